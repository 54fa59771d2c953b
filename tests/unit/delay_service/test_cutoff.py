"""The master's per-partition cutoff: what a cover lets it deliver, partition by partition."""

from __future__ import annotations

from delayq.delay_service.cover import Cutoff, Ends


def test_a_cover_every_partition_reached_covers_them_all_up_to_its_time():
    cutoff = Cutoff([0, 1, 2])

    assert cutoff.settle(Ends(1000, {0: 5, 1: 7, 2: 0}), {0: 5, 1: 9, 2: 0}, now_s=0.0)

    assert (cutoff.covers_ms, cutoff.uniform) == (1000, True)
    assert cutoff.partition_ms == {0: 1000, 1: 1000, 2: 1000}
    assert cutoff.offsets == {0: 5, 1: 7, 2: 0}
    assert cutoff.held == {}


def test_a_partition_not_reached_keeps_its_older_cover_and_is_not_waited_for():
    cutoff = Cutoff([0, 1])
    cutoff.settle(Ends(1000, {0: 5, 1: 5}), {0: 5, 1: 5}, now_s=0.0)

    assert cutoff.settle(Ends(2000, {0: 9, 1: 8}), {0: 9, 1: 6}, now_s=1.0)

    assert cutoff.partition_ms == {0: 2000, 1: 1000} and cutoff.offsets == {0: 9, 1: 5}
    assert (cutoff.covers_ms, cutoff.uniform) == (2000, False)
    assert cutoff.held[1].target == 8 and cutoff.held[1].read_at_ms == 2000
    assert cutoff.awaited({0: 12, 1: 10}) == {0: 12}, "a stuck partition is not waited for"
    assert cutoff.awaited({1: 10}) == {1: 10}, "when every partition is held, the cover waits for them all"


def test_a_held_partition_moves_on_to_its_older_cover_while_its_high_watermark_keeps_moving():
    """The master's own writes move the high watermark each cover: the partition still makes progress."""
    cutoff = Cutoff([0])
    cutoff.settle(Ends(1000, {0: 10}), {0: 8}, now_s=0.0)
    assert cutoff.partition_ms == {} and cutoff.held[0].target == 10

    assert cutoff.settle(Ends(2000, {0: 20}), {0: 12}, now_s=0.1)

    assert cutoff.partition_ms == {0: 1000} and cutoff.offsets == {0: 10}
    assert cutoff.held[0].target == 20 and cutoff.held[0].read_at_ms == 2000
    assert cutoff.held[0].moving and cutoff.awaited({0: 25}) == {0: 25}, "a lagging partition is waited for again"
    assert cutoff.settle(Ends(3000, {0: 30}), {0: 30}, now_s=0.2)
    assert cutoff.partition_ms == {0: 3000} and cutoff.held == {} and cutoff.uniform


def test_nothing_moves_while_ingest_stays_behind_every_target():
    cutoff = Cutoff([0, 1])
    cutoff.settle(Ends(1000, {0: 5, 1: 5}), {0: 5, 1: 5}, now_s=0.0)

    assert not cutoff.settle(Ends(2000, {0: 9, 1: 9}), {0: 6, 1: 6}, now_s=1.0)

    assert cutoff.covers_ms == 1000 and cutoff.partition_ms == {0: 1000, 1: 1000}


def test_a_partition_held_for_long_is_reported_once_per_hold():
    cutoff = Cutoff([0, 1])
    cutoff.settle(Ends(1000, {0: 5, 1: 5}), {0: 5, 1: 3}, now_s=10.0)

    assert cutoff.newly_held_for(5.0, now_s=14.0) == []
    assert cutoff.newly_held_for(5.0, now_s=15.0) == [1]
    assert cutoff.newly_held_for(5.0, now_s=30.0) == []
    cutoff.settle(Ends(2000, {0: 6, 1: 6}), {0: 6, 1: 6}, now_s=31.0)
    cutoff.settle(Ends(3000, {0: 6, 1: 9}), {0: 6, 1: 6}, now_s=32.0)
    assert cutoff.newly_held_for(5.0, now_s=37.0) == [1], "a new hold is reported again"


def test_only_partitions_stuck_for_long_count_as_held():
    cutoff = Cutoff([0, 1, 2])
    cutoff.settle(Ends(1000, {0: 5, 1: 5, 2: 5}), {0: 5, 1: 3, 2: 3}, now_s=10.0)
    cutoff.settle(Ends(2000, {0: 6, 1: 9, 2: 9}), {0: 6, 1: 5, 2: 3}, now_s=10.5)  # 1 moves on, 2 does not

    assert cutoff.stuck_for(1.0, now_s=11.2) == 1
    assert cutoff.stuck_for(1.0, now_s=11.6) == 2
