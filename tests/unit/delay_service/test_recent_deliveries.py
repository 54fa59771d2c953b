"""RecentDeliveries: the last minute's deliveries of a shard's master, exact counts, a bounded lateness sample."""

from __future__ import annotations

import random
from unittest import mock

import pytest

from delayq import wire
from delayq.delay_service import progress as progress_module
from delayq.delay_service import stored
from delayq.delay_service.metrics import NodeMetrics, RecentDeliveries
from delayq.delay_service.progress import Progress
from delayq.delay_service.routing import Outgoing
from delayq.election import Cursor
from delayq.store import StoredEntry

T0 = 1_800_000_000_000


def test_nothing_delivered_has_no_percentiles():
    recent = RecentDeliveries().recent(T0)
    assert (recent.window_s, recent.delivered, recent.lateness_p50_s, recent.lateness_p99_s) == (60.0, 0, None, None)


def test_counts_and_percentiles_are_of_the_commits_in_the_window_only():
    recent = RecentDeliveries(window_ms=60_000)
    recent.add(T0, [9.0] * 1000)  # leaves the window at T0 + 60 s
    recent.add(T0 + 30_000, [float(n) / 100 for n in range(1, 101)])  # 0.01 .. 1.00
    recent.add(T0 + 31_000, [])
    assert recent.recent(T0 + 59_999).delivered == 1100
    now = recent.recent(T0 + 60_000)
    assert now.delivered == 100
    assert now.lateness_p50_s == 0.5 and now.lateness_p99_s == 0.99
    assert recent.recent(T0 + 90_000).delivered == 0


def test_at_any_rate_it_keeps_a_bounded_sample_counts_stay_exact_and_percentiles_close():
    rng = random.Random(1)
    recent = RecentDeliveries(window_ms=60_000, max_samples=5000)
    values: list[float] = []
    for second in range(60):  # 60 commits of 2,000 deliveries: 24 times the sample's bound
        batch = [rng.random() for _ in range(2000)]
        values += batch
        recent.add(T0 + second * 1000, batch)
        assert recent._kept <= 5000
    now = recent.recent(T0 + 59_000)
    values.sort()
    assert now.delivered == 120_000
    assert now.lateness_p50_s == pytest.approx(values[60_000], abs=0.02)
    assert now.lateness_p99_s == pytest.approx(values[118_800], abs=0.01)
    # The rate falls: old commits leave the window and later ones are kept whole again.
    for second in range(60, 200):
        recent.add(T0 + second * 1000, [0.5])
    assert recent._stride == 1 and recent.recent(T0 + 199_000).delivered == 60


def test_small_commits_above_the_bound_are_sampled_fairly_not_each_first_value():
    recent = RecentDeliveries(window_ms=60_000, max_samples=100)
    for n in range(3000):  # commits of 3: [late, on time, on time]; a third of all deliveries are late
        recent.add(T0 + n, [5.0, 0.0, 0.0])
    now = recent.recent(T0 + 3000)
    assert now.delivered == 9000
    assert now.lateness_p50_s == 0.0 and now.lateness_p99_s == 5.0


def test_the_master_s_commits_feed_the_shards_recent_deliveries(monkeypatch):
    monkeypatch.setattr(progress_module, "now_ms", lambda: T0 + 250)
    metrics = NodeMetrics()
    progress = Progress("node-a", mock.Mock(spec_set=Cursor), metrics.shard(0))
    delay_id = wire.new_delay_id()
    item = Outgoing(StoredEntry(delay_id, T0, b""), stored.PendingMessage(0, 1, wire.Envelope(delay_id, "t", T0, b"v")),
                    0)
    progress.committed(1, [item, item], [])
    assert metrics.shard(0).recent is metrics.shard(0).recent, "one per shard, whoever asks"
    now = metrics.shard(0).recent.recent(T0 + 1000)
    assert now.delivered == 2 and now.lateness_p50_s == 0.25
    metrics.forget_shard(0)
    assert metrics.shard(0).recent.recent(T0 + 1000).delivered == 0, "a shard dropped and taken again starts at 0"
