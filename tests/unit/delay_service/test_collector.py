"""The node's collector settings (collector.py): thresholds, the freeze once started, and the pauses it reports."""

from __future__ import annotations

import gc

import pytest
from prometheus_client import CollectorRegistry

from delayq import Settings
from delayq.delay_service import collector
from delayq.delay_service.metrics import CollectorPauses, NodeMetrics


@pytest.fixture
def restored():
    """Whatever a test does to this process's collector is undone after it."""
    threshold = gc.get_threshold()
    yield
    gc.set_threshold(*threshold)
    gc.unfreeze()
    collector._frozen_at_start = 0


def test_tune_makes_young_collections_rare(restored):
    collector.tune()
    assert gc.get_threshold() == (collector.YOUNG_EVERY, *collector.OLDER_EVERY)
    assert collector.YOUNG_EVERY > 700 * 10  # Python's default is 700: the point is far fewer


def test_freeze_started_keeps_what_lives_out_of_later_collections(restored):
    kept = [[i] for i in range(1000)]  # containers alive "at start"
    collector.freeze_started()
    assert gc.get_freeze_count() >= len(kept)
    walked = {id(o) for o in gc.get_objects()}  # what collections walk: the frozen are not among them
    assert gc.is_tracked(kept[0]) and not any(id(k) in walked for k in kept)


def test_pauses_are_reported_by_generation_while_watched_and_not_after(restored):
    registry = CollectorRegistry()
    pauses = CollectorPauses(registry)

    def full() -> float:
        return registry.get_sample_value("delayq_gc_pause_seconds_count", {"generation": "2"}) or 0.0

    assert full() == 0
    pauses.watch()
    pauses.watch()  # once only: a collection is not counted twice
    try:
        gc.collect()
        gc.collect()
    finally:
        pauses.unwatch()
    assert full() == 2
    assert (registry.get_sample_value("delayq_gc_pause_seconds_bucket", {"generation": "2", "le": "+Inf"})
            == 2)
    assert registry.get_sample_value("delayq_gc_pause_seconds_sum", {"generation": "2"}) > 0
    gc.collect()
    assert full() == 2


def test_frozen_objects_are_a_gauge(restored):
    registry = NodeMetrics().registry
    assert registry.get_sample_value("delayq_gc_frozen_objects") == 0
    collector.freeze_started()
    assert registry.get_sample_value("delayq_gc_frozen_objects") == gc.get_freeze_count() > 0


def test_a_scrape_does_not_count_the_frozen_objects_again(restored, monkeypatch):
    # get_freeze_count walks the whole frozen list: a node's ~50,000 objects at every scrape, under its GIL.
    kept = [[i] for i in range(1000)]
    collector.freeze_started()
    frozen = gc.get_freeze_count()
    registry = NodeMetrics().registry

    def walked() -> int:
        raise AssertionError("a scrape walked the frozen objects")

    monkeypatch.setattr(gc, "get_freeze_count", walked)
    assert registry.get_sample_value("delayq_gc_frozen_objects") == frozen >= len(kept)


def test_the_setting_is_on_unless_turned_off(monkeypatch):
    assert Settings().gc_tuned is True
    monkeypatch.setenv("DELAYQ_GC_TUNED", "false")
    assert Settings().gc_tuned is False
