"""Delivery, on a shard's master only: the shard's due messages out, in Kafka transactions, exactly once.

Each batch is one transaction holding the deliveries to their target topics and a
``done`` tombstone per message on the buffer partition its put came from
(transactions.py). A new master's ``init_transactions`` fences the shard's old one. The
master removes nothing from its store itself: ingest does that when it reads the
``done`` back, so the store stays a pure view of the buffer; until then, ids already
delivered are in flight (handoff.py) and skipped.

The cancel guarantee (docs/DESIGN.md, "Cancel and reschedule guarantee"): before it
delivers anything due at or before T, the master has ingested the buffer up to high
watermarks it read at or after T (reading committed records, so past every transaction
below them): the cover (cover.py). A cancel or reschedule the producer saw acknowledged
before a message's due time is therefore in the store before the message is picked.
Each `done` records that cutoff offset, so the reconciliation can check the rule.

Faults: Kafka errors that can pass (a broker restarting, a leader moving) are waited
out inside the term, so a broker restart does not turn into an election storm; only a
fenced or fatally failed producer, or the end of the term, ends delivery.

This module is the loop; each part it drives owns its state: the cover (what is read,
up to when), the router (where each pick goes: now, after a dispatch limit or back-off,
or to the dead letters), the transactions (the producer, what a transaction writes, its
commit), the lookahead (what is prepared during a commit), the malformed copies, the
shadow repairs and the progress (metrics and cursor).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException

from delayq import wire
from delayq.clock import now_ms
from delayq.election import Cursor, FencedError, Term
from delayq.settings import Settings

from .cover import MARK_HELD_AFTER_S, Cutoff, EndsUnreadable, ShardCover
from .handoff import InFlight, Wakeup
from .ingest import ShardFeed
from .lookahead import Lookahead
from .malformed import MalformedCopies
from .master_producer import SpareProducer
from .progress import Progress
from .repairs import ShadowRepair
from .routing import Outgoing, Router, Undeliverable, expiry_of, is_expired, refusal_of
from .transactions import LeadershipLost, RecordRejected, ShardTransactions, TransactionStuck

log = logging.getLogger("delayq.delivery")

# How long to wait before trying again after a Kafka error that can pass.
KAFKA_RETRY_S = 0.5
# A term's first init_transactions call, and the most any later one waits. A call that fails (times out) is
# tried again with a new producer, each call twice as long as the last: librdkafka keeps asking a transaction
# coordinator that died (its broker SIGKILLed) until that broker is back, long after Kafka moved the
# coordinator elsewhere, while a new producer finds the new one at once (7.5 s sooner in
# test_replicated_kafka); a slow but live coordinator gets longer and longer calls.
INIT_CALL_S = 3.0
INIT_CALL_MAX_S = 30.0
# What an init_transactions call that timed out says when the coordinator did answer: it was still ending the
# previous master's transaction (whose partitions wait for new leaders after a broker was lost) or loading its
# log after it moved. librdkafka goes on in the background and the same producer's next call resumes there;
# a new producer would start over (find the coordinator, ask again), a second lost after the broker's loss.
COORDINATOR_BUSY = frozenset({KafkaError.CONCURRENT_TRANSACTIONS, KafkaError.COORDINATOR_LOAD_IN_PROGRESS})


class ShardLog(logging.LoggerAdapter):
    """The delivery logger, each line starting with the shard it is about: ``shard 3: epoch 7: ...``."""

    def __init__(self, logger: logging.Logger, shard: int):
        super().__init__(logger, {"shard": shard})
        self.prefix = f"shard {shard}: "

    def process(self, msg, kwargs):
        return self.prefix + str(msg), kwargs


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
        self.store = feed.store
        self.metrics = feed.metrics
        self.log = ShardLog(log, feed.shard)
        self.cursor = cursor
        self.wakeup = wakeup
        self.in_flight = in_flight
        self.transactions = ShardTransactions(settings, feed.shard, in_flight, self.log, spare)
        self.cover = ShardCover(feed, feed.metrics, self.log, self._mark_held, self.transactions.own_writes)
        self.router = Router(settings, feed.shards, feed.store, self.log, self.transactions.open_producer)
        self.lookahead = Lookahead(feed.store, self.cover, self.router, settings.delivery_batch_size, self._skip,
                                   self.log)
        self.malformed = MalformedCopies(settings, feed, self.transactions, self.log)
        self.repair = ShadowRepair(feed.store, self.transactions, self.router.unreadable, self.log)
        self.progress = Progress(settings.node_id, cursor, feed.metrics)
        # Why delivery cannot go on right now, since when (monotonic s); None while it can.
        self.failing: str | None = None
        self.failing_since: float | None = None
        self._start_times = StartTimes()

    @property
    def cutoff(self) -> Cutoff:
        """The cover's cutoff now (each `done` records its partition's offset)."""
        return self.cover.cutoff

    # -- the term --------------------------------------------------------

    def run(self, term: Term) -> None:
        """Deliver until the term ends or the producer is fenced; never raises a Kafka error."""
        self.metrics.epoch.set(term.epoch)
        self.transactions.begin_term()
        stuck = False
        try:
            self.cursor.read()
            while term.active:
                if not self.start(term):
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
                    self.transactions.close()
                    self._passing_error(term, err)
        except TransactionStuck as err:
            self.log.warning("epoch %d: stopped delivering: %s", term.epoch, err)
            stuck = True
        except (LeadershipLost, FencedError) as err:
            self.log.log(logging.INFO if term.routine else logging.WARNING, "epoch %d: stopped delivering: %s",
                         term.epoch, err)
            self.transactions.abandon()
        except KafkaException as err:
            self.log.error("epoch %d: giving up leadership after a Kafka error: %s", term.epoch, err.args[0].str())
        finally:
            self.lookahead.drop()
            self.transactions.end_term(stuck=stuck)

    def start(self, term: Term) -> bool:
        """Open the transactional producer (fencing the previous master) and read the buffer to its end.

        Errors that can pass (Kafka restarting) are retried while the term lasts; False if it ended first.
        """
        init_call_s = INIT_CALL_S
        fenced = resuming = False
        while term.active:
            try:
                if not fenced:
                    if not resuming:
                        self._start_times = StartTimes(began=time.monotonic())
                        self.transactions.take_producer()
                        self._start_times.connected = time.monotonic()
                    self.transactions.fence(init_call_s, term)
                    self._start_times.fenced = time.monotonic()
                    fenced = True
                # Nothing is covered until read again now: a transaction of this term whose
                # commit failed may have committed after all (init_transactions settled it),
                # and its `done`s must be read before its ids, no longer in flight, are picked.
                self.cover.reset()
                self.lookahead.drop()
                # After init_transactions no older master can commit, so once ingest reaches the
                # high watermarks (every transaction below them ended, an older master's committing
                # one included) every `done` of every committed delivery is in the store.
                if self.cover.cover(term):
                    self.malformed.read_mark()
                    self._recovered()
                    return True
            except EndsUnreadable as err:
                self._passing_error(term, err)  # the fenced producer stays: no transaction is open
            except KafkaException as err:
                error: KafkaError = err.args[0]
                if error.fatal():
                    raise
                resuming = not fenced and error.code() in COORDINATOR_BUSY
                if resuming:
                    self._note_failing(term, err)  # the call itself waited: call again at once
                    continue
                # The coordinator did not answer: a new producer finds where Kafka moved it (INIT_CALL_S).
                self.transactions.close()
                fenced = False
                init_call_s = min(INIT_CALL_MAX_S, init_call_s * 2)
                self._passing_error(term, err)
        return False

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
        self.transactions.begin()
        self.transactions.write_marks(held, self.feed.partition_count)
        self._commit_transaction(term, [])
        self.metrics.partition_marks.inc(len(held))
        cutoff = self.cover.cutoff
        first = any(p in cutoff.held and cutoff.held[p].marks == 1 for p in held)
        self.log.log(logging.WARNING if first else logging.INFO,
                     "buffer partitions %s: a transaction held them open for %.0fs; committed the partition mark "
                     "there, which ends one of this master's producer that Kafka left open (its markers lost, as "
                     "over a broker restart); if the hold lasts, it is another producer's", held, MARK_HELD_AFTER_S)

    def _passing_error(self, term: Term, err: KafkaException) -> None:
        """Note a Kafka error that may pass, wait a little, and let the loop try again."""
        error: KafkaError = err.args[0]
        if error.fatal():
            raise LeadershipLost(f"the master's producer failed: {error.str()}") from err
        self._note_failing(term, err)
        self.wakeup.sleep_until(now_ms() + int(KAFKA_RETRY_S * 1000), term)

    def _note_failing(self, term: Term, err: KafkaException) -> None:
        """Say once that Kafka errors keep delivery from going (`/readyz` says it while they last)."""
        reason = f"Kafka error, retrying: {err.args[0].str()}"
        if self.failing is None:
            self.failing_since = time.monotonic()
            self.log.warning("epoch %d: %s", term.epoch, reason)
        self.failing = reason

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
        prepared, early_ends = self.lookahead.take()
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
        if self.malformed.due:
            self.malformed.copy(term)
        shadowed = self.store.shadowed()
        if shadowed.keys() - skip:
            self.repair.repair(term, {i: copy for i, copy in shadowed.items() if i not in skip}, self.cutoff.offsets)
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
                self.progress.write_cursor(term.epoch)  # idle: the last batches' progress shows in `delayq status`
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
        self.commit(term, outgoing, dead)
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

    def commit(self, term: Term, outgoing: list[Outgoing], dead: list[Undeliverable]) -> None:
        """Deliver ``outgoing`` and dead-letter ``dead`` in one transaction, meeting each kind of failure.

        A record Kafka refuses for what it is is dead-lettered and the rest delivered; a
        transaction that must be aborted is tried one message per transaction to find the
        record the broker rejects; an error that may pass delivers nothing of the batch
        again until a fresh cover has read whatever of it may have committed.

        Raises:
            KafkaException: an error that may pass (the caller waits and calls again).
            LeadershipLost: the term ended, the producer was fenced, or an abort failed.
        """
        if not outgoing and not dead:
            return  # all in back-off: the next deliver_due() sleeps until the first retry
        try:
            self._transaction(term, outgoing, dead)
        except RecordRejected as rejected:
            self.transactions.abort()
            self.log.warning("message %s: Kafka refuses the record: %s", rejected.item.entry.delay_id,
                             rejected.error.str())
            rest = [item for item in outgoing if item is not rejected.item]
            self.commit(term, rest, [*dead, Undeliverable(rejected.item, wire.Reason.REJECTED,
                                                          f"Kafka refused the record: {rejected.error.str()}")])
        except KafkaException as err:
            error: KafkaError = err.args[0]
            if error.fatal() or not term.active:
                raise LeadershipLost(f"transaction failed: {error.str()}") from err
            if not error.txn_requires_abort() and not error.retriable():
                raise
            self.transactions.abort()
            if not error.txn_requires_abort():
                # One before the commit (a commit is resumed in commit_resuming), or a commit
                # given up as the term ended.
                self.cover.reset()
                return
            if len(outgoing) + len(dead) > 1:
                for item in outgoing:
                    self.commit(term, [item], [])
                for undeliverable in dead:
                    self.commit(term, [], [undeliverable])
                return
            now = now_ms()
            for item in outgoing:
                if self.router.give_up(item.entry.delay_id, f"rejected: {error.str()}", now):
                    self.commit(term, [], [refusal_of(item, error)])

    def _transaction(self, term: Term, outgoing: list[Outgoing], dead: list[Undeliverable]) -> None:
        cutoffs = self.cutoff.offsets
        self.transactions.begin()
        self.transactions.write_deliveries(term.epoch, outgoing, cutoffs)
        for undeliverable in dead:
            item = undeliverable.item
            self.transactions.dead_letter(undeliverable, term.epoch)
            partition = item.pending.buffer_partition
            self.transactions.write_done(item.entry.delay_id, item.pending, cutoffs.get(partition, 0))
        ids = [i.entry.delay_id for i in outgoing] + [d.item.entry.delay_id for d in dead]
        self._commit_transaction(term, ids, overlap=True)
        self.router.delivered(ids)
        self.progress.committed(term.epoch, outgoing, dead)

    def _commit_transaction(self, term: Term, ids: list[str], *, overlap: bool = False) -> None:
        """Commit the open transaction (ids in flight from now), preparing the next batch meanwhile with ``overlap``.

        Whatever was prepared during an earlier commit (the one-per-transaction retries
        commit several in a row) was picked with these ids out of flight: dropped before,
        and again if the commit fails (prepared on the assumption that these ids were delivered).
        """
        self.lookahead.drop()
        try:
            self.transactions.commit(term, ids, during=self.lookahead.during if overlap else None)
        except BaseException:
            self.lookahead.drop()
            raise
