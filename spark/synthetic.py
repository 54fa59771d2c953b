"""Synthetic delayq traffic written straight to Kafka, for the job's tests, benchmark and demos.

It writes what the proxy and a master write (the envelope of ``delayq.proxy``), with
record timestamps chosen by the caller, so any history can be staged: a clean run,
a duplicate, a loss, an early delivery, a cancel that was ignored. A delivery and a
``done`` name the put they deliver and close by its buffer offset, as a master's do, so
the writer waits for the offsets of the puts that are delivered.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Self

from delayq import wire
from delayq.wire import Envelope, new_delay_id

if TYPE_CHECKING:
    from confluent_kafka import Producer

# How many puts healthy_traffic writes before it waits for their offsets.
_BATCH = 100_000


class TrafficWriter:
    """Writes buffer records and deliveries with explicit timestamps.

    Args:
        bootstrap_servers: the Kafka to write to.
        buffer_topic: the buffer topic of the staged cluster.
        conf: extra librdkafka settings (the defaults batch hard and compress with lz4).

    Example:
        >>> with TrafficWriter("127.0.0.1:9092", "buffer") as writer:    # doctest: +SKIP
        ...     message, version = writer.delivered(topic="orders", due_ms=due, delivered_ms=due + 12)
    """

    def __init__(self, bootstrap_servers: str, buffer_topic: str, *, conf: dict | None = None):
        from confluent_kafka import Producer

        self.buffer_topic = buffer_topic
        self._bootstrap_servers = bootstrap_servers
        self._conf = dict(conf or {})
        self._acked: Producer | None = None
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

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info) -> None:
        if exc_info[0] is None:
            self.flush()

    def _on_delivery(self, err, message) -> None:
        if err is not None:
            self._errors.append(f"{message.topic()}: {err}")

    def _produce(self, topic: str, *, key: bytes | None, value: bytes | None,
                 headers: wire.ProduceHeaders, at_ms: int, wait: bool = False) -> int | None:
        """Write one record; with ``wait``, wait for it and return its offset (else None)."""
        if wait:
            return self._produce_acked(topic, key=key, value=value, headers=headers, at_ms=at_ms)
        while True:
            try:
                self._producer.produce(topic, key=key, value=value, headers=headers, timestamp=at_ms)
                return None
            except BufferError:  # the local queue is full: let librdkafka send some, then retry
                self._producer.poll(0.05)

    def _produce_acked(self, topic: str, *, key: bytes | None, value: bytes | None,
                       headers: wire.ProduceHeaders, at_ms: int) -> int:
        """Everything written so far, then this record, acknowledged; its offset.

        The batching producer reports errors only, so a record whose offset is wanted goes
        through a second producer, after the first one's records are out (one id's records
        stay in order).
        """
        from confluent_kafka import KafkaException

        self.flush()
        acked = self._acked_producer()
        written: list = []
        acked.produce(topic, key=key, value=value, headers=headers, timestamp=at_ms,
                      on_delivery=lambda err, message: written.append((err, message)))
        acked.flush(30)
        if not written:
            raise RuntimeError(f"a record to {topic} was still unsent after 30 s")
        err, message = written[0]
        if err is not None:
            raise KafkaException(err)
        return message.offset()

    def _acked_producer(self) -> Producer:
        """The producer whose every delivery is reported (the batching one reports errors only)."""
        from confluent_kafka import Producer

        if self._acked is None:
            self._acked = Producer({"bootstrap.servers": self._bootstrap_servers, **self._conf})
        return self._acked

    def put_all(self, messages: Sequence[Envelope]) -> list[int]:
        """The proxy's puts of ``messages``, each written at its creation time; their buffer offsets, in order.

        Everything written before goes first; the puts are sent in batches and then waited for,
        so this is the way to many puts whose offsets are wanted.

        Raises:
            RuntimeError: a put was refused, or some were still unsent after 120 s.
        """
        self.flush()
        acked = self._acked_producer()
        offsets: list[int] = [-1] * len(messages)
        errors: list[str] = []

        def report(index: int, err, message) -> None:
            if err is not None:
                errors.append(str(err))
            else:
                offsets[index] = message.offset()

        for index, message in enumerate(messages):
            while True:
                try:
                    acked.produce(self.buffer_topic, key=message.delay_id.encode(), value=message.buffer_value(),
                                  headers=message.buffer_headers(), timestamp=message.created_at_ms,
                                  on_delivery=partial(report, index))
                    break
                except BufferError:  # the local queue is full: let librdkafka send some, then retry
                    acked.poll(0.05)
        left = acked.flush(120)
        if errors or left or -1 in offsets:
            raise RuntimeError(f"{len(errors)} put(s) refused ({errors[:1]}), {left} still unsent after 120 s")
        return offsets

    def put(self, message: Envelope, at_ms: int, *, wait: bool = False, restores: int | None = None) -> int | None:
        """The proxy's ``put`` of ``message``, written at ``at_ms``; with ``wait``, its buffer offset.

        ``restores`` writes a master's copy of the put at that offset instead (frame option ``restores=``).
        """
        return self._produce(self.buffer_topic, key=message.delay_id.encode(),
                             value=message.buffer_value(restores=restores), headers=message.buffer_headers(),
                             at_ms=at_ms, wait=wait)

    def cancel(self, delay_id: str, at_ms: int, *, wait: bool = False) -> int | None:
        """A ``cancel`` tombstone for ``delay_id``, written at ``at_ms``; with ``wait``, its buffer offset."""
        return self._produce(self.buffer_topic, key=delay_id.encode(), value=None,
                             headers=wire.control_headers(wire.OP_CANCEL, delay_id), at_ms=at_ms, wait=wait)

    def done(self, delay_id: str, at_ms: int, *, version: int, cutoff: int, wait: bool = False) -> int | None:
        """The master's ``done`` tombstone for ``delay_id``, written at ``at_ms``; with ``wait``, its buffer offset.

        ``version`` (the offset of the put it closes) and ``cutoff`` (how far the master had
        read the partition) become its ``delayq-version`` and ``delayq-cutoff`` headers.
        """
        return self._produce(self.buffer_topic, key=delay_id.encode(), value=None,
                             headers=wire.done_headers(delay_id, version, cutoff), at_ms=at_ms, wait=wait)

    def deliver(self, message: Envelope, at_ms: int, *, version: int, epoch: int = 1) -> None:
        """One delivery of ``message`` to its topic, stamped ``at_ms``, as the master of ``epoch`` writes it.

        ``version`` is the buffer offset of the put delivered.
        """
        self._produce(message.topic, key=message.key, value=message.value,
                      headers=message.delivery_headers(epoch, version), at_ms=at_ms)

    def delivered(self, *, topic: str, due_ms: int, delivered_ms: int, created_ms: int | None = None,
                  epoch: int = 1, value: bytes = b"payload") -> tuple[Envelope, int]:
        """A whole healthy life: put at ``created_ms``, delivered and done at ``delivered_ms``.

        The delivery and the done name the put's offset, the done's cutoff just past it. It
        waits for that offset: for a few histories (:func:`healthy_traffic` writes many).
        Returns the message and its put's offset (the version delivered).
        """
        message = new_message(topic, due_ms, created_ms=created_ms, value=value)
        [offset] = self.put_all([message])
        self.deliver(message, delivered_ms, epoch=epoch, version=offset)
        self.done(message.delay_id, delivered_ms, version=offset, cutoff=offset + 1)
        return message, offset

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
    healthy master's is. The puts go first, a batch at a time (:meth:`TrafficWriter.put_all`),
    then each one's delivery and done, naming its offset. Returns ``count``.

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
    for start in range(0, count, _BATCH):
        planned = []
        for index in range(start, min(start + _BATCH, count)):
            due = since_ms + span * index // max(count, 1)
            lateness = int(max_lateness_ms * rng.random() ** 3)
            message = new_message(names[index % len(names)], due, created_ms=due - 60_000 - rng.randrange(3_600_000))
            planned.append((message, due + lateness))
        offsets = writer.put_all([message for message, _ in planned])
        for (message, delivered_ms), offset in zip(planned, offsets, strict=True):
            writer.deliver(message, delivered_ms, version=offset)
            writer.done(message.delay_id, delivered_ms, version=offset, cutoff=offset + 1)
    return count
