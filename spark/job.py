"""The reconciliation itself: the buffer topic against the target topics, one row per delay id.

Rules (docs/DESIGN.md, "The buffer topic is the source of truth"):

* Records of one id share a buffer partition, so their offsets order them. The
  latest ``put`` of an id wins (a reschedule replaces the due time and topic).
* A ``cancel`` after the latest put *counts* (the message must not be delivered)
  unless it came too late: a ``done`` precedes it, or, when no done is left to
  compare with (compaction keeps only the newest record of a key), the first
  delivery was written before the cancel record. A cancel that counts and a
  delivery anyway is *unexpected*; a too-late cancel is the documented race and not
  an anomaly.
* Compaction removes a put once a newer record of its id (done, cancel) is older
  than ``min.compaction.lag.ms``. Such an id is still known: its due time comes
  from the delivered record's ``delayq-deliver-at`` header. Only an id with no
  put, done or cancel in the buffer is *unknown*, and its delivery unexpected.
* Due time of an id: the latest put's, else the delivery header's, else its first
  delivery time. An id is judged when its due time falls in ``[since, until)``.
* Expected: a scheduled (or compacted-and-done) id due before ``until - grace``;
  delivered: expected and delivered at least once; missing: expected, never
  delivered; duplicate: delivered more than once; early: first delivered more than
  the tolerance before its due time; lateness: first delivery minus due time, of
  the delivered ones. Every delivery of a judged id counts, whenever it happened,
  so "missing" means "never delivered as of this run".
"""


from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from delayq.proxy import envelope as env

from .options import ReconcileOptions
from .session import ReconcileError, kafka_source_options, spark_session
from .summary import HOUR_MS, Summary, histogram

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame, SparkSession

    from delayq import Settings

WORST_LATE = 20

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


def _header(name: str, cast: str = "STRING") -> Column:
    """The first value of header ``name`` (null when absent; null too when it does not parse as ``cast``)."""
    from pyspark.sql import functions as F

    value = f"CAST(try_element_at(filter(headers, h -> h.key = '{name}'), 1).value AS STRING)"
    return F.expr(value if cast == "STRING" else f"try_cast({value} AS {cast})")


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
              .option("includeHeaders", "true")
              .option("endingOffsets", "latest"))
    if from_ms is None:
        reader = reader.option("startingOffsets", "earliest")
    else:
        # A partition with nothing that recent starts at its end instead of failing the run.
        reader = (reader.option("startingTimestamp", str(max(0, from_ms)))
                  .option("startingOffsetsByTimestampStrategy", "latest"))
    return reader.load()


def buffer_rows(raw: DataFrame) -> DataFrame:
    """One row per buffer record, with the put, cancel and done columns filled for its kind.

    A put is a record with a value that starts with the envelope's frame line
    (``put <deliver-at ms> <topic> <key length or -> [option ...]``) and carries no
    ``delayq-`` header; a cancel or done has a null value and its op in
    ``delayq-op``. Anything else, or a record without a key, counts as malformed
    and takes no part otherwise: the same records a node dead-letters.
    """
    from pyspark.sql import functions as F

    head = f"CAST(substring(value, 1, {env.MAX_FRAME_LINE}) AS STRING)"
    line = F.expr(f"substring_index({head}, '\\n', 1)")
    framed = F.expr(f"instr({head}, '\\n') > 0")
    reserved = F.expr(f"coalesce(exists(headers, h -> h.key LIKE '{env.RESERVED_PREFIX}%'), false)")
    rows = raw.select(
        F.col("key").cast("string").alias("id"),
        F.col("value").isNotNull().alias("has_value"),
        (framed & line.rlike(r"^put [0-9]{1,18} [^ ]+ (-|[0-9]+)( |$)") & ~reserved).alias("is_put"),
        F.split(line, " ").alias("frame"),
        _header(env.OP).alias("op"),
        F.col("offset"),
        F.unix_millis("timestamp").alias("ts"),
    )
    has_id = F.col("id").isNotNull()
    put = has_id & F.col("has_value") & F.col("is_put")
    tombstone = has_id & ~F.col("has_value")
    cancel = tombstone & (F.col("op") == "cancel")
    done = tombstone & (F.col("op") == "done")

    return rows.select(
        "id",
        (~(put | cancel | done)).cast("int").alias("malformed"),
        F.when(put, F.col("offset")).alias("put_offset"),
        F.when(put, F.expr("try_cast(try_element_at(frame, 2) AS BIGINT)")).alias("put_due"),
        F.when(put, F.expr("try_element_at(frame, 3)")).alias("put_topic"),
        F.when(cancel, F.col("offset")).alias("cancel_offset"),
        F.when(cancel, F.col("ts")).alias("cancel_ts"),
        F.when(done, F.col("offset")).alias("done_offset"),
    )


def delivery_rows(raw: DataFrame) -> DataFrame:
    """One row per delivered record on the target topics (records without ``delayq-id`` are not delayq's)."""
    from pyspark.sql import functions as F

    return raw.select(
        _header(env.ID).alias("id"),
        F.unix_millis("timestamp").alias("delivery_ts"),
        _header(env.DELIVER_AT, "BIGINT").alias("header_due"),
        _header(env.EPOCH, "BIGINT").alias("epoch"),
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


def per_id(buffer: DataFrame, deliveries: DataFrame, topics: list[str]) -> DataFrame:
    """Both sides grouped by delay id in one aggregation: latest put, cancel and done, and the deliveries.

    Args:
        buffer: :func:`buffer_rows`.
        deliveries: :func:`delivery_rows`.
        topics: every topic name either side may hold (put topics and target topics).
    """
    from pyspark.sql import functions as F

    both = (buffer.withColumn("put_topic", _topic_index("put_topic", topics))
            .unionByName(deliveries.withColumn("delivery_topic", _topic_index("delivery_topic", topics)),
                         allowMissingColumns=True))
    # Only fixed-width aggregation buffers (no strings, structs or sets), so Spark keeps a hash
    # aggregate instead of sorting millions of rows by id.
    grouped = both.where(F.col("id").isNotNull()).groupBy("id").agg(
        F.max("put_offset").alias("put_offset"),
        F.max_by("put_due", "put_offset").alias("put_due"),
        F.max_by("put_topic", "put_offset").alias("put_topic"),
        F.max("cancel_offset").alias("cancel_offset"),
        F.max_by("cancel_ts", "cancel_offset").alias("cancel_ms"),
        F.max("done_offset").alias("done_offset"),
        F.count("delivery_ts").alias("delivered_count"),
        F.min("delivery_ts").alias("first_ms"),
        F.max("delivery_ts").alias("last_ms"),
        F.min("header_due").alias("header_due"),
        F.min("epoch").alias("first_epoch"),
        F.max("epoch").alias("last_epoch"),
        F.min("delivery_topic").alias("delivery_topic"),
    )
    return (grouped.withColumn("put_topic", _topic_name("put_topic", topics))
            .withColumn("delivery_topic", _topic_name("delivery_topic", topics)))


def judge(ids: DataFrame, options: ReconcileOptions) -> DataFrame:
    """Decide, per id due in the window, what it was and what went wrong (rules: module docstring)."""
    from pyspark.sql import functions as F

    E = F.expr
    cancel_after_put = E("coalesce(cancel_offset > coalesce(put_offset, -1), false)")
    done_after_put = E("coalesce(done_offset > coalesce(put_offset, -1), false)")
    too_late = (F.when(done_after_put, E("done_offset < cancel_offset"))
                .otherwise(E("coalesce(first_ms < cancel_ms, false)")))
    legit = F.col("state").isin("scheduled", "compacted")
    delivered = F.col("delivered_count") > 0
    return (ids
            .withColumn("due_ms", E("coalesce(put_due, header_due, first_ms)"))
            .where((F.col("due_ms") >= options.since_ms) & (F.col("due_ms") < options.until_ms))
            .withColumn("cancel_too_late", cancel_after_put & too_late)
            .withColumn("state", F.when(cancel_after_put & ~too_late, "cancelled")
                        .when(F.col("put_offset").isNotNull(), "scheduled")
                        .when(F.col("done_offset").isNotNull() | F.col("cancel_offset").isNotNull(), "compacted")
                        .otherwise("unknown"))
            .withColumn("topic", F.coalesce("put_topic", "delivery_topic"))
            .withColumn("is_expected", legit & (F.col("due_ms") < options.expected_before_ms))
            .withColumn("in_grace", legit & (F.col("due_ms") >= options.expected_before_ms))
            .withColumn("is_delivered", F.col("is_expected") & delivered)
            .withColumn("is_missing", F.col("is_expected") & ~delivered)
            .withColumn("is_duplicate", F.col("delivered_count") > 1)
            .withColumn("is_unexpected", ~legit & delivered)
            .withColumn("is_early", E(f"coalesce(first_ms < due_ms - {options.early_tolerance_ms}, false)"))
            .withColumn("lateness_ms", F.when(F.col("is_delivered"), F.col("first_ms") - F.col("due_ms")))
            .select("id", "topic", "state", "due_ms", "delivered_count", "first_ms", "last_ms", "lateness_ms",
                    "first_epoch", "last_epoch", "cancel_ms", "cancel_too_late", "is_expected", "in_grace",
                    "is_delivered", "is_missing", "is_duplicate", "is_unexpected", "is_early"))


def _lateness_key() -> Column:
    """Lateness exact below 1 s, else kept to three significant digits (see summary.py)."""
    from pyspark.sql import functions as F

    return F.expr("CASE WHEN abs(lateness_ms) < 1000 THEN lateness_ms ELSE "
                  "CAST(round(lateness_ms / pow(10, floor(log10(abs(lateness_ms))) - 2)) "
                  "* pow(10, floor(log10(abs(lateness_ms))) - 2) AS BIGINT) END")


def summary_groups(judged: DataFrame) -> DataFrame:
    """Counts per (topic, hour of due time, lateness value): small, and all the report's figures sum from it."""
    from pyspark.sql import functions as F

    def count_of(condition: Column) -> Column:
        return F.count(F.when(condition, 1))

    flag = F.col
    return judged.groupBy(
        "topic", (F.floor(F.col("due_ms") / HOUR_MS) * HOUR_MS).alias("hour_ms"), _lateness_key().alias("lateness_key"),
    ).agg(
        count_of(flag("is_expected")).alias("expected"),
        count_of(flag("is_delivered")).alias("delivered"),
        F.sum("delivered_count").alias("delivered_records"),
        count_of(flag("is_duplicate")).alias("duplicates"),
        F.sum(F.when(flag("is_duplicate"), F.col("delivered_count") - 1)).alias("duplicate_records"),
        count_of(flag("is_missing")).alias("missing"),
        count_of(flag("is_unexpected")).alias("unexpected"),
        count_of(flag("is_unexpected") & (F.col("state") == "unknown")).alias("unknown"),
        count_of(flag("is_early")).alias("early"),
        count_of(F.col("state") == "cancelled").alias("cancelled"),
        count_of(flag("cancel_too_late")).alias("cancelled_too_late"),
        count_of(flag("in_grace")).alias("in_grace"),
        F.count("lateness_ms").alias("lateness_n"),
    )


def _topics_on_broker(settings: Settings, topics: list[str]) -> set[str]:
    from confluent_kafka.admin import AdminClient

    try:
        metadata = AdminClient(settings.kafka_conf()).list_topics(timeout=15)
    except Exception as err:  # KafkaException carries the cause; the user needs the address tried
        raise ReconcileError(f"Kafka at {settings.bootstrap_servers} did not answer: {err}") from err
    return {t for t in topics if t in metadata.topics and metadata.topics[t].error is None}


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
    if not _topics_on_broker(settings, [settings.buffer_topic]):
        raise ReconcileError(f"buffer topic {settings.buffer_topic!r} does not exist on {settings.bootstrap_servers}:"
                             " run `delayq init`, or set DELAYQ_BUFFER_TOPIC / DELAYQ_CLUSTER to the cluster's")
    say("starting Spark (the first run resolves the Kafka source from Maven)")
    spark = spark or spark_session(options.master, maven_repository=options.maven_repository,
                                   conf=options.spark_conf)
    lap("spark_start")

    say(f"reading the buffer topic {settings.buffer_topic}")
    buffer = buffer_rows(read_topics(spark, settings, options, [settings.buffer_topic]))
    buffer = buffer.persist(StorageLevel.MEMORY_AND_DISK)
    seen = buffer.agg(F.count(F.lit(1)).alias("records"), F.sum("malformed").alias("malformed"),
                      F.collect_set("put_topic").alias("topics")).first()
    put_topics = sorted(seen["topics"])
    lap("buffer")

    wanted = put_topics if options.topics is None else list(options.topics)
    present = _topics_on_broker(settings, wanted)
    targets = [t for t in wanted if t in present]
    missing_topics = [t for t in wanted if t not in present]
    say(f"reading {len(targets)} target topic(s) and judging every delay id")
    if targets:
        raw = read_topics(spark, settings, options, targets, from_ms=options.since_ms - options.lookback_ms)
    else:
        raw = spark.createDataFrame([], _KAFKA_SCHEMA)
    ids = per_id(buffer, delivery_rows(raw), sorted(set(put_topics) | set(targets)))
    judged = judge(ids, options).persist(StorageLevel.MEMORY_AND_DISK)
    judged.count()
    buffer.unpersist()
    lap("judge")

    say("summing up: totals, topics, hours, lateness")
    summary = Summary.of(r.asDict() for r in summary_groups(judged).collect())
    worst = (judged.where(F.col("is_delivered")).orderBy(F.desc("lateness_ms"), "id").limit(WORST_LATE)
             .select("id", "topic", "due_ms", "first_ms", "lateness_ms", "delivered_count", "first_epoch",
                     "last_epoch").collect())
    lap("summaries")

    say("collecting the anomalies")
    flags = F.col("is_missing") | F.col("is_duplicate") | F.col("is_unexpected") | F.col("is_early")
    anomalies = judged.where(flags).orderBy("due_ms", "id").toArrow()
    judged.unpersist()
    lap("anomalies")
    totals = {**summary.overall.counts, "buffer_records": int(seen["records"]),
              "malformed_buffer_records": int(seen["malformed"] or 0)}
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
    )


_KAFKA_SCHEMA = ("key BINARY, value BINARY, topic STRING, partition INT, offset BIGINT, timestamp TIMESTAMP, "
                 "timestampType INT, headers ARRAY<STRUCT<key: STRING, value: BINARY>>")
