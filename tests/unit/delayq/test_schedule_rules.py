"""Repeating messages, retry policies and dispatch limits as the parts apply them: the pure rules, no server.

The schedule math itself (due times, delay levels, next occurrences): test_schedule.py. On the
real stack: tests/integration/test_schedules.py.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from types import SimpleNamespace

import pytest
from confluent_kafka import Message
from pydantic import ValidationError
from support import wire_cases

from delayq import Cron, Every, RetryPolicy, Settings, wire
from delayq.delay_service import stored
from delayq.delay_service.limits import DispatchLimiter
from delayq.delay_service.reader import parse_batch
from delayq.proxy.producer import BufferWriter
from delayq.proxy.retry import attempt_of
from delayq.settings import settings_problem
from delayq.store import Put, Remove, TimeIndex, decode

NOW = 1_800_000_000_000  # 2027-01-15T08:00:00Z
ID = wire_cases.ID


def ms(when: datetime) -> int:
    return int(when.timestamp() * 1000)


# -- repeating messages ---------------------------------------------------------


@pytest.mark.parametrize("make, error, text", [
    (lambda: Every(0), ValueError, "at least 1 ms"),
    (lambda: Every("1s"), TypeError, "seconds"),
    (lambda: Every(1, times=0), ValueError, "times must be at least 1"),
    (lambda: Every(1, multiplier=0.5), ValueError, "multiplier must be from 1"),
    (lambda: Every(1, until=datetime(2030, 1, 1)), ValueError, "timezone-aware"),
    (lambda: Every(1, until=1_800_000_000), ValueError, "did you mean seconds"),
    (lambda: Cron("* * * *"), ValueError, "five fields"),
    (lambda: Cron("61 * * * *"), ValueError, "not valid"),
    (lambda: Cron("* * * * *", tz="Mars/Olympus"), ValueError, "IANA time zone"),
    (lambda: Cron(5), TypeError, "str"),
])
def test_a_bad_schedule_is_refused_before_anything_is_sent(make, error, text):
    with pytest.raises(error, match=text):
        make()


def test_a_repeat_that_is_no_schedule_or_ends_before_it_starts_is_refused():
    writer = BufferWriter(Settings())
    with pytest.raises(TypeError, match=r"delayq\.Every or delayq\.Cron"):
        writer.schedule(NOW, 1, None, None, "every minute")
    with pytest.raises(ValueError, match="before the first occurrence"):
        writer.schedule(NOW, 60, None, None, Every(1, until=NOW + 1000))
    assert writer.schedule(NOW, None, None, 2) == (NOW + 5000, "")
    assert writer.schedule(NOW, None, None, 0) == (None, "")


def test_a_series_round_trips_through_the_frame_and_the_stored_form():
    message = wire.Envelope(ID, "orders", NOW, b"v", b"k", series=Every(2, times=4, multiplier=1.5).series(),
                            occurrence=3, attempt=None)
    parsed = wire.parse_buffer_record(ID.encode(), message.buffer_value(follows=41), [])
    assert parsed.follows == 41 and parsed.envelope is not None
    assert (parsed.envelope.series, parsed.envelope.occurrence) == (message.series, 3)
    again = stored.unpack(stored.pack(0, 42, parsed.envelope)).message
    assert (again.series, again.occurrence, again.attempt) == (message.series, 3, None)
    following = again.next_occurrence()
    assert following is not None and (following.deliver_at_ms, following.occurrence) == (NOW + 4500, 4)
    assert following.extra_delivery_headers() == [(wire.OCCURRENCE, b"4")]


# -- a master's next occurrence, as ingest applies it -----------------------------


def follows_record(offset: int, follows: int, created_ms: int) -> Message:
    message = wire.Envelope(ID, "orders", NOW, b"v", series=Every(1).series(), occurrence=2)
    return Message(topic="buffer", partition=wire_cases.OWN, offset=offset, key=ID.encode(),
                   value=message.buffer_value(follows=follows), headers=None, timestamp=(1, created_ms))


def test_a_young_next_occurrence_replaces_only_the_put_it_follows_and_an_aged_one_any():
    lag = 7 * 86_400_000
    from delayq.clock import now_ms

    young = parse_batch([follows_record(9, 5, now_ms())], wire_cases.PARTITIONS, 1, lag).shards[0]
    aged = parse_batch([follows_record(9, 5, now_ms() - lag - 60_000)], wire_cases.PARTITIONS, 1, lag).shards[0]
    [young_op], [aged_op] = decode(young.ops), decode(aged.ops)
    assert type(young_op) is Put and young_op.restores == 5 and young.settled == [ID]
    assert aged_op.restores is None and aged.settled == [ID]  # compaction may have dropped the put it follows


def test_a_next_occurrence_after_a_cancel_is_not_pending_and_gets_closed(tmp_path):
    with TimeIndex(tmp_path / "store") as store:
        store.apply([Put(ID, NOW, b"first", 5)], {0: 6})
        store.apply([Remove(ID), Put(ID, NOW + 1000, b"second", 9, 5)], {0: 10})
        assert store.get(ID) is None
        assert store.shadowed() == {ID: None} or ID in store.shadowed()  # the master closes the stray put
        store.apply([Put(ID, NOW, b"again", 11), Put(ID, NOW + 1000, b"next", 12, 11)], {0: 13})
        entry = store.get(ID)
        assert entry is not None and entry.version == 12


# -- retries --------------------------------------------------------------------


def test_a_retry_policy_waits_its_delays_and_repeats_the_last():
    policy = RetryPolicy(delays=[0.5, timedelta(seconds=1), 1.5], max_attempts=5)
    assert [policy.delay_for(n) for n in range(1, 6)] == [0.5, 1.0, 1.5, 1.5, 1.5]
    assert RetryPolicy(delays=[1, 2]).max_attempts == 2
    assert policy.dead_letters_to("orders") == "orders.dlq"
    rocketmq = RetryPolicy.rocketmq()
    assert rocketmq.max_attempts == 16 and rocketmq.delay_for(1) == 10 and rocketmq.delay_for(16) == 7200


def test_an_exponential_policy_doubles_up_to_its_cap_within_its_jitter():
    policy = RetryPolicy.exponential(1, multiplier=2, max_delay=10, max_attempts=8, jitter=0.1)
    for attempt, base in enumerate((1, 2, 4, 8, 10, 10), 1):
        for _ in range(20):
            assert base * 0.9 <= policy.delay_for(attempt) <= base * 1.1
    assert policy.max_attempts == 8


@pytest.mark.parametrize("make, text", [
    (lambda: RetryPolicy(delays=[]), "non-empty"),
    (lambda: RetryPolicy(delays=[-1]), ">= 0"),
    (lambda: RetryPolicy(delays=[1], max_attempts=-1), ">= 0"),
    (lambda: RetryPolicy(delays=[1], dead_letter_topic="a/b"), "topic name"),
    (lambda: RetryPolicy.exponential(1, jitter=1.5), "jitter"),
])
def test_a_bad_retry_policy_is_refused(make, text):
    with pytest.raises((TypeError, ValueError), match=text):
        make()


def test_a_records_attempt_is_its_delayq_attempt_header():
    def record(headers):
        return SimpleNamespace(headers=lambda: headers)

    assert attempt_of(record(None)) == 0
    assert attempt_of(record([("x", b"1"), (wire.ATTEMPT, b"3")])) == 3
    with pytest.raises(ValueError, match="not an attempt number"):
        attempt_of(record([(wire.ATTEMPT, b"three")]))


# -- dispatch limits ------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_limited_topic_gets_its_burst_then_its_rate_and_others_are_not_held():
    clock = Clock()
    settings = Settings(dispatch_limits={"orders": {"rate": 500}, "audit.*": {"rate": 10, "burst": 3}})
    limiter = DispatchLimiter(settings, shards=1, clock=clock)
    assert sum(limiter.take("orders") for _ in range(200)) == 50  # burst: a tenth of a second's rate
    assert not limiter.released("orders") and 0.04 < limiter.release_in("orders") <= 0.05 + 1e-9
    clock.now += 1.0
    assert limiter.released("orders")
    assert sum(limiter.take("orders") for _ in range(1000)) == 50  # refilled to the burst, no more
    assert sum(limiter.take("audit.log") for _ in range(10)) == 3
    assert all(limiter.take("payments") for _ in range(10_000))  # no limit, no '*'


def test_each_shards_master_takes_its_part_of_the_clusters_rate():
    clock = Clock()
    limiter = DispatchLimiter(Settings(dispatch_limits={"*": {"rate": 600, "burst": 600}}), shards=3, clock=clock)
    assert sum(limiter.take("any") for _ in range(1000)) == 200
    clock.now += 0.5
    assert sum(limiter.take("any") for _ in range(1000)) == 100


def test_dispatch_limits_come_from_the_environment_as_json_and_refuse_a_bad_entry(monkeypatch):
    monkeypatch.setenv("DELAYQ_DISPATCH_LIMITS", '{"orders": {"rate": 500, "burst": 1000}, "*": {"rate": 20000}}')
    settings = Settings()
    assert settings.dispatch_limit("orders") == settings.dispatch_limits["orders"]
    assert settings.dispatch_limit("other") == settings.dispatch_limits["*"]
    monkeypatch.setenv("DELAYQ_DISPATCH_LIMITS", '{"orders": {"rate": 0}}')
    with pytest.raises(ValidationError) as refused:
        Settings()
    assert settings_problem(refused.value) == ("invalid setting: DELAYQ_DISPATCH_LIMITS (orders.rate) = 0: Input "
                                               "should be greater than 0")
