"""A node with no store of a shard copies the store of a node that holds it, and reads the buffer on from there.

The judge is what reaches the target topic after the node that copied became the master (the one it
copied from killed): every message put before or after the copy exactly once, none whose cancel came
after the copy, none early. Whether it copied is read from its metrics and from what it ingested.
"""

from __future__ import annotations

from collections import Counter

import pytest
from support.kafka_testing import create_topics, read_topic
from support.process_testing import wait_until
from support.service_testing import Feeder, now_ms

from delayq import wire

pytestmark = pytest.mark.integration


def test_a_new_node_copies_a_holders_store_and_delivers_exactly_what_the_buffer_says_after_it(cluster, settings,
                                                                                              names):
    target = names.topic("target")
    create_topics(settings.bootstrap_servers, [target], partitions=2)
    feeder = Feeder(settings)
    due = now_ms() + 30_000
    before = [feeder.put(target, f"b{i}".encode(), due + i, key=f"k{i}".encode()) for i in range(3000)]
    feeder.flush()
    holder = cluster.start("node-a")
    assert wait_until(lambda: holder.metric("delayq_pending") == 3000, timeout_s=30)

    copier = cluster.start("node-b")  # every node holds every shard (R = 0): node-a's store is a copy's source
    assert wait_until(lambda: copier.metric("delayq_pending") == 3000, timeout_s=30), copier.log_tail()
    assert copier.metric("delayq_store_copies_total", shard="0") == 1, copier.log_tail()
    assert copier.stores_rebuilt() == 0
    # It read none of the puts from the buffer: they came in the copy, with the offsets to read on from.
    assert copier.metric("delayq_ingested_total", op="put") == 0
    assert "store copied from node-a" in copier.own_log()

    # After the copy: more puts, and cancels of some puts the copy holds.
    after = [feeder.put(target, f"a{i}".encode(), due + i, key=f"k{i}".encode()) for i in range(500)]
    cancelled = before[:400]
    for delay_id in cancelled:
        feeder.cancel(delay_id)
    feeder.flush()
    assert wait_until(lambda: copier.metric("delayq_pending") == 3100 == holder.metric("delayq_pending"),
                      timeout_s=30), (copier.metric("delayq_pending"), holder.metric("delayq_pending"))

    holder.kill()  # the copier masters the shard from now on: it alone delivers
    assert wait_until(lambda: copier.metric("delayq_is_master", shard="0") == 1, timeout_s=30)
    expected = set(before[400:]) | set(after)
    records = read_topic(settings.bootstrap_servers, target, expect=len(expected),
                         timeout_s=max(60.0, (due - now_ms()) / 1000 + 60), idle_s=3)
    delivered = Counter(dict(r.headers())[wire.ID].decode() for r in records)
    assert {i for i, n in delivered.items() if n > 1} == set()
    assert set(delivered) == expected, (len(expected - set(delivered)), len(set(delivered) - expected))
    early = [r for r in records if r.timestamp()[1] < int(dict(r.headers())[wire.DELIVER_AT])]
    assert not early
