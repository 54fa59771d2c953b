"""The reconciliation's rules, id by id, on buffer and target records made in memory (a local Spark, no Kafka).

Each history is a handful of records shaped as Spark's Kafka source reads them; all
histories go through the job's own steps (buffer_rows, delivery_rows, per_version,
per_id, judge) in one Spark run, and each test looks at its own ids. Every history has
a real delay id (a UUIDv7) and its records are on that id's buffer partition, as the
nodes require; offsets are those of that partition, and a history names them explicitly.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from delayq import wire
from delayq.schedule import Series
from delayq.spark import ReconcileOptions, spark_session
from delayq.spark.follow import emitted_histories, history_rows, judge_histories, step_input
from delayq.spark.job import KAFKA_SCHEMA, buffer_rows, delivery_rows, judge, per_id, per_version
from delayq.spark.records import DEAD_LETTER_SCHEMA

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

T0 = 1_800_000_000_000  # 2027-01-15T08:00:00Z: every history is due around here
BUFFER = "rules-buffer"
PARTITIONS = 3  # of the buffer topic the histories are on
TOPIC = "orders"
OPTIONS = ReconcileOptions(since_ms=T0 - 3_600_000, until_ms=T0 + 3_600_000, out=Path("unused"))


def _time(ms: int) -> datetime:
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)


class History:
    """The records of one delay id: buffer records at the offsets given, deliveries on the target topic."""

    def __init__(self, name: str):
        self.name = name
        self.id = wire.new_delay_id(T0 - 7_200_000)
        self.partition = wire.buffer_partition(self.id, PARTITIONS)
        self.buffer: list[tuple] = []
        self.deliveries: list[tuple] = []
        self.letters: list[tuple] = []

    def _record(self, offset: int, value: bytes | None, headers: list[tuple[str, bytes]], ts: int,
                partition: int | None = None) -> History:
        where = self.partition if partition is None else partition
        self.buffer.append((self.id.encode(), value, BUFFER, where, offset, _time(ts), 0, headers))
        return self

    def put(self, offset: int, due: int, restores: int | None = None, at: int | None = None) -> History:
        """A put written at ``at`` (default: before it is due); with ``restores``, a master's copy."""
        value = wire.put_value(due, TOPIC, None, b"payload", restores=restores)
        return self._record(offset, value, [], T0 - 3_000_000 + offset if at is None else at)

    def occurrence(self, offset: int, due: int, number: int, follows: int | None = None,
                   cutoff: int | None = None) -> History:
        """A put of occurrence ``number`` of a series (every 1 s); ``follows``: the master's, after that put,
        picked under ``cutoff`` (default: the next-occurrence put's own offset)."""
        if follows is not None and cutoff is None:
            cutoff = offset
        options = wire.schedule_options(Series(every_ms=1000), number, None, follows, cutoff)
        value = wire.put_value(due, TOPIC, None, b"payload", more_options=options)
        return self._record(offset, value, [], T0 - 3_000_000 + offset if follows is None else due - 1000)

    def cancel(self, offset: int, at: int | None = None, partition: int | None = None) -> History:
        """A cancel; ``partition``: written to another partition than the id's (malformed)."""
        return self._record(offset, None, wire.control_headers(wire.OP_CANCEL, self.id),
                            T0 - 3_000_000 + offset if at is None else at, partition)

    def done(self, offset: int, version: int, cutoff: int) -> History:
        """The master's done of ``version``, picked with the partition read below ``cutoff``."""
        return self._record(offset, None, wire.done_headers(self.id, version, cutoff), T0 + offset)

    def raw(self, offset: int, value: bytes | None, headers: list[tuple[str, bytes]]) -> History:
        """Any buffer record, for the malformed ones."""
        return self._record(offset, value, headers, T0)

    def dead_letter(self, version: int, code: wire.Reason = wire.Reason.MISSING_TOPIC, due: int = T0) -> History:
        """The master's dead letter of version ``version`` (undeliverable), as dead_letter_rows reads it."""
        self.letters.append((self.id, self.id, self.partition, version, T0 + 50, code.value, "no such topic",
                             f"{BUFFER}/{self.partition}/{version}", version, due, TOPIC, True))
        return self

    def deliver(self, at: int, due: int | None, version: int | None = None, epoch: int = 1) -> History:
        """A delivery of ``version`` (as masters write it); without one, a record no master writes."""
        headers = [(wire.ID, self.id.encode()), (wire.EPOCH, str(epoch).encode())]
        if due is not None:
            headers.append((wire.DELIVER_AT, str(due).encode()))
        if version is not None:
            headers.append((wire.VERSION, str(version).encode()))
        self.deliveries.append((b"user-key", b"payload", TOPIC, 0, len(self.deliveries), _time(at), 0, headers))
        return self


def histories() -> list[History]:
    h = History
    return [
        # A cancel below the cutoff of the done that closed the delivered version: seen, ignored.
        h("cancel-below-cutoff").put(0, T0).cancel(1).deliver(T0 + 5, T0, 0).done(2, 0, 2),
        # The first cancel after the put counts, not a later repeat above the cutoff.
        h("first-cancel-below-cutoff").put(0, T0).cancel(1).cancel(5).deliver(T0 + 5, T0, 0).done(6, 0, 3),
        # A cancel at the cutoff, written after the due time, lost the race, though the done came after it.
        h("cancel-at-cutoff").put(0, T0).cancel(1, at=T0 + 1).deliver(T0 + 5, T0, 0).done(2, 0, 1),
        # A cancel, a new put (the id lives again), then a cancel at the cutoff written after due: too late.
        h("revived-cancel-too-late").put(0, T0).cancel(1).put(2, T0 + 1000).cancel(3, at=T0 + 1001)
        .deliver(T0 + 1005, T0 + 1000, 2).done(4, 2, 3),
        # The same with the second cancel below the cutoff: ignored.
        h("revived-cancel-ignored").put(0, T0).cancel(1).put(2, T0 + 1000).cancel(3)
        .deliver(T0 + 1005, T0 + 1000, 2).done(4, 2, 4),
        # Cancelled in time, never delivered.
        h("cancelled").put(0, T0).cancel(1),
        # Rescheduled before the pick: only the new version delivered.
        h("rescheduled-in-time").put(0, T0).put(1, T0 + 1000).deliver(T0 + 1004, T0 + 1000, 1).done(2, 1, 2),
        # Rescheduled too late (written after the old due time, at its cutoff): old version, then the new one.
        h("rescheduled-too-late").put(0, T0).put(1, T0 + 1000, at=T0 + 1).deliver(T0 + 2, T0, 0).done(2, 0, 1)
        .deliver(T0 + 1004, T0 + 1000, 1).done(3, 1, 3),
        # The reschedule lost and the new version never came: missing, and not early.
        h("lost-reschedule").put(0, T0).put(1, T0 + 60_000, at=T0 + 1).deliver(T0 + 2, T0, 0).done(2, 0, 1),
        # The master had read the reschedule and delivered the old version: ignored.
        h("reschedule-ignored").put(0, T0).put(1, T0 + 1000).deliver(T0 + 2, T0, 0).done(2, 0, 2)
        .deliver(T0 + 1004, T0 + 1000, 1).done(3, 1, 3),
        # Three puts: the latest is above the old version's cutoff, the middle one below it.
        h("middle-reschedule-ignored").put(0, T0).put(1, T0 + 1000).put(3, T0 + 2000)
        .deliver(T0 + 2, T0, 0).done(2, 0, 2).deliver(T0 + 2003, T0 + 2000, 3).done(4, 3, 4),
        # A cancel the master had read, delivered anyway; then a new put (the id lives again), delivered.
        h("older-cancel-ignored").put(0, T0).cancel(1).deliver(T0 + 5, T0, 0).done(2, 0, 2)
        .put(3, T0 + 1000).deliver(T0 + 1005, T0 + 1000, 3).done(4, 3, 4),
        # One version delivered twice.
        h("duplicate").put(0, T0).deliver(T0 + 5, T0, 0).deliver(T0 + 800, T0, 0, epoch=2).done(1, 0, 1),
        # A rewritten copy of the put (same frame, higher offset) is just the latest put.
        h("put-copied").put(0, T0).put(1, T0).deliver(T0 + 3, T0, 1).done(2, 1, 2),
        # A late reschedule whose put the old version's done came to follow: the master copied it
        # (restores=1), and delivered the copy.
        h("copy-delivered").put(0, T0).put(1, T0 + 1000, at=T0 + 1).deliver(T0 + 2, T0, 0).done(2, 0, 1)
        .put(3, T0 + 1000, restores=1, at=T0 + 3).deliver(T0 + 1004, T0 + 1000, 3).done(4, 3, 4),
        # ... a cancel overtook the copy: nodes ignore it and close it with a done; the cancel counts.
        h("copy-after-cancel").put(0, T0).put(1, T0 + 1000, at=T0 + 1).deliver(T0 + 2, T0, 0).done(2, 0, 1)
        .cancel(3, at=T0 + 3).put(4, T0 + 1000, restores=1, at=T0 + 4).done(5, 4, 5),
        # ... a newer put overtook the copy: ignored; the newer put is copied and delivered. The copies carry
        # the timestamps of the puts they copy, older than the newer put's: a master's put is never reordered.
        h("copy-overtaken").put(0, T0).put(1, T0 + 1000, at=T0 + 1).deliver(T0 + 2, T0, 0).done(2, 0, 1)
        .put(3, T0 + 2000, at=T0 + 500).put(4, T0 + 1000, restores=1, at=T0 + 1)
        .put(5, T0 + 2000, restores=3, at=T0 + 500).deliver(T0 + 2004, T0 + 2000, 5).done(6, 5, 6),
        # A delivery without delayq-version names no put: no master writes it.
        h("unversioned-delivery").put(0, T0).deliver(T0 + 3, T0, 0).done(1, 0, 1).deliver(T0 + 9, T0),
        # Fallback rules without a cutoff: compaction removed the put, then a cancel came after its done: too late.
        h("compacted-done-then-cancel").done(1, 0, 1).deliver(T0 + 3, T0, 0).cancel(2, at=T0 + 100),
        # ... no done (yet) of the latest version: the delivery was written before the cancel record.
        h("no-done-cancel-after-delivery").put(0, T0).deliver(T0 + 3, T0, 0).cancel(1, at=T0 + 100),
        # A delivery naming a put whose due time is not its deliver-at.
        h("version-mismatch").put(0, T0).deliver(T0 + 10, T0 + 5, 0).done(1, 0, 1),
        # Early against the due time of the version it delivered.
        h("early").put(0, T0).deliver(T0 - 5000, T0, 0).done(1, 0, 1),
        # Compaction left only the done: known, delivered, due time from the delivery.
        h("compacted").done(7, 3, 8).deliver(T0 + 5, T0, 3),
        # No buffer record at all.
        h("unknown").deliver(T0 + 5, T0, 4),
        # Malformed tombstones take no part: a cancel with a version, a done with a bad cutoff, a done
        # without version and cutoff (the done before it closes the delivered version).
        h("malformed-tombstones").put(0, T0).raw(1, None, [(wire.OP, wire.OP_CANCEL), (wire.VERSION, b"0")])
        .deliver(T0 + 4, T0, 0).raw(2, None, [(wire.OP, wire.OP_DONE), (wire.CUTOFF, b"x1")])
        .raw(3, None, [(wire.OP, wire.OP_DONE)]),
        # A cancel on another partition than the id's is malformed (wrong-partition): its offset, of
        # another partition, is never compared with the put's, and the delivery stands.
        h("cancel-on-wrong-partition").put(0, T0).cancel(1, partition=-1).deliver(T0 + 4, T0, 0).done(2, 0, 2),
        # Undeliverable: the master dead-lettered the version (and closed it with a done); not missing.
        h("dead-lettered").put(0, T0).done(1, 0, 1).dead_letter(0),
        # ... a dead letter of an older version does not excuse the latest one.
        h("older-version-dead-lettered").put(0, T0).done(1, 0, 1).dead_letter(0).put(2, T0 + 1000),
        # ... compaction left only the done: known, its due time from the dead letter's frame.
        h("compacted-dead-lettered").done(5, 4, 5).dead_letter(4, due=T0 + 7),
        # A series of three occurrences, each put by the master with the last one's delivery.
        h("series").occurrence(0, T0, 1).deliver(T0 + 5, T0, 0).occurrence(1, T0 + 1000, 2, follows=0)
        .deliver(T0 + 1004, T0 + 1000, 1).occurrence(2, T0 + 2000, 3, follows=1).deliver(T0 + 2003, T0 + 2000, 2)
        .done(3, 2, 3),
        # ... an occurrence followed by the next, never delivered: skipped.
        h("series-skipped").occurrence(0, T0, 1).occurrence(1, T0 + 1000, 2, follows=0)
        .deliver(T0 + 1004, T0 + 1000, 1).done(2, 1, 2),
        # ... one occurrence delivered twice.
        h("series-duplicate").occurrence(0, T0, 1).deliver(T0 + 5, T0, 0).deliver(T0 + 9, T0, 0, epoch=2)
        .occurrence(1, T0 + 1000, 2, follows=0).deliver(T0 + 1004, T0 + 1000, 1).done(2, 1, 2),
        # ... cancelled after the first occurrence: nothing more expected.
        h("series-cancelled").occurrence(0, T0, 1).deliver(T0 + 5, T0, 0).occurrence(1, T0 + 1000, 2, follows=0)
        .cancel(2, at=T0 + 100),
        # ... a cancel that raced the first occurrence's delivery (written before the delivery record,
        # above the cutoff the occurrence was picked under): the next-occurrence put after it is ignored
        # (nodes ignore it, the master closes it with a done), and the series ends.
        h("series-cancel-raced").occurrence(0, T0, 1).cancel(1, at=T0 + 3).deliver(T0 + 5, T0, 0)
        .occurrence(2, T0 + 1000, 2, follows=0, cutoff=1).done(3, 2, 3),
        # ... a cancel below that cutoff: the master had read it and delivered anyway.
        h("series-cancel-ignored").occurrence(0, T0, 1).cancel(1, at=T0 - 500).deliver(T0 + 5, T0, 0)
        .occurrence(2, T0 + 1000, 2, follows=0, cutoff=2).done(3, 2, 3),
        # The case: a put's batch retried after its own cancel (created 1.4 s later) was appended.
        h("reordered-cancel").put(6588, T0, at=T0 - 60_000).cancel(6514, at=T0 - 58_600)
        .deliver(T0 + 4, T0, 6588).done(6590, 6588, 6589),
        # ... and a reschedule: the older version (created first) appended after the newer one.
        h("reordered-reschedule").put(0, T0 + 1000, at=T0 - 10_000).put(1, T0, at=T0 - 20_000)
        .deliver(T0 + 3, T0, 1).done(2, 1, 2),
        # One put written twice (same value, headers, timestamp: a client library's resend), delivered once.
        h("twice-written").put(0, T0, at=T0 - 60_000).put(1, T0, at=T0 - 60_000).deliver(T0 + 4, T0, 0)
        .done(2, 0, 2),
        # ... delivered twice, once per copy: one version delivered twice.
        h("twice-written-delivered-twice").put(0, T0, at=T0 - 60_000).put(1, T0, at=T0 - 60_000)
        .deliver(T0 + 4, T0, 0).done(2, 0, 2).deliver(T0 + 9, T0, 1).done(3, 1, 3),
        # ... its copy appended after a cancel: no new version, the cancel stands.
        h("twice-written-around-cancel").put(0, T0, at=T0 - 60_000).cancel(1, at=T0 - 50_000)
        .put(2, T0, at=T0 - 60_000),
        # ... and delivered as the copy's version anyway, below the done's cutoff: the cancel was ignored ...
        h("twice-written-around-cancel-delivered").put(0, T0, at=T0 - 900_000).cancel(1, at=T0 - 600_000)
        .put(2, T0, at=T0 - 900_000).deliver(T0 + 5, T0, 2).done(3, 2, 3),
        # ... unless the cancel was written after the due time: too late.
        h("twice-written-around-late-cancel").put(0, T0, at=T0 - 60_000).cancel(1, at=T0 + 1)
        .put(2, T0, at=T0 - 60_000).deliver(T0 + 5, T0, 0).done(3, 0, 1),
        # A cancel written twice, its copy after a new put (the id lives again): the copy cancels nothing.
        h("cancel-twice-written").put(0, T0, at=T0 - 60_000).cancel(1, at=T0 - 50_000).put(2, T0 + 1000, at=T0 - 40_000)
        .cancel(3, at=T0 - 50_000).deliver(T0 + 1004, T0 + 1000, 2).done(4, 2, 4),
        # A copy shadows its id (it is the id's newest record), so the master repairs the buffer: a pending put
        # written again (restores=), the restored put delivered ...
        h("twice-written-repaired").put(0, T0, at=T0 - 60_000).put(1, T0, at=T0 - 60_000)
        .put(2, T0, restores=0, at=T0 - 60_000).deliver(T0 + 4, T0, 2).done(3, 2, 3),
        # ... the put a cancel's copy came after written again ...
        h("cancel-twice-written-repaired").put(0, T0, at=T0 - 60_000).cancel(1, at=T0 - 50_000)
        .put(2, T0 + 1000, at=T0 - 40_000).cancel(3, at=T0 - 50_000).put(4, T0 + 1000, restores=2, at=T0 - 40_000)
        .deliver(T0 + 1004, T0 + 1000, 4).done(5, 4, 5),
        # ... or, with nothing pending, the copy closed by a done naming it: a put's or a cancel's.
        h("twice-written-closed").put(0, T0, at=T0 - 60_000).cancel(1, at=T0 - 50_000).put(2, T0, at=T0 - 60_000)
        .done(3, 2, 3),
        h("cancel-twice-written-closed").put(0, T0, at=T0 - 60_000).cancel(1, at=T0 - 50_000)
        .cancel(2, at=T0 - 50_000).done(3, 2, 3),
        # A producer epoch bump resends two batches: puts A and B, then A and B again; B delivered once,
        # the delivery naming B itself or its copy.
        h("resent-pair").put(0, T0, at=T0 - 60_000).put(1, T0 + 1000, at=T0 - 50_000).put(2, T0, at=T0 - 60_000)
        .put(3, T0 + 1000, at=T0 - 50_000).deliver(T0 + 1004, T0 + 1000, 1).done(4, 1, 4),
        h("resent-pair-copy-delivered").put(0, T0, at=T0 - 60_000).put(1, T0 + 1000, at=T0 - 50_000)
        .put(2, T0, at=T0 - 60_000).put(3, T0 + 1000, at=T0 - 50_000).deliver(T0 + 1004, T0 + 1000, 3)
        .done(4, 3, 4),
        # Cancels that lost the race to a delivery, by what shows it: written after the due time ...
        h("cancel-written-after-due").put(0, T0, at=T0 - 60_000).cancel(1, at=T0 + 2).deliver(T0 + 5, T0, 0)
        .done(2, 0, 1),
        # ... appended after the delivery's done (created before the due time: its acknowledgement lagged) ...
        h("cancel-after-done").put(0, T0, at=T0 - 60_000).deliver(T0 + 5, T0, 0).done(1, 0, 1)
        .cancel(2, at=T0 - 30_000),
        # ... neither: above the cutoff, below the done, created 10 minutes before due (longer than any
        # acknowledgement may take: the ack grace), and delivered: ignored;
        h("cancel-ignored-by-time").put(0, T0, at=T0 - 900_000).cancel(2, at=T0 - 600_000)
        .deliver(T0 + 5, T0, 0).done(3, 0, 1),
        # ... created 2 s before due, within the ack grace: too late by the master's cutoff only.
        h("cancel-by-cutoff").put(0, T0, at=T0 - 60_000).cancel(2, at=T0 - 2000).deliver(T0 + 5, T0, 0)
        .done(3, 0, 1),
        # The same for reschedules: created 10 minutes before the old version's due time, which was delivered ...
        h("reschedule-ignored-by-time").put(0, T0, at=T0 - 900_000).put(2, T0 + 1000, at=T0 - 600_000)
        .deliver(T0 + 2, T0, 0).done(3, 0, 1).deliver(T0 + 1004, T0 + 1000, 2).done(4, 2, 4),
        # ... 2 s before it ...
        h("reschedule-by-cutoff").put(0, T0, at=T0 - 60_000).put(2, T0 + 1000, at=T0 - 2000)
        .deliver(T0 + 2, T0, 0).done(3, 0, 1).deliver(T0 + 1004, T0 + 1000, 2).done(4, 2, 4),
        # ... or appended after the old version's done.
        h("reschedule-after-done").put(0, T0, at=T0 - 60_000).deliver(T0 + 2, T0, 0).done(1, 0, 1)
        .put(2, T0 + 1000, at=T0 - 30_000).deliver(T0 + 1004, T0 + 1000, 2).done(3, 2, 3),
        # Written when it was already due: no lateness; the delay from put to delivery instead.
        h("already-due").put(0, T0, at=T0 + 60_000).deliver(T0 + 60_020, T0, 0).done(1, 0, 1),
        h("written-at-due-time").put(0, T0, at=T0).deliver(T0 + 9, T0, 0).done(1, 0, 1),
    ]


def _fix_partitions(cases: list[History]) -> None:
    """A record meant for another partition than its id's (``partition=-1``) goes to the next one."""
    for history in cases:
        history.buffer = [(*r[:3], (history.partition + 1) % PARTITIONS if r[3] == -1 else r[3], *r[4:])
                          for r in history.buffer]


def judged(cases: list[History], options: ReconcileOptions = OPTIONS, path: str = "batch") -> DataFrame:
    """The job's verdicts on ``cases``: buffer_rows, delivery_rows, per_version, per_id and judge.

    ``path``: "batch", as the batch job calls them; "follow", as the continuous job does (follow.py): the
    three sides as the history rows it keeps per id, judged by judge_histories at the window's end.
    """
    spark = spark_session("local[2]")
    _fix_partitions(cases)
    buffer = buffer_rows(spark.createDataFrame([r for h in cases for r in h.buffer], KAFKA_SCHEMA), PARTITIONS)
    deliveries = delivery_rows(spark.createDataFrame([r for h in cases for r in h.deliveries], KAFKA_SCHEMA))
    letters = spark.createDataFrame([r for h in cases for r in h.letters], DEAD_LETTER_SCHEMA)
    if path == "follow":
        from pyspark.sql import functions as F

        # Each id's records as the stateful step keeps and emits them (JSON), read back as the sink reads them.
        emitted = (step_input(history_rows(buffer, deliveries, letters)).groupBy("id")
                   .agg(F.concat(F.lit("["), F.concat_ws(",", F.collect_list("record")), F.lit("]")).alias("records"))
                   .select("id", "records", F.lit(0).alias("fresh_from"), F.lit(0).cast("bigint").alias("judged_at"),
                           F.lit(True).alias("judge")))
        return judge_histories(emitted_histories(emitted), [TOPIC], options, options.expected_before_ms)
    versions = per_version(buffer, deliveries, [TOPIC], options.early_tolerance_ms, dead_letters=letters,
                           reorder_tolerance_ms=options.reorder_tolerance_ms)
    return judge(per_id(versions, [TOPIC], ack_grace_ms=options.ack_grace_ms), options)


# Every rule below is tested once against both jobs: one definition of exactly-once (follow.py's docstring).
@pytest.fixture(scope="module", params=["batch", "follow"])
def verdicts(request) -> dict[str, dict]:
    spark = spark_session("local[2]")
    cases = histories()
    names = {h.id: h.name for h in cases}
    partitions = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", "2")  # a hundred rows: more tasks would only cost time
    try:
        return {names[row["id"]]: row.asDict() for row in judged(cases, path=request.param).collect()}
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", partitions)


ANOMALIES = ("is_missing", "is_duplicate", "is_unexpected", "is_early", "is_cancel_ignored", "is_reordered")


def anomalies(verdict: dict) -> set[str]:
    return {name for name in ANOMALIES if verdict[name]}


@pytest.mark.parametrize("name,ignored", [
    ("cancel-below-cutoff", "cancel"), ("first-cancel-below-cutoff", "cancel"), ("revived-cancel-ignored", "cancel"),
    ("reschedule-ignored", "reschedule"), ("middle-reschedule-ignored", "reschedule"),
    ("older-cancel-ignored", "cancel"),
])
def test_a_cancel_or_reschedule_below_the_cutoff_and_a_delivery_anyway_is_cancel_ignored(verdicts, name, ignored):
    verdict = verdicts[name]
    assert anomalies(verdict) == {"is_cancel_ignored"}
    assert verdict["ignored"] == ignored


def test_a_cancel_written_after_due_at_or_after_the_cutoff_lost_the_race_and_the_delivery_stands(verdicts):
    for name in ("cancel-at-cutoff", "revived-cancel-too-late"):
        verdict = verdicts[name]
        assert anomalies(verdict) == set(), name
        assert (verdict["state"], verdict["cancel_too_late"], verdict["is_delivered"]) == ("scheduled", True, True)


def test_a_cancel_in_time_leaves_nothing_expected(verdicts):
    verdict = verdicts["cancelled"]
    assert (verdict["state"], verdict["is_expected"], verdict["cancel_too_late"]) == ("cancelled", False, False)
    assert anomalies(verdict) == set()


def test_deliveries_are_judged_per_version(verdicts):
    in_time, late = verdicts["rescheduled-in-time"], verdicts["rescheduled-too-late"]
    assert anomalies(in_time) == anomalies(late) == set()
    assert (in_time["due_ms"], in_time["lateness_ms"], in_time["versions_delivered"]) == (T0 + 1000, 4, 1)
    assert (late["due_ms"], late["lateness_ms"], late["delivered_count"], late["versions_delivered"]) == \
        (T0 + 1000, 4, 2, 2)
    assert late["rescheduled_too_late"] and not in_time["rescheduled_too_late"]
    copied = verdicts["put-copied"]
    assert anomalies(copied) == set() and copied["version"] == 1


def test_a_masters_copy_of_a_put_counts_only_while_the_version_it_restores_is_pending(verdicts):
    delivered, overtaken = verdicts["copy-delivered"], verdicts["copy-overtaken"]
    assert anomalies(delivered) == anomalies(overtaken) == set()
    assert (delivered["version"], delivered["due_ms"], delivered["lateness_ms"]) == (3, T0 + 1000, 4)
    assert (overtaken["version"], overtaken["due_ms"], overtaken["lateness_ms"]) == (5, T0 + 2000, 4)
    cancelled = verdicts["copy-after-cancel"]
    assert anomalies(cancelled) == set()
    assert (cancelled["state"], cancelled["version"], cancelled["rescheduled_too_late"]) == ("cancelled", 1, True)


def test_each_occurrence_of_a_series_is_a_version_judged_on_its_own_due_time(verdicts):
    series = verdicts["series"]
    assert anomalies(series) == set() and not series["rescheduled_too_late"]
    assert (series["version"], series["due_ms"], series["delivered_count"], series["versions_delivered"],
            series["lateness_ms"]) == (2, T0 + 2000, 3, 3, 3)
    assert anomalies(verdicts["series-skipped"]) == {"is_missing"}
    assert anomalies(verdicts["series-duplicate"]) == {"is_duplicate"}
    cancelled, raced = verdicts["series-cancelled"], verdicts["series-cancel-raced"]
    assert anomalies(cancelled) == set() and cancelled["state"] == "cancelled" and not cancelled["is_expected"]
    # The raced cancel lost to the first occurrence (delivered, as expected) and ended the series.
    assert anomalies(raced) == set() and raced["cancel_too_late"] and raced["is_delivered"]
    assert (raced["version"], raced["delivered_count"]) == (0, 1)
    assert anomalies(verdicts["series-cancel-ignored"]) == {"is_cancel_ignored"}


def test_a_lost_reschedule_is_missing_never_early(verdicts):
    verdict = verdicts["lost-reschedule"]
    assert anomalies(verdict) == {"is_missing"}
    assert verdict["due_ms"] == T0 + 60_000 and verdict["rescheduled_too_late"]


def test_a_duplicate_is_one_version_delivered_twice(verdicts):
    verdict = verdicts["duplicate"]
    assert anomalies(verdict) == {"is_duplicate"}
    assert (verdict["delivered_count"], verdict["duplicate_records"], verdict["versions_delivered"]) == (2, 1, 1)
    assert (verdict["first_epoch"], verdict["last_epoch"]) == (1, 2)


def test_without_a_cutoff_a_cancel_after_the_done_or_the_delivery_was_too_late(verdicts):
    compacted, undone = verdicts["compacted-done-then-cancel"], verdicts["no-done-cancel-after-delivery"]
    assert anomalies(compacted) == anomalies(undone) == set()
    assert (compacted["state"], compacted["cancel_too_late"], compacted["is_delivered"]) == ("compacted", True, True)
    assert (undone["state"], undone["cancel_too_late"], undone["is_delivered"]) == ("scheduled", True, True)


def test_a_delivery_without_a_version_is_unexpected(verdicts):
    verdict = verdicts["unversioned-delivery"]
    assert anomalies(verdict) == {"is_unexpected"}
    assert (verdict["is_delivered"], verdict["delivered_count"], verdict["lateness_ms"]) == (True, 2, 3)
    assert not verdict["rescheduled_too_late"], "no older version: a record that names none"


def test_early_is_against_the_delivered_version_and_a_wrong_version_header_is_unexpected(verdicts):
    assert anomalies(verdicts["early"]) == {"is_early"}
    assert anomalies(verdicts["version-mismatch"]) == {"is_unexpected"}


def test_compacted_ids_are_known_and_unknown_ones_unexpected(verdicts):
    compacted, unknown = verdicts["compacted"], verdicts["unknown"]
    assert (compacted["state"], compacted["is_delivered"], compacted["due_ms"]) == ("compacted", True, T0)
    assert anomalies(compacted) == set()
    assert unknown["state"] == "unknown" and anomalies(unknown) == {"is_unexpected"}


def test_malformed_tombstones_take_no_part(verdicts):
    verdict = verdicts["malformed-tombstones"]
    assert anomalies(verdict) == set() and verdict["state"] == "scheduled" and verdict["is_delivered"]
    spark = spark_session("local[2]")
    a, b = wire.new_delay_id(), wire.new_delay_id()
    key = a.encode()
    records = [
        (key, None, [(wire.OP, b"cancel"), (wire.CUTOFF, b"3")]),            # a cutoff is a done's
        (key, None, [(wire.OP, b"done"), (wire.VERSION, b"-1")]),            # not digits
        (key, None, [(wire.OP, b"done"), (wire.OP, b"done")]),               # a header twice
        (key, None, [(wire.OP, b"done"), (wire.ID, b.encode())]),            # an id that is not the key
        (key, None, [(wire.OP, b"done"), (wire.ID, key)]),                   # no version, no cutoff
        (key, None, [(wire.OP, b"done"), (wire.ID, key), (wire.VERSION, b"0")]),  # no cutoff
        (key, None, [(wire.OP, b"done"), (wire.ID, key), (wire.VERSION, b"0"), (wire.CUTOFF, b"1")]),  # fine
        (key, None, [(wire.OP, b"cancel"), (wire.ID, key)]),                 # fine
    ]
    where = wire.buffer_partition(a, PARTITIONS)
    rows = [(k, value, BUFFER, where, i, _time(T0), 0, headers) for i, (k, value, headers) in enumerate(records)]
    found = buffer_rows(spark.createDataFrame(rows, KAFKA_SCHEMA), PARTITIONS).orderBy("offset").collect()
    assert [(r["kind"], r["code"], r["malformed"]) for r in found] == [
        *[(None, "bad-control", 1)] * 6, (2, None, 0), (1, None, 0)]
    assert (found[6]["version"], found[6]["cutoff"]) == (0, 1)


def test_a_cancel_on_another_partition_is_malformed_and_takes_no_part(verdicts):
    verdict = verdicts["cancel-on-wrong-partition"]
    assert anomalies(verdict) == set()
    assert (verdict["state"], verdict["is_delivered"], verdict["cancel_offset"]) == ("scheduled", True, None)


def test_a_dead_lettered_version_is_undeliverable_not_missing(verdicts):
    letter = verdicts["dead-lettered"]
    assert anomalies(letter) == set()
    assert (letter["is_expected"], letter["is_delivered"], letter["is_undeliverable"], letter["dead_letters"]) == \
        (True, False, True, 1)
    older = verdicts["older-version-dead-lettered"]
    assert anomalies(older) == {"is_missing"} and not older["is_undeliverable"]
    compacted = verdicts["compacted-dead-lettered"]
    assert anomalies(compacted) == set()
    assert (compacted["state"], compacted["due_ms"], compacted["is_undeliverable"]) == ("compacted", T0 + 7, True)


def test_a_put_written_when_already_due_has_no_lateness_but_a_delay_from_put_to_delivery(verdicts):
    late = verdicts["already-due"]
    assert anomalies(late) == set() and late["is_delivered"]
    assert (late["already_due"], late["lateness_ms"], late["put_to_delivery_ms"]) == (True, None, 20)
    at_due = verdicts["written-at-due-time"]  # written at its due time: already due too
    assert (at_due["already_due"], at_due["lateness_ms"], at_due["put_to_delivery_ms"]) == (True, None, 9)
    on_time = verdicts["rescheduled-in-time"]
    assert (on_time["already_due"], on_time["put_to_delivery_ms"]) == (False, None)


def test_producer_writes_whose_offset_and_creation_order_disagree_are_reordered(verdicts):
    cancel = verdicts["reordered-cancel"]  # the case: the cancel appended first, created 1.4 s later
    assert anomalies(cancel) == {"is_reordered"}
    assert (cancel["reorder_low_offset"], cancel["reorder_low_ms"], cancel["reorder_high_offset"],
            cancel["reorder_high_ms"]) == (6514, T0 - 58_600, 6588, T0 - 60_000)
    assert (cancel["state"], cancel["version"], cancel["is_delivered"]) == ("scheduled", 6588, True)
    reschedule = verdicts["reordered-reschedule"]  # the older version appended after the newer one
    assert anomalies(reschedule) == {"is_reordered"}
    assert (reschedule["version"], reschedule["reorder_low_offset"], reschedule["reorder_high_offset"]) == (1, 0, 1)


def test_a_masters_put_carrying_an_older_timestamp_at_a_later_offset_is_not_reordered(verdicts):
    overtaken = verdicts["copy-overtaken"]  # restores= copies with the timestamps of the puts they copy
    assert anomalies(overtaken) == set() and overtaken["reorder_low_offset"] is None
    # A next occurrence's put (follows=, stamped a second before its due time) after a cancel created later.
    raced = verdicts["series-cancel-raced"]
    assert anomalies(raced) == set() and raced["reorder_low_offset"] is None


def test_a_put_written_twice_is_one_version_applied_once_and_counted(verdicts):
    once = verdicts["twice-written"]
    assert anomalies(once) == set() and once["is_twice_written"]
    assert (once["version"], once["twice_written_offset"], once["twice_written_copy_offset"]) == (0, 0, 1)
    assert (once["is_delivered"], once["delivered_count"], once["versions_delivered"]) == (True, 1, 1)
    twice = verdicts["twice-written-delivered-twice"]  # once per copy: one version, delivered twice
    assert anomalies(twice) == {"is_duplicate"} and twice["is_twice_written"]
    assert (twice["version"], twice["delivered_count"], twice["versions_delivered"], twice["duplicate_records"]) == \
        (0, 2, 1, 1)


def test_a_put_copy_after_a_cancel_revives_nothing_and_a_delivery_anyway_is_judged_by_the_cancel(verdicts):
    around = verdicts["twice-written-around-cancel"]  # the copy carries the put's older timestamp: not reordered
    assert anomalies(around) == set() and around["is_twice_written"]
    assert (around["state"], around["version"], around["is_expected"]) == ("cancelled", 0, False)
    ignored = verdicts["twice-written-around-cancel-delivered"]  # the delivery names the copy: the put's version
    assert anomalies(ignored) == {"is_cancel_ignored"} and ignored["is_twice_written"]
    assert (ignored["state"], ignored["version"], ignored["ignored"], ignored["cancel_offset"]) == \
        ("cancelled", 0, "cancel", 1)
    late = verdicts["twice-written-around-late-cancel"]
    assert anomalies(late) == set() and late["is_twice_written"]
    assert (late["state"], late["cancel_too_late"], late["cancel_late_by"], late["is_delivered"]) == \
        ("scheduled", True, "after_due", True)


def test_a_cancel_written_twice_is_one_cancel_its_copy_cancels_nothing_and_is_not_reordered(verdicts):
    verdict = verdicts["cancel-twice-written"]
    assert anomalies(verdict) == set() and verdict["is_twice_written"]
    assert (verdict["state"], verdict["version"], verdict["due_ms"], verdict["is_delivered"]) == \
        ("scheduled", 2, T0 + 1000, True)
    assert (verdict["cancel_offset"], verdict["reorder_low_offset"]) == (None, None)
    assert (verdict["twice_written_offset"], verdict["twice_written_copy_offset"]) == (1, 3)


def test_the_masters_repair_of_an_id_a_copy_shadows_is_read_as_nodes_apply_it(verdicts):
    repaired = verdicts["twice-written-repaired"]
    assert anomalies(repaired) == set() and repaired["is_twice_written"]
    assert (repaired["version"], repaired["is_delivered"], repaired["delivered_count"]) == (2, True, 1)
    revived = verdicts["cancel-twice-written-repaired"]
    assert anomalies(revived) == set() and revived["is_twice_written"]
    assert (revived["state"], revived["version"], revived["due_ms"], revived["is_delivered"]) == \
        ("scheduled", 4, T0 + 1000, True)
    for name in ("twice-written-closed", "cancel-twice-written-closed"):
        closed = verdicts[name]
        assert anomalies(closed) == set() and closed["is_twice_written"], name
        assert (closed["state"], closed["version"], closed["is_expected"]) == ("cancelled", 0, False), name


@pytest.mark.parametrize("name", ["resent-pair", "resent-pair-copy-delivered"])
def test_two_puts_resent_after_both_are_not_reordered_and_the_later_one_is_delivered_once(verdicts, name):
    verdict = verdicts[name]
    assert anomalies(verdict) == set() and verdict["is_twice_written"]
    assert (verdict["version"], verdict["due_ms"], verdict["lateness_ms"], verdict["reorder_low_offset"]) == \
        (1, T0 + 1000, 4, None)
    assert (verdict["delivered_count"], verdict["versions_delivered"], verdict["rescheduled_too_late"]) == \
        (1, 1, False)
    assert (verdict["twice_written_offset"], verdict["twice_written_copy_offset"]) == (0, 2)


@pytest.mark.parametrize("name,evidence", [
    ("cancel-written-after-due", "after_due"), ("cancel-at-cutoff", "after_due"), ("revived-cancel-too-late", "after_due"),
    ("cancel-after-done", "after_delivery"), ("cancel-by-cutoff", "by_cutoff"),
])
def test_a_cancel_that_lost_to_a_delivery_is_too_late_by_the_evidence_it_has(verdicts, name, evidence):
    verdict = verdicts[name]
    assert anomalies(verdict) == set()
    assert (verdict["state"], verdict["cancel_too_late"], verdict["cancel_late_by"], verdict["is_delivered"]) == \
        ("scheduled", True, evidence, True)
    assert verdict["too_late_gap_ms"] == (2000 if evidence == "by_cutoff" else None)


def test_a_cancel_created_well_before_due_and_appended_before_the_done_was_ignored_above_the_cutoff_too(verdicts):
    verdict = verdicts["cancel-ignored-by-time"]  # 10 min before due; offset 2: above the cutoff 1, below the done 3
    assert anomalies(verdict) == {"is_cancel_ignored"}
    assert (verdict["state"], verdict["ignored"], verdict["cancel_offset"], verdict["cutoff"]) == \
        ("cancelled", "cancel", 2, 1)
    assert (verdict["cancel_too_late"], verdict["cancel_late_by"]) == (False, None)


def test_an_older_version_delivered_after_its_reschedule_is_too_late_by_evidence_or_ignored(verdicts):
    ignored = verdicts["reschedule-ignored-by-time"]
    assert anomalies(ignored) == {"is_cancel_ignored"} and ignored["ignored"] == "reschedule"
    assert not ignored["rescheduled_too_late"]
    for name, evidence in (("rescheduled-too-late", "after_due"), ("reschedule-after-done", "after_delivery"),
                           ("reschedule-by-cutoff", "by_cutoff")):
        verdict = verdicts[name]
        assert anomalies(verdict) == set(), name
        assert (verdict["rescheduled_too_late"], verdict["reschedule_late_by"]) == (True, evidence), name
    assert verdicts["reschedule-by-cutoff"]["too_late_gap_ms"] == 2000


def reported(cases: list[History], options: ReconcileOptions = OPTIONS):
    """The report on ``cases``, built from the job's own summary groups and anomalous ids."""
    from delayq import Settings
    from delayq.spark.job import Findings, anomalous, summary_groups
    from delayq.spark.report import build_report
    from delayq.spark.summary import Summary

    frame = judged(cases, options)
    summary = Summary.of(r.asDict() for r in summary_groups(frame).collect())
    findings = Findings(
        totals={**summary.overall.counts, "dead_lettered": 0, "buffer_records": 0, "malformed_buffer_records": 0},
        lateness=summary.overall.lateness_ms(), by_topic={}, per_hour=[], histogram=[], worst_late=[],
        anomalies=anomalous(frame).toArrow(), target_topics=[TOPIC], missing_topics=[], timings_s={},
        spark_version="", too_late_by_cutoff=summary.overall.too_late_gap_ms())
    return build_report(findings, Settings(), options)


def test_reordered_fails_the_run_and_the_too_late_buckets_are_summed_by_evidence():
    wanted = ("reordered-cancel", "twice-written-delivered-twice", "cancel-written-after-due", "cancel-by-cutoff",
              "reschedule-after-done")
    cases = [h for h in histories() if h.name in wanted]
    ids = {h.name: h.id for h in cases}
    # The cancel was created 1,400 ms after the put appended after it: reordered beyond 1,399 ms of tolerance.
    found = reported(cases, ReconcileOptions(**{**OPTIONS.__dict__, "reorder_tolerance_ms": 1399}))
    assert found.exit_code == 1
    assert found.anomalies["reordered"] == [ids["reordered-cancel"]]
    assert found.anomalies["duplicates"] == [ids["twice-written-delivered-twice"]]
    totals = found.totals
    assert (totals["reordered"], totals["twice_written"], totals["duplicates"]) == (1, 1, 1)
    assert (totals["cancelled_too_late"], totals["cancelled_too_late_after_due"],
            totals["cancelled_too_late_after_delivery"], totals["cancelled_too_late_by_cutoff"]) == (2, 1, 0, 1)
    assert (totals["rescheduled_too_late"], totals["rescheduled_too_late_after_delivery"]) == (1, 1)
    assert found.too_late_by_cutoff == {"count": 1, "p50": 2000, "max": 2000}
    # Within the tolerance, the same pair is no anomaly.
    alone = reported([h for h in histories() if h.name == "reordered-cancel"],
                     ReconcileOptions(**{**OPTIONS.__dict__, "reorder_tolerance_ms": 1400}))
    assert (alone.exit_code, alone.totals["reordered"]) == (0, 0)


def test_writes_appended_twice_and_applied_once_are_counted_and_pass_the_run():
    wanted = ("twice-written", "twice-written-around-cancel", "cancel-twice-written", "resent-pair",
              "resent-pair-copy-delivered")
    found = reported([h for h in histories() if h.name in wanted])
    assert (found.exit_code, found.ok) == (0, True)
    assert found.totals["twice_written"] == 5  # ids, each with a put or a cancel appended twice
    assert "twice_written" not in found.anomalies and all(ids == [] for ids in found.anomalies.values())


def test_every_stage_of_the_judgement_stays_small_enough_for_the_jvm_to_compile():
    """HotSpot leaves a method above 8,000 bytes of bytecode uncompiled: the judging stage (the per-id
    aggregate's output, with every column of judge) ran twice as slow when it grew past that."""
    spark = spark_session("local[2]")
    adaptive = spark.conf.get("spark.sql.adaptive.enabled")
    spark.conf.set("spark.sql.adaptive.enabled", "false")  # the plan with its whole-stage code, as it runs
    try:
        plan = judged(histories()[:1])._jdf.queryExecution().executedPlan()
        stages = spark._jvm.org.apache.spark.sql.execution.debug.package.codegenStringSeq(plan)
        sizes = {stages.apply(i)._1().split("\n")[0][:80]: stages.apply(i)._3().maxMethodCodeSize()
                 for i in range(stages.size())}
    finally:
        spark.conf.set("spark.sql.adaptive.enabled", adaptive)
    assert sizes and max(sizes.values()) < 8000, sizes


def test_a_buffer_holding_records_of_a_newer_feature_level_is_not_judged():
    from delayq.spark.job import refuse_newer_levels
    from delayq.spark.session import ReconcileError

    refuse_newer_levels(0)
    with pytest.raises(ReconcileError, match=r"holds 2 record\(s\) of a feature level above 2, which this delayq "
                                             r"cannot read: run the reconciliation of the delayq version the nodes"):
        refuse_newer_levels(2)
