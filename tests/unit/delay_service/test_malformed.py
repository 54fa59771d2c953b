"""Malformed buffer records: copied to the dead letters once per cluster, with the ledger's mark moved past them."""

from __future__ import annotations

import logging
from unittest import mock

import pytest
from confluent_kafka import Producer
from support.stand_ins import shard_feed

from delayq import Settings, wire
from delayq.delay_service import malformed as malformed_module
from delayq.delay_service import stored
from delayq.delay_service.handoff import InFlight
from delayq.delay_service.malformed import MalformedCopies
from delayq.delay_service.master_producer import SpareProducer
from delayq.delay_service.transactions import LeadershipLost, ShardTransactions
from delayq.election import Term
from delayq.store import MalformedEntry

LOG = logging.LoggerAdapter(logging.getLogger("test"), {})


def record(reason: str) -> bytes:
    return stored.pack_malformed(stored.MalformedBufferRecord(b"k", b"not a frame", [("app", b"1")], 0,
                                                              wire.Reason.BAD_FRAME.value, reason))


def copies(handled: dict[int, int], waiting: list[MalformedEntry], positions: dict[int, int]):
    feed = shard_feed([0, 1])
    feed.ledger.handled.return_value = handled
    feed.store.offsets.return_value = positions
    feed.store.malformed.return_value = waiting
    feed.store.malformed_count = len(waiting)
    txns = ShardTransactions(Settings(), 0, InFlight(), LOG, spare=mock.Mock(spec_set=SpareProducer))
    producer = mock.Mock(spec_set=Producer)
    txns.producer = producer
    copier = MalformedCopies(Settings(), feed, txns, LOG)
    copier.read_mark()
    return copier, feed, producer


def test_records_the_ledger_has_not_passed_are_copied_and_the_mark_moves_past_everything_read():
    waiting = [MalformedEntry(0, 3, record(f"{wire.Reason.BAD_FRAME.value}: no frame (seen before)")),
               MalformedEntry(0, 12, record(f"{wire.Reason.BAD_FRAME.value}: no frame")),
               MalformedEntry(1, 4, record(f"{wire.Reason.BAD_FRAME.value}: bad header"))]
    copier, feed, producer = copies(handled={0: 10, 1: 0}, waiting=waiting, positions={0: 20, 1: 9})

    copier.copy(Term(2))

    sources = [dict(call.kwargs["headers"])[wire.DEAD_LETTER_SOURCE] for call in producer.produce.call_args_list]
    buffer = Settings().buffer_topic
    assert sources == [f"{buffer}/0/12".encode(), f"{buffer}/1/4".encode()], "offset 3 was below the mark already"
    offsets, _group, _timeout = producer.send_offsets_to_transaction.call_args.args
    assert {(tp.partition, tp.offset) for tp in offsets} == {(0, 20), (1, 9)}
    producer.commit_transaction.assert_called_once()
    feed.store.forget_malformed.assert_called_once_with({0: 20, 1: 9})


def test_a_full_batch_moves_the_mark_only_past_the_records_it_holds(monkeypatch):
    monkeypatch.setattr(malformed_module, "DEAD_LETTER_BATCH", 2)
    waiting = [MalformedEntry(0, 5, record("x")), MalformedEntry(0, 6, record("x"))]
    copier, _feed, producer = copies(handled={}, waiting=waiting, positions={0: 50, 1: 50})

    copier.copy(Term(2))

    offsets, _group, _timeout = producer.send_offsets_to_transaction.call_args.args
    assert {(tp.partition, tp.offset) for tp in offsets} == {(0, 7)}, "more may wait below 50"


def test_with_none_waiting_the_mark_is_refreshed_at_the_start_of_a_term_and_then_only_every_few_hours(monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(malformed_module.time, "monotonic", lambda: clock[0])
    copier, _feed, producer = copies(handled={0: 4, 1: 4}, waiting=[], positions={0: 8, 1: 9})
    assert copier.due

    copier.copy(Term(2))

    producer.produce.assert_not_called()
    producer.commit_transaction.assert_called_once()
    assert not copier.due
    clock[0] += malformed_module.LEDGER_REFRESH_S
    assert copier.due


def test_a_term_that_ended_commits_no_mark():
    copier, feed, producer = copies(handled={}, waiting=[], positions={0: 8, 1: 9})
    term = Term(2)
    term.end("handed over")

    with pytest.raises(LeadershipLost):
        copier.copy(term)

    producer.commit_transaction.assert_not_called()
    feed.store.forget_malformed.assert_not_called()
