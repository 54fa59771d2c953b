"""Delivery, on a shard's master only: the shard's due messages out, in Kafka transactions, exactly once.

Each batch is one transaction holding the deliveries to their target topics and a
``done`` tombstone per message on the buffer partition its put came from. The
producer uses the shard's ``transactional.id``, so a new master of the shard's
``init_transactions`` fences the shard's old one at the broker (and no other shard's). The master removes nothing
from its store itself: ingest does that when it reads the ``done`` back, so the
store stays a pure view of the buffer; until then, ids already delivered are skipped.

The cancel guarantee (docs/DESIGN.md, "Cancel and reschedule guarantee"): before it
delivers anything due at or before T, the master has ingested the buffer up to high
watermarks it read at or after T (reading committed records, so past every transaction
below them). A cancel or reschedule the producer saw acknowledged
before a message's due time is therefore in the store before the message is picked.
Each `done` records that cutoff offset, so the reconciliation can check the rule.

Faults: Kafka errors that can pass (a broker restarting, a leader moving) are waited
out inside the term, so a broker restart does not turn into an election storm; only a
fenced or fatally failed producer, or the end of the term, ends delivery.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for_future
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from delayq import wire
from delayq.clock import now_ms
from delayq.election import Cursor, CursorRecord, FencedError, Term
from delayq.settings import Settings
from delayq.store import TimeIndex

from . import stored
from .cover import MARK_HELD_AFTER_S, Cutoff, Ends, EndsUnreadable, ShardCover
from .dead_letters import produce_copy
from .ingest import ShardFeed
from .master_producer import SpareProducer
from .routing import Outgoing, Router, Undeliverable, expiry_of, is_expired, refusal_of

log = logging.getLogger("delayq.delivery")

MAX_IDLE_WAIT_S = 1.0
# How long to wait before trying again after a Kafka error that can pass.
KAFKA_RETRY_S = 0.5
# While a commit lasts and messages are falling due, how often the master reads the buffer's
# end offsets for the next cover (one ListOffsets round trip each).
EARLY_ENDS_INTERVAL_S = 0.002
# How often the master commits the dead-letter ledger's mark when no malformed record comes:
# well within Kafka's offsets.retention.minutes (7 days), after which the group's offsets expire.
LEDGER_REFRESH_S = 6 * 3600.0
# Malformed records dead-lettered per transaction.
DEAD_LETTER_BATCH = 1000
# How long a master ending its term waits to abort the transaction it left open (see _abandon_transaction).
ABANDON_TIMEOUT_S = 5.0
# One commit_transaction call: a commit that times out is resumed by calling again (_commit_resuming),
# so a short call only means the term is looked at more often while a broker is frozen or restarting.
COMMIT_CALL_S = 2.0
# A commit not confirmed this long ends the term: the next master's init_transactions settles the
# transaction (it completes a commit the coordinator has, aborts the rest), and this node can lead again
# in a new term, with a new producer, once Kafka answers. A commit takes milliseconds; after a broker
# was frozen, librdkafka can hold the records of one for a partition whose new leader it has "not found
# in cache" for 15 s and more (asking for metadata did not free them), while a new producer starts
# with fresh metadata. An abort, which would end it sooner, is refused while a commit is pending.
COMMIT_GIVE_UP_S = 6.0
# An abort that takes longer ends the term at once (the next master's init_transactions aborts for it):
# the transaction was not going to deliver anything anyway.
ABORT_TIMEOUT_S = 5.0
# A term's first init_transactions call, and the most any later one waits. A call that fails (times out) is
# tried again with a new producer, each call twice as long as the last: librdkafka keeps asking a transaction
# coordinator that died (its broker SIGKILLed) until that broker is back, long after Kafka moved the
# coordinator elsewhere, while a new producer finds the new one at once (7.5 s sooner in
# test_replicated_kafka); a slow but live coordinator gets longer and longer calls.
INIT_CALL_S = 3.0
INIT_CALL_MAX_S = 30.0
# How long closing the master's producer waits for what it still has to send (nothing, after a stuck transaction).
CLOSE_FLUSH_S = 5.0
# How often the master records its progress in ZooKeeper (`delayq status` shows it): a write per
# transaction would cost a ZooKeeper round trip per batch.
CURSOR_WRITE_S = 1.0


class ShardLog(logging.LoggerAdapter):
    """The delivery logger, each line starting with the shard it is about: ``shard 3: epoch 7: ...``."""

    def __init__(self, logger: logging.Logger, shard: int):
        super().__init__(logger, {"shard": shard})
        self.prefix = f"shard {shard}: "

    def process(self, msg, kwargs):
        return self.prefix + str(msg), kwargs


class LeadershipLost(Exception):
    """The term ended or the producer was fenced: stop delivering now."""


class TransactionStuck(LeadershipLost):
    """The term's transaction could be neither confirmed nor aborted in time (a broker frozen or restarting).

    The next master's ``init_transactions`` settles it; nothing more is waited for on this
    producer (an abort is refused while a commit is pending, and a flush waits for the same
    stuck records), so the shard's lock passes on at once.
    """


# Errors produce() raises for the record itself: retrying the same record cannot help.
_RECORD_ERRORS = frozenset({KafkaError.MSG_SIZE_TOO_LARGE, KafkaError._INVALID_ARG, KafkaError._UNKNOWN_PARTITION,
                            KafkaError._UNKNOWN_TOPIC})


class RecordRejected(Exception):
    """produce() refused one delivery for what it is (too large, ...): dead-letter it, deliver the rest."""

    def __init__(self, item: Outgoing, error: KafkaError):
        super().__init__(error.str())
        self.item = item
        self.error = error


class InFlight:
    """Ids the master committed a write for (a `done`, or a copy of a put) that ingest has not read back yet.

    Delivery adds ids just before it commits (ingest may read a record back before the
    commit call returns) and takes them back if the commit fails; ingest takes them out
    when it reads a `done`, a `cancel` or a master's copy of the id. Until then the
    master neither delivers nor repairs them.
    """

    def __init__(self) -> None:
        self._ids: set[str] = set()
        self._lock = threading.Lock()

    def add(self, ids: list[str]) -> None:
        with self._lock:
            self._ids.update(ids)

    def discard(self, ids: list[str]) -> None:
        with self._lock:
            self._ids.difference_update(ids)

    def snapshot(self) -> set[str]:
        with self._lock:
            return set(self._ids)


class Wakeup:
    """Lets ingest wake the sleeping master when it stores a message due sooner than it planned."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._planned_ms: int | None = None
        self._woken = False

    def sleep_until(self, due_ms: int | None, term: Term) -> None:
        with self._cond:
            self._planned_ms = due_ms
            self._woken = False
            timeout = MAX_IDLE_WAIT_S if due_ms is None else min(MAX_IDLE_WAIT_S, max(0, due_ms - now_ms()) / 1000)
            if timeout > 0 and term.active:
                self._cond.wait_for(lambda: self._woken or not term.active, timeout)
            self._planned_ms = None

    def earlier_due(self, due_ms: int) -> None:
        with self._cond:
            if self._planned_ms is None or due_ms < self._planned_ms:
                self._woken = True
                self._cond.notify_all()

    def poke(self) -> None:
        with self._cond:
            self._woken = True
            self._cond.notify_all()


@dataclass
class StartTimes:
    """When (monotonic s) the last try at a term's start began and passed each step: the
    "delivering" line says where a slow start went."""

    began: float = 0.0
    connected: float = 0.0  # the producer made and connected (or the spare taken)
    fenced: float = 0.0  # init_transactions returned

    def summary(self, won_at: float, now: float) -> str:
        return (f"{now - won_at:.2f}s after the election: producer {self.connected - self.began:.2f}s, "
                f"fencing {self.fenced - self.connected:.2f}s, reading the buffer {now - self.fenced:.2f}s")


class Delivery:
    """A shard master's loop for one term; build a new one per term.

    It sees the shard through its :class:`~delayq.delay_service.ingest.ShardFeed`: the
    shard's store, partitions and metrics, and where ingest stands there.
    """

    def __init__(self, settings: Settings, feed: ShardFeed, cursor: Cursor, wakeup: Wakeup, in_flight: InFlight,
                 spare: SpareProducer | None = None):
        self.settings = settings
        self.feed = feed
        self.shard = feed.shard
        self.store: TimeIndex = feed.store
        self.metrics = feed.metrics
        self.log = ShardLog(log, feed.shard)
        self.cursor = cursor
        self.wakeup = wakeup
        self.in_flight = in_flight
        # How far the shard's partitions are read, and up to when that covers every write.
        self.cover = ShardCover(feed, feed.metrics, self.log, self._mark_held)
        # Where each pick goes (now, after a dispatch limit, after a back-off, or to the dead letters).
        self.router = Router(settings, feed.shards, feed.store, self.log, lambda: self._txn_producer())
        self.delivered_total = 0
        self.producer: Producer | None = None
        # Where this term's producer comes from: made while the node waited in line, or now.
        self.spare = spare if spare is not None else SpareProducer(settings, feed.shard)
        # Why delivery cannot go on right now, since when (monotonic s); None while it can.
        self.failing: str | None = None
        self.failing_since: float | None = None
        # The dead-letter ledger's mark as this term last read or committed it, and when to commit it again.
        self._handled: dict[int, int] | None = None
        self._ledger_due = 0.0
        self._cursor_due = 0.0  # when (monotonic s) to write the cursor again
        self._last_commit: CursorRecord | None = None  # the last committed batch, and the last one written
        self._cursor_written: CursorRecord | None = None
        # Commits run here, so the loop can prepare the next batch, or read the next cover's
        # end offsets, while the broker commits (see _transaction).
        self._committer: ThreadPoolExecutor | None = None
        # Prepared while the last commit ran: the next batch (picked under the current cutoff),
        # or the end offsets read when the next message fell due.
        self._prepared: tuple[list[Outgoing], list[Undeliverable]] | None = None
        self._early_ends: Ends | None = None
        self._start_times = StartTimes()

    @property
    def cutoff(self) -> Cutoff:
        """The cover's cutoff now (each `done` records its partition's offset)."""
        return self.cover.cutoff

    # -- the term --------------------------------------------------------

    def run(self, term: Term) -> None:
        """Deliver until the term ends or the producer is fenced; never raises a Kafka error."""
        self.metrics.epoch.set(term.epoch)
        self._committer = ThreadPoolExecutor(1, thread_name_prefix="delayq-commit")
        stuck = False
        try:
            self.cursor.read()
            while term.active:
                if not self._start(term):
                    return
                self.log.info("epoch %d: buffer read to its end; delivering (%s)", term.epoch,
                              self._start_times.summary(term.won_at, time.monotonic()))
                try:
                    while term.active:
                        try:
                            self.deliver_due(term)
                        except EndsUnreadable as err:
                            self._passing_error(term, err)
                            continue
                        self._recovered()
                except KafkaException as err:
                    # Whatever state the transaction was left in, a new producer starts clean
                    # (its init_transactions aborts what this one left open).
                    self._close_producer()
                    self._passing_error(term, err)
        except TransactionStuck as err:
            self.log.warning("epoch %d: stopped delivering: %s", term.epoch, err)
            stuck = True
        except (LeadershipLost, FencedError) as err:
            self.log.log(logging.INFO if term.routine else logging.WARNING, "epoch %d: stopped delivering: %s",
                         term.epoch, err)
            self._abandon_transaction()
        except KafkaException as err:
            self.log.error("epoch %d: giving up leadership after a Kafka error: %s", term.epoch, err.args[0].str())
        finally:
            self._committer.shutdown(wait=True)
            self._committer = None
            self._prepared = self._early_ends = None
            self._close_producer(flush_s=0.0 if stuck else CLOSE_FLUSH_S)

    def _start(self, term: Term) -> bool:
        """Open the transactional producer (fencing the previous master) and read the buffer to its end.

        Errors that can pass (Kafka restarting) are retried while the term lasts; False if it ended first.
        """
        init_call_s = INIT_CALL_S
        fenced = False
        while term.active:
            try:
                if not fenced:
                    self._start_times = StartTimes(began=time.monotonic())
                    if self.producer is None:
                        self.producer = self.spare.take()
                    self._start_times.connected = time.monotonic()
                    # Fences the previous master and aborts its open transaction.
                    self.producer.init_transactions(init_call_s)
                    self._start_times.fenced = time.monotonic()
                    fenced = True
                # Nothing is covered until read again now: a transaction of this term whose
                # commit failed may have committed after all (init_transactions settled it),
                # and its `done`s must be read before its ids, no longer in flight, are picked.
                self.cover.reset()
                self._prepared = self._early_ends = None
                # After init_transactions no older master can commit, so once ingest reaches the
                # high watermarks (every transaction below them ended, an older master's committing
                # one included) every `done` of every committed delivery is in the store.
                if self.cover.cover(term):
                    # After init_transactions: no older master's transaction can still move the mark.
                    self._handled = self.feed.ledger.handled(self.feed.partitions)
                    self._ledger_due = 0.0
                    self._recovered()
                    return True
            except EndsUnreadable as err:
                self._passing_error(term, err)  # the fenced producer stays: no transaction is open
            except KafkaException as err:
                error: KafkaError = err.args[0]
                if error.fatal():
                    raise
                # A timed-out init_transactions leaves the producer unusable for another call.
                self._close_producer()
                fenced = False
                init_call_s = min(INIT_CALL_MAX_S, init_call_s * 2)
                self._passing_error(term, err)
        return False

    def _txn_producer(self) -> Producer:
        """The transactional producer of this term, which :meth:`_start` opened.

        Raises:
            RuntimeError: there is none (a write outside :meth:`run`'s delivery loop).
        """
        producer = self.producer
        if producer is None:
            raise RuntimeError("the master has no open producer: only the delivery loop of a term, after "
                               "_start(), writes to Kafka")
        return producer

    def _mark_held(self, term: Term, partitions: list[int], targets: dict[int, int]) -> None:
        """Commit the partition mark to those of ``partitions`` an open transaction holds back.

        No transaction of this term is open while a cover runs, and init_transactions ended
        every older one the coordinator knows: one of this producer's still open there is
        one Kafka left open for good (its markers lost over a broker restart). A partition
        ends a producer's open transaction with that producer's next marker, so the mark's
        commit ends it, committed: the coordinator had decided it (a commit whose markers
        were lost), and the master's deliveries to its target partitions will end it there
        the same way. Its `done`s close their ids then; those ids were never picked again,
        their partition being held. Another producer's transaction is left alone.

        Raises:
            KafkaException: the last stable offsets could not be read, or the commit failed.
        """
        held = self.cover.held_by_transactions(partitions, targets)
        if not held:
            return  # ingest lags there: nothing to end
        count = self.feed.partition_count
        self._txn_producer().begin_transaction()
        for partition in held:
            mark = wire.mark_id(partition, count)
            self._to_buffer(mark, partition, None, wire.done_headers(mark, 0, 0))
        self._commit_transaction(term, [])
        self.metrics.partition_marks.inc(len(held))
        cutoff = self.cover.cutoff
        first = any(p in cutoff.held and cutoff.held[p].marks == 1 for p in held)
        self.log.log(logging.WARNING if first else logging.INFO,
                "buffer partitions %s: a transaction held them open for %.0fs; committed the partition mark "
                "there, which ends one of this master's producer that Kafka left open (its markers lost, as over "
                "a broker restart); if the hold lasts, it is another producer's", held, MARK_HELD_AFTER_S)

    def _passing_error(self, term: Term, err: KafkaException) -> None:
        """Note a Kafka error that may pass, wait a little, and let the loop try again."""
        error: KafkaError = err.args[0]
        if error.fatal():
            raise LeadershipLost(f"the master's producer failed: {error.str()}") from err
        reason = f"Kafka error, retrying: {error.str()}"
        if self.failing is None:
            self.failing_since = time.monotonic()
            self.log.warning("epoch %d: %s", term.epoch, reason)
        self.failing = reason
        self.wakeup.sleep_until(now_ms() + int(KAFKA_RETRY_S * 1000), term)

    def _recovered(self) -> None:
        if self.failing is not None:
            self.log.info("delivery going again after %.1fs of Kafka errors",
                          time.monotonic() - (self.failing_since or 0))
            self.failing = self.failing_since = None

    # -- one batch -------------------------------------------------------

    def deliver_due(self, term: Term) -> int:
        """Deliver one batch of what is due (or sleep until something is); the number delivered.

        Raises:
            KafkaException: an error that may pass (the caller waits and calls again).
            LeadershipLost: the term ended or the producer was fenced.
        """
        prepared, self._prepared = self._prepared, None
        early_ends, self._early_ends = self._early_ends, None
        now = now_ms()
        skip = self._skip(now)
        if self.cutoff.covers_ms < now:
            first = self.store.due(now, 1, skip=skip)
            fell_due = bool(first) and first[0].deliver_at_ms > self.cutoff.covers_ms
            if fell_due or self.cover.looks_again():
                # Something fell due after the last cutoff (or waits on a held partition): read
                # the buffer up to now first, so a cancel or reschedule acknowledged before its
                # due time wins.
                if not self.cover.cover(term, early_ends):
                    return 0
                skip = self._skip(now)
                # Its `done`s would record the new cutoff, not the one it was picked under.
                prepared = None
        if self.store.malformed_count or time.monotonic() >= self._ledger_due:
            self._dead_letter_malformed(term)
        shadowed = self.store.shadowed()
        if shadowed.keys() - skip:
            self._repair(term, {i: copy for i, copy in shadowed.items() if i not in skip})
            skip = self._skip(now)
            prepared = None  # picked before the repair: pick again, leaving the repaired ids out
        # Messages that waited for their topic's dispatch limit, now within it (their ids are in skip still).
        released = self.router.release_waiting() if self.router.waiting else []
        if prepared is not None:
            outgoing = [item for item in prepared[0] if item.entry.delay_id not in skip]
            dead = [d for d in prepared[1] if d.item.entry.delay_id not in skip]
        else:
            entries = self.cover.pick(self.store, self.settings.delivery_batch_size, skip)
            if not entries and not released:
                if entries is None:
                    return 0  # only uncovered ones: pick again without them
                self._write_cursor(term.epoch)  # idle: the last batches' progress shows in `delayq status`
                self.wakeup.sleep_until(self._next_wake(skip), term)
                return 0
            outgoing, dead = self.router.route(entries or [], now)
        if released:
            fresh = []
            for item in released:  # an expiry that passed while the message waited for its dispatch limit
                if is_expired(item.pending.message, now):
                    dead.append(expiry_of(item, now))
                else:
                    fresh.append(item)
            outgoing = fresh + outgoing
        self._commit(term, outgoing, dead)
        return len(outgoing)

    def _skip(self, now: int) -> set[str]:
        """Ids not to pick now: in flight, in retry back-off, unreadable, or waiting on a held partition."""
        # The snapshot is a copy of its own: extended in place.
        return self.cover.held_ids(self.router.held(self.in_flight.snapshot(), now))

    def _next_wake(self, skip: set[str]) -> int | None:
        upcoming = self.store.due(2**62, 1, skip=skip)
        candidates = [t for t in (upcoming[0].deliver_at_ms if upcoming else None, self.router.next_try_ms(now_ms()),
                                  self.cover.next_look_ms()) if t is not None]
        return min(candidates, default=None)

    def _commit(self, term: Term, outgoing: list[Outgoing], dead: list[Undeliverable]) -> None:
        if not outgoing and not dead:
            return  # all in back-off: the next deliver_due() sleeps until the first retry
        try:
            self._transaction(term, outgoing, dead)
        except RecordRejected as rejected:
            self._abort(term)
            self.log.warning("message %s: Kafka refuses the record: %s", rejected.item.entry.delay_id,
                             rejected.error.str())
            rest = [item for item in outgoing if item is not rejected.item]
            self._commit(term, rest, [*dead, Undeliverable(rejected.item, wire.Reason.REJECTED,
                                                           f"Kafka refused the record: {rejected.error.str()}")])
        except KafkaException as err:
            error: KafkaError = err.args[0]
            if error.fatal() or not term.active:
                raise LeadershipLost(f"transaction failed: {error.str()}") from err
            if not error.txn_requires_abort() and not error.retriable():
                raise
            # Abort in place, never through a new producer: a master whose term ended unseen
            # (frozen past its session) would fence the new master with its init_transactions.
            self._abort(term)
            if not error.txn_requires_abort():
                # An error that may pass (a commit is resumed in _commit_resuming, so this is
                # one before it, or a commit given up as the term ended): deliver nothing of
                # the batch again until a fresh cover has read whatever of it may have committed.
                self.cover.reset()
                return
            if len(outgoing) + len(dead) > 1:
                # Find the record the broker rejects: deliver one per transaction.
                for item in outgoing:
                    self._commit(term, [item], [])
                for undeliverable in dead:
                    self._commit(term, [], [undeliverable])
                return
            now = now_ms()
            for item in outgoing:
                if self.router.give_up(item.entry.delay_id, f"rejected: {error.str()}", now):
                    self._commit(term, [], [refusal_of(item, error)])

    def _repair(self, term: Term, shadowed: dict[str, bytes | None]) -> None:
        """Make each shadowed id's newest buffer record say what is stored of it, before compaction.

        A pending id whose put a `done` of an older version follows gets its stored put
        written again (``restores=`` its version); a copy of a message no longer pending
        gets a `done` of the copy's version. One transaction; the ids are in flight until
        ingest reads the writes back (TimeIndex.shadowed has the rules).
        """
        writes: list[tuple[str, stored.PendingMessage, bool]] = []
        for delay_id, copy in shadowed.items():
            value = copy
            if value is None:
                entry = self.store.get(delay_id)
                if entry is None:
                    continue  # settled since the marks were read
                value = entry.payload
            try:
                writes.append((delay_id, stored.unpack(value), copy is None))
            except stored.MalformedStoredEntry as err:
                self.log.error("message %s: %s; not repairing it", delay_id, err)
                self.router.unreadable.add(delay_id)
        if not writes:
            return
        self._txn_producer().begin_transaction()
        for delay_id, pending, put_again in writes:
            m = pending.message
            if put_again:
                self._to_buffer(delay_id, pending.buffer_partition, m.buffer_value(restores=pending.version),
                                m.buffer_headers() or None, timestamp=m.created_at_ms)
            else:
                self._write_done(delay_id, pending)
        self._commit_transaction(term, [delay_id for delay_id, _, _ in writes])
        self.log.info("repaired %d shadowed ids in the buffer (a reschedule raced a done, or a write was appended "
                      "twice)", len(writes))

    def _transaction(self, term: Term, outgoing: list[Outgoing], dead: list[Undeliverable]) -> None:
        producer = self._txn_producer()
        epoch = term.epoch
        producer.begin_transaction()
        self._produce_deliveries(producer, epoch, outgoing)
        for undeliverable in dead:
            self._dead_letter(undeliverable, epoch)
            self._write_done(undeliverable.item.entry.delay_id, undeliverable.item.pending)
        ids = [i.entry.delay_id for i in outgoing] + [d.item.entry.delay_id for d in dead]
        self._commit_transaction(term, ids, overlap=True)
        committed_at = now_ms()
        self.router.delivered(ids)
        self.metrics.lateness.observe_many([max(0, committed_at - item.entry.deliver_at_ms) / 1000
                                            for item in outgoing])
        self.metrics.delivered.inc(len(outgoing))
        for undeliverable in dead:
            self.metrics.dead_lettered.labels(undeliverable.code.value).inc()
        self.delivered_total += len(outgoing)
        last = (outgoing or [d.item for d in dead])[-1].entry
        self._last_commit = CursorRecord(epoch=epoch, node_id=self.settings.node_id,
                                         watermark_deliver_at_ms=last.deliver_at_ms, last_id=last.delay_id,
                                         delivered=self.delivered_total, committed_at_ms=committed_at)
        if time.monotonic() >= self._cursor_due:
            self._write_cursor(epoch)

    def _write_cursor(self, epoch: int) -> None:
        """Record the last committed batch in ZooKeeper, if not yet (at most once a second while busy).

        Raises:
            FencedError: a newer master wrote the cursor.
        """
        record = self._last_commit
        if record is None or record is self._cursor_written or record.epoch != epoch:
            return
        self.cursor.write(record)
        self._cursor_written = record
        self._cursor_due = time.monotonic() + CURSOR_WRITE_S

    def _produce_deliveries(self, producer: Producer, epoch: int, outgoing: list[Outgoing]) -> None:
        """Each message to its target, and its `done` to the buffer, in the open transaction.

        The hot path of delivery (twice a produce() per message): each value is encoded once,
        the per-batch ones (epoch, cutoffs) before the loop.

        Raises:
            RecordRejected: produce() refused a record for what it is.
        """
        produce = producer.produce
        buffer_topic = self.settings.buffer_topic
        epoch_text = str(epoch).encode()
        cutoffs = {partition: str(offset).encode() for partition, offset in self.cutoff.offsets.items()}
        for item in outgoing:
            pending = item.pending
            m = pending.message
            id_bytes = item.entry.delay_id.encode()
            version = str(pending.version).encode()
            headers = wire.delivery_headers(m.headers, id_bytes, str(m.deliver_at_ms).encode(), epoch_text, version)
            if m.occurrence is not None or m.attempt is not None:
                headers += m.extra_delivery_headers()
            try:
                produce(m.topic, m.value, m.key, partition=item.target_partition, headers=headers)
            except KafkaException as err:
                if err.args[0].code() in _RECORD_ERRORS:
                    raise RecordRejected(item, err.args[0]) from err
                raise
            partition = pending.buffer_partition
            following = m.next_occurrence() if m.series is not None else None
            if following is not None:
                # A series' next occurrence replaces this one in the same transaction: a failover
                # neither skips nor repeats one. It replaces only this version (follows=): a cancel
                # or reschedule that came between wins (docs/DESIGN.md, "Repeating messages").
                value = following.buffer_value(follows=pending.version, cutoff=int(cutoffs.get(partition, b"0")))
                produce(buffer_topic, value, id_bytes, partition=partition, headers=following.buffer_headers() or None)
            else:
                produce(buffer_topic, None, id_bytes, partition=partition,
                        headers=wire.encoded_done_headers(id_bytes, version, cutoffs.get(partition, b"0")))

    def _commit_transaction(self, term: Term, ids: list[str], *, overlap: bool = False) -> None:
        """Commit the open transaction whose buffer writes concern ``ids``; they are in flight from now.

        With ``overlap``, the commit runs on the committer thread while this one prepares
        the next batch (:meth:`_while_committing`).

        Raises:
            LeadershipLost: the term ended before the commit.
            KafkaException: the commit failed (the ids are no longer in flight then).
        """
        if not term.active:
            raise LeadershipLost(term.ended_because or "term ended")
        producer = self._txn_producer()
        # Prepared during an earlier commit (the one-per-transaction retries commit several in
        # a row): picked with these ids out of flight, so never used now.
        self._prepared = self._early_ends = None
        # Marked before the commit: ingest may read a record back before commit returns.
        self.in_flight.add(ids)
        try:
            if overlap and self._committer is not None:
                commit = self._committer.submit(self._commit_resuming, producer, term)
                self._while_committing(commit)
                commit.result()
            else:
                self._commit_resuming(producer, term)
        except BaseException:
            self.in_flight.discard(ids)
            # Prepared on the assumption that these ids were delivered.
            self._prepared = self._early_ends = None
            raise

    def _commit_resuming(self, producer: Producer, term: Term) -> None:
        """``commit_transaction``, called again while it fails in a way that may pass (Kafka restarting).

        librdkafka resumes a commit that timed out when it is called again; an abort then
        would be refused ("conflicting commit_transaction API call is already in progress"),
        and the commit may have reached the coordinator all the same.

        Raises:
            KafkaException: the commit failed for good (fatal, or the transaction must be
                aborted).
            TransactionStuck: it may pass, but not within COMMIT_GIVE_UP_S, or the term ended.
        """
        started = time.monotonic()
        warned = False
        while True:
            try:
                producer.commit_transaction(COMMIT_CALL_S)
                if warned:
                    self.log.info("epoch %d: the commit was confirmed after %.1fs", term.epoch,
                                  time.monotonic() - started)
                return
            except KafkaException as err:
                error: KafkaError = err.args[0]
                if error.fatal() or error.txn_requires_abort() or not error.retriable():
                    raise
                waited = time.monotonic() - started
                if not term.active:
                    # An abort would wait behind the pending commit (5 s in test_replicated_kafka, while the
                    # shard's lock stayed held): the next master's init_transactions settles it instead.
                    raise TransactionStuck(f"the term ended while the commit was unconfirmed after {waited:.0f}s "
                                           f"({error.str()}): the next master settles it") from err
                if waited >= COMMIT_GIVE_UP_S:
                    raise TransactionStuck(f"the commit was not confirmed within {waited:.0f}s ({error.str()}): "
                                           "the next master settles it") from err
                if not warned:
                    self.log.warning("epoch %d: the commit is not confirmed yet (%s); resuming it", term.epoch,
                                     error.str())
                    warned = True

    def _while_committing(self, commit: Future[None]) -> None:
        """Use the time the broker takes to commit (the ids being committed are in flight already).

        If the next message due is covered already (a backlog), pick and route the next
        batch now; if not, wait until it falls due and read the end offsets its cover
        needs then, not after the commit: the cover's wait then overlaps the commit's.
        Never raises: whatever fails here is done again by the next deliver_due().
        """
        try:
            now = now_ms()
            skip = self._skip(now)
            upcoming = self.store.due(2**62, 1, skip=skip)
            if not upcoming:
                return
            due = upcoming[0].deliver_at_ms
            if due <= self.cutoff.covers_ms:
                entries = self.cover.pick(self.store, self.settings.delivery_batch_size, skip)
                if entries:
                    self._prepared = self.router.route(entries, now)
                return
            while not commit.done():
                wait_ms = due - now_ms()
                if wait_ms > 0:
                    wait_for_future([commit], timeout=wait_ms / 1000)
                    continue
                # Read again while the commit lasts: the later the read, the more it covers (a
                # cover up to them waits for this commit's markers).
                self._early_ends = self.cover.read_ends()
                wait_for_future([commit], timeout=EARLY_ENDS_INTERVAL_S)
        except Exception as err:  # the commit's outcome decides; the next batch starts afresh
            self.log.info("could not prepare the next batch during a commit: %s", err)
            self._prepared = self._early_ends = None

    def _write_done(self, delay_id: str, pending: stored.PendingMessage) -> None:
        """The `done` closing ``pending``'s version, with the cutoff it was picked under (0: none read there)."""
        partition = pending.buffer_partition
        self._to_buffer(delay_id, partition, None,
                        wire.done_headers(delay_id, pending.version, self.cutoff.offsets.get(partition, 0)))

    def _to_buffer(self, delay_id: str, partition: int, value: bytes | None, headers: wire.ProduceHeaders | None,
                   timestamp: int = 0) -> None:
        self._txn_producer().produce(self.settings.buffer_topic, key=delay_id.encode(), value=value,
                                     partition=partition, headers=headers, timestamp=timestamp)

    def _dead_letter(self, undeliverable: Undeliverable, epoch: int) -> None:
        item = undeliverable.item
        m = item.message
        reason = wire.reason_text(undeliverable.code, undeliverable.text)
        source = f"{self.settings.buffer_topic}/{item.pending.buffer_partition}/{item.pending.version}"
        produce_copy(self._txn_producer(), self.settings.dead_letter_topic, m.delay_id.encode(), m.buffer_value(),
                     [*m.buffer_headers(), (wire.EPOCH, str(epoch).encode()),
                      (wire.VERSION, str(item.pending.version).encode()),
                      (wire.DEAD_LETTER_REASON, reason.encode()), (wire.DEAD_LETTER_SOURCE, source.encode())])
        self.log.warning("message %s dead-lettered: %s", m.delay_id, reason)

    def _dead_letter_malformed(self, term: Term) -> None:
        """Dead-letter the malformed buffer records no master has yet, once per cluster (dead_letters.py).

        One transaction writes the copies and moves the ledger's mark past them; with
        none waiting it only moves the mark (at the start of a term, and every
        LEDGER_REFRESH_S, so the group's offsets never expire).

        Raises:
            KafkaException: an error that may pass (the caller waits and tries again).
            LeadershipLost: the term ended before the commit.
        """
        handled = dict(self._handled or {})
        # The offsets first: every malformed record below them is in the list read after them.
        positions = self.store.offsets()
        entries = self.store.malformed(DEAD_LETTER_BATCH)
        marks = dict(handled)
        if len(entries) < DEAD_LETTER_BATCH:
            for partition, offset in positions.items():
                marks[partition] = max(marks.get(partition, 0), offset)
        todo = []
        for entry in entries:
            marks[entry.partition] = max(marks.get(entry.partition, 0), entry.offset + 1)
            if entry.offset >= handled.get(entry.partition, 0):
                todo.append(entry)
        producer = self._txn_producer()
        copies: list[tuple[str, str]] = []
        producer.begin_transaction()
        for entry in todo:
            source = f"{self.settings.buffer_topic}/{entry.partition}/{entry.offset}"
            try:
                record = stored.unpack_malformed(entry.payload)
            except stored.MalformedStoredEntry as err:
                self.log.error("malformed buffer record %s: %s; not dead-lettered (the original is still there)",
                          source, err)
                continue
            produce_copy(producer, self.settings.dead_letter_topic, record.key, record.value,
                         [*record.headers, (wire.DEAD_LETTER_REASON, record.reason.encode()),
                          (wire.DEAD_LETTER_SOURCE, source.encode())])
            copies.append((source, record.reason))
        producer.send_offsets_to_transaction(
            [TopicPartition(self.settings.buffer_topic, p, o) for p, o in sorted(marks.items())],
            self.feed.ledger.group_metadata(), 30)
        if not term.active:
            raise LeadershipLost(term.ended_because or "term ended")
        self._commit_resuming(producer, term)
        self._handled = marks
        self._ledger_due = time.monotonic() + LEDGER_REFRESH_S
        self.store.forget_malformed(marks)
        self.metrics.malformed_waiting.set(self.store.malformed_count)
        for source, reason in copies:
            code = wire.Reason.of(reason)
            self.metrics.dead_lettered.labels(code.value if code else "unknown").inc()
            self.log.warning("buffer record %s is malformed, dead-lettered: %s", source, reason)

    def _abandon_transaction(self) -> None:
        """Abort the transaction the term left open (it ended before the batch's commit), if any.

        Left open, the next master's init_transactions would make the coordinator abort it,
        and librdkafka asks again only half a second later: a handover would take that long.
        Aborting delivers nothing, so it is safe whoever leads now; a fenced producer's abort,
        or one with no transaction open, fails at once, and the next master ends it instead.
        """
        producer = self.producer
        if producer is None:
            return
        try:
            producer.abort_transaction(ABANDON_TIMEOUT_S)
        except KafkaException as err:
            self.log.debug("no transaction to abort at the end of the term: %s", err.args[0].str())

    def _abort(self, term: Term) -> None:
        try:
            self._txn_producer().abort_transaction(ABORT_TIMEOUT_S)
        except KafkaException as err:
            raise TransactionStuck(f"abort failed: {err.args[0].str()}") from err

    def _close_producer(self, flush_s: float = CLOSE_FLUSH_S) -> None:
        producer, self.producer = self.producer, None
        if producer is None:
            return
        try:
            producer.flush(flush_s)
        except Exception as err:  # a fenced producer raises on every call; it is done with either way
            self.log.info("closing the master's producer: %s", err)
