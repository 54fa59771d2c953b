"""The buffer reader process of a node (delay_service/reader.py), killed and replaced, on the real stack.

A node consumes and parses the buffer in a child process. Killing that child must cost
nothing: the node starts another from its store's offsets, every message is delivered
once, none early; and a node that dies takes its reader with it.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
from support.kafka_testing import create_topics, read_topic
from support.service_testing import Feeder, now_ms

from delayq import wire
from delayq.testing import reader_processes

pytestmark = pytest.mark.integration


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_for(condition, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def test_a_reader_killed_mid_stream_is_replaced_and_every_message_is_delivered_once(cluster, settings, names):
    target = names.topic("target")
    create_topics(settings.bootstrap_servers, [target])
    node = cluster.start("node-a")
    first = wait_for(lambda: node.readers(), 10, "the node's reader")[0]
    feeder = Feeder(settings)
    due = now_ms() + 6000
    sent = []
    for i in range(4000):
        sent.append(feeder.put(target, f"v{i}".encode(), due + i % 200, key=f"k{i}".encode()))
        if i == 2000:
            feeder.flush()
            os.kill(first, signal.SIGKILL)  # while the node is storing what came before
    feeder.flush()
    second = wait_for(lambda: [p for p in node.readers() if p != first], 10, "a new reader")[0]
    assert not alive(first)

    records = read_topic(settings.bootstrap_servers, target, expect=len(sent), timeout_s=60)
    delivered = [dict(r.headers())[wire.ID].decode() for r in records]
    assert sorted(delivered) == sorted(sent), (f"{len(set(sent) - set(delivered))} missing, "
                                               f"{len(delivered) - len(set(delivered))} delivered twice")
    early = [r for r in records if r.timestamp()[1] < int(dict(r.headers())[wire.DELIVER_AT])]
    assert not early
    assert node.running.poll() is None, "the node exited"
    assert "starting another from the store's offsets" in node.log_tail(400)
    assert node.metric("delayq_pending") == 0
    assert node.readers() == [second]


def test_a_node_killed_takes_its_reader_with_it_and_a_stopped_one_stops_it(cluster):
    killed = cluster.start("node-a")
    reader = wait_for(lambda: killed.readers(), 10, "the node's reader")[0]
    killed.kill()
    wait_for(lambda: not alive(reader), 5, f"reader {reader} to exit after its node's SIGKILL")

    stopped = cluster.start("node-b")
    reader = wait_for(lambda: stopped.readers(), 10, "the node's reader")[0]
    assert stopped.stop() == 0
    assert not alive(reader), "the reader outlived its node's clean stop"


def test_a_reader_that_cannot_start_says_why_in_one_line_and_leaves_no_process(settings):
    """A consumer setting librdkafka refuses: starting the reader fails at once with the reason, no restart loop."""
    from confluent_kafka import OFFSET_BEGINNING

    from delayq.delay_service.reader import BufferReader, ReaderConfig, ReaderGone

    config = ReaderConfig(consumer={"bootstrap.servers": settings.bootstrap_servers, "group.id": "refused",
                                    "partition.assignment.strategy": "bogus"},
                          topic=settings.buffer_topic, partitions=[0], partition_count=1, shards=1,
                          start={0: OFFSET_BEGINNING}, compaction_lag_ms=0, batch_size=10,
                          poll_s=0.002, idle_poll_s=0.064, log_level="WARNING", log_format="%(message)s", gc_tuned=True)
    started = time.monotonic()
    with pytest.raises(ReaderGone, match=r"^the buffer reader could not start: .*partition\.assignment\.strategy"):
        BufferReader(config)
    assert time.monotonic() - started < 30
    assert not reader_processes(os.getpid()), "reader processes left behind"


def test_a_reader_has_a_session_of_its_own_so_a_signal_to_the_nodes_group_reaches_the_node_only(cluster):
    node = cluster.start("node-a")
    reader = wait_for(node.readers, 10, "the node's reader")[0]
    # Not in the node's process group: a group signal (Ctrl-C, a supervisor stopping the group) misses it.
    assert os.getsid(reader) == reader == os.getpgid(reader) != os.getpgid(node.running.pid)
    assert node.stop() == 0
    wait_for(lambda: not alive(reader), 10, "the reader to be stopped by its node")
    assert "starting another" not in node.log_tail(400), "the node replaced a reader while stopping"


def test_a_reader_that_cannot_be_replaced_is_tried_again_and_ingest_goes_on(settings, tmp_path, monkeypatch):
    from delayq.delay_service import ensure_topics
    from delayq.delay_service.ingest import Ingest
    from delayq.delay_service.metrics import NodeMetrics
    from delayq.delay_service.reader import ReaderGone
    from delayq.delay_service.topics import EndOffsets, admin_client, buffer_info
    from delayq.store import TimeIndex

    ensure_topics(settings)
    admin = admin_client(settings)
    info = buffer_info(settings, admin)
    attempts = []
    start = Ingest._start_reader

    def fails_the_first_time(self):
        attempts.append(time.monotonic())
        if len(attempts) == 1:
            raise ReaderGone("the buffer reader could not start: refused for this test")
        return start(self)

    with TimeIndex(tmp_path / "store") as store:
        metrics = NodeMetrics()
        ingest = Ingest(settings, 1, metrics, EndOffsets(settings, info.partitions, admin))
        ingest.hold([ingest.feed(0, store, metrics.shard(0))])  # one shard: the whole buffer
        try:
            first = ingest.reader_pid
            assert first is not None, "holding a shard starts a reader"
            monkeypatch.setattr(Ingest, "_start_reader", fails_the_first_time)
            os.kill(first, signal.SIGKILL)
            feeder = Feeder(settings)
            for i in range(10):
                feeder.put("somewhere", f"v{i}".encode(), now_ms() + 3_600_000)
            feeder.flush()
            deadline = time.monotonic() + 30
            while store.pending_count() < 10 and time.monotonic() < deadline:
                ingest.poll_once(0.1)  # never raises: a reader that cannot start is tried again
            assert store.pending_count() == 10
            assert len(attempts) == 2, attempts
            second = ingest.reader_pid
        finally:
            ingest.close()
    assert not alive(second), "close() left the reader running"


@pytest.mark.settings(buffer_partitions=4)
def test_taking_and_dropping_shards_keeps_the_reader_and_reads_each_shard_once_into_its_own_store(settings, tmp_path):
    """A shard taken or dropped is told to the reader in use: no new process, and a dropped shard's store is left be."""
    from delayq.delay_service import ensure_topics
    from delayq.delay_service.ingest import Ingest
    from delayq.delay_service.metrics import NodeMetrics
    from delayq.delay_service.topics import EndOffsets, admin_client, buffer_info
    from delayq.store import TimeIndex

    ensure_topics(settings)
    admin = admin_client(settings)
    info = buffer_info(settings, admin)
    feeder = Feeder(settings)
    by_shard: dict[int, set[str]] = {0: set(), 1: set()}

    def put(count: int) -> None:
        for i in range(count):
            delay_id = feeder.put("somewhere", f"v{i}".encode(), now_ms() + 3_600_000)
            by_shard[wire.shard_of(wire.buffer_partition(delay_id, 4), 2)].add(delay_id)
        feeder.flush()

    def read_until(store: TimeIndex, ids: set[str], what: str) -> None:
        deadline = time.monotonic() + 30
        while store.pending_count() < len(ids) and time.monotonic() < deadline:
            ingest.poll_once(0.1)
        assert store.pending_count() == len(ids), what

    with TimeIndex(tmp_path / "zero") as zero, TimeIndex(tmp_path / "one") as one:
        metrics = NodeMetrics()
        ingest = Ingest(settings, 2, metrics, EndOffsets(settings, info.partitions, admin))
        try:
            put(200)
            ingest.hold([ingest.feed(0, zero, metrics.shard(0))])
            reader = ingest.reader_pid
            read_until(zero, by_shard[0], "shard 0 read")
            assert one.pending_count() == 0 and sorted(zero.offsets()) == [0, 2]

            ingest.hold([ingest.feed(0, zero, metrics.shard(0)), ingest.feed(1, one, metrics.shard(1))])
            read_until(one, by_shard[1], "shard 1, taken, read from the start")
            assert sorted(one.offsets()) == [1, 3]
            put(200)
            read_until(zero, by_shard[0], "shard 0, kept, read on")
            read_until(one, by_shard[1], "shard 1 read on")

            ingest.hold([ingest.feed(1, one, metrics.shard(1))])
            zero_offsets = zero.offsets()
            zero_pending = zero.pending_count()
            put(200)
            read_until(one, by_shard[1], "shard 1 read on after shard 0 was dropped")
            for _ in range(10):
                ingest.poll_once(0.05)
            assert (zero.pending_count(), zero.offsets()) == (zero_pending, zero_offsets), "a dropped shard was written"
            assert ingest.reader_pid == reader, "a shard taken or dropped replaced the reader process"
            assert ingest.positions() == {p: end for p, end in one.offsets().items()}
        finally:
            ingest.close()
    assert not alive(reader), "close() left the reader running"


def test_a_reader_that_stands_still_while_the_buffer_has_records_is_replaced_and_ingest_reads_on(settings, tmp_path):
    """A reader frozen (SIGSTOP: what a consumer that stopped fetching looks like to the node) is taken for stuck
    READER_STUCK_S later and replaced; every put the producer had acked is then in the store."""
    from delayq.delay_service import ensure_topics
    from delayq.delay_service.ingest import READER_STUCK_S, Ingest
    from delayq.delay_service.metrics import NodeMetrics
    from delayq.delay_service.topics import EndOffsets, admin_client, buffer_info
    from delayq.store import TimeIndex

    ensure_topics(settings)
    admin = admin_client(settings)
    feeder = Feeder(settings)
    with TimeIndex(tmp_path / "store") as store:
        metrics = NodeMetrics()
        ingest = Ingest(settings, 1, metrics, EndOffsets(settings, buffer_info(settings, admin).partitions, admin))
        stop = threading.Event()
        loop = threading.Thread(target=ingest.run, args=(stop,), daemon=True)
        try:
            ingest.hold([ingest.feed(0, store, metrics.shard(0))])
            loop.start()
            frozen = ingest.reader_pid
            assert frozen is not None
            os.kill(frozen, signal.SIGSTOP)
            frozen_at = time.monotonic()
            for i in range(300):
                feeder.put("somewhere", f"v{i}".encode(), now_ms() + 3_600_000)
            feeder.flush()
            wait_for(lambda: store.pending_count() == 300, READER_STUCK_S + 15, "the 300 puts stored")
            took_s = time.monotonic() - frozen_at
            assert ingest.reader_pid not in (None, frozen)
            assert READER_STUCK_S <= took_s < READER_STUCK_S + 15, took_s
        finally:
            stop.set()
            loop.join(30)
            ingest.close()
    assert not alive(frozen), "the stuck reader was left running"
