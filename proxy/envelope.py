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

import os
import struct
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
        out = [
            (OP, OP_PUT),
            (ID, self.delay_id.encode()),
            (TOPIC, self.topic.encode()),
            (DELIVER_AT, str(self.deliver_at_ms).encode()),
            (CREATED_AT, str(self.created_at_ms).encode()),
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

    # A compact, versioned binary form for the node's store (not the wire format).
    def to_bytes(self) -> bytes:
        parts = [
            self.delay_id.encode(), self.topic.encode(), _opt(self.key), _opt(self.value),
            (self.partitioner or "").encode(),
        ]
        out = [struct.pack(">BqqiH", 1, self.deliver_at_ms, self.created_at_ms,
                           -1 if self.partition is None else self.partition, len(self.headers))]
        for part in parts:
            out.append(part if part is _NONE else struct.pack(">i", len(part)) + part)
        for name, value in self.headers:
            raw_name = name.encode()
            raw_value = _opt(value)
            out.append(struct.pack(">H", len(raw_name)) + raw_name)
            out.append(raw_value if raw_value is _NONE else struct.pack(">i", len(raw_value)) + raw_value)
        return b"".join(out)

    @classmethod
    def from_bytes(cls, data: bytes) -> Envelope:
        version, deliver_at, created_at, partition, n_headers = struct.unpack_from(">BqqiH", data)
        if version != 1:
            raise ValueError(f"stored envelope version {version} is unknown to this delayq")
        pos = struct.calcsize(">BqqiH")
        fields = []
        for _ in range(5):
            value, pos = _read_opt(data, pos)
            fields.append(value)
        headers = []
        for _ in range(n_headers):
            (name_len,) = struct.unpack_from(">H", data, pos)
            pos += 2
            name = data[pos:pos + name_len].decode()
            pos += name_len
            value, pos = _read_opt(data, pos)
            headers.append((name, value))
        delay_id, topic, key, value, partitioner = fields
        return cls(delay_id.decode(), topic.decode(), deliver_at, value, key,
                   None if partition < 0 else partition, headers, created_at, partitioner.decode() or None)


_NONE = struct.pack(">i", -1)


def _opt(value: bytes | None) -> bytes:
    return _NONE if value is None else value


def _read_opt(data: bytes, pos: int) -> tuple[bytes | None, int]:
    (length,) = struct.unpack_from(">i", data, pos)
    pos += 4
    if length < 0:
        return None, pos
    return data[pos:pos + length], pos + length


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


def parse_buffer_record(key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]] | None) -> BufferRecord:
    """Read one buffer record.

    Raises:
        MalformedRecord: missing or contradictory headers, bad numbers, unknown op.
    """
    if key is None:
        raise MalformedRecord("record has no key (the delay id)")
    found: dict[str, bytes | None] = {}
    user_headers: list[tuple[str, bytes]] = []
    for name, header_value in headers or ():
        if name in _ENVELOPE_HEADERS:
            if name in found:
                raise MalformedRecord(f"header {name} appears twice")
            found[name] = header_value
        else:
            user_headers.append((name, header_value))
    op = found.get(OP)
    if op is None:
        raise MalformedRecord(f"header {OP} is missing")
    if op not in OPS:
        raise MalformedRecord(f"header {OP} is {op[:40]!r}; expected one of put, cancel, done")
    try:
        delay_id = key.decode("ascii")
    except UnicodeDecodeError:
        raise MalformedRecord("record key is not ASCII text") from None
    header_id = found.get(ID)
    if header_id is not None and header_id != key:
        raise MalformedRecord(f"header {ID} {header_id[:40]!r} differs from the record key {key[:40]!r}")
    if op != OP_PUT:
        if value:
            raise MalformedRecord(f"a {op.decode()} record must have a null value")
        return BufferRecord(op, delay_id)
    topic = found.get(TOPIC)
    if not topic:
        raise MalformedRecord(f"put without header {TOPIC}")
    try:
        topic_name = topic.decode()
    except UnicodeDecodeError:
        raise MalformedRecord(f"header {TOPIC} is not UTF-8") from None
    deliver_at = _int_header(found, DELIVER_AT, required=True)
    partition = _int_header(found, PARTITION, required=False)
    partitioner = found.get(PARTITIONER)
    envelope = Envelope(
        delay_id=delay_id,
        topic=topic_name,
        deliver_at_ms=deliver_at,
        value=None if found.get(VALUE_NULL) is not None else (value or b""),
        key=found.get(KEY),
        partition=partition,
        headers=user_headers,
        created_at_ms=_int_header(found, CREATED_AT, required=False) or 0,
        partitioner=partitioner.decode(errors="replace") if partitioner else None,
    )
    return BufferRecord(op, delay_id, envelope)


def _int_header(found: dict[str, bytes | None], name: str, *, required: bool) -> int | None:
    raw = found.get(name)
    if raw is None:
        if required:
            raise MalformedRecord(f"put without header {name}")
        return None
    if not raw.isdigit() or len(raw) > 18:
        raise MalformedRecord(f"header {name} is {raw[:40]!r}; expected ASCII digits")
    return int(raw)
