"""Small helpers tests share for talking to the real broker."""

from __future__ import annotations

import time
from collections.abc import Iterable

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic


def create_topics(bootstrap: str, topics: Iterable[str], partitions: int = 1, config: dict | None = None,
                  replication_factor: int = 1) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(t, partitions, replication_factor, config=config or {}) for t in topics])
    for future in futures.values():
        future.result(30)


def read_topic(
    bootstrap: str,
    topic: str,
    *,
    expect: int | None = None,
    timeout_s: float = 20.0,
    isolation: str = "read_committed",
    idle_s: float = 1.0,
    conf: dict | None = None,
) -> list[Message]:
    """Read ``topic`` from the beginning: until ``expect`` records came, or until it stays idle for ``idle_s``.

    ``conf``: more consumer settings (a secured cluster's, a group id the reader's ACLs allow).
    """
    consumer = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": f"reader-{topic}-{time.monotonic_ns()}",
        **(conf or {}),
        "enable.auto.commit": False,
        "isolation.level": isolation,
        "auto.offset.reset": "earliest",
    })
    metadata = consumer.list_topics(topic, timeout=10).topics[topic]
    consumer.assign([TopicPartition(topic, p, 0) for p in metadata.partitions])
    records: list[Message] = []
    deadline = time.monotonic() + timeout_s
    last_seen = time.monotonic()
    try:
        while time.monotonic() < deadline:
            if expect is not None and len(records) >= expect:
                # Keep reading briefly: a duplicate would arrive right behind.
                if time.monotonic() - last_seen > idle_s:
                    break
            elif expect is None and records and time.monotonic() - last_seen > idle_s:
                break
            for message in consumer.consume(500, 0.2):
                if message.error() is None:
                    records.append(message)
                    last_seen = time.monotonic()
    finally:
        consumer.close()
    return records


_NO_LEADER_YET = frozenset({KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
                            KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_PARTITION})


def end_offsets(bootstrap: str, topic: str, timeout_s: float = 15.0) -> dict[int, int]:
    """Each partition's end offset; waits out a topic so new that its partitions have no leader yet."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "end-offsets"})
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            try:
                metadata = consumer.list_topics(topic, timeout=10).topics[topic]
                return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                        for p in metadata.partitions}
            except KafkaException as err:
                if err.args[0].code() not in _NO_LEADER_YET or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    finally:
        consumer.close()
