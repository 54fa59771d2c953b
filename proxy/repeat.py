"""Repeating messages: ``produce(..., repeat=Every(...))`` and ``repeat=Cron(...)``.

A series is one delay id whose put carries its schedule (frame options, delayq.schedule.Series).
The master delivers each occurrence with ``delayq-occurrence`` = 1, 2, ... and, in the same
transaction, puts the next one under the same id; ``cancel(id)`` stops the series and
``lookup(id)`` shows the next occurrence (docs/DESIGN.md, "Repeating messages").

These classes check the user's arguments and make the schedule; its math (the first and
next due times, cron expressions) is delayq.schedule's.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from delayq import schedule, wire
from delayq.clock import seconds_of

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _interval_ms(interval: object, argument: str) -> int:
    ms = round(seconds_of(interval, argument) * 1000)
    if ms < 1:
        raise ValueError(f"{argument} must be at least 1 ms; got {interval!r}")
    return ms


def _times(times: object) -> int | None:
    if times is None:
        return None
    if isinstance(times, bool) or not isinstance(times, int):
        raise TypeError(f"times must be an int (how many occurrences) or None; got {type(times).__name__} "
                        f"{times!r:.60}")
    if times < 1:
        raise ValueError(f"times must be at least 1 (the number of occurrences); got {times}")
    return int(times)


def _until_ms(until: object) -> int | None:
    if until is None:
        return None
    if isinstance(until, datetime):
        if until.tzinfo is None or until.utcoffset() is None:
            raise ValueError(f"until must be a timezone-aware datetime; got naive {until.isoformat()}")
        return (until - _EPOCH) // timedelta(milliseconds=1)
    if isinstance(until, int) and not isinstance(until, bool):
        if until < schedule.MIN_DUE_MS:
            raise ValueError(f"until {until} is before 2000-01-01 in epoch milliseconds: did you mean seconds?")
        return int(until)
    raise TypeError(f"until must be a timezone-aware datetime or epoch milliseconds (an int); got "
                    f"{type(until).__name__} {until!r:.60}")


@dataclass(frozen=True)
class Every:
    """Repeat every ``interval`` (seconds or a timedelta), ``times`` times at most, none due after ``until``.

    With ``multiplier`` > 1 each interval is that much longer than the last (DDMQ's
    exponential loop): ``Every(60, multiplier=2)`` comes after 1, 2, 4, 8 minutes ...
    The first occurrence is at the produce's ``delay``/``deliver_at``; without either, one
    interval from now. Occurrences keep their rhythm from the first due time: one missed
    while no master ran is delivered as soon as one does, and the next follows on time.

    Raises:
        TypeError, ValueError: an interval below 1 ms, times below 1, a multiplier outside
            [1, 1000], a naive ``until``.
    """

    interval: float | timedelta
    times: int | None = None
    until: datetime | int | None = None
    multiplier: float = 1.0

    def __post_init__(self) -> None:
        _interval_ms(self.interval, "Every interval")
        _times(self.times)
        _until_ms(self.until)
        if isinstance(self.multiplier, bool) or not isinstance(self.multiplier, numbers.Real):
            raise TypeError(f"multiplier must be a number; got {type(self.multiplier).__name__}")
        if not 1.0 <= float(self.multiplier) <= schedule.MAX_MULTIPLIER:
            raise ValueError(f"multiplier must be from 1 to {schedule.MAX_MULTIPLIER:g}; got {self.multiplier!r}")

    def series(self) -> schedule.Series:
        """The schedule as the buffer's frame carries it."""
        multiplier = float(wire.format_multiplier(float(self.multiplier)))
        return schedule.Series(every_ms=_interval_ms(self.interval, "Every interval"), multiplier=multiplier,
                               times=_times(self.times), until_ms=_until_ms(self.until))


@dataclass(frozen=True)
class Cron:
    """Repeat at the minutes a standard five-field cron ``expression`` matches in time zone ``tz``.

    ``times`` and ``until`` end the series as in :class:`Every`. The first occurrence is
    at the produce's ``delay``/``deliver_at`` if given, else the next match after now.

    Raises:
        TypeError, ValueError: not a valid five-field expression, an unknown IANA time zone.
    """

    expression: str
    tz: str = "UTC"
    times: int | None = None
    until: datetime | int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.expression, str):
            raise TypeError(f"Cron expression must be a str like '*/5 * * * *'; got {type(self.expression).__name__}")
        if not isinstance(self.tz, str):
            raise TypeError(f"tz must be an IANA time zone name (a str); got {type(self.tz).__name__}")
        schedule.check_cron(self.expression)
        schedule.time_zone(self.tz)
        _times(self.times)
        _until_ms(self.until)

    def series(self) -> schedule.Series:
        """The schedule as the buffer's frame carries it."""
        return schedule.Series(cron=schedule.check_cron(self.expression), tz=self.tz, times=_times(self.times),
                               until_ms=_until_ms(self.until))


Repeat = Every | Cron
