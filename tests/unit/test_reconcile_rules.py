"""The reconciliation's rules, id by id, on buffer and target records made in memory (a local Spark, no Kafka).

Each history is a handful of records shaped as Spark's Kafka source reads them; all
histories go through the job's own steps (buffer_rows, delivery_rows, per_version,
per_id, judge) in one Spark run, and each test looks at its own ids. Offsets are
those of the id's buffer partition; a history names them explicitly.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from delayq.proxy import envelope as env
from delayq.spark import ReconcileOptions, spark_session
from delayq.spark.job import _KAFKA_SCHEMA, buffer_rows, delivery_rows, judge, per_id, per_version

T0 = 1_800_000_000_000  # 2027-01-15T08:00:00Z: every history is due around here
BUFFER = "rules-buffer"
TOPIC = "orders"
OPTIONS = ReconcileOptions(since_ms=T0 - 3_600_000, until_ms=T0 + 3_600_000, out=Path("unused"))


def _time(ms: int) -> datetime:
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)


class History:
    """The records of one delay id: buffer records at the offsets given, deliveries on the target topic."""

    def __init__(self, name: str):
        self.id = name
        self.buffer: list[tuple] = []
        self.deliveries: list[tuple] = []

    def _record(self, offset: int, value: bytes | None, headers: list[tuple[str, bytes]], ts: int) -> History:
        self.buffer.append((self.id.encode(), value, BUFFER, 0, offset, _time(ts), 0, headers))
        return self

    def put(self, offset: int, due: int, restores: int | None = None) -> History:
        """A put; with ``restores``, a master's copy of the put at that offset."""
        value = env.put_value(due, TOPIC, None, b"payload", restores=restores)
        return self._record(offset, value, [], T0 - 3_000_000 + offset)

    def cancel(self, offset: int, at: int | None = None) -> History:
        return self._record(offset, None, env.control_headers(env.OP_CANCEL, self.id),
                            T0 - 3_000_000 + offset if at is None else at)

    def done(self, offset: int, version: int | None = None, cutoff: int | None = None) -> History:
        headers = env.control_headers(env.OP_DONE, self.id)
        headers += [(name, str(number).encode()) for name, number in ((env.VERSION, version), (env.CUTOFF, cutoff))
                    if number is not None]
        return self._record(offset, None, headers, T0 + offset)

    def raw(self, offset: int, value: bytes | None, headers: list[tuple[str, bytes]]) -> History:
        """Any buffer record, for the malformed ones."""
        return self._record(offset, value, headers, T0)

    def deliver(self, at: int, due: int | None, version: int | None = None, epoch: int = 1) -> History:
        headers = [(env.ID, self.id.encode()), (env.EPOCH, str(epoch).encode())]
        if due is not None:
            headers.append((env.DELIVER_AT, str(due).encode()))
        if version is not None:
            headers.append((env.VERSION, str(version).encode()))
        self.deliveries.append((b"user-key", b"payload", TOPIC, 0, len(self.deliveries), _time(at), 0, headers))
        return self


def histories() -> list[History]:
    H = History
    return [
        # A cancel below the cutoff of the done that closed the delivered version: seen, ignored.
        H("cancel-below-cutoff").put(0, T0).cancel(1).deliver(T0 + 5, T0, 0).done(2, 0, 2),
        # The first cancel after the put counts, not a later repeat above the cutoff.
        H("first-cancel-below-cutoff").put(0, T0).cancel(1).cancel(5).deliver(T0 + 5, T0, 0).done(6, 0, 3),
        # A cancel at the cutoff lost the race, though the done came after it.
        H("cancel-at-cutoff").put(0, T0).cancel(1).deliver(T0 + 5, T0, 0).done(2, 0, 1),
        # A cancel, a new put (the id lives again), then a cancel at the cutoff: too late.
        H("revived-cancel-too-late").put(0, T0).cancel(1).put(2, T0 + 1000).cancel(3)
        .deliver(T0 + 1005, T0 + 1000, 2).done(4, 2, 3),
        # The same with the second cancel below the cutoff: ignored.
        H("revived-cancel-ignored").put(0, T0).cancel(1).put(2, T0 + 1000).cancel(3)
        .deliver(T0 + 1005, T0 + 1000, 2).done(4, 2, 4),
        # Cancelled in time, never delivered.
        H("cancelled").put(0, T0).cancel(1),
        # Rescheduled before the pick: only the new version delivered.
        H("rescheduled-in-time").put(0, T0).put(1, T0 + 1000).deliver(T0 + 1004, T0 + 1000, 1).done(2, 1, 2),
        # Rescheduled too late: old version (reschedule at its cutoff), then the new one.
        H("rescheduled-too-late").put(0, T0).put(1, T0 + 1000).deliver(T0 + 2, T0, 0).done(2, 0, 1)
        .deliver(T0 + 1004, T0 + 1000, 1).done(3, 1, 3),
        # The reschedule lost and the new version never came: missing, and not early.
        H("lost-reschedule").put(0, T0).put(1, T0 + 60_000).deliver(T0 + 2, T0, 0).done(2, 0, 1),
        # The master had read the reschedule and delivered the old version: ignored.
        H("reschedule-ignored").put(0, T0).put(1, T0 + 1000).deliver(T0 + 2, T0, 0).done(2, 0, 2)
        .deliver(T0 + 1004, T0 + 1000, 1).done(3, 1, 3),
        # Three puts: the latest is above the old version's cutoff, the middle one below it.
        H("middle-reschedule-ignored").put(0, T0).put(1, T0 + 1000).put(3, T0 + 2000)
        .deliver(T0 + 2, T0, 0).done(2, 0, 2).deliver(T0 + 2003, T0 + 2000, 3).done(4, 3, 4),
        # A cancel the master had read, delivered anyway; then a new put (the id lives again), delivered.
        H("older-cancel-ignored").put(0, T0).cancel(1).deliver(T0 + 5, T0, 0).done(2, 0, 2)
        .put(3, T0 + 1000).deliver(T0 + 1005, T0 + 1000, 3).done(4, 3, 4),
        # One version delivered twice.
        H("duplicate").put(0, T0).deliver(T0 + 5, T0, 0).deliver(T0 + 800, T0, 0, epoch=2).done(1, 0, 1),
        # A rewritten copy of the put (same frame, higher offset) is just the latest put.
        H("put-copied").put(0, T0).put(1, T0).deliver(T0 + 3, T0, 1).done(2, 1, 2),
        # A late reschedule whose put the old version's done came to follow: the master copied it
        # (restores=1), and delivered the copy.
        H("copy-delivered").put(0, T0).put(1, T0 + 1000).deliver(T0 + 2, T0, 0).done(2, 0, 1)
        .put(3, T0 + 1000, restores=1).deliver(T0 + 1004, T0 + 1000, 3).done(4, 3, 4),
        # ... a cancel overtook the copy: nodes ignore it and close it with a done; the cancel counts.
        H("copy-after-cancel").put(0, T0).put(1, T0 + 1000).deliver(T0 + 2, T0, 0).done(2, 0, 1)
        .cancel(3).put(4, T0 + 1000, restores=1).done(5, 4, 5),
        # ... a newer put overtook the copy: ignored; the newer put is copied and delivered.
        H("copy-overtaken").put(0, T0).put(1, T0 + 1000).deliver(T0 + 2, T0, 0).done(2, 0, 1)
        .put(3, T0 + 2000).put(4, T0 + 1000, restores=1).put(5, T0 + 2000, restores=3)
        .deliver(T0 + 2004, T0 + 2000, 5).done(6, 5, 6),
        # Older masters: no delayq-version anywhere; the delivery matches the latest put by due time.
        H("unversioned-rescheduled").put(0, T0).put(1, T0 + 1000).deliver(T0 + 1003, T0 + 1000).done(2),
        # ... or an older version by due time: the latest is missing.
        H("unversioned-lost-reschedule").put(0, T0).put(1, T0 + 60_000).deliver(T0 + 1, T0).done(2),
        # ... two copies of one due time are a duplicate; a versioned and an unversioned copy of the latest too.
        H("unversioned-duplicate").put(0, T0).deliver(T0 + 1, T0).deliver(T0 + 2, T0).done(1),
        H("mixed-duplicate").put(0, T0).deliver(T0 + 1, T0).deliver(T0 + 2, T0, 0).done(1, 0, 1),
        # Fallback rules without a cutoff: an old done before the cancel: too late.
        H("old-done-then-cancel").put(0, T0).deliver(T0 + 3, T0).done(1).cancel(2),
        # ... a cancel before the old done, delivered anyway: unexpected (not provably ignored).
        H("cancel-then-old-done").put(0, T0).cancel(1).deliver(T0 + 3, T0).done(2),
        # ... no done left: the delivery was written before the cancel record.
        H("no-done-cancel-after-delivery").put(0, T0).deliver(T0 + 3, T0).cancel(1, at=T0 + 100),
        # A delivery naming a put whose due time is not its deliver-at.
        H("version-mismatch").put(0, T0).deliver(T0 + 10, T0 + 5, 0).done(1, 0, 1),
        # Early against the due time of the version it delivered.
        H("early").put(0, T0).deliver(T0 - 5000, T0, 0).done(1, 0, 1),
        # Compaction left only the done: known, delivered, due time from the delivery.
        H("compacted").done(7, 3, 8).deliver(T0 + 5, T0, 3),
        # No buffer record at all.
        H("unknown").deliver(T0 + 5, T0, 4),
        # Malformed tombstones take no part: a cancel with a version, a done with a bad cutoff.
        H("malformed-tombstones").put(0, T0)
        .raw(1, None, [*env.control_headers(env.OP_CANCEL, "malformed-tombstones"), (env.VERSION, b"0")])
        .deliver(T0 + 4, T0, 0)
        .raw(2, None, [*env.control_headers(env.OP_DONE, "malformed-tombstones"), (env.CUTOFF, b"x1")]),
    ]


@pytest.fixture(scope="module")
def verdicts() -> dict[str, dict]:
    spark = spark_session("local[2]")
    cases = histories()
    buffer = buffer_rows(spark.createDataFrame([r for h in cases for r in h.buffer], _KAFKA_SCHEMA))
    deliveries = delivery_rows(spark.createDataFrame([r for h in cases for r in h.deliveries], _KAFKA_SCHEMA))
    judged = judge(per_id(per_version(buffer, deliveries, [TOPIC], OPTIONS.early_tolerance_ms), [TOPIC]), OPTIONS)
    partitions = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", "2")  # a hundred rows: more tasks would only cost time
    try:
        return {row["id"]: row.asDict() for row in judged.collect()}
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", partitions)


ANOMALIES = ("is_missing", "is_duplicate", "is_unexpected", "is_early", "is_cancel_ignored")


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


def test_a_cancel_at_or_after_the_cutoff_lost_the_race_and_the_delivery_stands(verdicts):
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


def test_a_lost_reschedule_is_missing_never_early(verdicts):
    for name in ("lost-reschedule", "unversioned-lost-reschedule"):
        verdict = verdicts[name]
        assert anomalies(verdict) == {"is_missing"}, name
        assert verdict["due_ms"] == T0 + 60_000 and verdict["rescheduled_too_late"]


def test_a_duplicate_is_one_version_delivered_twice(verdicts):
    for name in ("duplicate", "unversioned-duplicate", "mixed-duplicate"):
        verdict = verdicts[name]
        assert anomalies(verdict) == {"is_duplicate"}, name
        assert (verdict["delivered_count"], verdict["duplicate_records"], verdict["versions_delivered"]) == (2, 1, 1)
    assert (verdicts["duplicate"]["first_epoch"], verdicts["duplicate"]["last_epoch"]) == (1, 2)


def test_records_without_version_or_cutoff_follow_the_earlier_rules(verdicts):
    assert anomalies(verdicts["unversioned-rescheduled"]) == set()
    assert verdicts["unversioned-rescheduled"]["lateness_ms"] == 3
    for name in ("old-done-then-cancel", "no-done-cancel-after-delivery"):
        verdict = verdicts[name]
        assert anomalies(verdict) == set() and verdict["cancel_too_late"], name
    ignored = verdicts["cancel-then-old-done"]
    assert anomalies(ignored) == {"is_unexpected"} and ignored["state"] == "cancelled"


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
    records = [
        (b"a", None, [(env.OP, b"cancel"), (env.CUTOFF, b"3")]),            # a cutoff is a done's
        (b"a", None, [(env.OP, b"done"), (env.VERSION, b"-1")]),            # not digits
        (b"a", None, [(env.OP, b"done"), (env.OP, b"done")]),               # a header twice
        (b"a", None, [(env.OP, b"done"), (env.ID, b"b")]),                  # an id that is not the key
        (b"a", None, [(env.OP, b"done"), (env.ID, b"a"), (env.VERSION, b"0"), (env.CUTOFF, b"1")]),  # fine
        (b"a", None, [(env.OP, b"cancel"), (env.ID, b"a")]),                # fine
    ]
    rows = [(key, value, BUFFER, 0, i, _time(T0), 0, headers) for i, (key, value, headers) in enumerate(records)]
    kinds = [r["kind"] for r in buffer_rows(spark.createDataFrame(rows, _KAFKA_SCHEMA)).orderBy("offset").collect()]
    assert kinds == [None, None, None, None, 2, 1]
