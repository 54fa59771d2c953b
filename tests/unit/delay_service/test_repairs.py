"""Shadowed ids: the master writes the record the store holds as each id's newest, in one transaction."""

from __future__ import annotations

import logging
from unittest import mock

from confluent_kafka import Producer

from delayq import Settings, wire
from delayq.delay_service import stored
from delayq.delay_service.handoff import InFlight
from delayq.delay_service.master_producer import SpareProducer
from delayq.delay_service.repairs import ShadowRepair
from delayq.delay_service.transactions import ShardTransactions
from delayq.election import Term
from delayq.store import StoredEntry, TimeIndex

LOG = logging.LoggerAdapter(logging.getLogger("test"), {})
DUE_MS = 1_795_000_000_000


def repair_with(stored_entries: dict[str, bytes]) -> tuple[ShadowRepair, mock.Mock, set[str], InFlight]:
    store = mock.Mock(spec_set=TimeIndex)
    store.get.side_effect = lambda delay_id: (StoredEntry(delay_id, DUE_MS, stored_entries[delay_id])
                                              if delay_id in stored_entries else None)
    in_flight = InFlight()
    txns = ShardTransactions(Settings(), 0, in_flight, LOG, spare=mock.Mock(spec_set=SpareProducer))
    producer = mock.Mock(spec_set=Producer)
    txns.producer = producer
    unreadable: set[str] = set()
    return ShadowRepair(store, txns, unreadable, LOG), producer, unreadable, in_flight


def packed(delay_id: str, partition: int, version: int) -> bytes:
    return stored.pack(partition, version, wire.Envelope(delay_id, "orders", DUE_MS, b"v", created_at_ms=DUE_MS - 5))


def test_a_pending_id_gets_its_put_again_and_a_settled_copy_gets_a_done_of_its_version():
    pending_id, copied_id = wire.new_delay_id(), wire.new_delay_id()
    repair, producer, _unreadable, in_flight = repair_with({pending_id: packed(pending_id, 1, 40)})

    repair.repair(Term(3), {pending_id: None, copied_id: packed(copied_id, 0, 17)}, {0: 90, 1: 95})

    put, done = producer.produce.call_args_list
    assert put.kwargs["key"] == pending_id.encode() and put.kwargs["partition"] == 1
    assert put.kwargs["timestamp"] == DUE_MS - 5, "the put keeps its creation time"
    assert wire.Envelope(pending_id, "orders", DUE_MS, b"v").buffer_value(restores=40) == put.kwargs["value"]
    assert done.kwargs["key"] == copied_id.encode() and done.kwargs["value"] is None
    assert done.kwargs["headers"] == wire.done_headers(copied_id, 17, 90), "partition 0's cutoff"
    producer.commit_transaction.assert_called_once()
    assert in_flight.snapshot() == {pending_id, copied_id}, "until ingest reads the writes back"


def test_an_id_settled_since_is_left_alone_and_nothing_is_committed():
    settled = wire.new_delay_id()
    repair, producer, _unreadable, _in_flight = repair_with({})

    repair.repair(Term(3), {settled: None}, {})

    producer.begin_transaction.assert_not_called()
    producer.commit_transaction.assert_not_called()


def test_a_stored_form_that_cannot_be_read_is_never_picked_and_not_repaired():
    damaged = wire.new_delay_id()
    repair, producer, unreadable, _in_flight = repair_with({damaged: b"\x00damaged"})

    repair.repair(Term(3), {damaged: None}, {})

    assert unreadable == {damaged}
    producer.produce.assert_not_called()
