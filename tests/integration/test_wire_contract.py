"""The buffer's wire contract, enforced on the real stack by every node (issue: the wire contract).

A cancel written with a Java client's partitioner lands off its id's partition: it is
dead-lettered as ``wrong-partition`` and the put it meant to cancel is delivered once,
also by a node that rebuilt its store from the buffer. One malformed record yields one
dead letter, whatever the number of nodes, restarts and rebuilds.
"""

from __future__ import annotations

import shutil
import time
from collections import Counter

import pytest
from confluent_kafka import Producer
from support.kafka_testing import create_topics, read_topic
from support.process_testing import wait_until
from support.service_testing import Feeder, now_ms

from delayq import wire
from delayq.delay_service.partitioners import murmur2
from delayq.wire import new_delay_id

pytestmark = pytest.mark.integration

NODES = ("node-a", "node-b", "node-c")


def java_partition(delay_id: str, partitions: int) -> int:
    """Where Java's default partitioner (murmur2 of the key) puts a keyed record."""
    return (murmur2(delay_id.encode()) & 0x7FFFFFFF) % partitions


def an_id_java_puts_elsewhere(partitions: int) -> str:
    while True:
        delay_id = new_delay_id()
        if java_partition(delay_id, partitions) != wire.buffer_partition(delay_id, partitions):
            return delay_id


def dead_letters(settings, expect: int, timeout_s: float = 30) -> list:
    return read_topic(settings.bootstrap_servers, settings.dead_letter_topic, expect=expect, timeout_s=timeout_s,
                      idle_s=3)


def reason_of(record) -> str:
    return dict(record.headers())[wire.DEAD_LETTER_REASON].decode()


def all_forgotten(cluster) -> bool:
    """Every running node's store holds no malformed record the master has not dead-lettered."""
    return all(n.metric("delayq_malformed_waiting") == 0 for n in cluster.nodes.values()
               if n.process.poll() is None)


@pytest.mark.timeout(240)
def test_a_java_partitioned_cancel_is_dead_lettered_and_its_put_is_delivered_once_even_after_a_rebuild(
        cluster, settings, names):
    target = names.topic("target")
    create_topics(settings.bootstrap_servers, [target])
    partitions = settings.buffer_partitions
    first = cluster.start("node-a")
    feeder = Feeder(settings)
    delay_id = an_id_java_puts_elsewhere(partitions)
    feeder.put(target, b"still wanted", now_ms() + 12_000, delay_id=delay_id)
    feeder.flush()
    # What a Java KafkaProducer with its default partitioner writes for a cancel of that id.
    java = Producer(settings.kafka_conf())
    java.produce(settings.buffer_topic, key=delay_id.encode(), value=None, partition=java_partition(delay_id, partitions),
                 headers=wire.control_headers(wire.OP_CANCEL, delay_id))
    assert java.flush(10) == 0

    [letter] = dead_letters(settings, expect=1)
    assert reason_of(letter).startswith("wrong-partition: ")
    assert letter.key() == delay_id.encode() and letter.value() is None
    source = dict(letter.headers())[wire.DEAD_LETTER_SOURCE].decode()
    assert source.startswith(f"{settings.buffer_topic}/{java_partition(delay_id, partitions)}/")
    assert first.get_json(f"/v1/messages/{delay_id}")[1]["status"] == "pending"

    # A node that rebuilds from the buffer reads the wrong-partition cancel again: it still does not count.
    assert first.stop() == 0
    shutil.rmtree(first.data_dir)
    rebuilt = cluster.start("node-a")
    assert rebuilt.get_json(f"/v1/messages/{delay_id}")[1]["status"] == "pending"

    delivered = read_topic(settings.bootstrap_servers, target, expect=1, timeout_s=30, idle_s=3)
    assert [dict(r.headers())[wire.ID].decode() for r in delivered] == [delay_id]
    assert [r.value() for r in delivered] == [b"still wanted"]
    assert wait_until(lambda: all_forgotten(cluster), timeout_s=20)
    assert len(dead_letters(settings, expect=2, timeout_s=5)) == 1, "dead-lettered again after the rebuild"


@pytest.mark.timeout(300)
def test_one_malformed_record_is_one_dead_letter_with_three_nodes_a_restart_and_a_wiped_node(
        cluster, settings, names):
    target = names.topic("target")
    create_topics(settings.bootstrap_servers, [target])
    for node_id in NODES:
        cluster.start(node_id)
    feeder = Feeder(settings)
    bad = [new_delay_id() for _ in range(3)]
    feeder.raw(bad[0].encode(), b"no frame at all", [])
    feeder.raw(bad[1].encode(), f"put {now_ms()} {target} - bogus=1\n".encode(), [])
    feeder.raw(b"order-17", f"put {now_ms()} {target} -\n".encode(), [])
    good = feeder.put(target, b"fine", now_ms() + 500)
    feeder.flush()
    assert len(read_topic(settings.bootstrap_servers, target, expect=1, timeout_s=20)) == 1

    def copies() -> Counter:
        return Counter(dict(r.headers())[wire.DEAD_LETTER_SOURCE] for r in dead_letters(settings, expect=99,
                                                                                         timeout_s=4))

    assert wait_until(lambda: all_forgotten(cluster), timeout_s=30)
    first = copies()
    assert sorted(first.values()) == [1, 1, 1], first

    # The master restarts (a new term reads the ledger); a standby loses its disk and rebuilds.
    master = cluster.master()
    assert master.stop() == 0
    cluster.start(next(n for n, p in cluster.nodes.items() if p is master))
    standby = next(p for p in cluster.nodes.values() if p is not master and p.process.poll() is None
                   and p.metric("delayq_is_master") == 0)
    standby_id = next(n for n, p in cluster.nodes.items() if p is standby)
    assert standby.stop() == 0
    shutil.rmtree(standby.data_dir)
    cluster.start(standby_id)
    # Then the master changes hands once more, to be sure a master that never wrote them knows.
    master = cluster.master()
    assert master.stop() == 0
    cluster.master(timeout_s=30, other_than=master)
    time.sleep(2)
    assert wait_until(lambda: all_forgotten(cluster), timeout_s=30)

    assert copies() == first
    reasons = sorted(reason_of(r).split(":")[0] for r in dead_letters(settings, expect=99, timeout_s=4))
    assert reasons == ["bad-frame", "bad-id", "unknown-option"]
    assert good
