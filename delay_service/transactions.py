"""A shard master's transactions: its term's transactional producer, what a transaction writes, and its commit.

Each delivery transaction holds the messages for their target topics and, on the buffer
partition each put came from, the record that settles it: a ``done`` tombstone of the
version delivered, or a repeating series' next occurrence in its place. Every such record
carries the cutoff offset its message was picked under (docs/DESIGN.md, "Cancel and
reschedule guarantee"), so the reconciliation can check the rule from the buffer alone.

The producer uses the shard's ``transactional.id``: a new master's ``init_transactions``
fences the shard's old one at the broker, and no other shard's. A commit that times out is
resumed, never aborted (librdkafka refuses an abort while a commit is pending, and the
commit may have reached the coordinator); one unconfirmed for longer than a broker stall
should last ends the term, and the next master's ``init_transactions`` settles it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from confluent_kafka import KafkaError, KafkaException, Producer

from delayq import wire
from delayq.election import Term
from delayq.settings import Settings

from . import stored
from .cover import OwnWrites
from .dead_letters import produce_copy
from .handoff import InFlight
from .master_producer import SpareProducer, retire_producer
from .routing import Outgoing, Undeliverable

# How long a master ending its term waits to abort the transaction it left open (see abandon).
ABANDON_TIMEOUT_S = 5.0
# One commit_transaction call: a commit that times out is resumed by calling again (commit_resuming),
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
# How long closing the master's producer waits for what it still has to send (nothing, after a stuck transaction).
CLOSE_FLUSH_S = 5.0
# init_transactions is called in slices this long and resumed after each (librdkafka goes on in the background
# and a call after a timed-out one resumes it there), so a term that ends meanwhile (the node stopping) stops
# waiting within this, not after the whole call (up to 30 s while a coordinator is lost).
FENCE_SLICE_S = 0.5
# A term's calls of init_transactions until the coordinator first answers. When the previous master left a
# transaction open (killed, or frozen past its session), the first ask makes the coordinator abort it and is
# answered CONCURRENT_TRANSACTIONS within milliseconds; librdkafka asks again only when its PID timer fires, half
# a second later, although the abort is done long before. A short call returns that answer (a call returns the
# last error when it times out), and the producer is closed and a second one, made while the node waited in line,
# fences at once (a killed master's shard delivered again 0.5 s later than after a handover).
FIRST_ASK_S = 0.05

# Errors produce() raises for the record itself: retrying the same record cannot help.
_RECORD_ERRORS = frozenset({KafkaError.MSG_SIZE_TOO_LARGE, KafkaError._INVALID_ARG, KafkaError._UNKNOWN_PARTITION,
                            KafkaError._UNKNOWN_TOPIC})


class LeadershipLost(Exception):
    """The term ended or the producer was fenced: stop delivering now."""


class TransactionStuck(LeadershipLost):
    """The term's transaction could be neither confirmed nor aborted in time (a broker frozen or restarting).

    The next master's ``init_transactions`` settles it; nothing more is waited for on this
    producer (an abort is refused while a commit is pending, and a flush waits for the same
    stuck records), so the shard's lock passes on at once.
    """


class RecordRejected(Exception):
    """produce() refused one delivery for what it is (too large, ...): dead-letter it, deliver the rest."""

    def __init__(self, item: Outgoing, error: KafkaError):
        super().__init__(error.str())
        self.item = item
        self.error = error


class ShardTransactions:
    """The term's transactional producer and the transactions it opens, writes and commits.

    It holds the producer; two other parts use it, never outside a term: the malformed
    copies write theirs into a transaction begun and committed here, and the router reads
    the target topics' metadata. ``in_flight`` gets each transaction's ids just
    before its commit (ingest may read a record back before the commit call returns) and
    loses them again if the commit fails.
    """

    def __init__(self, settings: Settings, shard: int, in_flight: InFlight, log: logging.LoggerAdapter,
                 spare: SpareProducer | None = None):
        self.settings = settings
        self.in_flight = in_flight
        self.log = log
        # Where each committed transaction wrote on the buffer (its delivery reports), for the cover.
        self.own_writes = OwnWrites()
        # Where the term's producer comes from: made while the node waited in line, or now.
        self.spare = spare if spare is not None else SpareProducer(settings, shard)
        self.producer: Producer | None = None
        # When the term's producer first asked the coordinator, and whether it has answered (fence).
        self._first_ask_at: float | None = None
        self._answered = False
        # Commits run here, so the master can prepare its next batch while the broker commits.
        self._committer: ThreadPoolExecutor | None = None

    # -- the producer over a term ---------------------------------------

    def begin_term(self) -> None:
        self._committer = ThreadPoolExecutor(1, thread_name_prefix="delayq-commit")

    def end_term(self, *, stuck: bool) -> None:
        """Stop the committer and close the producer (at once if a transaction is stuck in it)."""
        if self._committer is not None:
            self._committer.shutdown(wait=True)
            self._committer = None
        self.close(flush_s=0.0 if stuck else CLOSE_FLUSH_S)

    def take_producer(self) -> None:
        """Make this term's producer a spare one (made while the node waited in line), unless it has one.

        The other spare stays: :meth:`fence` needs it when the previous master left a transaction
        open, and otherwise it is the next term's.
        """
        if self.producer is None:
            self.producer = self.spare.take()
            self._first_ask_at, self._answered = None, False

    def fence(self, timeout_s: float, term: Term) -> None:
        """``init_transactions``: fences the shard's previous master and ends its open transaction.

        Waits at most ``timeout_s``, in calls of :data:`FENCE_SLICE_S` resumed while ``term`` lasts;
        calls of :data:`FIRST_ASK_S` until the coordinator first answers (for at most a slice). A first
        answer CONCURRENT_TRANSACTIONS (the coordinator aborting the transaction the previous master
        left open) closes the producer, and the other spare asks instead, at once, not after
        librdkafka's half-second PID timer.

        Raises:
            KafkaException: it failed, or timed out (after ``timeout_s``, or a slice once the term ended).
        """
        producer = self.open_producer()
        deadline = time.monotonic() + timeout_s
        while True:
            now = time.monotonic()
            if self._first_ask_at is None:
                self._first_ask_at = now
            short = not self._answered and now - self._first_ask_at < FENCE_SLICE_S
            try:
                producer.init_transactions(max(0.0, min(FIRST_ASK_S if short else FENCE_SLICE_S, deadline - now)))
                return
            except KafkaException as err:
                error: KafkaError = err.args[0]
                if error.code() == KafkaError.CONCURRENT_TRANSACTIONS and not self._answered and term.active:
                    producer = self._ask_with_the_spare(producer)
                    continue
                self._answered = self._answered or error.code() != KafkaError._TIMED_OUT
                if (error.code() != KafkaError._TIMED_OUT or not error.retriable() or not term.active
                        or time.monotonic() >= deadline):
                    raise

    def _ask_with_the_spare(self, asked: Producer) -> Producer:
        """Close ``asked`` (its PID timer pending) and make a spare this term's producer, to ask once more.

        Closed, ``asked`` never asks again: had it asked after the spare, it would fence it. So the
        spare waits until it is closed (at once: its close() has no transaction to abort, init_transactions
        being under way), not a bounded while: its PID timer fires half a second after its answer.
        """
        retire_producer(asked, until_closed=True)
        self.producer = None  # should take() raise, the term makes a new producer, never uses the closed one
        self.producer = self.spare.take()
        self._answered = True  # the spare asks at full length: the coordinator has ended the transaction by now
        return self.producer

    def open_producer(self) -> Producer:
        """The transactional producer of this term.

        Raises:
            RuntimeError: there is none (a write outside a term's delivery loop).
        """
        producer = self.producer
        if producer is None:
            raise RuntimeError("the master has no open producer: only the delivery loop of a term, after "
                               "take_producer() and fence(), writes to Kafka")
        return producer

    def abandon(self) -> None:
        """Abort the transaction the term left open (it ended before the batch's commit), if any.

        Left open, the next master's init_transactions would make the coordinator abort it,
        and librdkafka asks again only half a second later: a handover would take that long.
        Aborting delivers nothing, so it is safe whoever leads now; a fenced producer's abort,
        or one with no transaction open, fails at once, and the next master ends it instead.
        """
        if self.producer is None:
            return
        try:
            self.producer.abort_transaction(ABANDON_TIMEOUT_S)
        except KafkaException as err:
            self.log.debug("no transaction to abort at the end of the term: %s", err.args[0].str())

    def close(self, flush_s: float = CLOSE_FLUSH_S) -> None:
        """Flush what the producer still sends (for ``flush_s`` at most), then destroy it (:func:`retire_producer`)."""
        producer, self.producer = self.producer, None
        if producer is None:
            return
        try:
            producer.flush(flush_s)
        except Exception as err:  # a fenced producer raises on every call; it is done with either way
            self.log.info("closing the master's producer: %s", err)
        retire_producer(producer)

    # -- what a transaction writes ---------------------------------------

    def begin(self) -> None:
        self.open_producer().begin_transaction()
        self.own_writes.begin()

    def write_deliveries(self, epoch: int, outgoing: list[Outgoing], cutoffs: dict[int, int]) -> None:
        """Each message to its target, and the record settling it to the buffer, in the open transaction.

        The hot path of delivery (twice a produce() per message): each value is encoded once,
        the per-batch ones (epoch, cutoffs) before the loop. Of the buffer records, only the
        first and the last on each partition ask for a delivery report (:class:`OwnWrites`):
        each partition's newest one waits in ``last`` until the next one there, or the end.

        Raises:
            RecordRejected: produce() refused a record for what it is.
        """
        produce = self.open_producer().produce
        buffer_topic = self.settings.buffer_topic
        epoch_text = str(epoch).encode()
        cutoff_texts = {partition: str(offset).encode() for partition, offset in cutoffs.items()}
        own = self.own_writes
        reported = own.reported
        record: tuple[bytes | None, bytes, wire.ProduceHeaders | None] | None
        last: dict[int, tuple[bytes | None, bytes, wire.ProduceHeaders | None] | None] = {}
        counts: dict[int, int] = {}
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
                record = (following.buffer_value(follows=pending.version, cutoff=cutoffs.get(partition, 0)), id_bytes,
                          following.buffer_headers() or None)
            else:
                record = (None, id_bytes,
                          wire.encoded_done_headers(id_bytes, version, cutoff_texts.get(partition, b"0")))
            counts[partition] = counts.get(partition, 0) + 1
            if partition not in last:  # the first on its partition
                produce(buffer_topic, record[0], record[1], partition=partition, headers=record[2],
                        on_delivery=reported)
                last[partition] = None
            else:
                previous = last[partition]
                if previous is not None:
                    produce(buffer_topic, previous[0], previous[1], partition=partition, headers=previous[2])
                last[partition] = record
        for partition, record in last.items():
            if record is not None:
                produce(buffer_topic, record[0], record[1], partition=partition, headers=record[2],
                        on_delivery=reported)
        for partition, count in counts.items():
            own.wrote(partition, count)

    def write_done(self, delay_id: str, pending: stored.PendingMessage, cutoff: int) -> None:
        """The `done` closing ``pending``'s version, with the cutoff it was picked under (0: none read there)."""
        self.to_buffer(delay_id, pending.buffer_partition, None, wire.done_headers(delay_id, pending.version, cutoff))

    def write_put(self, delay_id: str, pending: stored.PendingMessage) -> None:
        """``pending`` written to the buffer again as its newest record (``restores=`` its version)."""
        m = pending.message
        self.to_buffer(delay_id, pending.buffer_partition, m.buffer_value(restores=pending.version),
                       m.buffer_headers() or None, timestamp=m.created_at_ms)

    def write_marks(self, partitions: list[int], partition_count: int) -> None:
        """The partition mark of each of ``partitions`` (a `done` of an id no message has)."""
        for partition in partitions:
            mark = wire.mark_id(partition, partition_count)
            self.to_buffer(mark, partition, None, wire.done_headers(mark, 0, 0))

    def dead_letter(self, undeliverable: Undeliverable, epoch: int) -> None:
        """The dead-letter copy of a message delayq will not deliver, with its reason code."""
        item = undeliverable.item
        m = item.message
        reason = wire.reason_text(undeliverable.code, undeliverable.text)
        source = f"{self.settings.buffer_topic}/{item.pending.buffer_partition}/{item.pending.version}"
        produce_copy(self.open_producer(), self.settings.dead_letter_topic, m.delay_id.encode(), m.buffer_value(),
                     [*m.buffer_headers(), (wire.EPOCH, str(epoch).encode()),
                      (wire.VERSION, str(item.pending.version).encode()),
                      (wire.DEAD_LETTER_REASON, reason.encode()), (wire.DEAD_LETTER_SOURCE, source.encode())])
        self.log.warning("message %s dead-lettered: %s", m.delay_id, reason)

    def to_buffer(self, delay_id: str, partition: int, value: bytes | None, headers: wire.ProduceHeaders | None,
                  timestamp: int = 0) -> None:
        self.open_producer().produce(self.settings.buffer_topic, key=delay_id.encode(), value=value,
                                     partition=partition, headers=headers, timestamp=timestamp,
                                     on_delivery=self.own_writes.reported)
        self.own_writes.wrote(partition)

    # -- commit and abort -----------------------------------------------

    def commit(self, term: Term, ids: list[str], *, during: Callable[[Future[None]], None] | None = None) -> None:
        """Commit the open transaction whose buffer writes concern ``ids``; they are in flight from now.

        With ``during``, the commit runs on the committer thread while ``during`` uses the
        time (it gets the commit's future and must not raise).

        Raises:
            LeadershipLost: the term ended before the commit.
            KafkaException: the commit failed (the ids are no longer in flight then).
        """
        if not term.active:
            raise LeadershipLost(term.ended_because or "term ended")
        # Marked before the commit: ingest may read a record back before commit returns.
        self.in_flight.add(ids)
        try:
            if during is not None and self._committer is not None:
                commit = self._committer.submit(self.commit_resuming, term)
                during(commit)
                commit.result()
            else:
                self.commit_resuming(term)
        except BaseException:
            self.in_flight.discard(ids)
            # It may have committed after all, its ids out of flight: the cover reads its records.
            self.own_writes.clear()
            raise
        self.own_writes.committed()

    def commit_resuming(self, term: Term) -> None:
        """``commit_transaction``, called again while it fails in a way that may pass (Kafka restarting).

        librdkafka resumes a commit that timed out when it is called again; an abort then
        would be refused ("conflicting commit_transaction API call is already in progress"),
        and the commit may have reached the coordinator all the same.

        Raises:
            KafkaException: the commit failed for good (fatal, or the transaction must be
                aborted).
            TransactionStuck: it may pass, but not within COMMIT_GIVE_UP_S, or the term ended.
        """
        producer = self.open_producer()
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

    def abort(self) -> None:
        """Abort the open transaction in place, never through a new producer.

        A master whose term ended unseen (frozen past its session) would fence the new
        master with a new producer's init_transactions.

        Raises:
            TransactionStuck: the abort failed or timed out (the next master's init_transactions aborts it).
        """
        try:
            self.open_producer().abort_transaction(ABORT_TIMEOUT_S)
        except KafkaException as err:
            raise TransactionStuck(f"abort failed: {err.args[0].str()}") from err
