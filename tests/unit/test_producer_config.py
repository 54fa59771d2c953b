"""delayq.Producer without a broker: its settings, due-time arithmetic and delay ids.

Nothing here reaches Kafka: the producers point at a closed port and are purged. What
reaches the broker, and what must not, is tested in tests/integration/test_producer.py.
"""

from __future__ import annotations

import os
import time
import uuid
from datetime import datetime, timedelta, timezone

import pytest

import delayq
from delayq.proxy import check_delay_id, parse_buffer_record
from delayq.proxy import producer as producer_module
from delayq.proxy.producer import _ticks, due_ms

NOWHERE = {"bootstrap.servers": "127.0.0.1:9", "log_level": 0}


@pytest.fixture
def producer():
    producer = delayq.Producer(dict(NOWHERE))
    yield producer
    producer.purge()


def test_delayq_conf_keys_become_settings_and_never_reach_librdkafka():
    conf = {**NOWHERE, "delayq.cluster": "orders", "delayq.max.delay.ms": 60_000,
            "delayq.lookup.urls": "http://a:1, http://b:2/"}

    producer = delayq.Producer(conf)

    # librdkafka refuses unknown properties, so constructing at all proves the keys were taken out.
    assert producer.settings.cluster == "orders"
    assert producer.settings.buffer_topic == "delayq-orders-buffer"
    assert producer.settings.max_delay_ms == 60_000
    assert producer.settings.lookup_urls == ["http://a:1", "http://b:2/"]
    assert conf["delayq.cluster"] == "orders", "the caller's conf dict was modified"


def test_delayq_keys_are_taken_from_keyword_arguments_too():
    producer = delayq.Producer(**{**NOWHERE, "delayq.buffer.topic": "my-buffer"})

    assert producer.settings.buffer_topic == "my-buffer"


def test_environment_settings_apply_and_conf_keys_override_them(monkeypatch):
    monkeypatch.setenv("DELAYQ_CLUSTER", "from-env")
    monkeypatch.setenv("DELAYQ_MAX_DELAY_MS", "5000")

    producer = delayq.Producer({**NOWHERE, "delayq.max.delay.ms": "7000"})

    assert (producer.settings.cluster, producer.settings.max_delay_ms) == ("from-env", 7000)


def test_an_unknown_delayq_key_is_refused_by_name():
    with pytest.raises(ValueError, match=r"conf key 'delayq.bufer.topic' is not a delayq setting; known: .*"
                                         r"delayq\.buffer\.topic"):
        delayq.Producer({**NOWHERE, "delayq.bufer.topic": "x"})


def test_an_invalid_delayq_value_names_the_key():
    with pytest.raises(ValueError, match=r"conf key 'delayq\.max\.delay\.ms' = 0: Input should be greater than or equal to 1"):
        delayq.Producer({**NOWHERE, "delayq.max.delay.ms": 0})


NOW = 1_800_000_000_000
DAY = 86_400_000


@pytest.mark.parametrize("delay,deliver_at,expected", [
    (30, None, NOW + 30_000),
    (0, None, NOW),
    (0.25, None, NOW + 250),
    (timedelta(minutes=2), None, NOW + 120_000),
    (timedelta(microseconds=1500), None, NOW + 2),  # half a millisecond rounds up
    (None, NOW + 5, NOW + 5),
    (None, NOW - 60_000, NOW - 60_000),  # already past: kept, delivered as soon as possible
    (None, datetime.fromtimestamp((NOW + 1234) / 1000, timezone.utc), NOW + 1234),
    (None, datetime.fromtimestamp((NOW + 1234) / 1000, timezone(timedelta(hours=-7))), NOW + 1234),
    (None, datetime.fromtimestamp(NOW / 1000, timezone.utc) + timedelta(microseconds=1), NOW + 1),  # never early
    (365 * 86_400, None, NOW + 365 * DAY),  # exactly the maximum is allowed
])
def test_due_time_in_epoch_ms(delay, deliver_at, expected):
    assert due_ms(NOW, delay, deliver_at, 365 * DAY) == expected


def test_delay_ids_are_canonical_uuidv7_unique_and_in_creation_order(producer):
    before = time.time_ns() // 1_000_000
    ids = [producer.produce("t", b"v", delay=60) for _ in range(5000)]
    after = time.time_ns() // 1_000_000

    assert len(set(ids)) == 5000
    assert ids == sorted(ids)
    for delay_id in ids[:50] + ids[-50:]:
        parsed = uuid.UUID(check_delay_id(delay_id))
        assert (parsed.version, parsed.variant) == (7, uuid.RFC_4122)
        assert before <= parsed.int >> 80 <= after


def test_more_than_4096_ids_in_one_millisecond_stay_unique(producer, monkeypatch):
    monkeypatch.setattr(producer_module, "_time_ns", lambda: NOW * 1_000_000 + 123)
    ids = [producer.produce("t", b"v", delay=1) for _ in range(10_000)]

    assert len(set(ids)) == 10_000
    assert all(uuid.UUID(delay_id).int >> 80 == NOW for delay_id in ids)


def test_a_forked_child_draws_its_own_id_tail():
    _ticks.new(NOW * 1_000_000)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report whether it kept the parent's tick
        os.write(write_end, b"kept" if _ticks.tick[2] == NOW else b"forgot")
        os._exit(0)
    os.close(write_end)
    os.waitpid(pid, 0)
    answer = os.read(read_end, 16)
    os.close(read_end)

    assert answer == b"forgot"


def test_produce_batch_refuses_delays_it_would_silently_ignore(producer):
    with pytest.raises(TypeError, match=r"produce_batch\(\) cannot delay messages"):
        producer.produce_batch("t", [{"value": b"now"}, {"value": b"later", "delay": 5}])


def test_produce_batch_without_delays_queues_like_confluent_kafka(producer):
    assert producer.produce_batch("t", [{"value": b"a"}, {"value": b"b", "key": b"k"}]) == 2


def test_the_remembered_frame_line_never_leaks_into_another_topic_key_or_due_time(producer, monkeypatch):
    written = []
    monkeypatch.setattr(producer_module, "_base_produce", lambda _self, *args: written.append(args))
    monkeypatch.setattr(producer_module, "_time_ns", lambda: NOW * 1_000_000 + 5)
    calls = [("a", b"k1", b"v1", 1), ("a", b"k2", b"v2", 1), ("b", b"k3", b"v3", 1), ("b", b"long key", b"v4", 1),
             ("b", None, b"v5", 1), ("b", None, b"v6", 2), ("b", "str key", "str value", 2), ("a", b"", b"", 2)]

    ids = [producer.produce(topic, value, key, delay=delay) for topic, key, value, delay in calls]

    parsed = [parse_buffer_record(args[2].encode(), args[1], None).envelope for args in written]
    assert [args[2] for args in written] == ids
    assert [(e.topic, e.key, e.value, e.deliver_at_ms) for e in parsed] == [
        (topic, key.encode() if isinstance(key, str) else key, value.encode() if isinstance(value, str) else value,
         NOW + delay * 1000) for topic, key, value, delay in calls]
