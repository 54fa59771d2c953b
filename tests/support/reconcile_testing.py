"""Cluster histories planted on the real Kafka for the reconciliation's tests (local[2] and on a Spark cluster).

Written straight to Kafka with the envelope, the way the proxy and a master write them
(delayq.spark.synthetic's TrafficWriter): buffer puts, cancels and dones, deliveries with their
headers and explicit timestamps, and a fenced master's aborted transaction.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Producer

from delayq import Settings
from delayq.spark import ReconcileOptions
from delayq.spark.synthetic import TrafficWriter, healthy_traffic, new_message

from .kafka_testing import create_topics

MINUTE = 60_000
# Healthy messages of the troubled history, beside one of each anomaly.
TROUBLED_HEALTHY = 20


@dataclass
class Staged:
    """A staged cluster history: its settings, window and the ids that matter."""

    settings: Settings
    since: int
    until: int
    targets: list[str]
    ids: dict[str, str]

    def options(self, out: Path, **changes) -> ReconcileOptions:
        return ReconcileOptions(since_ms=self.since, until_ms=self.until, out=out, **changes)

    def env(self) -> dict[str, str]:
        """The DELAYQ_* variables that make ``delayq reconcile`` (or the job under spark-submit) read this history."""
        return {"DELAYQ_BOOTSTRAP_SERVERS": self.settings.bootstrap_servers,
                "DELAYQ_BUFFER_TOPIC": self.settings.buffer_topic,
                "DELAYQ_DEAD_LETTER_TOPIC": self.settings.dead_letter_topic}


def stage_topics(dev_stack, prefix: str, targets: int = 2) -> tuple[Settings, list[str], int, int]:
    """Fresh buffer and target topics (names unique like the ``names`` fixture's), and a window ending now."""
    settings = Settings(bootstrap_servers=dev_stack.bootstrap_servers, buffer_topic=f"{prefix}-buffer",
                        dead_letter_topic=f"{prefix}-dead-letter")
    topics = [f"{prefix}-target-{i}" for i in range(targets)]
    create_topics(dev_stack.bootstrap_servers, [settings.buffer_topic, *topics], partitions=3)
    now = int(time.time() * 1000)
    return settings, topics, now - 3 * 60 * MINUTE, now - 10 * MINUTE


def plant_troubled(dev_stack) -> Staged:
    """Healthy traffic plus one of each anomaly, a message cancelled in time, and a duplicate that only an aborted
    transaction holds."""
    settings, (c, d), since, until = stage_topics(dev_stack, f"t-reconcile-troubled-{uuid.uuid4().hex[:8]}")
    ids = {}
    with TrafficWriter(settings.bootstrap_servers, settings.buffer_topic) as writer:
        healthy_traffic(writer, TROUBLED_HEALTHY, [c, d], since, until - 30 * MINUTE, seed=11)
        duplicate, version = writer.delivered(topic=c, due_ms=since + 10 * MINUTE,
                                              delivered_ms=since + 10 * MINUTE + 5)
        writer.deliver(duplicate, since + 10 * MINUTE + 700, epoch=2, version=version)
        ids["duplicate"] = duplicate.delay_id
        lost = new_message(d, since + 20 * MINUTE)
        writer.put(lost, lost.created_at_ms)
        ids["missing"] = lost.delay_id
        early, _ = writer.delivered(topic=c, due_ms=since + 30 * MINUTE, delivered_ms=since + 30 * MINUTE - 2000)
        ids["early"] = early.delay_id
        # Cancelled in time and never delivered: no anomaly, counted as cancelled.
        cancelled = new_message(c, since + 35 * MINUTE)
        writer.put(cancelled, cancelled.created_at_ms)
        writer.cancel(cancelled.delay_id, since + 25 * MINUTE)
        ids["cancelled"] = cancelled.delay_id
        # A cancel the master had read (below its done's cutoff), delivered anyway.
        ignored = new_message(d, since + 40 * MINUTE)
        put = writer.put(ignored, ignored.created_at_ms, wait=True)
        cancel = writer.cancel(ignored.delay_id, since + 35 * MINUTE, wait=True)
        writer.deliver(ignored, ignored.deliver_at_ms + 9, version=put)
        writer.done(ignored.delay_id, ignored.deliver_at_ms + 9, version=put, cutoff=cancel + 1)
        ids["cancel_ignored"] = ignored.delay_id
        # A delivery of an id the buffer never held.
        stranger = new_message(c, since + 50 * MINUTE)
        writer.deliver(stranger, stranger.deliver_at_ms + 3, version=0)
        ids["unknown"] = stranger.delay_id
        fenced, fenced_version = writer.delivered(topic=d, due_ms=since + 60 * MINUTE,
                                                  delivered_ms=since + 60 * MINUTE + 4)
        ids["aborted_duplicate"] = fenced.delay_id
    # A fenced master's second copy, in a transaction that was aborted.
    producer = Producer({"bootstrap.servers": settings.bootstrap_servers,
                         "transactional.id": f"{settings.buffer_topic}-tx"})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(d, key=fenced.key, value=fenced.value, headers=fenced.delivery_headers(3, fenced_version),
                     timestamp=since + 60 * MINUTE + 600)
    producer.flush(30)
    producer.abort_transaction(30)
    return Staged(settings, since, until, [c, d], ids)
