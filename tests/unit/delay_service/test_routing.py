"""Where a master's picks go (delay_service/routing.py, Router): now, after a limit, after a back-off, dead-lettered.

Pure: a stand-in store and producer (spec_set), no servers.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace
from unittest import mock

from confluent_kafka import KafkaError, Producer

from delayq import Settings, wire
from delayq.delay_service import stored
from delayq.delay_service.limits import DispatchLimiter
from delayq.delay_service.routing import Router
from delayq.store import StoredEntry, TimeIndex

NOW = 1_800_000_000_000
LOG = logging.LoggerAdapter(logging.getLogger("test"), {})


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def topics(**partitions: int | None) -> mock.Mock:
    """A producer whose metadata has these topics (None: the topic's metadata carries an error)."""
    producer = mock.Mock(spec_set=Producer)

    def list_topics(topic: str, timeout: float) -> SimpleNamespace:
        count = partitions.get(topic.replace("-", "_"), 0)
        if count == 0:
            return SimpleNamespace(topics={})
        if count is None:
            error = mock.Mock(spec_set=KafkaError)
            error.code.return_value = KafkaError.TOPIC_AUTHORIZATION_FAILED
            return SimpleNamespace(topics={topic: SimpleNamespace(error=error, partitions={})})
        return SimpleNamespace(topics={topic: SimpleNamespace(error=None, partitions=dict.fromkeys(range(count)))})

    producer.list_topics.side_effect = list_topics
    return producer


def router(settings: Settings | None = None, **partitions: int | None) -> Router:
    return Router(settings or Settings(), 1, mock.Mock(spec_set=TimeIndex), LOG, lambda: topics(**partitions))


def entry(topic: str, n: int = 0, *, key: bytes | None = None, partition: int | None = None,
          expires_at_ms: int | None = None) -> StoredEntry:
    delay_id = wire.new_delay_id()
    message = wire.Envelope(delay_id, topic, NOW + n, b"v", key=key, partition=partition, expires_at_ms=expires_at_ms)
    return StoredEntry(delay_id, NOW + n, stored.pack(0, 10 + n, message), 10 + n)


def test_a_pick_goes_to_its_partition_or_its_keys_and_the_topic_is_asked_once():
    producer = topics(orders=6)
    routes = Router(Settings(), 1, mock.Mock(spec_set=TimeIndex), LOG, lambda: producer)
    fixed, keyed, unkeyed = entry("orders", partition=4), entry("orders", 1, key=b"k"), entry("orders", 2)
    outgoing, dead = routes.route([fixed, keyed, unkeyed], NOW + 10)
    assert [o.entry.delay_id for o in outgoing] == [fixed.delay_id, keyed.delay_id, unkeyed.delay_id] and not dead
    assert outgoing[0].target_partition == 4 and 0 <= outgoing[1].target_partition < 6
    assert outgoing[2].target_partition == -1, "no key and no partition: the producer's partitioner chooses"
    routes.route([entry("orders", 3)], NOW + 10)
    assert producer.list_topics.call_count == 1, "the partition count is cached"


def test_a_forbidden_topic_is_dead_lettered_at_once_and_a_missing_one_after_its_attempts():
    forbidding = router(Settings(target_topics=["orders"]), orders=1)
    outgoing, dead = forbidding.route([entry("payments")], NOW)
    assert not outgoing and [d.code for d in dead] == [wire.Reason.FORBIDDEN_TOPIC]

    routes = router(Settings(delivery_max_attempts=3, delivery_retry_backoff_ms=100))
    missing = entry("gone")
    for attempt in (1, 2):
        outgoing, dead = routes.route([missing], NOW)
        assert not outgoing and not dead, f"attempt {attempt} is retried"
        assert routes.held(set(), NOW) == {missing.delay_id}, "in back-off: out of the picks"
        assert routes.next_try_ms(NOW) == NOW + 100 * 2 ** (attempt - 1)
    outgoing, dead = routes.route([missing], NOW)
    assert [(d.item.entry.delay_id, d.code) for d in dead] == [(missing.delay_id, wire.Reason.MISSING_TOPIC)]
    routes.delivered([missing.delay_id])
    assert routes.held(set(), NOW + 10_000) == set() and routes.next_try_ms(NOW) is None


def test_a_partition_the_topic_lacks_an_unreadable_entry_and_an_expired_message():
    routes = router(Settings(delivery_max_attempts=1), orders=2)
    beyond, expired = entry("orders", partition=5), entry("orders", expires_at_ms=NOW + 5)
    damaged = StoredEntry(wire.new_delay_id(), NOW, b"not a stored value", 1)
    outgoing, dead = routes.route([beyond, damaged, expired], NOW + 10)
    assert not outgoing
    assert [(d.item.entry.delay_id, d.code) for d in dead] == [(beyond.delay_id, wire.Reason.BAD_PARTITION),
                                                              (expired.delay_id, wire.Reason.EXPIRED)]
    assert routes.unreadable == {damaged.delay_id} and damaged.delay_id in routes.held(set(), NOW)


def test_a_topic_the_principal_may_not_see_is_forbidden_not_missing():
    routes = router(Settings(delivery_max_attempts=1), secret=None)
    outgoing, dead = routes.route([entry("secret")], NOW)
    assert not outgoing and [d.code for d in dead] == [wire.Reason.FORBIDDEN_TOPIC]
    assert "TOPIC_AUTHORIZATION_FAILED" in dead[0].text


def test_messages_over_a_limit_wait_in_due_order_and_one_cancelled_while_it_waited_is_dropped():
    clock = Clock()
    settings = Settings(dispatch_limits={"orders": {"rate": 10, "burst": 2}})
    routes = router(settings, orders=1)
    routes.limiter = DispatchLimiter(settings, 1, clock=clock)
    entries = [entry("orders", n) for n in range(5)]
    ids = [e.delay_id for e in entries]
    outgoing, dead = routes.route(entries, NOW + 10)
    assert [o.entry.delay_id for o in outgoing] == ids[:2] and not dead  # the burst
    assert routes.held(set(), NOW) >= set(ids[2:])  # the rest wait, out of the picks
    assert routes.release_waiting() == []  # the bucket is empty
    by_id = {e.delay_id: e for e in entries}
    store = routes.store
    assert isinstance(store, mock.Mock)
    store.get.side_effect = lambda i: None if i == ids[2] else by_id[i]  # ids[2] was cancelled meanwhile
    clock.now += 0.2  # two tokens
    assert [o.entry.delay_id for o in routes.release_waiting()] == ids[3:5]
    assert not routes.waiting and not routes.waiting_ids
