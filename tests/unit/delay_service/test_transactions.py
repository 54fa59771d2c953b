"""The shard transaction: what each transaction writes to Kafka, and how its commit meets errors.

A stand-in (``spec_set``) for the producer: what is tested is the records written and
the calls made.
"""

from __future__ import annotations

import logging
import threading
import time
from unittest import mock

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer

from delayq import Settings, wire
from delayq.delay_service import master_producer, stored, transactions
from delayq.delay_service.cover import Tail
from delayq.delay_service.handoff import InFlight
from delayq.delay_service.master_producer import SpareProducer
from delayq.delay_service.routing import Outgoing, Undeliverable
from delayq.delay_service.transactions import RecordRejected, ShardTransactions, TransactionStuck
from delayq.election import Term
from delayq.store import StoredEntry

DUE_MS = 1_795_000_000_000
LOG = logging.LoggerAdapter(logging.getLogger("test"), {})


def shard_transactions() -> tuple[ShardTransactions, mock.Mock]:
    """Transactions with their term's producer (a stand-in) taken."""
    txns = ShardTransactions(Settings(), 0, InFlight(), LOG, spare=mock.Mock(spec_set=SpareProducer))
    producer = mock.Mock(spec_set=Producer)
    txns.producer = producer
    return txns, producer


def item(n: int, partition: int = 1, version: int = 10) -> Outgoing:
    delay_id = wire.new_delay_id()
    message = wire.Envelope(delay_id, "orders", DUE_MS + n, b"v", key=b"k")
    return Outgoing(StoredEntry(delay_id, DUE_MS + n, b""), stored.PendingMessage(partition, version + n, message), 2)


def timed_out() -> KafkaException:
    return KafkaException(KafkaError(KafkaError._TIMED_OUT, "commit timed out", retriable=True))


def test_each_delivery_goes_to_its_target_and_a_done_with_the_cutoff_to_its_buffer_partition():
    txns, producer = shard_transactions()
    first, second = item(0, partition=1), item(1, partition=0)

    txns.write_deliveries(7, [first, second], {0: 40, 1: 55})

    calls = producer.produce.call_args_list
    assert len(calls) == 4
    delivery, done = calls[0], calls[1]
    assert delivery.args[:3] == ("orders", b"v", b"k") and delivery.kwargs["partition"] == 2
    headers = dict(delivery.kwargs["headers"])
    assert headers[wire.ID] == first.entry.delay_id.encode() and headers[wire.EPOCH] == b"7"
    assert headers[wire.VERSION] == b"10"
    assert done.args[:3] == (Settings().buffer_topic, None, first.entry.delay_id.encode())
    assert done.kwargs["partition"] == 1
    assert done.kwargs["headers"] == wire.done_headers(first.entry.delay_id, 10, 55), "partition 1's cutoff"
    assert calls[3].kwargs["headers"] == wire.done_headers(second.entry.delay_id, 11, 40), "partition 0's cutoff"


@pytest.mark.parametrize("code", [KafkaError.MSG_SIZE_TOO_LARGE, KafkaError._UNKNOWN_TOPIC])
def test_a_delivery_kafka_refuses_for_what_it_is_is_named_and_nothing_after_it_is_written(code):
    txns, producer = shard_transactions()
    refused = item(1)
    producer.produce.side_effect = [None, None, KafkaException(KafkaError(code, "refused"))]

    with pytest.raises(RecordRejected) as raised:
        txns.write_deliveries(7, [item(0), refused, item(2)], {})

    assert raised.value.item is refused and raised.value.error.code() == code
    assert producer.produce.call_count == 3


def test_an_error_that_may_pass_is_raised_as_such_not_as_a_refused_record():
    txns, producer = shard_transactions()
    producer.produce.side_effect = KafkaException(KafkaError(KafkaError._QUEUE_FULL, "queue full"))

    with pytest.raises(KafkaException):
        txns.write_deliveries(7, [item(0)], {})


def test_a_dead_letter_copy_keeps_the_message_and_says_why_and_where_it_came_from():
    txns, producer = shard_transactions()
    undeliverable = Undeliverable(item(0, partition=1, version=30), wire.Reason.EXPIRED, "expired 5s before delivery")

    txns.dead_letter(undeliverable, 7)

    call = producer.produce.call_args
    assert call.args[0] == Settings().dead_letter_topic
    headers = dict(call.kwargs["headers"])
    assert headers[wire.DEAD_LETTER_REASON].decode().startswith(wire.Reason.EXPIRED.value)
    assert headers[wire.DEAD_LETTER_SOURCE] == f"{Settings().buffer_topic}/1/30".encode()
    assert headers[wire.VERSION] == b"30" and headers[wire.EPOCH] == b"7"


def test_the_ids_of_a_commit_are_in_flight_from_before_the_commit_and_stay_after_it():
    in_flight_during: list[set[str]] = []
    txns, producer = shard_transactions()
    producer.commit_transaction.side_effect = lambda _t: in_flight_during.append(txns.in_flight.snapshot())

    txns.commit(Term(4), ["a", "b"])

    assert in_flight_during == [{"a", "b"}], "ingest may read a done back before the commit returns"
    assert txns.in_flight.snapshot() == {"a", "b"}


def test_the_ids_of_a_failed_commit_are_no_longer_in_flight():
    txns, producer = shard_transactions()
    producer.commit_transaction.side_effect = KafkaException(
        KafkaError(KafkaError.INVALID_TXN_STATE, "bad state", txn_requires_abort=True))

    with pytest.raises(KafkaException):
        txns.commit(Term(4), ["a"])

    assert txns.in_flight.snapshot() == set()


def test_a_commit_runs_on_the_committer_while_the_master_uses_the_time():
    txns, producer = shard_transactions()
    txns.begin_term()
    used = []
    try:
        txns.commit(Term(4), ["a"], during=lambda commit: used.append(commit.result(timeout=5)))
    finally:
        txns.end_term(stuck=False)
    assert used == [None], "during() saw the commit finish"
    producer.commit_transaction.assert_called_once_with(transactions.COMMIT_CALL_S)
    assert txns.producer is None, "closed at the end of the term"


def test_a_commit_in_a_term_that_ended_is_refused_before_anything_is_sent():
    txns, producer = shard_transactions()
    term = Term(4)
    term.end("handed over")

    with pytest.raises(transactions.LeadershipLost, match="handed over"):
        txns.commit(term, ["a"])

    producer.commit_transaction.assert_not_called()
    assert txns.in_flight.snapshot() == set()


def test_a_timed_out_commit_is_resumed_until_it_is_confirmed():
    txns, producer = shard_transactions()
    producer.commit_transaction.side_effect = [timed_out(), timed_out(), None]

    txns.commit_resuming(Term(4))

    assert producer.commit_transaction.call_count == 3
    producer.abort_transaction.assert_not_called()


def test_an_abort_that_fails_leaves_the_transaction_to_the_next_master():
    txns, producer = shard_transactions()
    producer.abort_transaction.side_effect = timed_out()

    with pytest.raises(TransactionStuck, match="abort failed"):
        txns.abort()


def test_the_end_of_a_term_aborts_what_it_left_open_and_a_fenced_producer_ends_quietly():
    txns, producer = shard_transactions()
    producer.abort_transaction.side_effect = KafkaException(
        KafkaError(KafkaError._FENCED, "fenced", fatal=True))

    txns.abandon()  # never raises

    producer.abort_transaction.assert_called_once_with(transactions.ABANDON_TIMEOUT_S)


@pytest.mark.parametrize("stuck", [True, False])
def test_the_end_of_a_term_destroys_its_producer_rather_than_letting_it_go(stuck):
    # Let go, a producer a stuck commit raised through lived on in the exception's frames and resumed that
    # commit once the broker was back (CI's soak).
    txns, producer = shard_transactions()
    txns.begin_term()

    txns.end_term(stuck=stuck)

    assert producer.mock_calls[-2:] == [mock.call.purge(in_queue=True, in_flight=True), mock.call.close()]
    assert txns.producer is None


def test_a_producer_whose_close_waits_for_kafka_does_not_hold_up_the_end_of_the_term(monkeypatch):
    monkeypatch.setattr(master_producer, "RETIRE_WAIT_S", 0.05)
    txns, producer = shard_transactions()
    aborting = threading.Event()
    producer.close.side_effect = lambda: aborting.wait(10)  # close() aborting an open transaction, Kafka away

    started = time.monotonic()
    txns.close(flush_s=0.0)

    assert time.monotonic() - started < 5
    assert producer.close.called and not aborting.is_set()
    aborting.set()


def test_a_write_without_a_producer_says_only_a_term_writes():
    txns = ShardTransactions(Settings(), 0, InFlight(), LOG, spare=mock.Mock(spec_set=SpareProducer))

    with pytest.raises(RuntimeError, match="only the delivery loop of a term"):
        txns.begin()


def test_a_term_takes_the_spare_producer_once():
    spare = mock.Mock(spec_set=SpareProducer)
    txns = ShardTransactions(Settings(), 0, InFlight(), LOG, spare=spare)

    txns.take_producer()
    txns.take_producer()

    spare.take.assert_called_once()
    assert txns.producer is spare.take.return_value


def test_a_first_ask_answered_concurrent_transactions_is_asked_again_at_once_by_the_second_spare():
    """The previous master left a transaction open: the first producer is closed before its PID timer fires (it would
    fence the second), and the second spare asks at full length."""
    first, second = mock.Mock(spec_set=Producer), mock.Mock(spec_set=Producer)
    first.init_transactions.side_effect = KafkaException(KafkaError(KafkaError.CONCURRENT_TRANSACTIONS, "aborting",
                                                                    retriable=True))
    spare = mock.Mock(spec_set=SpareProducer)
    spare.take.side_effect = [first, second]
    txns = ShardTransactions(Settings(), 0, InFlight(), LOG, spare=spare)
    txns.take_producer()

    txns.fence(30.0, Term(3))

    first.init_transactions.assert_called_once_with(pytest.approx(transactions.FIRST_ASK_S))
    first.close.assert_called_once()
    second.init_transactions.assert_called_once_with(pytest.approx(transactions.FENCE_SLICE_S))
    assert txns.producer is second


def test_unanswered_asks_stay_short_and_are_resumed_with_the_same_producer():
    producer = mock.Mock(spec_set=Producer)
    producer.init_transactions.side_effect = [
        KafkaException(KafkaError(KafkaError._TIMED_OUT, "no answer yet", retriable=True)), None]
    spare = mock.Mock(spec_set=SpareProducer)
    spare.take.return_value = producer
    txns = ShardTransactions(Settings(), 0, InFlight(), LOG, spare=spare)
    txns.take_producer()

    txns.fence(30.0, Term(3))

    assert [c.args[0] for c in producer.init_transactions.call_args_list] == [
        pytest.approx(transactions.FIRST_ASK_S)] * 2
    spare.take.assert_called_once()
    producer.close.assert_not_called()


def test_only_the_first_and_the_last_buffer_record_of_each_partition_ask_for_a_report_and_order_is_kept():
    txns, producer = shard_transactions()
    items = [item(0, partition=1), item(1, partition=1), item(2, partition=0), item(3, partition=1)]

    txns.begin()
    txns.write_deliveries(7, items, {0: 40, 1: 55})

    buffer = [c for c in producer.produce.call_args_list if c.args[0] == Settings().buffer_topic]
    assert [c.args[2] for c in buffer if c.kwargs["partition"] == 1] == [
        i.entry.delay_id.encode() for i in (items[0], items[1], items[3])], "each partition's records in order"
    reporting = [c.args[2] for c in buffer if "on_delivery" in c.kwargs]
    assert sorted(reporting) == sorted(i.entry.delay_id.encode() for i in (items[0], items[3], items[2]))
    # The reports come during the commit's flush: three records on 1 at 55..57, one on 0 at 40.
    for c, offset in zip([c for c in buffer if "on_delivery" in c.kwargs], (55, 40, 57)):
        c.kwargs["on_delivery"](None, mock.Mock(partition=mock.Mock(return_value=c.kwargs["partition"]),
                                                offset=mock.Mock(return_value=offset)))
    txns.commit(Term(7), [i.entry.delay_id for i in items])

    assert {p: (tail.first, tail.last) for p, tail in txns.own_writes.tails.items()} == {0: (40, 40), 1: (55, 57)}


def test_a_failed_commit_leaves_no_record_of_where_the_master_wrote():
    txns, producer = shard_transactions()
    txns.own_writes.tails = {1: Tail(50, 52, 0.0)}
    producer.commit_transaction.side_effect = KafkaException(KafkaError(KafkaError._FENCED, "fenced", fatal=True))
    txns.begin()
    txns.write_deliveries(7, [item(0, partition=1)], {})

    with pytest.raises(KafkaException):
        txns.commit(Term(7), ["x"])

    assert txns.own_writes.tails == {}, "it may have committed all the same: its records are read"
