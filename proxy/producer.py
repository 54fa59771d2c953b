"""``delayq.Producer``: confluent-kafka's Producer, plus ``delay=`` / ``deliver_at=``.

Change ``from confluent_kafka import Producer`` to ``from delayq import Producer``;
nothing else changes for messages without a delay. A message with a delay goes to
the buffer topic in the envelope (docs/DESIGN.md, "Wire format"), and the delay-service
nodes deliver it to its topic when it falls due.

Which buffer partition an id lives on: ``crc32(id) % partitions`` (:func:`delayq.wire.buffer_partition`), the hash of
librdkafka's default ``consistent_random`` partitioner, so put, cancel and reschedule
of one id land on one partition whatever ``partitioner`` the producing client uses.
Never add partitions to the buffer topic: pending ids would move.
"""

from __future__ import annotations

import itertools
import numbers
import operator
import os
import threading
import time
import typing
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

import confluent_kafka
from confluent_kafka import KafkaError, KafkaException
from pydantic import ValidationError

from delayq import wire
from delayq.errors import ConfigurationError
from delayq.schedule import MIN_DUE_MS, clock_error, due_ms, first_due
from delayq.settings import ENV_PREFIX, Settings, closest_setting, validation_problems
from delayq.wire import buffer_partition, check_delay_id, control_headers, frame_head, put_value

from .feature_gate import FeatureGate
from .lookup import Lookup, lookup
from .repeat import Cron, Every

DEFAULT_PARTITIONER = "consistent_random"
# librdkafka partitioners that hash a non-empty key with CRC32, exactly like buffer_partition().
_CRC32_PARTITIONERS = frozenset({"consistent", "consistent_random"})

# Bound once: the hot path pays neither the global lookups nor super()'s frame walk.
_base_produce = confluent_kafka.Producer.produce
_time_ns = time.time_ns

_RESERVED = frozenset({wire.RESERVED_PREFIX, wire.RESERVED_PREFIX.encode()})
_RESERVED_LEN = len(wire.RESERVED_PREFIX)
# A clock before 2000-01-01 would make even delay=0 a due time the nodes refuse (schedule.MIN_DUE_MS).
_MIN_CLOCK_NS = MIN_DUE_MS * 1_000_000


# -- delay ids ---------------------------------------------------------------


class _DelayTicks:
    """State for UUIDv7 delay ids (RFC 9562, method 1: a 12-bit counter in ``rand_a``).

    ``wire.new_delay_id`` formats 128 fresh random bits per id, which alone costs
    about as much as a plain ``produce()``. Here the random tail (62 bits) is drawn once
    per millisecond per process and a counter numbers the ids inside that millisecond,
    so ids stay unique across processes (the tail) and sort in creation order inside
    one (the counter). A tick's ids come from a chain of C iterators, so ``next()``
    runs no Python code: it is cheap, and atomic under the GIL, so threads need no lock.

    A tick is ``(first ns, end ns, ms, the __next__ of an iterator of that millisecond's
    4096 ids)``: the hot path tells whether the clock is still in it without a division.
    """

    _COUNTER_HEX = tuple(f"{i:03x}" for i in range(4096))
    _NONE = (0, 0, -1, iter(()).__next__)

    def __init__(self) -> None:
        self.tick: tuple = self._NONE
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        # A forked child would otherwise share the parent's tail and counter for this millisecond.
        self.tick = self._NONE

    def new(self, now_ns: int) -> tuple:
        """Start the tick of ``now_ns``'s millisecond.

        Raises:
            RuntimeError: the clock reads before 2000-01-01. Checked here, once per
                millisecond, so every tick's ``ms`` is at or after schedule.MIN_DUE_MS and
                ``ms + delay`` (delay >= 0) is never a due time the nodes refuse.
        """
        if now_ns < _MIN_CLOCK_NS:
            raise clock_error(now_ns // 1_000_000)
        ms = now_ns // 1_000_000
        tail = int.from_bytes(os.urandom(8), "big") & (1 << 62) - 1 | 1 << 63
        head = f"{ms >> 16 & 0xFFFFFFFF:08x}-{ms & 0xFFFF:04x}-7"
        tail_text = f"-{tail >> 48:04x}-{tail & 0xFFFF_FFFF_FFFF:012x}"
        ids = map(operator.add, itertools.repeat(head),
                  map(operator.add, self._COUNTER_HEX, itertools.repeat(tail_text)))
        start = ms * 1_000_000
        tick = (start, start + 1_000_000, ms, ids.__next__)
        self.tick = tick
        return tick


_ticks = _DelayTicks()


def new_id(now_ns: int | None = None) -> str:
    """A fresh delay id (UUIDv7) from the process's ticks."""
    now_ns = _time_ns() if now_ns is None else now_ns
    tick = _ticks.tick
    if not tick[0] <= now_ns < tick[1]:
        tick = _ticks.new(now_ns)
    try:
        return tick[3]()
    except StopIteration:  # more than 4096 ids in one millisecond: a fresh tail keeps them unique
        return _ticks.new(now_ns)[3]()


def now_ms_of(now_ns: int) -> int:
    """``now_ns`` in ms, refused before 2000-01-01 (a due time from it would be too)."""
    if now_ns < _MIN_CLOCK_NS:
        raise clock_error(now_ns // 1_000_000)
    return now_ns // 1_000_000


# -- settings from the conf dict ---------------------------------------------

CONF_PREFIX = "delayq."


def split_conf(conf: dict[str, typing.Any]) -> tuple[dict[str, typing.Any], dict[str, typing.Any]]:
    """Split a producer conf into (delayq's keys without the prefix, the rest for librdkafka).

    ``conf`` itself is left untouched.
    """
    own: dict[str, typing.Any] = {}
    rest: dict[str, typing.Any] = {}
    for key, value in conf.items():
        if isinstance(key, str) and key.startswith(CONF_PREFIX):
            own[key[len(CONF_PREFIX):]] = value
        else:
            rest[key] = value
    return own, rest


# -- the buffer's per-id order -------------------------------------------------

# librdkafka's own defaults (idempotence off, up to a million requests in flight, retries on) let a
# retried batch land behind the batches sent after it, and a batch whose ack was lost be written twice:
# a put could then follow its own cancel in the buffer, or become a second version of itself. The
# nodes apply an id's records in buffer order, so every buffer writer is idempotent: the broker keeps
# each partition in the order produce() was called and drops a retried batch it already has.
_IDEMPOTENCE = "enable.idempotence"
# Each setting that idempotence constrains, under librdkafka's names and aliases.
_ACKS = ("acks", "request.required.acks")
_IN_FLIGHT = ("max.in.flight.requests.per.connection", "max.in.flight")
_RETRIES = ("retries", "message.send.max.retries")
_MAX_IDEMPOTENT_IN_FLIGHT = 5
_ORDER_FIX = ("delayq's buffer writes need an idempotent producer, so that each delay id's put, cancel and "
              "reschedule land in the order they were sent and a retried write is never written twice")


def _conf_value(conf: dict[str, typing.Any], names: tuple[str, ...]) -> tuple[str, typing.Any] | None:
    """(name, value) of the first of ``names`` set in ``conf`` or its ``default.topic.config``."""
    topic_conf = conf.get("default.topic.config")
    for scope in (conf, topic_conf if isinstance(topic_conf, dict) else {}):
        for name in names:
            if name in scope:
                return name, scope[name]
    return None


def _conf_int(value: typing.Any) -> int | None:
    try:
        return int(str(value).strip())
    except ValueError:
        return None


def ordered_conf(conf: dict[str, typing.Any]) -> dict[str, typing.Any]:
    """What to add to a librdkafka producer ``conf`` so that its buffer writes keep each id's order.

    ``enable.idempotence`` is turned on unless the conf sets it (a ``transactional.id``
    implies it). A conf that cannot keep the order is refused before anything is sent.

    Raises:
        ValueError: ``enable.idempotence`` off, ``acks`` other than all, more than 5 requests in
            flight, or no retries: each named with its value and the fix.
    """
    found = _conf_value(conf, (_IDEMPOTENCE,))
    if found is not None and str(found[1]).strip().lower() in ("false", "0", "no", "off"):
        raise ValueError(f"conf {_IDEMPOTENCE}={found[1]!r}: {_ORDER_FIX}; leave {_IDEMPOTENCE} out (delayq turns "
                         "it on) or set it to true")
    acks = _conf_value(conf, _ACKS)
    if acks is not None and str(acks[1]).strip().lower() not in ("all", "-1"):
        raise ValueError(f"conf {acks[0]}={acks[1]!r}: {_ORDER_FIX}, which needs acks from all in-sync replicas; "
                         f"leave {acks[0]} out or set it to all")
    in_flight = _conf_value(conf, _IN_FLIGHT)
    if in_flight is not None and (_conf_int(in_flight[1]) or 0) > _MAX_IDEMPOTENT_IN_FLIGHT:
        raise ValueError(f"conf {in_flight[0]}={in_flight[1]!r}: {_ORDER_FIX}, which keeps order with at most "
                         f"{_MAX_IDEMPOTENT_IN_FLIGHT} requests in flight; leave {in_flight[0]} out or set it "
                         f"to 1-{_MAX_IDEMPOTENT_IN_FLIGHT}")
    retries = _conf_value(conf, _RETRIES)
    if retries is not None and _conf_int(retries[1]) == 0:
        raise ValueError(f"conf {retries[0]}={retries[1]!r}: {_ORDER_FIX}, and without retries a write the broker "
                         f"did not confirm is lost; leave {retries[0]} out")
    return {} if found is not None else {_IDEMPOTENCE: True}


def settings_from_conf(own: dict[str, typing.Any]) -> Settings:
    """Settings from ``DELAYQ_*`` (and ``DELAYQ_CONFIG``), overridden by ``delayq.*`` conf keys.

    ``"delayq.buffer.topic"`` sets ``buffer_topic``: dots (and dashes) become underscores.

    Raises:
        ValueError: a key names no setting, or its value is not valid for that setting.
    """
    fields = Settings.model_fields
    overrides: dict[str, typing.Any] = {}
    conf_keys: dict[str, str] = {}
    for name, value in own.items():
        field = name.replace(".", "_").replace("-", "_")
        if field not in fields:
            known = [CONF_PREFIX + f.replace("_", ".") for f in fields]
            raise ConfigurationError(f"conf key {CONF_PREFIX + name!r}: no such setting; "
                                     f"{closest_setting(CONF_PREFIX + name, known, CONF_PREFIX)}")
        if typing.get_origin(fields[field].annotation) is list and isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        overrides[field] = value
        conf_keys[field] = CONF_PREFIX + name
    try:
        return Settings(**overrides)
    except ValidationError as err:
        def named(field: str) -> str:
            return f"conf key {conf_keys[field]!r}" if field in conf_keys else f"{ENV_PREFIX}{field.upper()}"

        raise ValueError("delayq settings are not valid: " + validation_problems(err, named)) from None


# -- expiry ------------------------------------------------------------------


# The feature level a message that expires needs (delayq/features.py): its frame says expires=.
EXPIRY_LEVEL = wire.OPTION_LEVELS[wire.EXPIRES_OPTION]
# The largest expires= a frame holds: 18 digits.
_MAX_FRAME_MS = 10**18 - 1


def expiry_options(due: int, expire_after: object, repeat: object) -> str:
    """The frame options of a message due at ``due`` that may be delivered at most ``expire_after`` late.

    Past that, the master dead-letters it (reason ``expired``) rather than deliver it.

    Raises:
        TypeError: ``expire_after`` is not seconds (int or float) or a timedelta.
        ValueError: negative, NaN or infinite; or a repeating message (``repeat``), whose
            occurrences one expiry time cannot bound.
    """
    if repeat is not None:
        raise ValueError("expire_after is for a message delivered once: a repeating message (repeat=) cannot "
                         "expire; give each occurrence's consumer the lateness it accepts instead")
    if isinstance(expire_after, timedelta):
        seconds = expire_after.total_seconds()
    elif isinstance(expire_after, bool) or not isinstance(expire_after, numbers.Real):
        raise TypeError(f"expire_after must be seconds as an int or float, or a timedelta; got "
                        f"{type(expire_after).__name__} {expire_after!r}")
    else:
        seconds = float(expire_after)
    if not seconds >= 0 or due + seconds * 1000 > _MAX_FRAME_MS:  # NaN is not >= 0, infinity is past the max
        raise ValueError(f"expire_after must be a finite number of seconds >= 0 (how late the message may still "
                         f"be delivered); got {expire_after!r}")
    return wire.expiry_options(due + round(seconds * 1000))


def _check_timestamp(timestamp: object) -> int:
    """``timestamp`` of a delayed message, refused before anything is sent unless an int.

    confluent-kafka raises a bare "'float' object cannot be interpreted as an integer" for
    these, and takes a bool as 0 or 1 ms; a negative int it sends, and Kafka keeps it, as
    the nodes do (a put's creation time may be negative), so that passes here too.
    """
    if isinstance(timestamp, bool) or not isinstance(timestamp, int):
        raise TypeError(f"timestamp must be epoch milliseconds as an int (0: now); got {type(timestamp).__name__} "
                        f"{timestamp!r:.100}")
    return int(timestamp)


def _as_bytes(data: object, argument: str) -> bytes:
    """``data`` (str, bytes or another read-only buffer, as confluent-kafka takes them) as bytes."""
    if type(data) is bytes:
        return data
    if isinstance(data, str):
        return data.encode()
    try:
        view = memoryview(data)  # type: ignore[arg-type]  # a probe: TypeError for what is not a buffer
    except TypeError:
        raise TypeError(f"{argument} must be str, bytes or None; got {type(data).__name__}") from None
    return view.tobytes()


def _bad_partition(partition: object) -> TypeError | ValueError:
    """The error for a ``partition`` that is neither -1 nor a partition number (an int >= 0)."""
    error = ValueError if type(partition) is int else TypeError
    return error(f"partition must be -1 (the partitioner decides) or a partition number >= 0 (an int); "
                 f"got {partition!r}")


def _check_user_headers(headers: object) -> list:
    """The user's headers as a list, in order; names starting ``delayq-`` are refused."""
    if isinstance(headers, dict):
        headers = list(headers.items())
    elif not isinstance(headers, list):
        raise TypeError(f"headers must be a dict or a list of (name, value) tuples; got {type(headers).__name__}")
    try:
        for header in headers:
            if header[0][:_RESERVED_LEN] in _RESERVED:
                raise ValueError(f"headers: name {header[0]!r} starts with {wire.RESERVED_PREFIX!r}, "
                                 "which delayq reserves for its envelope; rename the header")
    except (TypeError, IndexError, KeyError):
        raise TypeError(f"headers must be a dict or a list of (name, value) tuples; got {headers!r:.200}") from None
    return headers


# -- the rules of a delayed put, shared with delayq.aio ----------------------


def delay_id_needs_delay() -> ValueError:
    """The error for a ``delay_id`` given without a due time (it names a delayed message to put again)."""
    return ValueError("delay_id needs delay or deliver_at: it re-puts a delayed message")


def check_reschedule(delay_id: object, delay: object, deliver_at: object, delay_level: object,
                     repeat: object) -> None:
    """What a reschedule needs beyond a produce: a delay id, and a new due time.

    Raises:
        TypeError, ValueError: a malformed ``delay_id``, no due time, or ``delay_level=0`` without ``repeat``.
    """
    check_delay_id(delay_id)
    if delay is None and deliver_at is None and delay_level is None and repeat is None:
        raise ValueError("give delay (seconds or a timedelta) or deliver_at (a datetime or epoch ms) to reschedule")
    if delay_level == 0 and repeat is None:
        raise ValueError("delay_level 0 is no delay: reschedule needs a due time (level 1 or more)")


@dataclass(frozen=True, slots=True)
class Put:
    """A delayed message as the buffer takes it: the put's value, its id (the record key), user headers, timestamp."""

    frame: bytes
    delay_id: str
    headers: list | None
    timestamp: int


@dataclass(frozen=True, slots=True)
class BufferWriter:
    """What a producer needs to write delayed messages, and the checks they pass: one home for both producers.

    :class:`Producer` and :class:`delayq.aio.AIOProducer` accept, refuse and write a delayed
    message through these methods (the synchronous producer's plain-``delay`` hot path
    inlines the same checks for speed, and tests/integration/test_aio_producer.py holds
    the two to the same errors).

    Args:
        settings: from ``DELAYQ_*`` and the ``delayq.*`` conf keys.
        partitioner: the producer's librdkafka ``partitioner`` (a put's frame names it unless it is the default).
        sasl_user: the producer's SASL user, named when the buffer cannot be seen.
    """

    settings: Settings
    partitioner: str = DEFAULT_PARTITIONER
    sasl_user: str | None = None

    @classmethod
    def from_conf(cls, conf: dict[str, typing.Any]) -> tuple[BufferWriter, dict[str, typing.Any]]:
        """The writer for a producer conf, and the conf without its ``delayq.*`` keys (librdkafka's).

        Raises:
            ValueError: a ``delayq.*`` key names no setting or has a bad value, or the conf cannot keep
                each id's writes in order (:func:`ordered_conf`).
        """
        own, rest = split_conf(conf)
        topic_conf = rest.get("default.topic.config") or {}
        partitioner = str({**topic_conf, **rest}.get("partitioner", DEFAULT_PARTITIONER))
        writer = cls(settings_from_conf(own), partitioner, rest.get("sasl.username"))
        return writer, {**rest, **ordered_conf(rest)}

    @property
    def partitioner_name(self) -> str | None:
        """The partitioner a put's frame names: None for librdkafka's default (a shorter frame)."""
        return None if self.partitioner == DEFAULT_PARTITIONER else self.partitioner

    def schedule(self, now_ms: int, delay: object, deliver_at: object, delay_level: object = None,
                 repeat: Every | Cron | None = None, expire_after: object = None) -> tuple[int | None, str]:
        """(due time, more frame options) of a produce; (None, "") when it is no delayed message.

        Raises:
            TypeError, ValueError: as :meth:`Producer.produce` raises them for these arguments.
        """
        if delay is None and deliver_at is None and delay_level is None and repeat is None:
            if expire_after is not None:
                raise ValueError("expire_after bounds how late a delayed message may be delivered: give delay, "
                                 "deliver_at or delay_level too")
            return None, ""
        if repeat is not None and not isinstance(repeat, (Every, Cron)):
            raise TypeError(f"repeat must be a delayq.Every or delayq.Cron; got {type(repeat).__name__} "
                            f"{repeat!r:.60}")
        series = None if repeat is None else repeat.series()
        due = first_due(now_ms, delay, deliver_at, delay_level, series, self.settings.delay_levels_ms,
                        self.settings.max_delay_ms)
        if due is None:
            return None, ""
        options = wire.schedule_options(series, None, None)
        if expire_after is not None:
            options += expiry_options(due, expire_after, repeat)
        return due, options

    def put(self, topic: str, value: object, key: object, partition: object, timestamp: object,
            headers: object, *, due: int, options: str = "", delay_id: str | None = None) -> Put:
        """Check a delayed message and build its put.

        Raises:
            TypeError, ValueError: a key or value that is not bytes or str, a bad partition, a
                topic Kafka refuses or delayq never delivers to, a ``delayq-`` header, a
                timestamp that is no int, a malformed ``delay_id``. Nothing is sent.
        """
        if type(key) is not bytes and key is not None:
            key = _as_bytes(key, "key")
        if type(value) is not bytes and value is not None:
            value = _as_bytes(value, "value")
        if type(partition) is not int or partition < -1:
            raise _bad_partition(partition)
        if partition == -1:
            frame = put_value(due, topic, key, value, None, self.partitioner_name, None, options)
        else:
            frame = put_value(due, topic, key, value, partition, None, None, options)
        self.refuse_forbidden(topic)
        checked = _check_user_headers(headers) if headers is not None else None
        return Put(frame, new_id() if delay_id is None else check_delay_id(delay_id), checked,
                   _check_timestamp(timestamp))

    def refuse_forbidden(self, topic: str) -> None:
        """Raises: ValueError: no delayq master ever delivers to ``topic`` (Settings.always_forbidden_target)."""
        problem = self.settings.always_forbidden_target(topic)
        if problem is not None:
            raise ValueError(f"delayq never delivers to {topic}: {problem} (a put there would be dead-lettered "
                             "forbidden-topic); choose the topic the message is for")

    def partition_count(self, topics: dict[str, typing.Any]) -> int:
        """The buffer's partition count from a ``list_topics()`` answer (of all topics: one by name may auto-create it).

        Raises:
            KafkaException: UNKNOWN_TOPIC_OR_PART, saying how to fix it, when the buffer is not
                listed: it does not exist, or (Kafka lists only what a principal may see) an ACL is missing.
        """
        buffer_topic = self.settings.buffer_topic
        found = topics.get(buffer_topic)
        if found is None or found.error is not None or not found.partitions:
            user = self.sasl_user
            unseen = f", or Kafka user {user!r} may not see it" if user else ""
            grant = f", grant the producer ACLs (delayq acls --producer User:{user} --apply)" if user else ""
            raise KafkaException(KafkaError(
                KafkaError.UNKNOWN_TOPIC_OR_PART,
                f"buffer topic {buffer_topic!r} does not exist{unseen}: create it with `delayq init`{grant}, or "
                "set DELAYQ_CLUSTER or conf key delayq.cluster (or the buffer topic) to the cluster's"))
        return len(found.partitions)


# -- the producer ------------------------------------------------------------


class Producer(confluent_kafka.Producer):
    """confluent-kafka's Producer that can also hold a message back until a due time.

    Configuration is the confluent-kafka one. delayq's own settings come from
    :class:`delayq.Settings` (``DELAYQ_*`` environment variables, ``DELAYQ_CONFIG``
    file), overridden by conf keys starting ``delayq.``: ``"delayq.cluster"``,
    ``"delayq.buffer.topic"``, ``"delayq.max.delay.ms"``, ``"delayq.lookup.urls"``,
    ``"delayq.zk.connect"``, ... Those keys are taken out of (a copy of) the conf
    before it reaches librdkafka; ``bootstrap.servers`` and every librdkafka setting
    come from the conf as usual.

    Example::

        from delayq import Producer

        p = Producer({"bootstrap.servers": "kafka:9092", "delayq.cluster": "orders"})
        p.produce("payments", b"now")                              # as before
        delay_id = p.produce("reminders", b"pay?", key=b"o-17", delay=3600)
        p.cancel(delay_id)
        p.flush()

    Delayed messages ride the producer's transaction when it has one: an aborted
    transaction leaves no delayed message behind.

    Args:
        conf: the librdkafka configuration, with optional ``delayq.*`` keys.
        **kwargs: more configuration, as confluent-kafka takes it (e.g. ``logger=``).

    Every write is idempotent (librdkafka's ``enable.idempotence``, turned on unless the conf
    sets it): the buffer then holds each delay id's writes in the order they were sent, each
    once, which a cancel or reschedule winning over its put depends on.

    Raises:
        ValueError: a ``delayq.*`` key names no setting or has a bad value, or the conf turns
            idempotence off or sets what it cannot work with (acks other than all, more than 5
            requests in flight, no retries).
    """

    __slots__ = (
        "_buffer_partitions",
        "_buffer_topic",
        "_crc_by_librdkafka",
        "_last_frame",
        "_level_gate",
        "_lock",
        "_max_delay_ms",
        "_max_delay_s",
        "_partitioner",
        "_partitioner_name",
        "_partitioner_option",
        "_settings",
        "_writer",
    )

    def __init__(self, conf: dict[str, typing.Any] | None = None, /, **kwargs: typing.Any) -> None:
        if conf is not None and not isinstance(conf, dict):
            raise TypeError(f"conf must be a configuration dict, not {type(conf).__name__}")
        # delayq's keys of both, the writer's; librdkafka's part of each goes on as confluent-kafka takes them.
        # from_conf's librdkafka conf is both merged, with idempotence added unless either set it; what came
        # as keyword arguments goes on as keyword arguments.
        self._writer, librdkafka_conf = BufferWriter.from_conf({**(conf or {}), **kwargs})
        rest_kw = split_conf(kwargs)[1]
        rest = {key: value for key, value in librdkafka_conf.items() if key not in rest_kw}
        self._settings = self._writer.settings
        self._buffer_topic = self._settings.buffer_topic
        self._max_delay_ms = self._settings.max_delay_ms
        self._max_delay_s = self._max_delay_ms / 1000
        self._partitioner = self._writer.partitioner
        # Absent means librdkafka's default to the nodes (delay_service.partitioners): a shorter frame.
        self._partitioner_name = self._writer.partitioner_name
        self._partitioner_option = wire.frame_options(None, self._partitioner_name, False)
        self._last_frame: tuple = (None, None, None, b"")
        # With a CRC32 partitioner librdkafka already puts key=id where buffer_partition() says.
        self._crc_by_librdkafka = self._partitioner in _CRC32_PARTITIONERS
        self._buffer_partitions: int | None = None
        self._lock = threading.Lock()
        self._level_gate = FeatureGate(self._settings)
        super().__init__(rest, **rest_kw)

    @property
    def settings(self) -> Settings:
        """delayq's settings for this producer (environment, then ``delayq.*`` conf keys)."""
        return self._settings

    @property
    def level_gate(self) -> FeatureGate:
        """The cluster's finalized feature level as this producer follows it: what needs a newer level asks it first."""
        return self._level_gate

    def close(self) -> bool:
        """Close this producer: its ZooKeeper client, if a request of a feature level above 1 opened one, then (from
        confluent-kafka 2.13, whose close() flushes first) the producer itself.

        An older confluent-kafka has no close(): its producer is freed when no reference to it remains
        (call flush() before).
        """
        self._level_gate.close()
        closes = getattr(super(), "close", None)
        return closes() if closes is not None else True

    def __exit__(self, *exc_info: typing.Any) -> bool | None:
        """The end of ``with Producer(...) as p:`` (confluent-kafka 2.13 on): flush and close, the ZooKeeper client
        too."""
        self._level_gate.close()
        return super().__exit__(*exc_info)

    # Not confluent-kafka's signature: it returns the delay id, and `callback` is keyword-only here.
    def produce(  # type: ignore[override]
        self,
        topic: str,
        value: str | bytes | None = None,
        key: str | bytes | None = None,
        partition: int = -1,
        on_delivery: Callable | None = None,
        timestamp: int = 0,
        headers: dict | list | None = None,
        *,
        delay: float | timedelta | None = None,
        deliver_at: datetime | int | None = None,
        delay_id: str | None = None,
        callback: Callable | None = None,
        delay_level: int | None = None,
        repeat: Every | Cron | None = None,
        expire_after: float | timedelta | None = None,
    ) -> str | None:
        """Produce a message to ``topic``, now or, with ``delay``/``deliver_at``, when it falls due.

        Without ``delay`` and ``deliver_at`` this is confluent-kafka's ``produce()``,
        untouched, and returns None. With one of them the message goes to the buffer
        topic and this returns its delay id (a UUIDv7 str) for :meth:`cancel`,
        :meth:`reschedule` and :func:`delayq.lookup`. ``deliver_at`` as an int is epoch
        **milliseconds**; a due time before 2000-01-01 (:data:`delayq.schedule.MIN_DUE_MS`) is
        refused, since it is almost always seconds meant as milliseconds (every node
        refuses it too). A due time already past (after 2000) is delivered as soon as
        possible. The delivered record has the ``key``,
        ``value``, ``headers`` and ``partition`` given here, bit for bit; when no
        partition is given, the node picks it with this producer's ``partitioner``,
        so it lands beside immediate messages with the same key.

        ``on_delivery`` (alias ``callback``) for a delayed message reports the write to
        the **buffer topic**, not the later delivery: ``msg.topic()`` is the buffer
        topic, ``msg.key()`` is the delay id as ASCII bytes (match it with
        ``msg.key().decode() == delay_id``), ``msg.value()`` the buffer record's
        value: the envelope's frame line, then your key and payload
        (``delayq.wire.parse_buffer_record`` reads it back). Success means delayq
        holds the message durably.

        ``timestamp`` of a delayed message is the timestamp of its **buffer** record
        (the put's creation time, which the reconciliation reads as when the put was
        written); 0 means now, by the producer's clock. It does not move the due time
        (``delay`` counts from now). The **delivered** record's timestamp is the time
        of delivery, as for every delayq delivery: the delivering master's CreateTime
        (the broker's clock if the target topic uses LogAppendTime), at or after the
        due time, so consumers and the reconciliation judge "never early" by it. A
        negative timestamp is sent as confluent-kafka sends it; one further ahead than
        the buffer topic's ``message.timestamp.after.max.ms`` (one hour by default in
        Kafka 4) is refused by the broker, in the delivery report (``INVALID_TIMESTAMP``).

        ``delay_id`` puts the message under an id :meth:`produce` returned before: the
        new put replaces that pending message, which is :meth:`reschedule`.

        Args:
            topic: target topic.
            value: payload (str or bytes), or None.
            key: key (str or bytes), or None.
            partition: target partition, or -1 for the configured partitioner.
            on_delivery: delivery report callback ``(err, msg)``, served by poll()/flush().
            timestamp: CreateTime in epoch ms (an int), 0 for now; for a delayed message,
                the buffer record's (see above).
            headers: dict or list of (name, value); names starting ``delayq-`` are
                refused for a delayed message.
            delay: seconds (int or float, >= 0) or a timedelta.
            deliver_at: due time, a timezone-aware datetime or epoch milliseconds (int),
                at or after 2000-01-01T00:00:00Z.
            delay_id: re-put under this existing id (needs ``delay`` or ``deliver_at``).
            callback: alias of ``on_delivery``, as in confluent-kafka.
            delay_level: instead of ``delay``, a RocketMQ-style level: 1 to the number of
                levels in setting ``delay_levels`` (default 1s 5s 10s 30s 1m 2m ... 1h 2h);
                0 is no delay. An out-of-range level raises (RocketMQ would clamp it).
            repeat: :class:`delayq.Every` or :class:`delayq.Cron`: deliver the message again
                and again under one id, each occurrence with header ``delayq-occurrence``;
                the first at ``delay``/``deliver_at``/``delay_level`` (default: one interval
                from now, or the cron expression's next match). ``cancel(id)`` stops it.
            expire_after: how late the message may still be delivered, in seconds or a
                timedelta after its due time: one the cluster cannot deliver by then (an
                outage, a dispatch limit, a backlog) goes to the dead-letter topic with reason
                ``expired`` instead. Needs the cluster's feature level 2 (``delayq upgrade
                finalize``), asked of ZooKeeper the first time; not with ``repeat``.

        Returns:
            The delay id for a delayed message, else None.

        Raises:
            TypeError: ``delay``/``deliver_at``/``headers``/``topic``/``key``/``value``
                of the wrong type; for a delayed message, a ``timestamp`` that is not an int.
            ValueError: negative, NaN or infinite delay; both ``delay`` and
                ``deliver_at``; naive datetime; ``deliver_at`` before 2000-01-01 ("did
                you mean seconds?"); due beyond ``max_delay_ms``; a ``delayq-`` header
                name; a topic name Kafka refuses; a malformed ``delay_id``; ``expire_after``
                negative, with ``repeat``, or without a delay. Nothing is sent.
            LevelNotFinalized: (a ValueError) ``expire_after``, and the cluster is not finalized
                at feature level 2. Nothing is sent.
            UnavailableError: ``expire_after``, and ZooKeeper did not answer whether the cluster is.
            RuntimeError: this machine's clock reads before 2000-01-01. Nothing is sent.
            BufferError: the local queue is full (``queue.buffering.max.messages``); poll and retry.
            KafkaException: as confluent-kafka's ``produce()``; for a delayed message
                also when the buffer topic does not exist (run ``delayq init``).
        """
        if callback is not None:  # confluent-kafka lets callback win when both are given
            on_delivery = callback
        if delay_level is not None or repeat is not None or expire_after is not None:
            due, options = self._writer.schedule(now_ms_of(_time_ns()), delay, deliver_at, delay_level, repeat,
                                                 expire_after)
            if due is None:  # level 0: no delay
                return self.produce(topic, value, key, partition, on_delivery, timestamp, headers, delay_id=delay_id)
            if expire_after is not None:
                self._level_gate.require_level(EXPIRY_LEVEL, "expire_after")
            return self.produce_put(topic, value, key, partition, on_delivery, timestamp, headers, due=due,
                                    options=options, delay_id=delay_id)
        # Positional arguments in the order of cimpl's produce(topic, value, key, partition,
        # callback, on_delivery, timestamp, headers): keyword parsing costs measurably per call.
        if delay is None and deliver_at is None:
            if delay_id is not None:
                raise delay_id_needs_delay()
            return _base_produce(self, topic, value, key, partition, on_delivery, None, timestamp, headers)
        # The hot path of a delayed message, in one frame: each step shows in the per-call
        # cost (bench/produce_bench.py), so checks take their cheap branch first.
        now_ns = _time_ns()
        tick = _ticks.tick
        if not tick[0] <= now_ns < tick[1]:
            tick = _ticks.new(now_ns)
        now_ms = tick[2]
        # type(delay) each time, not in a local: only that narrows `delay` for mypy, and it measures no slower.
        if deliver_at is None and (type(delay) is int or type(delay) is float) and 0 <= delay <= self._max_delay_s:
            due = now_ms + (delay * 1000 if type(delay) is int else round(delay * 1000))
        else:
            due = due_ms(now_ms, delay, deliver_at, self._max_delay_ms)
        if type(key) is not bytes and key is not None:
            key = _as_bytes(key, "key")
        if type(value) is not bytes and value is not None:
            value = _as_bytes(value, "value")
        if partition == -1 and value is not None:
            # A burst to one topic with one delay shares the frame line within a millisecond.
            length = -1 if key is None else len(key)
            last = self._last_frame
            if last[0] != due or last[1] != topic or last[2] != length:
                head = frame_head(due, topic, None if key is None else length, self._partitioner_option)
                self._writer.refuse_forbidden(topic)
                last = self._last_frame = (due, topic, length, head)  # one tuple: no torn reads across threads
            value = last[3] + value if key is None else b"".join((last[3], key, value))
        elif partition == -1:  # a null value
            value = put_value(due, topic, key, None, None, self._partitioner_name)
            self._writer.refuse_forbidden(topic)
        elif type(partition) is int and partition >= 0:
            value = put_value(due, topic, key, value, partition)
            self._writer.refuse_forbidden(topic)
        else:
            raise _bad_partition(partition)
        if headers is not None:
            headers = _check_user_headers(headers)
        if type(timestamp) is not int:
            timestamp = _check_timestamp(timestamp)
        if delay_id is None:
            try:
                delay_id = tick[3]()
            except StopIteration:
                # More than 4096 ids in one millisecond: a fresh tail keeps them unique.
                delay_id = _ticks.new(now_ns)[3]()
        else:
            check_delay_id(delay_id)
        if self._crc_by_librdkafka:
            if on_delivery is None and timestamp == 0 and headers is None:
                _base_produce(self, self._buffer_topic, value, delay_id)  # fewer arguments parse faster
            else:
                _base_produce(self, self._buffer_topic, value, delay_id, -1, on_delivery, None, timestamp, headers)
        else:
            _base_produce(self, self._buffer_topic, value, delay_id, self._partition_of(delay_id), on_delivery,
                          None, timestamp, headers)
        return delay_id

    def produce_put(self, topic: str, value: str | bytes | None, key: str | bytes | None, partition: int,
                    on_delivery: Callable | None, timestamp: int, headers: dict | list | None, *, due: int,
                    options: str = "", delay_id: str | None = None) -> str:
        """Put a delayed message due at ``due`` (epoch ms, checked already) with more frame ``options``.

        The one path for puts beyond a plain delay (a level, a series, a retry); the arguments
        as :meth:`produce` takes them, ``options`` as :func:`delayq.wire.schedule_options` writes them.
        """
        put = self._writer.put(topic, value, key, partition, timestamp, headers, due=due, options=options,
                               delay_id=delay_id)
        target = -1 if self._crc_by_librdkafka else self._partition_of(put.delay_id)
        _base_produce(self, self._buffer_topic, put.frame, put.delay_id, target, on_delivery, None, put.timestamp,
                      put.headers)
        return put.delay_id

    def reschedule(
        self,
        delay_id: str,
        topic: str,
        value: str | bytes | None = None,
        key: str | bytes | None = None,
        partition: int = -1,
        on_delivery: Callable | None = None,
        timestamp: int = 0,
        headers: dict | list | None = None,
        *,
        delay: float | timedelta | None = None,
        deliver_at: datetime | int | None = None,
        delay_level: int | None = None,
        repeat: Every | Cron | None = None,
        expire_after: float | timedelta | None = None,
    ) -> str:
        """Move a pending delayed message to a new due time, under the same id.

        The buffer keeps no copy the producer could cheaply read back, so pass the
        message again as you gave it to :meth:`produce` (or a changed one: the new
        put replaces the old). The nodes replace the pending entry of ``delay_id``.
        Like cancel, this races with delivery near the old due time: a message
        delivered (or cancelled) before this put is read is delivered once more at
        the new time, under the same id; check :func:`delayq.lookup` first if that
        matters.

        Args:
            delay_id: the id :meth:`produce` returned.
            topic, value, key, partition, on_delivery, timestamp, headers: as in :meth:`produce`.
            delay: new delay from now, seconds or a timedelta.
            deliver_at: new due time, a timezone-aware datetime or epoch milliseconds
                (at or after 2000-01-01, as in :meth:`produce`).
            delay_level, repeat, expire_after: as in :meth:`produce`; a series rescheduled with ``repeat``
                starts again from occurrence 1, one rescheduled without it stops repeating.

        Returns:
            ``delay_id``.

        Raises:
            TypeError, ValueError: a malformed ``delay_id``, or any bad input :meth:`produce` refuses.
        """
        check_reschedule(delay_id, delay, deliver_at, delay_level, repeat)
        # With a delay, produce() returns the id it was given.
        self.produce(topic, value, key, partition, on_delivery, timestamp, headers, delay=delay,
                     deliver_at=deliver_at, delay_id=delay_id, delay_level=delay_level, repeat=repeat,
                     expire_after=expire_after)
        return delay_id

    def cancel(self, delay_id: str, on_delivery: Callable | None = None) -> None:
        """Cancel a delayed message: a ``cancel`` tombstone for ``delay_id`` to the buffer topic.

        Asynchronous like :meth:`produce`; ``on_delivery`` reports the tombstone's
        write (``msg.key()`` is the id). A cancel that reaches the buffer after the
        message was delivered has no effect; :func:`delayq.lookup` tells whether it
        is still pending. Cancelling an unknown or finished id is harmless.

        Args:
            delay_id: the id :meth:`produce` returned.
            on_delivery: delivery report callback ``(err, msg)`` for the tombstone.

        Raises:
            TypeError: ``delay_id`` is not a str.
            ValueError: ``delay_id`` is not a delay id (a canonical UUID).
        """
        check_delay_id(delay_id)
        target = -1 if self._crc_by_librdkafka else self._partition_of(delay_id)
        _base_produce(self, self._buffer_topic, None, delay_id, target, on_delivery, None, 0,
                      control_headers(wire.OP_CANCEL, delay_id))

    def lookup(self, delay_id: str, timeout: float = 2.0) -> Lookup:
        """Ask a node whether ``delay_id`` is pending: :func:`delayq.lookup` with this producer's settings."""
        return lookup(delay_id, settings=self._settings, timeout=timeout)

    def produce_batch(self, topic: str, messages: list, *args: typing.Any, **kwargs: typing.Any) -> int:
        """confluent-kafka's ``produce_batch()``; it cannot delay (batches carry no headers).

        Raises:
            TypeError: a message dict has a ``delay`` or ``deliver_at`` key, which
                confluent-kafka would silently ignore. Nothing is sent.
        """
        if isinstance(messages, list):
            for message in messages:
                if isinstance(message, dict) and ("delay" in message or "deliver_at" in message):
                    raise TypeError("produce_batch() cannot delay messages (librdkafka batches carry no headers, "
                                    "which the envelope needs); call produce(..., delay=...) for each instead")
        return super().produce_batch(topic, messages, *args, **kwargs)

    def _partition_of(self, delay_id: str) -> int:
        partitions = self._buffer_partitions
        if partitions is None:
            partitions = self.buffer_partitions()
        return buffer_partition(delay_id, partitions)

    def buffer_partitions(self, timeout: float = 10.0) -> int:
        """The buffer topic's partition count, asked of Kafka once, then remembered.

        Raises:
            KafkaException: UNKNOWN_TOPIC_OR_PART, saying to run ``delayq init``, when the
                buffer topic does not exist; another error when Kafka does not answer.
        """
        with self._lock:
            if self._buffer_partitions is None:
                self._buffer_partitions = self._writer.partition_count(self.list_topics(timeout=timeout).topics)
        return self._buffer_partitions


# -- one-shot helpers (the command line uses them) ---------------------------


def send_and_wait(producer: Producer, send: Callable[[Callable], typing.Any],
                  timeout: float) -> confluent_kafka.Message:
    """Call ``send(on_delivery)``, flush, and return the delivery report of that one message.

    Raises:
        KafkaException: the write failed, or was not confirmed within ``timeout`` seconds.
    """
    reports: list[tuple[KafkaError | None, confluent_kafka.Message]] = []
    send(lambda err, msg: reports.append((err, msg)))
    producer.flush(timeout)
    if not reports:
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT,
                                        f"no delivery report within {timeout:g} s: is Kafka reachable?"))
    err, msg = reports[0]
    if err is not None:
        raise KafkaException(err)
    return msg


def cancel(delay_id: str, *, conf: dict[str, typing.Any] | None = None,
           timeout: float = 10.0) -> confluent_kafka.Message:
    """Cancel one delayed message and wait until the buffer topic has the tombstone.

    For many cancels, use :meth:`Producer.cancel` on a long-lived producer.

    Args:
        delay_id: the id ``Producer.produce()`` returned.
        conf: producer conf (with optional ``delayq.*`` keys); default: from
            :class:`delayq.Settings` (``DELAYQ_*``).
        timeout: seconds to wait for the write.

    Returns:
        The delivery report of the tombstone (buffer topic, partition, offset).

    Raises:
        TypeError, ValueError: ``delay_id`` is malformed; nothing is sent.
        KafkaException: the tombstone was not written.
    """
    check_delay_id(delay_id)
    producer = Producer(conf if conf is not None else Settings().kafka_conf())
    return send_and_wait(producer, lambda report: producer.cancel(delay_id, on_delivery=report), timeout)
