"""TimeIndex.pending_by_due: per-minute counts kept exact by apply(), counted once in a thread, never blocking."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter

import pytest

from delayq.clock import HOUR_MS, MINUTE_MS
from delayq.store import MAX_DAYS, PendingByDue, Put, Remove, StoreError, TimeIndex
from delayq.store import pending_by_due as counting
from delayq.store.pending_by_due import MinuteTally, summarize

T0 = 1_800_000_000_000  # a minute boundary (30,000,000 minutes)
DAYS = 2


def truth(store: TimeIndex) -> dict[int, int]:
    """Entries per minute of due time, read from the store itself."""
    return dict(Counter(entry.deliver_at_ms // MINUTE_MS for entry in store.due(2**63 - 1, 10**9)))


def counted(store: TimeIndex, now_ms: int = T0, timeout_s: float = 30) -> PendingByDue:
    """The histogram, once the count has ended."""
    deadline = time.monotonic() + timeout_s
    while (histogram := store.pending_by_due(now_ms, DAYS)) is None:
        assert time.monotonic() < deadline, "the count never ended"
        time.sleep(0.01)
    return histogram


def assert_exact(store: TimeIndex) -> None:
    for now_ms in (T0, T0 + 17 * MINUTE_MS + 5, T0 + 30 * HOUR_MS):
        assert store.pending_by_due(now_ms, DAYS) == summarize(truth(store), now_ms, DAYS)
    assert counted(store).count == store.pending_count()


def random_ops(rng: random.Random, ids: list[str], count: int, version: list[int]) -> list[Put | Remove]:
    """Puts (new ids, reschedules, the same put again, new payloads at the same time), dones and cancels."""
    ops: list[Put | Remove] = []
    for _ in range(count):
        delay_id = rng.choice(ids)
        version[0] += 1
        kind = rng.random()
        if kind < 0.55:
            due = T0 + rng.randrange(-2 * HOUR_MS, 3 * 24 * HOUR_MS)  # overdue, this hour, these days, later
            ops.append(Put(delay_id, due, rng.choice([b"a", b"b"]), version[0]))
        elif kind < 0.8:
            ops.append(Remove(delay_id, version[0]))  # a `done` of whatever version is stored
        elif kind < 0.9:
            ops.append(Remove(delay_id, 0))  # a stale `done`: kept
        else:
            ops.append(Remove(delay_id))  # a cancel
    return ops


def test_the_buckets_split_the_minutes_around_now_into_overdue_an_hour_by_minute_days_by_hour_and_later():
    now = T0 + 30_000  # half way through minute T0
    counts = {T0 // MINUTE_MS - 1: 3,  # the minute before: overdue
              T0 // MINUTE_MS: 2,  # the minute of now (some of it may be due already): the first minute bucket
              T0 // MINUTE_MS + 59: 5,  # the last minute bucket
              T0 // MINUTE_MS + 60: 7,  # the first hour bucket
              T0 // MINUTE_MS + 60 + 24 * 60 - 1: 11,  # the last hour bucket of one day
              T0 // MINUTE_MS + 60 + 24 * 60: 13}  # after it: later
    histogram = summarize(counts, now, 1)
    assert histogram.start_ms == T0
    assert histogram.overdue == 3 and histogram.later == 13 and histogram.count == 41
    assert len(histogram.minutes) == 60 and histogram.minutes[0] == 2 and histogram.minutes[59] == 5
    assert len(histogram.hours) == 24 and histogram.hours[0] == 7 and histogram.hours[23] == 11
    assert sum(histogram.minutes) + sum(histogram.hours) == 25


def test_a_tally_says_what_is_left_per_minute_and_forgets_the_minutes_that_emptied():
    tally = MinuteTally({10: 2})
    tally.record([T0, T0 + 1, T0 + MINUTE_MS], [T0 + 5])
    tally.record([], [T0 + MINUTE_MS, 10 * MINUTE_MS + 7, 10 * MINUTE_MS])
    counts, emptied = tally.net()
    assert counts == {T0 // MINUTE_MS: 1} and sorted(emptied) == [10, T0 // MINUTE_MS + 1]
    tally.record([T0 + MINUTE_MS], [])  # that minute has an entry again before the reader drops it
    tally.forget(emptied)
    assert tally.net() == ({T0 // MINUTE_MS: 1, T0 // MINUTE_MS + 1: 1}, [])
    assert set(tally.added) == {T0 // MINUTE_MS, T0 // MINUTE_MS + 1}, "the emptied minute 10 is gone"


def test_a_new_store_is_counted_at_once_and_every_apply_keeps_the_counts_exact(tmp_path):
    rng = random.Random(5)
    ids = [f"id-{i}" for i in range(300)]
    version = [0]
    with TimeIndex(tmp_path / "s") as store:
        assert store.pending_by_due(T0, DAYS) == PendingByDue(T0, 0, (0,) * 60, (0,) * 48, 0, 0)
        for offset in range(60):
            store.apply(random_ops(rng, ids, rng.randrange(1, 40), version), {0: offset + 1})
            assert_exact(store)
        # A put and its removal in one batch, a reschedule within a batch: only the net change counts.
        store.apply([Put("x", T0, b"p", 10**6), Put("x", T0 + HOUR_MS, b"p", 10**6 + 1), Put("y", T0, b"q", 10**6 + 2),
                     Remove("y", 10**6 + 2)], {0: 100})
        assert_exact(store)


def test_a_store_reopened_with_entries_says_it_is_counting_then_counts_them_exactly(tmp_path):
    rng = random.Random(9)
    ids = [f"id-{i}" for i in range(2000)]
    with TimeIndex(tmp_path / "s") as store:
        store.apply(random_ops(rng, ids, 3000, [0]), {0: 1})
        expected = summarize(truth(store), T0, DAYS)
    with TimeIndex(tmp_path / "s") as store:
        assert store.pending_by_due(T0, DAYS) is None, "counting: says so instead of blocking"
        assert counted(store) == expected
        assert store.pending_counted == expected.count


def test_the_count_can_be_started_before_anyone_asks(tmp_path):
    with TimeIndex(tmp_path / "s") as store:
        store.apply([Put(f"id-{i}", T0 + i * MINUTE_MS, b"p", i) for i in range(100)], {0: 1})
    with TimeIndex(tmp_path / "s") as store:
        store.count_pending_by_due()
        store.count_pending_by_due()  # once counting, again is nothing
        assert counted(store).minutes == (1,) * 60


class GatedChunks:
    """islice for the count's pass that holds the pass before each chunk until the test lets it go on."""

    def __init__(self) -> None:
        self.at_chunk = threading.Semaphore(0)  # released by the pass as it reaches a chunk
        self.go_on = threading.Semaphore(0)  # released by the test: read one chunk
        self.original = counting.islice

    def __call__(self, keys, size):
        self.at_chunk.release()
        assert self.go_on.acquire(timeout=30), "the test never let the count go on"
        return self.original(keys, size)

    def step(self) -> None:
        assert self.at_chunk.acquire(timeout=30), "the count did not reach its next chunk"
        self.go_on.release()


def test_writes_landing_while_the_count_runs_are_counted_once_neither_lost_nor_twice(tmp_path, monkeypatch):
    rng = random.Random(11)
    ids = [f"id-{i}" for i in range(5000)]
    version = [0]
    with TimeIndex(tmp_path / "s") as store:
        store.apply(random_ops(rng, ids, 8000, version), {0: 1})
    gate = GatedChunks()
    monkeypatch.setattr(counting, "islice", gate)
    monkeypatch.setattr(counting, "COUNT_CHUNK", 200)
    with TimeIndex(tmp_path / "s") as store:
        assert store.pending_by_due(T0, DAYS) is None  # the snapshot is taken now; the pass waits at its first chunk
        # Writes before the pass reads anything: in the delta, not in what it reads (its snapshot is older).
        for offset in range(5):
            store.apply(random_ops(rng, ids, 300, version), {0: offset + 2})
        landed = 0
        while store.pending_by_due(T0, DAYS) is None:
            store.apply(random_ops(rng, ids, 50, version), {0: 100 + landed})  # and between its chunks
            landed += 1
            if gate.at_chunk.acquire(timeout=0.5):
                gate.go_on.release()
        assert landed > 10, "the writes did not overlap the count"
        assert_exact(store)


def test_a_failed_count_is_said_once_and_the_next_ask_counts_again(tmp_path, monkeypatch):
    with TimeIndex(tmp_path / "s") as store:
        store.apply([Put("a", T0, b"p", 1)], {0: 1})
    calls = []
    real_islice = counting.islice

    def failing_once(keys, size):
        calls.append(size)
        if len(calls) == 1:
            raise RuntimeError("Corruption: block checksum mismatch")
        return real_islice(keys, size)

    monkeypatch.setattr(counting, "islice", failing_once)
    with TimeIndex(tmp_path / "s") as store:
        assert store.pending_by_due(T0, DAYS) is None
        deadline = time.monotonic() + 10
        while True:
            try:
                histogram = store.pending_by_due(T0, DAYS)
            except StoreError as err:
                assert "block checksum mismatch" in str(err) and "counting again" in str(err)
                break
            assert histogram is None and time.monotonic() < deadline
            time.sleep(0.01)
        assert counted(store).minutes[0] == 1


def test_closing_the_store_ends_a_count_that_runs(tmp_path, monkeypatch):
    with TimeIndex(tmp_path / "s") as store:
        store.apply([Put(f"id-{i}", T0 + i, b"p", i) for i in range(20_000)], {0: 1})
    monkeypatch.setattr(counting, "COUNT_CHUNK", 1)
    store = TimeIndex(tmp_path / "s")
    store.count_pending_by_due()
    started = time.monotonic()
    store.close()
    assert time.monotonic() - started < 5
    assert not [t for t in threading.enumerate() if t.name.startswith("count-due-")]


def test_bad_arguments_are_refused(tmp_path):
    with TimeIndex(tmp_path / "s") as store:
        with pytest.raises(ValueError, match="days must be between 1 and 31"):
            store.pending_by_due(T0, MAX_DAYS + 1)
        with pytest.raises(TypeError, match="days must be an int"):
            store.pending_by_due(T0, "7")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="now_ms"):
            store.pending_by_due(-1, 1)
    with pytest.raises(StoreError, match="closed"):
        store.pending_by_due(T0, 1)
