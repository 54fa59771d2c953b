"""Delay levels, repeating messages, retry policies and dispatch limits: the pure rules, no server.

On the real stack: tests/integration/test_schedules.py.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from confluent_kafka import Message
from pydantic import ValidationError
from support import wire_cases

from delayq import Cron, Every, RetryPolicy, Settings, wire
from delayq.delay_service import stored
from delayq.delay_service.limits import DispatchLimiter
from delayq.delay_service.reader import parse_batch
from delayq.proxy.producer import level_delay_ms, scheduled_due
from delayq.proxy.retry import attempt_of
from delayq.settings import parse_delay_levels, settings_problem
from delayq.store import Put, Remove, TimeIndex, decode

NOW = 1_800_000_000_000  # 2027-01-15T08:00:00Z
ID = wire_cases.ID


def ms(when: datetime) -> int:
    return int(when.timestamp() * 1000)


# -- delay levels -------------------------------------------------------------


def test_the_default_levels_are_rocketmqs_eighteen():
    assert Settings().delay_levels_ms == tuple(s * 1000 for s in (
        1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200))


def test_a_level_is_its_tables_delay_and_an_out_of_range_level_is_refused_with_the_table():
    levels = parse_delay_levels("500ms 2s 1m,1h")
    assert levels == (500, 2000, 60_000, 3_600_000)
    assert [level_delay_ms(n, levels) for n in range(5)] == [0, 500, 2000, 60_000, 3_600_000]
    for bad in (5, -1):
        with pytest.raises(ValueError, match=r"is not a level: levels are 1=500ms, 2=2s, 3=1m, 4=1h"):
            level_delay_ms(bad, levels)
    for wrong in (True, 1.0, "1"):
        with pytest.raises(TypeError, match="delay_level must be an int"):
            level_delay_ms(wrong, levels)


@pytest.mark.parametrize("text", ["", "1s 0s", "1s soon"])
def test_a_bad_level_table_is_refused_in_one_line(text, monkeypatch):
    monkeypatch.setenv("DELAYQ_DELAY_LEVELS", text)
    with pytest.raises(ValidationError) as refused:
        Settings()
    assert settings_problem(refused.value).startswith(f"invalid setting: DELAYQ_DELAY_LEVELS = {text!r}: Value error")


def test_a_level_with_a_delay_is_refused_and_level_0_is_no_delay():
    settings = Settings()
    assert scheduled_due(NOW, None, None, 2, None, settings) == (NOW + 5000, None)
    assert scheduled_due(NOW, None, None, 0, None, settings) == (None, None)
    with pytest.raises(ValueError, match="not both"):
        scheduled_due(NOW, 5, None, 2, None, settings)
    with pytest.raises(ValueError, match="not both"):
        scheduled_due(NOW, None, NOW + 5, 2, None, settings)


# -- repeating messages ---------------------------------------------------------


def test_every_counts_from_each_due_time_and_stops_at_times_and_until():
    series = Every(1.5, times=3).series()
    assert series.next_due(NOW, 1) == NOW + 1500
    assert series.next_due(NOW + 1500, 2) == NOW + 3000
    assert series.next_due(NOW + 3000, 3) is None
    until = Every(timedelta(minutes=1), until=datetime.fromtimestamp((NOW + 120_000) / 1000, UTC)).series()
    assert until.next_due(NOW + 60_000, 2) == NOW + 120_000
    assert until.next_due(NOW + 120_000, 3) is None


def test_a_multiplier_makes_each_interval_that_much_longer_than_the_last():
    series = Every(60, multiplier=2).series()
    due, gaps = NOW, []
    for occurrence in range(1, 6):
        following = series.next_due(due, occurrence)
        assert following is not None
        gaps.append(following - due)
        due = following
    assert gaps == [60_000, 120_000, 240_000, 480_000, 960_000]
    assert Every(1, multiplier=1000).series().next_due(NOW, 10**6) is None  # past year 9999: over


def test_cron_matches_in_its_time_zone_across_a_dst_change():
    # Berlin leaves summer time at 03:00 on 2026-10-25: "0 9 * * *" stays at 09:00 local time.
    series = Cron("0 9 * * *", tz="Europe/Berlin").series()
    saturday = ms(datetime(2026, 10, 24, 7, 0, tzinfo=UTC))  # 09:00 CEST
    sunday = series.next_due(saturday, 1)
    assert sunday == ms(datetime(2026, 10, 25, 8, 0, tzinfo=UTC))  # 09:00 CET
    weekdays = Cron("30 8 * * 1-5").series()
    friday = ms(datetime(2026, 11, 27, 8, 30, tzinfo=UTC))
    assert weekdays.next_due(friday, 1) == ms(datetime(2026, 11, 30, 8, 30, tzinfo=UTC))  # Monday


def test_a_cron_series_without_a_due_time_starts_at_the_next_match():
    due, series = scheduled_due(NOW + 1, None, None, None, Cron("*/5 * * * *", times=2), Settings())
    assert due == NOW + 300_000 and series is not None and series.times == 2
    due, _ = scheduled_due(NOW, 3, None, None, Cron("*/5 * * * *"), Settings())
    assert due == NOW + 3000  # the given time first, then the matches
    due, _ = scheduled_due(NOW, None, None, None, Every(90), Settings())
    assert due == NOW + 90_000  # Every without a due time: one interval from now


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
    with pytest.raises(TypeError, match=r"delayq\.Every or delayq\.Cron"):
        scheduled_due(NOW, 1, None, None, "every minute", Settings())
    with pytest.raises(ValueError, match="before the first occurrence"):
        scheduled_due(NOW, 60, None, None, Every(1, until=NOW + 1000), Settings())


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
