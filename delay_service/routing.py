"""Where a shard master's picked messages go: their target partitions, the dispatch limits, attempts and dead letters.

The :class:`Router` owns what delivery keeps about messages between batches: those waiting
for their topic's dispatch limit (in due order, their ids out of the picks), the attempts of
those Kafka refused for a while (their back-off), the ids whose stored value cannot be read,
and the target topics' partition counts. It decides, per picked message, to deliver it now,
to let it wait, to try it again later, or to dead-letter it with a reason code; it writes
nothing to Kafka (transactions.py writes what the delivery loop decides).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from confluent_kafka import KafkaError, Producer

from delayq import wire
from delayq.settings import Settings
from delayq.store import StoredEntry, TimeIndex

from . import stored
from .limits import DispatchLimiter
from .partitioners import partition_for

# How long a target topic's partition count is trusted before it is asked again.
TOPIC_CACHE_S = 30.0


def denied_text(topic: str) -> str:
    """Why a target the nodes' principal may not write is dead-lettered (forbidden-topic), and the fix."""
    return (f"Kafka denies the nodes' principal writing to {topic} (TOPIC_AUTHORIZATION_FAILED): grant it "
            f"(delayq acls --node User:NAME --targets {topic} --apply), or leave {topic} out of target_topics")


def refusal_of(item: Outgoing, error: KafkaError) -> Undeliverable:
    """A delivery the broker kept refusing, as it is dead-lettered: an ACL missing for the target is forbidden-topic."""
    if error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
        return Undeliverable(item, wire.Reason.FORBIDDEN_TOPIC, denied_text(item.message.topic))
    return Undeliverable(item, wire.Reason.REJECTED, f"Kafka refused the record: {error.str()}")


@dataclass
class Retry:
    attempts: int
    next_try_ms: int
    reason: str


@dataclass
class Undeliverable:
    """A message the master gives up on: dead-lettered with its reason code and text, and closed by a `done`."""

    item: Outgoing
    code: wire.Reason
    text: str


def is_expired(message: wire.Envelope, now: int) -> bool:
    """Whether ``message`` (picked at ``now``) may no longer be delivered: its ``expires=`` time has passed."""
    return message.expires_at_ms is not None and now > message.expires_at_ms


def expiry_of(item: Outgoing, now: int) -> Undeliverable:
    """The dead letter of an expired message (``is_expired``)."""
    m = item.pending.message
    assert m.expires_at_ms is not None  # is_expired said so
    return Undeliverable(item, wire.Reason.EXPIRED,
                         f"picked {now - m.deliver_at_ms} ms after its due time {m.deliver_at_ms}, past its expiry "
                         f"{m.expires_at_ms} (expires=, {m.expires_at_ms - m.deliver_at_ms} ms after the due time)")


@dataclass(slots=True)
class Outgoing:
    entry: StoredEntry
    pending: stored.PendingMessage
    target_partition: int

    @property
    def message(self) -> wire.Envelope:
        return self.pending.message


class Router:
    """Routes one shard master's picks: deliver now, wait for a dispatch limit, try again later, or dead-letter.

    ``producer`` gives the term's producer, whose metadata says the target topics' partitions.
    """

    def __init__(self, settings: Settings, shards: int, store: TimeIndex, log: logging.LoggerAdapter,
                 producer: Callable[[], Producer]):
        self.settings = settings
        self.store = store
        self.log = log
        self._producer = producer
        self.retries: dict[str, Retry] = {}
        # Dispatch limits: this shard's part of each limited topic's rate, and the messages
        # picked over it, waiting in due order for their topic's bucket (their ids left out of picks).
        self.limiter = DispatchLimiter(settings, shards)
        self.waiting: dict[str, deque[Outgoing]] = {}
        self.waiting_ids: set[str] = set()
        # Ids whose stored value this node cannot read (a damaged store): never picked again this term.
        self.unreadable: set[str] = set()
        self._topics: dict[str, tuple[float, int | None]] = {}
        self._denied_topics: set[str] = set()  # targets Kafka says the nodes' principal may not see (no ACL)

    def held(self, skip: set[str], now: int) -> set[str]:
        """``skip`` with the ids not to pick now added: waiting for a limit, unreadable, in retry back-off."""
        if self.waiting_ids:
            # The messages waiting for a dispatch limit can be many: a union copies them as a block
            # (set | set), where adding them to the small set would insert them one by one.
            skip = self.waiting_ids | skip
        if self.unreadable:
            skip |= self.unreadable
        if self.retries:
            skip.update(i for i, r in self.retries.items() if r.next_try_ms > now)
        return skip

    def next_try_ms(self, now: int) -> int | None:
        """When a message held here may go next: its retry's time, or its topic's bucket refilled; None: none held."""
        times = [r.next_try_ms for r in self.retries.values()]
        if self.waiting:  # when the first topic over its limit may deliver again
            times.append(now + 1 + int(1000 * min(self.limiter.release_in(t) for t in self.waiting)))
        return min(times, default=None)

    def delivered(self, ids: Iterable[str]) -> None:
        """These ids were committed: their attempts are over."""
        if self.retries:
            for delay_id in ids:
                self.retries.pop(delay_id, None)

    def route(self, entries: list[StoredEntry], now: int) -> tuple[list[Outgoing], list[Undeliverable]]:
        outgoing, dead = [], []
        counts: dict[str, int | None] = {}  # this batch's partition counts: one cache lookup per topic
        refusals: dict[str, str | None] = {}  # and why a topic is forbidden (None: it is not), once per topic
        limited = self.limiter.active
        for entry in entries:
            try:
                pending = stored.unpack(entry.payload)
            except stored.MalformedStoredEntry as err:
                self.log.error("message %s: %s; leaving it out", entry.delay_id, err)
                self.unreadable.add(entry.delay_id)
                continue
            message = pending.message
            if message.expires_at_ms is not None and is_expired(message, now):
                dead.append(expiry_of(Outgoing(entry, pending, message.partition or 0), now))
                continue
            topic = message.topic
            if topic in refusals:
                forbidden = refusals[topic]
            else:
                forbidden = refusals[topic] = self.settings.forbidden_target(topic)
            if forbidden is not None:
                # Never delivered, never retried: the buffer's writer may not reach this topic through delayq.
                item = Outgoing(entry, pending, message.partition if message.partition is not None else 0)
                dead.append(Undeliverable(item, wire.Reason.FORBIDDEN_TOPIC, forbidden))
                continue
            if topic in counts:
                count = counts[topic]
            else:
                count = counts[topic] = self.partition_count(topic)
            problem: tuple[wire.Reason, str] | None = None
            if count is None and topic in self._denied_topics:
                problem = wire.Reason.FORBIDDEN_TOPIC, denied_text(topic)
            elif count is None:
                problem = wire.Reason.MISSING_TOPIC, f"target topic {topic} does not exist"
            elif message.partition is not None and message.partition >= count:
                problem = (wire.Reason.BAD_PARTITION,
                           f"partition {message.partition} of {topic} does not exist (it has {count})")
            if message.partition is not None:
                target = message.partition
            else:
                target = partition_for(message.key, count or 1, message.partitioner)
            item = Outgoing(entry, pending, target)
            if problem is not None:
                if self.give_up(entry.delay_id, problem[1], now):
                    dead.append(Undeliverable(item, *problem))
            elif limited and (topic in self.waiting or not self.limiter.take(topic)):
                # Over its topic's dispatch limit: it waits, behind the earlier ones, for the bucket to refill.
                self.waiting.setdefault(topic, deque()).append(item)
                self.waiting_ids.add(entry.delay_id)
            else:
                outgoing.append(item)
        return outgoing, dead

    def release_waiting(self) -> list[Outgoing]:
        """The waiting messages whose topics' buckets have refilled, as many as the buckets allow, in due order.

        Each is checked against the store first: one cancelled or rescheduled while it waited
        is dropped (the store offers its new version to the next pick).
        """
        released: list[Outgoing] = []
        room = self.settings.delivery_batch_size
        for topic, queue in list(self.waiting.items()):
            if self.limiter.released(topic):
                while queue and len(released) < room and self.limiter.take(topic):
                    item = queue.popleft()
                    self.waiting_ids.discard(item.entry.delay_id)
                    stored_now = self.store.get(item.entry.delay_id)
                    if stored_now is None or stored_now.version != item.pending.version:
                        self.limiter.give_back(topic)
                        continue
                    released.append(item)
            if not queue:
                del self.waiting[topic]
        return released

    def give_up(self, delay_id: str, reason: str, now: int) -> bool:
        """Count one failed attempt; True when the message has had all its attempts."""
        retry = self.retries.get(delay_id)
        attempts = 1 if retry is None else retry.attempts + 1
        if attempts >= self.settings.delivery_max_attempts:
            return True
        backoff = self.settings.delivery_retry_backoff_ms * 2 ** (attempts - 1)
        self.retries[delay_id] = Retry(attempts, now + backoff, reason)
        self.log.info("message %s: %s; attempt %d, retrying in %d ms", delay_id, reason, attempts, backoff)
        return False

    def partition_count(self, topic: str) -> int | None:
        """The partition count of target ``topic`` (cached for TOPIC_CACHE_S); None if it cannot be delivered to."""
        cached = self._topics.get(topic)
        if cached is not None and time.monotonic() - cached[0] < TOPIC_CACHE_S and cached[1] is not None:
            return cached[1]
        metadata = self._producer().list_topics(topic, timeout=10).topics.get(topic)
        count = None
        if metadata is not None and metadata.error is None and metadata.partitions:
            count = len(metadata.partitions)
        # A topic the nodes' principal may not describe looks missing; Kafka says which it is.
        if metadata is not None and metadata.error is not None and \
                metadata.error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
            self._denied_topics.add(topic)
        else:
            self._denied_topics.discard(topic)
        self._topics[topic] = (time.monotonic(), count)
        return count

