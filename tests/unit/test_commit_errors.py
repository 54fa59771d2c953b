"""How the master meets a failed commit: never abort and deliver again what may still commit.

Stand-ins (``spec_set``) for the producer, the store, ingest and the cursor: what is
tested is which calls the master makes after each kind of error.
"""

from __future__ import annotations

from unittest import mock

from confluent_kafka import KafkaError, KafkaException, Producer

from delayq import Settings, wire
from delayq.delay_service import stored
from delayq.delay_service.delivery import Delivery, InFlight, Outgoing, Wakeup
from delayq.delay_service.ingest import Ingest
from delayq.delay_service.metrics import NodeMetrics
from delayq.election import Cursor, Term
from delayq.store import StoredEntry, TimeIndex

DUE_MS = 1_795_000_000_000


def master(producer: Producer) -> Delivery:
    ingest = mock.Mock(spec_set=[*dir(Ingest), "partitions"])  # partitions: set in Ingest.__init__
    ingest.partitions = [0, 1]
    delivery = Delivery(Settings(), mock.Mock(spec_set=TimeIndex), ingest, NodeMetrics(),
                        mock.Mock(spec_set=Cursor), Wakeup(), InFlight())
    delivery.producer = producer
    return delivery


def outgoing(count: int) -> list[Outgoing]:
    items = []
    for n in range(count):
        delay_id = wire.new_delay_id()
        message = wire.Envelope(delay_id, "orders", DUE_MS + n, b"v")
        items.append(Outgoing(StoredEntry(delay_id, DUE_MS + n, b""), stored.PendingMessage(0, 10 + n, message), 0))
    return items


def test_a_commit_that_may_still_complete_is_not_delivered_again_before_a_fresh_cover():
    producer = mock.Mock(spec_set=Producer)
    producer.commit_transaction.side_effect = KafkaException(
        KafkaError(KafkaError._TIMED_OUT, "commit timed out", retriable=True))
    delivery = master(producer)
    delivery.cutoff.covers_ms = DUE_MS + 10
    items = outgoing(3)

    delivery._commit(Term(4), items, [])

    producer.abort_transaction.assert_called_once()  # in place: no new producer, which could fence a newer master
    producer.init_transactions.assert_not_called()
    assert producer.commit_transaction.call_count == 1, "nothing delivered again right away"
    assert producer.produce.call_count == 6, "each message and its done, once"
    assert delivery.in_flight.snapshot() == set()
    assert delivery.cutoff.covers_ms == -1, "nothing is covered until the buffer is read again"


def test_a_transaction_that_cannot_commit_is_aborted_and_its_messages_tried_one_by_one():
    producer = mock.Mock(spec_set=Producer)
    producer.commit_transaction.side_effect = [
        KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "1 message(s) failed delivery",
                                  txn_requires_abort=True)),
        None, None]
    delivery = master(producer)
    items = outgoing(2)

    delivery._commit(Term(4), items, [])

    producer.abort_transaction.assert_called_once()
    assert producer.commit_transaction.call_count == 3
    assert delivery.in_flight.snapshot() == {item.entry.delay_id for item in items}
