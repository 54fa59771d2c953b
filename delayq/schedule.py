"""Schedule math, the one home of each rule: due times, delay levels, and a series' next occurrence.

Pure functions and types, no Kafka and no I/O:

* a produce's first due time from ``delay``, ``deliver_at``, ``delay_level`` and a series
  (:func:`first_due`, :func:`due_ms`, :func:`level_delay_ms`), as the producers compute it;
* the delay-level table, as setting ``delay_levels`` reads it (:func:`parse_delay_levels`);
* a repeating message's schedule (:class:`Series`) and its next occurrence
  (:meth:`Series.next_due`), as a master computes it after each delivery;
* the bounds every due time keeps (:data:`MIN_DUE_MS`, :data:`MAX_DUE_MS`), which the wire
  contract (delayq.wire) also applies when it reads a frame.

Cron expressions are read by cronsim (standard five fields, Vixie/Debian cron semantics:
a day-of-month and a day-of-week both restricted match either, and DST gaps and repeats
handled as cron does). Why cronsim: it is small, pure Python, maintained, does exactly
the five standard fields (no seconds field or Quartz extensions that a node of another
language could not read the same way), and takes a zoneinfo time zone. It is imported
only where a cron expression is read, so ``import delayq.wire`` does not load it.
"""

from __future__ import annotations

import datetime
import functools
import math
import numbers
import re
from dataclasses import dataclass

from delayq.clock import parse_duration_ms

# Due times below this (2000-01-01T00:00:00Z in ms) are refused: they are almost always
# seconds given where milliseconds are meant, and would be delivered at once.
MIN_DUE_MS = 946_684_800_000
# The last instant a datetime holds (9999-12-31T23:59:59.999Z): a series whose next due time is past it is over.
MAX_DUE_MS = 253_402_300_799_999
# The largest multiplier a series may have: past it the interval means a mistake.
MAX_MULTIPLIER = 1000.0
# RocketMQ's messageDelayLevel default: level N (1-18) is the Nth of these.
DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_ONE_MS = datetime.timedelta(milliseconds=1)
_HALF_MS = datetime.timedelta(microseconds=500)
_CRON_FIELD = re.compile(r"[0-9A-Za-z*/,?#-]+")


# -- a produce's first due time ------------------------------------------------


def due_ms(now_ms: int, delay: object, deliver_at: object, max_delay_ms: int) -> int:
    """The due time in epoch ms for ``delay`` or ``deliver_at``, checked; the full rules.

    A due time below :data:`MIN_DUE_MS` (2000-01-01T00:00:00Z) is refused, as every node
    refuses it (dead-letter reason ``bad-due-time``): it is almost always seconds given
    where milliseconds are meant, and would be delivered at once.

    Raises:
        TypeError: ``delay`` is not an int, float or timedelta (a bool or str is refused);
            ``deliver_at`` is not a datetime or int.
        ValueError: both or neither given; negative, NaN or infinite delay; naive datetime;
            ``deliver_at`` before 2000-01-01 (epoch ms or datetime); due beyond
            ``max_delay_ms`` from now.
        RuntimeError: ``now_ms`` (the clock) is before 2000-01-01, so a delay from it is too.
    """
    if delay is not None and deliver_at is not None:
        raise ValueError("give delay or deliver_at, not both: delay is relative (seconds), deliver_at absolute")
    if delay is not None:
        if isinstance(delay, datetime.timedelta):
            if delay < datetime.timedelta(0):
                raise ValueError(f"delay must be >= 0; got {delay!r}")
            ms = (delay + _HALF_MS) // _ONE_MS
        else:
            if isinstance(delay, bool) or not isinstance(delay, numbers.Real):
                raise TypeError(f"delay must be seconds as an int or float, or a timedelta; "
                                f"got {type(delay).__name__} {delay!r}")
            seconds = float(delay)
            if math.isnan(seconds) or math.isinf(seconds):
                raise ValueError(f"delay must be a finite number of seconds; got {delay!r}")
            if seconds < 0:
                raise ValueError(f"delay must be >= 0 seconds; got {delay!r}")
            ms = round(seconds * 1000)
        due = now_ms + ms
        if due < MIN_DUE_MS:  # ms >= 0: only a clock before 2000 gets here
            raise clock_error(now_ms)
    elif deliver_at is not None:
        if isinstance(deliver_at, datetime.datetime):
            if deliver_at.tzinfo is None or deliver_at.utcoffset() is None:
                raise ValueError(f"deliver_at must be a timezone-aware datetime (e.g. datetime.now(timezone.utc) "
                                 f"+ timedelta(...)); got naive {deliver_at.isoformat()}")
            # Ceiling: a due time between two milliseconds is not reached before the later one.
            due = -((deliver_at - _EPOCH) // -_ONE_MS)
            if due < MIN_DUE_MS:
                raise ValueError(f"deliver_at {deliver_at.isoformat()} is before 2000-01-01T00:00:00Z: delayq "
                                 "refuses due times before 2000 (the nodes would dead-letter the message)")
        elif isinstance(deliver_at, int) and not isinstance(deliver_at, bool):
            due = int(deliver_at)
            if due < MIN_DUE_MS:
                raise ValueError(_early_epoch_ms(due, now_ms, max_delay_ms))
        else:
            raise TypeError(f"deliver_at must be a timezone-aware datetime or epoch milliseconds as an int; "
                            f"got {type(deliver_at).__name__} {deliver_at!r}")
    else:
        raise ValueError("give delay (seconds or a timedelta) or deliver_at (a datetime or epoch ms)")
    if due - now_ms > max_delay_ms:
        given = f"delay {delay!r}" if delay is not None else f"deliver_at {deliver_at!r}"
        raise ValueError(f"{given} is {_span(due - now_ms)} ahead, beyond the maximum delay of "
                         f"{_span(max_delay_ms)} (setting max_delay_ms: DELAYQ_MAX_DELAY_MS or conf key "
                         "delayq.max.delay.ms)")
    return due


def first_due(now_ms: int, delay: object, deliver_at: object, delay_level: object, series: Series | None,
              levels: tuple[int, ...], max_delay_ms: int) -> int | None:
    """Due time of a produce's message, or of a series' first occurrence: the full rules.

    ``delay_level`` names one of ``levels`` (:func:`level_delay_ms`). A series without a due
    time starts one interval from now (``every``) or at the cron expression's next match
    after now. None for ``delay_level=0`` without a series: no delay, a plain produce.

    Raises:
        TypeError, ValueError: as :func:`due_ms`, :func:`level_delay_ms`; ``delay_level``
            with ``delay`` or ``deliver_at``; a series' ``until_ms`` before its first
            occurrence, or a cron expression that never matches again.
        RuntimeError: as :func:`due_ms`.
    """
    if delay_level is not None:
        if delay is not None or deliver_at is not None:
            raise ValueError("give delay_level, or delay or deliver_at, not both: a level names a delay")
        delay = datetime.timedelta(milliseconds=level_delay_ms(delay_level, levels))
        if series is None and delay == datetime.timedelta(0):
            return None
    if series is None:
        return due_ms(now_ms, delay, deliver_at, max_delay_ms)
    if delay is None and deliver_at is None:
        due = series.start(now_ms)
    else:
        due = due_ms(now_ms, delay, deliver_at, max_delay_ms)
    if series.until_ms is not None and series.until_ms < due:
        raise ValueError(f"repeat's until ({series.until_ms} ms) is before the first occurrence ({due} ms): "
                         "nothing would be delivered")
    return due


def clock_error(now_ms: int) -> RuntimeError:
    """The error for a clock that reads ``now_ms``, before 2000-01-01: every due time from it would be refused."""
    return RuntimeError(f"this machine's clock reads {now_ms} ms since the epoch, before 2000-01-01: a due time "
                        "counted from it would be refused by every node; set the clock (NTP)")


def _early_epoch_ms(due: int, now_ms: int, max_delay_ms: int) -> str:
    """Why an int ``deliver_at`` below MIN_DUE_MS is refused, and what was likely meant."""
    text = f"deliver_at {due} is before 2000-01-01 in epoch milliseconds"
    point = (f"deliver_at is a point in time: epoch milliseconds from {MIN_DUE_MS} (2000-01-01T00:00:00Z), "
             "or a timezone-aware datetime")
    if due < 0:
        return f"{text}; {point}"
    if MIN_DUE_MS <= due * 1000 <= now_ms + max_delay_ms:
        return f"{text}: did you mean seconds? use deliver_at={due * 1000} or a datetime"
    if due * 1000 <= max_delay_ms:
        return f"{text}: did you mean seconds? {point}; for {due} s from now use delay={due}"
    return f"{text}: did you mean seconds? {point}"


def _span(ms: int) -> str:
    if ms >= 86_400_000:
        return f"{ms / 86_400_000:g} days ({ms} ms)"
    return f"{ms / 1000:g} s ({ms} ms)"


# -- delay levels --------------------------------------------------------------


@functools.lru_cache(maxsize=16)
def parse_delay_levels(text: str) -> tuple[int, ...]:
    """The delay of each level, in ms, from a RocketMQ-style list (``"1s 5s 10s 30s 1m ... 2h"``).

    Durations in delayq's grammar (delayq.clock: ``ms``, ``s``, ``m``, ``h``, ``d``, ``w``),
    separated by spaces (or commas). Each must be above 0.

    Raises:
        ValueError: an empty list, a part that is no duration, or a zero delay.
    """
    parts = text.replace(",", " ").split()
    if not parts:
        raise ValueError(f"delay levels {text!r} is empty: list durations, like {DEFAULT_DELAY_LEVELS!r}")
    levels = []
    for number, part in enumerate(parts, 1):
        ms = parse_duration_ms(part, f"delay level {number}")
        if ms <= 0:
            raise ValueError(f"delay level {number} is {part!r}: a level's delay must be above 0 (level 0 means "
                             "no delay)")
        levels.append(ms)
    return tuple(levels)


def level_delay_ms(level: object, levels: tuple[int, ...]) -> int:
    """The delay of ``delay_level`` ``level`` (1 is the first of ``levels``, 0 no delay), in ms.

    Raises:
        TypeError: ``level`` is not an int.
        ValueError: ``level`` is not from 0 to the number of levels (RocketMQ clamps such a
            level to the nearest one; delayq refuses it, naming the table).
    """
    if isinstance(level, bool) or not isinstance(level, int):
        raise TypeError(f"delay_level must be an int (0 for no delay, 1 to {len(levels)}); got "
                        f"{type(level).__name__} {level!r:.60}")
    if level == 0:
        return 0
    if not 1 <= level <= len(levels):
        table = ", ".join(f"{n}={_level_text(ms)}" for n, ms in enumerate(levels, 1))
        raise ValueError(f"delay_level {level} is not a level: levels are {table} (setting delay_levels: "
                         f"DELAYQ_DELAY_LEVELS or conf key delayq.delay.levels); 0 means no delay")
    return levels[level - 1]


def _level_text(ms: int) -> str:
    for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


# -- repeating messages ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Series:
    """A repeating message's schedule, as its put's frame carries it (delayq.wire: options ``every=``/``cron=`` ...).

    Exactly one of ``every_ms`` (a fixed interval, each ``multiplier`` times the last) and
    ``cron`` (five fields, matched in time zone ``tz``) is set. ``times`` caps the number of
    occurrences, ``until_ms`` the due time of the last.
    """

    every_ms: int | None = None
    multiplier: float = 1.0
    cron: str | None = None
    tz: str = "UTC"
    times: int | None = None
    until_ms: int | None = None

    def start(self, now_ms: int) -> int:
        """The first occurrence's due time when the produce gives none: one interval from now, or the next match.

        Raises:
            ValueError: the cron expression never matches again.
        """
        if self.every_ms is not None:
            return now_ms + self.every_ms
        due = next_cron_match(self.cron or "", self.tz, now_ms)
        if due is None:
            raise ValueError(f"cron expression {self.cron!r} never matches again")
        return due

    def next_due(self, due_ms: int, occurrence: int) -> int | None:
        """Due time of occurrence ``occurrence + 1``, after occurrence ``occurrence`` due at ``due_ms``.

        Counted from the due time, not from when the occurrence was delivered: a series
        keeps its rhythm, and after an outage the occurrences it missed follow one another
        at once, none skipped. None when the series is over (``times``, ``until_ms``, or a
        due time past year 9999).
        """
        if self.times is not None and occurrence >= self.times:
            return None
        if self.every_ms is not None:
            gap = self.every_ms
            if self.multiplier != 1.0:
                try:
                    gap = round(gap * self.multiplier ** (occurrence - 1))
                except OverflowError:  # an interval past any due time: the series is over
                    return None
            following: int | None = due_ms + max(1, gap)
        else:
            following = next_cron_match(self.cron or "", self.tz, due_ms)
        if following is None or following > MAX_DUE_MS or (self.until_ms is not None and following > self.until_ms):
            return None
        return following

    def as_tuple(self) -> tuple:
        """The fields in order (a node's stored form keeps them so)."""
        return (self.every_ms, self.multiplier, self.cron, self.tz, self.times, self.until_ms)


@functools.lru_cache(maxsize=256)
def time_zone(name: str) -> datetime.tzinfo:
    """The IANA time zone ``name`` (zoneinfo), or ValueError naming it."""
    import zoneinfo

    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"time zone {name!r:.60} is not an IANA time zone name (like 'UTC' or "
                         "'Europe/Berlin')") from None


@functools.lru_cache(maxsize=256)
def check_cron(expression: str) -> str:
    """``expression`` with single spaces if it is a standard five-field cron expression (cronsim), else ValueError."""
    import cronsim

    fields = expression.split()
    if len(fields) != 5 or not all(_CRON_FIELD.fullmatch(f) for f in fields):
        raise ValueError(f"cron expression {expression!r:.100} must have five fields (minute hour day-of-month "
                         "month day-of-week), like '*/5 * * * *'")
    text = " ".join(fields)
    try:
        cronsim.CronSim(text, datetime.datetime(2000, 1, 1, tzinfo=datetime.UTC))
    except cronsim.CronSimError as err:
        raise ValueError(f"cron expression {text!r:.100} is not valid: {err}") from None
    return text


def next_cron_match(expression: str, tz: str, after_ms: int) -> int | None:
    """Epoch ms of the first minute matching ``expression`` in ``tz`` strictly after ``after_ms``; None if none."""
    import cronsim

    zone = time_zone(tz)
    start = datetime.datetime.fromtimestamp(after_ms / 1000, datetime.UTC).astimezone(zone)
    try:
        match = next(cronsim.CronSim(check_cron(expression), start))
    except (StopIteration, OverflowError, ValueError):  # no match before year 9999
        return None
    return int(match.timestamp() * 1000)
