"""What each record of the buffer and the dead-letter topic means to the console: pure rules, no Kafka, no RocksDB.

The console's index (index.py) reads every record of both topics once, in order per
partition, and keeps per delay id its history and a small state; these rules say what a
record adds and changes. The buffer's grammar is only :func:`delayq.wire.parse_buffer_record`'s
(the nodes' own parser), so a record is a put, a cancel, a done, or malformed with the
:class:`delayq.wire.Reason` a node gives it.

A buffer record of an id becomes one history event, told apart as:

- ``put``: a producer's first put of the id; ``reschedule``: a later producer put of it;
  ``replay``: a producer put carrying :data:`REPLAYED_FROM` (the console's replay of a dead letter);
- ``copy``: a master's ``restores=N`` copy of version N; ``next-occurrence``: a master's put of a
  series' next occurrence (``follows=N``); both replace version N only, as a node applies them;
- ``cancel``, ``done`` (a partition mark's ``done`` is no message's and is left out);
- ``malformed``: a record a node dead-letters, with the reason code (when its key is a delay id).

The id's state (:class:`IdState`) follows what a node's store holds: the version pending
(a put's offset), the latest put applied (where a reschedule reads the message back), and
whether a live series is kept for it (:class:`~delayq.delay_service.console.records.SeriesInfo`):
a put with a schedule starts or continues it, a put without one, a cancel, or a ``done`` of
the version pending ends it.

Events are stored as :data:`EventTuple` (marshal data, no dict per record: the index must
keep up with a buffer of tens of thousands of records a second); :func:`event_from_tuple`
makes the record the console shows.
"""

from __future__ import annotations

import bisect
import dataclasses
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import get_args

from delayq import wire

from .records import DeadLetter, HistoryEvent, HistoryKind, SeriesInfo

# The header a console replay's put carries: "<dead-letter topic>/<partition>/<offset>" of the dead letter it
# re-produces. Not a delayq- header: the producer refuses those on a put.
REPLAYED_FROM = "dead-letter-replayed-from"
# A dead letter's reason header that names no known code.
UNKNOWN_CODE = wire.UNKNOWN_CODE
# Header values of a dead letter as the console shows them: at most this many characters each.
MAX_HEADER_TEXT = 200

# Event kinds as small ints in the stored form, in the order records.HistoryKind lists them.
KINDS: tuple[HistoryKind, ...] = get_args(HistoryKind)
(PUT, RESCHEDULE, COPY, NEXT_OCCURRENCE, CANCEL, DONE, DELIVERED, DEAD_LETTER, MALFORMED,
 REPLAY) = range(len(KINDS))

# One stored event, without where it is (its key says that):
# (kind, ts_ms, due_ms, target, version, cutoff, epoch, occurrence, repeat, reason, text).
EventTuple = tuple[int, int, int | None, str | None, int | None, int | None, int | None, int | None, str | None,
                   str | None, str | None]

NONE = -1  # "no offset" in the packed state
# A stored dead letter: these fields of DeadLetter, in this order (its key says where it is; replays are apart).
LETTER_FIELDS = tuple(f.name for f in dataclasses.fields(DeadLetter)
                      if f.name not in ("partition", "offset", "replayed_as"))


def event_from_tuple(topic: str, partition: int, offset: int, event: Sequence) -> HistoryEvent:
    """The :class:`HistoryEvent` of a stored :data:`EventTuple` of record ``topic``/``partition``/``offset``."""
    kind, ts_ms, due_ms, target, version, cutoff, epoch, occurrence, repeat, reason, text = event
    return HistoryEvent(KINDS[kind], ts_ms, topic, partition, offset, due_ms=due_ms, target=target, version=version,
                        cutoff=cutoff, epoch=epoch, occurrence=occurrence, repeat=repeat, reason=reason, text=text)


def parse_coordinates(text: str) -> tuple[int, int]:
    """``"<partition>/<offset>"`` (a dead letter's :attr:`DeadLetter.coordinates`) as two ints.

    Raises:
        ValueError: not two non-negative integers joined by ``/``.
    """
    partition, sep, offset = str(text).partition("/")
    if not sep or not partition.isdigit() or not offset.isdigit() or len(partition) > 9 or len(offset) > 18:
        raise ValueError(f"dead letter coordinates {text!r:.60} are not <partition>/<offset> (e.g. 0/42): "
                         "use the coordinates the dead-letter list shows")
    return int(partition), int(offset)


# -- the state of one id -----------------------------------------------------


@dataclass(slots=True)
class IdState:
    """What the index keeps of one delay id besides its events; :meth:`pack` is its stored form."""

    events: int = 0  # events of the id's own buffer records stored (the history's bound counts these)
    pending: int = NONE  # the version (put offset) pending, as a node's store has it
    put_partition: int = NONE  # the latest put applied: where a reschedule reads the message back
    put_offset: int = NONE
    produced: bool = False  # a producer's put was seen: the next one is a reschedule
    repeating: bool = False  # a live series is kept for the id

    _FORM = struct.Struct(">Iqiq??")

    def pack(self) -> bytes:
        return self._FORM.pack(self.events, self.pending, self.put_partition, self.put_offset, self.produced,
                               self.repeating)

    @classmethod
    def unpack(cls, data: bytes) -> IdState:
        return cls(*cls._FORM.unpack(data))


@dataclass(slots=True)
class Change:
    """What one buffer record does to the index: the event of ``delay_id`` and its state after the record.

    ``series_changed``: ``series`` is the id's live series now (None: it has none any more).
    ``replay_of``: the dead letter (partition, offset) this put replays.
    """

    delay_id: str
    event: EventTuple
    state: IdState
    series: SeriesInfo | None = None
    series_changed: bool = False
    replay_of: tuple[int, int] | None = None


class BufferReading:
    """Reads buffer records into :class:`Change` s, given the state the index has of each id.

    Args:
        partitions: the buffer's partition count (a record off its id's partition is malformed).
        dead_letter_topic: the cluster's; a replay put naming another topic's dead letter marks nothing.
    """

    def __init__(self, partitions: int, dead_letter_topic: str):
        self.partitions = partitions
        self.dead_letter_topic = dead_letter_topic
        self._replay_prefix = dead_letter_topic + "/"

    def read(self, key: bytes | None, value: bytes | None, headers: wire.Headers | None, ts_ms: int,
             partition: int, offset: int, state_of: Callable[[str], IdState | None],
             series_of: Callable[[str], SeriesInfo | None]) -> Change | None:
        """The change one buffer record makes; None for a record of no message (no delay id, a partition mark).

        Args:
            state_of: the id's state so far (None: no record of it read yet); the returned
                change's state may be the same object, changed.
            series_of: the id's live series (asked only when the state says it has one).

        Raises:
            wire.NewerLevelRecord: a frame of a feature level this delayq does not read.
        """
        try:
            record = wire.parse_buffer_record(key, value, headers, ts_ms, partition=partition,
                                              partitions=self.partitions)
        except wire.MalformedRecord as err:
            if not key or not wire.is_delay_id(key):
                return None
            delay_id = key.decode()
            state = state_of(delay_id) or IdState()
            state.events += 1
            return Change(delay_id, (MALFORMED, ts_ms, None, None, None, None, None, None, None, err.code.value,
                                     err.text), state)
        delay_id = record.delay_id
        op = record.op
        if op == wire.OP_DONE and wire.is_mark_id(key or b""):
            return None
        known = state_of(delay_id)
        state = known or IdState()
        state.events += 1
        if op == wire.OP_PUT:
            return self._put(record, headers, ts_ms, partition, offset, known is None, state, series_of)
        if op == wire.OP_CANCEL:
            event: EventTuple = (CANCEL, ts_ms, None, None, None, None, None, None, None, None, None)
            closes = True
        else:
            version = record.closes_version
            event = (DONE, ts_ms, None, None, version, record.cutoff, None, None, None, None, None)
            closes = version == state.pending
        change = Change(delay_id, event, state)
        if closes:
            state.pending = NONE
            if state.repeating:
                state.repeating = False
                change.series_changed = True
        return change

    def _put(self, record: wire.BufferRecord, headers: wire.Headers | None, ts_ms: int, partition: int,
             offset: int, first: bool, state: IdState, series_of: Callable[[str], SeriesInfo | None]) -> Change:
        message = record.envelope
        assert message is not None  # a put has its envelope
        delay_id = record.delay_id
        replay_of = text = None
        # A master's put replaces one version only (restores=N, follows=N), as a node applies it; with no
        # record of the id read before, N was compacted away and the put is what the buffer has.
        if record.restores is not None:
            kind, replaces = COPY, record.restores
        elif record.follows is not None:
            kind, replaces = NEXT_OCCURRENCE, record.follows
        else:
            replaces = None
            text = self._replay_source(headers) if headers else None
            if text is not None:
                kind = REPLAY
                replay_of = self._replayed_letter(text)
            else:
                kind = RESCHEDULE if state.produced else PUT
            state.produced = True
        series = message.series
        repeat = wire.series_options(series).strip() if series is not None else None
        event: EventTuple = (kind, ts_ms, message.deliver_at_ms, message.topic, replaces,
                             record.cutoff if kind == NEXT_OCCURRENCE else None, None, message.occurrence, repeat,
                             None, text)
        change = Change(delay_id, event, state, replay_of=replay_of)
        if replaces is not None and not first and state.pending != replaces:
            return change  # a stray copy or next occurrence (a cancel or reschedule came between): nodes ignore it
        state.pending, state.put_partition, state.put_offset = offset, partition, offset
        if repeat is not None:
            previous = series_of(delay_id) if state.repeating else None
            occurrence = message.occurrence or 1
            if previous is None:
                delivered = occurrence - 1
            else:
                delivered = previous.delivered + (1 if kind == NEXT_OCCURRENCE else 0)
            change.series = SeriesInfo(delay_id, message.topic, repeat, occurrence, message.deliver_at_ms, delivered,
                                       offset)
            change.series_changed = state.repeating = True
        elif state.repeating:
            state.repeating = False
            change.series_changed = True
        return change

    @staticmethod
    def _replay_source(headers: wire.Headers | None) -> str | None:
        for name, data in headers or ():
            if name == REPLAYED_FROM:
                return (data or b"").decode(errors="replace")[:MAX_HEADER_TEXT]
        return None

    def _replayed_letter(self, source: str) -> tuple[int, int] | None:
        """The (partition, offset) of this cluster's dead letter a replay header names, if it names one."""
        if not source.startswith(self._replay_prefix):
            return None
        try:
            return parse_coordinates(source[len(self._replay_prefix):])
        except ValueError:
            return None


# -- dead letters ------------------------------------------------------------


def read_dead_letter(partition: int, offset: int, ts_ms: int, key: bytes | None, value: bytes | None,
                     headers: wire.Headers | None) -> DeadLetter:
    """What a record of the dead-letter topic says (delay_service/dead_letters.py and transactions.py write them).

    The reason header gives the code (:data:`UNKNOWN_CODE` when it starts with none) and the
    text; the version is an undeliverable message's ``delayq-version``, else the offset its
    source header names; the due time and target come from the put frame an undeliverable
    message's copy carries (none for a copy too large for Kafka, which has no value), or from a
    put that was only on the wrong partition; only those can be replayed.
    """
    facts = wire.read_dead_letter(key, value, headers)
    shown = tuple((name, "" if data is None else data[:MAX_HEADER_TEXT * 4].decode(errors="replace")[:MAX_HEADER_TEXT])
                  for name, data in headers or ())
    due, target = facts.due_ms, facts.topic
    if target is None and facts.code == wire.Reason.WRONG_PARTITION.value:
        due, target = _misplaced_put(key, value, facts.user_headers)
    return DeadLetter(partition, offset, ts_ms, facts.code, facts.text, facts.delay_id, facts.source, facts.version,
                      target, due, shown, replayable=target is not None)


def _misplaced_put(key: bytes | None, value: bytes | None, user_headers: wire.Headers) -> tuple[int | None, str | None]:
    """The due time and target of a put written to a buffer partition that is not its id's, if it is one.

    Its frame is valid: only the partition was wrong (a client's own partitioner, say), so the
    message can go through delayq again, onto the right partition. A wrong-partition cancel or done
    carries nothing to replay, and neither does any other malformed record.
    """
    if value is None or key is None or not wire.is_delay_id(key):
        return None, None
    try:
        message = wire.parse_buffer_record(key, value, user_headers).envelope
    except (wire.MalformedRecord, wire.NewerLevelRecord):
        return None, None
    return (message.deliver_at_ms, message.topic) if message is not None else (None, None)


def dead_letter_event(letter: DeadLetter) -> EventTuple:
    """The history event of the id a dead letter is about."""
    return (DEAD_LETTER, letter.ts_ms, letter.due_ms, letter.target, letter.version, None, None, None, None,
            letter.code, letter.text)


def replay_event(ts_ms: int, due_ms: int | None, target: str | None, source: str) -> EventTuple:
    """The event a replay's put adds to the history of the id whose dead letter it replays (text: the dead letter)."""
    return (REPLAY, ts_ms, due_ms, target, None, None, None, None, None, None, source)


# -- one id's history, in order ----------------------------------------------


def in_order(own: list[HistoryEvent], others: list[HistoryEvent]) -> list[HistoryEvent]:
    """An id's history: ``own`` (its records on its buffer partition, in offset order) with ``others`` placed by time.

    Offsets order the buffer's records; dead letters, replays and records on another
    partition only have a timestamp, and buffer timestamps do not rise strictly (a master's
    copy keeps its original's), so each other event goes before the first record of the
    id whose timestamp, or an earlier record's, is later than its own.
    """
    if not others:
        return own
    rising = []
    highest = None
    for event in own:
        highest = event.ts_ms if highest is None else max(highest, event.ts_ms)
        rising.append(highest)
    merged: list[HistoryEvent] = []
    start = 0
    for event in sorted(others, key=lambda e: (e.ts_ms, e.topic, e.partition, e.offset)):
        place = bisect.bisect_right(rising, event.ts_ms)
        merged.extend(own[start:place])
        start = max(start, place)
        merged.append(event)
    merged.extend(own[start:])
    return merged
