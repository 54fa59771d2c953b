"""How the master meets a failed commit: never abort and deliver again what may still commit.

Stand-ins (``spec_set``) for the producer, the store, ingest and the cursor: what is
tested is which calls the master makes after each kind of error.
"""

from __future__ import annotations

from unittest import mock

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from support.stand_ins import shard_feed

from delayq import Settings, wire
from delayq.delay_service import stored, transactions
from delayq.delay_service.delivery import INIT_CALL_S, Delivery
from delayq.delay_service.handoff import InFlight, Wakeup
from delayq.delay_service.routing import Outgoing
from delayq.delay_service.transactions import (
    ABORT_TIMEOUT_S,
    FENCE_SLICE_S,
    FIRST_ASK_S,
    LeadershipLost,
    TransactionStuck,
)
from delayq.election import Cursor, Term
from delayq.store import StoredEntry

DUE_MS = 1_795_000_000_000


def master(producer: Producer) -> Delivery:
    delivery = Delivery(Settings(), shard_feed([0, 1]), mock.Mock(spec_set=Cursor), Wakeup(), InFlight())
    delivery.transactions.producer = producer
    return delivery


def outgoing(count: int) -> list[Outgoing]:
    items = []
    for n in range(count):
        delay_id = wire.new_delay_id()
        message = wire.Envelope(delay_id, "orders", DUE_MS + n, b"v")
        items.append(Outgoing(StoredEntry(delay_id, DUE_MS + n, b""), stored.PendingMessage(0, 10 + n, message), 0))
    return items


def test_a_commit_that_timed_out_is_resumed_never_aborted():
    producer = mock.Mock(spec_set=Producer)
    producer.commit_transaction.side_effect = [
        KafkaException(KafkaError(KafkaError._TIMED_OUT, "commit timed out", retriable=True)), None]
    delivery = master(producer)
    items = outgoing(3)

    delivery.commit(Term(4), items, [])

    # librdkafka refuses an abort while a timed-out commit is pending, and the commit may
    # have reached the coordinator: it is called again, which resumes it.
    producer.abort_transaction.assert_not_called()
    producer.init_transactions.assert_not_called()
    assert producer.commit_transaction.call_count == 2
    assert producer.produce.call_count == 6, "each message and its done, once"
    assert delivery.in_flight.snapshot() == {item.entry.delay_id for item in items}, "committed: in flight"


def test_a_commit_left_unconfirmed_when_the_term_ends_is_given_up_and_nothing_is_delivered_again():
    producer = mock.Mock(spec_set=Producer)
    term = Term(4)
    def time_out_and_lose_the_term(_timeout):
        term.end("ZooKeeper session lost")
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "commit timed out", retriable=True))
    producer.commit_transaction.side_effect = time_out_and_lose_the_term
    delivery = master(producer)

    with pytest.raises(LeadershipLost):
        delivery.commit(term, outgoing(2), [])

    assert producer.commit_transaction.call_count == 1
    producer.abort_transaction.assert_not_called()
    assert delivery.in_flight.snapshot() == set()


def test_a_commit_unconfirmed_for_longer_than_a_broker_stall_should_last_ends_the_term(monkeypatch):
    # A broker frozen or restarting: each short call times out and is resumed, and after
    # COMMIT_GIVE_UP_S the term ends, so the shard gets a master whose init_transactions
    # settles the transaction (the masters waited a minute in 30 s calls first).
    clock = [1000.0]
    monkeypatch.setattr(transactions.time, "monotonic", lambda: clock[0])
    calls = []

    def time_out(timeout):
        calls.append(timeout)
        clock[0] += timeout
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "commit timed out", retriable=True))

    producer = mock.Mock(spec_set=Producer)
    producer.commit_transaction.side_effect = time_out
    delivery = master(producer)

    with pytest.raises(LeadershipLost, match=r"the commit was not confirmed within [67]s"):
        delivery.commit(Term(4), outgoing(2), [])

    assert calls and all(timeout <= transactions.COMMIT_CALL_S for timeout in calls)
    assert sum(calls) >= transactions.COMMIT_GIVE_UP_S and sum(calls) < transactions.COMMIT_GIVE_UP_S + 3
    producer.abort_transaction.assert_not_called()
    assert delivery.in_flight.snapshot() == set(), "its ids wait for the next master's cover"


def test_an_abort_that_does_not_finish_ends_the_term_within_seconds():
    producer = mock.Mock(spec_set=Producer)
    producer.commit_transaction.side_effect = KafkaException(
        KafkaError(KafkaError._TIMED_OUT, "delivery timed out", retriable=False, txn_requires_abort=True))
    producer.abort_transaction.side_effect = KafkaException(
        KafkaError(KafkaError._TIMED_OUT, "Timed out waiting for operation to finish, retry call to resume",
                   retriable=True))
    delivery = master(producer)

    with pytest.raises(LeadershipLost, match="abort failed"):
        delivery.commit(Term(4), outgoing(1), [])

    producer.abort_transaction.assert_called_once_with(ABORT_TIMEOUT_S)
    assert ABORT_TIMEOUT_S <= 5


def test_a_transaction_that_cannot_commit_is_aborted_and_its_messages_tried_one_by_one():
    producer = mock.Mock(spec_set=Producer)
    producer.commit_transaction.side_effect = [
        KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "1 message(s) failed delivery",
                                  txn_requires_abort=True)),
        None, None]
    delivery = master(producer)
    items = outgoing(2)

    delivery.commit(Term(4), items, [])

    producer.abort_transaction.assert_called_once()
    assert producer.commit_transaction.call_count == 3
    assert delivery.in_flight.snapshot() == {item.entry.delay_id for item in items}


@pytest.mark.parametrize("routine", [True, False])
def test_a_term_that_ends_before_its_batch_commits_aborts_the_open_transaction(monkeypatch, routine):
    producer = mock.Mock(spec_set=Producer)
    delivery = master(producer)
    term = Term(4)
    monkeypatch.setattr(delivery, "start", lambda term: True)

    def build_a_batch_and_lose_the_term(term_: Term) -> None:
        producer.begin_transaction()
        producer.produce("orders", b"v")
        term.end("handed over to node-b (balance)" if routine else "a newer master holds epoch 5", routine=routine)
        delivery.transactions.commit(term, [])  # raises LeadershipLost: the term ended before the commit

    monkeypatch.setattr(delivery, "deliver_due", build_a_batch_and_lose_the_term)
    delivery.run(term)

    # Aborted by the master that opened it, not left for the next master's init_transactions to end.
    producer.abort_transaction.assert_called_once()
    producer.commit_transaction.assert_not_called()
    assert delivery.transactions.producer is None, "the term's producer is closed"


def test_a_stuck_transaction_ends_the_term_without_waiting_on_the_producer_again(monkeypatch):
    # An abort would be refused while the commit is pending, and a flush waits on the same stuck
    # records: each cost the soak 5 s more before the shard's lock passed on.
    producer = mock.Mock(spec_set=Producer)
    delivery = master(producer)
    monkeypatch.setattr(delivery, "start", lambda term: True)

    def stuck(term_: Term) -> None:
        raise TransactionStuck("the commit was not confirmed within 15s (timed out): the next master settles it")

    monkeypatch.setattr(delivery, "deliver_due", stuck)
    delivery.run(Term(4))

    producer.abort_transaction.assert_not_called()
    producer.flush.assert_called_once_with(0.0)
    assert delivery.transactions.producer is None


def test_a_fenced_master_whose_abort_fails_still_ends_its_term_quietly(monkeypatch):
    producer = mock.Mock(spec_set=Producer)
    producer.abort_transaction.side_effect = KafkaException(
        KafkaError(KafkaError._FENCED, "fenced by a newer instance", fatal=True))
    delivery = master(producer)
    term = Term(4)
    monkeypatch.setattr(delivery, "start", lambda term: True)

    def fenced(term_: Term) -> None:
        raise LeadershipLost("the master's producer failed: fenced")

    monkeypatch.setattr(delivery, "deliver_due", fenced)
    delivery.run(term)  # returns: never raises a Kafka error

    producer.abort_transaction.assert_called_once()
    assert delivery.transactions.producer is None


class SlowCoordinator:
    """init_transactions calls that each time out after their whole timeout, on a clock of the test's."""

    def __init__(self, monkeypatch):
        self.now = 1000.0
        monkeypatch.setattr(transactions.time, "monotonic", lambda: self.now)

    def times_out(self, timeout_s: float) -> None:
        self.now += timeout_s
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "init timed out", retriable=True))


def waited(producer: mock.Mock) -> float:
    """How long ``producer``'s init_transactions calls were given, together."""
    return sum(call.args[0] for call in producer.init_transactions.call_args_list)


def test_an_init_that_times_out_is_tried_again_with_a_new_producer_and_twice_as_long(monkeypatch):
    # A transaction coordinator whose broker was killed: librdkafka asks that broker until it is back;
    # a new producer finds the coordinator Kafka moved, and a live but slow one gets longer calls.
    coordinator = SlowCoordinator(monkeypatch)
    producers = [mock.Mock(spec_set=Producer) for _ in range(3)]
    producers[0].init_transactions.side_effect = coordinator.times_out
    producers[1].init_transactions.side_effect = coordinator.times_out
    delivery = master(producers[0])
    spare = iter(producers[1:])
    monkeypatch.setattr(delivery.transactions.spare, "take", lambda: next(spare))
    monkeypatch.setattr(delivery.cover, "cover", lambda _term: True)
    monkeypatch.setattr(delivery.wakeup, "sleep_until", lambda _due, _term: None)

    assert delivery.start(Term(4)) is True

    assert [waited(p) for p in producers[:2]] == [pytest.approx(INIT_CALL_S), pytest.approx(2 * INIT_CALL_S)]
    for p in producers[:2]:  # each call a slice, resumed: short ones (FIRST_ASK_S) for a slice, unanswered, then full
        slices = [c.args[0] for c in p.init_transactions.call_args_list]
        shorts = [x for x in slices if x == pytest.approx(FIRST_ASK_S)]
        assert slices[:len(shorts)] == shorts and sum(shorts) == pytest.approx(FENCE_SLICE_S, abs=FIRST_ASK_S)
        assert set(slices[len(shorts):-1]) == {FENCE_SLICE_S}
    assert producers[2].init_transactions.call_count == 1
    assert delivery.transactions.producer is producers[2]
    for closed in producers[:2]:
        closed.flush.assert_called()  # closed before the next was taken


def test_a_term_that_ends_during_a_long_init_stops_waiting_within_a_slice(monkeypatch):
    # The node stops (SIGTERM) while its new master waits for a lost coordinator: it must not wait out the call.
    coordinator = SlowCoordinator(monkeypatch)
    term = Term(4)
    producer = mock.Mock(spec_set=Producer)

    def times_out_then_the_node_stops(timeout_s: float) -> None:
        if producer.init_transactions.call_count == 2:
            term.end("the node is stopping", routine=True)
        coordinator.times_out(timeout_s)

    producer.init_transactions.side_effect = times_out_then_the_node_stops
    delivery = master(producer)
    monkeypatch.setattr(delivery.wakeup, "sleep_until", lambda _due, _term: None)

    assert delivery.start(term) is False

    assert waited(producer) == pytest.approx(2 * FIRST_ASK_S)


def test_an_init_the_coordinator_answered_busy_is_resumed_on_the_same_producer_at_once(monkeypatch):
    # The coordinator still loads its log, or ends the previous master's transaction (its partitions wait for new
    # leaders after a broker was lost): librdkafka goes on in the background, and calling again resumes it there.
    # Only a first answer CONCURRENT_TRANSACTIONS is asked again by the other spare (see the next test).
    def busy(code: int) -> KafkaException:
        return KafkaException(KafkaError(code, "Failed to initialize Producer ID: busy", retriable=True))

    producer = mock.Mock(spec_set=Producer)
    producer.init_transactions.side_effect = [busy(KafkaError.COORDINATOR_LOAD_IN_PROGRESS),
                                              busy(KafkaError.CONCURRENT_TRANSACTIONS), None]
    delivery = master(producer)
    monkeypatch.setattr(delivery.transactions.spare, "take",
                        lambda: pytest.fail("a new producer was taken for a busy coordinator"))
    monkeypatch.setattr(delivery.cover, "cover", lambda _term: True)
    slept: list[int] = []
    monkeypatch.setattr(delivery.wakeup, "sleep_until", lambda due, _term: slept.append(due))

    assert delivery.start(Term(4)) is True

    assert [c.args[0] for c in producer.init_transactions.call_args_list] == [
        pytest.approx(FIRST_ASK_S), FENCE_SLICE_S, FENCE_SLICE_S]
    assert not slept, "a resumed init waited before calling again"
    producer.flush.assert_not_called()
    assert delivery.transactions.producer is producer
    assert delivery.failing is None, "still failing after the init went through"


def test_a_transaction_the_previous_master_left_open_costs_one_short_ask_not_librdkafkas_pid_timer(monkeypatch):
    # Killed mid-transaction: the first ask makes the coordinator abort it and is answered CONCURRENT_TRANSACTIONS;
    # librdkafka would ask again after 500 ms. The first producer is closed and the other spare asks at once.
    concurrent = KafkaException(KafkaError(KafkaError.CONCURRENT_TRANSACTIONS, "ongoing", retriable=True))
    first, second = mock.Mock(spec_set=Producer), mock.Mock(spec_set=Producer)
    first.init_transactions.side_effect = concurrent
    second.init_transactions.side_effect = [concurrent, None]  # still aborting: resumed on the same producer
    delivery = master(first)
    spares = iter([second])
    monkeypatch.setattr(delivery.transactions.spare, "take", lambda: next(spares))
    monkeypatch.setattr(delivery.cover, "cover", lambda _term: True)
    monkeypatch.setattr(delivery.wakeup, "sleep_until", lambda _due, _term: None)

    assert delivery.start(Term(4)) is True

    assert [c.args[0] for c in first.init_transactions.call_args_list] == [pytest.approx(FIRST_ASK_S)]
    first.close.assert_called_once()
    assert [c.args[0] for c in second.init_transactions.call_args_list] == [FENCE_SLICE_S] * 2
    assert delivery.transactions.producer is second


def unreadable_ends() -> KafkaException:
    return KafkaException(KafkaError(KafkaError._TIMED_OUT, "no end offset for buffer partitions [0]", retriable=True))


def test_a_cover_whose_end_offsets_cannot_be_read_keeps_the_producer_and_its_fencing(monkeypatch):
    # A broker lost: its partitions' end offsets cannot be read until Kafka elects new leaders. No
    # transaction is open then, and a new producer's init_transactions would wait for the coordinator and
    # for the markers of what the last one left open (2.3 s more stall in test_replicated_kafka).
    producer = mock.Mock(spec_set=Producer)
    delivery = master(producer)
    term = Term(4)
    delivery.feed.read_ends.side_effect = [unreadable_ends(), unreadable_ends(), {0: 5, 1: 7}]
    delivery.feed.wait_until_read.return_value = True
    delivery.feed.held_back.return_value = []
    delivery.feed.positions.return_value = {0: 5, 1: 7}
    delivery.feed.ledger.handled.return_value = {}
    monkeypatch.setattr(delivery.wakeup, "sleep_until", lambda _due, _term: None)

    assert delivery.start(term) is True

    producer.init_transactions.assert_called_once()  # fenced once, not again after each failed read
    producer.flush.assert_not_called()  # never closed
    assert delivery.transactions.producer is producer and delivery.failing is None
    assert delivery.feed.read_ends.call_count == 3


def test_delivery_that_cannot_read_its_cover_waits_with_the_same_producer(monkeypatch):
    producer = mock.Mock(spec_set=Producer)
    delivery = master(producer)
    term = Term(4)
    monkeypatch.setattr(delivery, "start", lambda term_: True)
    monkeypatch.setattr(delivery.wakeup, "sleep_until", lambda _due, _term: None)
    calls = []

    def deliver_due(term_: Term) -> int:
        calls.append(delivery.transactions.producer)
        if len(calls) < 3:
            delivery.cover.read_ends()  # the buffer's end offsets cannot be read
        term.end("done")
        return 0

    delivery.feed.read_ends.side_effect = unreadable_ends()
    monkeypatch.setattr(delivery, "deliver_due", deliver_due)
    delivery.run(term)

    assert calls == [producer, producer, producer], "the same producer, never closed and opened again"
    producer.init_transactions.assert_not_called()
