"""A buffer partition an open transaction holds back gets the master's partition mark; a lagging one does not.

Kafka can leave a transaction of the master's producer open for good (its markers lost
over a broker restart); the mark's commit ends it. Stand-ins (``spec_set``) for the
producer and the shard's feed: what is tested is what the master writes, and where.
"""

from __future__ import annotations

import threading
import types
from unittest import mock

import pytest
from confluent_kafka import Producer
from support.stand_ins import shard_feed

from delayq import Settings, wire
from delayq.delay_service import cover as cover_module
from delayq.delay_service.cover import Cutoff, Ends
from delayq.delay_service.delivery import Delivery
from delayq.delay_service.handoff import InFlight, Wakeup
from delayq.delay_service.ingest import Ingest, ShardFeed
from delayq.election import Cursor, Term

READ_AT_MS = 1_795_000_000_000


class Buffer:
    """Where ingest stands (``positions``) and the last stable offsets, as the stand-in ingest reports them."""

    def __init__(self, positions: dict[int, int], stable: dict[int, int]):
        self.positions = positions
        self.stable = stable

    def feed(self) -> ShardFeed:
        feed = shard_feed(sorted(self.positions))
        feed.read_ends.side_effect = lambda **_: dict(self.stable)
        feed.wait_until_read.return_value = False
        feed.positions.side_effect = lambda: dict(self.positions)
        # The real rule (read to the last stable offset, not to the target), on these positions.
        feed.held_back.side_effect = lambda targets, stable: Ingest.held_back(
            types.SimpleNamespace(_progress=threading.Condition(), _positions=self.positions), targets, stable)
        return feed


@pytest.mark.timeout(20)
def test_a_partition_held_by_an_open_transaction_gets_the_mark_and_a_lagging_one_does_not(monkeypatch):
    monkeypatch.setattr(cover_module, "MARK_HELD_AFTER_S", 0.0)
    # Partition 0: ingest at its last stable offset (50), short of the high watermark (80): a
    # transaction holds it. Partition 1: ingest behind the last stable offset: it lags.
    buffer = Buffer(positions={0: 50, 1: 20}, stable={0: 50, 1: 80})
    producer = mock.Mock(spec_set=Producer)
    # The mark's commit ends the transaction: ingest then reads partition 0 to its end.
    producer.commit_transaction.side_effect = lambda *_: buffer.positions.update({0: 80})
    delivery = Delivery(Settings(), buffer.feed(), mock.Mock(spec_set=Cursor), Wakeup(), InFlight())
    delivery.transactions.producer = producer

    assert delivery.cover.cover(Term(7), Ends(READ_AT_MS, {0: 80, 1: 80}))

    mark = wire.mark_id(0, 2)
    producer.produce.assert_called_once_with(Settings().buffer_topic, key=mark.encode(), value=None, partition=0,
                                             headers=wire.done_headers(mark, 0, 0), timestamp=0,
                                             on_delivery=mock.ANY)
    producer.commit_transaction.assert_called_once()
    assert delivery.cutoff.partition_ms == {0: READ_AT_MS}, "partition 0 moved on; partition 1 still lags"
    marks, = (sample.value for sample in delivery.metrics.partition_marks.collect()[0].samples
              if sample.name.endswith("_total"))
    assert marks == 1


@pytest.mark.parametrize("moved_on", [False, True])
def test_a_hold_is_marked_after_a_while_and_again_only_every_few_seconds(moved_on):
    cutoff = Cutoff([0])
    ends = Ends(READ_AT_MS, {0: 80})
    cutoff.settle(ends, {0: 50}, now_s=100.0)

    assert cutoff.due_for_mark(2.0, 5.0, now_s=101.0) == [], "held for 1 s only"
    assert cutoff.due_for_mark(2.0, 5.0, now_s=102.0) == [0]
    assert cutoff.due_for_mark(2.0, 5.0, now_s=106.0) == [], "marked 4 s ago"
    if moved_on:  # to its older cover, still short of the newest: a new hold, counted from now
        cutoff.settle(Ends(READ_AT_MS + 1000, {0: 90}), {0: 80}, now_s=106.5)
        assert cutoff.due_for_mark(2.0, 5.0, now_s=107.0) == []
        assert cutoff.due_for_mark(2.0, 5.0, now_s=108.5) == [0]
    else:
        assert cutoff.due_for_mark(2.0, 5.0, now_s=107.0) == [0]
        assert cutoff.held[0].marks == 2
