"""One node on the real stack: order, never early, cancel, reschedule, HTTP, dead letters."""

from __future__ import annotations

import time

import pytest
from support.kafka_testing import create_topics, read_topic
from support.process_testing import wait_until
from support.service_testing import Feeder, now_ms

import delayq
from delayq import wire
from delayq.wire import new_delay_id

pytestmark = pytest.mark.integration


@pytest.fixture
def feeder(settings):
    return Feeder(settings)


def header(record, name: str) -> bytes | None:
    return dict(record.headers() or []).get(name)


def test_messages_arrive_in_due_order_never_early_with_key_value_headers_kept(cluster, feeder, settings, names):
    target = names.topic("target")
    create_topics(settings.bootstrap_servers, [target])
    cluster.start("node-a")
    base = now_ms() + 1500
    # Produced in reverse order of due time, with ties on the same millisecond.
    sent = {}
    for i in reversed(range(30)):
        due = base + (i // 3) * 100
        delay_id = feeder.put(target, f"v{i}".encode(), due, key=f"k{i}".encode(), headers=[("trace", f"t{i}".encode())])
        sent[delay_id] = (due, i)
    feeder.flush()

    records = read_topic(settings.bootstrap_servers, target, expect=30, timeout_s=30)

    assert len(records) == 30
    ids = [header(r, wire.ID).decode() for r in records]
    assert sorted(ids) == sorted(sent)
    assert ids == sorted(ids, key=lambda d: (sent[d][0], d)), "delivered out of (deliver_at, id) order"
    for record in records:
        due, i = sent[header(record, wire.ID).decode()]
        assert record.timestamp()[1] >= due, f"message {i} delivered {due - record.timestamp()[1]} ms early"
        assert (record.key(), record.value()) == (f"k{i}".encode(), f"v{i}".encode())
        assert record.headers()[0] == ("trace", f"t{i}".encode())
        assert header(record, wire.DELIVER_AT) == str(due).encode()
        assert header(record, wire.EPOCH) == b"1"


def test_cancel_before_due_stops_delivery_and_cancel_after_changes_nothing(cluster, feeder, settings, names):
    target = names.topic("target")
    create_topics(settings.bootstrap_servers, [target])
    node = cluster.start("node-a")
    cancelled = feeder.put(target, b"cancelled", now_ms() + 2000)
    kept = feeder.put(target, b"kept", now_ms() + 500)
    feeder.flush()
    feeder.cancel(cancelled)
    feeder.flush()

    delivered = read_topic(settings.bootstrap_servers, target, expect=1, idle_s=3, timeout_s=15)
    assert [r.value() for r in delivered] == [b"kept"]
    feeder.cancel(kept)  # too late: it was delivered
    feeder.flush()
    time.sleep(1)

    assert [r.value() for r in read_topic(settings.bootstrap_servers, target, idle_s=2)] == [b"kept"]
    assert node.get_json(f"/v1/messages/{cancelled}")[0] == 404
    assert node.metric("delayq_pending") == 0


def test_reschedule_moves_the_due_time_and_delivers_once(cluster, feeder, settings, names):
    target = names.topic("target")
    create_topics(settings.bootstrap_servers, [target])
    node = cluster.start("node-a")
    delay_id = feeder.put(target, b"first", now_ms() + 3000)
    feeder.flush()
    later = now_ms() + 4500
    feeder.put(target, b"second", later, delay_id=delay_id)
    feeder.flush()

    # The node applies the buffer on its own time: ask until it has read the second put (or give up well
    # before the first due time could pass unseen).
    assert wait_until(lambda: node.get_json(f"/v1/messages/{delay_id}")[1].get("deliver_at_ms") == later,
                      timeout_s=2.5), node.get_json(f"/v1/messages/{delay_id}")
    status, body = node.get_json(f"/v1/messages/{delay_id}")
    assert status == 200 and body["status"] == "pending"
    records = read_topic(settings.bootstrap_servers, target, expect=1, idle_s=2, timeout_s=15)
    assert [r.value() for r in records] == [b"second"]
    assert records[0].timestamp()[1] >= later


def test_a_write_its_client_library_appends_twice_is_applied_once(cluster, feeder, settings, names):
    """librdkafka may send a batch again under a new epoch after a leader change: one write at two offsets."""
    target = names.topic("target")
    create_topics(settings.bootstrap_servers, [target])
    node = cluster.start("node-a")

    def put_record(value: bytes, due: int, delay_id: str | None = None) -> tuple[bytes, bytes, list]:
        message = wire.Envelope(delay_id or new_delay_id(), target, due, value, None, None, [("trace", value)],
                               now_ms(), "consistent_random")
        return message.delay_id.encode(), message.buffer_value(), message.buffer_headers()

    def twice(record: tuple[bytes, bytes | None, list], *, between=lambda: None) -> tuple[int, int]:
        created = now_ms()
        first = feeder.write_at(*record, created)
        between()
        return first, feeder.write_at(*record, created)

    # Copied while pending: one version, delivered once, its done naming the first offset.
    pending = put_record(b"copied while pending", now_ms() + 2000)
    pending_offsets = twice(pending)
    # Copied after its delivery: nothing to deliver again; the master closes the copy with a done.
    delivered = put_record(b"copied after delivery", now_ms() + 300)
    delivered_first = feeder.write_at(*delivered, created := now_ms())
    # Copied after its cancel: never delivered.
    cancelled = put_record(b"copied after cancel", now_ms() + 2500)
    twice(cancelled, between=lambda: feeder.cancel(cancelled[0].decode()) or feeder.flush())
    # A cancel copied after the reschedule that followed it: the reschedule stands.
    rescheduled_id = new_delay_id()
    feeder.write_at(*put_record(b"first version", now_ms() + 2500, rescheduled_id), now_ms())
    cancel = (rescheduled_id.encode(), None, wire.control_headers(wire.OP_CANCEL, rescheduled_id))
    rescheduled = put_record(b"rescheduled after a cancel", now_ms() + 3000, rescheduled_id)
    twice(cancel, between=lambda: feeder.write_at(*rescheduled, now_ms()))

    records = read_topic(settings.bootstrap_servers, target, expect=1, idle_s=1, timeout_s=10)
    assert [r.value() for r in records] == [b"copied after delivery"]
    delivered_copy = feeder.write_at(*delivered, created)
    records = read_topic(settings.bootstrap_servers, target, expect=3, idle_s=3, timeout_s=20)

    assert sorted(r.value() for r in records) == [b"copied after delivery", b"copied while pending",
                                                  b"rescheduled after a cancel"], "each write applied once"
    versions = {header(r, wire.ID).decode(): int(header(r, wire.VERSION)) for r in records}
    # The first write's version, or the master's restores= copy of it (the copy was the id's newest record).
    assert versions[pending[0].decode()] != pending_offsets[1], "a copy is no new version"
    assert versions[delivered[0].decode()] == delivered_first
    assert node.metric("delayq_write_copies_total") == 4
    dones = {(r.key(), int(header(r, wire.VERSION))) for r in read_topic(settings.bootstrap_servers,
                                                                         settings.buffer_topic, idle_s=1)
             if r.value() is None and header(r, wire.OP) == wire.OP_DONE}
    assert (delivered[0], delivered_copy) in dones, "the copy after delivery is closed, so compaction keeps no put"
    assert node.metric("delayq_pending") == 0


def test_a_message_picked_after_its_expiry_is_dead_lettered_expired_and_one_in_time_is_delivered(
        cluster, feeder, settings, names):
    target = names.topic("target")
    create_topics(settings.bootstrap_servers, [target])
    cluster.start("node-a")
    # Through delayq.Producer: its gate reads the cluster's feature level (a new cluster starts at 2).
    producer = delayq.Producer({"bootstrap.servers": settings.bootstrap_servers, "delayq.cluster": settings.cluster,
                                "delayq.zk.connect": settings.zk_connect})
    # Fell due 10 s ago (a cluster outage, say) and may be at most 5 s late: too late now.
    stale = producer.produce(target, b"stale reminder", deliver_at=now_ms() - 10_000, expire_after=5)
    fresh = producer.produce(target, b"fresh reminder", delay=0.5, expire_after=60)
    assert producer.flush(10) == 0
    producer.close()

    delivered = read_topic(settings.bootstrap_servers, target, expect=1, idle_s=2, timeout_s=15)
    assert [(header(r, wire.ID).decode(), r.value()) for r in delivered] == [(fresh, b"fresh reminder")]
    [letter] = read_topic(settings.bootstrap_servers, settings.dead_letter_topic, expect=1, timeout_s=15, idle_s=2)
    assert letter.key() == stale.encode() and letter.value().endswith(b"stale reminder")
    reason = header(letter, wire.DEAD_LETTER_REASON).decode()
    assert wire.Reason.of(reason) is wire.Reason.EXPIRED and "after its due time" in reason, reason


def test_a_record_of_a_newer_feature_level_holds_its_partition_and_is_never_dead_lettered(
        cluster, feeder, settings, names):
    target = names.topic("target")
    create_topics(settings.bootstrap_servers, [target])
    node = cluster.start("node-a")
    newer = new_delay_id()
    held_partition = wire.buffer_partition(newer, settings.buffer_partitions)

    def id_on(same: bool) -> str:
        while (wire.buffer_partition(found := new_delay_id(), settings.buffer_partitions) == held_partition) != same:
            pass
        return found

    feeder.raw(newer.encode(), f"put {now_ms()} {target} - level=9 warp=1\n".encode() + b"x", [])
    behind = feeder.put(target, b"behind it", now_ms() + 300, delay_id=id_on(True))
    feeder.put(target, b"beside it", now_ms() + 300, delay_id=id_on(False))
    feeder.flush()

    delivered = read_topic(settings.bootstrap_servers, target, expect=1, idle_s=3, timeout_s=15)
    assert [r.value() for r in delivered] == [b"beside it"], "its partition waits, the others flow"
    status, body = node.get_json("/readyz")
    assert status == 503 and f"partition {held_partition} at offset" in body["reason"] and "level 9" in body["reason"]
    assert node.metric("delayq_partitions_awaiting_upgrade") == 1
    assert node.get_json(f"/v1/messages/{behind}")[0] == 404, "nothing after the newer record is applied"
    assert read_topic(settings.bootstrap_servers, settings.dead_letter_topic, idle_s=1) == []


def test_http_endpoints_report_health_metrics_and_messages(cluster, feeder, settings, names):
    target = names.topic("target")
    create_topics(settings.bootstrap_servers, [target])
    node = cluster.start("node-a")
    delay_id = feeder.put(target, b"later", now_ms() + 60_000)
    feeder.flush()

    assert node.get("/livez") == (200, b"ok\n")
    assert node.get_json("/readyz")[0] == 200
    # The node applies the buffer on its own time (a busy CI host took longer than half a second once).
    assert wait_until(lambda: node.get_json(f"/v1/messages/{delay_id}")[0] == 200, timeout_s=15), \
        node.get_json(f"/v1/messages/{delay_id}")
    assert node.get_json(f"/v1/messages/{delay_id}")[1]["topic"] == target
    assert node.get_json("/v1/messages/not-an-id")[0] == 400
    metrics = node.get("/metrics")[1].decode()
    for name in ("delayq_ingested_total", "delayq_delivered_total", "delayq_pending", "delayq_buffer_lag",
                 "delayq_delivery_lateness_seconds_bucket", "delayq_is_master", "delayq_epoch",
                 "delayq_elections_total"):
        assert name in metrics
    assert node.metric("delayq_pending") == 1
    assert node.metric("delayq_is_master") == 1
    # The node's process runs with its collector tuned (delay_service/collector.py): what it made at start is
    # frozen, after the one full collection that freeze makes, which its pause histogram counted.
    deadline = time.monotonic() + 10
    while node.metric("delayq_gc_frozen_objects") == 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert node.metric("delayq_gc_frozen_objects") > 10_000
    assert node.metric("delayq_gc_pause_seconds_count", generation="2") >= 1


def test_malformed_records_and_missing_topic_are_dead_lettered_while_the_rest_flows(cluster, feeder, settings, names):
    target = names.topic("target")
    create_topics(settings.bootstrap_servers, [target])
    node = cluster.start("node-a")
    no_frame, bad_time, no_op = new_delay_id(), new_delay_id(), new_delay_id()
    feeder.raw(b"not-an-id", f"put {now_ms()} {target} -\n".encode() + b"x", [])
    feeder.raw(no_frame.encode(), b"a payload without the envelope", [])
    feeder.raw(bad_time.encode(), f"put 1795404000 {target} -\n".encode() + b"x", [])
    feeder.raw(no_op.encode(), None, [])
    lost = feeder.put(names.topic("does-not-exist"), b"nowhere", now_ms() + 200)
    good = feeder.put(target, b"fine", now_ms() + 500)
    feeder.flush()

    assert [r.value() for r in read_topic(settings.bootstrap_servers, target, expect=1, timeout_s=15)] == [b"fine"]
    dead = read_topic(settings.bootstrap_servers, settings.dead_letter_topic, expect=5, timeout_s=30, idle_s=2)
    reasons = {r.key(): header(r, wire.DEAD_LETTER_REASON).decode() for r in dead}
    assert set(reasons) == {b"not-an-id", no_frame.encode(), bad_time.encode(), no_op.encode(), lost.encode()}
    assert reasons[b"not-an-id"].startswith("bad-id: record key b'not-an-id' is not a delay id")
    assert reasons[no_frame.encode()].startswith("bad-frame: a put's value must start with 'put <deliver-at ms>")
    assert reasons[bad_time.encode()].startswith("bad-due-time: ") and "were seconds meant?" in reasons[bad_time.encode()]
    assert reasons[no_op.encode()].startswith("bad-control: ") and "needs header delayq-op" in reasons[no_op.encode()]
    assert reasons[lost.encode()].startswith("missing-topic: ") and "does not exist" in reasons[lost.encode()]
    for record in dead:  # each points at the buffer record it copies
        topic, partition, offset = header(record, wire.DEAD_LETTER_SOURCE).decode().rsplit("/", 2)
        assert topic == settings.buffer_topic and int(partition) >= 0 and int(offset) >= 0
    assert good != lost
    for code in ("bad-id", "bad-frame", "bad-due-time", "bad-control", "missing-topic"):
        assert node.metric("delayq_dead_lettered_total", reason=code) == 1, code


def broker_auto_creates_topics(bootstrap: str) -> bool:
    from confluent_kafka.admin import AdminClient, ConfigResource

    admin = AdminClient({"bootstrap.servers": bootstrap})
    broker = next(iter(admin.list_topics(timeout=10).brokers))
    resource = ConfigResource(ConfigResource.Type.BROKER, str(broker))
    configs = admin.describe_configs([resource])[resource].result(15)
    return configs["auto.create.topics.enable"].value == "true"


def topic_exists(bootstrap: str, topic: str) -> bool:
    from confluent_kafka.admin import AdminClient

    found = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics
    return topic in found and found[topic].error is None


def test_a_message_for_a_missing_topic_is_dead_lettered_and_never_creates_it(cluster, feeder, settings, names):
    # Most brokers create a topic on a producer's metadata request (Kafka's default); the dev broker does too.
    assert broker_auto_creates_topics(settings.bootstrap_servers), (
        "the dev broker runs with auto.create.topics.enable=false; restart it (delayq dev down && delayq dev up) "
        "so this test sees what most users' brokers do")
    missing = names.topic("never-created")
    node = cluster.start("node-a")
    lost = feeder.put(missing, b"nowhere", now_ms() + 100)
    feeder.flush()

    [letter] = read_topic(settings.bootstrap_servers, settings.dead_letter_topic, expect=1, timeout_s=30, idle_s=2)
    assert letter.key() == lost.encode()
    assert header(letter, wire.DEAD_LETTER_REASON).startswith(b"missing-topic: ")
    assert not topic_exists(settings.bootstrap_servers, missing)
    assert node.metric("delayq_dead_lettered_total", reason="missing-topic") == 1
