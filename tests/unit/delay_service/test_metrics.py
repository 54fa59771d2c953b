"""The node's batch histogram (delay_service/metrics.py) exposes what prometheus_client's Histogram would."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from delayq.delay_service.metrics import LATENESS_BUCKETS, BatchHistogram


def exposition(registry: CollectorRegistry) -> list[str]:
    return [line for line in generate_latest(registry).decode().splitlines() if "_created" not in line]


def test_observe_many_exposes_the_same_buckets_count_and_sum_as_observe_one_by_one():
    values = [0, 0.005, 0.0051, 0.02, 0.3, 1, 59.9, 60, 70, 0.0049]
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    batch = BatchHistogram("lateness_seconds", "doc", buckets=LATENESS_BUCKETS, registry=ours)
    reference = Histogram("lateness_seconds", "doc", buckets=LATENESS_BUCKETS, registry=theirs)
    batch.observe_many(values[:4])
    batch.observe_many([])
    batch.observe_many(values[4:])
    for value in values:
        reference.observe(value)
    assert exposition(ours) == exposition(theirs)
    assert 'lateness_seconds_bucket{le="0.005"} 3.0' in exposition(ours)  # a value on a bound counts in it
