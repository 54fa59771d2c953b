"""What a node answers the console about one shard it holds (console/records.py), from the shard's store and counters.

Never a read of Kafka, never a pass over the whole store per request: the pending histogram comes
from the per-minute counts the store keeps in memory (:meth:`TimeIndex.pending_by_due`), a page of
upcoming messages from a cursor into the time index (:meth:`TimeIndex.upcoming`, a topic filter
looking at :data:`~.console.records.UPCOMING_SCAN_LIMIT` entries at most), the delivery figures
from the master's last minute of commits (:class:`~.metrics.RecentDeliveries`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from delayq.clock import HOUR_MS, MINUTE_MS
from delayq.store import StoredEntry, TimeIndex
from delayq.wire import Envelope, series_options

from . import stored
from .console.records import UPCOMING_SCAN_LIMIT, Bucket, PendingHistogram, ShardNow, UpcomingItem, UpcomingPage
from .metrics import RecentDeliveries

log = logging.getLogger("delayq.http")

# The longest message key an upcoming item shows (as text).
KEY_SHOWN = 200


@dataclass(frozen=True)
class Counting:
    """The shard's pending histogram is not known yet: its store is being counted (``counted`` of ``pending``)."""

    shard: int
    counted: int
    pending: int


def schedule_of(message: Envelope) -> tuple[int | None, str | None]:
    """A repeating message's occurrence pending and schedule (frame options); (None, None) for any other."""
    if message.series is None:
        return None, None
    return message.occurrence or 1, series_options(message.series).strip()


def cursor_text(after: tuple[int, str] | None) -> str | None:
    """An upcoming cursor as a page's ``next`` says it: ``<due_ms>:<id>``."""
    return None if after is None else f"{after[0]}:{after[1]}"


def _upcoming_item(entry: StoredEntry) -> UpcomingItem | None:
    """What the console shows of a stored entry; None (logged) for one this node cannot read."""
    try:
        pending = stored.unpack(entry.payload)
    except stored.MalformedStoredEntry as err:
        log.warning("upcoming: %s's stored entry is unreadable, left off the page: %s", entry.delay_id, err)
        return None
    message = pending.message
    occurrence, repeat = schedule_of(message)
    key = None if message.key is None else message.key[:4 * KEY_SHOWN].decode("utf-8", "replace")[:KEY_SHOWN]
    return UpcomingItem(id=entry.delay_id, due_ms=entry.deliver_at_ms, topic=message.topic, key=key,
                        version=pending.version, partition=pending.buffer_partition, occurrence=occurrence,
                        repeat=repeat, attempt=message.attempt)


def _of_topic(topic: str) -> Callable[[bytes], bool]:
    """Whether a stored value is of a message to ``topic``.

    A topic name is ASCII and marshal writes an ASCII str as its bytes, so a value without them is
    passed over without being decoded (most of them, when the filter matters).
    """
    name = topic.encode("ascii")

    def keep(payload: bytes) -> bool:
        if name not in payload:
            return False
        try:
            return stored.unpack(payload).message.topic == topic
        except stored.MalformedStoredEntry:
            return False  # left off; an unfiltered page logs it

    return keep


class ShardAnswers:
    """The console's questions about shard ``shard``, answered from its ``store`` and ``recent`` deliveries.

    Args:
        shard: The shard.
        store: Its store on this node.
        recent: What its master delivered lately (moves only while this node masters it).
        mastering: Whether this node masters the shard now.
    """

    def __init__(self, shard: int, store: TimeIndex, recent: RecentDeliveries, mastering: Callable[[], bool]):
        self.shard = shard
        self.store = store
        self.recent = recent
        self.mastering = mastering

    def histogram(self, now_ms: int, days: int) -> PendingHistogram | Counting:
        """Pending messages by due time around ``now_ms`` (``GET .../pending``), or how far the first count is.

        Raises:
            ValueError: ``days`` is out of range (store.MAX_DAYS).
            StoreError: the store is closed (the shard dropped meanwhile) or its count failed.
        """
        found = self.store.pending_by_due(now_ms, days)
        if found is None:
            return Counting(self.shard, self.store.pending_counted, self.store.pending_count())
        start = found.start_ms
        minutes = tuple(Bucket(start + i * MINUTE_MS, MINUTE_MS, count) for i, count in enumerate(found.minutes))
        hours_from = start + len(found.minutes) * MINUTE_MS
        hours = tuple(Bucket(hours_from + i * HOUR_MS, HOUR_MS, count) for i, count in enumerate(found.hours))
        return PendingHistogram(shard=self.shard, now_ms=now_ms, count=found.count, overdue=found.overdue,
                                minutes=minutes, hours=hours, later=found.later)

    def upcoming(self, after: tuple[int, str] | None, limit: int, topic: str | None) -> UpcomingPage:
        """The next ``limit`` messages due after the cursor ``after`` (``GET .../upcoming``), of ``topic`` if given.

        With a topic, at most :data:`UPCOMING_SCAN_LIMIT` entries are looked at: the page may hold
        fewer than ``limit`` (none, for a rare topic) with a ``next`` to go on from.

        Raises:
            StoreError: the store is closed (the shard dropped meanwhile).
        """
        if topic is None:
            found = self.store.upcoming(after, limit)
        else:
            found = self.store.upcoming(after, limit, keep=_of_topic(topic), scan_limit=UPCOMING_SCAN_LIMIT)
        items = tuple(item for item in map(_upcoming_item, found.entries) if item is not None)
        return UpcomingPage(shard=self.shard, items=items, next=cursor_text(found.next), scanned=found.scanned)

    def now(self, now_ms: int) -> ShardNow:
        """What the shard's master delivered in the last minute, as of ``now_ms`` (``GET .../now``)."""
        recent = self.recent.recent(now_ms)
        p50, p99 = recent.lateness_p50_s, recent.lateness_p99_s
        return ShardNow(shard=self.shard, master=self.mastering(), window_s=recent.window_s,
                        delivered=recent.delivered, rate_per_s=recent.delivered / recent.window_s,
                        lateness_p50_ms=None if p50 is None else p50 * 1000,
                        lateness_p99_ms=None if p99 is None else p99 * 1000, pending=self.store.pending_count())
