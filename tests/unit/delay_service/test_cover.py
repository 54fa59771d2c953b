"""A master's cover (delay_service/cover.py, ShardCover): what a cover reaches, what it picks, what waits.

Pure: a stand-in feed and store (spec_set), no servers.
"""

from __future__ import annotations

import logging
import time
from unittest import mock

from support.stand_ins import shard_feed

from delayq import wire
from delayq.delay_service.cover import PARTIAL_COVER_S, Ends, ShardCover
from delayq.election import Term
from delayq.store import StoredEntry

NOW = 1_800_000_000_000
LOG = logging.LoggerAdapter(logging.getLogger("test"), {})


def id_on(partition: int, count: int = 2) -> str:
    while True:
        delay_id = wire.new_delay_id()
        if wire.buffer_partition(delay_id, count) == partition:
            return delay_id


def covering(positions: dict[int, int]) -> tuple[ShardCover, mock.Mock]:
    feed = shard_feed([0, 1])
    feed.wait_until_read.return_value = True
    feed.positions.return_value = positions
    mark = mock.Mock()
    return ShardCover(feed, feed.metrics, LOG, mark), mark


def test_a_cover_ingest_reached_everywhere_covers_every_partition_and_picks_what_is_due():
    cover, mark = covering({0: 10, 1: 20})
    assert cover.cover(Term(3), Ends(NOW, {0: 10, 1: 20}))
    assert cover.cutoff.covers_ms == NOW and cover.cutoff.uniform and cover.cutoff.offsets == {0: 10, 1: 20}
    due = [StoredEntry(id_on(0), NOW - 5, b"", 1), StoredEntry(id_on(1), NOW - 1, b"", 2)]
    store = cover.feed.store
    store.due.return_value = due
    assert cover.pick(store, 100, set()) == due
    store.due.assert_called_once_with(NOW, 100, skip=set())
    mark.assert_not_called()


def test_ids_of_a_partition_not_reached_wait_out_of_the_picks_until_a_cover_reaches_it():
    cover, _ = covering({0: 10, 1: 5})  # partition 1 short of its end: held back
    assert cover.cover(Term(3), Ends(NOW, {0: 10, 1: 20}))
    assert not cover.cutoff.uniform and cover.cutoff.partition_ms == {0: NOW}
    on_0, on_1 = StoredEntry(id_on(0), NOW - 5, b"", 1), StoredEntry(id_on(1), NOW - 1, b"", 2)
    cover.feed.store.due.return_value = [on_0, on_1]
    skip: set[str] = set()
    assert cover.pick(cover.feed.store, 100, skip) == [on_0]
    assert skip == {on_1.delay_id} and cover.held_ids(set()) == {on_1.delay_id}, "it waits, out of the picks"
    assert cover.next_look_ms() is not None and not cover.looks_again(), "looked at again after a short while"
    cover.retry_held_at = time.monotonic() - PARTIAL_COVER_S
    assert cover.looks_again()
    cover.feed.positions.return_value = {0: 10, 1: 20}
    assert cover.cover(Term(3), Ends(NOW + 50, {0: 10, 1: 20}))
    assert cover.held_ids(set()) == set() and cover.cutoff.uniform, "reached: its ids may be picked again"
    cover.reset()
    assert cover.cutoff.covers_ms == -1 and cover.next_look_ms() is None, "a reset covers nothing"
