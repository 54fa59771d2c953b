"""The envelope: how a delayed message is written to the buffer topic, and read back.

This module is the contract between the producer proxy, the delay-service nodes and
the reconciliation job (docs/DESIGN.md, "Envelope"). A buffer record is::

    key     = the delay id (UUIDv7 text, ASCII)
    value   = the user's payload (put) or null (cancel, done)
    headers = delayq-op, delayq-id, and for a put the envelope fields, then the user's headers

A null user value is kept as an empty value plus the ``delayq-value-null`` header,
because a null value is a tombstone to compaction and would be dropped from the
buffer before it falls due.
"""

from __future__ import annotations

import marshal
import os
import time
import uuid
from dataclasses import dataclass, field

OP = "delayq-op"
ID = "delayq-id"
TOPIC = "delayq-topic"
PARTITION = "delayq-partition"
KEY = "delayq-key"
DELIVER_AT = "delayq-deliver-at"
CREATED_AT = "delayq-created-at"
PARTITIONER = "delayq-partitioner"
VALUE_NULL = "delayq-value-null"
EPOCH = "delayq-epoch"
DEAD_LETTER_REASON = "delayq-dead-letter-reason"
DEAD_LETTER_SOURCE = "delayq-dead-letter-source"
RESERVED_PREFIX = "delayq-"

OP_PUT = b"put"
OP_CANCEL = b"cancel"
OP_DONE = b"done"
OPS = (OP_PUT, OP_CANCEL, OP_DONE)

_ENVELOPE_HEADERS = frozenset({OP, ID, TOPIC, PARTITION, KEY, DELIVER_AT, CREATED_AT, PARTITIONER, VALUE_NULL})


class MalformedRecord(ValueError):
    """A buffer record that is not a valid envelope. ``reason`` goes into the dead-letter header."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


# -- delay ids ---------------------------------------------------------------


def new_delay_id(now_ms: int | None = None) -> str:
    """A UUIDv7 (RFC 9562): 48-bit Unix milliseconds, then random bits; ids sort by creation time."""
    ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms & 0xFFFF_FFFF_FFFF) << 80 | 0x7 << 76 | (rand >> 68 & 0xFFF) << 64 | 0b10 << 62 | rand & ((1 << 62) - 1)
    return str(uuid.UUID(int=value))


def check_delay_id(delay_id: object, argument: str = "delay_id") -> str:
    """Return ``delay_id`` if it is a delay id as delayq makes them, else raise.

    Raises:
        TypeError: it is not a str.
        ValueError: it is not a UUID in canonical text form.
    """
    if not isinstance(delay_id, str):
        raise TypeError(f"{argument} must be a str (the id produce() returned), not {type(delay_id).__name__}")
    try:
        parsed = uuid.UUID(delay_id)
    except ValueError:
        parsed = None
    if parsed is None or str(parsed) != delay_id:
        raise ValueError(f"{argument} {delay_id!r} is not a delay id: expected a UUID like "
                         "'0190a3e4-5b6c-7d8e-9f00-112233445566', as returned by produce()")
    return delay_id


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
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    created_at_ms: int = 0
    partitioner: str | None = None

    def buffer_headers(self) -> list[tuple[str, bytes]]:
        """The headers of this message's ``put`` record on the buffer topic."""
        # No delayq-id (the record key is the id) and no delayq-created-at (the record's
        # timestamp is): each header costs the producer's hot path about as much as the
        # rest of a plain produce() call (bench/produce_bench.py).
        out = [
            (OP, OP_PUT),
            (TOPIC, self.topic.encode()),
            (DELIVER_AT, str(self.deliver_at_ms).encode()),
        ]
        if self.partition is not None and self.partition >= 0:
            out.append((PARTITION, str(self.partition).encode()))
        if self.key is not None:
            out.append((KEY, self.key))
        if self.partitioner:
            out.append((PARTITIONER, self.partitioner.encode()))
        if self.value is None:
            out.append((VALUE_NULL, b"1"))
        out.extend(self.headers)
        return out

    def buffer_value(self) -> bytes:
        return b"" if self.value is None else self.value

    def delivery_headers(self, epoch: int) -> list[tuple[str, bytes]]:
        """Headers of the delivered record: the user's, then who and when (DESIGN.md)."""
        return [
            *self.headers,
            (ID, self.delay_id.encode()),
            (DELIVER_AT, str(self.deliver_at_ms).encode()),
            (EPOCH, str(epoch).encode()),
        ]

    # The node's store form (not the wire format): marshal is C-fast for tuples of
    # bytes/str/int, and the store is a rebuildable view, so a format change only costs
    # a rebuild (the leading version says which).
    def to_bytes(self) -> bytes:
        return marshal.dumps((_STORE_FORM, self.delay_id, self.topic, self.deliver_at_ms, self.value, self.key,
                              self.partition, self.headers, self.created_at_ms, self.partitioner))

    @classmethod
    def from_bytes(cls, data: bytes) -> Envelope:
        fields = marshal.loads(data)
        if fields[0] != _STORE_FORM:
            raise ValueError(f"stored envelope form {fields[0]} is unknown to this delayq: rebuild the store")
        return cls(*fields[1:])


_STORE_FORM = 2


# -- reading buffer records --------------------------------------------------


@dataclass(slots=True)
class BufferRecord:
    """A parsed buffer record: ``op`` is one of OPS; ``envelope`` is set for a put."""

    op: bytes
    delay_id: str
    envelope: Envelope | None = None


def control_headers(op: bytes, delay_id: str) -> list[tuple[str, bytes]]:
    """Headers of a ``cancel`` or ``done`` tombstone."""
    return [(OP, op), (ID, delay_id.encode())]


def parse_buffer_record(key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]] | None,
                        timestamp_ms: int = 0) -> BufferRecord:
    """Read one buffer record; ``timestamp_ms`` (the record's) is the put's creation time.

    Raises:
        MalformedRecord: missing or contradictory headers, bad numbers, unknown op.
    """
    if not key:
        raise MalformedRecord("record has no key (the delay id)")
    # The hot path of every node's ingest: plain locals, positional calls.
    found: dict[str, bytes | None] = {}
    user_headers: list[tuple[str, bytes]] = []
    for name, header_value in headers or ():
        if name in _ENVELOPE_HEADERS:
            if name in found:
                raise MalformedRecord(f"header {name} appears twice")
            found[name] = header_value
        else:
            user_headers.append((name, header_value))
    get = found.get
    op = get(OP)
    if op is None:
        raise MalformedRecord(f"header {OP} is missing")
    if op not in OPS:
        raise MalformedRecord(f"header {OP} is {op[:40]!r}; expected one of put, cancel, done")
    if not key.isascii():
        raise MalformedRecord("record key is not ASCII text")
    delay_id = key.decode()
    header_id = get(ID)
    if header_id is not None and header_id != key:
        raise MalformedRecord(f"header {ID} {header_id[:40]!r} differs from the record key {key[:40]!r}")
    if op != OP_PUT:
        if value:
            raise MalformedRecord(f"a {op.decode()} record must have a null value")
        return BufferRecord(op, delay_id)
    topic = get(TOPIC)
    if not topic:
        raise MalformedRecord(f"put without header {TOPIC}")
    try:
        topic_name = topic.decode()
    except UnicodeDecodeError:
        raise MalformedRecord(f"header {TOPIC} is not UTF-8") from None
    deliver_at = _int_header(get(DELIVER_AT), DELIVER_AT, True)
    partition = _int_header(get(PARTITION), PARTITION, False)
    partitioner = get(PARTITIONER)
    envelope = Envelope(
        delay_id,
        topic_name,
        deliver_at,
        None if get(VALUE_NULL) is not None else (value or b""),
        get(KEY),
        partition,
        user_headers,
        _int_header(get(CREATED_AT), CREATED_AT, False) or timestamp_ms,
        partitioner.decode(errors="replace") if partitioner else None,
    )
    return BufferRecord(op, delay_id, envelope)


def _int_header(raw: bytes | None, name: str, required: bool) -> int | None:
    if raw is None:
        if required:
            raise MalformedRecord(f"put without header {name}")
        return None
    if not raw.isdigit() or len(raw) > 18:
        raise MalformedRecord(f"header {name} is {raw[:40]!r}; expected ASCII digits")
    return int(raw)
