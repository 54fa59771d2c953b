"""The buffer wire contract: how a delayed message is written to the buffer topic, and read back.

The one home of the contract between the producer proxy, the delay-service nodes, the
reconciliation job, bench and tests (docs/DESIGN.md, "Wire format"): the frame, the
control records, the header names, the partition rule, the delay-id format, the
partitioner names and the dead-letter reason codes. Anything that writes or reads
buffer records imports them from here; nothing else defines them. The schedule rules a
frame carries (the earliest due time, a series and its cron expression) are
:mod:`delayq.schedule`'s: this module writes and reads them. A buffer record is one of::

    put      key = the delay id (lower-case UUID text; UUIDv7 from delayq's tools)
             partition = crc32(id) % partitions, for every record of the id
             value = one ASCII line, the frame, then the user's key and payload:
                 put <deliver-at ms, from 2000-01-01> <topic> <key length | -> [option ...]\n<key><payload>
             headers = the user's, as given (none named delayq-...)
    cancel   key = the delay id, value = null, headers = delayq-op: cancel [, delayq-id]
    done     value = null, delayq-op: done, delayq-id, delayq-version, delayq-cutoff (the
             master writes it with the delivery; without delayq-version or delayq-cutoff it
             is malformed)

The options: ``partition=N`` (the user named a partition), ``partitioner=NAME`` (the
producing client's, when not librdkafka's default; one of PARTITIONERS), ``value=null``
(the user's value was null; a null record value would be a tombstone to compaction and
vanish before it falls due) and ``restores=N`` (a master's copy of the put at offset N);
a repeating message's and a retry's options; from feature level 2, ``expires=T`` (epoch
ms: dead-letter the message, reason ``expired``, rather than deliver it after T) and
``level=N`` (the feature level the frame needs; see delayq/features.py). A frame of a
level above this code's is no malformed record but one this node cannot read yet
(:class:`NewerLevelRecord`). Anything else makes the record malformed, with a :class:`Reason` code.

Why the envelope rides in the value and not in headers: librdkafka's Python binding
charges a produce() with headers about as much again as one without, and each
header more (bench/produce_bench.py), on the producer's hot path and again when
every node consumes the record.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import marshal
import os
import re
import time
import uuid
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from delayq.features import LEVELS, SUPPORTED_LEVEL
from delayq.schedule import MAX_MULTIPLIER, MIN_DUE_MS, Series, check_cron, time_zone

OP = "delayq-op"
ID = "delayq-id"
DELIVER_AT = "delayq-deliver-at"
EPOCH = "delayq-epoch"
# The buffer offset of the put a delivery or a `done` is about: which version of an id
# (a reschedule is a newer put of the same id) was delivered, and which one a `done` closes.
VERSION = "delayq-version"
# On a `done`: the offset of its buffer partition up to which the master had read the buffer
# before it picked the message. Every record of that partition below it was seen, so a cancel
# or reschedule there should have won (docs/DESIGN.md, "Cancel and reschedule guarantee").
CUTOFF = "delayq-cutoff"
DEAD_LETTER_REASON = "delayq-dead-letter-reason"
DEAD_LETTER_SOURCE = "delayq-dead-letter-source"
# On a delivered occurrence of a repeating message: its number in the series, 1, 2, ...
OCCURRENCE = "delayq-occurrence"
# On a delivered retry (delayq.retry_later): which attempt this is, 1, 2, ...; a record without it is attempt 0.
ATTEMPT = "delayq-attempt"
RESERVED_PREFIX = "delayq-"

# A record's headers as confluent-kafka's Message.headers() gives them, in order: a value
# is None for a header sent without one (Kafka allows it, and users' headers pass through).
Headers = list[tuple[str, bytes | None]]
# Headers as confluent-kafka's produce() takes them, in its list form (a value may also be a str).
ProduceHeaders = list[tuple[str, str | bytes | None]]

OP_PUT = b"put"
OP_CANCEL = b"cancel"
OP_DONE = b"done"
OPS = (OP_PUT, OP_CANCEL, OP_DONE)
TOMBSTONE_OPS = (OP_CANCEL, OP_DONE)

# A frame line longer than this is not a frame: topic names stop at 249 characters.
MAX_FRAME_LINE = 512
PARTITION_OPTION = "partition"
PARTITIONER_OPTION = "partitioner"
NULL_VALUE_OPTION = "value=null"
# Only a master writes it: this put is a copy of the put at offset N of its partition,
# written again because a `done` of an older version now follows that put in the buffer
# (docs/DESIGN.md, "Cancel and reschedule guarantee").
RESTORES_OPTION = "restores"
_PARTITION_NAME = PARTITION_OPTION.encode()
_PARTITIONER_NAME = PARTITIONER_OPTION.encode()
_NULL_VALUE = NULL_VALUE_OPTION.encode()
_RESTORES_NAME = RESTORES_OPTION.encode()
# Repeating messages (docs/DESIGN.md, "Repeating messages"): the series' schedule, which
# occurrence this put is, and (written by a master only) the put of the occurrence it follows.
EVERY_OPTION = "every"            # interval in ms between occurrences 1 and 2
MULTIPLIER_OPTION = "multiplier"  # each interval this much longer than the last (decimal, >= 1)
CRON_OPTION = "cron"              # five cron fields joined by "_"
TZ_OPTION = "tz"                  # the cron expression's IANA time zone (default UTC)
TIMES_OPTION = "times"            # at most this many occurrences
UNTIL_OPTION = "until"            # no occurrence due after this (epoch ms)
OCCURRENCE_OPTION = "occurrence"  # this put's number in its series (default 1)
FOLLOWS_OPTION = "follows"        # a master's put of the next occurrence, after the put at this offset
FOLLOWS_CUTOFF_OPTION = "cutoff"  # with follows: the cutoff the last occurrence was picked under (as a done's)
ATTEMPT_OPTION = "attempt"        # a retry's attempt number (delayq.retry_later), delivered as delayq-attempt
# Feature level 2 (delayq/features.py): a frame that uses an option above level 1 says the level it
# needs, so a node of an older level holds it until it is upgraded instead of dead-lettering it.
LEVEL_OPTION = "level"            # the feature level the frame needs (2 or more; absent: 1)
EXPIRES_OPTION = "expires"        # epoch ms: dead-lettered (reason expired) if not delivered by then
# The options above level 1, each with the level that introduced it (delayq/features.py, the one table).
OPTION_LEVELS = {name: entry.level for entry in LEVELS[1:] for name in entry.frame_options if name != LEVEL_OPTION}
# The highest feature level of frames this code reads and writes.
WIRE_LEVEL = SUPPORTED_LEVEL
_LEVEL_NAME = LEVEL_OPTION.encode()
_EXPIRES_NAME = EXPIRES_OPTION.encode()
_LEVEL_PREFIX = _LEVEL_NAME + b"="
_SCHEDULE_OPTIONS = frozenset(name.encode() for name in (
    EVERY_OPTION, MULTIPLIER_OPTION, CRON_OPTION, TZ_OPTION, TIMES_OPTION, UNTIL_OPTION, OCCURRENCE_OPTION,
    FOLLOWS_OPTION, FOLLOWS_CUTOFF_OPTION, ATTEMPT_OPTION))
# Kafka's own rule for topic names (org.apache.kafka.common.internals.Topic).
_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]{1,249}")
FRAME_SYNTAX = "'put <deliver-at ms> <topic> <key length or -> [option ...]' and a newline"


# The partitioner names a frame's ``partitioner=`` option may carry (librdkafka's).
PARTITIONERS = frozenset({"random", "consistent", "consistent_random", "murmur2", "murmur2_random", "fnv1a",
                          "fnv1a_random"})


class Reason(enum.StrEnum):
    """Why a record went to the dead-letter topic: the stable code that starts its reason header.

    The header reads ``<code>: <text>``; metrics label dead letters by the code.
    """

    # Malformed buffer records (found by ingest, dead-lettered once by the master).
    WRONG_PARTITION = "wrong-partition"  # not on crc32(id) % partitions
    BAD_ID = "bad-id"                    # no key, or a key that is not a delay id (UUID text)
    BAD_FRAME = "bad-frame"              # a put's value is not a frame as the grammar says
    UNKNOWN_OPTION = "unknown-option"    # a frame option, or a partitioner name, this node does not know
    BAD_DUE_TIME = "bad-due-time"        # a due time before 2000-01-01 (seconds meant?)
    RESERVED_HEADER = "reserved-header"  # a put carrying a delayq- header
    BAD_CONTROL = "bad-control"          # a cancel or done whose delayq- headers are wrong
    # Messages the master could not deliver.
    MISSING_TOPIC = "missing-topic"      # the target topic does not exist
    BAD_PARTITION = "bad-partition"      # the target partition does not exist
    REJECTED = "rejected"                # Kafka refused the record (too large, ...)
    FORBIDDEN_TOPIC = "forbidden-topic"  # the target is not in target_topics, or is delayq's or Kafka's own
    EXPIRED = "expired"                  # picked after its expires= time (feature level 2)
    # Written by delayq.retry_later, not by a node: a record whose retries are used up.
    RETRIES_EXHAUSTED = "retries-exhausted"

    @classmethod
    def of(cls, header: bytes | str | None) -> Reason | None:
        """The code a dead-letter reason header starts with; None if it starts with none."""
        text = header.decode(errors="replace") if isinstance(header, bytes) else header or ""
        code = text.partition(":")[0]
        return cls(code) if code in cls._value2member_map_ else None


# The codes of messages the master could not deliver (valid puts); every other code but retries-exhausted
# is a malformed buffer record's.
UNDELIVERABLE = frozenset({Reason.MISSING_TOPIC, Reason.BAD_PARTITION, Reason.REJECTED, Reason.FORBIDDEN_TOPIC,
                           Reason.EXPIRED})


def reason_text(code: Reason, text: str) -> str:
    """A dead-letter reason header's value: the stable code, then the human text."""
    return f"{code.value}: {text}"


class NewerLevelRecord(Exception):
    """A buffer record of a feature level above this code's: not malformed, not readable here yet.

    A node holds it (and the rest of its partition) until it is upgraded; nothing dead-letters it.
    """

    def __init__(self, level: int, supported: int):
        self.level = level
        super().__init__(f"a frame of feature level {level}; this delayq reads up to level {supported}: "
                         f"upgrade it (delayq/features.py says which release speaks which level)")


class MalformedRecord(ValueError):
    """A buffer record that is not valid by the contract: ``code`` (a :class:`Reason`) and ``text`` say why.

    ``reason`` (``code: text``) goes into the dead-letter header.
    """

    def __init__(self, code: Reason, text: str):
        self.code = code
        self.text = text
        self.reason = reason_text(code, text)
        super().__init__(self.reason)


# -- dead letters as read back ------------------------------------------------

# The code of a dead letter whose reason header starts with no known code.
UNKNOWN_CODE = "unknown"


class DeadLetterFacts(NamedTuple):
    """What a record of the dead-letter topic says, as the reconciliation and the console read it back.

    ``code`` is the reason's code (:data:`UNKNOWN_CODE` when the header starts with none) and
    ``text`` the rest of the header; ``delay_id`` the key if it is a delay id; ``version`` an
    undeliverable message's ``delayq-version``, else the offset its source header names;
    ``due_ms`` and ``topic`` come from the put frame an undeliverable message's copy carries (None
    for a copy too large for Kafka, which has no value); ``user_headers`` are the message's own.
    """

    delay_id: str | None
    code: str
    text: str
    source: str | None
    version: int | None
    due_ms: int | None
    topic: str | None
    undeliverable: bool
    user_headers: Headers


def _offset_number(raw: bytes | str | None) -> int | None:
    """A buffer offset written as plain decimal digits (as a node writes it), else None."""
    if raw is None:
        return None
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
    return int(text) if text.isdigit() and text.isascii() and len(text) <= 18 else None


def read_dead_letter(key: bytes | None, value: bytes | None, headers: Headers | None) -> DeadLetterFacts:
    """A dead-letter record's facts (delay_service/dead_letters.py and the master's transactions write them)."""
    reason = source = version_text = None
    user_headers: Headers = []
    for name, data in headers or ():
        if name == DEAD_LETTER_REASON:
            reason = data
        elif name == DEAD_LETTER_SOURCE:
            source = (data or b"").decode(errors="replace")
        elif name == VERSION:
            version_text = data
        elif not name.startswith(RESERVED_PREFIX):
            user_headers.append((name, data))
    found = Reason.of(reason)
    text = (reason or b"").decode(errors="replace")
    code = UNKNOWN_CODE if found is None else found.value
    if found is not None:
        text = text[len(code) + 1:].lstrip()
    delay_id = key.decode() if key is not None and is_delay_id(key) else None
    version = _offset_number(version_text)
    if version is None and source:
        version = _offset_number(source.rpartition("/")[2])
    undeliverable = found in UNDELIVERABLE
    due = topic = None
    if undeliverable and value is not None and delay_id is not None:
        try:
            message = parse_buffer_record(key, value, user_headers).envelope
        except (MalformedRecord, NewerLevelRecord):
            message = None
        if message is not None:
            due, topic = message.deliver_at_ms, message.topic
    return DeadLetterFacts(delay_id, code, text, source, version, due, topic, undeliverable, user_headers)


# -- delay ids ---------------------------------------------------------------


def new_delay_id(now_ms: int | None = None) -> str:
    """A UUIDv7 (RFC 9562): 48-bit Unix milliseconds, then random bits; ids sort by creation time."""
    ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms & 0xFFFF_FFFF_FFFF) << 80 | 0x7 << 76 | (rand >> 68 & 0xFFF) << 64 | 0b10 << 62 | rand & ((1 << 62) - 1)
    return str(uuid.UUID(int=value))


# A delay id, as every delayq tool writes and accepts it: a UUID in canonical text form
# (lower-case hex, 8-4-4-4-12). A buffer record whose key is anything else is malformed.
_DELAY_ID = re.compile(rb"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
DELAY_ID_EXAMPLE = "0190a3e4-5b6c-7d8e-9f00-112233445566"


def is_delay_id(key: bytes) -> bool:
    """Whether ``key`` (a buffer record key) is a delay id in canonical UUID text form."""
    return _DELAY_ID.fullmatch(key) is not None


# Ids whose UUIDv7 time is 0 are no message's (new_delay_id() stamps the current time):
# each buffer partition has one, the key of the master's partition mark (mark_id()).
MARK_ID_PREFIX = b"00000000-0000-7000-8000-"


def is_mark_id(key: bytes) -> bool:
    """Whether ``key`` is a partition mark's id (:func:`mark_id`), which no message may use."""
    return key.startswith(MARK_ID_PREFIX)


@functools.lru_cache(maxsize=1024)
def mark_id(partition: int, partitions: int) -> str:
    """The id of buffer partition ``partition``'s mark: the first ``00000000-0000-7000-8000-<n>`` that lands there.

    A mark is a ``done`` of this id (it closes nothing) that the master commits to a
    partition a transaction has held open for too long. Kafka can leave a transaction of
    the master's producer open on a partition whose markers it lost (over a broker
    restart, when it takes a partition without a leader for a deleted one); no
    coordinator will ever end it. The master's next committed write there ends it
    (a partition ends a producer's open transaction with that producer's next marker), and
    with it the hold on every read_committed reader, ingest included.
    """
    if not 0 <= partition < partitions:
        raise ValueError(f"partition {partition} is not one of the buffer's {partitions} partitions")
    n = 0
    while True:
        candidate = MARK_ID_PREFIX + b"%012x" % n
        if zlib.crc32(candidate) % partitions == partition:
            return candidate.decode()
        n += 1


def buffer_partition(delay_id: str | bytes, partitions: int) -> int:
    """The buffer partition every record of ``delay_id`` goes to: CRC32 of the id's bytes, mod the count.

    librdkafka's ``consistent`` and ``consistent_random`` partitioners (kcat's and
    confluent-kafka's default) pick the same for a keyed record; Java and Go clients
    hash differently and must set the partition explicitly. A record anywhere else is
    malformed (:attr:`Reason.WRONG_PARTITION`).
    """
    key = delay_id.encode() if isinstance(delay_id, str) else delay_id
    return zlib.crc32(key) % partitions


def shard_of(partition: int, shards: int) -> int:
    """The shard buffer partition ``partition`` belongs to: ``partition % shards``.

    Every record of an id is on one partition, so in one shard. The buffer's partition
    count is a multiple of ``shards``, so each shard has as many partitions as the others
    (shard k: partitions k, k + S, k + 2S, ...). Recorded at ``delayq init`` and never changed.
    """
    return partition % shards


def shard_partitions(shard: int, shards: int, partitions: int) -> list[int]:
    """The buffer partitions of ``shard`` (of ``shards``) in a buffer of ``partitions`` partitions."""
    return list(range(shard, partitions, shards))


def check_delay_id(delay_id: object, argument: str = "delay_id") -> str:
    """Return ``delay_id`` if it is a delay id as delayq makes them, else raise.

    Raises:
        TypeError: it is not a str.
        ValueError: it is not a UUID in canonical text form.
    """
    if not isinstance(delay_id, str):
        raise TypeError(f"{argument} must be a str (the id produce() returned), not {type(delay_id).__name__}")
    if not delay_id.isascii() or not is_delay_id(delay_id.encode()):
        raise ValueError(f"{argument} {delay_id!r} is not a delay id: expected a UUID like "
                         f"'{DELAY_ID_EXAMPLE}', as returned by produce()")
    if is_mark_id(delay_id.encode()):
        raise ValueError(f"{argument} {delay_id!r} is reserved (ids starting {MARK_ID_PREFIX.decode()} are the "
                         f"buffer partitions' marks): use the id produce() returned")
    return delay_id


# -- repeating messages ------------------------------------------------------


def series_options(series: Series) -> str:
    """A repeating message's schedule as frame options (each after a space)."""
    text = ""
    if series.every_ms is not None:
        text += f" {EVERY_OPTION}={series.every_ms}"
        if series.multiplier != 1.0:
            text += f" {MULTIPLIER_OPTION}={format_multiplier(series.multiplier)}"
    if series.cron is not None:
        text += f" {CRON_OPTION}={'_'.join(series.cron.split())}"
        if series.tz != "UTC":
            text += f" {TZ_OPTION}={series.tz}"
    if series.times is not None:
        text += f" {TIMES_OPTION}={series.times}"
    if series.until_ms is not None:
        text += f" {UNTIL_OPTION}={series.until_ms}"
    return text


def format_multiplier(multiplier: float) -> str:
    """A multiplier as the frame writes it: plain decimal digits, at most 6 after the point."""
    return f"{multiplier:.6f}".rstrip("0").rstrip(".")


# -- the envelope ------------------------------------------------------------


@dataclass(slots=True)
class Envelope:
    """One delayed message, as the buffer holds it."""

    delay_id: str
    topic: str
    deliver_at_ms: int
    value: bytes | None
    key: bytes | None = None
    partition: int | None = None
    headers: Headers = field(default_factory=list)
    created_at_ms: int = 0
    partitioner: str | None = None
    # A repeating message's schedule, and which occurrence this put is (1 for the first).
    series: Series | None = None
    occurrence: int | None = None
    # A retry's attempt number (delayq.retry_later), delivered as header delayq-attempt.
    attempt: int | None = None
    # Epoch ms after which the master dead-letters it (reason expired) rather than deliver it (level 2).
    expires_at_ms: int | None = None

    def buffer_headers(self) -> ProduceHeaders:
        """The headers of this message's ``put`` record on the buffer topic: the user's."""
        return list(self.headers)

    def buffer_value(self, restores: int | None = None, follows: int | None = None,
                     cutoff: int | None = None) -> bytes:
        """The value of this message's ``put`` record: frame, key, payload.

        ``restores``: a master's copy of the put at that offset; ``follows``: a master's put of
        this occurrence of a series, after the put of the last one at that offset, which it
        picked under ``cutoff``.
        """
        return put_value(self.deliver_at_ms, self.topic, self.key, self.value, self.partition, self.partitioner,
                         restores, schedule_options(self.series, self.occurrence, self.attempt, follows, cutoff)
                         + expiry_options(self.expires_at_ms))

    def delivery_headers(self, epoch: int, version: int) -> ProduceHeaders:
        """Headers of the delivered record: the user's, then which message, when, by whom (DESIGN.md).

        ``version`` is the buffer offset of the put delivered: a reschedule is a newer version.
        """
        return delivery_headers(self.headers, self.delay_id.encode(), str(self.deliver_at_ms).encode(),
                                str(epoch).encode(), str(version).encode()) + self.extra_delivery_headers()

    def extra_delivery_headers(self) -> ProduceHeaders:
        """``delayq-occurrence`` of a series' occurrence and ``delayq-attempt`` of a retry, when they apply."""
        extra: ProduceHeaders = []
        if self.occurrence is not None:
            extra.append((OCCURRENCE, str(self.occurrence).encode()))
        if self.attempt is not None:
            extra.append((ATTEMPT, str(self.attempt).encode()))
        return extra

    def next_occurrence(self) -> Envelope | None:
        """The put of this series' next occurrence (same id, key, payload, headers); None when it is over."""
        if self.series is None:
            return None
        occurrence = self.occurrence or 1
        due = self.series.next_due(self.deliver_at_ms, occurrence)
        if due is None:
            return None
        return dataclasses.replace(self, deliver_at_ms=due, occurrence=occurrence + 1)


def delivery_headers(user_headers: Headers, delay_id: bytes, deliver_at: bytes, epoch: bytes,
                     version: bytes) -> ProduceHeaders:
    """:meth:`Envelope.delivery_headers` from values already in ASCII (the master's loop encodes each once)."""
    return [*user_headers, (ID, delay_id), (DELIVER_AT, deliver_at), (EPOCH, epoch), (VERSION, version)]


# -- reading buffer records --------------------------------------------------


@dataclass(slots=True)
class BufferRecord:
    """A parsed buffer record: ``op`` is one of OPS; ``envelope`` is set for a put.

    ``closes_version`` is set for a ``done``: the put it closes (its buffer offset), with
    ``cutoff``, the buffer offset up to which the master had read the put's partition when it
    picked it; a ``cancel`` closes whatever is pending. ``restores`` is set for a put a master
    copied from the put at that offset, ``follows`` for a master's put of a series' next
    occurrence, after the occurrence put at that offset, with ``cutoff``: the master's cutoff
    when it picked that occurrence (what the ``done`` of it would record).
    """

    op: bytes
    delay_id: str
    envelope: Envelope | None = None
    closes_version: int | None = None
    restores: int | None = None
    follows: int | None = None
    cutoff: int | None = None


def check_topic(topic: object) -> str:
    """``topic`` as a plain str if Kafka takes it as a topic name (which keeps the frame line parsable).

    Raises:
        TypeError: not a str.
        ValueError: not a valid Kafka topic name.
    """
    if not isinstance(topic, str):
        raise TypeError(f"topic must be a str; got {type(topic).__name__}")
    if not _TOPIC_NAME.fullmatch(topic) or topic in (".", ".."):
        raise ValueError(f"topic {topic!r:.300} is not a valid Kafka topic name: 1 to 249 characters from "
                         "a-z, A-Z, 0-9, '.', '_' and '-', and not '.' or '..'")
    # The plain str value of a str subclass (an enum member formats as its name, not its value).
    return str.__str__(topic)


def frame_head(deliver_at_ms: int, topic: str, key_length: int | None, options: str = "") -> bytes:
    """The frame line of a put, newline included; a put's value is this, then the key, then the payload.

    ``options`` is :func:`frame_options`' text. The topic is checked (:func:`check_topic`).

    Raises:
        TypeError, ValueError: ``topic`` is not a Kafka topic name.
    """
    length = "-" if key_length is None else key_length
    return f"put {deliver_at_ms} {check_topic(topic)} {length}{options}\n".encode()


def frame_options(partition: int | None, partitioner: str | None, null_value: bool,
                  restores: int | None = None) -> str:
    """The options part of a frame line (empty, or each option after a space)."""
    options = ""
    if partition is not None:
        options += f" {PARTITION_OPTION}={partition}"
    if partitioner is not None:
        options += f" {PARTITIONER_OPTION}={partitioner}"
    if null_value:
        options += f" {NULL_VALUE_OPTION}"
    if restores is not None:
        options += f" {RESTORES_OPTION}={restores}"
    return options


def schedule_options(series: Series | None, occurrence: int | None, attempt: int | None,
                     follows: int | None = None, cutoff: int | None = None) -> str:
    """The frame options of a repeating message and of a retry (empty, or each option after a space)."""
    options = series_options(series) if series is not None else ""
    if occurrence is not None and occurrence != 1:
        options += f" {OCCURRENCE_OPTION}={occurrence}"
    if follows is not None:
        options += f" {FOLLOWS_OPTION}={follows}"
        if cutoff is not None:
            options += f" {FOLLOWS_CUTOFF_OPTION}={cutoff}"
    if attempt is not None:
        options += f" {ATTEMPT_OPTION}={attempt}"
    return options


def expiry_options(expires_at_ms: int | None) -> str:
    """The frame options of a message that expires (with the level they need), or empty."""
    if expires_at_ms is None:
        return ""
    return f" {LEVEL_OPTION}={OPTION_LEVELS[EXPIRES_OPTION]} {EXPIRES_OPTION}={expires_at_ms}"


def put_value(deliver_at_ms: int, topic: str, key: bytes | None, value: bytes | None,
              partition: int | None = None, partitioner: str | None = None, restores: int | None = None,
              more_options: str = "") -> bytes:
    """The value of a ``put`` record: the frame line, the user's key, then the payload.

    ``more_options``: :func:`schedule_options`' text.

    Raises:
        TypeError, ValueError: ``topic`` is not a Kafka topic name.
    """
    head = frame_head(deliver_at_ms, topic, None if key is None else len(key),
                      frame_options(partition, partitioner, value is None, restores) + more_options)
    return b"".join((head, key or b"", value or b""))


def control_headers(op: bytes, delay_id: str) -> ProduceHeaders:
    """Headers of a ``cancel`` tombstone (a ``done`` adds :func:`done_headers`' version and cutoff)."""
    return [(OP, op), (ID, delay_id.encode())]


def done_headers(delay_id: str, version: int, cutoff: int) -> ProduceHeaders:
    """Headers of a ``done`` tombstone: it closes the put at offset ``version``; the master had read to ``cutoff``."""
    return encoded_done_headers(delay_id.encode(), str(version).encode(), str(cutoff).encode())


def encoded_done_headers(delay_id: bytes, version: bytes, cutoff: bytes) -> ProduceHeaders:
    """:func:`done_headers` from values already in ASCII (the master's loop encodes each once)."""
    return [(OP, OP_DONE), (ID, delay_id), (VERSION, version), (CUTOFF, cutoff)]


def parse_buffer_record(key: bytes | None, value: bytes | None, headers: Headers | None,
                        timestamp_ms: int = 0, *, partition: int | None = None,
                        partitions: int | None = None) -> BufferRecord:
    """Read one buffer record, exactly as every node and the reconciliation read it.

    Args:
        key, value, headers: the record's.
        timestamp_ms: the record's timestamp, the put's creation time.
        partition, partitions: where the record was read and the buffer's partition count;
            given both, a record off its id's partition (:func:`buffer_partition`) is malformed.

    A record with a value is a put; a null value is a tombstone, told by ``delayq-op``.

    Raises:
        MalformedRecord: with the :class:`Reason` code: a key that is not a delay id, the
            wrong partition, a bad frame, an unknown option or partitioner, a due time
            before 2000, a put with a ``delayq-`` header, a tombstone without a known op
            or with wrong ``delayq-`` headers.
    """
    if not key:
        raise MalformedRecord(Reason.BAD_ID, "record has no key (the delay id)")
    if not _DELAY_ID.fullmatch(key):
        raise MalformedRecord(Reason.BAD_ID, f"record key {key[:40]!r} is not a delay id: expected a UUID in "
                              f"lower-case text form like {DELAY_ID_EXAMPLE}")
    if partitions is not None and partition is not None and zlib.crc32(key) % partitions != partition:
        raise MalformedRecord(Reason.WRONG_PARTITION,
                              f"record of {key.decode()} is on partition {partition}; every record of an id "
                              f"must be on crc32(id) % {partitions} = {zlib.crc32(key) % partitions}")
    delay_id = key.decode()
    if value is None:
        op, closes_version, cutoff = _tombstone(key, headers)
        if op != OP_DONE and key.startswith(MARK_ID_PREFIX):
            raise MalformedRecord(Reason.BAD_ID, f"a cancel of {delay_id}, a partition mark's id "
                                  f"({MARK_ID_PREFIX.decode()}...): no message has it")
        return BufferRecord(op, delay_id, None, closes_version, cutoff=cutoff)
    if key.startswith(MARK_ID_PREFIX):
        raise MalformedRecord(Reason.BAD_ID, f"a put of {delay_id}, a partition mark's id "
                              f"({MARK_ID_PREFIX.decode()}...): a message's id comes from produce()")
    if headers:
        for header_name, _ in headers:
            if header_name.startswith(RESERVED_PREFIX):
                raise MalformedRecord(Reason.RESERVED_HEADER,
                                      f"a put (a record with a value) carries header {header_name[:60]}: names "
                                      f"starting {RESERVED_PREFIX} are delayq's; a cancel or done has a null value")
        user_headers = headers
    else:
        user_headers = []
    # The hot path of every node's ingest: plain locals, one split.
    end = value.find(b"\n", 0, MAX_FRAME_LINE)
    line = value[:end] if end > 0 else b""
    fields = line.split(b" ") if end > 0 else ()
    if _LEVEL_PREFIX in line:
        # First: a newer level may give any part of the frame a meaning this code does not know.
        _check_level(fields)
    if len(fields) < 4 or fields[0] != OP_PUT:
        raise MalformedRecord(Reason.BAD_FRAME, f"a put's value must start with {FRAME_SYNTAX}; "
                              f"it starts {value[:40]!r}")
    deliver_at = _digits(fields[1], "deliver-at time")
    if deliver_at < MIN_DUE_MS:
        raise MalformedRecord(Reason.BAD_DUE_TIME,
                              f"the frame's deliver-at time {deliver_at} is before 2000-01-01 ({MIN_DUE_MS}); "
                              "it is in milliseconds since the epoch: were seconds meant?")
    topic = _known_topics.get(fields[2])
    if topic is None:
        topic = _frame_topic(fields[2])
    start = end + 1
    if fields[3] == b"-":
        user_key = None
    else:
        length = _digits(fields[3], "key length")
        user_key = value[start:start + length]
        start += length
        if start > len(value):
            raise MalformedRecord(Reason.BAD_FRAME, f"the frame's key length {length} runs past the end of the value")
    partition_option = partitioner = None
    restores: int | None = None
    schedule: dict[bytes, bytes] | None = None
    null_value = False
    level = expires = None
    for option in fields[4:]:
        if option in _PARTITIONER_OPTIONS and partitioner is None:  # the usual option, without splitting it
            partitioner = _PARTITIONER_OPTIONS[option]
            continue
        name, sep, text = option.partition(b"=")
        if option == _NULL_VALUE:
            repeated, null_value = null_value, True
        elif name == _PARTITION_NAME and sep:
            repeated, partition_option = partition_option is not None, _digits(text, "partition")
        elif name == _PARTITIONER_NAME and text:
            repeated, partitioner = partitioner is not None, text.decode(errors="replace")
            if partitioner not in PARTITIONERS:
                raise MalformedRecord(Reason.UNKNOWN_OPTION,
                                      f"unknown partitioner {partitioner[:40]!r}; expected one of "
                                      f"{', '.join(sorted(PARTITIONERS))}")
        elif name == _RESTORES_NAME and sep:
            repeated, restores = restores is not None, _digits(text, "restores offset")
        elif name in _SCHEDULE_OPTIONS and text:
            if schedule is None:
                schedule = {}
            repeated = name in schedule
            schedule[name] = text
        elif name == _EXPIRES_NAME and sep:
            repeated, expires = expires is not None, _digits(text, "expires time")
        elif name == _LEVEL_NAME and sep:
            repeated, level = level is not None, _digits(text, "level")
        else:
            raise MalformedRecord(Reason.UNKNOWN_OPTION,
                                  f"unknown frame option {option[:40]!r}; expected {PARTITION_OPTION}=N, "
                                  f"{PARTITIONER_OPTION}=NAME, {NULL_VALUE_OPTION}, {RESTORES_OPTION}=N or a "
                                  f"schedule option ({', '.join(sorted(n.decode() for n in _SCHEDULE_OPTIONS))})")
        if repeated:
            # Which one would win is a guess; the producer writes each at most once.
            raise MalformedRecord(Reason.BAD_FRAME, f"frame option {name.decode()} appears twice")
    if null_value and start != len(value):
        raise MalformedRecord(Reason.BAD_FRAME,
                              f"the frame says {NULL_VALUE_OPTION} but {len(value) - start} bytes follow the key")
    envelope = Envelope(delay_id, topic, deliver_at, None if null_value else value[start:], user_key,
                        partition_option, user_headers, timestamp_ms, partitioner)
    record = BufferRecord(OP_PUT, delay_id, envelope, None, restores)
    if schedule is not None:
        _read_schedule(schedule, record, envelope)
    if level is not None or expires is not None:
        _read_expiry(envelope, level, expires)
    return record


def _check_level(fields: Sequence[bytes]) -> None:
    """Raise :class:`NewerLevelRecord` if the frame says a level above this code's (its own errors later)."""
    for option in fields[4:]:
        if option.startswith(_LEVEL_PREFIX) and option[len(_LEVEL_PREFIX):].isdigit():
            level = int(option[len(_LEVEL_PREFIX):])
            if level > WIRE_LEVEL:
                raise NewerLevelRecord(level, WIRE_LEVEL)


def _read_expiry(envelope: Envelope, level: int | None, expires: int | None) -> None:
    """Check the level a frame says against the options it uses, and set the envelope's expiry."""
    if level is not None and level < 2:
        raise MalformedRecord(Reason.BAD_FRAME, f"the frame says {LEVEL_OPTION}={level}; a frame says its level "
                              f"only from 2 (one without {LEVEL_OPTION}= is of level 1)")
    if expires is None:
        return
    needed = OPTION_LEVELS[EXPIRES_OPTION]
    if level is None or level < needed:
        raise MalformedRecord(Reason.BAD_FRAME, f"frame option {EXPIRES_OPTION} is of feature level {needed}: the "
                              f"frame must say {LEVEL_OPTION}={needed} or higher")
    if expires < envelope.deliver_at_ms:
        raise MalformedRecord(Reason.BAD_FRAME, f"the frame's {EXPIRES_OPTION}={expires} is before its deliver-at "
                              f"time {envelope.deliver_at_ms}")
    if envelope.series is not None:
        raise MalformedRecord(Reason.BAD_FRAME, f"frame option {EXPIRES_OPTION} is for a message delivered once; a "
                              "repeating message cannot have it")
    envelope.expires_at_ms = expires


def _read_schedule(options: dict[bytes, bytes], record: BufferRecord, envelope: Envelope) -> None:
    """Set ``envelope``'s series, occurrence and attempt, and ``record``'s follows and cutoff, from the options."""
    def number(name: str, least: int = 0) -> int | None:
        raw = options.get(name.encode())
        if raw is None:
            return None
        value = _digits(raw, f"{name} option")
        if value < least:
            raise MalformedRecord(Reason.BAD_FRAME, f"the frame's {name}={value} must be at least {least}")
        return value

    every, cron = number(EVERY_OPTION, 1), options.get(CRON_OPTION.encode())
    attempt = number(ATTEMPT_OPTION, 1)
    envelope.attempt = attempt
    if every is None and cron is None:
        alone = [n.decode() for n in options if n != ATTEMPT_OPTION.encode()]
        if alone:
            raise MalformedRecord(Reason.BAD_FRAME, f"frame option {alone[0]} belongs to a repeating message, "
                                  f"which needs {EVERY_OPTION}=MS or {CRON_OPTION}=EXPRESSION")
        return
    if every is not None and cron is not None:
        raise MalformedRecord(Reason.BAD_FRAME, f"a frame has {EVERY_OPTION} or {CRON_OPTION}, not both")
    raw_multiplier, raw_tz = options.get(MULTIPLIER_OPTION.encode()), options.get(TZ_OPTION.encode())
    multiplier = 1.0
    if raw_multiplier is not None:
        if every is None:
            raise MalformedRecord(Reason.BAD_FRAME, f"frame option {MULTIPLIER_OPTION} needs {EVERY_OPTION}")
        if not _DECIMAL.fullmatch(raw_multiplier) or not 1.0 <= float(raw_multiplier) <= MAX_MULTIPLIER:
            raise MalformedRecord(Reason.BAD_FRAME, f"the frame's {MULTIPLIER_OPTION} is {raw_multiplier[:40]!r}; "
                                  f"expected a decimal number from 1 to {MAX_MULTIPLIER:g}")
        multiplier = float(raw_multiplier)
    tz = "UTC"
    expression = None
    if cron is not None:
        try:
            expression = check_cron(cron.decode("ascii").replace("_", " "))
            if raw_tz is not None:
                tz = raw_tz.decode("ascii")
                time_zone(tz)
        except (UnicodeDecodeError, ValueError) as err:
            raise MalformedRecord(Reason.BAD_FRAME, f"the frame's schedule: {err}") from None
    elif raw_tz is not None:
        raise MalformedRecord(Reason.BAD_FRAME, f"frame option {TZ_OPTION} needs {CRON_OPTION}")
    envelope.series = Series(every, multiplier, expression, tz, number(TIMES_OPTION, 1), number(UNTIL_OPTION))
    envelope.occurrence = number(OCCURRENCE_OPTION, 1) or 1
    record.follows, record.cutoff = number(FOLLOWS_OPTION), number(FOLLOWS_CUTOFF_OPTION)
    if record.cutoff is not None and record.follows is None:
        raise MalformedRecord(Reason.BAD_FRAME, f"frame option {FOLLOWS_CUTOFF_OPTION} needs {FOLLOWS_OPTION}")


_DECIMAL = re.compile(rb"[0-9]{1,6}(\.[0-9]{1,6})?")


# Every frame option naming a known partitioner, and the name.
_PARTITIONER_OPTIONS = {f"{PARTITIONER_OPTION}={name}".encode(): name for name in PARTITIONERS}
# Topic names already checked, as they appear in frames: a buffer holds few distinct targets.
_known_topics: dict[bytes, str] = {}
_KNOWN_TOPICS_MAX = 10_000


def _frame_topic(raw: bytes) -> str:
    """The target topic of a frame, checked (and remembered, so the next frame naming it skips the checks)."""
    try:
        topic = raw.decode()
    except UnicodeDecodeError:
        raise MalformedRecord(Reason.BAD_FRAME, f"the topic in the frame is not UTF-8: {raw[:40]!r}") from None
    # A name Kafka refuses would fail at delivery, where it cannot even be dead-lettered as written.
    if not _TOPIC_NAME.fullmatch(topic) or topic in (".", ".."):
        raise MalformedRecord(Reason.BAD_FRAME, f"the frame's topic {topic[:40]!r} is not a Kafka topic name")
    if len(_known_topics) >= _KNOWN_TOPICS_MAX:
        _known_topics.clear()
    _known_topics[raw] = topic
    return topic


def _tombstone(key: bytes, headers: Headers | None) -> tuple[bytes, int | None, int | None]:
    """The op of a tombstone and, for a ``done``, the version it closes and its cutoff (None, None for a cancel)."""
    if headers is not None and len(headers) == 4:
        # A master's done, headers in the order done_headers() writes them: checked without
        # the general walk below (every node reads one back per delivered message).
        try:
            (op_name, op), (id_name, record_id), (version_name, version), (cutoff_name, cutoff) = headers
        except (TypeError, ValueError):  # not four pairs: the general walk says what is wrong
            op_name = None
        if (op_name == OP and op == OP_DONE and id_name == ID and record_id == key and version_name == VERSION
                and cutoff_name == CUTOFF and version and version.isdigit() and len(version) <= 18
                and cutoff and cutoff.isdigit() and len(cutoff) <= 18):
            return OP_DONE, int(version), int(cutoff)
    found: dict[str, bytes | None] = {}
    for name, header_value in headers or ():
        if name in (OP, ID, VERSION, CUTOFF):
            if name in found:
                raise MalformedRecord(Reason.BAD_CONTROL, f"header {name} appears twice")
            found[name] = header_value
    op, record_id = found.get(OP), found.get(ID)
    if op is None:
        raise MalformedRecord(Reason.BAD_CONTROL,
                              f"a record with a null value needs header {OP} (cancel or done); it has none")
    if op not in TOMBSTONE_OPS:
        raise MalformedRecord(Reason.BAD_CONTROL, f"header {OP} of a record with a null value is {op[:40]!r}; "
                              "expected cancel or done (a put has a value)")
    if record_id is not None and record_id != key:
        raise MalformedRecord(Reason.BAD_CONTROL,
                              f"header {ID} {record_id[:40]!r} differs from the record key {key[:40]!r}")
    if op != OP_DONE:
        if VERSION in found or CUTOFF in found:
            raise MalformedRecord(Reason.BAD_CONTROL, f"a {op.decode()} carries header "
                                  f"{VERSION if VERSION in found else CUTOFF}, which only a done has")
        return op, None, None
    missing = [name for name in (VERSION, CUTOFF) if name not in found]
    if missing:
        raise MalformedRecord(Reason.BAD_CONTROL, f"a done needs headers {VERSION} (the put it closes) and "
                              f"{CUTOFF} (how far the master had read); it has no {' and no '.join(missing)}")
    return op, _header_digits(found[VERSION], VERSION), _header_digits(found[CUTOFF], CUTOFF)


def _header_digits(raw: bytes | None, name: str) -> int:
    if raw is None or not raw.isdigit() or len(raw) > 18:
        raise MalformedRecord(Reason.BAD_CONTROL,
                              f"header {name} is {(raw or b'')[:40]!r}; expected a buffer offset in ASCII digits")
    return int(raw)


def _digits(raw: bytes, what: str) -> int:
    if not raw.isdigit() or len(raw) > 18:
        raise MalformedRecord(Reason.BAD_FRAME, f"the frame's {what} is {raw[:40]!r}; expected ASCII digits")
    return int(raw)


# -- one write appended twice ------------------------------------------------

# A client library can append one write twice: librdkafka's idempotent producer, when a
# partition's leader changes under a batch in flight, may bump its epoch and send again a
# batch the broker had appended already (confluentinc/librdkafka#4953, and its INTRODUCTION.md:
# an epoch bump "may cause duplicate messages"). The copy has its original's key, value,
# headers and timestamp (the producer's creation time). A node applies a producer write (a put
# that is no master's, or a cancel) once: a write with the identity of one of its id read
# before on the partition, and a timestamp at most COPY_WINDOW_MS older than the newest record
# time read there, is no write. librdkafka fails a message 5 minutes after produce()
# (message.timeout.ms), the Java client after 2 (delivery.timeout.ms): 10 minutes covers either,
# with 5 minutes to spare for a producer's clock behind the others'. One value for the cluster:
# nodes that judged copies by different windows would disagree on what is pending.
COPY_WINDOW_MS = 600_000


def write_digest(key: bytes, value: bytes | None, headers: Headers | None) -> bytes:
    """8 bytes that tell two writes of one id and one timestamp apart: a digest of key, value and headers.

    With the timestamp, the identity by which a copy of a write is known (COPY_WINDOW_MS).
    """
    # A delay id's 36 bytes, then the headers' marshal form (self-delimiting, and never starting like a
    # frame), then the value: no two writes share these bytes. One concatenation: ingest's hot path.
    return hashlib.blake2b(key + (marshal.dumps(headers) if headers else b"") + (value or b""),
                           digest_size=8).digest()
