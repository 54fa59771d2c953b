"""The store's ops (what a buffer record asks of a node's store) and their codec between processes: one home.

A node's buffer reader (delay_service/reader.py) parses records in a process of its own and
sends them as frames of plain tuples (``marshal`` carries no classes): each op as its tag, then
its fields in the order of its named tuple here. :func:`put_frame`, :func:`remove_frame` and
:func:`malformed_frame` build them, :func:`decode` turns them back into the ops that
:meth:`delayq.store.TimeIndex.apply` takes. tests/unit/store/test_store.py checks that a frame of each
op decodes to the op built by name.
"""

from __future__ import annotations

import struct
from typing import NamedTuple, final

MAX_DELIVER_AT_MS = 2**63 - 1
MAX_PARTITION = 2**31 - 1


def check_ms(value: object, argument: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{argument} must be an int (Unix epoch milliseconds), not {type(value).__name__}")
    if not 0 <= value <= MAX_DELIVER_AT_MS:
        raise ValueError(f"{argument} must be between 0 and 2**63-1 milliseconds, got {value}")
    return value


def check_id(value: object, argument: str = "delay_id") -> str:
    if not isinstance(value, str):
        raise TypeError(f"{argument} must be a str, not {type(value).__name__}")
    if not value or not value.isascii():
        raise ValueError(f"{argument} {value!r} must be a non-empty ASCII string (the buffer record key)")
    return value


# The ops are named tuples: one is built per buffer record a node ingests, and a tuple costs a
# fifth of a frozen dataclass. Built by name (``Put(...)``) an op checks its fields; :func:`decode`,
# whose frames the reader built from records it parsed by the wire contract already, builds them
# with ``tuple.__new__`` (what the named tuple's ``_make`` does), which checks nothing.
# apply() tells them apart by ``type(op) is``: they are final.


# A producer write's identity, as ops carry it: where it was read (partition, offset), then
# what it is (record timestamp, the 8-byte digest of wire.write_digest). The last 16 bytes
# key it in meta (after sys/written/), the first 12 are the value.
WRITTEN = struct.Struct(">IQQ8s")
# A record's place in the buffer, partition and offset: a malformed record's key, a producer write's value.
PLACE = struct.Struct(">IQ")
WRITTEN_PLACE = PLACE.size


def producer_write(partition: int, offset: int, timestamp_ms: int, digest: bytes) -> bytes:
    """The ``written`` field of a :class:`Put` or :class:`Remove` that a producer wrote (not a master).

    A put without ``restores=``/``follows=`` or a cancel: a client library may append it
    twice (wire.COPY_WINDOW_MS), and the store applies the second copy as no write.

    Raises:
        ValueError: a field out of range, or a digest that is not 8 bytes.
    """
    if not isinstance(digest, bytes) or len(digest) != 8:
        raise ValueError(f"digest must be 8 bytes (wire.write_digest), got {digest!r:.40}")
    if not 0 <= partition <= MAX_PARTITION:
        raise ValueError(f"partition {partition!r} is outside [0, 2**31)")
    check_ms(offset, "offset")
    check_ms(max(timestamp_ms, 0), "timestamp_ms")
    # A producer may give any timestamp, even before 1970 (-1: none): the key orders it as 0.
    return WRITTEN.pack(partition, offset, max(timestamp_ms, 0), digest)


# Ingest's reader packs what it has parsed by the wire contract already: unchecked (as ingest builds
# the ops themselves with tuple.__new__), a timestamp below 0 given as 0.
pack_producer_write = WRITTEN.pack


def _check_written(written: object) -> None:
    if written is not None and (not isinstance(written, bytes) or len(written) != WRITTEN.size):
        raise ValueError(f"written must be None or producer_write(...)'s {WRITTEN.size} bytes, got {written!r:.40}")


class _PutFields(NamedTuple):
    delay_id: str
    deliver_at_ms: int
    payload: bytes
    version: int = 0
    restores: int | None = None
    written: bytes | None = None


@final
class Put(_PutFields):
    """A buffer `put`: add ``delay_id``, or replace what is stored of it (reschedule).

    ``version`` is the put's buffer offset: a later put of one id has a higher one.
    ``restores`` marks a master's copy of the put at that offset (see :class:`Remove`):
    it replaces only that version; if another is stored, or none, it changes nothing
    but the id's shadow mark (the copy is now the id's newest buffer record).
    ``written`` (:func:`producer_write`) marks a producer's put: one with the identity of a
    producer write of its id applied within ``COPY_WINDOW_MS`` before is a copy that a
    client library appended again; it changes nothing but the id's shadow mark, like a
    stale ``restores`` copy, even if the put it copies is still stored (a copy is no new version).

    Raises:
        TypeError: a field has the wrong type.
        ValueError: ``delay_id`` is empty or not ASCII, or ``deliver_at_ms`` or ``version`` is outside [0, 2**63).
    """

    __slots__ = ()

    def __new__(cls, delay_id: str, deliver_at_ms: int, payload: bytes, version: int = 0,
                restores: int | None = None, written: bytes | None = None) -> Put:
        check_id(delay_id)
        check_ms(deliver_at_ms, "deliver_at_ms")
        check_ms(version, "version")
        if restores is not None:
            check_ms(restores, "restores")
        if not isinstance(payload, bytes):
            raise TypeError(f"payload must be bytes, not {type(payload).__name__}")
        _check_written(written)
        return tuple.__new__(cls, (delay_id, deliver_at_ms, payload, version, restores, written))


class _RemoveFields(NamedTuple):
    delay_id: str
    version: int | None = None
    written: bytes | None = None


@final
class Remove(_RemoveFields):
    """A buffer `cancel` (``version`` None: whatever is stored) or `done` (the version it closes).

    A remove of an older version than the one stored keeps the stored one: the put that
    replaced it (a reschedule) reached the buffer after the master picked the old one.
    The id is then *shadowed* (:meth:`TimeIndex.shadowed`): its newest put lies before a
    `done` of its id in the buffer, where compaction would drop it, so the master writes
    it again (a :class:`Put` with ``restores``).
    ``written`` (:func:`producer_write`) marks a producer's cancel: a copy of one applied
    within ``COPY_WINDOW_MS`` before removes nothing (a put since then stays, shadowed).

    Raises:
        TypeError, ValueError: ``delay_id`` is not a non-empty ASCII str, ``version`` not None or an offset,
            or ``written`` not :func:`producer_write`'s.
    """

    __slots__ = ()

    def __new__(cls, delay_id: str, version: int | None = None, written: bytes | None = None) -> Remove:
        check_id(delay_id)
        if version is not None:
            check_ms(version, "version")
        _check_written(written)
        return tuple.__new__(cls, (delay_id, version, written))


class _MalformedFields(NamedTuple):
    partition: int
    offset: int
    payload: bytes
    delay_id: str | None = None


@final
class Malformed(_MalformedFields):
    """A buffer record no node may apply: kept, by its place in the buffer, until the cluster has dead-lettered it.

    ``payload`` is what the dead-letter copy needs (the caller's form). ``delay_id`` is
    set when the record's key is a valid id on its own partition: the record is then that
    id's newest, and compaction would drop an older put of it, so a pending id becomes
    shadowed (the master writes its put again, as after a stale `done`).

    Raises:
        TypeError, ValueError: a partition, offset or id out of range, or a payload that is not bytes.
    """

    __slots__ = ()

    def __new__(cls, partition: int, offset: int, payload: bytes, delay_id: str | None = None) -> Malformed:
        if not isinstance(partition, int) or not 0 <= partition <= MAX_PARTITION:
            raise ValueError(f"partition {partition!r} is outside [0, 2**31)")
        check_ms(offset, "offset")
        if not isinstance(payload, bytes):
            raise TypeError(f"payload must be bytes, not {type(payload).__name__}")
        if delay_id is not None:
            check_id(delay_id)
        return tuple.__new__(cls, (partition, offset, payload, delay_id))


StoreOp = Put | Remove | Malformed

# -- frames: ops between the reader and the node ------------------------------

# An op's tag, first in its frame; its fields follow in its named tuple's order.
_PUT, _REMOVE, _MALFORMED = 0, 1, 2
_KINDS: tuple[type[StoreOp], ...] = (Put, Remove, Malformed)


def put_frame(delay_id: str, deliver_at_ms: int, payload: bytes, version: int, restores: int | None,
              written: bytes | None) -> tuple:
    """A :class:`Put` as a frame carries it (unchecked: the reader parsed the record by the wire contract)."""
    return (_PUT, delay_id, deliver_at_ms, payload, version, restores, written)


def remove_frame(delay_id: str, version: int | None, written: bytes | None) -> tuple:
    """A :class:`Remove` as a frame carries it."""
    return (_REMOVE, delay_id, version, written)


def malformed_frame(partition: int, offset: int, payload: bytes, delay_id: str | None) -> tuple:
    """A :class:`Malformed` as a frame carries it."""
    return (_MALFORMED, partition, offset, payload, delay_id)


def decode(frames: list[tuple]) -> list[StoreOp]:
    """The ops of a frame's op tuples, unchecked (see above), in order."""
    kinds, new = _KINDS, tuple.__new__
    return [new(kinds[fields[0]], fields[1:]) for fields in frames]
