"""Synthetic delayq traffic written straight to Kafka, for the job's tests, benchmark and demos.

It writes what the proxy and a master write (the envelope of ``delayq.proxy``), with
record timestamps chosen by the caller, so any history can be staged: a clean run,
a duplicate, a loss, an early delivery, a cancel that was ignored.
"""

from __future__ import annotations

import random
from collections.abc import Iterable

from delayq.proxy import Envelope, new_delay_id
from delayq.proxy import envelope as env


class TrafficWriter:
    """Writes buffer records and deliveries with explicit timestamps.

    Args:
        bootstrap_servers: the Kafka to write to.
        buffer_topic: the buffer topic of the staged cluster.
        conf: extra librdkafka settings (the defaults batch hard and compress with lz4).

    Example:
        >>> with TrafficWriter("127.0.0.1:9092", "buffer") as writer:    # doctest: +SKIP
        ...     message = writer.delivered(topic="orders", due_ms=due, delivered_ms=due + 12)
    """

    def __init__(self, bootstrap_servers: str, buffer_topic: str, *, conf: dict | None = None):
        from confluent_kafka import Producer

        self.buffer_topic = buffer_topic
        self._errors: list[str] = []
        self._producer = Producer({
            "bootstrap.servers": bootstrap_servers,
            "linger.ms": 50,
            "batch.size": 1_000_000,
            "compression.type": "lz4",
            "queue.buffering.max.messages": 500_000,
            "delivery.report.only.error": True,
            "on_delivery": self._on_delivery,
            **(conf or {}),
        })

    def __enter__(self) -> TrafficWriter:
        return self

    def __exit__(self, *exc_info) -> None:
        if exc_info[0] is None:
            self.flush()

    def _on_delivery(self, err, message) -> None:
        if err is not None:
            self._errors.append(f"{message.topic()}: {err}")

    def _produce(self, topic: str, *, key: bytes | None, value: bytes | None,
                 headers: list[tuple[str, bytes]], at_ms: int) -> None:
        while True:
            try:
                self._producer.produce(topic, key=key, value=value, headers=headers, timestamp=at_ms)
                return
            except BufferError:  # the local queue is full: let librdkafka send some, then retry
                self._producer.poll(0.05)

    def put(self, message: Envelope, at_ms: int) -> None:
        """The proxy's ``put`` of ``message``, written at ``at_ms``."""
        self._produce(self.buffer_topic, key=message.delay_id.encode(), value=message.buffer_value(),
                      headers=message.buffer_headers(), at_ms=at_ms)

    def cancel(self, delay_id: str, at_ms: int) -> None:
        """A ``cancel`` tombstone for ``delay_id``, written at ``at_ms``."""
        self._control(env.OP_CANCEL, delay_id, at_ms)

    def done(self, delay_id: str, at_ms: int) -> None:
        """The master's ``done`` tombstone for ``delay_id``, written at ``at_ms``."""
        self._control(env.OP_DONE, delay_id, at_ms)

    def _control(self, op: bytes, delay_id: str, at_ms: int) -> None:
        self._produce(self.buffer_topic, key=delay_id.encode(), value=None,
                      headers=env.control_headers(op, delay_id), at_ms=at_ms)

    def deliver(self, message: Envelope, at_ms: int, *, epoch: int = 1) -> None:
        """One delivery of ``message`` to its topic, stamped ``at_ms``, as the master of ``epoch`` writes it."""
        self._produce(message.topic, key=message.key, value=message.value,
                      headers=message.delivery_headers(epoch), at_ms=at_ms)

    def delivered(self, *, topic: str, due_ms: int, delivered_ms: int, created_ms: int | None = None,
                  epoch: int = 1, value: bytes = b"payload") -> Envelope:
        """A whole healthy life: put at ``created_ms``, delivered and done at ``delivered_ms``."""
        message = new_message(topic, due_ms, created_ms=created_ms, value=value)
        self.put(message, message.created_at_ms)
        self.deliver(message, delivered_ms, epoch=epoch)
        self.done(message.delay_id, delivered_ms)
        return message

    def flush(self, timeout_s: float = 120.0) -> None:
        """Wait until everything written is acknowledged.

        Raises:
            RuntimeError: a record was refused, or some were still unsent after ``timeout_s``.
        """
        left = self._producer.flush(timeout_s)
        if self._errors:
            raise RuntimeError(f"{len(self._errors)} record(s) were refused, e.g. {self._errors[0]}")
        if left:
            raise RuntimeError(f"{left} record(s) still unsent after {timeout_s} s")


def new_message(topic: str, due_ms: int, *, created_ms: int | None = None, value: bytes = b"payload",
                key: bytes | None = None) -> Envelope:
    """An envelope for ``topic`` due at ``due_ms``, created an hour before unless told."""
    created = due_ms - 3_600_000 if created_ms is None else created_ms
    return Envelope(delay_id=new_delay_id(created), topic=topic, deliver_at_ms=due_ms, value=value, key=key,
                    created_at_ms=created)


def healthy_traffic(writer: TrafficWriter, count: int, topics: Iterable[str], since_ms: int, until_ms: int, *,
                    max_lateness_ms: int = 200, seed: int = 7) -> int:
    """Write ``count`` delayed messages due evenly in ``[since_ms, until_ms)``, each delivered once, on time.

    Lateness is drawn from 0 to ``max_lateness_ms``, skewed towards small values as a
    healthy master's is. Returns ``count``.

    Raises:
        ValueError: ``count`` is negative, ``topics`` is empty or the window is empty.
    """
    names = list(topics)
    if count < 0:
        raise ValueError(f"count must not be negative, got {count}")
    if not names:
        raise ValueError("topics is empty: name at least one target topic")
    if since_ms >= until_ms:
        raise ValueError(f"since_ms {since_ms} must be before until_ms {until_ms}")
    rng = random.Random(seed)
    span = until_ms - since_ms
    for index in range(count):
        due = since_ms + span * index // max(count, 1)
        lateness = int(max_lateness_ms * rng.random() ** 3)
        writer.delivered(topic=names[index % len(names)], due_ms=due, delivered_ms=due + lateness,
                         created_ms=due - 60_000 - rng.randrange(3_600_000))
    return count
