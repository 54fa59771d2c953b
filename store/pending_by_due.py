"""A store's pending entries by due time, counted per minute in memory: a histogram that costs a request nothing.

The counts are of the time family's keys (``deliver_at_ms`` + id), the one place an entry is
pending: :meth:`TimeIndex.apply <delayq.store.TimeIndex.apply>` is the only writer of that family,
so every way an entry comes or goes (a put, a delivery's `done`, a cancel, a reschedule, a
re-read record, a copy) passes through :meth:`DueCounts.changed`. A store dropped, wiped or
rebuilt is a new :class:`~delayq.store.TimeIndex`, with counts of its own; a format migration
moves no time key.

Nothing is counted until someone asks: a node without the console pays a list append per time key
written or deleted. The first ask starts one pass over the family's keys in a thread
(:meth:`DueCounts.start`): only the first 8 bytes of each key matter, and keys of one minute are
counted as a run, one comparison each. The pass reads a RocksDB snapshot taken under the store's
view lock, and from that moment every write reports its changes into a delta (under the same
lock), so the snapshot's counts plus the delta are exactly the family when the pass ends. Until
then the histogram says it is counting (None) instead of blocking. Counted, a write folds its due
times into the counts in C (:class:`MinuteTally`): about 0.1 us a key, on an apply of 7 to 10 us.

Memory: two counts per minute that has pending entries (10M entries due over a week: 10,080
minutes); a request copies them under the view lock (milliseconds for a year of minutes).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice, repeat
from operator import floordiv

from delayq.clock import MINUTE_MS

# The next hour by minute, then hours for at most this many days; what is due after that is "later".
MINUTE_BUCKETS = 60
MAX_DAYS = 31
# Keys read between two looks at whether the store is closing (and updates of the progress figure).
COUNT_CHUNK = 4096


def check_days(days: object) -> int:
    if not isinstance(days, int) or isinstance(days, bool):
        raise TypeError(f"days must be an int, not {type(days).__name__}")
    if not 1 <= days <= MAX_DAYS:
        raise ValueError(f"days must be between 1 and {MAX_DAYS}, got {days}")
    return days


@dataclass(frozen=True)
class PendingByDue:
    """A store's pending entries by due time, from ``start_ms`` (the start of the minute asked about).

    ``overdue``: due before ``start_ms``; ``minutes``: 60 one-minute buckets from ``start_ms``;
    ``hours``: one-hour buckets from ``start_ms`` + 1 h, for the days asked; ``later``: due after the
    last hour. They add up to ``count``, every entry of the store.
    """

    start_ms: int
    overdue: int
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    later: int
    count: int


def summarize(counts: dict[int, int], now_ms: int, days: int) -> PendingByDue:
    """The buckets around ``now_ms`` of per-minute ``counts`` (minute number -> entries due in it)."""
    first = now_ms // MINUTE_MS
    hours_from = first + MINUTE_BUCKETS
    end = hours_from + days * 24 * 60
    minutes = [0] * MINUTE_BUCKETS
    hours = [0] * (days * 24)
    overdue = later = 0
    for minute, count in counts.items():
        if minute < first:
            overdue += count
        elif minute < hours_from:
            minutes[minute - first] += count
        elif minute < end:
            hours[(minute - hours_from) // 60] += count
        else:
            later += count
    return PendingByDue(first * MINUTE_MS, overdue, tuple(minutes), tuple(hours), later, sum(counts.values()))


class MinuteTally:
    """Time keys added and deleted per minute of due time: what is there is the difference.

    Two counts that only grow, each batch's due times folded in by ``Counter.update`` in C
    (``map(floordiv, ...)``: no Python bytecode per key), where one count up and down would
    cost a dict read and write in Python per key. Minutes that emptied are dropped by
    :meth:`forget` (the histogram's reader finds them).
    """

    def __init__(self, counts: dict[int, int] | None = None):
        self.added: Counter[int] = Counter(counts)
        self.deleted: Counter[int] = Counter()

    def record(self, arrived: list[int], left: list[int]) -> None:
        if arrived:
            self.added.update(map(floordiv, arrived, repeat(MINUTE_MS)))
        if left:
            self.deleted.update(map(floordiv, left, repeat(MINUTE_MS)))

    def merge(self, other: MinuteTally) -> None:
        self.added.update(other.added)
        self.deleted.update(other.deleted)

    def copy(self) -> MinuteTally:
        tally = MinuteTally()
        tally.added, tally.deleted = self.added.copy(), self.deleted.copy()
        return tally

    def net(self) -> tuple[dict[int, int], list[int]]:
        """Minute -> entries due in it, and the minutes that emptied (for :meth:`forget`)."""
        deleted = self.deleted
        counts: dict[int, int] = {}
        emptied = []
        for minute, added in self.added.items():
            count = added - deleted.get(minute, 0)
            if count:
                counts[minute] = count
            else:
                emptied.append(minute)
        return counts, emptied

    def forget(self, minutes: list[int]) -> None:
        """Drop those of ``minutes`` that are empty (a reader found them so; a write may have come since)."""
        for minute in minutes:
            if self.added.get(minute, 0) == self.deleted.get(minute, 0):
                self.added.pop(minute, None)
                self.deleted.pop(minute, None)


class DueCounts:
    """Pending entries per minute of due time, exact from the first count on; one per store.

    Methods marked "under the lock" expect the caller to hold ``lock``, the store's view lock,
    the one its writes take to write a batch: that is what makes a snapshot and the delta meet.

    Args:
        lock: The store's view lock.
        empty: The store holds nothing: the counts are known (empty) without a pass.
    """

    def __init__(self, lock: threading.Lock, *, empty: bool):
        self._lock = lock
        self._tally: MinuteTally | None = MinuteTally() if empty else None  # None: not counted yet
        self._delta: MinuteTally | None = None  # while a pass runs: the changes written since its snapshot
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._failure: Exception | None = None
        self.counted = 0  # keys the running pass has counted so far

    def changed(self, arrived: list[int], left: list[int]) -> None:
        """A batch written (under the lock): the due times of the time keys it added and of those it deleted."""
        tally = self._delta if self._delta is not None else self._tally
        if tally is not None:
            tally.record(arrived, left)

    def tally(self) -> MinuteTally | None:
        """A copy of the counts (under the lock), or None until the first pass has ended."""
        return None if self._tally is None else self._tally.copy()

    def forget(self, emptied: list[int]) -> None:
        """Drop minutes that a copy :meth:`tally` gave found empty, if they still are (under the lock)."""
        if self._tally is not None:
            self._tally.forget(emptied)

    @property
    def known(self) -> bool:
        """Whether the first pass has ended (under the lock)."""
        return self._tally is not None

    @property
    def counting(self) -> bool:
        """Whether a pass runs (under the lock)."""
        return self._delta is not None

    def take_failure(self) -> Exception | None:
        """Why the last pass failed, once (under the lock); None if it did not."""
        failure, self._failure = self._failure, None
        return failure

    def start(self, keys: Iterator[bytes], name: str) -> None:
        """Count ``keys`` (the time family's, in order, from a snapshot taken now) in a thread (under the lock).

        Every write from now on goes into the delta, which the pass adds to what it counted.
        """
        if self._tally is not None or self._delta is not None:
            return
        self._delta = MinuteTally()
        self.counted = 0
        self._thread = threading.Thread(target=self._count, args=(keys,), name=name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End a running pass and wait for it (not under the lock: the pass takes it to finish)."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _count(self, keys: Iterator[bytes]) -> None:
        """The pass: per-minute counts of ``keys``, then the delta added, and the counts live."""
        counts: dict[int, int] = {}
        minute, run, next_minute_key = -1, 0, b""
        try:
            while True:
                if self._stop.is_set():
                    return  # the store is closing: its counts go with it
                chunk = list(islice(keys, COUNT_CHUNK))
                if not chunk:
                    break
                for key in chunk:
                    # Keys are in (time, id) order: a minute's keys are one run, told by one comparison each.
                    if key < next_minute_key:
                        run += 1
                        continue
                    if run:
                        counts[minute] = run
                    minute = int.from_bytes(key[:8], "big") // MINUTE_MS
                    next_minute_key = ((minute + 1) * MINUTE_MS).to_bytes(8, "big")
                    run = 1
                self.counted += len(chunk)
            if run:
                counts[minute] = run
        except Exception as err:  # rocksdict raises bare Exception for a failed read
            with self._lock:
                self._failure = err
                self._delta = None
            return
        tally = MinuteTally(counts)
        with self._lock:
            if self._delta is not None:
                tally.merge(self._delta)
            self._tally = tally
            self._delta = None
