"""Driver-side sums of the reconciliation: nearest-rank percentiles, histogram buckets, per topic and hour."""

from __future__ import annotations

from collections import Counter

import pytest

from delayq.spark.summary import COUNT_FIELDS, HOUR_MS, LATENESS_EDGES_MS, Summary, histogram, percentile


def test_percentile_is_the_nearest_rank_of_a_value_count_table():
    table = Counter({v: 1 for v in range(1, 101)})  # 1..100 once each
    assert [percentile(table, q) for q in (0.5, 0.9, 0.99, 1.0)] == [50, 90, 99, 100]
    assert percentile(Counter({7: 3}), 0.5) == 7
    assert percentile(Counter({0: 98, 500: 2}), 0.99) == 500  # 2% at 500 ms: p99 must show it
    assert percentile(Counter(), 0.5) is None


@pytest.mark.parametrize("fraction", [0, -0.1, 1.5])
def test_percentile_refuses_a_fraction_outside_zero_to_one(fraction):
    with pytest.raises(ValueError, match="fraction must be in"):
        percentile(Counter({1: 1}), fraction)


def test_histogram_puts_each_value_in_the_bucket_whose_lower_edge_it_reaches():
    buckets = histogram(Counter({-5000: 1, -1000: 2, -1: 3, 0: 4, 4: 5, 5: 6, 60_000: 7, 10**9: 8}))
    assert len(buckets) == len(LATENESS_EDGES_MS) + 1
    by_range = {(b["from_ms"], b["to_ms"]): b["count"] for b in buckets}
    assert by_range[(None, -1000)] == 1 and by_range[(-1000, -100)] == 2 and by_range[(-10, 0)] == 3
    assert by_range[(0, 5)] == 9 and by_range[(5, 10)] == 6 and by_range[(60_000, None)] == 15
    assert sum(b["count"] for b in buckets) == 36


def group(topic: str, hour: int, lateness: int | None, n: int = 0, **counts: int) -> dict:
    return {"topic": topic, "hour_ms": hour * HOUR_MS, "lateness_key": lateness, "lateness_n": n,
            **dict.fromkeys(COUNT_FIELDS, 0), **counts}


def test_summary_sums_groups_overall_per_topic_and_per_hour():
    summary = Summary.of([
        group("a", 0, 10, 3, expected=3, delivered=3, delivered_records=3),
        group("a", 1, 30, 1, expected=1, delivered=1, delivered_records=2, duplicates=1, duplicate_records=1),
        group("b", 0, None, 0, expected=2, missing=2),
        group("b", 1, 20, 1, expected=1, delivered=1, delivered_records=1, early=1),
        group("b", 1, 40, 1, expected=1, delivered=1, delivered_records=2, rescheduled_too_late=1),
        group("b", 2, None, 0, cancel_ignored=1, cancelled=1),
    ])
    assert summary.overall.counts["expected"] == 8 and summary.overall.counts["missing"] == 2
    assert summary.overall.lateness_ms() == {"p50": 10, "p90": 40, "p99": 40, "max": 40, "min": 10, "count": 6}
    assert list(summary.by_topic) == ["a", "b"]
    assert summary.by_topic["a"].counts["duplicates"] == 1 and summary.by_topic["b"].counts["missing"] == 2
    assert summary.by_topic["b"].lateness_ms()["p50"] == 20
    assert (summary.overall.counts["cancel_ignored"], summary.overall.counts["rescheduled_too_late"]) == (1, 1)
    assert list(summary.per_hour) == [0, HOUR_MS, 2 * HOUR_MS]
    assert summary.per_hour[2 * HOUR_MS].counts["cancel_ignored"] == 1
    assert summary.per_hour[0].counts["expected"] == 5 and summary.per_hour[HOUR_MS].counts["early"] == 1
    assert summary.per_hour[0].as_dict()["lateness_ms"]["max"] == 10


def test_puts_already_due_when_written_are_summed_apart_from_lateness():
    summary = Summary.of([
        group("a", 0, 10, 3, expected=3, delivered=3, delivered_records=3),
        # Written an hour after their due time: no lateness, a delay from put to first delivery.
        {**group("a", 0, None, 0, expected=2, delivered=2, delivered_records=2, already_due_when_written=2),
         "written_key": 20, "written_n": 2},
        {**group("b", 1, None, 0, expected=1, delivered=1, delivered_records=1, already_due_when_written=1),
         "written_key": 1500, "written_n": 1},
        group("b", 1, None, 0, expected=1, undeliverable=1),
    ])
    assert summary.overall.lateness_ms()["max"] == 10 and summary.overall.lateness_ms()["count"] == 3
    assert summary.overall.put_to_delivery_ms() == {"count": 3, "delivered": 3, "p50": 20, "p99": 1500,
                                                    "max": 1500}
    assert summary.by_topic["a"].put_to_delivery_ms()["max"] == 20
    assert (summary.overall.counts["undeliverable"], summary.overall.counts["expected"]) == (1, 7)


def test_too_late_by_the_cutoff_only_is_summed_with_how_long_before_due_the_write_was_created():
    summary = Summary.of([
        group("a", 0, 10, 1, expected=1, delivered=1, delivered_records=1, cancelled_too_late=1,
              cancelled_too_late_after_due=1),
        {**group("a", 0, None, 0, expected=1, delivered=1, delivered_records=1, cancelled_too_late=1,
                 cancelled_too_late_by_cutoff=1), "gap_key": 2000, "gap_n": 1},
        {**group("b", 1, None, 0, rescheduled_too_late=2, rescheduled_too_late_by_cutoff=2), "gap_key": 9500,
         "gap_n": 2},
        group("b", 1, None, 0, reordered=1, twice_written=1),
    ])
    counts = summary.overall.counts
    assert (counts["cancelled_too_late"], counts["cancelled_too_late_after_due"],
            counts["cancelled_too_late_by_cutoff"], counts["rescheduled_too_late_by_cutoff"]) == (2, 1, 1, 2)
    assert (counts["reordered"], counts["twice_written"]) == (1, 1)
    assert summary.overall.too_late_gap_ms() == {"count": 3, "p50": 9500, "max": 9500}
    assert summary.by_topic["a"].too_late_gap_ms() == {"count": 1, "p50": 2000, "max": 2000}
    assert Summary.of([]).overall.too_late_gap_ms() == {"count": 0, "p50": None, "max": None}
