"""A master's cover (delay_service/cover.py, ShardCover): what a cover reaches, what it picks, what waits.

Pure: a stand-in feed and store (spec_set), no servers.
"""

from __future__ import annotations

import logging
import time
from unittest import mock

import pytest
from support.stand_ins import shard_feed

from delayq import wire
from delayq.delay_service import cover as cover_module
from delayq.delay_service.cover import PARTIAL_COVER_S, Ends, OwnWrites, ShardCover
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


class Report:
    """A delivery report's message: where one buffer record was appended."""

    def __init__(self, partition: int, offset: int):
        self._partition, self._offset = partition, offset

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset


def own_transaction(own: OwnWrites, partition: int, offsets: list[int], *, reported: list[int] | None = None) -> None:
    """A committed transaction of the master's that wrote ``offsets`` on ``partition`` (``reported``: the reports)."""
    own.begin()
    own.wrote(partition, len(offsets))
    for offset in offsets if reported is None else reported:
        own.reported(None, Report(partition, offset))
    own.committed()


def test_a_partition_that_ends_right_after_the_masters_last_transaction_is_covered_at_its_first_record():
    cover, _ = covering({0: 40, 1: 20})  # ingest has read up to the transaction's first record on 0, not past it
    own_transaction(cover.own, 0, [40, 41, 42])
    assert cover.cover(Term(3), Ends(NOW, {0: 43, 1: 20}))
    assert cover.cutoff.uniform and cover.cutoff.offsets == {0: 40, 1: 20}, "no wait for the master's own records"
    cover.feed.wait_until_read.assert_called_with({0: 40, 1: 20}, PARTIAL_COVER_S, abandon=mock.ANY)


@pytest.mark.parametrize("end", [44, 42], ids=["another record after it (a write, or its marker)", "not all in"])
def test_a_partition_that_does_not_end_right_after_the_masters_records_is_read_to_its_end(end):
    own = OwnWrites()
    own_transaction(own, 0, [40, 41, 42])
    assert own.trim(Ends(NOW, {0: end, 1: 20})).targets == {0: end, 1: 20}


def test_records_of_the_master_with_a_gap_between_them_are_read_to_the_end():
    own = OwnWrites()
    own_transaction(own, 0, [40, 41, 42], reported=[40, 43])  # three records over 40..43: another writer's among them
    assert own.trim(Ends(NOW, {0: 44})).targets == {0: 44}
    own_transaction(own, 1, [7, 8], reported=[7])  # the last one not reported: unknown
    assert own.trim(Ends(NOW, {1: 9})).targets == {1: 9}


def test_a_failed_report_a_failed_commit_or_a_reset_forgets_the_masters_records():
    own = OwnWrites()
    own.begin()
    own.wrote(0, 1)
    own.reported(object(), Report(0, 40))
    own.committed()
    assert own.trim(Ends(NOW, {0: 41})).targets == {0: 41}
    own_transaction(own, 0, [40])
    own.clear()
    assert own.trim(Ends(NOW, {0: 41})).targets == {0: 41}
    cover, _ = covering({0: 40, 1: 20})
    own_transaction(cover.own, 0, [40])
    cover.reset()
    assert cover.own.trim(Ends(NOW, {0: 41})).targets == {0: 41}


def test_a_later_transaction_on_a_partition_replaces_the_earlier_one_there_and_leaves_the_others():
    own = OwnWrites()
    own_transaction(own, 0, [40, 41])
    own_transaction(own, 1, [5])
    own_transaction(own, 0, [43])
    assert own.trim(Ends(NOW, {0: 44, 1: 6})).targets == {0: 43, 1: 5}
    assert own.trim(Ends(NOW, {0: 42, 1: 6})).targets == {0: 42, 1: 5}, "an older transaction's end: read it all"


def test_a_report_that_comes_after_its_transaction_ended_goes_to_that_transaction_not_the_next():
    own = OwnWrites()
    own.begin()
    own.wrote(0, 1)
    aborted = own.reported  # an aborted transaction's report, served during the next one's commit
    own_transaction(own, 0, [45, 46])
    own.begin()
    own.wrote(0, 1)
    aborted(None, Report(0, 40))
    own.reported(None, Report(0, 47))
    own.committed()
    assert own.trim(Ends(NOW, {0: 48})).targets == {0: 47}


def test_a_report_without_an_offset_is_a_failed_one(monkeypatch):
    # A batch the broker answered as a duplicate: librdkafka reports offset -1 + i, confluent-kafka None.
    own = OwnWrites()
    own_transaction(own, 0, [40, 41], reported=[None, 41])  # type: ignore[list-item]
    own_transaction(own, 1, [7, 8], reported=[-1, 0])
    assert own.trim(Ends(NOW, {0: 42, 1: 9})).targets == {0: 42, 1: 9}


def test_a_transaction_whose_markers_are_lost_holds_its_partition_once_the_tail_is_no_longer_trusted(monkeypatch):
    # Kafka lost the commit's markers on partition 0 (a broker restart): the end stays right after
    # the master's records, ingest stops at their first one. Trimmed for good, the partition would
    # never be held nor marked, and the transaction's own ids in flight would wait for ever.
    clock = [1000.0]
    monkeypatch.setattr(cover_module.time, "monotonic", lambda: clock[0])
    cover, _ = covering({0: 40, 1: 20})
    own_transaction(cover.own, 0, [40, 41, 42])
    assert cover.own.trim(Ends(NOW, {0: 43, 1: 20})).targets == {0: 40, 1: 20}, "just committed: its markers come"

    clock[0] += cover_module.OWN_TAIL_TRUST_S + 0.01

    assert cover.own.trim(Ends(NOW, {0: 43, 1: 20})).targets == {0: 43, 1: 20}, "read to its end, or held and marked"
