"""End to end: delayq.Producer -> buffer -> a real `delayq node` -> the target topic, as produced."""

from __future__ import annotations

import subprocess
import time
from datetime import UTC, datetime, timedelta

import confluent_kafka
import pytest
from confluent_kafka import Producer as PlainProducer
from support.kafka_testing import create_topics, read_topic
from support.process_testing import run_delayq, wait_until

import delayq
from delayq import wire

pytestmark = pytest.mark.integration


def delayq_cli(settings, *args: str) -> subprocess.CompletedProcess:
    return run_delayq(*args, settings=settings)


def test_delayed_messages_arrive_after_their_time_exactly_as_produced(cluster, settings, names):
    target = names.topic("target")
    create_topics(settings.bootstrap_servers, [target], partitions=3)
    cluster.start("node-a")
    conf = {"bootstrap.servers": settings.bootstrap_servers, "delayq.cluster": settings.cluster, "linger.ms": 1}
    producer = delayq.Producer(conf)
    murmur = delayq.Producer({**conf, "partitioner": "murmur2_random"})
    plain_murmur = PlainProducer({"bootstrap.servers": settings.bootstrap_servers, "partitioner": "murmur2_random"})

    keyed_headers = [("trace", b"t1"), ("trace", b"dup"), ("empty", None)]
    due = {}
    producer.produce(target, b"now", b"order-1")  # immediate, beside which the delayed order-1 must land
    plain_murmur.produce(target, b"now-murmur", b"order-5")
    keyed = producer.produce(target, b"\x00keyed", b"order-1", headers=keyed_headers, delay=1.5)
    pinned = producer.produce(target, None, partition=2, headers={"h": "x"},
                              deliver_at=datetime.now(UTC) + timedelta(seconds=2))
    hashed = murmur.produce(target, b"murmur", b"order-5", delay=1.5)
    cancelled = producer.produce(target, b"cancelled", delay=2.5)
    cancelled_due_ms = time.time_ns() // 1_000_000 + 2500
    moved = producer.produce(target, b"original", b"m", delay=600)
    for p in (producer, murmur, plain_murmur):
        p.flush(10)
    producer.cancel(cancelled)
    producer.reschedule(moved, target, b"rescheduled", b"m", headers=[("v", b"2")], delay=2)
    producer.flush(10)
    for delay_id in (keyed, pinned, hashed, moved):
        assert wait_until(lambda delay_id=delay_id: delayq.lookup(delay_id, settings=settings).pending), delay_id
        due[delay_id] = delayq.lookup(delay_id, settings=settings).deliver_at_ms

    records = read_topic(settings.bootstrap_servers, target, expect=6, timeout_s=30, idle_s=1)
    # Read again once the cancelled message is well past due, so its absence means something.
    time.sleep(max(0.0, (cancelled_due_ms + 1000) / 1000 - time.time()))
    records = read_topic(settings.bootstrap_servers, target, expect=6, timeout_s=30, idle_s=0.5)

    now_records = {r.value(): r for r in records if wire.ID not in dict(r.headers() or [])}
    delayed = {dict(r.headers())[wire.ID].decode(): r for r in records if wire.ID in dict(r.headers() or [])}
    assert set(now_records) == {b"now", b"now-murmur"}
    assert set(delayed) == {keyed, pinned, hashed, moved}, "a cancelled message was delivered, or one is missing"
    for delay_id, record in delayed.items():
        assert record.timestamp()[1] >= due[delay_id], f"{delay_id} delivered early"
        assert dict(record.headers())[wire.DELIVER_AT] == str(due[delay_id]).encode()
    expect = {
        keyed: (b"\x00keyed", b"order-1", keyed_headers, now_records[b"now"].partition()),
        pinned: (None, None, [("h", b"x")], 2),
        hashed: (b"murmur", b"order-5", [], now_records[b"now-murmur"].partition()),
        moved: (b"rescheduled", b"m", [("v", b"2")], None),
    }
    for delay_id, (value, key, headers, partition) in expect.items():
        record = delayed[delay_id]
        assert (record.value(), record.key()) == (value, key)
        assert record.headers()[:len(headers)] == headers
        assert [name for name, _ in record.headers()[len(headers):]] == [wire.ID, wire.DELIVER_AT, wire.EPOCH, wire.VERSION]
        if partition is not None:
            assert record.partition() == partition
    assert due[moved] - due[keyed] < 5_000, "reschedule did not move the due time"
    assert wait_until(lambda: not delayq.lookup(keyed, settings=settings).pending)


def test_a_delayed_messages_timestamp_stamps_the_buffer_put_and_the_delivery_is_stamped_when_delivered(
        cluster, settings, names):
    target = names.topic("target")
    create_topics(settings.bootstrap_servers, [target])
    cluster.start("node-a")
    producer = delayq.Producer({"bootstrap.servers": settings.bootstrap_servers, "delayq.cluster": settings.cluster})
    an_hour_ago = time.time_ns() // 1_000_000 - 3_600_000

    delay_id = producer.produce(target, b"stamped", b"k", timestamp=an_hour_ago, delay=1.5)
    assert producer.flush(10) == 0

    [delivered] = read_topic(settings.bootstrap_servers, target, expect=1, timeout_s=30, idle_s=0.5)
    # The buffer holds the put and, since the delivery, the master's `done` (a null value).
    [put] = [r for r in read_topic(settings.bootstrap_servers, settings.buffer_topic, expect=2, idle_s=0.5)
             if r.value() is not None]
    envelope = wire.parse_buffer_record(put.key(), put.value(), put.headers(), put.timestamp()[1]).envelope
    assert (envelope.delay_id, envelope.created_at_ms) == (delay_id, an_hour_ago)
    assert put.timestamp() == (confluent_kafka.TIMESTAMP_CREATE_TIME, an_hour_ago), "the put is not stamped ts"
    # The due time counts from when produce() was called, not from the timestamp.
    assert envelope.deliver_at_ms - an_hour_ago >= 3_600_000 + 1_500
    headers = dict(delivered.headers())
    assert (delivered.value(), headers[wire.ID], headers[wire.DELIVER_AT]) == (
        b"stamped", delay_id.encode(), str(envelope.deliver_at_ms).encode())
    # The delivered record is stamped at delivery: at or after its due time, not with the user's timestamp.
    kind, stamped_at = delivered.timestamp()
    assert kind == confluent_kafka.TIMESTAMP_CREATE_TIME
    assert envelope.deliver_at_ms <= stamped_at <= time.time_ns() // 1_000_000


def test_cli_get_and_cancel_through_a_node_found_in_zookeeper(cluster, settings, names):
    target = names.topic("target")
    create_topics(settings.bootstrap_servers, [target])
    cluster.start("node-a")
    produced = delayq_cli(settings, "produce", "--topic", target, "--delay", "10m", "later")
    delay_id = produced.stdout.strip()
    assert produced.returncode == 0, produced.stderr

    assert wait_until(lambda: delayq_cli(settings, "get", delay_id).returncode == 0)
    pending = delayq_cli(settings, "get", delay_id)
    cancelled = delayq_cli(settings, "cancel", delay_id)

    assert pending.stdout.startswith("pending: due ") and f"to topic {target}" in pending.stdout
    assert cancelled.returncode == 0, cancelled.stderr
    assert wait_until(lambda: delayq_cli(settings, "get", delay_id).returncode == 1)


def test_a_delayed_message_in_an_aborted_transaction_is_never_delivered(cluster, settings, names):
    target = names.topic("target")
    create_topics(settings.bootstrap_servers, [target])
    cluster.start("node-a")
    producer = delayq.Producer({"bootstrap.servers": settings.bootstrap_servers, "delayq.cluster": settings.cluster,
                                "transactional.id": names.topic("tx")})
    producer.init_transactions(30)
    producer.begin_transaction()
    aborted = producer.produce(target, b"aborted", key=b"k", delay=0.5)
    producer.flush(10)
    producer.abort_transaction(30)
    producer.begin_transaction()
    committed = producer.produce(target, b"committed", key=b"k", delay=0.5)
    producer.commit_transaction(30)

    records = read_topic(settings.bootstrap_servers, target, expect=1, idle_s=3, timeout_s=20)

    assert [(dict(r.headers())[wire.ID].decode(), r.value()) for r in records] == [(committed, b"committed")]
    assert aborted != committed


def test_a_transaction_left_open_on_the_buffer_holds_back_its_partition_only_and_loses_nothing(
        cluster, settings, names):
    """A producer's open transaction holds back what falls due on its buffer partition, nothing else.

    A cancel acknowledged behind the transaction could be for any message of that
    partition, so none is delivered until the transaction ends (the cancel test below
    attacks that). Messages of the other partitions are delivered on time meanwhile,
    including one due after the transaction began. Then everything is delivered, once.
    """
    target = names.topic("target")
    create_topics(settings.bootstrap_servers, [target])
    node = cluster.start("node-a")
    conf = {"bootstrap.servers": settings.bootstrap_servers, "delayq.cluster": settings.cluster, "linger.ms": 1}
    partitions = settings.buffer_partitions
    plain = delayq.Producer(conf)
    before = [plain.produce(target, b"before", key=b"k", delay=3) for _ in range(40)]  # every buffer partition
    plain.flush(10)
    transactional = delayq.Producer({**conf, "transactional.id": names.topic("tx")})
    transactional.init_transactions(30)
    transactional.begin_transaction()
    held = transactional.produce(target, b"held", key=b"k", delay=0.5)
    transactional.flush(10)  # written, not committed
    held_partition = wire.buffer_partition(held, partitions)
    after = next(i for i in iter(wire.new_delay_id, None) if wire.buffer_partition(i, partitions) != held_partition)
    plain.produce(target, b"after", key=b"k", delay=6, delay_id=after)
    plain.flush(10)
    on_time = sorted([i for i in before if wire.buffer_partition(i, partitions) != held_partition] + [after])
    assert len(on_time) < 41, "no message of `before` went to the held partition: nothing to test"

    first = read_topic(settings.bootstrap_servers, target, expect=len(on_time), timeout_s=30, idle_s=3)
    time.sleep(3)
    while_open = read_topic(settings.bootstrap_servers, target, idle_s=1)
    held_while_open = node.metric("delayq_held_partitions")
    transactional.commit_transaction(30)
    everything = read_topic(settings.bootstrap_servers, target, expect=42, timeout_s=30)

    def ids(records):
        return sorted(dict(r.headers())[wire.ID].decode() for r in records)

    assert ids(first) == on_time
    assert ids(while_open) == on_time
    assert ids(everything) == sorted([*before, after, held])
    assert held_while_open == 1
    assert wait_until(lambda: node.metric("delayq_held_partitions") == 0, timeout_s=10)


def test_a_long_hold_with_a_large_backlog_does_not_slow_the_other_partitions(cluster, settings, names):
    """20,000 due messages wait on a partition an open transaction holds; the others deliver on time.

    The held partition's backlog is first in due order: the master must not walk it again
    at every cover, or what falls due elsewhere would wait behind it.
    """
    target = names.topic("target")
    create_topics(settings.bootstrap_servers, [target], partitions=3)
    cluster.start("node-a")
    conf = {"bootstrap.servers": settings.bootstrap_servers, "delayq.cluster": settings.cluster, "linger.ms": 5}
    partitions = settings.buffer_partitions
    plain = delayq.Producer(conf)
    held_partition = 0
    ids = iter(wire.new_delay_id, None)
    start_ms = int(time.time() * 1000)
    backlog = [next(i for i in ids if wire.buffer_partition(i, partitions) == held_partition) for _ in range(20_000)]
    for delay_id in backlog:
        plain.produce(target, b"backlog", deliver_at=start_ms + 5000, delay_id=delay_id)
    plain.flush(30)
    transactional = delayq.Producer({**conf, "transactional.id": names.topic("tx")})
    transactional.init_transactions(30)
    transactional.begin_transaction()
    held = next(i for i in ids if wire.buffer_partition(i, partitions) == held_partition)
    transactional.produce(target, b"held", deliver_at=start_ms + 5000, delay_id=held)
    transactional.flush(10)
    others = {}
    for n in range(200):
        delay_id = next(i for i in ids if wire.buffer_partition(i, partitions) != held_partition)
        others[delay_id] = start_ms + 7000 + n * 30  # falling due over 6 s while the hold lasts
        plain.produce(target, b"other", deliver_at=others[delay_id], delay_id=delay_id)
    plain.flush(10)
    assert int(time.time() * 1000) < start_ms + 5000, "the set-up took too long to test anything"

    while_held = read_topic(settings.bootstrap_servers, target, expect=len(others), timeout_s=30, idle_s=2)
    transactional.commit_transaction(30)
    everything = read_topic(settings.bootstrap_servers, target, expect=len(others) + 20_001, timeout_s=60, idle_s=3)

    delivered = {dict(r.headers())[wire.ID].decode(): r.timestamp()[1] for r in while_held}
    assert set(delivered) == set(others)
    lateness = sorted(delivered[i] - due for i, due in others.items())
    assert lateness[0] >= 0 and lateness[-1] < 2000, f"lateness of the other partitions' messages: {lateness[-5:]} ms"
    assert sorted(dict(r.headers())[wire.ID].decode() for r in everything) == sorted([*others, *backlog, held])


def test_a_cancel_acknowledged_behind_an_open_transaction_wins_before_and_after_a_failover(
        cluster, settings, names):
    """A cancel the producer saw acknowledged is honoured even if a transaction holds its partition back.

    The cancel lands behind another producer's open transaction on the buffer: no
    read_committed reader can see it until that transaction ends. Its message falls due
    meanwhile; neither the master nor, after the master is killed, its successor may
    deliver it. A cover reads the buffer up to the high watermark, past every acknowledged
    write, and waits for the transaction that holds it back.
    """
    target = names.topic("target")
    create_topics(settings.bootstrap_servers, [target])
    cluster.start("node-a")
    cluster.start("node-b")
    master = cluster.master()
    conf = {"bootstrap.servers": settings.bootstrap_servers, "delayq.cluster": settings.cluster, "linger.ms": 1}
    plain = delayq.Producer(conf)
    due_ms = int(time.time() * 1000) + 8000
    cancelled = plain.produce(target, b"cancelled", deliver_at=due_ms)
    plain.flush(10)
    partition = wire.buffer_partition(cancelled, settings.buffer_partitions)
    held = next(i for i in iter(wire.new_delay_id, None)
                if wire.buffer_partition(i, settings.buffer_partitions) == partition)
    transactional = delayq.Producer({**conf, "transactional.id": names.topic("tx")})
    transactional.init_transactions(30)
    transactional.begin_transaction()
    transactional.produce(target, b"held", delay=0.5, delay_id=held)
    transactional.flush(10)  # written to the cancelled message's partition, not committed
    acked: list[object] = []
    plain.cancel(cancelled, on_delivery=lambda err, _msg: acked.append(err))
    plain.flush(10)
    assert acked == [None], f"the cancel was not acknowledged: {acked}"
    assert time.time() * 1000 < due_ms - 2000, "the set-up took too long: the cancel came too close to the due time"

    time.sleep((due_ms / 1000 - time.time()) + 3)  # past the due time, the master running
    while_open = read_topic(settings.bootstrap_servers, target, idle_s=1)
    assert [r.value() for r in while_open] == [], "the master delivered a message whose cancel was acknowledged"
    master.kill()
    successor = cluster.master(other_than=master)
    # The successor's first cover waits for the transaction, and says so.
    assert wait_until(lambda: "a transaction is open" in successor.log_tail(200), timeout_s=30), successor.log_tail()
    after_failover = read_topic(settings.bootstrap_servers, target, idle_s=1)
    assert [r.value() for r in after_failover] == [], "the successor delivered it"
    transactional.commit_transaction(30)
    everything = read_topic(settings.bootstrap_servers, target, expect=1, timeout_s=30, idle_s=3)

    assert [dict(r.headers())[wire.ID].decode() for r in everything] == [held]
