"""retry_later without a broker: a policy's delay the producer would refuse is refused before anything is sent.

What a retry delivers, and when, is tested on the real stack in tests/integration/test_schedules.py.
"""

from __future__ import annotations

from unittest import mock

import pytest

import delayq
from delayq import RetryPolicy, retry_later

NOWHERE = {"bootstrap.servers": "127.0.0.1:9", "log_level": 0}


class ConsumedRecord:
    """A stand-in for a record a confluent_kafka.Consumer returned: the methods retry_later reads."""

    def __init__(self, headers: list[tuple[str, bytes]] | None = None):
        self._headers = headers

    def topic(self) -> str:
        return "orders"

    def key(self) -> bytes:
        return b"order-1"

    def value(self) -> bytes:
        return b"{}"

    def headers(self) -> list[tuple[str, bytes]] | None:
        return self._headers

    def partition(self) -> int:
        return 0

    def error(self) -> None:
        return None


@pytest.fixture
def producer():
    producer = delayq.Producer({**NOWHERE, "delayq.max.delay.ms": 60_000})
    yield producer
    producer.purge()


@pytest.fixture
def puts():
    """Every put the producer would send (none reaches Kafka: nothing listens at NOWHERE anyway)."""
    with mock.patch.object(delayq.Producer, "produce_put", autospec=True) as produce_put:
        yield produce_put


def test_a_back_off_beyond_the_producers_max_delay_is_refused_before_anything_is_sent(producer, puts):
    policy = RetryPolicy(delays=[30, 120], max_attempts=3)

    with pytest.raises(ValueError, match=r"retry_later: the policy's delay for attempt 2: delay 120\.0 is .*beyond "
                                         r"the maximum delay of .*max_delay_ms"):
        retry_later(producer, ConsumedRecord([("delayq-attempt", b"1")]), policy)

    assert not puts.called, "nothing was sent"


def test_an_exponential_back_off_beyond_the_producers_max_delay_is_refused_at_the_attempt_that_needs_it(producer,
                                                                                                       puts):
    policy = RetryPolicy.exponential(120, max_delay=7_200, max_attempts=3)  # 108 s to 132 s at the first retry

    with pytest.raises(ValueError, match=r"retry_later: the policy's delay for attempt 1: delay .* beyond the maximum"):
        retry_later(producer, ConsumedRecord(), policy)

    assert not puts.called
