"""The console's index on a real Kafka with real nodes: histories, deliveries, dead letters, series, restarts."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Producer as KafkaProducer
from support.kafka_testing import create_topics, read_topic
from support.process_testing import wait_until

from delayq import Every, Producer, Settings, wire
from delayq.delay_service.console.history import REPLAYED_FROM
from delayq.delay_service.console.index import ConsoleIndex
from delayq.delay_service.topics import ensure_topics

pytestmark = pytest.mark.integration


def producer(settings: Settings) -> Producer:
    return Producer({"bootstrap.servers": settings.bootstrap_servers, "delayq.cluster": settings.cluster,
                     "delayq.lookup.urls": ""})


def kinds(index: ConsoleIndex, delay_id: str) -> list[str]:
    return [event.kind for event in index.history(delay_id)]


def header(record, name: str) -> str | None:
    value = dict(record.headers() or []).get(name)
    return None if value is None else value.decode()


def test_an_ids_history_reads_put_reschedule_cancel_and_a_delivery_is_found_by_its_done(
        cluster, settings, names, tmp_path):
    target = names.topic("target")
    create_topics(settings.bootstrap_servers, [target], partitions=2)
    cluster.start("node-a")
    delayq_producer = producer(settings)
    pending = delayq_producer.produce(target, b"later", delay=600)
    delayq_producer.reschedule(pending, target, b"later still", delay=900)
    delayq_producer.cancel(pending)
    delivered = delayq_producer.produce(target, b"now", key=b"k", delay=0.2)
    assert delayq_producer.flush(10) == 0
    [record] = read_topic(settings.bootstrap_servers, target, expect=1, timeout_s=30)

    with ConsoleIndex(settings, tmp_path / "index") as index:
        assert wait_until(lambda: "done" in kinds(index, delivered), timeout_s=30), "no done of the delivered message"
        assert index.wait_caught_up(30) and index.caught_up() and index.lag() == 0
        assert kinds(index, pending) == ["put", "reschedule", "cancel"]
        [put, reschedule, _cancel] = index.history(pending)
        assert put.target == reschedule.target == target and reschedule.due_ms > put.due_ms
        assert index.latest_put(pending) == (reschedule.partition, reschedule.offset)

        [put, done] = index.history(delivered)
        assert done.version == put.offset and done.topic == settings.buffer_topic
        found = index.find_delivery(target, delivered, put.offset, done.ts_ms)
        assert found is not None and found.kind == "delivered"
        assert (found.partition, found.offset, found.epoch, found.version) == (
            record.partition(), record.offset(), int(header(record, wire.EPOCH) or -1), put.offset)
        assert index.find_delivery(target, delivered, put.offset + 1, done.ts_ms) is None, "another version"
        assert index.find_delivery(names.topic("nowhere"), delivered, put.offset, done.ts_ms) is None


def test_dead_letters_series_and_replays_are_listed_and_a_restart_resumes_without_duplicates(
        cluster, settings, names, tmp_path):
    target = names.topic("target")
    create_topics(settings.bootstrap_servers, [target])
    cluster.start("node-a")
    delayq_producer = producer(settings)
    ticking = delayq_producer.produce(target, b"tick", repeat=Every(1, times=1000), delay=0.2)
    assert delayq_producer.flush(10) == 0
    # A cancel on the wrong partition: the master dead-letters it (wrong-partition) and it cancels nothing.
    victim = delayq_producer.produce(target, b"never cancelled by the stray", delay=0.3)
    assert delayq_producer.flush(10) == 0
    wrong = (wire.buffer_partition(victim, settings.buffer_partitions) + 1) % settings.buffer_partitions
    plain = KafkaProducer(settings.kafka_conf())
    plain.produce(settings.buffer_topic, key=victim.encode(), value=None, partition=wrong,
                  headers=wire.control_headers(wire.OP_CANCEL, victim))
    assert plain.flush(10) == 0

    path = tmp_path / "index"
    index = ConsoleIndex(settings, path)
    index.start()
    try:
        assert wait_until(lambda: index.dead_letter_codes().get("wrong-partition") == 1, timeout_s=30), \
            "no dead letter of the wrong-partition cancel"
        [letter] = index.dead_letters(code="wrong-partition").items
        assert (letter.id, letter.replayable, letter.replayed_as) == (victim, False, None)
        assert letter.source is not None and letter.source.startswith(f"{settings.buffer_topic}/{wrong}/")
        assert [(e.kind, e.reason) for e in index.history(victim) if e.kind in ("malformed", "dead-letter")] == [
            ("malformed", "wrong-partition"), ("dead-letter", "wrong-partition")]
        raw = index.dead_letter_record(letter.coordinates)
        assert raw is not None and raw.key == victim.encode() and raw.value is None
        assert dict(raw.headers)[wire.DEAD_LETTER_REASON].startswith(b"wrong-partition: ")

        assert wait_until(lambda: any(s.id == ticking and s.occurrence >= 3 for s in index.series().items),
                          timeout_s=30), "the series never reached its third occurrence"
        [series] = index.series().items
        assert (series.target, series.repeat, series.delivered) == (target, "every=1000 times=1000",
                                                                     series.occurrence - 1)
        assert "next-occurrence" in kinds(index, ticking)

        # A replay of the dead letter (as the console's replay action writes it) marks it replayed.
        replayed = delayq_producer.produce(target, b"replayed", delay=600, headers=[
            (REPLAYED_FROM, f"{settings.dead_letter_topic}/{letter.coordinates}")])
        assert delayq_producer.flush(10) == 0
        assert wait_until(lambda: index.dead_letter(letter.coordinates).replayed_as == replayed, timeout_s=30), \
            "the dead letter was not marked replayed"
        assert kinds(index, replayed) == ["replay"] and kinds(index, victim)[-1] == "replay"
        delayq_producer.cancel(ticking)
        assert delayq_producer.flush(10) == 0
        assert wait_until(lambda: index.series().items == (), timeout_s=30), "the cancelled series is still listed"
        assert index.wait_caught_up(30)
        before = {delay_id: index.history(delay_id) for delay_id in (ticking, victim, replayed)}
        codes, offsets = index.dead_letter_codes(), index.offsets()
    finally:
        index.stop()

    later = delayq_producer.produce(target, b"while the index was away", delay=600)
    assert delayq_producer.flush(10) == 0
    with ConsoleIndex(settings, path) as again:
        assert again.offsets() == offsets
        assert again.wait_caught_up(30)
        assert kinds(again, later) == ["put"]
        assert again.dead_letter_codes() == codes
        after = {delay_id: again.history(delay_id) for delay_id in before}
        # The series may have delivered one more occurrence before its cancel was read: nothing twice, though.
        assert after == before


def test_the_index_waits_for_a_cluster_that_does_not_exist_yet_and_stops_within_two_seconds(settings, tmp_path):
    index = ConsoleIndex(settings, tmp_path / "index")
    index.start()
    time.sleep(1.0)
    assert index.lag() is None and not index.caught_up()
    ensure_topics(settings)
    assert index.wait_caught_up(30) and index.lag() == 0
    started = time.monotonic()
    index.stop()
    assert time.monotonic() - started < 2.0


@pytest.mark.slow
def test_the_index_reads_a_busy_buffer_at_tens_of_thousands_of_records_a_second(settings, tmp_path):
    """Puts with 200-byte payloads, their dones and some cancels, as a busy cluster writes them; prints the rate."""
    ensure_topics(settings)
    plain = KafkaProducer(settings.kafka_conf(**{"linger.ms": 50, "batch.size": 1_000_000,
                                                 "compression.type": "lz4", "queue.buffering.max.messages": 500_000}))
    partitions = settings.buffer_partitions
    payload = b"p" * 200
    ids = [wire.new_delay_id() for _ in range(100_000)]
    due = int(time.time() * 1000) + 3_600_000
    written = 0
    for n, delay_id in enumerate(ids):
        message = wire.Envelope(delay_id, "orders", due + n, payload, b"key")
        key, partition = delay_id.encode(), wire.buffer_partition(delay_id, partitions)
        plain.produce(settings.buffer_topic, key=key, value=message.buffer_value(), partition=partition)
        plain.produce(settings.buffer_topic, key=key, value=message.buffer_value(), partition=partition)
        closing = wire.done_headers(delay_id, n, n) if n % 3 else wire.control_headers(wire.OP_CANCEL, delay_id)
        plain.produce(settings.buffer_topic, key=key, value=None, partition=partition, headers=closing)
        written += 3
        if n % 10_000 == 0:
            plain.flush(60)
    assert plain.flush(60) == 0

    index = ConsoleIndex(settings, tmp_path / "index")
    started, cpu = time.monotonic(), time.process_time()
    index.start()
    try:
        assert wait_until(lambda: sum(index.offsets().values()) == written, timeout_s=120, interval_s=0.01)
        took, cpu = time.monotonic() - started, time.process_time() - cpu
        assert index.wait_caught_up(30)
        assert len(index.history(ids[-1])) == 3
    finally:
        index.stop()
    rate = written / took
    print(f"console index: {written} buffer records in {took:.1f} s from start: {rate:,.0f} records/s "
          f"({written / cpu:,.0f} per second of this process's CPU)")
    assert rate > 20_000  # the figure is the print's; a loaded shared machine must not fail the suite
