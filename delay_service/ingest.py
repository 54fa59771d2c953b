"""Ingest, on every node: the buffer topic, all partitions, into the local store.

The store is a view of the buffer (a compacted changelog): it is filled only from
records consumed with ``read_committed``, and each polled batch, with the offsets it
reached, goes into RocksDB as one WriteBatch, so a restart resumes exactly where the
store is. Malformed records are copied to the dead-letter topic with the reason,
before their offsets are stored, so nothing is lost and nothing crashes the node.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from delayq.proxy import MalformedRecord, envelope, parse_buffer_record
from delayq.settings import Settings
from delayq.store import Put, Remove, TimeIndex

from . import stored
from .dead_letters import produce_copy
from .metrics import NodeMetrics
from .topics import EndOffsets

log = logging.getLogger("delayq.ingest")

# How long one consume() may wait for a full batch; shorter while delivery waits on ingest.
POLL_S = 0.02
HURRIED_POLL_S = 0.002

def now_ms() -> int:
    return time.time_ns() // 1_000_000


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
        # Whether ingest had read up to the previous end offsets when the last ones were read.
        self._kept_up = False
        self._progress = threading.Condition()
        self._waiters = 0  # threads in wait_until_read
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
        self.dead_letters = Producer(settings.kafka_conf(**{
            "client.id": f"delayq-dead-letter-{settings.node_id}",
            "enable.idempotence": True,
            "linger.ms": 5,
        }))
        stored = store.offsets()
        self.consumer.assign([
            TopicPartition(settings.buffer_topic, p, stored.get(p, OFFSET_BEGINNING)) for p in partitions
        ])
        self._positions = {p: stored.get(p, 0) for p in partitions}

    # -- the loop --------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        next_lag_check = 0.0
        while not stop.is_set():
            # consume() returns when the batch is full or the timeout passes, not when the
            # first record arrives: while the master waits to be covered, poll in short steps.
            self.poll_once(timeout_s=HURRIED_POLL_S if self._waiters else POLL_S)
            if time.monotonic() >= next_lag_check:
                next_lag_check = time.monotonic() + 0.5
                self.refresh_lag()

    def poll_once(self, timeout_s: float = 0.05) -> int:
        """Consume one batch and apply it as one WriteBatch; return the number of records read."""
        messages = self.consumer.consume(self.batch_size, timeout_s)
        if not messages:
            self._update_positions()
            return 0
        ops: list[Put | Remove] = []
        offsets: dict[int, int] = {}
        # Ids of records that settle a master's write: a done, a cancel, a master's copy.
        settled: list[str] = []
        earliest_put: int | None = None
        counts = {b"put": 0, b"cancel": 0, b"done": 0}
        dead = 0
        for message in messages:
            error = message.error()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:
                    log.warning("buffer consumer: %s", error.str())
                continue
            offsets[message.partition()] = message.offset() + 1
            try:
                record = parse_buffer_record(message.key(), message.value(), message.headers(),
                                             message.timestamp()[1])
            except MalformedRecord as bad:
                self._dead_letter(message, bad.reason)
                dead += 1
                continue
            counts[record.op] += 1
            if record.op == envelope.OP_PUT:
                env = record.envelope
                version = message.offset()
                ops.append(Put(record.delay_id, env.deliver_at_ms, stored.pack(message.partition(), version, env),
                               version, record.restores))
                if record.restores is not None:
                    settled.append(record.delay_id)
                if earliest_put is None or env.deliver_at_ms < earliest_put:
                    earliest_put = env.deliver_at_ms
            else:
                ops.append(Remove(record.delay_id, record.closes_version))
                settled.append(record.delay_id)
        if dead:
            # The copies must be durable before the offsets that skip their originals are stored.
            remaining = self.dead_letters.flush(30)
            if remaining:
                raise RuntimeError(f"{remaining} malformed buffer records could not be written to the dead-letter "
                                   f"topic {self.settings.dead_letter_topic}; not advancing past them")
        if offsets:
            self.store.apply(ops, offsets, ingested_at_ms=now_ms())
        for op, count in counts.items():
            if count:
                self.metrics.ingested.labels(op.decode()).inc(count)
        self.metrics.pending.set(self.store.pending_count())
        if settled:
            self.on_settled(settled)
        if earliest_put is not None:
            self.on_earlier_due(earliest_put)
        self._update_positions()
        return len(messages)

    def _dead_letter(self, message: Message, reason: str) -> None:
        headers = list(message.headers() or [])
        headers += [
            (envelope.DEAD_LETTER_REASON, reason.encode()),
            (envelope.DEAD_LETTER_SOURCE,
             f"{message.topic()}/{message.partition()}/{message.offset()}".encode()),
        ]
        produce_copy(self.dead_letters, self.settings.dead_letter_topic, message.key(), message.value(), headers)
        self.metrics.dead_lettered.labels("malformed").inc()
        log.warning("buffer record %s/%d/%d is malformed (%s): dead-lettered", message.topic(),
                    message.partition(), message.offset(), reason)

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
            self._waiters += 1
            try:
                while not all(self._positions.get(p, 0) >= end for p, end in targets.items()):
                    remaining = deadline - time.monotonic()
                    if remaining <= 0 or abandon():
                        return False
                    self._progress.wait(min(remaining, 0.1))
            finally:
                self._waiters -= 1
        return True

    def close(self) -> None:
        self.dead_letters.flush(10)
        self.consumer.close()
