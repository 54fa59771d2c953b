"""``delayq.quix.DelaySink``: a quixstreams sink that writes each row as a delayed message.

quixstreams has no wall-clock timers (quixstreams#790): a pipeline that wants "emit this
again in 30 minutes unless something happens" sinks the row into delayq, which delivers
it to ``topic`` when it falls due, and a later row cancels or replaces it by its delay id::

    from quixstreams import Application
    from delayq.quix import DelaySink, delay_id_for

    app = Application(broker_address="kafka:9092", consumer_group="orders")
    timeouts = DelaySink(
        "order-timeouts", delay=1800,                                   # 30 minutes
        delay_id=lambda value, key, timestamp, headers: delay_id_for("unpaid", value["order"]),
        cancel_when=lambda value, key, timestamp, headers: value["event"] == "paid",
        producer_conf={"bootstrap.servers": "kafka:9092", "delayq.cluster": "orders"})
    app.dataframe(app.topic("order-events")).sink(timeouts)

Checkpointing: a row is written when quixstreams adds it, and the sink's ``flush()``, which
quixstreams calls before it commits the input offsets, returns only once Kafka holds every
delayed message and cancel written since the last one; if one failed it raises, the
checkpoint is aborted and the rows are processed again (a put under the same delay id
replaces the pending one, so a replay neither doubles nor loses a timeout).

Installed with ``pip install "delayq[quix]"`` (quixstreams from PyPI).
"""

from __future__ import annotations

import json
import typing
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta

try:
    from quixstreams.sinks import BaseSink
except ImportError as err:  # an optional extra: say how to get it
    raise ImportError(f"delayq.quix needs quixstreams: pip install 'delayq[quix]' ({err})") from None

from delayq import schedule, wire

from .producer import Producer

# Namespace of delay_id_for(): the ids it makes are delayq's own, never another tool's uuid5s.
_ID_NAMESPACE = uuid.UUID("5f0d6a7e-9c3b-4e1a-8d2f-0b7c1e4a9d63")

RowFunction = Callable[[typing.Any, typing.Any, int, typing.Any], typing.Any]


def delay_id_for(*parts: object) -> str:
    """A delay id that is the same for the same ``parts`` (a uuid5): how a later row finds the message to cancel.

    Example:
        >>> delay_id_for("unpaid", 17) == delay_id_for("unpaid", 17)
        True
    """
    if not parts:
        raise ValueError("delay_id_for needs at least one part, like the order id")
    return str(uuid.uuid5(_ID_NAMESPACE, "\x1f".join(str(part) for part in parts)))


def _json_bytes(value: typing.Any) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    return json.dumps(value, separators=(",", ":"), default=str).encode()


class DelaySink(BaseSink):
    """Writes each row to ``topic`` through delayq, due after ``delay`` (or when ``due`` says).

    Args:
        topic: where delayq delivers the rows when they fall due.
        delay: a fixed delay, seconds or a timedelta.
        due: instead of ``delay``, a function of (value, key, timestamp, headers) returning the
            delay (seconds or a timedelta) or the due time (a timezone-aware datetime or epoch ms).
        delay_id: a function of (value, key, timestamp, headers) returning the row's delay id
            (:func:`delay_id_for`): a row with the id of a pending message replaces it. Without
            it every row gets a new id, and nothing can cancel it.
        cancel_when: a function of (value, key, timestamp, headers): a row for which it is true
            cancels the pending message of its ``delay_id`` instead of writing one.
        value_serializer, key_serializer: turn a row's value and key into bytes (JSON by
            default; bytes and str pass as they are).
        producer_conf: the :class:`delayq.Producer` configuration (``bootstrap.servers``,
            ``delayq.*`` keys, SASL, ...); ``DELAYQ_*`` settings apply as usual.
        flush_timeout: how long ``flush()`` waits for Kafka before it fails the checkpoint, s.

    Raises:
        TypeError, ValueError: neither or both of ``delay`` and ``due``, ``cancel_when``
            without ``delay_id``, a function that is not callable, or a bad ``delay``.
    """

    def __init__(self, topic: str, *, delay: float | timedelta | None = None, due: RowFunction | None = None,
                 delay_id: RowFunction | None = None, cancel_when: RowFunction | None = None,
                 value_serializer: Callable[[typing.Any], bytes | None] = _json_bytes,
                 key_serializer: Callable[[typing.Any], bytes | None] = _json_bytes,
                 producer_conf: dict[str, typing.Any] | None = None, flush_timeout: float = 30.0, **kwargs):
        super().__init__(**kwargs)
        if (delay is None) == (due is None):
            raise ValueError("give DelaySink either delay (a fixed delay) or due (a function of the row), not "
                             f"{'both' if delay is not None else 'neither'}")
        if cancel_when is not None and delay_id is None:
            raise ValueError("cancel_when needs delay_id: the id tells which pending message a row cancels")
        for name, function in (("due", due), ("delay_id", delay_id), ("cancel_when", cancel_when),
                               ("value_serializer", value_serializer), ("key_serializer", key_serializer)):
            if function is not None and not callable(function):
                raise TypeError(f"{name} must be a function of (value, key, timestamp, headers), not "
                                f"{type(function).__name__}")
        wire.check_topic(topic)
        self.topic = topic
        self._delay, self._due, self._delay_id, self._cancel_when = delay, due, delay_id, cancel_when
        self._value_bytes, self._key_bytes = value_serializer, key_serializer
        self._conf = dict(producer_conf or {})
        self._flush_timeout = flush_timeout
        self._producer: Producer | None = None
        self._failures: list[str] = []

    def setup(self) -> None:
        """The delayq producer, and a check that Kafka and the buffer topic are there (quixstreams' start)."""
        self._producer = Producer(self._conf)
        self._producer.buffer_partitions()

    def add(self, value: typing.Any, key: typing.Any, timestamp: int, headers: typing.Any, topic: str,
            partition: int, offset: int) -> None:
        producer = self._producer
        if producer is None:
            self.setup()
            producer = self._producer
        assert producer is not None
        row = (value, key, timestamp, headers)
        delay_id = self._delay_id(*row) if self._delay_id is not None else None
        if self._cancel_when is not None and self._cancel_when(*row):
            assert delay_id is not None  # checked in __init__
            producer.cancel(delay_id, on_delivery=self._delivered)
            return
        when = self._due(*row) if self._due is not None else self._delay
        if isinstance(when, datetime) or (isinstance(when, int) and not isinstance(when, bool)
                                          and when >= schedule.MIN_DUE_MS):
            timing: dict[str, typing.Any] = {"deliver_at": when}
        else:
            timing = {"delay": when}
        producer.produce(self.topic, self._value_bytes(value), self._key_bytes(key), on_delivery=self._delivered,
                         delay_id=delay_id, **timing)
        producer.poll(0)

    def flush(self) -> None:
        """Returns once Kafka holds every row written since the last flush; raises (aborting the checkpoint) if not.

        Raises:
            RuntimeError: a delayed message or cancel was refused, or Kafka did not confirm in time.
        """
        if self._producer is None:
            return
        remaining = self._producer.flush(self._flush_timeout)
        failures, self._failures = self._failures, []
        if remaining:
            raise RuntimeError(f"DelaySink: {remaining} delayed message(s) to {self.topic} not confirmed by Kafka "
                               f"within {self._flush_timeout:g}s: the checkpoint is not committed, the rows come again")
        if failures:
            raise RuntimeError(f"DelaySink: {len(failures)} delayed message(s) to {self.topic} failed "
                               f"({failures[0]}): the checkpoint is not committed, the rows come again")

    def _delivered(self, err: typing.Any, msg: typing.Any) -> None:
        if err is not None:
            self._failures.append(str(err))
