"""One duration grammar for every command, and one clock."""

from __future__ import annotations

import time

import pytest

from delayq.clock import now_ms, parse_duration_ms
from delayq.errors import DelayqError


@pytest.mark.parametrize("text,ms", [
    ("90", 90_000), ("1.5", 1500), ("250ms", 250), ("30s", 30_000), ("5m", 300_000), ("2h", 7_200_000),
    ("1d", 86_400_000), ("1w", 604_800_000), ("1h30m", 5_400_000), (" 2H ", 7_200_000), ("0", 0), ("1.5s", 1500),
])
def test_every_form_of_the_grammar_reads_as_milliseconds(text, ms):
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize("text", ["", "abc", "5 m", "-5s", "5x", "m5", "1e3", "5m-", "s"])
def test_anything_else_is_a_usage_error_naming_the_argument_and_the_forms(text):
    with pytest.raises(ValueError) as refused:
        parse_duration_ms(text, "--grace")
    assert isinstance(refused.value, DelayqError)
    assert str(refused.value).startswith(f"--grace {text!r} is not a duration: use plain seconds (90)")


def test_now_ms_is_the_wall_clock_in_milliseconds():
    before = time.time() * 1000
    assert before - 1 <= now_ms() <= time.time() * 1000 + 1
