"""SpareProducer's bookkeeping: one spare made ahead, handed to one term, made now when there is none."""

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


def test_a_prepared_spare_is_made_once_and_handed_to_the_next_term(made):
    producers, _ = made
    spare = SpareProducer(Settings(), 3)
    spare.prepare()
    spare.prepare()  # a second call while one is ready or on its way makes no other
    taken = spare.take()
    assert producers == [taken]
    assert spare.take() is not taken  # the next term without a prepare gets one made then
    assert len(producers) == 2


def test_take_waits_for_the_spare_on_its_way_rather_than_making_another(made):
    producers, gate = made
    gate.clear()
    spare = SpareProducer(Settings(), 0)
    spare.prepare()
    got: list[Producer] = []
    taker = threading.Thread(target=lambda: got.append(spare.take()))
    taker.start()
    taker.join(0.3)
    assert taker.is_alive() and not producers  # waiting for the spare being made
    gate.set()
    taker.join(10)
    assert got == producers and len(producers) == 1


def test_a_spare_that_could_not_connect_leaves_the_term_to_make_its_own(monkeypatch):
    calls: list[str] = []

    def make(settings: Settings, shard: int) -> Producer:
        calls.append("make")
        if len(calls) == 1:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "broker down"))
        return mock.Mock(spec_set=Producer)

    monkeypatch.setattr(module, "master_producer", make)
    spare = SpareProducer(Settings(), 0)
    spare.prepare()
    assert spare.take() is not None
    assert calls == ["make", "make"]


def test_a_closed_seat_drops_its_spare_and_prepares_no_more(made):
    producers, gate = made
    gate.clear()
    spare = SpareProducer(Settings(), 0)
    spare.prepare()
    spare.close()  # while the spare is being made
    gate.set()
    spare.prepare()
    assert spare.take() is not None  # made then: the one on its way was dropped
    assert len(producers) == 2
