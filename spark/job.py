"""The reconciliation itself: the buffer topic against the target topics, one row per delay id.

Rules (docs/DESIGN.md, "Reconciliation"):

* Every buffer record is read by the nodes' own parser (``delayq.wire.parse_buffer_record``,
  see records.py), with its partition and the topic's partition count: a malformed
  record (a key that is no delay id, a record off its id's partition, a bad frame, ...)
  takes no part, as on a node. So the records of one id that count share a buffer
  partition, and their offsets order them (offsets of different partitions are never
  compared). A *version* of an id is one of its
  ``put`` records, named by its offset; a reschedule is a newer put, and the latest
  put wins. A delivered record names the version it delivered in ``delayq-version``;
  one without it (or with one that is no buffer offset) names no version: no master
  writes such a record, and it is *unexpected*. A ``done`` names the version it closes
  (``delayq-version``) and ``delayq-cutoff``: the master had read every record of the
  partition below that offset when it picked the message; a ``done`` without either is
  malformed, as on a node. A master's copy of a put
  (frame option ``restores=N``) is a put like any other when version N was still the
  one pending at its offset; a copy a newer put or a cancel overtook is ignored, as
  nodes ignore it. A master's put of a repeating message's next occurrence (``follows=N``)
  is read the same way: a put like any other if N was still pending, so each occurrence
  is a version of the series' id, judged on its own due time (early, duplicated), and the
  last one on whether it was delivered; the put also stands for the ``done`` of occurrence N
  (its ``cutoff=`` is that done's cutoff), even when a cancel overtook it. An occurrence the
  master continued is no older version (no reschedule); one continued but never delivered
  is missing. A retry (``attempt=N``) is a delayed message like any other.
* A *producer write* is a cancel or a put no master wrote (no ``restores=`` or
  ``follows=``). Two producer writes of one id whose offset order and record
  timestamp (creation time) order disagree, the one at the lower offset created more
  than ``reorder_tolerance_ms`` after the other, make the id **reordered**: a
  producer's retry appended a write after one created after it. A producer write with
  the value, headers and timestamp of an earlier one of its id is that write appended
  again by the client library (librdkafka resends a batch after an epoch bump), and nodes
  apply it once: the copy is no write. It takes no part in the reorder check and
  supersedes nothing; a put copy is no version (a record naming its offset names the
  first copy's, so two deliveries across the copies are a duplicate), a cancel copy
  cancels nothing. Such an id is counted **twice_written** (no anomaly).
* A version is *superseded* by the first put or cancel after it. A superseding write
  of a version delivered anyway was too late only with evidence the master did not
  produce: it was created (record timestamp) at or after the version's due time, or
  appended after the done that closed it (the next occurrence's put for a series).
  Otherwise, at or above that done's cutoff and created less than ``ack_grace_ms``
  before the due time, it was too late by the master's cutoff only (its acknowledgement
  may have come after the due time); created earlier, or below the cutoff (the master
  had read it), it was ignored: **cancel_ignored** (the product promises that a cancel
  or reschedule acknowledged before the due time wins). Too late, it lost the
  documented race: a cancel "too late", or a "rescheduled too late" delivery of the
  older version, counted by that evidence; neither is an anomaly. With no cutoff or no
  superseding write left to judge by (compaction removed the version's put and done),
  an older version delivered was rescheduled too late.
* A cancel after the latest put *counts* (the latest version must not be delivered)
  unless it was too late as above, when the latest version's done has a cutoff; else
  (compaction left no put, or no done of the latest version) when a done of the latest
  version precedes it, or, with no done at all, when the latest version's first
  delivery was written before the cancel record (record timestamps). A cancel that
  counts by the cutoff and a delivery anyway is *cancel_ignored*; one that counts by
  the fallback and a delivery anyway is *unexpected*, as is any delivery of an id
  unknown to the buffer, a delivery without ``delayq-version``, and one whose
  ``delayq-version`` names a put with another due time than its ``delayq-deliver-at``.
* An older version delivered once, superseded too late (or with no cutoff to tell),
  is legitimate: a late reschedule delivers the old version and then the new one, and
  that is no duplicate. A *duplicate* is one version (same id and ``delayq-version``)
  delivered more than once.
* Compaction removes a put once a newer record of its id is older than
  ``min.compaction.lag.ms``. Such an id (done or cancel left, no put) is *compacted*:
  known, its due time taken from its latest delivered version's ``delayq-deliver-at``,
  and any delivery counts. Only an id with no put, done or cancel left is *unknown*.
* Due time of an id: its latest put's, else (compacted) its deliveries' header, else
  the frame its dead letter carries, else its first delivery time. An id is judged when
  its due time falls in ``[since, until)``.
* Expected: a scheduled (or compacted) id due before ``until - grace``; delivered:
  expected and its latest version delivered at least once; undeliverable: expected, not
  delivered, and the master dead-lettered its latest version (a dead letter of that id
  and ``delayq-version`` on the dead-letter topic; without a put left, of any version);
  missing: expected, latest version neither delivered nor dead-lettered, even when an
  older version was delivered (a lost reschedule is missing, never early); early: any
  delivery more than the tolerance before the due time of the version it delivered;
  lateness: first delivery of the latest version minus its due time, except for a put
  written when it was already due (its record timestamp at or after its due time),
  whose delay is measured from the put to its first delivery instead. Every delivery of
  a judged id counts, whenever it happened, so "missing" means "never delivered as of
  this run".

The work is one shuffle by id: a window over each id's records in timestamp order finds
the writes appended twice or out of order, one in offset order gives every record its
id's latest put and every put the write that superseded it; then two hash aggregations,
by (id, version) and by id, with fixed-width buffers only, and no further shuffle.
"""


from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from delayq import wire

from .options import ReconcileOptions
from .records import (
    BUFFER_SCHEMA,
    CANCEL,
    CANCEL_COPY,
    DEAD_LETTER,
    DEAD_LETTER_SCHEMA,
    DELIVERY,
    DONE,
    MALFORMED_CODES,
    NEWER_LEVEL_CODE,
    PUT,
    PUT_COPY,
    classify_buffer,
    classify_dead_letters,
)
from .report import ANOMALY_FLAGS
from .session import ReconcileError, kafka_source_options, spark_session
from .summary import HOUR_MS, TOO_LATE_EVIDENCE, Summary, histogram

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame, SparkSession

    from delayq import Settings

WORST_LATE = 20
# Why a cancel or reschedule that lost to a delivery was too late, strongest evidence first: created
# at or after the due time, appended after the delivery's done, or only the master's cutoff says so
# (created less than the ack grace before the due time). Codes 1-3 here, TOO_LATE_EVIDENCE's names in the report.
AFTER_DUE, AFTER_DELIVERY, BY_CUTOFF = 1, 2, 3
# The version key of a record with no put left to belong to, and of a delivery that names no version (no
# delayq-version, or one that is no offset: no master writes it). Real versions are offsets, >= 0.
NO_PUT = -1
UNVERSIONED = -2
# How a node reads delayq-version and delayq-cutoff: a buffer offset in plain decimal digits.
_OFFSET_DIGITS = r"^[0-9]{1,18}$"

Progress = Callable[[str], None]


@dataclass
class Findings:
    """What the Spark side found, in plain Python: the report is built from this."""

    totals: dict[str, int]
    lateness: dict[str, int | None]
    by_topic: dict[str, dict[str, Any]]
    per_hour: list[dict[str, Any]]
    histogram: list[dict[str, Any]]
    worst_late: list[dict[str, Any]]
    anomalies: pa.Table
    target_topics: list[str]
    missing_topics: list[str]
    timings_s: dict[str, float]
    spark_version: str
    # total, by_code, repeated_sources, listed, truncated, topic, topic_found (dead_letter_findings)
    dead_letters: dict[str, Any] = field(default_factory=dict)
    malformed_by_code: dict[str, int] = field(default_factory=dict)
    # Puts written when already due: how many, and first delivery minus the put's timestamp.
    already_due: dict[str, int | None] = field(default_factory=dict)
    # Cancels and reschedules too late by the master's cutoff only: how many ids, and how long
    # before the due time the write was created (Tally.too_late_gap_ms).
    too_late_by_cutoff: dict[str, int | None] = field(default_factory=dict)


def _header(name: str, cast: str = "STRING") -> Column:
    """The first value of header ``name`` (null when absent; null too when it does not parse as ``cast``)."""
    from pyspark.sql import functions as F

    value = f"CAST(try_element_at(filter(headers, h -> h.key = '{name}'), 1).value AS STRING)"
    return F.expr(value if cast == "STRING" else f"try_cast({value} AS {cast})")


def _offset_header(name: str) -> Column:
    """Header ``name`` as a buffer offset: null when absent or not plain decimal digits (as a node reads it)."""
    from pyspark.sql import functions as F

    text = _header(name)
    return F.when(text.rlike(_OFFSET_DIGITS), text.cast("bigint"))


def read_topics(spark: SparkSession, settings: Settings, options: ReconcileOptions, topics: list[str],
                *, from_ms: int | None = None) -> DataFrame:
    """Records of ``topics`` with their headers, from the start (or from ``from_ms``) to their current end.

    Args:
        spark: the session.
        settings: where Kafka is and how to connect.
        options: the isolation level to read with.
        topics: topic names.
        from_ms: the earliest record timestamp wanted; None reads from the beginning.
    """
    reader = (spark.read.format("kafka")
              .options(**kafka_source_options(settings, isolation_level=options.isolation_level))
              .option("subscribe", ",".join(topics))
              # Its consumer groups, which `delayq acls --reconcile` grants by this prefix.
              .option("groupIdPrefix", settings.reconcile_group_prefix)
              .option("includeHeaders", "true")
              .option("endingOffsets", "latest"))
    if from_ms is None:
        reader = reader.option("startingOffsets", "earliest")
    else:
        # A partition with nothing that recent starts at its end instead of failing the run.
        reader = (reader.option("startingTimestamp", str(max(0, from_ms)))
                  .option("startingOffsetsByTimestampStrategy", "latest"))
    return reader.load()


def buffer_rows(raw: DataFrame, partitions: int) -> DataFrame:
    """One row per buffer record, classified as a node classifies it: a put, a cancel, a done, or malformed.

    Every record goes through :func:`delayq.wire.parse_buffer_record`, the nodes' own
    parser (:func:`.records.classify_buffer`, in ``mapInArrow``), with the partition it
    was read from and the buffer's partition count, so a record off its id's partition
    is malformed here exactly as on a node. Malformed records (``malformed`` 1, ``kind``
    null, ``code`` their :class:`delayq.wire.Reason`) take no part otherwise: the same
    records a node dead-letters. The master's partition marks (:func:`delayq.wire.mark_id`)
    are left out: they are no message's records.

    Args:
        raw: the buffer topic as Spark's Kafka source reads it.
        partitions: the buffer topic's partition count (Kafka metadata).
    """
    from functools import partial

    from pyspark.sql import functions as F

    # Value and headers hashed in the JVM (with the timestamp, they tell a write appended twice) and
    # passed through the parser untouched.
    parsed = (raw.select("key", "value", "headers", "partition", "offset", F.unix_millis("timestamp").alias("ts"),
                         F.xxhash64("value", "headers").alias("written"))
              .mapInArrow(partial(classify_buffer, partitions=partitions), BUFFER_SCHEMA))
    rows = parsed.select(
        F.col("key").cast("string").alias("id"),
        F.col("code").isNotNull().cast("int").alias("malformed"),
        "kind", "code", "partition", "offset", "due", "put_topic", "restores", "ts", "version", "cutoff",
        "follows", "follows_cutoff", "written",
    )
    # A put or cancel of a mark's id is malformed (nodes dead-letter it): only the marks themselves go.
    return rows.where((F.col("malformed") == 1) | F.col("id").isNull()
                      | ~F.col("id").startswith(wire.MARK_ID_PREFIX.decode()))


def dead_letter_rows(raw: DataFrame) -> DataFrame:
    """One row per dead-letter record (:data:`.records.DEAD_LETTER_SCHEMA`): who, why, from where, when."""
    from pyspark.sql import functions as F

    return (raw.select("key", "value", "headers", "partition", "offset", F.unix_millis("timestamp").alias("ts"))
            .mapInArrow(classify_dead_letters, DEAD_LETTER_SCHEMA))


def delivery_rows(raw: DataFrame) -> DataFrame:
    """One row per delivered record on the target topics (records without ``delayq-id`` are not delayq's)."""
    from pyspark.sql import functions as F

    return raw.select(
        _header(wire.ID).alias("id"),
        F.lit(DELIVERY).alias("kind"),
        F.unix_millis("timestamp").alias("ts"),
        _header(wire.DELIVER_AT, "BIGINT").alias("due"),
        _header(wire.EPOCH, "BIGINT").alias("epoch"),
        _offset_header(wire.VERSION).alias("version"),
        F.col("topic").alias("delivery_topic"),
    ).where(F.col("id").isNotNull())


def _topic_index(column: str, topics: list[str]) -> Column:
    """1-based index of the topic in ``topics`` (0 when absent): aggregates over ints stay in a hash table."""
    from pyspark.sql import functions as F

    if not topics:  # an empty array literal has no element type to compare with
        return F.lit(0).cast("int")
    return F.array_position(F.array(*(F.lit(t) for t in topics)), F.col(column)).cast("int")


def _topic_name(column: str, topics: list[str]) -> Column:
    from pyspark.sql import functions as F

    if not topics:
        return F.lit(None).cast("string")
    return F.when(F.col(column) > 0, F.element_at(F.array(*(F.lit(t) for t in topics)), F.col(column)))


def per_version(buffer: DataFrame, deliveries: DataFrame, topics: list[str], early_tolerance_ms: int, *,
                copies: bool = True, dead_letters: DataFrame | None = None,
                reorder_tolerance_ms: int = 0) -> DataFrame:
    """Both sides grouped by (delay id, version): one row per put, with its done and deliveries.

    A first window over each id's records, in order of record timestamp, finds its
    producers' writes appended twice or out of order (:func:`_producer_writes`). A second
    one, over the same rows, gives every record its id's latest put (offset and due time)
    and every put the first put or cancel after it: its offset (``superseded_at``), timestamp
    (``superseded_ms``) and whether it was a reschedule or a cancel (``superseded_by``);
    it orders puts and cancels first, by offset, so that is the next row. That places each
    record in a version:

    * a put: its own offset; a done or a delivery: the version its ``delayq-version`` names;
    * a delivery without one: :data:`UNVERSIONED` (``-2``, below every offset), no put's;
    * a cancel: the latest put (``-1`` when none is left);
    * a dead letter of an undeliverable message: the version its ``delayq-version`` names;
    * a put appended twice: the copy, and whatever names its offset, belong to the first
      copy's version (the second window orders each copy just before the records that
      name its offset, so each of those finds it as the last copy before it);
    * a cancel appended twice: the copy is no write; it is kept to be counted only.

    A master's copy of a put (``restores=N``, written when a ``done`` of an older version
    came to follow the pending put) is the put nodes store in N's place when N is still
    pending at its offset, so it is a put like any other (the latest put wins); a copy a
    newer put or a cancel overtook changes nothing on a node and is left out here too.

    Columns a version does not hold are null; cancel and done columns hold only the
    records after the latest put (``cancel_offset``: the first cancel; ``done_offset``:
    the first done of the latest version), so the per-id step needs no ordering.

    Args:
        buffer: :func:`buffer_rows`.
        deliveries: :func:`delivery_rows`.
        topics: every topic name either side may hold (put topics and target topics).
        early_tolerance_ms: a delivery this much or less before its due time is not early.
        copies: whether the buffer may hold masters' copies; False (none were seen) saves
            the window pass that tells the overtaken ones.
        dead_letters: :func:`dead_letter_rows`; those of undeliverable messages count per version.
        reorder_tolerance_ms: producer writes whose offset and timestamp order disagree by
            this much or less are not reordered.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    puts_and_tombstones = buffer.where(F.col("kind").isNotNull())
    rows = (puts_and_tombstones
            .select("id", "kind", "offset", "due", _topic_index("put_topic", topics).alias("topic"), "ts",
                    "version", "cutoff", "restores", "follows", "written")
            # A master's put of a series' next occurrence closes the occurrence it follows, as a done
            # would, and records the cutoff that occurrence was picked under: one row of each, even
            # when a cancel overtook the put (nodes ignore it then, but the master had picked).
            .unionByName(puts_and_tombstones.where(F.col("follows").isNotNull())
                         .select("id", F.lit(DONE).alias("kind"), "offset", "ts", F.col("follows").alias("version"),
                                 F.col("follows_cutoff").alias("cutoff")),
                         allowMissingColumns=True)
            .unionByName(deliveries.select("id", "kind", "ts", "due", "epoch", "version",
                                           _topic_index("delivery_topic", topics).alias("topic")),
                         allowMissingColumns=True))
    if dead_letters is not None:
        rows = rows.unionByName(
            dead_letters.where(F.col("undeliverable") & F.col("id").isNotNull())
            .select("id", F.lit(DEAD_LETTER).alias("kind"), "ts", "due", "version",
                    _topic_index("put_topic", topics).alias("topic")),
            allowMissingColumns=True)
    rows = _producer_writes(rows, reorder_tolerance_ms)
    kind, offset, due = F.col("kind"), F.col("offset"), F.col("due")
    put_offset = F.when(kind == PUT, offset)
    # Puts and cancels first, in offset order, so the row after a put is the write that superseded it.
    # The others, copies included (no writes), follow, each at the offset of the put it names (a put copy at
    # its own offset, then what names that copy), so a record naming a copy finds it as the last copy before it.
    # (Columns, not expressions: both windows must order by the same attributes, or Spark sorts twice.)
    rows = (rows.withColumn("not_a_write", kind > CANCEL)
            .withColumn("place", F.when((kind <= CANCEL) | (kind == PUT_COPY), offset)
                        .otherwise(F.coalesce(F.col("version"), offset)))
            .withColumn("names_a_put", kind != PUT_COPY))
    ordered = Window.partitionBy("id").orderBy("not_a_write", F.col("place").asc_nulls_last(), "names_a_put")
    whole = ordered.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    before = ordered.rowsBetween(Window.unboundedPreceding, -1)
    # A master's copy of a put (restores=N) counts as a put only if the version it restores was
    # still the one pending: N is the last producer's put before it, or a copy after that, and
    # no cancel came between. Otherwise nodes ignore it (and a done of it closes nothing).
    if copies:
        last_put, last_cancel = F.col("last_put"), F.col("last_cancel")
        live = (F.coalesce(F.col("restores") >= last_put, last_cancel.isNull())
                & (last_cancel.isNull() | F.coalesce(last_cancel < last_put, F.lit(False))))
        producers_put = F.when((kind == PUT) & F.col("restores").isNull(), offset)
        rows = (rows.select("*",
                            F.last(producers_put, ignorenulls=True).over(before).alias("last_put"),
                            F.last(F.when(kind == CANCEL, offset), ignorenulls=True).over(before).alias("last_cancel"))
                .where(F.col("restores").isNull() | live)
                .drop("last_put", "last_cancel"))  # still in window order: the next window sorts nothing
    # The version a record names: a put copy's names the first copy.
    last_copy = F.last(F.when(kind == PUT_COPY, offset), ignorenulls=True).over(before)
    last_copy_of = F.last(F.when(kind == PUT_COPY, F.col("first_copy")), ignorenulls=True).over(before)
    placed = rows.select(
        "*",
        F.max(put_offset).over(whole).alias("latest"),
        F.max_by(F.when(kind == PUT, due), put_offset).over(whole).alias("latest_due"),
        F.when(kind == PUT, F.lead(F.when(kind <= CANCEL, offset)).over(ordered)).alias("superseded_at"),
        F.when(kind == PUT, F.lead(F.when(kind <= CANCEL, kind)).over(ordered)).alias("superseded_by"),
        F.when(kind == PUT, F.lead(F.when(kind <= CANCEL, F.col("ts"))).over(ordered)).alias("superseded_ms"),
        # A repeating message's occurrence whose next occurrence the master put after it (follows=).
        F.when(kind == PUT, F.lead(F.when(kind <= CANCEL, F.col("follows"))).over(ordered) == offset
               ).alias("continued"),
        F.when((kind != PUT_COPY) & (last_copy == F.col("version")), last_copy_of)
        .otherwise(F.col("version")).alias("named"),
    )
    latest, delivery, version = F.col("latest"), kind == DELIVERY, F.col("named")
    after_latest = offset > F.coalesce(latest, F.lit(NO_PUT))
    cancel_after = (kind == CANCEL) & after_latest
    done_of_latest = (kind == DONE) & (latest.isNull() | (version == latest))
    key = (F.when(kind == PUT, offset)
           .when(kind == PUT_COPY, F.col("first_copy"))
           .when(delivery, F.coalesce(version, F.lit(UNVERSIONED)))
           .when(((kind == DONE) | (kind == DEAD_LETTER)) & version.isNotNull(), version)
           .otherwise(F.coalesce(latest, F.lit(NO_PUT))))
    early = delivery & (F.col("ts") < F.coalesce(due, F.col("latest_due")) - early_tolerance_ms)
    # The done that closed this version: the one naming it.
    closing = kind == DONE
    reordered = F.col("reordered")
    copy = (kind == PUT_COPY) | (kind == CANCEL_COPY)

    def of_deliveries(column: str) -> Column:
        return F.when(delivery, F.col(column))

    def of_reordered(column: str) -> Column:
        return F.min_by(F.when(reordered, F.col(column)), F.when(reordered, offset))

    dead_letter = kind == DEAD_LETTER

    # Only fixed-width aggregation buffers (no strings, structs or sets), so Spark keeps hash
    # aggregates instead of sorting by id once more.
    return placed.groupBy("id", key.alias("version")).agg(
        F.max("latest").alias("latest"),
        F.max(put_offset).alias("put_offset"),
        F.max(F.when(kind == PUT, due)).alias("put_due"),
        F.max(F.when(kind == PUT, F.col("ts"))).alias("put_ms"),
        F.max(F.when(kind == PUT, F.col("topic"))).alias("put_topic"),
        F.max("superseded_at").alias("superseded_at"),
        F.max("superseded_by").alias("superseded_by"),
        F.max("superseded_ms").alias("superseded_ms"),
        F.max(F.col("continued").cast("int")).alias("continued"),
        F.max("cutoff").alias("cutoff"),
        F.min(F.when(closing, offset)).alias("closed_at"),
        F.min(F.when(cancel_after, offset)).alias("cancel_offset"),
        F.min_by(F.when(cancel_after, F.col("ts")), F.when(cancel_after, offset)).alias("cancel_ms"),
        F.min(F.when(done_of_latest, offset)).alias("done_offset"),
        F.max((kind <= DONE).cast("int")).alias("in_buffer"),
        F.min(F.when(copy, offset)).alias("copy_offset"),
        F.min_by(F.col("first_copy"), F.when(copy, offset)).alias("copied_offset"),
        F.min(F.when(reordered, offset)).alias("reorder_low_offset"),
        of_reordered("ts").alias("reorder_low_ms"),
        of_reordered("appended_later").alias("reorder_high_offset"),
        of_reordered("appended_later_ms").alias("reorder_high_ms"),
        F.count(of_deliveries("ts")).alias("copies"),
        F.min(of_deliveries("ts")).alias("first_ms"),
        F.max(of_deliveries("ts")).alias("last_ms"),
        F.min("epoch").alias("first_epoch"),
        F.max("epoch").alias("last_epoch"),
        F.max(early.cast("int")).alias("early"),
        F.min(of_deliveries("due")).alias("header_due"),
        F.max(of_deliveries("due")).alias("header_due_max"),
        F.min(of_deliveries("topic")).alias("delivery_topic"),
        F.count(F.when(dead_letter, 1)).alias("dead_letters"),
        F.max(F.when(dead_letter, due)).alias("dead_letter_due"),
        F.max(F.when(dead_letter, F.col("topic"))).alias("dead_letter_topic"),
    )


def _producer_writes(rows: DataFrame, reorder_tolerance_ms: int) -> DataFrame:
    """Mark what producers wrote twice or out of order, from a window over each id in timestamp order.

    A producer write is a put that is no master's (no ``restores=`` or ``follows=``) or
    a cancel. One with the value, headers and timestamp of an earlier one is that write
    appended again (a client library's resend), which nodes apply once: it becomes
    :data:`.records.PUT_COPY` or :data:`.records.CANCEL_COPY`, with ``first_copy`` the
    offset of the first, and is no write. Two writes out of order (``reordered``): one
    appended at a lower offset than another, though created (record timestamp) more than
    ``reorder_tolerance_ms`` after it; each such record gets the highest offset of a write
    created that much before it (``appended_later``) and that write's timestamp. A copy
    takes no part there: a resend lands after writes created after it, as it must. One
    sort serves both windows: (timestamp, what was written, offset).
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    kind, offset, ts, again = F.col("kind"), F.col("offset"), F.col("ts"), F.col("again")
    producer_write = ((kind == PUT) & F.col("restores").isNull()) | (kind == CANCEL)
    # Ordered by (timestamp, what was written, offset), a write appended twice follows its first copy.
    by_time = Window.partitionBy("id").orderBy("ts", "written", "offset")
    written = F.when(producer_write, F.col("written"))
    rows = rows.select("*", F.coalesce((F.lag(written).over(by_time) == written)
                                       & (F.lag("ts").over(by_time) == ts), F.lit(False)).alias("again"))
    write_offset = F.when(producer_write & ~again, offset)
    first = F.last(write_offset, ignorenulls=True).over(by_time.rowsBetween(Window.unboundedPreceding,
                                                                             Window.currentRow))
    # Writes created more than the tolerance before this one: a range of timestamps, in the same order.
    created_before = (Window.partitionBy("id").orderBy("ts")
                      .rangeBetween(Window.unboundedPreceding, -(reorder_tolerance_ms + 1)))
    rows = rows.select(
        "*",
        F.when(again, first).alias("first_copy"),
    ).select(
        "*",
        F.max(write_offset).over(created_before).alias("appended_later"),
        F.max_by(F.when(write_offset.isNotNull(), ts), write_offset).over(created_before).alias("appended_later_ms"),
    )
    # What was written is no longer needed: the rows are sorted again by offset, lighter without it.
    return rows.select(
        *(F.col(name) for name in rows.columns if name not in ("kind", "again", "appended_later", "written")),
        F.when(again, F.when(kind == PUT, F.lit(PUT_COPY)).otherwise(F.lit(CANCEL_COPY))).otherwise(kind)
        .alias("kind"),
        F.when(write_offset.isNotNull(), F.col("appended_later")).alias("appended_later"),
        F.coalesce(F.col("appended_later") > write_offset, F.lit(False)).alias("reordered"),
    )


def _too_late(at: Column, at_ms: Column, due: Column, cutoff: Column, closed_at: Column,
              ack_grace_ms: int) -> Column:
    """Why the write at offset ``at``, created at ``at_ms``, that superseded a version delivered anyway, was too late.

    :data:`AFTER_DUE`: created at or after the version's due time; :data:`AFTER_DELIVERY`:
    appended after the done (``closed_at``) that closed the version; :data:`BY_CUTOFF`:
    neither, but created less than ``ack_grace_ms`` before the due time and at or above
    the done's cutoff, so its acknowledgement may have come after the due time. Null when
    it was not too late: below the cutoff (the master had read it), or created earlier
    and appended before the done (ignored).
    """
    from pyspark.sql import functions as F

    return F.when(at >= cutoff, F.coalesce(_evidence(at, at_ms, due, closed_at),
                                           F.when(due - at_ms < ack_grace_ms, F.lit(BY_CUTOFF))))


def _evidence(at: Column, at_ms: Column, due: Column, closed_at: Column) -> Column:
    """:data:`AFTER_DUE` or :data:`AFTER_DELIVERY` (see :func:`_too_late`), null when neither."""
    from pyspark.sql import functions as F

    return F.when(at_ms >= due, F.lit(AFTER_DUE)).when(at > closed_at, F.lit(AFTER_DELIVERY))


def _evidence_name(code: Column) -> Column:
    """An evidence code as its name in TOO_LATE_EVIDENCE (null stays null).

    A CASE rather than ``element_at`` of an array: Spark 4.0.0 answers ``element_at(array,
    CASE WHEN c THEN 3 END)`` with the third element even where the index is null.
    """
    from pyspark.sql import functions as F

    after_due, after_delivery, by_cutoff = TOO_LATE_EVIDENCE
    return (F.when(code == AFTER_DUE, F.lit(after_due))
            .when(code == AFTER_DELIVERY, F.lit(after_delivery))
            .when(code == BY_CUTOFF, F.lit(by_cutoff)))


def per_id(versions: DataFrame, topics: list[str], *, ack_grace_ms: int) -> DataFrame:
    """:func:`per_version` rows summed up per delay id: the latest version, the cancel, and all deliveries.

    Args:
        versions: :func:`per_version`.
        topics: the topic list :func:`per_version` indexed topics with.
        ack_grace_ms: how long an acknowledgement may lag its write's creation (see :func:`_too_late`).
    """
    from pyspark.sql import functions as F

    version, latest, copies = F.col("version"), F.col("latest"), F.col("copies")
    is_latest = version == latest
    # An occurrence of a series the master continued is not an older version: the next occurrence follows it.
    continued = F.coalesce(F.col("continued"), F.lit(0)) == 1
    unversioned = version == UNVERSIONED
    older = latest.isNotNull() & (version != latest) & (copies > 0) & ~continued & ~unversioned
    put_due, cutoff, at = F.col("put_due"), F.col("cutoff"), F.col("superseded_at")
    at_ms = F.col("superseded_ms")
    # An older version delivered: its reschedule (or cancel) was too late, with this evidence, or, with a
    # cutoff to judge by and no evidence, ignored. Without a cutoff or the write that superseded it (compaction
    # removed the version's put and its done) nothing tells ignored.
    has_cutoff = cutoff.isNotNull() & at.isNotNull()
    evidence = (F.when(has_cutoff, _too_late(at, at_ms, put_due, cutoff, F.col("closed_at"), ack_grace_ms))
                .otherwise(F.coalesce(_evidence(at, at_ms, put_due, F.col("closed_at")), F.lit(BY_CUTOFF))))
    ignored = older & has_cutoff & evidence.isNull()
    late_by = F.when(older, evidence)
    # A delivery naming a put of another due time, or naming none.
    mismatched = ((F.col("put_offset").isNotNull() & (copies > 0)
                   & ((F.col("header_due") != put_due) | (F.col("header_due_max") != put_due)))
                  | (unversioned & (copies > 0)))

    def flag(condition: Column) -> Column:
        return F.max(F.coalesce(condition, F.lit(False)).cast("int")) == 1

    grouped = versions.groupBy("id").agg(
        F.max("put_offset").alias("put_offset"),
        F.max_by("put_due", "put_offset").alias("put_due"),
        F.max_by("put_ms", "put_offset").alias("put_ms"),
        F.max_by("put_topic", "put_offset").alias("put_topic"),
        F.coalesce(F.sum(F.when(is_latest, copies)), F.lit(0)).alias("latest_copies"),
        F.min(F.when(is_latest, F.col("first_ms"))).alias("latest_first_ms"),
        F.max(F.when(is_latest, F.col("cutoff"))).alias("cutoff"),
        F.min("cancel_offset").alias("cancel_offset"),
        F.min_by("cancel_ms", "cancel_offset").alias("cancel_ms"),
        F.min("done_offset").alias("done_offset"),
        (F.max("in_buffer") == 1).alias("in_buffer"),
        F.sum("copies").alias("delivered_count"),
        F.count(F.when(copies > 0, 1)).alias("versions_delivered"),
        F.max("copies").alias("most_copies"),
        F.sum(F.greatest(copies - 1, F.lit(0))).alias("duplicate_records"),
        F.min("first_ms").alias("first_ms"),
        F.max("last_ms").alias("last_ms"),
        F.min("first_epoch").alias("first_epoch"),
        F.max("last_epoch").alias("last_epoch"),
        flag(F.col("early") == 1).alias("any_early"),
        flag(older).alias("older_delivered"),
        flag(ignored & (F.col("superseded_by") == PUT)).alias("reschedule_ignored"),
        flag(ignored & (F.col("superseded_by") == CANCEL)).alias("older_cancel_ignored"),
        # The weakest evidence of the older versions delivered too late, and by how much a write too
        # late by the cutoff only was created before the due time.
        F.max(late_by).alias("reschedule_late_by"),
        F.max(F.when(late_by == BY_CUTOFF, put_due - at_ms)).alias("reschedule_gap_ms"),
        flag(mismatched).alias("version_mismatch"),
        # An occurrence followed by the next one, yet never delivered: the series skipped it.
        flag(continued & (copies == 0)).alias("occurrence_missing"),
        F.max_by("header_due", F.when(copies > 0, version)).alias("header_due"),
        F.min("delivery_topic").alias("delivery_topic"),
        F.coalesce(F.sum(F.when(is_latest, F.col("dead_letters"))), F.lit(0)).alias("latest_dead_letters"),
        F.sum("dead_letters").alias("dead_letters"),
        F.max("dead_letter_due").alias("dead_letter_due"),
        F.max("dead_letter_topic").alias("dead_letter_topic"),
        F.min("copy_offset").alias("twice_written_copy_offset"),
        F.min_by("copied_offset", "copy_offset").alias("twice_written_offset"),
        F.min("reorder_low_offset").alias("reorder_low_offset"),
        F.min_by("reorder_low_ms", "reorder_low_offset").alias("reorder_low_ms"),
        F.min_by("reorder_high_offset", "reorder_low_offset").alias("reorder_high_offset"),
        F.min_by("reorder_high_ms", "reorder_low_offset").alias("reorder_high_ms"),
    )
    return (grouped.withColumn("put_topic", _topic_name("put_topic", topics))
            .withColumn("delivery_topic", _topic_name("delivery_topic", topics))
            .withColumn("dead_letter_topic", _topic_name("dead_letter_topic", topics)))


def judge(ids: DataFrame, options: ReconcileOptions, *, expected_before_ms: int | None = None) -> DataFrame:
    """Decide, per id due in the window, what it was and what went wrong (rules: module docstring).

    Args:
        ids: :func:`per_id`.
        options: the window, the grace and the ack grace.
        expected_before_ms: messages due before this are expected delivered; None: the window's
            end minus the grace. The continuous job (follow.py) judges at each micro-batch's time
            whatever the window.
    """
    from pyspark.sql import functions as F

    expected_before = options.expected_before_ms if expected_before_ms is None else expected_before_ms

    expr, col = F.expr, F.col
    has_put = col("put_offset").isNotNull()
    delivered = F.when(has_put, col("latest_copies") > 0).otherwise(col("delivered_count") > 0)
    first_ms = F.when(has_put, col("latest_first_ms")).otherwise(col("first_ms"))
    cancel_after = col("cancel_offset").isNotNull()
    by_cutoff = col("cutoff").isNotNull()
    cancel_offset, cancel_ms, put_due = col("cancel_offset"), col("cancel_ms"), col("put_due")
    # No cutoff to judge by (compaction left no put, or no done of the latest version): a cancel after a done of
    # the latest version is too late, or, with no done left, one created after the latest version's first delivery.
    after_delivery = (F.when(col("done_offset").isNotNull(), col("done_offset") < cancel_offset)
                      .otherwise(F.coalesce(first_ms < cancel_ms, F.lit(False))))
    cancel_late_by = (F.when(by_cutoff, _too_late(cancel_offset, cancel_ms, put_due, col("cutoff"),
                                                  col("done_offset"), options.ack_grace_ms))
                      .when(after_delivery, F.when(cancel_ms >= put_due, F.lit(AFTER_DUE))
                            .otherwise(F.lit(AFTER_DELIVERY))))
    too_late = col("cancel_too_late")
    # The master dead-lettered the version that had to be delivered (undeliverable: no target topic or
    # partition, or Kafka refused the record); without a put left, any version of the id.
    dead_lettered = F.when(has_put, col("latest_dead_letters") > 0).otherwise(col("dead_letters") > 0)
    # Written when it was already due: its lateness says how late the producer was, not the master.
    already_due = has_put & (col("put_ms") >= col("put_due"))
    state = col("state")
    legit = state.isin("scheduled", "compacted")
    cancel_ignored = ((state == "cancelled") & delivered & by_cutoff) | col("older_cancel_ignored")
    cancel_gap = F.when(col("cancel_late_by") == BY_CUTOFF, put_due - cancel_ms)
    rescheduled_too_late = col("rescheduled_too_late")
    # Each column computed once and read by name after: the stage's generated code then stays under the
    # size the JVM still compiles (8,000 bytes of bytecode per method; above it, it runs interpreted).
    return (ids
            .withColumn("due_ms", expr("coalesce(put_due, header_due, dead_letter_due, first_ms)"))
            .where((col("due_ms") >= options.since_ms) & (col("due_ms") < options.until_ms))
            .withColumn("cancel_late_by", F.when(cancel_after, cancel_late_by))
            .withColumn("cancel_too_late", col("cancel_late_by").isNotNull())
            .withColumn("state", F.when(cancel_after & ~too_late, "cancelled")
                        .when(has_put, "scheduled")
                        .when(col("in_buffer"), "compacted")
                        .otherwise("unknown"))
            .withColumn("topic", F.coalesce("put_topic", "delivery_topic", "dead_letter_topic"))
            .withColumn("ignored", F.when(cancel_ignored, "cancel").when(col("reschedule_ignored"), "reschedule"))
            .withColumn("is_expected", legit & (col("due_ms") < expected_before))
            .withColumn("in_grace", legit & (col("due_ms") >= expected_before))
            .withColumn("is_delivered", col("is_expected") & delivered)
            .withColumn("is_undeliverable", col("is_expected") & ~delivered & dead_lettered)
            .withColumn("is_missing", (col("is_expected") & ~delivered & ~dead_lettered)
                        | (legit & col("occurrence_missing")))
            .withColumn("already_due", F.coalesce(already_due, F.lit(False)))
            .withColumn("is_duplicate", col("most_copies") > 1)
            .withColumn("is_unexpected", ((state == "cancelled") & delivered & ~by_cutoff)
                        | ((state == "unknown") & (col("delivered_count") > 0)) | col("version_mismatch"))
            .withColumn("is_early", col("any_early"))
            .withColumn("is_cancel_ignored", col("ignored").isNotNull())
            .withColumn("is_reordered", col("reorder_low_offset").isNotNull())
            .withColumn("is_twice_written", col("twice_written_copy_offset").isNotNull())
            .withColumn("rescheduled_too_late", col("older_delivered") & ~col("reschedule_ignored")
                        & ~col("older_cancel_ignored"))
            .withColumn("reschedule_late_by", F.when(rescheduled_too_late, col("reschedule_late_by")))
            .withColumn("too_late_gap_ms", F.greatest(cancel_gap, F.when(col("reschedule_late_by") == BY_CUTOFF,
                                                                          col("reschedule_gap_ms"))))
            .withColumn("cancel_late_by", _evidence_name(col("cancel_late_by")))
            .withColumn("reschedule_late_by", _evidence_name(col("reschedule_late_by")))
            .withColumn("lateness_ms", F.when(col("is_delivered") & ~col("already_due"), first_ms - col("due_ms")))
            .withColumn("put_to_delivery_ms",
                        F.when(col("is_delivered") & col("already_due"), first_ms - col("put_ms")))
            .select(F.col("id"), "topic", "state", "due_ms", col("put_offset").alias("version"), "put_ms",
                    "already_due", "put_to_delivery_ms", "dead_letters", "delivered_count",
                    "versions_delivered", "duplicate_records", "first_ms", "last_ms", "lateness_ms", "first_epoch",
                    "last_epoch", "cancel_offset", "cancel_ms", "cutoff", "cancel_too_late", "cancel_late_by",
                    "rescheduled_too_late", "reschedule_late_by", "too_late_gap_ms", "ignored",
                    "reorder_low_offset", "reorder_low_ms", "reorder_high_offset", "reorder_high_ms",
                    "twice_written_offset", "twice_written_copy_offset", "is_expected", "in_grace", "is_delivered",
                    "is_missing", "is_duplicate", "is_unexpected", "is_early", "is_cancel_ignored", "is_reordered",
                    "is_twice_written", "is_undeliverable"))


def _rounded_ms(column: str) -> Column:
    """A duration in ms exact below 1 s, else kept to three significant digits (see summary.py)."""
    from pyspark.sql import functions as F

    return F.expr(f"CASE WHEN abs({column}) < 1000 THEN {column} ELSE "
                  f"CAST(round({column} / pow(10, floor(log10(abs({column}))) - 2)) "
                  f"* pow(10, floor(log10(abs({column}))) - 2) AS BIGINT) END")


def summary_groups(judged: DataFrame) -> DataFrame:
    """Counts per (topic, hour of due time, lateness value): small, and all the report's figures sum from it."""
    from pyspark.sql import functions as F

    def count_of(condition: Column) -> Column:
        return F.count(F.when(condition, 1))

    flag = F.col
    def late_by(column: str, evidence: str) -> Column:
        return F.col(column) == evidence

    return judged.groupBy(
        "topic", (F.floor(F.col("due_ms") / HOUR_MS) * HOUR_MS).alias("hour_ms"),
        _rounded_ms("lateness_ms").alias("lateness_key"), _rounded_ms("put_to_delivery_ms").alias("written_key"),
        _rounded_ms("too_late_gap_ms").alias("gap_key"),
    ).agg(
        count_of(flag("is_expected")).alias("expected"),
        count_of(flag("is_delivered")).alias("delivered"),
        F.sum("delivered_count").alias("delivered_records"),
        count_of(flag("is_duplicate")).alias("duplicates"),
        F.sum(F.when(flag("is_duplicate"), F.col("duplicate_records"))).alias("duplicate_records"),
        count_of(flag("is_missing")).alias("missing"),
        count_of(flag("is_undeliverable")).alias("undeliverable"),
        count_of(flag("is_expected") & flag("already_due")).alias("already_due_when_written"),
        count_of(flag("is_unexpected")).alias("unexpected"),
        count_of(flag("is_unexpected") & (F.col("state") == "unknown")).alias("unknown"),
        count_of(flag("is_early")).alias("early"),
        count_of(flag("is_cancel_ignored")).alias("cancel_ignored"),
        count_of(F.col("state") == "cancelled").alias("cancelled"),
        count_of(flag("cancel_too_late")).alias("cancelled_too_late"),
        count_of(flag("rescheduled_too_late")).alias("rescheduled_too_late"),
        *(count_of(late_by(column, evidence)).alias(f"{total}_{evidence}")
          for column, total in (("cancel_late_by", "cancelled_too_late"),
                                ("reschedule_late_by", "rescheduled_too_late"))
          for evidence in TOO_LATE_EVIDENCE),
        count_of(flag("is_reordered")).alias("reordered"),
        count_of(flag("is_twice_written")).alias("twice_written"),
        count_of(flag("in_grace")).alias("in_grace"),
        F.count("lateness_ms").alias("lateness_n"),
        F.count("put_to_delivery_ms").alias("written_n"),
        F.count("too_late_gap_ms").alias("gap_n"),
    )


def anomalous(judged: DataFrame) -> DataFrame:
    """The judged ids with an anomaly of any kind (:data:`.report.ANOMALY_FLAGS`), by due time."""
    from functools import reduce
    from operator import or_

    from pyspark.sql import functions as F

    return judged.where(reduce(or_, (F.col(flag) for flag in ANOMALY_FLAGS.values()))).orderBy("due_ms", "id")


def refuse_newer_levels(count: int) -> None:
    """Raise ReconcileError when the buffer holds ``count`` > 0 records of a feature level this code cannot read.

    Judged without them, every message they carry would look missing or unexpected.
    """
    if count:
        raise ReconcileError(f"the buffer holds {count} record(s) of a feature level above {wire.WIRE_LEVEL}, which "
                             f"this delayq cannot read: run the reconciliation of the delayq version the nodes run "
                             "(`delayq upgrade status` shows the cluster's level)")


def _topics_on_broker(settings: Settings, topics: list[str]) -> dict[str, int]:
    """The partition count of each of ``topics`` that exists on the broker."""
    from confluent_kafka.admin import AdminClient

    try:
        metadata = AdminClient(settings.kafka_conf()).list_topics(timeout=15)
    except Exception as err:  # KafkaException carries the cause; the user needs the address tried
        raise ReconcileError(f"Kafka at {settings.bootstrap_servers} did not answer: {err}") from err
    return {t: len(metadata.topics[t].partitions) for t in topics
            if t in metadata.topics and metadata.topics[t].error is None}


def topics_with_the_buffer(settings: Settings, others: list[str]) -> dict[str, int]:
    """The partition count of the buffer topic and of each of ``others`` that exists.

    Raises:
        ReconcileError: Kafka did not answer, or the buffer topic does not exist (the message says how to fix it).
    """
    found = _topics_on_broker(settings, [settings.buffer_topic, *others])
    if settings.buffer_topic not in found:
        raise ReconcileError(f"buffer topic {settings.buffer_topic!r} does not exist on {settings.bootstrap_servers}:"
                             " run `delayq init`, or set DELAYQ_BUFFER_TOPIC / DELAYQ_CLUSTER to the cluster's")
    return found


def dead_letter_findings(letters: DataFrame, judged: DataFrame, options: ReconcileOptions) -> dict[str, Any]:
    """The dead letters that concern the window, counted by reason code, the first ``list_limit`` listed.

    Those of undeliverable messages whose id is judged (due in the window), and those of
    malformed buffer records written (dead-lettered) in ``[since, until)``.
    """
    from pyspark.sql import functions as F

    col = F.col
    with_letters = judged.where(col("dead_letters") > 0).select("id")
    scoped = (letters.where(col("undeliverable")).join(F.broadcast(with_letters), "id", "left_semi")
              .unionByName(letters.where(~col("undeliverable") & (col("ts") >= options.since_ms)
                                         & (col("ts") < options.until_ms))))
    by_code = {r["code"]: int(r["count"]) for r in scoped.groupBy("code").count().orderBy("code").collect()}
    repeated = (scoped.where(col("source").isNotNull()).groupBy("source").count().where(col("count") > 1)
                .count())
    listed = (scoped.orderBy("ts", "source", "id")
              .select("ts", "code", "text", "id", "key_text", "source", "version", "put_topic", "due",
                      "undeliverable")
              .limit(options.list_limit).collect())
    total = sum(by_code.values())
    return {"total": total, "by_code": by_code, "repeated_sources": repeated,
            "listed": [r.asDict() for r in listed], "truncated": total > len(listed)}


def reconcile_findings(settings: Settings, options: ReconcileOptions, *, spark: SparkSession | None = None,
                       progress: Progress | None = None) -> Findings:
    """Run the Spark side and bring the findings back to the driver.

    Raises:
        ReconcileError: Kafka does not answer, the buffer topic does not exist, or Spark does not start.
    """
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    say = progress or (lambda _text: None)
    timings: dict[str, float] = {}
    clock = time.monotonic()

    def lap(name: str) -> None:
        nonlocal clock
        now = time.monotonic()
        timings[name] = round(now - clock, 3)
        clock = now

    say(f"checking topics on {settings.bootstrap_servers}")
    found = topics_with_the_buffer(settings, [settings.dead_letter_topic])
    say("starting Spark (the first run resolves the Kafka source from Maven)")
    spark = spark or spark_session(options.master, maven_repository=options.maven_repository,
                                   conf=options.spark_conf)
    lap("spark_start")

    say(f"reading the buffer topic {settings.buffer_topic}")
    buffer = buffer_rows(read_topics(spark, settings, options, [settings.buffer_topic]),
                         found[settings.buffer_topic])
    buffer = buffer.persist(StorageLevel.MEMORY_AND_DISK)
    code = F.col("code")
    seen = buffer.agg(F.count(F.lit(1)).alias("records"), F.count(code).alias("malformed"),
                      F.collect_set("put_topic").alias("topics"), F.count("restores").alias("copies"),
                      F.count(F.when(code == NEWER_LEVEL_CODE, 1)).alias(NEWER_LEVEL_CODE),
                      *(F.count(F.when(code == reason, 1)).alias(reason) for reason in MALFORMED_CODES)).first()
    assert seen is not None  # a global aggregate has one row
    refuse_newer_levels(seen[NEWER_LEVEL_CODE])
    put_topics = sorted(seen["topics"])
    letters = None
    if settings.dead_letter_topic in found:
        letters = dead_letter_rows(read_topics(spark, settings, options, [settings.dead_letter_topic],
                                               from_ms=options.since_ms - options.lookback_ms))
        letters = letters.persist(StorageLevel.MEMORY_AND_DISK)
        if not letters.count():  # none since the lookback: nothing to join or to list
            letters.unpersist()
            letters = None
    lap("buffer")

    wanted = put_topics if options.topics is None else list(options.topics)
    # A put may name delayq's own topics or Kafka's (a forged one, dead-lettered forbidden-topic): their
    # records are no deliveries, and reading the buffer as a target would count every done as one.
    wanted = [topic for topic in wanted if settings.always_forbidden_target(topic) is None]
    present = _topics_on_broker(settings, wanted)
    targets = [t for t in wanted if t in present]
    missing_topics = [t for t in wanted if t not in present]
    say(f"reading {len(targets)} target topic(s) and judging every delay id")
    if targets:
        raw = read_topics(spark, settings, options, targets, from_ms=options.since_ms - options.lookback_ms)
    else:
        raw = spark.createDataFrame([], KAFKA_SCHEMA)
    topics = sorted(set(put_topics) | set(targets))
    versions = per_version(buffer, delivery_rows(raw), topics, options.early_tolerance_ms,
                           copies=seen["copies"] > 0, dead_letters=letters,
                           reorder_tolerance_ms=options.reorder_tolerance_ms)
    judged = judge(per_id(versions, topics, ack_grace_ms=options.ack_grace_ms), options)
    judged = judged.persist(StorageLevel.MEMORY_AND_DISK)
    judged.count()
    buffer.unpersist()
    lap("judge")

    say("summing up: totals, topics, hours, lateness, dead letters")
    summary = Summary.of(r.asDict() for r in summary_groups(judged).collect())
    # The latest version's first delivery, the one lateness is measured on (puts written when
    # already due have none: how late they went out says nothing about the master).
    worst = (judged.where(F.col("lateness_ms").isNotNull()).orderBy(F.desc("lateness_ms"), "id").limit(WORST_LATE)
             .select("id", "topic", "due_ms", (F.col("due_ms") + F.col("lateness_ms")).alias("first_ms"),
                     "lateness_ms", "delivered_count", "first_epoch", "last_epoch").collect())
    dead_letters: dict[str, Any] = {
        "topic": settings.dead_letter_topic, "topic_found": settings.dead_letter_topic in found,
        "total": 0, "by_code": {}, "repeated_sources": 0, "listed": [], "truncated": False}
    if letters is not None:
        dead_letters.update(dead_letter_findings(letters, judged, options))
        letters.unpersist()
    lap("summaries")

    say("collecting the anomalies")
    anomalies = anomalous(judged).toArrow()
    judged.unpersist()
    lap("anomalies")
    totals = {**summary.overall.counts, "dead_lettered": int(dead_letters["total"]),
              "buffer_records": int(seen["records"]), "malformed_buffer_records": int(seen["malformed"] or 0)}
    return Findings(
        totals=totals,
        lateness=summary.overall.lateness_ms(),
        by_topic={topic: tally.as_dict() for topic, tally in summary.by_topic.items()},
        per_hour=[{"hour_ms": hour, **tally.as_dict()} for hour, tally in summary.per_hour.items()],
        histogram=histogram(summary.overall.lateness),
        worst_late=[r.asDict() for r in worst],
        anomalies=anomalies,
        target_topics=targets,
        missing_topics=missing_topics,
        timings_s=timings,
        spark_version=spark.version,
        dead_letters=dead_letters,
        malformed_by_code={reason: int(seen[reason]) for reason in MALFORMED_CODES if seen[reason]},
        already_due=summary.overall.put_to_delivery_ms(),
        too_late_by_cutoff=summary.overall.too_late_gap_ms(),
    )


# The rows Spark's Kafka source gives: what the job reads, and what tests build in memory in its place.
KAFKA_SCHEMA = ("key BINARY, value BINARY, topic STRING, partition INT, offset BIGINT, timestamp TIMESTAMP, "
                "timestampType INT, headers ARRAY<STRUCT<key: STRING, value: BINARY>>")
