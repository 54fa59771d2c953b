"""Schedule math (delayq.schedule): first due times, delay levels, a series' next occurrence. No server.

What the producers make of these rules: tests/unit/proxy/; on the real stack: tests/integration/test_schedules.py.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone

import pytest
from pydantic import ValidationError

from delayq import Cron, Every, Settings
from delayq.schedule import (
    DEFAULT_DELAY_LEVELS,
    MIN_DUE_MS,
    Series,
    due_ms,
    first_due,
    level_delay_ms,
    next_cron_match,
    parse_delay_levels,
)
from delayq.settings import settings_problem

NOW = 1_800_000_000_000  # 2027-01-15T08:00:00Z
DAY = 86_400_000
YEAR_MS = 365 * DAY
LEVELS = parse_delay_levels(DEFAULT_DELAY_LEVELS)


def ms(when: datetime) -> int:
    return int(when.timestamp() * 1000)


# -- a first due time from delay or deliver_at -------------------------------------


@pytest.mark.parametrize("delay,deliver_at,expected", [
    (30, None, NOW + 30_000),
    (0, None, NOW),
    (0.25, None, NOW + 250),
    (0.0004, None, NOW),  # rounded to the millisecond
    (0.0006, None, NOW + 1),
    (timedelta(minutes=2), None, NOW + 120_000),
    (timedelta(microseconds=1500), None, NOW + 2),  # half a millisecond rounds up
    (timedelta(microseconds=499), None, NOW),
    (None, NOW + 5, NOW + 5),
    (None, NOW - 60_000, NOW - 60_000),  # already past: kept, delivered as soon as possible
    (None, datetime.fromtimestamp((NOW + 1234) / 1000, UTC), NOW + 1234),
    (None, datetime.fromtimestamp((NOW + 1234) / 1000, timezone(timedelta(hours=-7))), NOW + 1234),
    (None, datetime.fromtimestamp(NOW / 1000, UTC) + timedelta(microseconds=1), NOW + 1),  # never early
    (365 * 86_400, None, NOW + 365 * DAY),  # exactly the maximum is allowed
])
def test_due_time_in_epoch_ms(delay, deliver_at, expected):
    assert due_ms(NOW, delay, deliver_at, 365 * DAY) == expected


@pytest.mark.parametrize("delay,deliver_at,error,text", [
    (1, NOW, ValueError, "not both"),
    (None, None, ValueError, "give delay"),
    (-1, None, ValueError, ">= 0"),
    (float("nan"), None, ValueError, "finite"),
    (timedelta(seconds=-1), None, ValueError, ">= 0"),
    ("5", None, TypeError, "seconds as an int or float"),
    (True, None, TypeError, "seconds as an int or float"),
    (None, datetime(2030, 1, 1), ValueError, "timezone-aware"),
    (None, "2030-01-01", TypeError, "datetime or epoch milliseconds"),
    (366 * 86_400, None, ValueError, "beyond the maximum delay of 365 days"),
])
def test_a_due_time_that_is_no_time_or_too_far_is_refused(delay, deliver_at, error, text):
    with pytest.raises(error, match=text):
        due_ms(NOW, delay, deliver_at, YEAR_MS)


@pytest.mark.parametrize("deliver_at,message", [
    (1_795_404_000, "deliver_at 1795404000 is before 2000-01-01 in epoch milliseconds: did you mean seconds? "
                    "use deliver_at=1795404000000 or a datetime"),
    (1_600_000_000, "did you mean seconds? use deliver_at=1600000000000 or a datetime"),  # seconds, in the past
    (MIN_DUE_MS - 1, f"deliver_at {MIN_DUE_MS - 1} is before 2000-01-01 in epoch milliseconds: did you mean "
                     f"seconds? deliver_at is a point in time: epoch milliseconds from {MIN_DUE_MS}"),
    (30, "did you mean seconds? deliver_at is a point in time: epoch milliseconds from 946684800000 "
         "(2000-01-01T00:00:00Z), or a timezone-aware datetime; for 30 s from now use delay=30"),
    (0, "deliver_at 0 is before 2000-01-01 in epoch milliseconds"),
    (-1, "deliver_at -1 is before 2000-01-01 in epoch milliseconds; deliver_at is a point in time"),
    (datetime(1999, 12, 31, 23, 59, 59, 999_000, UTC),
     "deliver_at 1999-12-31T23:59:59.999000+00:00 is before 2000-01-01T00:00:00Z: delayq refuses due times before "
     "2000 (the nodes would dead-letter the message)"),
    (datetime(2000, 1, 1, 0, 30, tzinfo=timezone(timedelta(hours=1))), "is before 2000-01-01T00:00:00Z"),
    (datetime(1, 1, 1, tzinfo=UTC), "deliver_at 0001-01-01T00:00:00+00:00 is before 2000-01-01"),
], ids=["seconds", "seconds-past", "bound-minus-1", "a-delay", "zero", "negative", "datetime-1999",
        "datetime-offset", "datetime-year-1"])
def test_a_due_time_before_2000_is_refused_asking_whether_seconds_were_meant(deliver_at, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        due_ms(NOW, None, deliver_at, YEAR_MS)


@pytest.mark.parametrize("deliver_at", [
    MIN_DUE_MS,
    datetime(2000, 1, 1, tzinfo=UTC),
    datetime(2000, 1, 1, 1, tzinfo=timezone(timedelta(hours=1))),
    datetime(1999, 12, 31, 23, 59, 59, 999_001, UTC),  # rounded up to the millisecond: the bound itself
])
def test_a_due_time_exactly_at_2000_is_taken(deliver_at):
    assert due_ms(NOW, None, deliver_at, YEAR_MS) == MIN_DUE_MS
    assert int(datetime(2000, 1, 1, tzinfo=UTC).timestamp() * 1000) == MIN_DUE_MS


def test_due_ms_itself_refuses_a_delay_from_a_clock_before_2000():
    with pytest.raises(RuntimeError, match=r"clock reads 1000 ms since the epoch, before 2000-01-01"):
        due_ms(1000, 5, None, YEAR_MS)


# -- delay levels -------------------------------------------------------------


def test_the_default_levels_are_rocketmqs_eighteen():
    assert Settings().delay_levels_ms == LEVELS == tuple(s * 1000 for s in (
        1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200))


def test_a_level_table_takes_the_duration_grammar_rounded_to_the_millisecond():
    assert parse_delay_levels("250ms 1.5s 1h30m, 2d") == (250, 1500, 5_400_000, 2 * DAY)
    assert parse_delay_levels("0.0006s 1.2345s") == (1, 1234)  # each part rounded to the millisecond
    with pytest.raises(ValueError, match=r"delay level 1 is '0\.0004s': a level's delay must be above 0"):
        parse_delay_levels("0.0004s")  # rounds to 0 ms: no delay, which is level 0's


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
    assert first_due(NOW, None, None, 2, None, LEVELS, YEAR_MS) == NOW + 5000
    assert first_due(NOW, None, None, 0, None, LEVELS, YEAR_MS) is None
    assert first_due(NOW, None, None, 0, Every(60).series(), LEVELS, YEAR_MS) == NOW  # a series starting now
    with pytest.raises(ValueError, match="not both"):
        first_due(NOW, 5, None, 2, None, LEVELS, YEAR_MS)
    with pytest.raises(ValueError, match="not both"):
        first_due(NOW, None, NOW + 5, 2, None, LEVELS, YEAR_MS)
    with pytest.raises(ValueError, match="beyond the maximum delay"):
        first_due(NOW, None, None, 18, None, LEVELS, 3_600_000)  # 2h, past a 1h maximum


def test_a_first_due_time_from_delay_or_deliver_at_is_due_ms():
    assert first_due(NOW, 1.5, None, None, None, LEVELS, YEAR_MS) == NOW + 1500
    at = datetime.fromtimestamp((NOW + 90_000) / 1000, UTC)
    assert first_due(NOW, None, at, None, None, LEVELS, YEAR_MS) == NOW + 90_000
    with pytest.raises(ValueError, match="did you mean seconds"):
        first_due(NOW, None, 1_795_404_000, None, None, LEVELS, YEAR_MS)


# -- repeating messages ---------------------------------------------------------


def test_a_series_without_a_due_time_starts_one_interval_or_the_next_cron_match_from_now():
    due = first_due(NOW + 1, None, None, None, Cron("*/5 * * * *", times=2).series(), LEVELS, YEAR_MS)
    assert due == NOW + 300_000
    due = first_due(NOW, 3, None, None, Cron("*/5 * * * *").series(), LEVELS, YEAR_MS)
    assert due == NOW + 3000  # the given time first, then the matches
    assert first_due(NOW, None, None, None, Every(90).series(), LEVELS, YEAR_MS) == NOW + 90_000
    assert Every(timedelta(milliseconds=1500)).series().start(NOW) == NOW + 1500
    berlin_nine = Cron("0 9 * * *", tz="Europe/Berlin").series()  # 08:00 UTC in winter, which NOW is
    assert berlin_nine.start(NOW - 1) == NOW
    assert berlin_nine.start(NOW) == NOW + DAY  # strictly after now
    with pytest.raises(ValueError, match="never matches again"):
        Series(cron="0 0 31 2 *").start(NOW)  # February 31st


def test_a_series_that_ends_before_it_starts_is_refused():
    with pytest.raises(ValueError, match="before the first occurrence"):
        first_due(NOW, 60, None, None, Every(1, until=NOW + 1000).series(), LEVELS, YEAR_MS)


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
    assert Series(every_ms=1, multiplier=1.5).next_due(NOW, 1) == NOW + 1  # a gap rounds, never below 1 ms


def test_cron_matches_in_its_time_zone_across_a_dst_change():
    # Berlin leaves summer time at 03:00 on 2026-10-25: "0 9 * * *" stays at 09:00 local time.
    series = Cron("0 9 * * *", tz="Europe/Berlin").series()
    saturday = ms(datetime(2026, 10, 24, 7, 0, tzinfo=UTC))  # 09:00 CEST
    sunday = series.next_due(saturday, 1)
    assert sunday == ms(datetime(2026, 10, 25, 8, 0, tzinfo=UTC))  # 09:00 CET
    weekdays = Cron("30 8 * * 1-5").series()
    friday = ms(datetime(2026, 11, 27, 8, 30, tzinfo=UTC))
    assert weekdays.next_due(friday, 1) == ms(datetime(2026, 11, 30, 8, 30, tzinfo=UTC))  # Monday


def test_a_cron_match_is_strictly_after_the_time_given_and_none_when_there_is_none():
    on_the_minute = ms(datetime(2027, 1, 15, 8, 5, tzinfo=UTC))
    assert next_cron_match("*/5 * * * *", "UTC", on_the_minute) == on_the_minute + 300_000
    assert next_cron_match("*/5 * * * *", "UTC", on_the_minute - 1) == on_the_minute
    assert next_cron_match("0 0 31 2 *", "UTC", NOW) is None
