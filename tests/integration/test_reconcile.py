"""The reconciliation job on the real Kafka: staged histories, each anomaly found with its id and nothing else.

Histories are written straight to Kafka with the envelope (buffer puts, cancels and
done tombstones; deliveries with ``delivery_headers`` and explicit timestamps), the
way the proxy and a master write them: ``clean`` and ``troubled`` as masters did
before ``delayq-version`` and ``delayq-cutoff``, ``races`` and ``races_lost`` with
them, where the buffer offsets decide who won a cancel's or a reschedule's race.
One Spark session (local[2]) serves the whole test session.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import uuid
from pathlib import Path

import pyarrow.parquet as pq
import pyspark
import pytest
from confluent_kafka import Producer
from support.kafka_testing import create_topics
from support.reconcile_testing import MINUTE, Staged, plant_troubled, stage_topics

from delayq import wire
from delayq.cli import main as delayq_main
from delayq.spark import ANOMALY_KINDS, ReconcileOptions, iso, load_report, reconcile, spark_session
from delayq.spark.session import spark_home_dir
from delayq.spark.synthetic import TrafficWriter, healthy_traffic, new_message

pytestmark = pytest.mark.integration

HEALTHY = 40
RACES_HEALTHY = 10


@pytest.fixture(scope="session")
def spark(dev_stack):
    return spark_session("local[2]")


@pytest.fixture(scope="module")
def clean(dev_stack, spark) -> Staged:
    """Healthy traffic plus every case that looks odd but is no anomaly."""
    settings, (a, b), since, until = stage_topics(dev_stack, f"t-reconcile-clean-{uuid.uuid4().hex[:8]}")
    ids = {}
    with TrafficWriter(settings.bootstrap_servers, settings.buffer_topic) as writer:
        healthy_traffic(writer, HEALTHY, [a, b], since, until - 30 * MINUTE)
        # Rescheduled: the second put wins, so a delivery at the new time is neither early nor late.
        first = new_message(a, since + 10 * MINUTE)
        writer.put(first, first.created_at_ms)
        moved = dataclasses.replace(first, deliver_at_ms=since + 20 * MINUTE)
        new = writer.put(moved, first.created_at_ms + 1000, wait=True)
        writer.deliver(moved, moved.deliver_at_ms + 15, version=new)
        writer.done(moved.delay_id, moved.deliver_at_ms + 15, version=new, cutoff=new + 1)
        ids["rescheduled"] = moved.delay_id
        # Cancelled in time and never delivered.
        cancelled = new_message(b, since + 30 * MINUTE)
        writer.put(cancelled, cancelled.created_at_ms)
        writer.cancel(cancelled.delay_id, since + 25 * MINUTE)
        ids["cancelled"] = cancelled.delay_id
        # Cancelled after the delivery: the documented race, not an anomaly.
        raced, _ = writer.delivered(topic=a, due_ms=since + 40 * MINUTE, delivered_ms=since + 40 * MINUTE + 8)
        writer.cancel(raced.delay_id, since + 40 * MINUTE + 5000)
        ids["cancel_too_late"] = raced.delay_id
        # Compaction removed the put (at offset 0): only the done tombstone and the delivery are left.
        compacted = new_message(b, since + 50 * MINUTE)
        writer.deliver(compacted, compacted.deliver_at_ms + 11, version=0)
        writer.done(compacted.delay_id, compacted.deliver_at_ms + 11, version=0, cutoff=1)
        ids["compacted"] = compacted.delay_id
        # Due within the grace before the window end: not delivered yet, not missing yet.
        pending = new_message(a, until - 2 * MINUTE)
        writer.put(pending, pending.created_at_ms)
        ids["in_grace"] = pending.delay_id
        # Due before the window (delivered late, inside it) and after it: neither is judged.
        writer.delivered(topic=a, due_ms=since - 10 * MINUTE, delivered_ms=since + MINUTE)
        later = new_message(b, until + 60 * MINUTE, created_ms=since)
        writer.put(later, since)
    raw = Producer({"bootstrap.servers": settings.bootstrap_servers})
    raw.produce(a, key=b"k", value=b"an ordinary record, sent without delay", timestamp=since + MINUTE)
    # Malformed, as a node would dead-letter them: a value with no frame, a tombstone with
    # an unknown op, and a framed put carrying a header delayq reserves.
    raw.produce(settings.buffer_topic, key=b"junk", value=b"x", timestamp=since)
    raw.produce(settings.buffer_topic, key=b"junk-op", value=None, headers=[(wire.OP, b"launch")], timestamp=since)
    raw.produce(settings.buffer_topic, key=b"junk-header", value=f"put {until} {a} -\nx".encode(),
                headers=[(wire.OP, b"put")], timestamp=since)
    assert raw.flush(30) == 0
    return Staged(settings, since, until, [a, b], ids)


@pytest.fixture(scope="module")
def troubled(dev_stack, spark) -> Staged:
    """Healthy traffic plus one of each anomaly, a message cancelled in time, and a duplicate that only an aborted
    transaction holds (support.reconcile_testing)."""
    return plant_troubled(dev_stack)


def test_clean_history_reports_zero_anomalies_and_exit_code_0(clean, spark, tmp_path):
    report = reconcile(clean.settings, clean.options(tmp_path), spark=spark)

    totals = report.totals
    assert {k: totals[k] for k in ("duplicates", "missing", "unexpected", "early", "unknown")} == \
        dict.fromkeys(("duplicates", "missing", "unexpected", "early", "unknown"), 0)
    assert report.anomalies == {kind: [] for kind in ANOMALY_KINDS}
    assert report.exit_code == 0
    # healthy + rescheduled + cancelled too late + compacted; the pending one is in grace, not expected
    assert (totals["expected"], totals["delivered"], totals["delivered_records"]) == (HEALTHY + 3,) * 3
    assert (totals["cancelled"], totals["cancelled_too_late"], totals["in_grace"]) == (1, 1, 1)
    assert totals["malformed_buffer_records"] == 3
    assert 0 <= report.lateness_ms["p50"] <= report.lateness_ms["p99"] <= report.lateness_ms["max"] <= 200
    assert report.lateness_ms["count"] == HEALTHY + 3
    assert report.source["target_topics"] == sorted(clean.targets)
    assert sum(t["expected"] for t in report.by_topic.values()) == HEALTHY + 3
    assert sum(h["expected"] for h in report.per_hour) == HEALTHY + 3
    assert sum(b["count"] for b in report.lateness_histogram) == HEALTHY + 3
    for kind in ANOMALY_KINDS:
        assert pq.read_table(tmp_path / "anomalies" / f"{kind}.parquet").num_rows == 0
    assert load_report(tmp_path)["totals"] == totals


def test_each_injected_anomaly_is_found_with_its_id_and_nothing_else(troubled, spark, tmp_path):
    ids = troubled.ids

    report = reconcile(troubled.settings, troubled.options(tmp_path), spark=spark)

    assert report.anomalies == {
        "duplicates": [ids["duplicate"]],
        "missing": [ids["missing"]],
        "unexpected": [ids["unknown"]],
        "early": [ids["early"]],
        "cancel_ignored": [ids["cancel_ignored"]],  # its done's cutoff proves the master had read it
        "reordered": [],
    }
    totals = report.totals
    assert {k: totals[k] for k in ("duplicates", "duplicate_records", "missing", "unexpected", "unknown", "early",
                                   "cancel_ignored")} == {"duplicates": 1, "duplicate_records": 1, "missing": 1,
                                                          "unexpected": 1, "unknown": 1, "early": 1,
                                                          "cancel_ignored": 1}
    assert (totals["expected"], totals["delivered"]) == (24, 23)  # 20 healthy, duplicate, lost, early, fenced
    assert report.exit_code == 1
    duplicate = pq.read_table(tmp_path / "anomalies" / "duplicates.parquet").to_pylist()
    assert [(r["id"], r["delivered_count"], r["first_epoch"], r["last_epoch"]) for r in duplicate] == \
        [(ids["duplicate"], 2, 1, 2)]
    unexpected = {r["id"]: r["state"] for r in pq.read_table(tmp_path / "anomalies" / "unexpected.parquet").to_pylist()}
    assert unexpected == {ids["unknown"]: "unknown"}
    early = pq.read_table(tmp_path / "anomalies" / "early.parquet").to_pylist()
    assert [(r["id"], r["lateness_ms"]) for r in early] == [(ids["early"], -2000)]
    missing = pq.read_table(tmp_path / "anomalies" / "missing.parquet").to_pylist()
    assert [(r["id"], r["delivered_count"], r["due_ms"]) for r in missing] == \
        [(ids["missing"], 0, troubled.since + 20 * MINUTE)]


def test_read_uncommitted_also_counts_the_aborted_copy_as_a_duplicate(troubled, spark, tmp_path):
    ids = troubled.ids

    report = reconcile(troubled.settings, troubled.options(tmp_path, read_committed=False), spark=spark)

    assert report.anomalies["duplicates"] == [ids["duplicate"], ids["aborted_duplicate"]]
    assert report.source["isolation_level"] == "read_uncommitted"
    assert (report.totals["missing"], report.totals["early"], report.totals["unexpected"]) == (1, 1, 1)


@pytest.fixture(scope="module")
def races(dev_stack, spark) -> Staged:
    """Cancels and reschedules near the due time, with version and cutoff headers: every race lost fairly."""
    settings, (a, b), since, until = stage_topics(dev_stack, f"t-reconcile-races-{uuid.uuid4().hex[:8]}")
    ids = {}
    with TrafficWriter(settings.bootstrap_servers, settings.buffer_topic) as writer:
        healthy_traffic(writer, RACES_HEALTHY, [a, b], since, until - 30 * MINUTE)
        # A cancel at the cutoff: the master had read the buffer up to just before it, so the
        # cancel came too late, although the done was written after it.
        raced = new_message(a, since + 10 * MINUTE)
        put = writer.put(raced, raced.created_at_ms, wait=True)
        cancel = writer.cancel(raced.delay_id, raced.deliver_at_ms + 2, wait=True)
        writer.deliver(raced, raced.deliver_at_ms + 6, version=put)
        writer.done(raced.delay_id, raced.deliver_at_ms + 6, version=put, cutoff=cancel)
        ids["cancel_at_cutoff"] = raced.delay_id
        # Rescheduled before the master picked it: only the new version is delivered.
        first = new_message(b, since + 20 * MINUTE)
        writer.put(first, first.created_at_ms, wait=True)
        moved = dataclasses.replace(first, deliver_at_ms=since + 25 * MINUTE)
        new = writer.put(moved, first.created_at_ms + 1000, wait=True)
        writer.deliver(moved, moved.deliver_at_ms + 12, version=new)
        writer.done(moved.delay_id, moved.deliver_at_ms + 12, version=new, cutoff=new + 1)
        ids["rescheduled_in_time"] = moved.delay_id
        # Rescheduled too late (the reschedule is at the old version's cutoff): the old version
        # went out, then the new one. One delivery per version: no duplicate.
        late = new_message(a, since + 30 * MINUTE)
        old = writer.put(late, late.created_at_ms, wait=True)
        later = dataclasses.replace(late, deliver_at_ms=since + 40 * MINUTE)
        new = writer.put(later, late.deliver_at_ms + 1, wait=True)
        writer.deliver(late, late.deliver_at_ms + 4, version=old)
        done = writer.done(late.delay_id, late.deliver_at_ms + 4, version=old, cutoff=new, wait=True)
        writer.deliver(later, later.deliver_at_ms + 7, version=new)
        writer.done(later.delay_id, later.deliver_at_ms + 7, version=new, cutoff=done + 1)
        ids["rescheduled_too_late"] = later.delay_id
        # A late reschedule, then a cancel that overtook the master's copy of the new put (written
        # because the old version's done followed it): nodes ignore the copy and close it with a done.
        shadowed = new_message(b, since + 70 * MINUTE)
        old = writer.put(shadowed, shadowed.created_at_ms, wait=True)
        rescheduled = dataclasses.replace(shadowed, deliver_at_ms=since + 80 * MINUTE)
        new = writer.put(rescheduled, shadowed.deliver_at_ms + 1, wait=True)
        writer.deliver(shadowed, shadowed.deliver_at_ms + 4, version=old)
        writer.done(shadowed.delay_id, shadowed.deliver_at_ms + 4, version=old, cutoff=new)
        writer.cancel(shadowed.delay_id, shadowed.deliver_at_ms + 10)
        copy = writer.put(rescheduled, rescheduled.created_at_ms, wait=True, restores=new)
        writer.done(shadowed.delay_id, shadowed.deliver_at_ms + 20, version=copy, cutoff=copy + 1)
        ids["copy_after_cancel"] = shadowed.delay_id
    return Staged(settings, since, until, [a, b], ids)


@pytest.fixture(scope="module")
def races_lost(dev_stack, spark) -> Staged:
    """Cancels and reschedules the master had read before it delivered, a lost reschedule, a duplicated version."""
    settings, (c, d), since, until = stage_topics(dev_stack, f"t-reconcile-races-lost-{uuid.uuid4().hex[:8]}")
    ids = {}
    with TrafficWriter(settings.bootstrap_servers, settings.buffer_topic) as writer:
        healthy_traffic(writer, RACES_HEALTHY, [c, d], since, until - 30 * MINUTE, seed=3)
        # A cancel below the done's cutoff: the master had read it, and delivered anyway.
        ignored = new_message(c, since + 10 * MINUTE)
        put = writer.put(ignored, ignored.created_at_ms, wait=True)
        cancel = writer.cancel(ignored.delay_id, ignored.deliver_at_ms - MINUTE, wait=True)
        writer.deliver(ignored, ignored.deliver_at_ms + 5, version=put)
        writer.done(ignored.delay_id, ignored.deliver_at_ms + 5, version=put, cutoff=cancel + 1)
        ids["cancel_ignored"] = ignored.delay_id
        # A reschedule below the old version's cutoff: the old version was delivered anyway
        # (and the new one after it, so nothing is missing).
        first = new_message(d, since + 20 * MINUTE)
        old = writer.put(first, first.created_at_ms, wait=True)
        moved = dataclasses.replace(first, deliver_at_ms=since + 30 * MINUTE)
        new = writer.put(moved, first.created_at_ms + 1000, wait=True)
        writer.deliver(first, first.deliver_at_ms + 5, version=old)
        done = writer.done(first.delay_id, first.deliver_at_ms + 5, version=old, cutoff=new + 1, wait=True)
        writer.deliver(moved, moved.deliver_at_ms + 5, version=new)
        writer.done(moved.delay_id, moved.deliver_at_ms + 5, version=new, cutoff=done + 1)
        ids["reschedule_ignored"] = moved.delay_id
        # Rescheduled too late, and the new version never delivered: missing, not early.
        lost = new_message(c, since + 40 * MINUTE)
        old = writer.put(lost, lost.created_at_ms, wait=True)
        lost_moved = dataclasses.replace(lost, deliver_at_ms=since + 50 * MINUTE)
        new = writer.put(lost_moved, lost.deliver_at_ms + 1, wait=True)
        writer.deliver(lost, lost.deliver_at_ms + 4, version=old)
        writer.done(lost.delay_id, lost.deliver_at_ms + 4, version=old, cutoff=new)
        ids["lost_reschedule"] = lost.delay_id
        # One version delivered twice, the second copy by the next master.
        twice = new_message(d, since + 60 * MINUTE)
        put = writer.put(twice, twice.created_at_ms, wait=True)
        writer.deliver(twice, twice.deliver_at_ms + 5, version=put)
        writer.done(twice.delay_id, twice.deliver_at_ms + 5, version=put, cutoff=put + 1)
        writer.deliver(twice, twice.deliver_at_ms + 800, epoch=2, version=put)
        ids["duplicate"] = twice.delay_id
    return Staged(settings, since, until, [c, d], ids)


def test_races_lost_fairly_report_nothing_and_exit_0(races, spark, tmp_path):
    report = reconcile(races.settings, races.options(tmp_path), spark=spark)

    assert report.anomalies == {kind: [] for kind in ANOMALY_KINDS}
    assert report.exit_code == 0
    totals = report.totals
    # healthy + cancel at cutoff + rescheduled in time + rescheduled too late
    assert (totals["expected"], totals["delivered"]) == (RACES_HEALTHY + 3,) * 2
    assert totals["delivered_records"] == RACES_HEALTHY + 5  # late reschedules: both versions; the copy's: old
    # the cancel that overtook the copy counts: nothing expected of that id, its old version legitimately out
    assert (totals["cancelled"], totals["cancelled_too_late"], totals["rescheduled_too_late"]) == (1, 1, 2)
    assert totals["duplicates"] == totals["duplicate_records"] == totals["cancel_ignored"] == 0
    assert report.lateness_ms["max"] <= 200


def test_a_cancel_or_reschedule_the_master_had_read_is_cancel_ignored_and_a_lost_reschedule_missing(
        races_lost, spark, tmp_path):
    ids = races_lost.ids

    report = reconcile(races_lost.settings, races_lost.options(tmp_path), spark=spark)

    assert report.anomalies == {
        "duplicates": [ids["duplicate"]],
        "missing": [ids["lost_reschedule"]],  # never early: its old version was on time
        "unexpected": [],
        "early": [],
        "cancel_ignored": [ids["cancel_ignored"], ids["reschedule_ignored"]],  # by due time
        "reordered": [],
    }
    assert report.exit_code == 1
    totals = report.totals
    assert (totals["cancel_ignored"], totals["missing"], totals["duplicates"], totals["duplicate_records"]) == \
        (2, 1, 1, 1)
    assert totals["rescheduled_too_late"] == 1  # the lost reschedule's old version went out legitimately
    ignored = pq.read_table(tmp_path / "anomalies" / "cancel_ignored.parquet").to_pylist()
    assert [(r["id"], r["state"], r["ignored"], r["versions_delivered"]) for r in ignored] == [
        (ids["cancel_ignored"], "cancelled", "cancel", 1), (ids["reschedule_ignored"], "scheduled", "reschedule", 2)]
    missing = pq.read_table(tmp_path / "anomalies" / "missing.parquet").to_pylist()
    assert [(r["id"], r["due_ms"], r["delivered_count"]) for r in missing] == \
        [(ids["lost_reschedule"], races_lost.since + 50 * MINUTE, 1)]
    assert "cancel or reschedule ignored" in (tmp_path / "report.html").read_text()


def test_a_cancel_ignored_alone_fails_the_run(races_lost, spark, tmp_path):
    due = races_lost.since + 10 * MINUTE  # only the ignored cancel's id is due in this window
    options = ReconcileOptions(since_ms=due - MINUTE, until_ms=due + 10 * MINUTE, out=tmp_path, grace_ms=MINUTE)

    report = reconcile(races_lost.settings, options, spark=spark)

    assert report.anomalies["cancel_ignored"] == [races_lost.ids["cancel_ignored"]]
    assert sum(report.totals[kind] for kind in ANOMALY_KINDS) == 1
    assert report.exit_code == 1 and not load_report(tmp_path)["ok"]


@pytest.fixture(scope="module")
def misordered(dev_stack, spark) -> Staged:
    """What a producer without idempotence left when a broker froze (issue 28), planted in the buffer.

    A put's retried batch appended after the cancel sent 1.4 s behind it (every node then saw
    "cancel, then put" and delivered it), and a put whose ack was lost appended twice, each copy
    delivered as a version of its own (as a node that took the copy for a new write would). The
    masters' records say nothing is wrong: only the producers' creation times and the copies'
    bytes show it.
    """
    settings, (e, f), since, until = stage_topics(dev_stack, f"t-reconcile-misordered-{uuid.uuid4().hex[:8]}")
    ids = {}
    with TrafficWriter(settings.bootstrap_servers, settings.buffer_topic) as writer:
        healthy_traffic(writer, RACES_HEALTHY, [e, f], since, until - 30 * MINUTE, seed=5)
        overtaken = new_message(e, since + 10 * MINUTE)
        created = overtaken.deliver_at_ms - 30 * MINUTE
        writer.cancel(overtaken.delay_id, created + 1400, wait=True)  # appended first, created 1.4 s later
        put = writer.put(overtaken, created, wait=True)
        writer.deliver(overtaken, overtaken.deliver_at_ms + 54_000, version=put)
        writer.done(overtaken.delay_id, overtaken.deliver_at_ms + 54_000, version=put, cutoff=put + 1)
        ids["reordered"] = overtaken.delay_id
        doubled = new_message(f, since + 20 * MINUTE)
        first = writer.put(doubled, doubled.created_at_ms, wait=True)
        writer.deliver(doubled, doubled.deliver_at_ms + 5, version=first)
        done = writer.done(doubled.delay_id, doubled.deliver_at_ms + 5, version=first, cutoff=first + 1, wait=True)
        copy = writer.put(doubled, doubled.created_at_ms, wait=True)  # the same record, appended again
        writer.deliver(doubled, doubled.deliver_at_ms + 44_000, version=copy)
        writer.done(doubled.delay_id, doubled.deliver_at_ms + 44_000, version=copy, cutoff=max(copy, done) + 1)
        ids["twice_written"] = doubled.delay_id
    return Staged(settings, since, until, [e, f], ids)


def test_a_reordered_pair_and_a_put_copy_delivered_twice_fail_the_run_though_every_master_record_agrees(
        misordered, spark, tmp_path):
    ids = misordered.ids

    report = reconcile(misordered.settings, misordered.options(tmp_path), spark=spark)

    assert report.anomalies["reordered"] == [ids["reordered"]]
    assert "twice_written" not in report.anomalies  # counted: the copy itself is no anomaly
    assert report.anomalies["duplicates"] == [ids["twice_written"]], "one write, delivered twice"
    assert report.exit_code == 1
    totals = report.totals
    assert (totals["reordered"], totals["twice_written"], totals["cancel_ignored"], totals["missing"]) == (1, 1, 0, 0)
    reordered = pq.read_table(tmp_path / "anomalies" / "reordered.parquet").to_pylist()
    assert [r["id"] for r in reordered] == [ids["reordered"]]


def _write(producer: Producer, topic: str, key: bytes | None, value: bytes | None, headers: list | None,
           at_ms: int, partition: int | None = None) -> tuple[int, int]:
    """One record, acknowledged: its (partition, offset)."""
    reports: list = []
    producer.produce(topic, key=key, value=value, headers=headers, timestamp=at_ms,
                     on_delivery=lambda err, msg: reports.append((err, msg)),
                     **({} if partition is None else {"partition": partition}))
    producer.flush(30)
    err, message = reports[0]
    assert err is None, err
    return message.partition(), message.offset()


@pytest.fixture(scope="module")
def dead_lettered(dev_stack, spark) -> Staged:
    """Healthy traffic, two undeliverable messages and four malformed buffer records with their dead letters
    (as the master writes them, in transactions), a cancel on the wrong partition and a put written an hour
    after its due time."""
    prefix = f"t-reconcile-dead-{uuid.uuid4().hex[:8]}"
    settings, (a, b), since, until = stage_topics(dev_stack, prefix)
    create_topics(dev_stack.bootstrap_servers, [settings.dead_letter_topic])
    buffer = settings.buffer_topic
    ids: dict[str, str] = {}
    raw = Producer({"bootstrap.servers": settings.bootstrap_servers})
    letters: list[tuple[bytes | None, bytes | None, list, int]] = []  # key, value, headers, when
    with TrafficWriter(settings.bootstrap_servers, buffer) as writer:
        healthy_traffic(writer, HEALTHY, [a, b], since, until - 30 * MINUTE, seed=5)
        # Undeliverable: its target topic does not exist. The master closed the version with a
        # done and wrote the dead letter (the put's value, user headers, epoch, version, reason, source).
        lost = new_message(f"{prefix}-nowhere", since + 20 * MINUTE)
        lost.headers = [("trace", b"t-1")]
        put = writer.put(lost, lost.created_at_ms, wait=True)
        writer.done(lost.delay_id, lost.deliver_at_ms + 900, version=put, cutoff=put + 1)
        where = wire.buffer_partition(lost.delay_id, 3)
        letters.append((lost.delay_id.encode(), lost.buffer_value(), [
            *lost.headers, (wire.EPOCH, b"1"), (wire.VERSION, str(put).encode()),
            (wire.DEAD_LETTER_REASON, wire.reason_text(wire.Reason.MISSING_TOPIC,
                                                     f"target topic {lost.topic} does not exist").encode()),
            (wire.DEAD_LETTER_SOURCE, f"{buffer}/{where}/{put}".encode())], lost.deliver_at_ms + 900))
        ids["missing_topic"] = lost.delay_id
        # Undeliverable: Kafka refused it, and the copy was too large too: only delayq's headers left.
        big = new_message(a, since + 40 * MINUTE)
        put = writer.put(big, big.created_at_ms, wait=True)
        writer.done(big.delay_id, big.deliver_at_ms + 50, version=put, cutoff=put + 1)
        reason = (wire.reason_text(wire.Reason.REJECTED, "rejected by Kafka: message too large") +
                  "; the copy leaves out the original's value (1048570 bytes) and user headers: too large for "
                  "Kafka with the dead-letter headers")
        letters.append((big.delay_id.encode(), None, [
            (wire.EPOCH, b"1"), (wire.VERSION, str(put).encode()), (wire.DEAD_LETTER_REASON, reason.encode()),
            (wire.DEAD_LETTER_SOURCE, f"{buffer}/{wire.buffer_partition(big.delay_id, 3)}/{put}".encode())],
            big.deliver_at_ms + 50))
        ids["rejected"] = big.delay_id
        # Written an hour after it was due, delivered 20 ms later: no lateness of an hour.
        past = new_message(b, since + 15 * MINUTE, created_ms=since + 75 * MINUTE)
        put = writer.put(past, past.created_at_ms, wait=True)
        writer.deliver(past, past.created_at_ms + 20, version=put)
        writer.done(past.delay_id, past.created_at_ms + 20, version=put, cutoff=put + 1)
        ids["already_due"] = past.delay_id
        # A cancel written to another partition than its id's: malformed, so it cancels nothing, and
        # its offset is never compared with the put's.
        victim = new_message(a, since + 50 * MINUTE)
        victim_put = writer.put(victim, victim.created_at_ms, wait=True)
        other = (wire.buffer_partition(victim.delay_id, 3) + 1) % 3
        ids["wrong_partition_cancel"] = victim.delay_id
    malformed = [
        (victim.delay_id.encode(), None, wire.control_headers(wire.OP_CANCEL, victim.delay_id), other),
        (wire.new_delay_id().encode(), f"put {since + 5 * MINUTE} {a} 10\nabc".encode(), [], None),
        (b"order-42", f"put {since + 5 * MINUTE} {a} -\nx".encode(), [], None),
        (wire.new_delay_id().encode(), f"put {since + 5 * MINUTE} {a} - bogus=1\nx".encode(), [], None),
    ]
    for n, (key, value, headers, partition) in enumerate(malformed):
        at = victim.created_at_ms + 1 if n == 0 else since
        found = _write(raw, buffer, key, value, headers or None, at, partition)
        try:
            wire.parse_buffer_record(key, value, headers, partition=found[0], partitions=3)
        except wire.MalformedRecord as err:
            reason = err.reason
        # The last one was dead-lettered before the window: listed nowhere, counted only as malformed.
        when = since - 30 * MINUTE if n == 3 else since + (n + 1) * MINUTE
        letters.append((key, value, [*headers, (wire.DEAD_LETTER_REASON, reason.encode()),
                                     (wire.DEAD_LETTER_SOURCE, f"{buffer}/{found[0]}/{found[1]}".encode())], when))
    with TrafficWriter(settings.bootstrap_servers, buffer) as writer:
        writer.deliver(victim, victim.deliver_at_ms + 7, version=victim_put)
        writer.done(victim.delay_id, victim.deliver_at_ms + 7, version=victim_put, cutoff=victim_put + 1)
    master = Producer({"bootstrap.servers": settings.bootstrap_servers, "transactional.id": f"{prefix}-master"})
    master.init_transactions(30)
    master.begin_transaction()
    for key, value, headers, when in letters:
        master.produce(settings.dead_letter_topic, key=key, value=value, headers=headers, timestamp=when)
    master.commit_transaction(30)
    # A fenced master's dead letter, aborted: read_committed never sees it.
    master.begin_transaction()
    master.produce(settings.dead_letter_topic, key=lost.delay_id.encode(), value=lost.buffer_value(),
                   headers=letters[0][2], timestamp=since + 30 * MINUTE)
    master.flush(30)
    master.abort_transaction(30)
    return Staged(settings, since, until, [a, b], ids)


def test_dead_letters_are_reported_apart_and_an_undeliverable_message_is_not_missing(dead_lettered, spark,
                                                                                     tmp_path):
    ids = dead_lettered.ids

    report = reconcile(dead_lettered.settings, dead_lettered.options(tmp_path), spark=spark)

    assert report.anomalies == {kind: [] for kind in ANOMALY_KINDS}
    assert report.exit_code == 0
    totals = report.totals
    # healthy, the two undeliverable, the one written when already due, the wrong-partition cancel's
    assert (totals["expected"], totals["delivered"], totals["undeliverable"], totals["missing"]) == \
        (HEALTHY + 4, HEALTHY + 2, 2, 0)
    assert (totals["dead_lettered"], totals["malformed_buffer_records"], totals["cancelled"]) == (5, 4, 0)
    assert report.dead_letters["by_code"] == {"bad-frame": 1, "bad-id": 1, "missing-topic": 1, "rejected": 1,
                                              "wrong-partition": 1}
    assert report.malformed_buffer_records_by_code == {"bad-frame": 1, "bad-id": 1, "unknown-option": 1,
                                                       "wrong-partition": 1}
    listed = report.dead_letters["listed"]
    assert [d["code"] for d in listed] == ["wrong-partition", "bad-frame", "bad-id", "missing-topic", "rejected"]
    assert [d["id"] for d in listed[3:]] == [ids["missing_topic"], ids["rejected"]]
    assert listed[3]["due_ms"] == dead_lettered.since + 20 * MINUTE and listed[4]["due_ms"] is None  # no value
    assert listed[2]["id"] is None and listed[2]["key"] == "order-42" and listed[2]["source"].startswith(
        f"{dead_lettered.settings.buffer_topic}/")
    assert listed[3]["text"] == f"target topic {dead_lettered.settings.buffer_topic[:-7]}-nowhere does not exist"
    assert report.dead_letters["repeated_sources"] == 0 and not report.dead_letters["truncated"]
    # The put written an hour after its due time is not an hour late.
    already = report.already_due_when_written
    assert (already["count"], already["delivered"], already["p50"], already["max"]) == (1, 1, 20, 20)
    assert report.lateness_ms["max"] <= 200 and report.lateness_ms["count"] == HEALTHY + 1
    document = load_report(tmp_path)
    assert document["totals"]["dead_lettered"] == 5 and document["exit_code"] == 0
    page = (tmp_path / "report.html").read_text()
    assert "Dead letters: 5" in page and "Malformed buffer records: 4" in page and "ALERT" not in page


def test_cli_exit_code_is_0_for_a_clean_window_and_1_when_a_given_topic_is_left_out(clean, spark, tmp_path,
                                                                                      monkeypatch, capsys):
    monkeypatch.setenv("DELAYQ_BOOTSTRAP_SERVERS", clean.settings.bootstrap_servers)
    monkeypatch.setenv("DELAYQ_BUFFER_TOPIC", clean.settings.buffer_topic)
    window = ["--since", iso(clean.since), "--until", iso(clean.until), "--grace", "5m"]

    assert delayq_main(["reconcile", *window, "--out", str(tmp_path / "all")]) == 0
    # Reading only the first target topic, the second topic's messages were never delivered as far as it can see.
    only_first = ["--topics", clean.targets[0], "--out", str(tmp_path / "first")]
    assert delayq_main(["reconcile", *window, *only_first]) == 1

    first = json.loads((tmp_path / "first" / "report.json").read_text())
    second_topic_expected = load_report(tmp_path / "all")["by_topic"][clean.targets[1]]["expected"]
    assert first["source"]["target_topics"] == [clean.targets[0]]
    # All but the compacted one, whose due time is known only from its delivery, which went unread.
    assert first["totals"]["missing"] == second_topic_expected - 1 > 0
    assert clean.ids["compacted"] not in first["anomalies"]["missing"]
    assert "ALERT" in capsys.readouterr().out


def test_cli_fails_with_exit_code_2_naming_a_buffer_topic_that_does_not_exist(dev_stack, names, tmp_path,
                                                                              monkeypatch, capsys):
    monkeypatch.setenv("DELAYQ_BOOTSTRAP_SERVERS", dev_stack.bootstrap_servers)
    monkeypatch.setenv("DELAYQ_BUFFER_TOPIC", names.topic("no-such-buffer"))

    assert delayq_main(["reconcile", "--out", str(tmp_path)]) == 2
    error = " ".join(capsys.readouterr().err.split())  # the console wraps long lines
    assert f"buffer topic '{names.topic('no-such-buffer')}' does not exist" in error


def test_a_second_start_resolves_the_kafka_source_from_the_cache_without_downloading(spark):
    # The session fixture has filled the cache (or found it full); a new JVM must not fetch anything.
    script = "from delayq.spark import spark_session; from delayq.spark.session import jvm_log; " \
             "spark_session('local[1]'); print(jvm_log())"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                            check=False)

    assert result.returncode == 0, result.stderr
    log = Path(result.stdout.strip().splitlines()[-1]).read_text()
    assert f"found org.apache.spark#spark-sql-kafka-0-10_2.13;{pyspark.__version__}" in log
    assert "downloading" not in log
    assert "0 artifacts copied" in log
    jar = f"org.apache.spark_spark-sql-kafka-0-10_2.13-{pyspark.__version__}.jar"
    assert (spark_home_dir() / "ivy" / "jars" / jar).is_file()


def test_an_empty_buffer_gives_a_clean_report_with_nothing_expected(dev_stack, spark, tmp_path):
    settings, _targets, since, until = stage_topics(dev_stack, f"t-reconcile-empty-{uuid.uuid4().hex[:8]}")

    report = reconcile(settings, ReconcileOptions(since_ms=since, until_ms=until, out=tmp_path), spark=spark)

    assert report.exit_code == 0 and report.source["target_topics"] == []
    assert all(value == 0 for value in report.totals.values())
    assert report.lateness_ms["p50"] is None and report.per_hour == []
    assert (tmp_path / "report.html").is_file()
