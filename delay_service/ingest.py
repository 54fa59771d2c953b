"""Ingest, on every node: the buffer topic, all partitions, into the local store.

The store is a view of the buffer (a compacted changelog): it is filled only from
records consumed with ``read_committed``, and each polled batch, with the offsets it
reached, goes into RocksDB as one WriteBatch, so a restart resumes exactly where the
store is. A malformed record (by :func:`delayq.wire.parse_buffer_record`, the one
parser) is kept in the store, in the same batch, until the cluster has dead-lettered
it: the master writes each one once, in its transaction (see dead_letters.py); every
node drops the ones the ledger says are done. Nothing is lost and nothing crashes the node.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import cast

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message, TopicPartition

from delayq import wire
from delayq.clock import now_ms
from delayq.settings import Settings
from delayq.store import Malformed, Put, Remove, StoreOp, TimeIndex
from delayq.wire import MalformedRecord, parse_buffer_record

from . import stored
from .dead_letters import DeadLetterLedger
from .metrics import NodeMetrics
from .topics import EndOffsets

log = logging.getLogger("delayq.ingest")

# How long one consume() may wait for a full batch. librdkafka's consume() returns when the
# batch is full or this passes, not when the first record arrives: it bounds how long a record
# that came in sits in the client while the master waits to be covered (the cycle behind
# delivery lateness). Idle, a node then uses 3.6% of a core instead of 2.4% (measured with 20 ms).
POLL_S = 0.002
# How often a node with malformed records waiting asks the ledger which ones the master has dead-lettered.
LEDGER_CHECK_S = 5.0
# How often ingest persists what it applied (store batches skip the WAL: TimeIndex.flush), so a
# crash rolls the store back by at most this, and never past the buffer's delete.retention.ms.
STORE_FLUSH_S = 300.0


class Ingest:
    """Reads the buffer into ``store``; tells the delivery loop about earlier due times and removals."""

    def __init__(
        self,
        settings: Settings,
        store: TimeIndex,
        metrics: NodeMetrics,
        end_offsets: EndOffsets,
        *,
        on_earlier_due: Callable[[int], None] = lambda _ms: None,
        on_settled: Callable[[list[str]], None] = lambda _ids: None,
        batch_size: int = 10_000,
    ):
        self.settings = settings
        self.store = store
        self.metrics = metrics
        self.end_offsets = end_offsets
        self.partitions = partitions = end_offsets.partitions
        self.on_earlier_due = on_earlier_due
        self.on_settled = on_settled
        self.batch_size = batch_size
        self.lag: int | None = None
        # Why the buffer's end offsets cannot be read, since when (monotonic s); None while they can.
        self.failing: str | None = None
        self.failing_since: float | None = None
        self._positions: dict[int, int] = {}
        self._end_offsets: dict[int, int] = {}
        self._unflushed = False  # batches applied since the store was last flushed
        # Whether ingest had read up to the previous end offsets when the last ones were read.
        self._kept_up = False
        self._progress = threading.Condition()
        self.consumer = Consumer(settings.kafka_conf(**{
            "group.id": f"delayq-{settings.cluster}-ingest-{settings.node_id}",
            "client.id": f"delayq-ingest-{settings.node_id}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            # Low fetch wait: a put due in 50 ms must reach the master's store well before then.
            "fetch.wait.max.ms": 5,
            "fetch.min.bytes": 1,
        }))
        self.ledger = DeadLetterLedger(settings)
        stored = store.offsets()
        self.consumer.assign([
            TopicPartition(settings.buffer_topic, p, stored.get(p, OFFSET_BEGINNING)) for p in partitions
        ])
        self._positions = {p: stored.get(p, 0) for p in partitions}

    # -- the loop --------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        next_lag_check = next_ledger_check = 0.0
        next_flush = time.monotonic() + STORE_FLUSH_S
        while not stop.is_set():
            self.poll_once(timeout_s=POLL_S)
            if time.monotonic() >= next_flush:
                next_flush = time.monotonic() + STORE_FLUSH_S
                if self._unflushed:
                    self.store.flush()
                    self._unflushed = False
            if time.monotonic() >= next_lag_check:
                next_lag_check = time.monotonic() + 0.5
                self.refresh_lag()
            if self.store.malformed_count and time.monotonic() >= next_ledger_check:
                next_ledger_check = time.monotonic() + LEDGER_CHECK_S
                self.forget_dead_lettered()

    def forget_dead_lettered(self) -> None:
        """Drop the stored malformed records the cluster's master has dead-lettered."""
        try:
            handled = self.ledger.handled(self.partitions)
        except KafkaException as err:
            log.info("cannot read the dead-letter ledger: %s", err.args[0].str())
            return
        self.store.forget_malformed(handled)
        self.metrics.malformed_waiting.set(self.store.malformed_count)

    def poll_once(self, timeout_s: float = 0.05) -> int:
        """Consume one batch and apply it as one WriteBatch; return the number of records read."""
        messages = self.consumer.consume(self.batch_size, timeout_s)
        if not messages:
            self._update_positions()
            return 0
        ops: list[StoreOp] = []
        partitions = len(self.partitions)
        offsets: dict[int, int] = {}
        # Ids of records that settle a master's write: a done, a cancel, a master's copy.
        settled: list[str] = []
        earliest_put: int | None = None
        counts = {b"put": 0, b"cancel": 0, b"done": 0, b"malformed": 0}
        for message in messages:
            error = message.error()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:
                    log.warning("buffer consumer: %s", error.str())
                continue
            partition, offset = message.partition(), message.offset()
            if partition is None or offset is None:
                raise RuntimeError(f"the buffer consumer returned a record of {message.topic()} without a partition "
                                   "or offset, which librdkafka gives every record it reads")
            # A consumed record's headers are a list of (name, bytes or None): the stub's type is
            # the one produce() takes, which also allows a dict and str values.
            headers = cast("wire.Headers | None", message.headers())
            offsets[partition] = offset + 1
            try:
                record = parse_buffer_record(message.key(), message.value(), headers, message.timestamp()[1],
                                             partition=partition, partitions=partitions)
            except MalformedRecord as bad:
                ops.append(self._malformed(message, partition, offset, headers, bad))
                counts[b"malformed"] += 1
                continue
            counts[record.op] += 1
            env = record.envelope
            if env is not None:  # a put: only a put has an envelope
                version = offset
                ops.append(Put(record.delay_id, env.deliver_at_ms, stored.pack(partition, version, env),
                               version, record.restores))
                if record.restores is not None:
                    settled.append(record.delay_id)
                if earliest_put is None or env.deliver_at_ms < earliest_put:
                    earliest_put = env.deliver_at_ms
            else:
                ops.append(Remove(record.delay_id, record.closes_version))
                settled.append(record.delay_id)
        if offsets:
            self.store.apply(ops, offsets, ingested_at_ms=now_ms())
            self._unflushed = True
        for op, count in counts.items():
            if count:
                self.metrics.ingested.labels(op.decode()).inc(count)
        self.metrics.pending.set(self.store.pending_count())
        self.metrics.malformed_waiting.set(self.store.malformed_count)
        if settled:
            self.on_settled(settled)
        if earliest_put is not None:
            self.on_earlier_due(earliest_put)
        self._update_positions()
        return len(messages)

    @staticmethod
    def _malformed(message: Message, partition: int, offset: int, headers: wire.Headers | None,
                   bad: MalformedRecord) -> Malformed:
        """The store op that keeps a malformed record until the master has dead-lettered it."""
        key = message.key()
        # A valid id on its own partition: the record is the id's newest, which matters to compaction.
        # (A record without a key is BAD_ID.)
        own_id = (key.decode() if key is not None and bad.code not in (wire.Reason.BAD_ID, wire.Reason.WRONG_PARTITION)
                  else None)
        log.debug("buffer record %s/%d/%d is malformed (%s)", message.topic(), partition, offset, bad.reason)
        record = stored.MalformedBufferRecord(key, message.value(), list(headers or []), message.timestamp()[1],
                                              bad.code.value, bad.reason)
        return Malformed(partition, offset, stored.pack_malformed(record), own_id)

    # -- where ingest stands ---------------------------------------------

    def _update_positions(self) -> None:
        topic = self.settings.buffer_topic
        # position() moves past transaction markers; the last message's offset + 1 would not.
        for tp in self.consumer.position([TopicPartition(topic, p) for p in self.partitions]):
            if tp.offset >= 0:
                self._positions[tp.partition] = tp.offset
        with self._progress:
            self._progress.notify_all()

    def refresh_lag(self) -> int | None:
        previous = self._end_offsets
        try:
            self._end_offsets = self.end_offsets.read(timeout_s=5.0)
        except KafkaException as err:
            if self.failing is None:
                self.failing_since = time.monotonic()
                log.warning("cannot read the buffer's end offsets: %s", err.args[0].str())
            self.failing = f"cannot read the buffer's end offsets: {err.args[0].str()}"
            return self.lag
        if self.failing is not None:
            log.info("buffer end offsets readable again after %.1fs", time.monotonic() - (self.failing_since or 0))
            self.failing = self.failing_since = None
        self.lag = sum(max(0, end - self._positions.get(p, 0)) for p, end in self._end_offsets.items())
        self._kept_up = bool(previous) and all(self._positions.get(p, 0) >= end for p, end in previous.items())
        self.metrics.buffer_lag.set(self.lag)
        return self.lag

    @property
    def caught_up(self) -> bool:
        """At the end of the buffer, or (under steady traffic, never quite at it) past where it ended a refresh ago."""
        return self.lag == 0 or self._kept_up

    def wait_until_read(self, targets: dict[int, int], timeout_s: float, abandon: Callable[[], bool]) -> bool:
        """Block until ingest has read every partition up to ``targets`` (or ``abandon()``); True if it did."""
        deadline = time.monotonic() + timeout_s
        with self._progress:
            while not all(self._positions.get(p, 0) >= end for p, end in targets.items()):
                remaining = deadline - time.monotonic()
                if remaining <= 0 or abandon():
                    return False
                self._progress.wait(min(remaining, 0.1))
        return True

    def positions(self) -> dict[int, int]:
        """Partition -> the offset ingest has read the buffer up to (a copy)."""
        with self._progress:
            return dict(self._positions)

    def held_back(self, targets: dict[int, int], stable: dict[int, int]) -> list[int]:
        """The partitions ingest has read up to the last stable offset (``stable``) but not to ``targets``.

        There, an open transaction keeps a read_committed reader from what lies behind it.
        """
        with self._progress:
            return sorted(p for p, end in targets.items()
                          if stable.get(p, end) <= self._positions.get(p, 0) < end)

    def close(self) -> None:
        self.ledger.close()
        self.consumer.close()
