"""Ingest, on every node: the buffer topic, all partitions, into the local store.

The buffer is consumed and parsed in a child process, the reader (reader.py), which
hands this loop each batch as store ops: the node's GIL then spends only the store
writes on ingest, and the master's delivery loop has the rest of it.

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

from confluent_kafka import OFFSET_BEGINNING, KafkaException

from delayq.clock import now_ms
from delayq.settings import Settings
from delayq.store import Malformed, Put, Remove, StoreOp, TimeIndex

from .dead_letters import DeadLetterLedger
from .metrics import NodeMetrics
from .reader import MALFORMED, PUT, REMOVE, Batch, BufferReader, ReaderConfig, ReaderGone
from .topics import EndOffsets

log = logging.getLogger("delayq.ingest")

# How long the reader's consume() waits for a first record before it looks at the consumer positions
# again (they move past transaction markers, which a cover waits for, without a record).
POLL_S = 0.002
# How long the ingest loop waits for the reader's next frame before it looks at its chores (flush, lag, ledger).
CHORES_S = 0.05
# How long ingest waits before it replaces a reader that died.
READER_RESTART_S = 0.5
# How often a node with malformed records waiting asks the ledger which ones the master has dead-lettered.
LEDGER_CHECK_S = 5.0
# How often ingest persists what it applied (store batches skip the WAL: TimeIndex.flush), so a
# crash rolls the store back by at most this, and never past the buffer's delete.retention.ms.
STORE_FLUSH_S = 300.0

# The store op each tag of a reader's frame stands for.
_OP_KINDS: dict[int, type[StoreOp]] = {PUT: Put, REMOVE: Remove, MALFORMED: Malformed}


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
        batch_size: int = 2_000,  # records per frame: one frame fits the reader's pipe (reader.PIPE_BYTES)
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
        self._consumer_conf = settings.kafka_conf(**{
            "group.id": f"delayq-{settings.cluster}-ingest-{settings.node_id}",
            "client.id": f"delayq-ingest-{settings.node_id}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            # Low fetch wait: a put due in 50 ms must reach the master's store well before then.
            "fetch.wait.max.ms": 5,
            "fetch.min.bytes": 1,
        })
        self._consumer_conf.pop("logger", None)  # a Python object: the reader sets its own
        self.ledger = DeadLetterLedger(settings)
        self._positions = {p: store.offsets().get(p, 0) for p in partitions}
        # The reader in use; None between one that died and its replacement. Swapped under
        # _reader_lock, so close() never misses one the ingest thread is starting.
        self._reader_lock = threading.Lock()
        self._closed = False
        self._reader: BufferReader | None = self._start_reader()

    def _start_reader(self) -> BufferReader:
        """A reader process that consumes from where the store is (every record it has applied is below)."""
        stored_offsets = self.store.offsets()
        root = logging.getLogger()
        # The node's own log line format (a %-style one; the reader falls back to logging's default).
        formats = [h.formatter._fmt for h in root.handlers if h.formatter is not None and h.formatter._fmt
                   and isinstance(h.formatter._style, logging.PercentStyle)]
        return BufferReader(ReaderConfig(
            consumer=self._consumer_conf, topic=self.settings.buffer_topic, partitions=list(self.partitions),
            start={p: stored_offsets.get(p, OFFSET_BEGINNING) for p in self.partitions},
            batch_size=self.batch_size, poll_s=POLL_S, log_level=root.getEffectiveLevel(),
            log_format=formats[0] if formats else logging.BASIC_FORMAT))

    def _replace_reader(self, gone: ReaderGone | None) -> None:
        """Stop the reader that is gone (if any) and start another from the store's offsets; never raises.

        A reader that cannot start is tried again at the next poll, READER_RESTART_S later:
        ingest waits (covers hold, /readyz says ingest lags), the node does not die of it.
        """
        with self._reader_lock:
            reader, self._reader = self._reader, None
        if reader is not None:
            reader.stop()
        if gone is not None:
            log.warning("%s; starting another from the store's offsets", gone)
        time.sleep(READER_RESTART_S)  # a reader that keeps dying must not spin the node
        try:
            started = self._start_reader()
        except ReaderGone as err:
            log.warning("%s; trying again", err)
            return
        with self._reader_lock:
            if not self._closed:
                self._reader = started
                return
        started.stop()  # close() ran meanwhile

    # -- the loop --------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        next_lag_check = next_ledger_check = 0.0
        next_flush = time.monotonic() + STORE_FLUSH_S
        while not stop.is_set():
            # Returns as soon as the reader sends a frame; the timeout only paces the chores below.
            self.poll_once(timeout_s=CHORES_S)
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
        """Apply the reader's next batch (waiting up to ``timeout_s``) as one WriteBatch; the records it read.

        A reader that exited is replaced by one that reads on from the store's offsets.
        """
        reader = self._reader
        if reader is None:
            if not self._closed:
                self._replace_reader(None)
            return 0
        try:
            frame = reader.receive(timeout_s)
        except ReaderGone as gone:
            if not self._closed:
                self._replace_reader(gone)
            return 0
        if frame is None:
            return 0
        positions, batch = frame
        if batch is not None:
            self._apply(batch)
        with self._progress:
            self._positions.update(positions)
            self._progress.notify_all()
        return batch.records if batch is not None else 0

    def _apply(self, batch: Batch) -> None:
        # The reader parsed each record by the wire contract: the ops are built from its fields
        # unchecked, as the named tuples' _make() builds them, without its Python-level call.
        kinds, new = _OP_KINDS, tuple.__new__
        ops = cast("list[StoreOp]", [new(kinds[op[0]], op[1:]) for op in batch.ops])
        if batch.offsets:
            self.store.apply(ops, batch.offsets, ingested_at_ms=now_ms())
            self._unflushed = True
        for op_name, count in batch.counts.items():
            if count:
                self.metrics.ingested.labels(op_name.decode()).inc(count)
        self.metrics.pending.set(self.store.pending_count())
        self.metrics.malformed_waiting.set(self.store.malformed_count)
        if batch.settled:
            self.on_settled(batch.settled)
        if batch.earliest_put is not None:
            self.on_earlier_due(batch.earliest_put)

    # -- where ingest stands ---------------------------------------------

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
        with self._reader_lock:
            self._closed = True
            reader, self._reader = self._reader, None
        if reader is not None:
            reader.stop()
        self.ledger.close()
