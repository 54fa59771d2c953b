"""The spare master producer a node makes while it waits in line for a shard, against the real Kafka."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaException
from support.kafka_testing import create_topics, read_topic

from delayq.delay_service.master_producer import SpareProducer, master_producer

pytestmark = pytest.mark.integration


def test_a_spare_made_beside_the_live_master_fences_it_only_when_its_term_begins(settings, names):
    target = names.topic("target")
    create_topics(settings.bootstrap_servers, [target])
    live = master_producer(settings, 0)
    live.init_transactions(30)
    live.begin_transaction()
    live.produce(target, b"before the spare")
    live.flush(10)

    spare = SpareProducer(settings, 0)
    spare.prepare()
    taken = spare.take()  # made and connected while the live master's transaction is open

    # The live master goes on: its open transaction commits, and so does another.
    live.commit_transaction(30)
    live.begin_transaction()
    live.produce(target, b"beside the spare")
    live.commit_transaction(30)

    taken.init_transactions(30)  # the term begins: now, and only now, the live master is fenced
    with pytest.raises(KafkaException) as fenced:
        live.begin_transaction()
        live.produce(target, b"after the fence")
        live.commit_transaction(30)
    assert fenced.value.args[0].fatal(), fenced.value
    taken.begin_transaction()
    taken.produce(target, b"the new master")
    taken.commit_transaction(30)

    values = [r.value() for r in read_topic(settings.bootstrap_servers, target, expect=4, timeout_s=20, idle_s=2)]
    assert values == [b"before the spare", b"beside the spare", b"the new master"]
