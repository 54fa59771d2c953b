"""The follow suite's logic without Kafka or Spark: pacing, percentiles, the keeps-up verdict, the log lines
(issue 33: "the streaming job keeps up with 20k msg/s of deliveries on this box with its lag reported")."""

from __future__ import annotations

import math

import pytest

from delayq.bench import follow_bench
from delayq.bench.follow_bench import (
    Pacer,
    TrafficStats,
    batch_durations,
    descendants,
    figures,
    lag_now,
    lag_verdict,
    parse_batch_line,
    parse_triggers,
    percentile,
    rate_between,
    settings_from,
    slope_per_minute,
    steady,
)
from delayq.bench.suites import OPT_IN_SUITES, SUITE_TEXT


def test_the_pacer_owes_rate_times_elapsed_less_what_was_sent_and_nothing_past_its_total():
    pacer = Pacer(20_000, 10)
    assert pacer.owed(0) == 0
    assert pacer.owed(0.05) == 1_000
    pacer.sent += 600
    assert pacer.owed(0.05) == 400  # behind: the rest is owed at once
    pacer.sent += 400
    assert pacer.owed(0.05) == 0  # on pace
    assert pacer.owed(-1) == 0
    assert pacer.owed(60) == 200_000 - 1_000  # never past rate x seconds
    pacer.sent = 200_000
    assert pacer.done() and pacer.owed(60) == 0


@pytest.mark.parametrize(("rate", "seconds"), [(0, 10), (10, 0), (-1, 5)])
def test_a_pacer_needs_a_rate_and_a_duration(rate, seconds):
    with pytest.raises(ValueError):
        Pacer(rate, seconds)


def test_percentiles_interpolate_between_ranks_and_an_empty_list_has_none():
    values = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert percentile(values, 0) == 1.0
    assert percentile(values, 50) == 3.0
    assert percentile(values, 100) == 5.0
    assert percentile(values, 95) == pytest.approx(4.8)
    assert percentile([7.0], 95) == 7.0
    assert percentile([], 50) is None
    with pytest.raises(ValueError):
        percentile(values, 101)


def test_the_slope_is_per_minute_and_needs_two_times():
    assert slope_per_minute([(0, 1.0), (30, 2.0), (60, 3.0)]) == pytest.approx(2.0)
    assert slope_per_minute([(0, 5.0), (60, 5.0)]) == pytest.approx(0.0)
    assert slope_per_minute([(3, 1.0), (3, 2.0)]) is None
    assert slope_per_minute([]) is None


def sawtooth(seconds: int, period: int, floor: float, climb_per_s: float = 0.0) -> list[tuple[float, float]]:
    """A micro-batch job's lag sampled every second: up by 1 s a second, back to ``floor`` each batch, the floor
    itself climbing by ``climb_per_s``."""
    return [(t, floor + climb_per_s * t + t % period) for t in range(seconds)]


def test_a_lag_that_swings_with_each_batch_but_stays_bounded_keeps_up():
    verdict = lag_verdict(sawtooth(180, 10, 4.0))
    assert verdict["keeps_up"] is True
    assert abs(verdict["slope_s_per_min"]) <= 1.0
    assert (verdict["p50_s"], verdict["max_s"]) == (8.5, 13.0)
    assert verdict["samples"] == 180


def test_a_lag_that_climbs_falls_behind_with_its_slope_in_seconds_a_minute():
    verdict = lag_verdict(sawtooth(180, 10, 4.0, climb_per_s=0.25))
    assert verdict["keeps_up"] is False
    assert verdict["slope_s_per_min"] == pytest.approx(15.0, abs=0.5)


def test_no_lag_sample_in_the_steady_part_does_not_keep_up():
    assert lag_verdict([]) == {"samples": 0, "p50_s": None, "p95_s": None, "max_s": None, "slope_s_per_min": None,
                               "keeps_up": False}


def test_the_lag_now_grows_while_a_batch_runs_and_before_anything_was_judged_is_the_traffics_age():
    judged = {"lag_seconds": 4.0, "last_batch_timestamp_seconds": 1_000.0, "records_total{source=buffer}": 10.0}
    assert lag_now(judged, 1_000.0, 900.0) == 4.0
    assert lag_now(judged, 1_030.0, 900.0) == 34.0  # a batch running for 30 s: the reported lag is 30 s stale
    nothing = {"lag_seconds": 0.0, "last_batch_timestamp_seconds": 1_000.0, "records_total{source=buffer}": 0.0}
    assert lag_now(nothing, 1_030.0, 1_010.0) == 20.0  # the gauge's 0 is no lag: it was never set
    assert lag_now({}, 1_030.0, 1_010.0) is None


def test_the_steady_part_and_a_counters_rate_within_it():
    samples = [(float(t), 100.0 * t) for t in range(0, 100)]
    assert steady(samples, 10, 12) == [(10.0, 1000.0), (11.0, 1100.0), (12.0, 1200.0)]
    assert rate_between(samples, 20, 80) == pytest.approx(100.0)
    assert rate_between(samples, 20.5, 20.9) is None


def test_the_followers_batch_lines_are_read_with_their_counts_and_lag():
    line = "batch 12: read 150,000 buffer, 50,000 delivered; judged 120,345 ids; lag 7.3 s"
    assert parse_batch_line(line) == {"batch": 12, "read": {"buffer": 150_000, "delivered": 50_000},
                                      "ids": 120_345, "lag_s": 7.3, "found": False}
    found = parse_batch_line("batch 3: read nothing; judged 4 ids; lag - ; found duplicated 0190...")
    assert found is not None and found["read"] == {} and found["lag_s"] is None and found["found"]
    assert parse_batch_line("following x-buffer: findings to x-findings") is None
    assert batch_durations([100.0, 110.5, 125.0]) == [10.5, 14.5]


def test_descendants_follow_parent_links_from_the_root_only():
    parents = {10: 1, 11: 10, 12: 11, 13: 1, 14: 12}
    assert descendants(10, parents) == {10, 11, 12, 14}
    assert descendants(99, parents) == set()


def test_the_traffic_stats_count_acknowledged_records_and_rates():
    stats = TrafficStats(rate=1000, seconds=10, puts=10_000, deliveries=10_000, dones=10_000, refused=2, unsent=1,
                         elapsed_s=10.0, cpu_s=0.5, late_ms=[0, 1, 2, 100])
    out = stats.to_json()
    assert (out["records"], out["acknowledged"]) == (30_000, 29_997)
    assert (out["delivery_rate"], out["records_per_s"], out["cpu_us_per_message"]) == (1000.0, 3000.0, 50.0)
    assert out["delivery_late_ms"]["max"] == 100


def test_the_suites_settings_come_from_the_environment_or_the_defaults():
    assert settings_from({}, quick=False) == (20_000, 180, 60, (10.0, 5.0))
    assert settings_from({}, quick=True) == (1_000, 30, 30, (5.0,))
    env = {follow_bench.RATE_ENV: "5000", follow_bench.SECONDS_ENV: "60", follow_bench.TRIGGERS_ENV: "5"}
    assert settings_from(env, quick=False) == (5_000, 60, 60, (5.0,))
    assert parse_triggers("10, 5") == (10.0, 5.0)
    for bad in ("", "0", "5,x"):
        with pytest.raises(ValueError):
            parse_triggers(bad)
    with pytest.raises(ValueError):
        settings_from({follow_bench.RATE_ENV: "-3"}, quick=False)


def run_result(keeps_up: bool, p95: float | None, cpu: float | None) -> dict:
    lag = {"samples": 3, "p50_s": 5.0, "p95_s": p95, "max_s": p95, "slope_s_per_min": 0.2 if keeps_up else 30.0,
           "keeps_up": keeps_up}
    return {"rate_asked": 20_000, "seconds": 180, "warmup_s": 60, "achieved_delivery_rate": 19_990.0,
            "keeps_up": keeps_up, "lag": lag, "lag_now": {**lag, "p95_s": 99.0, "p50_s": 50.0, "max_s": 120.0},
            "generator": {}, "judged_records_per_s": 60_000.0, "records_judged": 1, "records_written": 1,
            "judged_all": True, "drained_s": 1.0, "batches": 20, "batches_steady": 18, "batch_seconds": {},
            "batch_lines": [], "findings": {}, "finding_keys": [], "follower_cpu_cores": 1.5,
            "follower_cpu_us_per_record": cpu, "machine_busy_cores": 2.0, "load_before": [1, 1, 1],
            "load_after": [2, 2, 2]}


def test_each_trigger_gives_rate_lag_slope_and_cpu_figures_and_a_missing_lag_falls_back_to_its_age():
    made = figures(5.0, [run_result(True, 9.0, 25.0), run_result(False, None, None)])
    by_key = {f.key: f for f in made}
    assert set(by_key) == {"follow.t5.delivery_rate", "follow.t5.lag_p50", "follow.t5.lag_p95", "follow.t5.lag_max",
                           "follow.t5.lag_now_max", "follow.t5.lag_slope", "follow.t5.cpu_us"}
    assert by_key["follow.t5.lag_p95"].values == [9.0, 99.0]  # the second run's from lag_now
    assert by_key["follow.t5.cpu_us"].values == [25.0, math.inf]
    assert by_key["follow.t5.delivery_rate"].details["keeps_up"] == [True, False]
    assert "--trigger 5" in by_key["follow.t5.lag_p50"].label


def test_the_follow_suite_is_listed_and_runs_only_when_asked_for():
    from delayq.bench.runner import SUITES, BenchOptions

    assert "follow" in SUITE_TEXT and "follow" in SUITES and "follow" in OPT_IN_SUITES
    assert "follow" not in BenchOptions().suites()
    assert BenchOptions(only=["follow"]).suites() == ["follow"]
