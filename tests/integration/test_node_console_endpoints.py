"""What a node answers the console about its shards (/v1/shards/<shard>/pending, /upcoming, /now), on the dev stack.

A 2-shard cluster: messages with known due times go through the buffer; the node's port answers
each shard's pending histogram, its next messages in due order (paged, filtered by topic) and
what its master delivered in the last minute, from the node's stores and counters. Then the same
through a node of two member processes (each holds one shard), on the node's own port.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest
from support.kafka_testing import create_topics, read_topic
from support.process_testing import wait_until
from support.service_testing import Feeder, now_ms

from delayq import Settings, wire
from delayq.clock import HOUR_MS, MINUTE_MS
from delayq.delay_service import ensure_shards, ensure_topics
from delayq.delay_service.console.records import (
    Bucket,
    PendingHistogram,
    histogram_from_json,
    now_from_json,
    upcoming_from_json,
)
from delayq.testing import NodeProcess, free_ports

pytestmark = pytest.mark.integration

SHARDS = 2
PARTITIONS = 4
DAYS = 3
# Due later than the test lasts, spread over every part of the histogram: this hour by minute, days by hour, later.
LATER_MS = (7 * MINUTE_MS, 33 * MINUTE_MS + 5, 59 * MINUTE_MS, 2 * HOUR_MS, 25 * HOUR_MS, 71 * HOUR_MS, 4 * 24 * HOUR_MS,
            40 * 24 * HOUR_MS)
PENDING_EACH = 60  # messages per offset above
SOON = 40  # messages due in seconds: delivered during the test


def shard_of(delay_id: str) -> int:
    return wire.shard_of(wire.buffer_partition(delay_id, PARTITIONS), SHARDS)


def feed(settings: Settings, targets: tuple[str, str]) -> tuple[dict[str, tuple[int, str]], dict[str, int]]:
    """Puts of pending messages (id -> (due, topic)) and of messages due in 2 s (id -> due), through the buffer."""
    rng = random.Random(4)
    feeder = Feeder(settings)
    start = now_ms()
    pending: dict[str, tuple[int, str]] = {}
    for offset in LATER_MS:
        for i in range(PENDING_EACH):
            due = start + offset + rng.randrange(60_000)
            topic = targets[i % 5 == 0]  # a fifth to the second topic
            pending[feeder.put(topic, b"p", due, key=f"k{i}".encode())] = (due, topic)
    soon = {}
    for i in range(SOON):
        due = start + 2_000 + i * 10
        soon[feeder.put(targets[0], b"s", due)] = due
    feeder.flush()
    return pending, soon


def expected_histogram(histogram: PendingHistogram, dues: list[int]) -> PendingHistogram:
    """What the histogram taken at its ``now_ms`` must say of messages due at ``dues``."""

    def counted(buckets: tuple[Bucket, ...]) -> tuple[Bucket, ...]:
        return tuple(Bucket(b.start_ms, b.width_ms, sum(b.start_ms <= d < b.start_ms + b.width_ms for d in dues))
                     for b in buckets)

    start = histogram.minutes[0].start_ms
    end = histogram.hours[-1].start_ms + HOUR_MS
    return PendingHistogram(shard=histogram.shard, now_ms=histogram.now_ms, count=len(dues),
                            overdue=sum(d < start for d in dues), minutes=counted(histogram.minutes),
                            hours=counted(histogram.hours), later=sum(d >= end for d in dues))


def check_shards(node: NodeProcess, pending: dict[str, tuple[int, str]], soon: dict[str, int],
                 targets: tuple[str, str]) -> None:
    """Every shard's answers on ``node``'s port, once the soon messages are delivered."""
    by_shard = {shard: {i: v for i, v in pending.items() if shard_of(i) == shard} for shard in range(SHARDS)}

    def histogram(shard: int) -> PendingHistogram | None:
        status, body = node.get_json(f"/v1/shards/{shard}/pending?days={DAYS}")
        return histogram_from_json(body) if status == 200 else None

    for shard, mine in by_shard.items():
        assert wait_until(lambda: (h := histogram(shard)) is not None and h.count == len(mine), timeout_s=60,  # noqa: B023
                          interval_s=0.2), f"shard {shard}: {node.get(f'/v1/shards/{shard}/pending')}"
        found = histogram(shard)
        assert found is not None and found.count == len(mine)
        assert found == expected_histogram(found, [due for due, _ in mine.values()])
        assert found.overdue == 0 and found.later > 0 and sum(b.count for b in found.minutes) > 0

        # The next messages due, in due order, a page at a time from each page's cursor.
        expected = sorted((due, delay_id) for delay_id, (due, _) in mine.items())
        seen, after = [], ""
        while True:
            status, body = node.get_json(f"/v1/shards/{shard}/upcoming?limit=37{after}")
            assert status == 200, body
            page = upcoming_from_json(body)
            seen += page.items
            if page.next is None:
                break
            after = f"&after={page.next}"
        assert [(item.due_ms, item.id) for item in seen] == expected
        assert all(item.topic == mine[item.id][1] and item.partition % SHARDS == shard for item in seen)
        # By topic: only the second topic's, in order.
        status, body = node.get_json(f"/v1/shards/{shard}/upcoming?limit=500&topic={targets[1]}")
        assert status == 200 and [item.id for item in upcoming_from_json(body).items] == [
            delay_id for _, delay_id in expected if mine[delay_id][1] == targets[1]]

        # What its master delivered in the last minute: the soon messages of this shard.
        status, body = node.get_json(f"/v1/shards/{shard}/now")
        shard_now = now_from_json(body)
        delivered = sum(shard_of(i) == shard for i in soon)
        assert status == 200 and shard_now.master and shard_now.pending == len(mine)
        assert shard_now.delivered == delivered, shard_now
        assert shard_now.lateness_p50_ms is not None and 0 <= shard_now.lateness_p50_ms <= shard_now.lateness_p99_ms

    status, body = node.get_json(f"/v1/shards/{SHARDS}/now")
    assert status == 400 and f"it has shards 0 to {SHARDS - 1}" in body["error"]


def delivered(settings: Settings, target: str, soon: dict[str, int]) -> None:
    records = read_topic(settings.bootstrap_servers, target, expect=len(soon), timeout_s=60, idle_s=2)
    assert Counter(dict(r.headers())[wire.ID].decode() for r in records) == Counter(soon.keys())


def test_a_node_answers_its_shards_pending_upcoming_and_now_from_its_stores(settings, names, tmp_path):
    settings = settings.model_copy(update={"shards": SHARDS, "buffer_partitions": PARTITIONS})
    targets = (names.topic("orders"), names.topic("billing"))
    create_topics(settings.bootstrap_servers, list(targets), partitions=2)
    ensure_topics(settings)
    ensure_shards(settings)
    node = NodeProcess(settings, "node-a", tmp_path / "node-a").start()
    try:
        node.wait_ready(90)
        pending, soon = feed(settings, targets)
        delivered(settings, targets[0], soon)
        check_shards(node, pending, soon, targets)
    finally:
        code = node.stop()
    assert code == 0, node.log_tail()


def test_a_node_of_member_processes_answers_for_the_member_holding_each_shard(settings, names, tmp_path):
    settings = settings.model_copy(update={"shards": SHARDS, "buffer_partitions": PARTITIONS, "processes": 2})
    targets = (names.topic("orders"), names.topic("billing"))
    create_topics(settings.bootstrap_servers, list(targets), partitions=2)
    ensure_topics(settings)
    ensure_shards(settings)
    port = free_ports(3)  # the node's, then its members'
    # With the console: its first member runs it, the node's port passes /console to it.
    node = NodeProcess(settings, "box", tmp_path / "box", http_port=port, console=True).start()
    try:
        node.wait_ready(90)
        members = [NodeProcess(settings, f"box-{i}", tmp_path / "box", http_port=port + 1 + i) for i in range(2)]
        assert wait_until(lambda: sorted(m.get("/v1/shards/0/now")[0] for m in members) == [200, 421], timeout_s=60,
                          interval_s=0.2), "each member holds one shard"
        pending, soon = feed(settings, targets)
        delivered(settings, targets[0], soon)
        check_shards(node, pending, soon, targets)
        # The console's overview on the node's port, from the first member, which asks the shards' holders.
        status, page = node.get("/console/")
        assert status == 200 and b'id="shards"' in page, page[:2000]
        assert members[0].get("/console/")[0] == 200 and members[1].get("/console/")[0] == 404
    finally:
        code = node.stop()
    assert code == 0, node.log_tail()
