"""Ingest, on every node: the partitions of the shards it holds, each shard into a store of its own.

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

from confluent_kafka import OFFSET_BEGINNING, KafkaException

from delayq import wire
from delayq.clock import now_ms
from delayq.settings import Settings
from delayq.store import TimeIndex, decode

from .dead_letters import DeadLetterLedger
from .metrics import NodeMetrics, ShardMetrics
from .reader import Batch, BufferReader, ReaderConfig, ReaderGone
from .topics import LEADER_REFRESH_CONF, AskedEnds, EndOffsets

log = logging.getLogger("delayq.ingest")

# How long the reader's consume() waits for a first record before it looks at the consumer positions
# again (they move past transaction markers, which a cover waits for, without a record); doubled at each
# look that finds nothing new, up to IDLE_POLL_S, and back to POLL_S at the first record or move. A
# record wakes consume() at once whatever its wait: only a move past markers alone (an aborted
# transaction's) waits longer, and only on a buffer that was quiet. At 2 ms always, an idle reader
# spent 8% of a core looking.
POLL_S = 0.002
IDLE_POLL_S = 0.064
# How long the broker may hold a fetch that finds no record. It answers as soon as a record (or a
# transaction's marker) lands in any partition of the fetch (fetch.min.bytes 1), so this costs no
# latency; it bounds how often an idle reader asks. At 5 ms each idle node cost the broker 8-10% of a core.
FETCH_WAIT_MS = 100
# How long the ingest loop waits for the reader's next frame before it looks at its chores (flush, lag, ledger).
CHORES_S = 0.05
# How long ingest waits before it replaces a reader that died.
READER_RESTART_S = 0.5
# How long a partition's position may stand still below its last stable offset (records there to read) before
# ingest takes its reader for stuck and replaces it. A librdkafka client can stop using partitions for good
# once their leader was briefly unknown (a broker frozen, then back: librdkafka issue 5430, open in 2.16): they
# stay with its "internal" broker, and a node's covers waited ten minutes in a soak. A reader reading moves every
# partition it is behind on within milliseconds; a node frozen longer than this finds its frames waiting when it
# thaws; a consumer reconnecting after a broker restart backs off at most 10 s (reconnect.backoff.max.ms).
READER_STUCK_S = 15.0
# How often a node with malformed records waiting asks the ledger which ones the master has dead-lettered.
LEDGER_CHECK_S = 5.0
# How often ingest reads the buffer's end offsets (its lag, and readiness), and how long one read may take. The
# read is asked for and its answer taken when it comes: a read waited for held ingest, and every master's cover
# with it, for its whole timeout each time a partition's leader was a broker just lost (test_replicated_kafka).
LAG_CHECK_S = 0.5
LAG_CALL_S = 5.0
# How often ingest persists what it applied (store batches skip the WAL: TimeIndex.flush), so a
# crash rolls the store back by at most this, and never past the buffer's delete.retention.ms.
STORE_FLUSH_S = 300.0


class ShardFeed:
    """One shard as this node holds it: its store, where ingest stands in its partitions, what wakes its master.

    The shard's master (:class:`delayq.delay_service.delivery.Delivery`) sees ingest only
    through this: the shard's partitions, their end offsets, ingest's positions there.
    """

    def __init__(self, ingest: Ingest, shard: int, store: TimeIndex, metrics: ShardMetrics, *,
                 on_earlier_due: Callable[[int], None] = lambda _ms: None,
                 on_settled: Callable[[list[str]], None] = lambda _ids: None,
                 on_ready: Callable[[], None] = lambda: None):
        self.shard = shard
        self.store = store
        self.metrics = metrics
        self.shards = ingest.shards
        self.partitions = wire.shard_partitions(shard, ingest.shards, ingest.partition_count)
        self.partition_count = ingest.partition_count
        self.ledger = ingest.ledger
        self.on_earlier_due = on_earlier_due
        self.on_settled = on_settled
        self.on_ready = on_ready
        self.lag: int | None = None
        # Caught up on this shard at least once since the node took it: it may master it from then on.
        self.ready = False
        self._kept_up = False
        self._ingest = ingest

    @property
    def caught_up(self) -> bool:
        """At the end of the shard's partitions, or (under steady traffic) past where they ended a refresh ago."""
        return self.lag == 0 or self._kept_up

    def read_ends(self, timeout_s: float, *, committed: bool = True) -> dict[int, int]:
        """The end offsets of the shard's partitions (``committed=False``: the high watermarks).

        Raises:
            KafkaException: Kafka did not answer.
        """
        return self._ingest.end_offsets.read(timeout_s, committed=committed, partitions=self.partitions)

    def wait_until_read(self, targets: dict[int, int], timeout_s: float, abandon: Callable[[], bool]) -> bool:
        return self._ingest.wait_until_read(targets, timeout_s, abandon)

    def positions(self) -> dict[int, int]:
        """Partition -> the offset ingest has read the shard's partitions up to (a copy)."""
        everywhere = self._ingest.positions()
        return {p: everywhere.get(p, 0) for p in self.partitions}

    def held_back(self, targets: dict[int, int], stable: dict[int, int]) -> list[int]:
        return self._ingest.held_back(targets, stable)

    def _saw_ends(self, ends: dict[int, int], previous: dict[int, int], positions: dict[int, int]) -> None:
        mine = {p: ends[p] for p in self.partitions if p in ends}
        self.lag = sum(max(0, end - positions.get(p, 0)) for p, end in mine.items())
        self._kept_up = bool(previous) and all(positions.get(p, 0) >= previous.get(p, 0) for p in mine)
        self.metrics.buffer_lag.set(self.lag)
        if self.caught_up and not self.ready:
            self.ready = True
            self.on_ready()


class Ingest:
    """Reads the partitions of the shards it holds into their stores; tells each shard's master what it must know."""

    def __init__(
        self,
        settings: Settings,
        shards: int,
        metrics: NodeMetrics,
        end_offsets: EndOffsets,
        *,
        batch_size: int = 2_000,  # records per frame: one frame fits the reader's pipe (reader.PIPE_BYTES)
        compaction_lag_ms: int | None = None,  # the buffer's min.compaction.lag.ms (topics.BufferInfo)
    ):
        self.settings = settings
        self.compaction_lag_ms = settings.min_compaction_lag_ms if compaction_lag_ms is None else compaction_lag_ms
        self.shards = shards
        self.metrics = metrics
        self.end_offsets = end_offsets
        self.partition_count = len(end_offsets.partitions)
        self.batch_size = batch_size
        self.feeds: dict[int, ShardFeed] = {}
        self.partitions: list[int] = []  # those of the shards held
        self.lag: int | None = None
        # Why the buffer's end offsets cannot be read, since when (monotonic s); None while they can.
        self.failing: str | None = None
        self.failing_since: float | None = None
        # Buffer partitions whose reading stopped at a record of a newer feature level: partition ->
        # (offset, level). Nothing there from that record on is applied until the node is upgraded.
        self.held_for_upgrade: dict[int, tuple[int, int]] = {}
        self._positions: dict[int, int] = {}
        self._end_offsets: dict[int, int] = {}
        self._unflushed: set[int] = set()  # shards with batches applied since their store was last flushed
        self._progress = threading.Condition()
        self._consumer_conf = settings.kafka_conf(**{
            "group.id": settings.ingest_group,
            "client.id": f"delayq-ingest-{settings.node_id}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": FETCH_WAIT_MS,
            "fetch.min.bytes": 1,
            **LEADER_REFRESH_CONF,
        })
        self._consumer_conf.pop("logger", None)  # a Python object: the reader sets its own
        self.ledger = DeadLetterLedger(settings)
        # The reader and the held shards change only under this lock: the ingest thread holds it while
        # it takes and applies a frame, hold() while it swaps them, close() while it stops the reader.
        self._lock = threading.Lock()
        self._closed = False
        # The reader in use; None until a shard is held, and between one that died and its replacement.
        self._reader: BufferReader | None = None
        # The number of the shards held now (reader.py): a frame of another is of shards held before.
        self._generation = 0
        # Partition -> (position, since when, monotonic) while ingest is behind there: see READER_STUCK_S.
        self._standing: dict[int, tuple[int, float]] = {}

    def feed(self, shard: int, store: TimeIndex, metrics: ShardMetrics, *,
             on_earlier_due: Callable[[int], None] = lambda _ms: None,
             on_settled: Callable[[list[str]], None] = lambda _ids: None,
             on_ready: Callable[[], None] = lambda: None) -> ShardFeed:
        """A feed of ``shard`` into ``store``, for :meth:`hold`; ``on_ready`` once it first caught up."""
        return ShardFeed(self, shard, store, metrics, on_earlier_due=on_earlier_due, on_settled=on_settled,
                         on_ready=on_ready)

    def hold(self, feeds: list[ShardFeed]) -> None:
        """Read exactly these shards from now on, each partition from where its store is.

        The reader in use is told (the first shard held starts it); the frames it sent before are
        dropped, their records read again from the stores' offsets. A reader that is gone is replaced.

        Raises:
            ReaderGone: the first reader could not start (the ingest loop tries again at its next poll).
        """
        with self._lock:
            if self._closed:
                return
            self.feeds = {feed.shard: feed for feed in feeds}
            self.partitions = sorted(p for feed in feeds for p in feed.partitions)
            start = self._start_offsets()
            with self._progress:
                self._positions = {p: max(offset, 0) for p, offset in start.items()}
                self._progress.notify_all()
            if self._reader is None:
                if self.partitions:
                    self._reader = self._start_reader(start)
                return
            self._generation += 1
            try:
                self._reader.reassign(self._generation, self.partitions, start)
            except ReaderGone as gone:
                self._replace_reader(gone)

    def _start_offsets(self) -> dict[int, int]:
        """Partition -> where to read it from: after every record its shard's store has applied."""
        start = {}
        for feed in self.feeds.values():
            stored_offsets = feed.store.offsets()
            start.update({p: stored_offsets.get(p, OFFSET_BEGINNING) for p in feed.partitions})
        return start

    def _start_reader(self, start: dict[int, int] | None = None) -> BufferReader:
        """A reader process that consumes from where the stores are (every record they have applied is below)."""
        root = logging.getLogger()
        # The node's own log line format (a %-style one; the reader falls back to logging's default).
        formats = [h.formatter._fmt for h in root.handlers if h.formatter is not None and h.formatter._fmt
                   and isinstance(h.formatter._style, logging.PercentStyle)]
        return BufferReader(ReaderConfig(
            consumer=self._consumer_conf, topic=self.settings.buffer_topic, partitions=list(self.partitions),
            partition_count=self.partition_count, shards=self.shards,
            start=self._start_offsets() if start is None else start,
            compaction_lag_ms=self.compaction_lag_ms,
            batch_size=self.batch_size, poll_s=POLL_S, idle_poll_s=IDLE_POLL_S, log_level=root.getEffectiveLevel(),
            log_format=formats[0] if formats else logging.BASIC_FORMAT, gc_tuned=self.settings.gc_tuned,
            generation=self._generation))

    def _replace_reader(self, gone: ReaderGone | None) -> None:
        """Stop the reader that is gone (if any) and start another from the stores' offsets; never raises.

        Called with ``_lock`` held. A reader that cannot start is tried again at the next
        poll, READER_RESTART_S later: ingest waits (covers hold, /readyz says ingest lags),
        the node does not die of it.
        """
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.stop()
        if gone is not None:
            log.warning("%s; starting another from the store's offsets", gone)
        time.sleep(READER_RESTART_S)  # a reader that keeps dying must not spin the node
        try:
            self._reader = self._start_reader()
        except ReaderGone as err:
            log.warning("%s; trying again", err)

    # -- the loop --------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        next_lag_check = next_ledger_check = 0.0
        asked: AskedEnds | None = None  # end offsets asked for: never waited for here, records keep flowing
        next_flush = time.monotonic() + STORE_FLUSH_S
        while not stop.is_set():
            # Returns as soon as the reader sends a frame; the timeout only paces the chores below.
            self.poll_once(timeout_s=CHORES_S)
            if time.monotonic() >= next_flush:
                next_flush = time.monotonic() + STORE_FLUSH_S
                self.flush()
            if asked is None and time.monotonic() >= next_lag_check:
                asked = self._ask_ends()
            if asked is not None and asked.done():
                next_lag_check = time.monotonic() + LAG_CHECK_S
                self.refresh_lag(asked)
                asked = None
            if time.monotonic() >= next_ledger_check and any(f.store.malformed_count for f in self.feeds.values()):
                next_ledger_check = time.monotonic() + LEDGER_CHECK_S
                self.forget_dead_lettered()

    def flush(self) -> None:
        """Persist what was applied to each store since its last flush."""
        with self._lock:
            for shard in sorted(self._unflushed):
                feed = self.feeds.get(shard)
                if feed is not None:
                    feed.store.flush()
            self._unflushed.clear()

    def forget_dead_lettered(self) -> None:
        """Drop the stored malformed records the shards' masters have dead-lettered."""
        feeds = list(self.feeds.values())
        try:
            handled = self.ledger.handled(sorted(p for feed in feeds for p in feed.partitions))
        except KafkaException as err:
            log.info("cannot read the dead-letter ledger: %s", err.args[0].str())
            return
        for feed in feeds:
            feed.store.forget_malformed({p: o for p, o in handled.items() if p in feed.partitions})
            feed.metrics.malformed_waiting.set(feed.store.malformed_count)

    def poll_once(self, timeout_s: float = 0.05) -> int:
        """Apply the reader's next batch (waiting up to ``timeout_s``), each shard's as one WriteBatch; its records.

        A reader that exited is replaced by one that reads on from the stores' offsets.
        """
        with self._lock:
            if self._closed:
                return 0
            reader = self._reader
            if reader is None:
                if self.partitions:
                    self._replace_reader(None)
                else:  # no shard held: nothing to read
                    time.sleep(timeout_s)
                return 0
            try:
                frame = reader.receive(timeout_s)
            except ReaderGone as gone:
                self._replace_reader(gone)
                return 0
            if frame is None:
                return 0
            if frame.generation != self._generation:  # read before the shards held changed: read again since
                return 0
            batch = frame.batch
            if batch is not None:
                self._apply(batch)
            if frame.held != self.held_for_upgrade:
                self.held_for_upgrade = frame.held
                self.metrics.awaiting_upgrade.set(len(frame.held))
            with self._progress:
                self._positions.update(frame.positions)
                self._progress.notify_all()
            return batch.records if batch is not None else 0

    def _apply(self, batch: Batch) -> None:
        ingested_at = now_ms()
        for shard, part in batch.shards.items():
            feed = self.feeds.get(shard)
            if feed is None:  # the reader reads only the held shards' partitions
                continue
            store = feed.store
            if part.offsets:
                # The reader parsed each record by the wire contract: decode() builds the ops unchecked.
                applied = store.apply(decode(part.ops), part.offsets, ingested_at_ms=ingested_at)
                self._unflushed.add(shard)
                if applied.copies:
                    feed.metrics.write_copies.inc(applied.copies)
                    log.info("shard %d: %d producer writes appended to the buffer again by their client library "
                             "(same id, value, headers and timestamp) applied once", shard, applied.copies)
            feed.metrics.pending.set(store.pending_count())
            feed.metrics.malformed_waiting.set(store.malformed_count)
            if part.settled:
                feed.on_settled(part.settled)
            if part.earliest_put is not None:
                feed.on_earlier_due(part.earliest_put)
        for op_name, count in batch.counts.items():
            if count:
                self.metrics.ingested.labels(op_name.decode()).inc(count)

    # -- where ingest stands ---------------------------------------------

    def _ask_ends(self) -> AskedEnds | None:
        try:
            return self.end_offsets.ask(timeout_s=LAG_CALL_S, partitions=list(self.partitions))
        except KafkaException as err:
            self._ends_failed(err)
            return None

    def _ends_failed(self, err: KafkaException) -> None:
        if self.failing is None:
            self.failing_since = time.monotonic()
            log.warning("cannot read the buffer's end offsets: %s", err.args[0].str())
        self.failing = f"cannot read the buffer's end offsets: {err.args[0].str()}"

    def refresh_lag(self, asked: AskedEnds) -> int | None:
        """Take the buffer's end offsets ``asked`` for (answered by now) as the shards' lag and readiness."""
        previous = self._end_offsets
        try:
            self._end_offsets = asked.result()
        except KafkaException as err:
            self._ends_failed(err)
            return self.lag
        if self.failing is not None:
            log.info("buffer end offsets readable again after %.1fs", time.monotonic() - (self.failing_since or 0))
            self.failing = self.failing_since = None
        positions = self.positions()
        for feed in list(self.feeds.values()):
            feed._saw_ends(self._end_offsets, previous, positions)
        self.lag = sum(max(0, end - positions.get(p, 0)) for p, end in self._end_offsets.items())
        stuck = self._standing_still(self._end_offsets, positions)
        if stuck:
            with self._lock:
                if not self._closed and self._reader is not None:
                    self._replace_reader(ReaderGone(
                        f"the buffer reader read nothing of partitions {stuck} for {READER_STUCK_S:.0f}s while Kafka "
                        f"had records there (last stable offsets {[self._end_offsets[p] for p in stuck]}, read up "
                        f"to {[positions.get(p, 0) for p in stuck]})"))
        return self.lag

    def _standing_still(self, ends: dict[int, int], positions: dict[int, int]) -> list[int]:
        """The partitions whose position has not moved for READER_STUCK_S while below their end (forgotten then)."""
        now = time.monotonic()
        standing, stuck = {}, []
        for p in self.partitions:  # the ends may be of partitions held when they were asked for
            position = positions.get(p, 0)
            if p not in ends or position >= ends[p] or p in self.held_for_upgrade:
                continue
            seen, since = self._standing.get(p, (position, now))
            if seen != position:
                since = now
            if now - since >= READER_STUCK_S:
                stuck.append(p)
            else:
                standing[p] = (position, since)
        self._standing = standing
        return stuck

    @property
    def reader_pid(self) -> int | None:
        """The process id of the buffer reader in use; None while none runs (no shard held, or one being replaced)."""
        reader = self._reader
        return reader.process.pid if reader is not None else None

    @property
    def caught_up(self) -> bool:
        """Caught up on every shard held (see :attr:`ShardFeed.caught_up`)."""
        return all(feed.caught_up for feed in list(self.feeds.values()))

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
        with self._lock:
            self._closed = True
            reader, self._reader = self._reader, None
        if reader is not None:
            reader.stop()
        self.ledger.close()
