"""SpareProducer's bookkeeping: two spares made ahead, handed out in turn, one made now when there is none."""

from __future__ import annotations

import threading
from unittest import mock

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer

from delayq import Settings
from delayq.delay_service import master_producer as module
from delayq.delay_service.master_producer import SpareProducer


@pytest.fixture
def made(monkeypatch):
    """The producers master_producer made, in order (stand-ins: no Kafka here)."""
    producers: list[Producer] = []
    gate = threading.Event()
    gate.set()

    def make(settings: Settings, shard: int) -> Producer:
        gate.wait(10)
        producer = mock.Mock(spec_set=Producer)
        producers.append(producer)
        return producer

    monkeypatch.setattr(module, "master_producer", make)
    return producers, gate


def test_two_spares_are_made_once_and_handed_out_in_turn(made):
    producers, _ = made
    spare = SpareProducer(Settings(), 3)
    spare.prepare()
    spare.prepare()  # a second call while they are ready or on their way makes no more
    first = spare.take()
    second = spare.take()  # the one a fence asks with when the first found a transaction open
    assert sorted(map(id, producers)) == sorted(map(id, [first, second])) and first is not second
    assert spare.take() not in (first, second)  # none left: made then
    assert len(producers) == 3


def test_prepare_tops_up_to_two(made):
    producers, _ = made
    spare = SpareProducer(Settings(), 3)
    spare.prepare()
    spare.take()
    spare.prepare()  # one left, one more made
    spare.take()
    spare.take()
    assert len(producers) == 3


def test_take_waits_for_the_spare_on_its_way_rather_than_making_another(made):
    producers, gate = made
    gate.clear()
    spare = SpareProducer(Settings(), 0)
    spare.prepare()
    got: list[Producer] = []
    taker = threading.Thread(target=lambda: got.append(spare.take()))
    taker.start()
    taker.join(0.3)
    assert taker.is_alive() and not producers  # waiting for the spares being made
    gate.set()
    taker.join(10)
    # The taker got the first spare made; the second may still be on its way: count once both are made.
    for maker in [t for t in threading.enumerate() if t.name == "spare-producer-0"]:
        maker.join(10)
    assert len(got) == 1 and got[0] in producers and len(producers) == 2


def test_spares_that_could_not_connect_leave_the_term_to_make_its_own(monkeypatch):
    calls: list[str] = []

    def make(settings: Settings, shard: int) -> Producer:
        calls.append("make")
        if len(calls) <= 2:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "broker down"))
        return mock.Mock(spec_set=Producer)

    monkeypatch.setattr(module, "master_producer", make)
    spare = SpareProducer(Settings(), 0)
    spare.prepare()
    assert spare.take() is not None
    assert calls == ["make", "make", "make"]


def test_a_closed_seat_drops_its_spare_and_prepares_no_more(made):
    producers, gate = made
    gate.clear()
    spare = SpareProducer(Settings(), 0)
    spare.prepare()
    spare.close()  # while the spare is being made
    gate.set()
    spare.prepare()
    assert spare.take() is not None  # made then: the ones on their way were dropped
    assert len(producers) == 3


def test_closing_the_seat_closes_its_ready_spares_rather_than_dropping_them(made):
    producers, _ = made
    spare = SpareProducer(Settings(), 0)
    spare.prepare()
    for maker in [t for t in threading.enumerate() if t.name == "spare-producer-0"]:
        maker.join(10)
    assert len(producers) == 2
    spare.close()
    for closing in [t for t in threading.enumerate() if t.name == "delayq-close-spare"]:
        closing.join(10)
    for producer in producers:
        producer.purge.assert_called_once_with(in_queue=True, in_flight=True)
        producer.close.assert_called_once_with()


def test_a_spare_made_after_the_seat_closed_is_closed_once_made(made):
    producers, gate = made
    gate.clear()
    spare = SpareProducer(Settings(), 0)
    spare.prepare()
    spare.close()  # while both are being made
    gate.set()
    for maker in [t for t in threading.enumerate() if t.name in ("spare-producer-0", "delayq-close-spare")]:
        maker.join(10)
    for closing in [t for t in threading.enumerate() if t.name == "delayq-close-spare"]:
        closing.join(10)
    assert len(producers) == 2
    assert all(p.close.call_count == 1 for p in producers)
