"""The embedded stack is a real Kafka broker and a real ZooKeeper: transactions, fencing, sessions."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaException, Producer
from kazoo.client import KazooClient
from support.kafka_testing import create_topics, read_topic

pytestmark = pytest.mark.integration


def test_produce_and_consume_round_trip(dev_stack, names):
    topic = names.topic()
    create_topics(dev_stack.bootstrap_servers, [topic])
    producer = Producer({"bootstrap.servers": dev_stack.bootstrap_servers})
    for i in range(10):
        producer.produce(topic, key=f"k{i}".encode(), value=f"v{i}".encode(), headers=[("h", b"x")])
    assert producer.flush(30) == 0

    records = read_topic(dev_stack.bootstrap_servers, topic, expect=10)

    assert [(r.key(), r.value()) for r in records] == [(f"k{i}".encode(), f"v{i}".encode()) for i in range(10)]
    assert all(r.headers() == [("h", b"x")] for r in records)


def test_read_committed_sees_committed_and_not_aborted_records(dev_stack, names):
    topic = names.topic()
    create_topics(dev_stack.bootstrap_servers, [topic])
    producer = Producer({"bootstrap.servers": dev_stack.bootstrap_servers, "transactional.id": names.topic("tx")})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, value=b"committed")
    producer.commit_transaction(30)
    producer.begin_transaction()
    producer.produce(topic, value=b"aborted")
    producer.flush(30)
    producer.abort_transaction(30)

    committed_view = read_topic(dev_stack.bootstrap_servers, topic, idle_s=2)
    uncommitted_view = read_topic(dev_stack.bootstrap_servers, topic, isolation="read_uncommitted", idle_s=2)

    assert [r.value() for r in committed_view] == [b"committed"]
    assert sorted(r.value() for r in uncommitted_view) == [b"aborted", b"committed"]


def test_second_producer_with_same_transactional_id_fences_the_first(dev_stack, names):
    topic = names.topic()
    create_topics(dev_stack.bootstrap_servers, [topic])
    conf = {"bootstrap.servers": dev_stack.bootstrap_servers, "transactional.id": names.topic("tx")}
    old = Producer(conf)
    old.init_transactions(30)
    old.begin_transaction()
    old.produce(topic, value=b"from the old producer")
    old.flush(30)

    new = Producer(conf)
    new.init_transactions(30)  # bumps the epoch: the old producer is fenced, its transaction aborted
    new.begin_transaction()
    new.produce(topic, value=b"from the new producer")
    new.commit_transaction(30)

    with pytest.raises(KafkaException) as fenced:
        old.produce(topic, value=b"late write")
        old.commit_transaction(30)
    assert fenced.value.args[0].fatal() or "fenced" in str(fenced.value).lower()
    assert [r.value() for r in read_topic(dev_stack.bootstrap_servers, topic, idle_s=2)] == [b"from the new producer"]


def test_ephemeral_znode_disappears_when_its_session_closes(dev_stack, names):
    owner = KazooClient(hosts=dev_stack.zk_connect)
    owner.start(timeout=10)
    path = owner.create(f"{names.zk_root}/member", b"alive", ephemeral=True, makepath=True)
    observer = KazooClient(hosts=dev_stack.zk_connect)
    observer.start(timeout=10)
    try:
        assert observer.exists(path) is not None
        owner.stop()
        owner.close()
        assert observer.exists(path) is None
    finally:
        observer.delete(names.zk_root, recursive=True)
        observer.stop()
        observer.close()
