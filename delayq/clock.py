"""Time as every part of delayq speaks it: Unix epoch milliseconds now, and one duration grammar.

Durations, the same for every command and setting that takes one: a plain number is
seconds (``90``, ``1.5``); otherwise a number and a unit, ``ms``, ``s``, ``m``, ``h``,
``d`` or ``w``, parts chained (``250ms``, ``30s``, ``5m``, ``2h``, ``1d``, ``1w``, ``1h30m``).
"""

from __future__ import annotations

import math
import numbers
import re
import time
from datetime import timedelta

from delayq.errors import UsageError

MINUTE_MS = 60_000
HOUR_MS = 60 * MINUTE_MS
DAY_MS = 24 * HOUR_MS
_UNIT_MS = {"ms": 1, "s": 1000, "m": MINUTE_MS, "h": HOUR_MS, "d": DAY_MS, "w": 7 * DAY_MS}
_NUMBER = r"\d+(?:\.\d+)?"
_PLAIN_SECONDS = re.compile(_NUMBER)
_PARTS = re.compile(rf"(?:{_NUMBER}(?:ms|s|m|h|d|w))+")
_PART = re.compile(rf"({_NUMBER})(ms|s|m|h|d|w)")
DURATION_FORMS = "plain seconds (90) or a number and a unit: 250ms, 30s, 5m, 2h, 1d, 1w, or chained like 1h30m"


def now_ms() -> int:
    """The wall clock in Unix epoch milliseconds (what due times, record timestamps and lateness use)."""
    return time.time_ns() // 1_000_000


def seconds_of(value: object, argument: str) -> float:
    """Seconds of ``value``, an int or float of seconds or a timedelta, checked finite and >= 0.

    Raises:
        TypeError: ``value`` is neither (a bool or str is refused).
        ValueError: NaN, infinite or negative.
    """
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, numbers.Real) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise TypeError(f"{argument} must be seconds (an int or float) or a timedelta; got "
                        f"{type(value).__name__} {value!r:.60}")
    if math.isnan(seconds) or math.isinf(seconds) or seconds < 0:
        raise ValueError(f"{argument} must be a finite number of seconds >= 0; got {value!r}")
    return seconds


def parse_duration_ms(text: str, argument: str = "duration") -> int:
    """Milliseconds of a duration in delayq's grammar (module docstring), rounded to the millisecond.

    Raises:
        TypeError: ``text`` is not a str.
        UsageError: (a ValueError) ``text`` is not a duration; the message names ``argument`` and the forms.
    """
    if not isinstance(text, str):
        raise TypeError(f"{argument} must be a str like '5m', not {type(text).__name__}")
    compact = text.strip().lower()
    if _PLAIN_SECONDS.fullmatch(compact):
        return round(float(compact) * 1000)
    if compact and _PARTS.fullmatch(compact):
        return round(sum(float(number) * _UNIT_MS[unit] for number, unit in _PART.findall(compact)))
    raise UsageError(f"{argument} {text!r} is not a duration: use {DURATION_FORMS}")


def format_span(span: timedelta) -> str:
    """A short span for people: ``2d3h``, ``3h12m``, ``5m7s``, ``42s``, ``350ms``."""
    ms = max(0, round(span / timedelta(milliseconds=1)))
    if ms < 1000:
        return f"{ms}ms"
    seconds = ms // 1000
    days, rest = divmod(seconds, 86_400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    parts = [(days, "d"), (hours, "h"), (minutes, "m"), (seconds, "s")]
    first = next(i for i, (n, _) in enumerate(parts) if n)
    return "".join(f"{n}{unit}" for n, unit in parts[first:first + 2] if n)
