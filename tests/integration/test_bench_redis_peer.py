"""The Redis sorted-set peer of `delayq bench` on a real redis-server and the real Kafka."""

from __future__ import annotations

import time

import pytest
from rich.progress import Progress
from support.kafka_testing import create_topics, read_topic

from delayq.bench.redis_peer import QUEUE_KEY, Poller, RedisServer, peer_lateness, schedule
from delayq.bench.service_bench import PAYLOAD_SIZE, now_ms

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def redis_server():
    server = RedisServer.start()
    yield server
    server.stop()


def test_peer_delivers_every_message_and_none_early(redis_server, dev_stack):
    with Progress(disable=True) as progress:
        figures = peer_lateness(redis_server, dev_stack, rate=300, seconds=1, progress=progress)

    assert figures["count"] == figures["expected"] == 300
    assert figures["early"] == 0
    assert figures["stored_ahead_ms"] > 0  # the fill was over before anything fell due
    assert 0 <= figures["p50_ms"] <= figures["p99_ms"] <= figures["max_ms"]


def test_poller_moves_due_members_to_their_topic_with_key_and_value_and_removes_them(redis_server, dev_stack, names):
    topic = names.topic("target")
    create_topics(dev_stack.bootstrap_servers, [topic], partitions=3)
    client = redis_server.client()
    client.delete(QUEUE_KEY)
    due = now_ms() - 1
    with Progress(disable=True) as progress:
        schedule(client, topic, 250, lambda i: due if i < 200 else due + 3_600_000, progress)
    poller = Poller(client, dev_stack.bootstrap_servers, batch=64)

    moved = 0
    deadline = time.monotonic() + 20
    while moved < 200 and time.monotonic() < deadline:
        moved += poller.poll_once()
    poller.stop()

    records = read_topic(dev_stack.bootstrap_servers, topic, expect=200)
    assert moved == 200 and poller.poll_once() == 0  # the 50 due in an hour stay
    assert sorted(r.key() for r in records) == sorted(f"k{i}".encode() for i in range(200))
    assert {len(r.value()) for r in records} == {PAYLOAD_SIZE} and len({r.value() for r in records}) == 200
    assert all(int(dict(r.headers())["due-ms"]) == due for r in records)
    assert client.zcard(QUEUE_KEY) == 50


def test_stopped_server_leaves_nothing_running_or_on_disk():
    server = RedisServer.start()
    assert server.client().ping()

    server.stop()

    assert server.process.poll() is not None
    assert not server.folder.exists()
