"""Routine faults the chaos soak found breaking the promise, each reproduced on the real stack.

- a Kafka broker killed and restarted under running nodes (delivery stalled until a node restart);
- a reschedule that reaches the buffer after the master picked the old version (it vanished);
- a master frozen past its ZooKeeper session and resumed (its node crashed on the fenced producer);
- cancels acknowledged just before the due time (they must win).
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter

import pytest
from support.kafka_testing import create_topics, read_topic
from support.process_testing import wait_until
from support.service_testing import Cluster, Feeder, now_ms, start_private_stack

from delayq import Settings, wire
from delayq.dev import DevStack, StackError
from delayq.proxy import Producer
from delayq.wire import buffer_partition

pytestmark = pytest.mark.integration


def delivered_ids(records) -> Counter:
    return Counter(dict(r.headers())[wire.ID].decode() for r in records)


# -- a broker restart --------------------------------------------------------------


@pytest.fixture
def private_stack(tmp_path):
    """A Kafka and ZooKeeper of this test's own (its broker gets killed), on free ports."""
    try:
        stack = start_private_stack(tmp_path)
    except StackError as err:
        pytest.fail(f"a private Kafka + ZooKeeper could not start: {err}", pytrace=False)
    yield stack
    stack.down()


def private_settings(stack: DevStack, names) -> Settings:
    """Settings of a cluster of this test's own on the private stack (a short session: faults show fast)."""
    return Settings(bootstrap_servers=stack.bootstrap_servers, zk_connect=stack.zk_connect, cluster=names.cluster,
                    buffer_partitions=3, zk_session_timeout_ms=4000)


def kill_kafka(stack: DevStack) -> None:
    pid = int((stack.state_dir / "kafka" / "kafka.pid").read_text())
    os.killpg(pid, signal.SIGKILL)
    wait_until(lambda: not stack.status()[0].running, timeout_s=15)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_delivery_resumes_after_a_broker_restart_without_restarting_any_node(private_stack, names, tmp_path):
    settings = private_settings(private_stack, names)
    target = names.topic("target")
    create_topics(settings.bootstrap_servers, [target], partitions=2)
    cluster = Cluster(settings, tmp_path / "nodes")
    try:
        nodes = [cluster.start(node_id) for node_id in ("node-a", "node-b", "node-c")]
        cluster.master()
        feeder = Feeder(settings)
        before = {feeder.put(target, b"before", now_ms() + 300) for _ in range(50)}
        feeder.flush()
        assert set(delivered_ids(read_topic(settings.bootstrap_servers, target, expect=50, timeout_s=30))) == before

        kill_kafka(private_stack)
        # A node whose loops cannot reach Kafka says so on /readyz.
        assert wait_until(lambda: all(n.get("/readyz")[0] == 503 for n in nodes), timeout_s=20), \
            [n.get("/readyz") for n in nodes]
        time.sleep(3)
        private_stack.up(say=lambda _text: None)
        restarted_at = time.monotonic()

        feeder = Feeder(settings)
        after = {feeder.put(target, b"after", now_ms() + 200) for _ in range(50)}
        feeder.flush()
        bound_s = settings.zk_session_timeout_ms / 1000 + 10
        assert wait_until(
            lambda: set(delivered_ids(read_topic(settings.bootstrap_servers, target, idle_s=0.5))) >= before | after,
            timeout_s=bound_s + 20, interval_s=1.0)
        resumed_s = time.monotonic() - restarted_at
        assert resumed_s < bound_s, f"delivery resumed {resumed_s:.1f}s after the broker restart; bound {bound_s}s"

        counts = delivered_ids(read_topic(settings.bootstrap_servers, target, expect=100, timeout_s=30, idle_s=2))
        assert set(counts) == before | after and max(counts.values()) == 1
        assert all(n.process.poll() is None for n in nodes), "a node exited"
        assert wait_until(lambda: all(n.get("/readyz")[0] == 200 for n in nodes), timeout_s=20)
        # No election storm: at most a handful of terms for one broker restart.
        elections = sum(n.metric("delayq_elections_total") for n in nodes)
        assert elections <= 3, f"{elections} elections for one broker restart"
    finally:
        cluster.close()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_zookeeper_outage_stops_the_master_and_every_node_says_why(private_stack, names, tmp_path):
    settings = private_settings(private_stack, names)
    target = names.topic("target")
    create_topics(settings.bootstrap_servers, [target])
    cluster = Cluster(settings, tmp_path / "nodes")
    try:
        nodes = [cluster.start(node_id) for node_id in ("node-a", "node-b")]
        master = cluster.master()
        epoch = int(master.metric("delayq_epoch"))
        pid = int((private_stack.state_dir / "zookeeper" / "zookeeper.pid").read_text())
        os.killpg(pid, signal.SIGKILL)
        # Without ZooKeeper no node may act as master: it could not be fenced.
        assert wait_until(lambda: master.metric("delayq_is_master") == 0, timeout_s=20), master.log_tail()
        assert wait_until(lambda: "membership not published" in master.log_tail(200), timeout_s=10)
        log = master.log_tail(200)
        assert (f"stepped down as master of {settings.cluster} shard 0, epoch {epoch}: ZooKeeper session suspended"
                in log)
        published = [line for line in log.splitlines() if "membership not published" in line]
        assert published[0].split("membership not published: ")[1].strip(), "an empty reason"
        assert len(published) == 1, "the same outage logged again every second"
        # Told to stop during the outage, the old master exits at once: its lock and registration are
        # ephemeral, nothing waits for ZooKeeper to delete them.
        stopping = time.monotonic()
        master.signal(signal.SIGTERM)
        assert master.running.wait(30) == 0, master.log_tail()
        assert time.monotonic() - stopping < 15, f"stopping took {time.monotonic() - stopping:.1f}s"
        standby = next(n for n in nodes if n is not master)

        private_stack.up(say=lambda _text: None)
        assert cluster.master(timeout_s=40) is standby
        feeder = Feeder(settings)
        after = {feeder.put(target, b"after", now_ms() + 200) for _ in range(20)}
        feeder.flush()
        counts = delivered_ids(read_topic(settings.bootstrap_servers, target, expect=20, timeout_s=40, idle_s=2))
        assert set(counts) == after and max(counts.values()) == 1
        assert standby.process.poll() is None
        assert wait_until(lambda: "membership published again" in standby.log_tail(400), timeout_s=20)
    finally:
        cluster.close()


# -- a late reschedule --------------------------------------------------------------


def test_a_reschedule_written_between_pick_and_done_is_delivered_at_its_new_time(cluster, settings, names):
    """The buffer as the race leaves it: put v1, the reschedule's put v2, then the master's done of v1.

    The master's side of the race is written here exactly as the master writes it, so
    the outcome does not depend on timing: v1 was delivered; v2 must be, once, at its time.
    """
    target = names.topic("target")
    create_topics(settings.bootstrap_servers, [target])
    delay_id = wire.new_delay_id()
    partition = buffer_partition(delay_id, settings.buffer_partitions)
    feeder = Feeder(settings)
    offsets: list[int] = []

    def put(due_ms: int, value: bytes) -> None:
        message = wire.Envelope(delay_id, target, due_ms, value, None, None, [], now_ms())
        feeder.producer.produce(settings.buffer_topic, key=delay_id.encode(), value=message.buffer_value(),
                                partition=partition, on_delivery=lambda err, msg: offsets.append(msg.offset()))
        feeder.flush()

    put(now_ms() - 1000, b"v1")
    new_due = now_ms() + 3000
    put(new_due, b"v2")
    feeder.producer.produce(settings.buffer_topic, key=delay_id.encode(), value=None, partition=partition,
                            headers=wire.done_headers(delay_id, offsets[0], offsets[0] + 1))
    feeder.flush()

    node = cluster.start("node-a")
    records = read_topic(settings.bootstrap_servers, target, expect=1, timeout_s=20, idle_s=2)
    assert [(r.value(), dict(r.headers())[wire.DELIVER_AT]) for r in records] == [(b"v2", str(new_due).encode())]
    assert records[0].timestamp()[1] >= new_due
    assert wait_until(lambda: node.metric("delayq_pending") == 0, timeout_s=10)

    # Compaction keeps only a key's newest record, and the stale done followed v2: the master
    # wrote v2 again after it (restores=), and delivered that copy; its done is the newest record.
    history = [r for r in read_topic(settings.bootstrap_servers, settings.buffer_topic, idle_s=1)
               if r.key() == delay_id.encode()]
    parsed = [wire.parse_buffer_record(r.key(), r.value(), r.headers()) for r in history]
    copy = next(i for i, p in enumerate(parsed) if p.restores == offsets[1])
    assert copy > 2 and parsed[copy].envelope.value == b"v2"
    assert parsed[-1].op == wire.OP_DONE and parsed[-1].closes_version == history[copy].offset()
    assert dict(records[0].headers())[wire.VERSION] == str(history[copy].offset()).encode()


def test_a_masters_copy_that_raced_a_cancel_is_closed_and_never_delivered(cluster, settings, names):
    """put v1, put v2, done(v1), the user's cancel, then a master's copy of v2 that the cancel overtook."""
    target = names.topic("target")
    create_topics(settings.bootstrap_servers, [target])
    delay_id = wire.new_delay_id()
    partition = buffer_partition(delay_id, settings.buffer_partitions)
    producer = Feeder(settings).producer
    offsets: list[int] = []
    v2 = wire.Envelope(delay_id, target, now_ms() + 1000, b"v2", None, None, [], now_ms())

    def write(value: bytes | None, headers=None) -> None:
        producer.produce(settings.buffer_topic, key=delay_id.encode(), value=value, headers=headers,
                         partition=partition, on_delivery=lambda err, msg: offsets.append(msg.offset()))
        producer.flush(10)

    write(wire.Envelope(delay_id, target, now_ms() - 1000, b"v1", None, None, [], now_ms()).buffer_value())
    write(v2.buffer_value())
    write(None, wire.done_headers(delay_id, offsets[0], offsets[0] + 1))
    write(None, wire.control_headers(wire.OP_CANCEL, delay_id))
    write(v2.buffer_value(restores=offsets[1]))

    node = cluster.start("node-a")
    assert wait_until(lambda: node.metric("delayq_pending") == 0, timeout_s=10)

    def newest() -> wire.BufferRecord:
        history = [r for r in read_topic(settings.bootstrap_servers, settings.buffer_topic, idle_s=0.5)
                   if r.key() == delay_id.encode()]
        return wire.parse_buffer_record(history[-1].key(), history[-1].value(), history[-1].headers())

    assert wait_until(lambda: newest().op == wire.OP_DONE, timeout_s=15)
    assert newest().closes_version == offsets[4]
    assert read_topic(settings.bootstrap_servers, target, timeout_s=3, idle_s=1) == []


# -- a frozen master -------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_master_frozen_past_its_session_and_resumed_returns_to_standby(cluster, settings, names):
    target = names.topic("target")
    create_topics(settings.bootstrap_servers, [target], partitions=3)
    nodes = {node_id: cluster.start(node_id) for node_id in ("node-a", "node-b")}
    feeder = Feeder(settings)
    # Messages fall due all the time, so the master is mid-transaction when it freezes.
    ids = {feeder.put(target, f"m{i}".encode(), now_ms() + 1000 + i * 10) for i in range(3000)}
    feeder.flush()
    session_s = settings.zk_session_timeout_ms / 1000
    for _cycle in range(3):
        frozen = cluster.master()
        frozen.signal(signal.SIGSTOP)
        taker = cluster.master(timeout_s=20, other_than=frozen)
        time.sleep(session_s / 2)
        frozen.signal(signal.SIGCONT)
        # Resumed, it learns its session is gone, steps down, and stays up as a ready standby.
        assert wait_until(lambda f=frozen: f.metric("delayq_is_master") == 0, timeout_s=30), frozen.log_tail()
        assert wait_until(lambda f=frozen: f.get("/readyz")[0] == 200, timeout_s=30), frozen.log_tail()
        assert frozen.process.poll() is None, f"the resumed master's node exited:\n{frozen.log_tail()}"
        assert taker.metric("delayq_is_master") == 1
    assert all(n.process.poll() is None for n in nodes.values())
    counts = delivered_ids(read_topic(settings.bootstrap_servers, target, expect=3000, timeout_s=90, idle_s=3))
    assert set(counts) == ids and max(counts.values()) == 1


# -- the cancel guarantee --------------------------------------------------------------


@pytest.mark.slow
def test_cancels_acknowledged_shortly_before_the_due_time_always_win(cluster, settings, names):
    """Puts due soon, each cancelled 1 to 40 ms before its due time; none may be delivered."""
    target = names.topic("target")
    create_topics(settings.bootstrap_servers, [target])
    cluster.start("node-a")
    cluster.start("node-b")
    producer = Producer({"bootstrap.servers": settings.bootstrap_servers, "delayq.cluster": settings.cluster,
                         "linger.ms": 0})
    keep: set[str] = set()
    cancelled: list[tuple[str, int, int]] = []  # (id, due ms, acknowledged ms)
    start = now_ms() + 1500
    for i in range(150):
        due = start + i * 20
        delay_id = producer.produce(target, f"m{i}".encode(), deliver_at=due)
        if i % 3 == 0:
            keep.add(delay_id)
        else:
            cancelled.append((delay_id, due, 0))
    producer.flush(10)
    for index, (delay_id, due, _) in enumerate(cancelled):
        lead_ms = 1 + index % 40
        while now_ms() < due - lead_ms - 2:
            time.sleep(0.0005)
        acked: list[int] = []
        producer.cancel(delay_id, on_delivery=lambda err, msg, acked=acked: acked.append(now_ms()))
        producer.flush(5)
        cancelled[index] = (delay_id, due, acked[0] if acked else 2**62)
    records = read_topic(settings.bootstrap_servers, target, expect=len(keep), timeout_s=30, idle_s=3)
    counts = delivered_ids(records)
    should_have_won = {d for d, due, acked in cancelled if acked < due}
    assert len(should_have_won) > 50, "too few cancels were acknowledged in time to test anything"
    assert not should_have_won & set(counts), f"{len(should_have_won & set(counts))} cancels acknowledged in time lost"
    assert keep <= set(counts) and max(counts.values()) == 1
