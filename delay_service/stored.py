"""The stored form of a pending message: what a node keeps in its time index per delay id.

Not a wire format: only the node that wrote it reads it. The store is a view of the
buffer topic, rebuilt from it at will, so a change of this form costs a rebuild and
never data (the leading form number says which form a value is in).

A stored value holds what delivery needs without going back to the buffer:

- the buffer partition of the put (the master writes the `done` there, whatever
  partitioner the producing client used),
- the version: the put's offset in that partition (a `done` names the version it
  closes, so a reschedule that lands after the master picked the old version survives),
- the envelope: target topic, due time, key, value, headers, creation time, partitioner,
  and a repeating message's schedule and occurrence, a retry's attempt.

Why marshal: C-fast for tuples of bytes/str/int, and every byte it reads was written
by this module in this node's own store.
"""

from __future__ import annotations

import marshal
from dataclasses import dataclass

from delayq.schedule import Series
from delayq.wire import Envelope

# Form 4 added a repeating message's schedule and occurrence and a retry's attempt. Form 5 adds
# the expiry (feature level 2) and is written only for a message that has one: every other
# value stays in form 4, which a node of 0.1.0 reads, so the store format is unchanged and a
# node rolled back before the cluster is finalized at level 2 (when no message can expire)
# reads its store as it was.
STORED_FORM = 4
EXPIRING_FORM = 5
# marshal's type code of a small tuple (at most 255 items), without and with its ref flag.
_SMALL_TUPLE = (b")", b"\xa9")


class MalformedStoredEntry(ValueError):
    """A stored value this node cannot read (damaged, or written in another form): rebuild the store."""


# Not frozen: one is built per delivered message, and a frozen dataclass's __init__ costs three times as much.
@dataclass(slots=True)
class PendingMessage:
    """One pending message as the node stores it."""

    buffer_partition: int
    version: int
    message: Envelope


def pack(buffer_partition: int, version: int, message: Envelope) -> bytes:
    """The stored value of ``message``, read from ``buffer_partition`` at offset ``version``."""
    m = message
    fields = (buffer_partition, version, m.delay_id, m.topic, m.deliver_at_ms, m.value, m.key, m.partition,
              m.headers, m.created_at_ms, m.partitioner, None if m.series is None else m.series.as_tuple(),
              m.occurrence, m.attempt)
    if m.expires_at_ms is None:
        return marshal.dumps((STORED_FORM, *fields))
    return marshal.dumps((EXPIRING_FORM, *fields, m.expires_at_ms))


def unpack(value: bytes) -> PendingMessage:
    """Read a stored value back.

    Raises:
        MalformedStoredEntry: ``value`` is not a stored value of this form; never any other exception.
    """
    fields = _load_tuple(value, "stored entry")
    expires_at_ms = None
    if type(fields) is tuple and len(fields) == 16 and fields[0] == EXPIRING_FORM:
        expires_at_ms = fields[15]
        if type(expires_at_ms) is not int:
            raise MalformedStoredEntry("stored value has an expiry of the wrong type: rebuild the store")
        fields = fields[:15]
    elif type(fields) is not tuple or len(fields) != 15 or fields[0] != STORED_FORM:
        form = fields[0] if type(fields) is tuple and fields else None
        raise MalformedStoredEntry(f"stored value has form {form!r:.40}, this delayq reads forms {STORED_FORM} and "
                                   f"{EXPIRING_FORM}: rebuild the store")
    (_, buffer_partition, version, delay_id, topic, deliver_at_ms, payload, key, partition, headers,
     created_at_ms, partitioner, schedule, occurrence, attempt) = fields
    # The master's hot path (once per delivered message): the checks inline, cheapest first.
    if (type(buffer_partition) is not int or buffer_partition < 0 or type(version) is not int or version < 0
            or type(delay_id) is not str or type(topic) is not str or type(deliver_at_ms) is not int
            or deliver_at_ms < 0 or (payload is not None and type(payload) is not bytes)
            or (key is not None and type(key) is not bytes)
            or (partition is not None and (type(partition) is not int or partition < 0))
            or type(headers) is not list or (headers and not _is_headers(headers)) or type(created_at_ms) is not int
            or (partitioner is not None and type(partitioner) is not str)
            or (occurrence is not None and type(occurrence) is not int)
            or (attempt is not None and type(attempt) is not int)):
        raise MalformedStoredEntry("stored value has fields of the wrong types: rebuild the store")
    message = Envelope(delay_id, topic, deliver_at_ms, payload, key, partition, headers, created_at_ms, partitioner,
                       None if schedule is None else _series(schedule), occurrence, attempt, expires_at_ms)
    return PendingMessage(buffer_partition, version, message)


def _series(fields: object) -> Series:
    if type(fields) is not tuple or len(fields) != 6:
        raise MalformedStoredEntry("stored value has a schedule of the wrong form: rebuild the store")
    every_ms, multiplier, cron, tz, times, until_ms = fields
    if not ((every_ms is None or type(every_ms) is int) and type(multiplier) is float
            and (cron is None or type(cron) is str) and type(tz) is str
            and (times is None or type(times) is int) and (until_ms is None or type(until_ms) is int)):
        raise MalformedStoredEntry("stored value has a schedule of the wrong types: rebuild the store")
    return Series(every_ms, multiplier, cron, tz, times, until_ms)


def _load_tuple(value: bytes, what: str) -> object:
    """``marshal.loads`` of a value this module wrote as a small tuple, or MalformedStoredEntry."""
    # Checked first: a damaged value that claims to be a list of 2**30 items makes marshal
    # allocate gigabytes and spend seconds before it fails.
    if value[:1] not in _SMALL_TUPLE:
        raise MalformedStoredEntry(f"stored value starts {value[:8]!r}, not as a {what}: rebuild the store")
    try:
        return marshal.loads(value)
    except Exception as err:  # damaged marshal data raises EOFError, ValueError, SystemError, ...
        raise MalformedStoredEntry(f"stored {what} is not readable ({type(err).__name__}: {err}): "
                                   "rebuild the store") from None


def _bytes_or_none(value: object) -> bool:
    return value is None or type(value) is bytes


def _is_headers(value: object) -> bool:
    return type(value) is list and all(
        type(h) is tuple and len(h) == 2 and type(h[0]) is str and _bytes_or_none(h[1]) for h in value)


# -- malformed records waiting to be dead-lettered ---------------------------

# The form number of a stored malformed record (its own series: the two never share a key).
MALFORMED_FORM = 1


@dataclass(frozen=True, slots=True)
class MalformedBufferRecord:
    """A buffer record no node applies, as kept until the master dead-letters it: the original and why."""

    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]
    timestamp_ms: int
    code: str
    reason: str


def pack_malformed(record: MalformedBufferRecord) -> bytes:
    r = record
    return marshal.dumps((MALFORMED_FORM, r.key, r.value, r.headers, r.timestamp_ms, r.code, r.reason))


def unpack_malformed(value: bytes) -> MalformedBufferRecord:
    """Read a stored malformed record back.

    Raises:
        MalformedStoredEntry: ``value`` is not one of this form; never any other exception.
    """
    fields = _load_tuple(value, "malformed record")
    if type(fields) is not tuple or len(fields) != 7 or fields[0] != MALFORMED_FORM:
        raise MalformedStoredEntry("stored malformed record has another form: rebuild the store")
    _, key, payload, headers, timestamp_ms, code, reason = fields
    if not (_bytes_or_none(key) and _bytes_or_none(payload) and _is_headers(headers) and type(timestamp_ms) is int
            and type(code) is str and type(reason) is str):
        raise MalformedStoredEntry("stored malformed record has fields of the wrong types: rebuild the store")
    return MalformedBufferRecord(key, payload, headers, timestamp_ms, code, reason)
