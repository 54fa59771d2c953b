"""Consumer retries with back-off: send a record that failed back through delayq, ``retry_later()``.

A consumer that cannot handle a record now gives it to :func:`retry_later`: delayq
delivers it again to its topic after the policy's delay for that attempt, with header
``delayq-attempt`` counting the attempts (RocketMQ's ``RECONSUME_LATER``, without one
retry topic per back-off step as Spring's retry topics need). When the attempts are used
up the record goes to the policy's dead-letter topic instead.
"""

from __future__ import annotations

import numbers
import random
import time
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta

from confluent_kafka import KafkaError, KafkaException

from delayq import wire
from delayq.clock import seconds_of
from delayq.schedule import DEFAULT_DELAY_LEVELS, due_ms, parse_delay_levels

if typing.TYPE_CHECKING:
    from .producer import Producer

# RocketMQ's consumer retry intervals: its delay levels without the first two (16 attempts, 10 s to 2 h).
ROCKETMQ_DELAYS_S = tuple(ms // 1000 for ms in parse_delay_levels(DEFAULT_DELAY_LEVELS)[2:])
DEAD_LETTER_SUFFIX = ".dlq"


@dataclass(frozen=True)
class RetryPolicy:
    """How long to wait before each attempt, how many attempts, and where records go after the last.

    ``delays[i]`` (seconds or a timedelta) is the wait before attempt ``i + 1``; with more
    ``max_attempts`` than delays, the last delay repeats. ``dead_letter_topic`` defaults to
    ``<topic>.dlq`` of the record's topic.

    Raises:
        TypeError, ValueError: no delays, a negative or non-numeric delay, ``max_attempts`` below 0.
    """

    delays: Sequence[float | timedelta] = ROCKETMQ_DELAYS_S
    max_attempts: int | None = None
    dead_letter_topic: str | None = None
    # For exponential(): the jittered, capped wait of attempt n, instead of delays.
    _backoff: Callable[[int], float] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self._backoff is None:
            if isinstance(self.delays, (str, bytes)) or not isinstance(self.delays, Sequence) or not self.delays:
                raise TypeError(f"delays must be a non-empty list of seconds or timedeltas; got {self.delays!r:.80}")
            object.__setattr__(self, "delays", tuple(self.delays))
            for n, delay in enumerate(self.delays, 1):
                seconds_of(delay, f"delays[{n - 1}]")
        if self.max_attempts is None:
            object.__setattr__(self, "max_attempts", len(self.delays))
        elif isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int):
            raise TypeError(f"max_attempts must be an int; got {type(self.max_attempts).__name__}")
        elif self.max_attempts < 0:
            raise ValueError(f"max_attempts must be >= 0 (0: straight to the dead-letter topic); got "
                             f"{self.max_attempts}")
        if self.dead_letter_topic is not None:
            wire.check_topic(self.dead_letter_topic)

    @classmethod
    def rocketmq(cls, dead_letter_topic: str | None = None) -> RetryPolicy:
        """RocketMQ's consumer retries: 10s 30s 1m 2m 3m ... 10m 20m 30m 1h 2h, 16 attempts (the default)."""
        return cls(ROCKETMQ_DELAYS_S, dead_letter_topic=dead_letter_topic)

    @classmethod
    def exponential(cls, initial: float | timedelta, multiplier: float = 2.0,
                    max_delay: float | timedelta = timedelta(hours=1), max_attempts: int = 10, jitter: float = 0.1,
                    dead_letter_topic: str | None = None) -> RetryPolicy:
        """Waits of ``initial``, then each ``multiplier`` times the last, capped at ``max_delay``.

        Each wait is moved at random by up to ``jitter`` of itself either way, so records that
        failed together do not all come back together.
        """
        first, cap = seconds_of(initial, "initial"), seconds_of(max_delay, "max_delay")
        if isinstance(multiplier, bool) or not isinstance(multiplier, numbers.Real) or not multiplier >= 1:
            raise ValueError(f"multiplier must be a number >= 1; got {multiplier!r}")
        if isinstance(jitter, bool) or not isinstance(jitter, numbers.Real) or not 0 <= jitter < 1:
            raise ValueError(f"jitter must be a fraction from 0 to below 1; got {jitter!r}")

        def capped(attempt: int) -> float:
            """The wait before ``attempt`` without jitter: the one formula of delays and backoff."""
            try:
                return min(cap, first * float(multiplier) ** (attempt - 1))
            except OverflowError:  # grown past any float: the cap
                return cap

        def backoff(attempt: int) -> float:
            return capped(attempt) * (1 + random.uniform(-jitter, jitter))

        delays = tuple(capped(n) for n in range(1, min(max_attempts, 64) + 1))
        return cls(delays or (first,), max_attempts, dead_letter_topic, backoff)

    def delay_for(self, attempt: int) -> float:
        """Seconds to wait before attempt ``attempt`` (1 is the first retry)."""
        if self._backoff is not None:
            return self._backoff(attempt)
        return seconds_of(self.delays[min(attempt, len(self.delays)) - 1], "delay")

    def dead_letters_to(self, topic: str) -> str:
        """Where records of ``topic`` go when their attempts are used up."""
        return self.dead_letter_topic or topic + DEAD_LETTER_SUFFIX


def attempt_of(message: typing.Any) -> int:
    """Which attempt ``message`` (a consumed record) is: its ``delayq-attempt`` header, 0 without one.

    Raises:
        ValueError: the header is not a whole number.
    """
    attempt = 0
    for name, value in message.headers() or ():
        if name == wire.ATTEMPT:
            text = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
            if not text.isdigit() or len(text) > 9:
                raise ValueError(f"header {wire.ATTEMPT} of the record is {text[:40]!r}, not an attempt number: "
                                 "only delayq writes it")
            attempt = int(text)
    return attempt


def retry_later(producer: Producer, message: typing.Any, policy: RetryPolicy | None = None, *,
                topic: str | None = None, reason: str | None = None, timeout: float = 30.0) -> str | None:
    """Have delayq deliver ``message`` again after its next attempt's delay; or dead-letter it.

    ``message`` is a record a ``confluent_kafka.Consumer`` returned. Its key, value and
    headers (without delayq's own) go back through delayq to ``topic`` (default: the
    record's own topic, and then its partition too), with ``delayq-attempt`` set to the
    record's attempt + 1, after ``policy.delay_for(attempt + 1)``. When the record has had
    ``policy.max_attempts`` attempts it goes to ``policy``'s dead-letter topic (default
    ``<topic>.dlq``) with headers ``delayq-attempt`` and ``delayq-dead-letter-reason``
    (``retries-exhausted: ...``, with ``reason`` if given) instead.

    Returns only once Kafka has the write, so a consumer that commits the record's offset
    after this returns loses no record (at least once).

    Args:
        producer: a :class:`delayq.Producer`.
        message: the consumed record.
        policy: default :meth:`RetryPolicy.rocketmq`.
        topic: where to deliver it again; default the record's topic.
        reason: why it failed, for the dead-letter header.
        timeout: seconds to wait for Kafka to take the write.

    Returns:
        The delay id of the retry, or None when the record was dead-lettered.

    Raises:
        TypeError, ValueError: ``message`` is not a record (or a consumer error event), a bad
            ``topic``, a ``delayq-attempt`` header that is no number, or the policy's delay for the
            next attempt is no delay the producer takes (negative, not finite, or beyond its
            ``max_delay_ms``). Nothing is sent.
        KafkaException: Kafka did not take the write within ``timeout``.
    """
    from .producer import Producer, now_ms_of

    if not isinstance(producer, Producer):
        raise TypeError(f"producer must be a delayq.Producer; got {type(producer).__name__}")
    for method in ("topic", "key", "value", "headers", "partition", "error"):
        if not callable(getattr(message, method, None)):
            raise TypeError(f"message must be a record a confluent_kafka.Consumer returned; got "
                            f"{type(message).__name__}")
    if message.error() is not None:
        raise ValueError(f"message is a consumer error event ({message.error()}), not a record")
    policy = RetryPolicy.rocketmq() if policy is None else policy
    if not isinstance(policy, RetryPolicy):
        raise TypeError(f"policy must be a delayq.RetryPolicy; got {type(policy).__name__}")
    source = message.topic()
    target = wire.check_topic(source if topic is None else topic)
    attempt = attempt_of(message) + 1
    headers = [(name, value) for name, value in message.headers() or () if not name.startswith(wire.RESERVED_PREFIX)]
    reports: list[KafkaError | None] = []

    def report(err: KafkaError | None, _msg: typing.Any) -> None:
        reports.append(err)

    assert policy.max_attempts is not None  # set in __post_init__
    if attempt > policy.max_attempts:
        used = attempt - 1
        text = f"{used} attempts used (the policy's max_attempts is {policy.max_attempts})"
        if reason:
            text += f"; last failure: {reason}"
        producer.produce(policy.dead_letters_to(target), message.value(), message.key(), on_delivery=report,
                         headers=[*headers, (wire.ATTEMPT, str(used).encode()),
                                  (wire.DEAD_LETTER_REASON, wire.reason_text(wire.Reason.RETRIES_EXHAUSTED,
                                                                             text).encode())])
        delay_id = None
    else:
        delay = policy.delay_for(attempt)
        try:  # the producer's own rules: a finite delay >= 0, within its max_delay_ms
            due = due_ms(now_ms_of(time.time_ns()), delay, None, producer.settings.max_delay_ms)
        except (TypeError, ValueError) as err:
            raise type(err)(f"retry_later: the policy's delay for attempt {attempt}: {err}") from None
        partition = message.partition() if target == source and message.partition() is not None else -1
        delay_id = producer.produce_put(target, message.value(), message.key(), partition, report, 0, headers or None,
                                        due=due, options=wire.schedule_options(None, None, attempt))
    deadline = time.monotonic() + timeout
    while not reports and time.monotonic() < deadline:
        producer.poll(min(0.1, max(0.0, deadline - time.monotonic())))
    if not reports:
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT, f"retry_later: Kafka did not take the write within "
                                        f"{timeout:g} s: is it reachable?"))
    if reports[0] is not None:
        raise KafkaException(reports[0])
    return delay_id
