"""``delayq.aio.AIOProducer``: confluent-kafka's asyncio producer, plus ``delay=`` / ``deliver_at=``.

For asyncio services (FastAPI and the like): change ``from confluent_kafka.aio import
AIOProducer`` to ``from delayq.aio import AIOProducer``; a message without a delay is
produced exactly as before (``await produce(...)`` returns the delivery future). A
delayed message goes to the buffer topic through the same batching, and ``await
produce(..., delay=...)`` returns its delay id; ``await flush()`` returns once Kafka
holds every message produced before it, and raises if a delayed one could not be
written. The rules (what is refused, the frame, the id, the partition) are the
synchronous producer's: :class:`delayq.proxy.producer.BufferWriter`.

A cancel is a record with delayq's own headers, which confluent-kafka's batching cannot
carry, and so is a delayed message with user headers: those go through the underlying
producer directly, and ``await cancel(id)`` returns once Kafka has the cancel (a cancel
acknowledged before the due time wins).
"""

from __future__ import annotations

import asyncio
import time
import typing
from datetime import datetime, timedelta

from confluent_kafka import KafkaException, Message, version

try:
    from confluent_kafka.aio import AIOProducer as _ConfluentAIOProducer
except ImportError:  # before 2.13 it was confluent_kafka.experimental.aio, with another API
    raise ImportError(f"delayq.aio needs confluent-kafka 2.13 or later (confluent_kafka.aio); this is "
                      f"{version()[0]}: pip install -U confluent-kafka") from None

from delayq import wire
from delayq.wire import buffer_partition, check_delay_id, control_headers

from .feature_gate import FeatureGate
from .lookup import Lookup, lookup
from .producer import EXPIRY_LEVEL, BufferWriter, check_reschedule, delay_id_needs_delay, now_ms_of
from .repeat import Cron, Every


class AIOProducer(_ConfluentAIOProducer):
    """confluent-kafka's ``AIOProducer`` that can also hold a message back until a due time.

    Configuration as :class:`delayq.Producer`'s: librdkafka's, with optional ``delayq.*``
    keys over the ``DELAYQ_*`` settings. Create it inside a running event loop.

    Example::

        from delayq.aio import AIOProducer

        async with AIOProducer({"bootstrap.servers": "kafka:9092", "delayq.cluster": "orders"}) as p:
            delay_id = await p.produce("order-timeouts", b"cancel o-17 unless paid", key=b"o-17", delay=1800)
            await p.flush()                 # Kafka holds it: delayq will deliver it
            await p.cancel(delay_id)        # paid after all

    Its writes are idempotent, as :class:`delayq.Producer`'s are.

    Raises:
        ValueError: a ``delayq.*`` key names no setting or has a bad value, or the conf cannot keep
            each id's writes in order (:func:`delayq.proxy.producer.ordered_conf`).
    """

    def __init__(self, producer_conf: dict[str, typing.Any], **kwargs: typing.Any) -> None:
        if not isinstance(producer_conf, dict):
            raise TypeError(f"producer_conf must be a configuration dict, not {type(producer_conf).__name__}")
        self._writer, rest = BufferWriter.from_conf(producer_conf)
        self._level_gate = FeatureGate(self._writer.settings)
        self._buffer_partitions: int | None = None
        # Futures of the delayed puts not yet flushed: flush() raises the first failure among them.
        self._unflushed: set[asyncio.Future] = set()
        super().__init__(rest, **kwargs)

    @property
    def settings(self):
        """delayq's settings for this producer (environment, then ``delayq.*`` conf keys)."""
        return self._writer.settings

    async def produce(
        self,
        topic: str,
        value: typing.Any = None,
        key: typing.Any = None,
        *args: typing.Any,
        delay: float | timedelta | None = None,
        deliver_at: datetime | int | None = None,
        delay_level: int | None = None,
        repeat: Every | Cron | None = None,
        expire_after: float | timedelta | None = None,
        delay_id: str | None = None,
        partition: int = -1,
        timestamp: int = 0,
        headers: dict | list | None = None,
        **kwargs: typing.Any,
    ) -> typing.Any:
        """Produce now (the delivery future, as confluent-kafka's), or, with a delay, when it falls due (its id).

        Args:
            topic, value, key, partition, timestamp, headers: as confluent-kafka takes them; a
                delayed message may carry headers (not named ``delayq-*``).
            delay, deliver_at, delay_level, repeat, expire_after, delay_id: as :meth:`delayq.Producer.produce`
                (the first ``expire_after`` asks ZooKeeper for the cluster's feature level off the loop).

        Returns:
            The delay id for a delayed message; confluent-kafka's delivery future otherwise.

        Raises:
            TypeError, ValueError: as :meth:`delayq.Producer.produce`, before anything is sent.
        """
        due, options = self._writer.schedule(now_ms_of(time.time_ns()), delay, deliver_at, delay_level, repeat,
                                             expire_after)
        if due is not None and expire_after is not None:
            await asyncio.to_thread(self._level_gate.require_level, EXPIRY_LEVEL, "expire_after")
        if due is None:
            if delay_id is not None:
                raise delay_id_needs_delay()
            plain = {**kwargs, **({"partition": partition} if partition != -1 else {}),
                     **({"timestamp": timestamp} if timestamp else {}),
                     **({"headers": headers} if headers is not None else {})}
            return await super().produce(topic, value, key, *args, **plain)
        put = self._writer.put(topic, value, key, partition, timestamp, headers, due=due, options=options,
                               delay_id=delay_id)
        target = buffer_partition(put.delay_id, await self.buffer_partitions())
        if put.headers:
            written = await self._produce_direct(put.frame, put.delay_id, target, put.headers, put.timestamp)
        else:
            extra = {"timestamp": put.timestamp} if put.timestamp else {}
            written = await super().produce(self._writer.settings.buffer_topic, put.frame, put.delay_id,
                                            partition=target, **extra)
        self._unflushed.add(written)
        written.add_done_callback(self._unflushed.discard)
        return put.delay_id

    async def reschedule(self, delay_id: str, topic: str, value: typing.Any = None, key: typing.Any = None, *,
                         delay: float | timedelta | None = None, deliver_at: datetime | int | None = None,
                         delay_level: int | None = None, repeat: Every | Cron | None = None,
                         expire_after: float | timedelta | None = None, **kwargs: typing.Any) -> str:
        """Move a pending delayed message to a new due time, under the same id (:meth:`delayq.Producer.reschedule`).

        Raises:
            TypeError, ValueError: a malformed ``delay_id``, no new due time, or what :meth:`produce` refuses.
        """
        check_reschedule(delay_id, delay, deliver_at, delay_level, repeat)
        await self.produce(topic, value, key, delay=delay, deliver_at=deliver_at, delay_level=delay_level,
                           repeat=repeat, expire_after=expire_after, delay_id=delay_id, **kwargs)
        return delay_id

    async def cancel(self, delay_id: str) -> Message:
        """Cancel a delayed message; returns once Kafka has the cancel (its delivery report's message).

        A cancel that reaches the buffer after the message was delivered has no effect;
        :meth:`lookup` tells whether it is still pending.

        Raises:
            TypeError, ValueError: ``delay_id`` is not a delay id.
            KafkaException: Kafka refused the cancel.
        """
        check_delay_id(delay_id)
        target = buffer_partition(delay_id, await self.buffer_partitions())
        written = await self._produce_direct(None, delay_id, target, control_headers(wire.OP_CANCEL, delay_id), 0)
        # confluent-kafka's AIOProducer polls only when it sends a batch or flushes: poll until this one is in.
        while not written.done():
            await self._call(self._producer.poll, 0.05)
        return await written

    async def lookup(self, delay_id: str, timeout: float = 2.0) -> Lookup:
        """Ask a node whether ``delay_id`` is pending (:func:`delayq.lookup`), without blocking the loop."""
        return await self._call(lookup, delay_id, settings=self._writer.settings, timeout=timeout)

    async def close(self) -> None:
        """Flush and close the producer (confluent-kafka's), and the ZooKeeper client an ``expire_after`` opened."""
        try:
            await super().close()
        finally:
            await asyncio.to_thread(self._level_gate.close)

    async def flush(self, *args: typing.Any, **kwargs: typing.Any) -> typing.Any:
        """Wait until Kafka holds every message produced so far (or the timeout, if given, passed).

        Raises:
            KafkaException: a delayed message produced before could not be written (the first such).
        """
        remaining = await super().flush(*args, **kwargs)
        await asyncio.sleep(0)  # delivery reports of direct records are settled on this loop
        failed = [f for f in list(self._unflushed) if f.done() and not f.cancelled() and f.exception() is not None]
        for future in failed:
            self._unflushed.discard(future)
        if failed:
            raise failed[0].exception()  # type: ignore[misc]
        return remaining

    async def buffer_partitions(self, timeout: float = 10.0) -> int:
        """The buffer topic's partition count, asked of Kafka once, then remembered.

        Raises:
            KafkaException: UNKNOWN_TOPIC_OR_PART, saying how to fix it, when the buffer is not there.
        """
        if self._buffer_partitions is None:
            # All topics, not just the buffer: a metadata request naming a missing topic may auto-create it.
            metadata = await self.list_topics(timeout=timeout)
            self._buffer_partitions = self._writer.partition_count(metadata.topics)
        return self._buffer_partitions

    async def _produce_direct(self, value: bytes | None, delay_id: str, partition: int, headers: list,
                              timestamp: int) -> asyncio.Future:
        """One record with headers, past confluent-kafka's batching (which drops headers): its delivery future."""
        loop = asyncio.get_running_loop()
        written: asyncio.Future = loop.create_future()

        def delivered(err, msg) -> None:  # on whichever thread polls the producer
            loop.call_soon_threadsafe(_settle, written, err, msg)

        await self._call(self._producer.produce, self._writer.settings.buffer_topic, value, delay_id.encode(),
                         partition, on_delivery=delivered, timestamp=timestamp, headers=headers)
        return written


def _settle(written: asyncio.Future, err: typing.Any, msg: Message) -> None:
    if written.done():
        return
    if err is not None:
        written.set_exception(KafkaException(err))
    else:
        written.set_result(msg)
