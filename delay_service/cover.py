"""A shard master's cover: how far it has read each buffer partition, and up to when that covers every write.

The cancel guarantee (docs/DESIGN.md, "Cancel and reschedule guarantee"): before the master
delivers anything due at or before T, it has ingested the buffer up to high watermarks read
at or after T. :class:`Cutoff` keeps, per partition, the last such read ingest has reached;
:class:`ShardCover` reads the ends (:class:`Ends`), waits for ingest, lets a partition held
back by an open transaction lag one cover behind without holding the others, marks one held
by a transaction Kafka left open (through delivery's transaction, the ``mark`` it is given),
and picks only what each partition's cover covers.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from confluent_kafka import KafkaException

from delayq import wire
from delayq.clock import now_ms
from delayq.election import Term
from delayq.store import StoredEntry, TimeIndex

from .ingest import ShardFeed
from .metrics import ShardMetrics

# How long a partition may be held back by an open transaction before the master warns (it
# goes on waiting for it, and delivering from the other partitions: see ShardCover.cover).
OPEN_TRANSACTION_WARN_S = 5.0
# How long a partition may be held back by an open transaction before the master commits its
# partition mark there (wire.mark_id), and how often again while the hold lasts. Kafka can
# leave a transaction of the master's producer open on a partition for good (its markers
# lost over a broker restart): the mark ends it. Anyone else's transaction it leaves alone.
MARK_HELD_AFTER_S = 2.0
MARK_AGAIN_S = 5.0
# How long after its commit a transaction's own records are known to be the only ones above its first record
# (OwnWrites.trim): well under MARK_HELD_AFTER_S, so a transaction whose markers were lost is marked as soon.
OWN_TAIL_TRUST_S = 0.5
# How long a cover waits for a partition not known to be held back before it covers the others
# without it; and how often, while messages wait on a held partition, a cover looks at it again.
PARTIAL_COVER_S = 0.1
# A partition that has not moved on for this long counts in delayq_held_partitions.
HELD_GAUGE_S = 1.0
# How long one read of the buffer's end offsets for a cover waits (a ListOffsets takes milliseconds). A failed
# read is tried again through a new admin client, with new metadata: a read sent to the leader a broker had
# before it died waits for its whole timeout, and at 10 s the master's second read, sent just before the
# controllers fenced the dead broker, kept delivery 9.5 s behind Kafka (test_replicated_kafka).
END_OFFSETS_CALL_S = 2.0


class EndsUnreadable(KafkaException):
    """The buffer's end offsets could not be read for a cover: no transaction is open then.

    Delivery keeps its producer and waits for Kafka: a new producer's ``init_transactions`` would
    wait for the coordinator, and for the markers of whatever the last one left open, for seconds
    after the partitions had new leaders (2.3 s of test_replicated_kafka's stall after a broker was lost).
    """


@dataclass
class HeldCover:
    """A partition's oldest cover that ingest has not reached: an open transaction may hold it back."""

    read_at_ms: int
    target: int
    since_s: float  # monotonic: when the partition last moved on
    # It moved on at the last settle (to an older cover): lagging, not stuck, so covers wait for it again.
    moving: bool = False
    warned: bool = False
    marked_at: float | None = None  # monotonic: when the master last committed its mark there
    marks: int = 0  # how many marks this hold has had


class Cutoff:
    """How far the master has read each buffer partition, and the time before which that covers every write.

    ``partition_ms[p]``: a time at or before which partition p's high watermark was read,
    ``offsets[p]``; everything below it is ingested. Every record of p acknowledged by
    then is below it, so a message of p (its put, cancels, reschedules and `done`s all go
    to p) that falls due by then may be delivered. ``covers_ms``: the latest of those, what
    the next cover is measured against; ``uniform``: every partition is covered up to it.

    A partition ingest could not read up to the ends of a cover (an open transaction holds
    it back, or ingest lags) keeps that cover as ``held[p]``, and is covered up to it once
    ingest gets there: it moves on, one cover behind, even while the master's own writes
    keep moving its high watermark.
    """

    def __init__(self, partitions: Iterable[int]) -> None:
        self.partitions = list(partitions)
        self.covers_ms = -1
        self.partition_ms: dict[int, int] = {}
        self.offsets: dict[int, int] = {}
        self.uniform = True
        self.held: dict[int, HeldCover] = {}

    def awaited(self, targets: dict[int, int]) -> dict[int, int]:
        """The targets a cover waits for: all but those of the partitions stuck (all, if all are)."""
        return {p: end for p, end in targets.items()
                if p not in self.held or self.held[p].moving} or targets

    def settle(self, ends: Ends, positions: Mapping[int, int], now_s: float) -> set[int]:
        """Cover each partition as far as ingest (at ``positions``) has read; the partitions that moved on."""
        moved = set()
        for p, target in ends.targets.items():
            position = positions.get(p, 0)
            if position >= target:
                self._cover(p, ends.read_at_ms, target)
                self.held.pop(p, None)
                moved.add(p)
                continue
            held = self.held.get(p)
            if held is not None and position >= held.target:
                self._cover(p, held.read_at_ms, held.target)
                moved.add(p)
                self.held[p] = HeldCover(ends.read_at_ms, target, now_s, moving=True)
            elif held is None:
                self.held[p] = HeldCover(ends.read_at_ms, target, now_s)
            else:
                held.moving = False
        if moved:
            self.covers_ms = max(self.partition_ms.values())
            self.uniform = all(self.partition_ms.get(p) == self.covers_ms for p in self.partitions)
        return moved

    def stuck_for(self, seconds: float, now_s: float) -> int:
        """How many partitions have not moved on for ``seconds``."""
        return sum(1 for held in self.held.values() if now_s - held.since_s >= seconds)

    def newly_held_for(self, seconds: float, now_s: float) -> list[int]:
        """The partitions that have not moved on for ``seconds``, each returned once per hold."""
        found = sorted(p for p, held in self.held.items() if not held.warned and now_s - held.since_s >= seconds)
        for p in found:
            self.held[p].warned = True
        return found

    def due_for_mark(self, after_s: float, again_s: float, now_s: float) -> list[int]:
        """The partitions held for ``after_s`` and not marked for ``again_s``; they count as marked now."""
        found = sorted(p for p, held in self.held.items() if now_s - held.since_s >= after_s
                       and (held.marked_at is None or now_s - held.marked_at >= again_s))
        for p in found:
            self.held[p].marked_at = now_s
            self.held[p].marks += 1
        return found

    def _cover(self, partition: int, read_at_ms: int, target: int) -> None:
        self.partition_ms[partition] = read_at_ms
        self.offsets[partition] = target


@dataclass(frozen=True)
class Ends:
    """The buffer's high watermarks, read at ``read_at_ms``: the offsets a cover's ingest must reach.

    Every write acknowledged by ``read_at_ms`` is below them, including one behind an open
    transaction: a producer's, or a master's still being committed or aborted (after a
    broker restart that can take seconds). The last stable offset stops at such a
    transaction, so a cover up to it would miss a cancel acknowledged behind it. A
    read_committed reader reaches the high watermark once every transaction below it has ended.
    """

    read_at_ms: int
    targets: dict[int, int]


@dataclass
class TransactionWrites:
    """One transaction's buffer records: how many on each partition, and the offsets their reports gave."""

    counts: dict[int, int] = field(default_factory=dict)
    first: dict[int, int] = field(default_factory=dict)
    last: dict[int, int] = field(default_factory=dict)
    failed: set[int] = field(default_factory=set)

    def reported(self, error: Any, message: Any) -> None:
        """A delivery report (``on_delivery``) of one of the transaction's buffer records."""
        partition = message.partition()
        if error is not None:
            self.failed.add(partition)
            return
        offset = message.offset()
        if offset is None or offset < 0:
            # A batch the broker answered as a duplicate has no offsets (librdkafka reports -1 + i;
            # confluent-kafka gives None): nothing is known of where the records lie.
            self.failed.add(partition)
            return
        self.first[partition] = min(offset, self.first.get(partition, offset))
        self.last[partition] = max(offset, self.last.get(partition, offset))


class Tail(NamedTuple):
    """A committed transaction's contiguous records on one partition, and when its commit returned."""

    first: int
    last: int
    committed_at: float  # monotonic s


class OwnWrites:
    """Where the master's own committed transactions wrote on the buffer: what a cover need not wait for ingest to read.

    A cover waits until ingest has read every record below high watermarks read at or after
    the due time, but it is the other writers' records it must see (a cancel, a reschedule):
    the master's own are `done`s, next occurrences and copies of ids in flight until ingest
    reads them back. When a partition's high watermark is one past the last record the
    master's last committed transaction there wrote, and that transaction's records there
    are contiguous (its delivery reports give the first and last offsets, its count of
    records the rest), nobody else's record lies between the first of them and the high
    watermark, so reaching that first offset covers the partition: the cover no longer
    waits for the reader to consume, parse and apply the master's own last batch and the
    commit's markers (docs/DESIGN.md, "Cancel and reschedule guarantee").

    Filled from the producer's delivery reports (the committer thread, during the commit's
    flush); read by the delivery loop once the commit returned. Only a commit that
    returned counts: one that failed may have committed after all, its ids out of flight,
    so its `done`s must be read.
    """

    def __init__(self) -> None:
        # Last committed transaction's records per partition, where contiguous.
        self.tails: dict[int, Tail] = {}
        self.open = TransactionWrites()

    def begin(self) -> None:
        """A transaction begins: nothing of it is known yet (a late report of an earlier one goes to that one)."""
        self.open = TransactionWrites()

    def wrote(self, partition: int, records: int = 1) -> None:
        """The open transaction wrote ``records`` more to ``partition`` (the first and the last of them reported)."""
        counts = self.open.counts
        counts[partition] = counts.get(partition, 0) + records

    @property
    def reported(self) -> Callable[[Any, Any], None]:
        """The ``on_delivery`` of the open transaction's buffer records."""
        return self.open.reported

    def committed(self) -> None:
        """The open transaction's commit returned: its contiguous records become the partitions' tails."""
        written = self.open
        committed_at = time.monotonic()
        for partition, count in written.counts.items():
            first, last = written.first.get(partition), written.last.get(partition)
            if first is None or last is None or partition in written.failed or last - first + 1 != count:
                self.tails.pop(partition, None)  # not contiguous (or not all reported): ingest reads it all
            else:
                self.tails[partition] = Tail(first, last, committed_at)
        self.begin()

    def clear(self) -> None:
        """Nothing known: a commit failed, or the term's producer starts afresh."""
        self.tails = {}
        self.begin()

    def trim(self, ends: Ends) -> Ends:
        """``ends``; where a partition ends right after the master's last transaction there, at its first record.

        Only for OWN_TAIL_TRUST_S after the commit: its markers land within milliseconds. A
        partition whose end still stops right after the tail then has lost them (a broker
        restart), the transaction stays open there, and the hold it makes must show: held,
        it gets the partition mark, whose commit ends it (:meth:`ShardCover.held_by_transactions`).
        Trimmed for good, it would never be marked, and the transaction's own ids in flight
        (next occurrences, repairs) would wait until somebody else wrote there.
        """
        tails = self.tails
        if not tails:
            return ends
        trusted_since = time.monotonic() - OWN_TAIL_TRUST_S
        targets = {}
        for p, end in ends.targets.items():
            tail = tails.get(p)
            if tail is not None and end == tail.last + 1 and tail.committed_at >= trusted_since:
                end = tail.first
            targets[p] = end
        return Ends(ends.read_at_ms, targets)


class ShardCover:
    """The cover of one shard's master for one term (see the module's docstring).

    ``mark(term, partitions, targets)`` commits the partition mark to those of ``partitions``
    an open transaction holds (delivery's, which owns the producer).
    """

    def __init__(self, feed: ShardFeed, metrics: ShardMetrics, log: logging.LoggerAdapter,
                 mark: Callable[[Term, list[int], dict[int, int]], None], own: OwnWrites | None = None):
        self.feed = feed
        # Where the term's own transactions wrote (the delivery reports of its producer): see OwnWrites.
        self.own = own if own is not None else OwnWrites()
        self.metrics = metrics
        self.log = log
        self._mark = mark
        self.cutoff = Cutoff(feed.partitions)
        # Due ids of each held partition, not covered yet: left out of picks until it moves on
        # (kept across covers: a long hold's backlog is not walked again by every cover).
        self.uncovered: dict[int, set[str]] = {}
        self.retry_held_at = 0.0  # when (monotonic s) a cover next looks at the held partitions

    def reset(self) -> None:
        """Nothing covered: what the term's producer may have committed must be read first."""
        self.cutoff = Cutoff(self.feed.partitions)
        self.own.clear()
        self.uncovered.clear()

    def looks_again(self) -> bool:
        """Whether ids wait on a held partition and it is time to look at it again."""
        return bool(self.uncovered) and time.monotonic() >= self.retry_held_at

    def held_ids(self, skip: set[str]) -> set[str]:
        """``skip`` with the ids waiting on a held partition added."""
        for waiting in self.uncovered.values():
            skip |= waiting
        return skip

    def next_look_ms(self) -> int | None:
        """When to look at the held partitions again, if ids wait on one."""
        return now_ms() + int(PARTIAL_COVER_S * 1000) if self.uncovered else None

    def cover(self, term: Term, ends: Ends | None = None) -> bool:
        """Ingest the buffer up to end offsets read now (or ``ends``, read earlier); False if the term ended first.

        The clock is read before the offsets are asked for, so every write acknowledged
        by then is below them: what falls due by then may be delivered once they are read.

        Raises:
            KafkaException: the end offsets could not be read.
        """
        if ends is None:
            ends = self.read_ends()
        # Where only the master's last committed transaction lies between ingest and the end, its first record.
        ends = self.own.trim(ends)
        targets = ends.targets
        # A partition held back (see Cutoff) is not waited for: the others are covered without
        # it, and every cover looks at it again.
        awaited = self.cutoff.awaited(targets)
        settle_at = time.monotonic() + PARTIAL_COVER_S
        while term.active:
            done = self.feed.wait_until_read(awaited, PARTIAL_COVER_S, abandon=lambda: not term.active)
            if not done and time.monotonic() < settle_at:
                continue
            # Never covered short of its targets: a cancel acknowledged behind an open
            # transaction would lose to its message (see Ends).
            moved = self.cutoff.settle(ends, self.feed.positions(), time.monotonic())
            self.metrics.held_partitions.set(self.cutoff.stuck_for(HELD_GAUGE_S, time.monotonic()))
            to_mark = self.cutoff.due_for_mark(MARK_HELD_AFTER_S, MARK_AGAIN_S, time.monotonic())
            if to_mark:
                self._mark(term, to_mark, targets)
            long_held = self.cutoff.newly_held_for(OPEN_TRANSACTION_WARN_S, time.monotonic())
            if long_held:
                self._say_what_holds_back(long_held, targets)
            for p in moved:
                self.uncovered.pop(p, None)
            if moved:
                self.retry_held_at = time.monotonic() + PARTIAL_COVER_S
                return True
        return False

    def held_by_transactions(self, partitions: list[int], targets: dict[int, int]) -> list[int]:
        """Those of ``partitions`` an open transaction holds back: ingest is at their last stable offset.

        Raises:
            KafkaException: the last stable offsets could not be read.
        """
        stable = self.feed.read_ends(timeout_s=5.0)
        return self.feed.held_back({p: targets[p] for p in partitions}, stable)

    def _say_what_holds_back(self, long_held: list[int], targets: dict[int, int]) -> None:
        """Warn of partitions held back for long, and by what: an open transaction, or ingest lagging."""
        try:
            held = self.held_by_transactions(long_held, targets)
        except KafkaException as err:
            self.log.warning("buffer partitions %s: ingest has not reached their high watermarks for %.0fs (the last "
                        "stable offsets cannot be read: %s); what falls due there waits", long_held,
                        OPEN_TRANSACTION_WARN_S, err.args[0].str())
            return
        if held:
            self.log.warning("buffer partitions %s: a transaction is open there (a producer's, or a master's being "
                        "committed or aborted) with acknowledged writes behind it; for %.0fs what falls due there "
                        "has waited for it to end (the other partitions deliver)", held, OPEN_TRANSACTION_WARN_S)
        behind = [p for p in long_held if p not in held]
        if behind:
            self.log.warning("buffer partitions %s: ingest has not reached their high watermarks for %.0fs: it is "
                        "behind; what falls due there waits", behind, OPEN_TRANSACTION_WARN_S)

    def read_ends(self) -> Ends:
        """The high watermarks a cover waits for, read now (see :class:`Ends`).

        The clock is read first: every write acknowledged by then is below them.

        Raises:
            EndsUnreadable: the end offsets could not be read.
        """
        read_at = now_ms()
        try:
            return Ends(read_at, self.feed.read_ends(timeout_s=END_OFFSETS_CALL_S, committed=False))
        except KafkaException as err:
            raise EndsUnreadable(*err.args) from err

    def pick(self, store: TimeIndex, batch_size: int, skip: set[str]) -> list[StoredEntry] | None:
        """The next batch the cutoff covers, in due order; None if all it found waits on a held partition.

        While every partition is covered up to the same time (the usual case) that is the
        store's due entries; otherwise each is checked against its own partition's cover,
        and the ones not covered are left out until the next cover.
        """
        cutoff = self.cutoff
        entries = store.due(cutoff.covers_ms, batch_size, skip=skip)
        if cutoff.uniform or not entries:
            return entries
        count = self.feed.partition_count
        covered = cutoff.partition_ms
        picked = []
        for entry in entries:
            partition = wire.buffer_partition(entry.delay_id, count)
            if covered.get(partition, -1) >= entry.deliver_at_ms:
                picked.append(entry)
            else:
                self.uncovered.setdefault(partition, set()).add(entry.delay_id)
                skip.add(entry.delay_id)
        return picked or None

