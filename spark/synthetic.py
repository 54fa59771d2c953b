"""Synthetic delayq traffic written straight to Kafka, for the job's tests, benchmark and demos.

It writes what the proxy and a master write (the envelope of ``delayq.proxy``), with
record timestamps chosen by the caller, so any history can be staged: a clean run,
a duplicate, a loss, an early delivery, a cancel that was ignored.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from typing import Self

from delayq import wire
from delayq.wire import Envelope, new_delay_id


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
        from confluent_kafka import KafkaException, Producer

        self.flush()
        if self._acked is None:
            self._acked = Producer({"bootstrap.servers": self._bootstrap_servers, **self._conf})
        written: list = []
        self._acked.produce(topic, key=key, value=value, headers=headers, timestamp=at_ms,
                            on_delivery=lambda err, message: written.append((err, message)))
        self._acked.flush(30)
        if not written:
            raise RuntimeError(f"a record to {topic} was still unsent after 30 s")
        err, message = written[0]
        if err is not None:
            raise KafkaException(err)
        return message.offset()

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

    def done(self, delay_id: str, at_ms: int, *, version: int | None = None, cutoff: int | None = None,
             wait: bool = False) -> int | None:
        """The master's ``done`` tombstone for ``delay_id``, written at ``at_ms``.

        ``version`` (the offset of the put it closes) and ``cutoff`` (how far the master had
        read the partition) become its ``delayq-version`` and ``delayq-cutoff`` headers; leave
        both out for a ``done`` as masters wrote it before those headers.
        """
        if version is not None and cutoff is not None:
            headers = wire.done_headers(delay_id, version, cutoff)
        else:
            headers = wire.control_headers(wire.OP_DONE, delay_id)
            headers += [(name, str(number).encode()) for name, number in ((wire.VERSION, version),
                                                                         (wire.CUTOFF, cutoff)) if number is not None]
        return self._produce(self.buffer_topic, key=delay_id.encode(), value=None, headers=headers, at_ms=at_ms,
                             wait=wait)

    def deliver(self, message: Envelope, at_ms: int, *, epoch: int = 1, version: int | None = None) -> None:
        """One delivery of ``message`` to its topic, stamped ``at_ms``, as the master of ``epoch`` writes it.

        ``version`` is the buffer offset of the put delivered; None writes the record as
        masters did before the ``delayq-version`` header.
        """
        self._produce(message.topic, key=message.key, value=message.value,
                      headers=delivery_headers(message, epoch, version), at_ms=at_ms)

    def delivered(self, *, topic: str, due_ms: int, delivered_ms: int, created_ms: int | None = None,
                  epoch: int = 1, value: bytes = b"payload", versioned: bool = False) -> Envelope:
        """A whole healthy life: put at ``created_ms``, delivered and done at ``delivered_ms``.

        ``versioned`` writes the delivery and the done as masters with ``delayq-version``
        do (the put's offset; the done's cutoff just past the put); it waits for the put's
        offset, so it is for small histories. Otherwise they are written as before those headers.
        """
        message = new_message(topic, due_ms, created_ms=created_ms, value=value)
        offset = self.put(message, message.created_at_ms, wait=versioned)
        self.deliver(message, delivered_ms, epoch=epoch, version=offset)
        self.done(message.delay_id, delivered_ms, version=offset, cutoff=None if offset is None else offset + 1)
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


def delivery_headers(message: Envelope, epoch: int, version: int | None = None) -> wire.ProduceHeaders:
    """Headers of a delivery of ``message``; without ``version``, as masters wrote them before ``delayq-version``."""
    if version is not None:
        return message.delivery_headers(epoch, version)
    return [*message.headers, (wire.ID, message.delay_id.encode()),
            (wire.DELIVER_AT, str(message.deliver_at_ms).encode()), (wire.EPOCH, str(epoch).encode())]


def new_message(topic: str, due_ms: int, *, created_ms: int | None = None, value: bytes = b"payload",
                key: bytes | None = None) -> Envelope:
    """An envelope for ``topic`` due at ``due_ms``, created an hour before unless told."""
    created = due_ms - 3_600_000 if created_ms is None else created_ms
    return Envelope(delay_id=new_delay_id(created), topic=topic, deliver_at_ms=due_ms, value=value, key=key,
                    created_at_ms=created)


def healthy_traffic(writer: TrafficWriter, count: int, topics: Iterable[str], since_ms: int, until_ms: int, *,
                    max_lateness_ms: int = 200, seed: int = 7, versioned: bool = False) -> int:
    """Write ``count`` delayed messages due evenly in ``[since_ms, until_ms)``, each delivered once, on time.

    Lateness is drawn from 0 to ``max_lateness_ms``, skewed towards small values as a
    healthy master's is. ``versioned``: see :meth:`TrafficWriter.delivered`. Returns ``count``.

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
                         created_ms=due - 60_000 - rng.randrange(3_600_000), versioned=versioned)
    return count
