"""The console index's RocksDB: its key layout, the order each key encodes, and what reads and writes it.

:class:`IndexStore` applies each batch of consumed records (the meaning of each is history.py's; the
buffer's grammar is :func:`delayq.wire.parse_buffer_record`'s) in one RocksDB WriteBatch together with
the next offset of each partition the batch reached, so a restart resumes exactly where the index is,
and answers the console's queries from any thread. The consumer thread that feeds it, and the
console's face over it (:class:`ConsoleIndex`), are index.py's.

Layout, one column family each (keys are bytes; ``<p><o>`` is a partition, 4 bytes, and an
offset, 8 bytes, big-endian; ``<ts>`` a Kafka timestamp, 8 bytes):

- ``history``: ``<id><section><p><o>`` -> an event (history.EventTuple, marshal). Section 0: the
  id's own buffer records, in offset order; 1: its dead letters; 2: replays of its dead
  letters (the replay put's buffer place). An id keeps its newest :data:`MAX_HISTORY` own events.
- ``ids``: ``<id>`` -> :class:`history.IdState` (the version pending, the latest put, ...).
- ``series``: ``<id>`` -> a live series (:class:`SeriesInfo`'s fields, marshal), paged in id order.
- ``dead``: ``<ts><p><o>`` -> a dead letter (marshal): read backwards, newest first.
- ``dead_at``: ``<p><o>`` -> ``<ts>``, to find one by its coordinates.
- ``dead_codes``: ``<code>\\0<ts><p><o>`` -> nothing: the dead letters of one code, newest first.
- ``replays``: ``<p><o>`` -> the replay of that dead letter (its id, and its put's place once read).
- ``offsets``: ``b"b"<p>`` (buffer) or ``b"d"<p>`` (dead-letter topic) -> next offset to read.
- ``meta``: ``topics`` (the two topic names the index is of) and ``code/<code>`` -> count.

Every list is read from a cursor with one seek (``from_key``), never by counting or scanning.
"""

from __future__ import annotations

import logging
import marshal
import struct
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple, Protocol, cast

import rocksdict

from delayq import wire
from delayq.errors import DelayqError

from .history import (
    LETTER_FIELDS,
    BufferReading,
    IdState,
    dead_letter_event,
    event_from_tuple,
    in_order,
    parse_coordinates,
    read_dead_letter,
    replay_event,
)
from .records import MAX_PAGE, DeadLetter, HistoryEvent, Page, SeriesInfo

log = logging.getLogger("delayq.console.index")

# An id keeps at most this many events of its own buffer records (newest kept; a series delivered every second
# writes 3,600 an hour); the oldest go TRIM_STEP at a time, so trimming is not a delete per record.
MAX_HISTORY = 2000
TRIM_STEP = 200
HISTORY_CF, IDS_CF, SERIES_CF, DEAD_CF, DEAD_AT_CF, DEAD_CODES_CF, REPLAYS_CF, OFFSETS_CF, META_CF = FAMILIES = (
    "history", "ids", "series", "dead", "dead_at", "dead_codes", "replays", "offsets", "meta")
OWN, LETTERS, REPLAYS = b"\x00", b"\x01", b"\x02"  # history key sections
BUFFER_ROLE, DEAD_LETTER_ROLE = b"b", b"d"  # offsets key prefixes
ID_LENGTH = len(wire.DELAY_ID_EXAMPLE)
_TOPICS_KEY = b"topics"
_PARTITIONS_KEY = b"partitions"  # the buffer's partition count, as last read from Kafka
_CODE_PREFIX = b"code/"
_PLACE = struct.Struct(">IQ")
_LETTER_KEY = struct.Struct(">QIQ")
_COUNT = struct.Struct(">Q")
_PARTITION = struct.Struct(">I")
_ALL_KEYS_END = b"\xff" * 32  # above every key of every family: the end of a range delete of all of it
_NEWEST = b"\xff" * _LETTER_KEY.size  # above every dead letter's key: where a newest-first page starts

# One consumed record: (topic, partition, offset, timestamp ms, key, value, headers).
Consumed = tuple[str, int, int, int, bytes | None, bytes | None, wire.Headers | None]


class ConsoleIndexError(DelayqError):
    """The index's RocksDB cannot be opened or written; the message says what to do."""


class ReplayMark(NamedTuple):
    """A dead letter's replay: the id it was replayed as and, once the index read it, where its put is."""

    replay_id: str
    partition: int = -1  # of the replay's put in the buffer; -1: only marked (mark_replayed), not read yet
    offset: int = -1
    ts_ms: int = 0
    due_ms: int | None = None
    target: str | None = None

    @property
    def read(self) -> bool:
        return self.partition >= 0

    def pack(self) -> bytes:
        return marshal.dumps(tuple(self))

    @classmethod
    def unpack(cls, data: bytes) -> ReplayMark:
        return cls(*marshal.loads(data))


class _Family(Protocol):
    """A column family opened in raw mode: keys and values are bytes (rocksdict's stubs type its default mode)."""

    def get(self, key: bytes) -> bytes | None: ...

    def __getitem__(self, keys: list[bytes]) -> list[bytes | None]: ...  # a multi-get

    def keys(self, *, backwards: bool = False, from_key: bytes | None = None) -> Iterator[bytes]: ...

    def items(self, *, backwards: bool = False, from_key: bytes | None = None) -> Iterator[tuple[bytes, bytes]]: ...


@dataclass
class _BatchView:
    """What one batch being applied has written so far, which RocksDB does not show until the batch is written."""

    store: IndexStore
    states: dict[str, IdState | None] = field(default_factory=dict)
    changed: set[str] = field(default_factory=set)
    series: dict[str, SeriesInfo | None] = field(default_factory=dict)
    letters: dict[bytes, DeadLetter] = field(default_factory=dict)
    replays: dict[bytes, ReplayMark] = field(default_factory=dict)

    def state_of(self, delay_id: str) -> IdState | None:
        if delay_id in self.states:
            return self.states[delay_id]
        raw = self.store._ids.get(delay_id.encode())
        state = self.states[delay_id] = None if raw is None else IdState.unpack(raw)
        return state

    def series_of(self, delay_id: str) -> SeriesInfo | None:
        if delay_id in self.series:
            return self.series[delay_id]
        return self.store._series_at(delay_id.encode())

    def letter_at(self, place: bytes) -> DeadLetter | None:
        return self.letters.get(place) or self.store._letter_at(place)

    def replay_at(self, place: bytes) -> ReplayMark | None:
        if place in self.replays:
            return self.replays[place]
        raw = self.store._replays.get(place)
        return None if raw is None else ReplayMark.unpack(raw)


class IndexStore:
    """The index's RocksDB: applies consumed records (one writer thread) and answers the console (any thread).

    Args:
        path: its directory (created if missing).
        buffer_topic, dead_letter_topic: the topics it is an index of; a store of other topics is emptied.

    Raises:
        ConsoleIndexError: RocksDB cannot open the directory (another process holds it, or it is no such index).
    """

    def __init__(self, path: Path | str, buffer_topic: str, dead_letter_topic: str):
        self.path = Path(path)
        self.buffer_topic = buffer_topic
        self.dead_letter_topic = dead_letter_topic
        self.skipped = 0  # records that could not be read (logged each)
        self.reading: BufferReading | None = None  # set once the buffer's partition count is known
        options = rocksdict.Options(raw_mode=True)
        options.create_if_missing(True)
        options.create_missing_column_families(True)
        options.set_keep_log_file_num(3)
        family = rocksdict.Options(raw_mode=True)
        family.set_compression_type(rocksdict.DBCompressionType.lz4())
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            self._db = rocksdict.Rdict(str(self.path), options, column_families={name: family for name in FAMILIES})
        except Exception as err:  # rocksdict raises bare Exception for every RocksDB status
            raise ConsoleIndexError(f"the console's index at {self.path} cannot be opened ({err}): another console or "
                              "node may use it (give each its own console_data_dir), or delete the folder and "
                              "let the console read the topics again") from err
        self._cf = {name: cast(_Family, self._db.get_column_family(name)) for name in FAMILIES}
        self._handle = {name: self._db.get_column_family_handle(name) for name in FAMILIES}
        self._history, self._ids, self._series = self._cf[HISTORY_CF], self._cf[IDS_CF], self._cf[SERIES_CF]
        self._dead, self._dead_at, self._dead_codes = self._cf[DEAD_CF], self._cf[DEAD_AT_CF], self._cf[DEAD_CODES_CF]
        self._replays, self._meta = self._cf[REPLAYS_CF], self._cf[META_CF]
        # One writer at a time: the feed's batches and mark_replayed.
        self._write_lock = threading.Lock()
        self._next: dict[tuple[str, int], int] = {}
        self._codes: dict[str, int] = {}
        self._load()

    def _load(self) -> None:
        topics = f"{self.buffer_topic}\n{self.dead_letter_topic}".encode()
        stored = self._meta.get(_TOPICS_KEY)
        if stored != topics:
            if stored is not None:
                was = stored.decode(errors="replace").replace("\n", " and ")
                self.wipe(f"it was of {was}, not of {self.buffer_topic} and {self.dead_letter_topic}")
            else:
                self.wipe("it is new")
            return
        roles = {BUFFER_ROLE: self.buffer_topic, DEAD_LETTER_ROLE: self.dead_letter_topic}
        for key, value in self._cf[OFFSETS_CF].items():
            self._next[(roles[key[:1]], _PARTITION.unpack_from(key, 1)[0])] = _COUNT.unpack(value)[0]
        for key, value in self._meta.items(from_key=_CODE_PREFIX):
            if not key.startswith(_CODE_PREFIX):
                break
            self._codes[key[len(_CODE_PREFIX):].decode()] = _COUNT.unpack(value)[0]
        partitions = self._meta.get(_PARTITIONS_KEY)
        if partitions is not None:
            # Before the feed reads the topics again, an id's history is already in order.
            self.reading = BufferReading(_COUNT.unpack(partitions)[0], self.dead_letter_topic)

    def wipe(self, why: str) -> None:
        """Empty the index (it reads both topics again from their start), saying ``why`` in the log."""
        with self._write_lock:
            batch = rocksdict.WriteBatch(raw_mode=True)
            for name in FAMILIES:
                batch.delete_range(b"", _ALL_KEYS_END, self._handle[name])
            batch.put(_TOPICS_KEY, f"{self.buffer_topic}\n{self.dead_letter_topic}".encode(), self._handle[META_CF])
            self._write(batch)
            self._next, self._codes = {}, {}
        log.info("console index at %s starts from the topics' start: %s", self.path, why)

    def close(self) -> None:
        with self._write_lock:
            self._cf.clear()
            self._handle.clear()
            del self._history, self._ids, self._series, self._dead, self._dead_at, self._dead_codes, self._replays
            del self._meta
            self._db.close()

    def offsets(self) -> dict[tuple[str, int], int]:
        """(topic, partition) -> the next offset to read, for every partition read so far."""
        return dict(self._next)

    def set_buffer_partitions(self, partitions: int) -> None:
        """The buffer's partition count (Kafka's metadata says it): a record off its id's partition is malformed."""
        if self.reading is not None and self.reading.partitions == partitions:
            return
        with self._write_lock:
            batch = rocksdict.WriteBatch(raw_mode=True)
            batch.put(_PARTITIONS_KEY, _COUNT.pack(partitions), self._handle[META_CF])
            self._write(batch)
            self.reading = BufferReading(partitions, self.dead_letter_topic)

    def _write(self, batch: rocksdict.WriteBatch) -> None:
        try:
            self._db.write(batch)
        except Exception as err:
            raise ConsoleIndexError(f"writing the console's index at {self.path} failed: {err}") from err

    # -- applying consumed records --------------------------------------------

    def apply(self, records: Iterable[Consumed]) -> None:
        """Index ``records`` (in the order consumed) and the offsets they reach, in one WriteBatch.

        A record that cannot be read is skipped, with a log line, and counted in :attr:`skipped`.

        Raises:
            ConsoleIndexError: RocksDB failed to write (nothing of the batch was written).
        """
        reading = self.reading
        if reading is None:
            raise RuntimeError("set_buffer_partitions() first: a buffer record is read against the partition count")
        buffer_topic = self.buffer_topic
        with self._write_lock:
            batch = rocksdict.WriteBatch(raw_mode=True)
            view = _BatchView(self)
            codes = dict(self._codes)
            offsets: dict[tuple[str, int], int] = {}
            history = self._handle[HISTORY_CF]
            dumps, place_of = marshal.dumps, _PLACE.pack
            for record in records:
                topic, partition, offset, ts_ms, key, value, headers = record
                offsets[(topic, partition)] = offset + 1
                try:
                    if topic != buffer_topic:
                        self._index_dead_letter(batch, view, codes, record)
                        continue
                    change = reading.read(key, value, headers, ts_ms, partition, offset, view.state_of,
                                          view.series_of)
                    if change is None:
                        continue
                    delay_id = change.delay_id
                    id_bytes = delay_id.encode()
                    batch.put(id_bytes + OWN + place_of(partition, offset), dumps(change.event), history)
                    view.states[delay_id] = change.state
                    view.changed.add(delay_id)
                    if change.series_changed:
                        view.series[delay_id] = change.series
                    if change.replay_of is not None:
                        self._index_replay(batch, view, change.replay_of, delay_id, partition, offset,
                                           change.event)
                except Exception as err:  # a newer feature level's frame, or anything else: never stop the index
                    self.skipped += 1
                    log.warning("console index: record %s/%d/%d skipped, it cannot be read: %s", topic, partition,
                                offset, err)
            self._finish(batch, view, codes, offsets)

    def _finish(self, batch: rocksdict.WriteBatch, view: _BatchView, codes: dict[str, int],
                offsets: dict[tuple[str, int], int]) -> None:
        ids, series, meta = self._handle[IDS_CF], self._handle[SERIES_CF], self._handle[META_CF]
        for delay_id in view.changed:
            state = view.states[delay_id]
            assert state is not None  # a changed id has a state
            if state.events > MAX_HISTORY + TRIM_STEP:
                self._trim(batch, delay_id.encode(), state)
            batch.put(delay_id.encode(), state.pack(), ids)
        for delay_id, info in view.series.items():
            if info is None:
                batch.delete(delay_id.encode(), series)
            else:
                batch.put(delay_id.encode(), marshal.dumps((info.target, info.repeat, info.occurrence,
                                                            info.next_due_ms, info.delivered, info.version)), series)
        for code, count in codes.items():
            if count != self._codes.get(code):
                batch.put(_CODE_PREFIX + code.encode(), _COUNT.pack(count), meta)
        offsets_cf = self._handle[OFFSETS_CF]
        for (topic, partition), offset in offsets.items():
            role = BUFFER_ROLE if topic == self.buffer_topic else DEAD_LETTER_ROLE
            batch.put(role + _PARTITION.pack(partition), _COUNT.pack(offset), offsets_cf)
        self._write(batch)
        self._codes = codes
        self._next.update(offsets)

    def _trim(self, batch: rocksdict.WriteBatch, id_bytes: bytes, state: IdState) -> None:
        """Delete the id's oldest own events down to MAX_HISTORY, once per batch.

        Only events already written are seen, and deleted: those of the batch are newer (a batch of more
        than MAX_HISTORY records of one id leaves the rest to the next).
        """
        prefix = id_bytes + OWN
        surplus = state.events - MAX_HISTORY
        last = None
        dropped = 0
        for key in self._history.keys(from_key=prefix):
            if dropped == surplus or not key.startswith(prefix):
                break
            last = key
            dropped += 1
        if last is not None:
            batch.delete_range(prefix, last + b"\x00", self._handle[HISTORY_CF])
            state.events -= dropped

    def _index_dead_letter(self, batch: rocksdict.WriteBatch, view: _BatchView, codes: dict[str, int],
                           record: Consumed) -> None:
        _topic, partition, offset, ts_ms, key, value, headers = record
        letter = read_dead_letter(partition, offset, ts_ms, key, value, headers)
        place = _PLACE.pack(partition, offset)
        letter_key = _LETTER_KEY.pack(max(ts_ms, 0), partition, offset)
        batch.put(letter_key, marshal.dumps(tuple(getattr(letter, name) for name in LETTER_FIELDS)),
                  self._handle[DEAD_CF])
        batch.put(place, letter_key, self._handle[DEAD_AT_CF])
        batch.put(letter.code.encode() + b"\x00" + letter_key, b"", self._handle[DEAD_CODES_CF])
        codes[letter.code] = codes.get(letter.code, 0) + 1
        view.letters[place] = letter
        if letter.id is None:
            return
        history = self._handle[HISTORY_CF]
        batch.put(letter.id.encode() + LETTERS + place, marshal.dumps(dead_letter_event(letter)), history)
        replay = view.replay_at(place)
        if replay is not None and replay.read:
            batch.put(letter.id.encode() + REPLAYS + _PLACE.pack(replay.partition, replay.offset),
                      marshal.dumps(replay_event(replay.ts_ms, replay.due_ms, replay.target,
                                                 self._letter_name(partition, offset))), history)

    def _index_replay(self, batch: rocksdict.WriteBatch, view: _BatchView, letter_place: tuple[int, int],
                      replay_id: str, partition: int, offset: int, event: tuple) -> None:
        """A replay's put: mark its dead letter replayed (the first replay put wins) and tell the letter's id."""
        place = _PLACE.pack(*letter_place)
        known = view.replay_at(place)
        if known is not None and known.read:
            return
        mark = ReplayMark(replay_id, partition, offset, ts_ms=event[1], due_ms=event[2], target=event[3])
        batch.put(place, mark.pack(), self._handle[REPLAYS_CF])
        view.replays[place] = mark
        letter = view.letter_at(place)
        if letter is not None and letter.id is not None:
            batch.put(letter.id.encode() + REPLAYS + _PLACE.pack(partition, offset),
                      marshal.dumps(replay_event(mark.ts_ms, mark.due_ms, mark.target,
                                                 self._letter_name(*letter_place))), self._handle[HISTORY_CF])

    def _letter_name(self, partition: int, offset: int) -> str:
        return f"{self.dead_letter_topic}/{partition}/{offset}"

    def mark_replayed(self, coordinates: str, replay_id: str) -> None:
        """Mark the dead letter at ``coordinates`` replayed as ``replay_id`` (a replay put read later keeps it).

        Raises:
            ValueError: bad coordinates, or ``replay_id`` is no delay id.
        """
        place = _PLACE.pack(*parse_coordinates(coordinates))
        wire.check_delay_id(replay_id, "replay_id")
        with self._write_lock:
            if self._replays.get(place) is not None:
                return
            batch = rocksdict.WriteBatch(raw_mode=True)
            batch.put(place, ReplayMark(replay_id).pack(), self._handle[REPLAYS_CF])
            self._write(batch)

    # -- answering -------------------------------------------------------------

    def history(self, delay_id: str) -> list[HistoryEvent]:
        """Every event kept of ``delay_id``, in order (history.in_order); [] for an unknown id or no id at all."""
        prefix = delay_id.encode(errors="replace")
        if not wire.is_delay_id(prefix):
            return []
        own: list[HistoryEvent] = []
        others: list[HistoryEvent] = []
        home = wire.buffer_partition(prefix, self.reading.partitions) if self.reading is not None else None
        for key, value in self._history.items(from_key=prefix):
            if not key.startswith(prefix):
                break
            section = key[ID_LENGTH:ID_LENGTH + 1]
            partition, offset = _PLACE.unpack_from(key, ID_LENGTH + 1)
            topic = self.dead_letter_topic if section == LETTERS else self.buffer_topic
            event = event_from_tuple(topic, partition, offset, marshal.loads(value))
            (own if section == OWN and partition == home else others).append(event)
        return in_order(own, others)

    def latest_put(self, delay_id: str) -> tuple[int, int] | None:
        """(buffer partition, offset) of the id's latest put applied (pending, or the last that was); None: none."""
        raw = self._ids.get(delay_id.encode(errors="replace"))
        if raw is None:
            return None
        state = IdState.unpack(raw)
        return None if state.put_offset < 0 else (state.put_partition, state.put_offset)

    def dead_letters(self, after: str | None = None, limit: int = 50, code: str | None = None) -> Page[DeadLetter]:
        """Dead letters newest first (of one reason ``code`` if given), from the cursor ``after`` (a page's next).

        Raises:
            ValueError: ``after`` is no cursor this index gave.
        """
        limit = max(1, min(int(limit), MAX_PAGE))
        start = _cursor_key(after) if after else None
        keys: list[bytes] = []
        values: list[bytes | None]
        if code is None:
            values = []
            for key, value in self._dead.items(backwards=True, from_key=start or _NEWEST):
                if key == start:
                    continue
                keys.append(key)
                values.append(value)
                if len(keys) > limit:
                    break
        else:
            prefix = code.encode(errors="replace") + b"\x00"
            for key in self._dead_codes.keys(backwards=True, from_key=prefix + (start or _NEWEST)):
                if not key.startswith(prefix) or len(keys) > limit:
                    break
                letter_key = key[len(prefix):]
                if letter_key != start:
                    keys.append(letter_key)
            values = self._dead[keys] if keys else []
        more = len(keys) > limit
        keys, values = keys[:limit], values[:limit]
        letters = self._letters(keys, values)
        return Page(tuple(letters), keys[-1].hex() if more else None)

    def _letters(self, keys: Sequence[bytes], values: Sequence[bytes | None]) -> list[DeadLetter]:
        places = [key[8:] for key in keys]
        replays = self._replays[places] if places else []
        letters = []
        for key, value, replay in zip(keys, values, replays, strict=True):
            if value is None:
                continue
            partition, offset = _PLACE.unpack_from(key, 8)
            letters.append(_letter(partition, offset, value, replay))
        return letters

    def dead_letter(self, coordinates: str) -> DeadLetter | None:
        """The dead letter at ``"<partition>/<offset>"``; None if the index has none there.

        Raises:
            ValueError: bad coordinates.
        """
        return self._letter_at(_PLACE.pack(*parse_coordinates(coordinates)))

    def _letter_at(self, place: bytes) -> DeadLetter | None:
        letter_key = self._dead_at.get(place)
        if letter_key is None:
            return None
        return next(iter(self._letters([letter_key], [self._dead.get(letter_key)])), None)

    def dead_letter_codes(self) -> dict[str, int]:
        """Reason code -> how many dead letters the index has of it."""
        return dict(sorted(self._codes.items()))

    def series(self, after: str | None = None, limit: int = 50) -> Page[SeriesInfo]:
        """The live repeating messages in id order (UUIDv7: creation order), from the cursor ``after``."""
        limit = max(1, min(int(limit), MAX_PAGE))
        start = after.encode(errors="replace") if after else None
        found: list[SeriesInfo] = []
        more = False
        for key, value in self._series.items(from_key=start or b""):
            if key == start:
                continue
            if len(found) == limit:
                more = True
                break
            found.append(_series_info(key, value))
        return Page(tuple(found), found[-1].id if more else None)

    def _series_at(self, id_bytes: bytes) -> SeriesInfo | None:
        raw = self._series.get(id_bytes)
        return None if raw is None else _series_info(id_bytes, raw)


def _series_info(key: bytes, value: bytes) -> SeriesInfo:
    target, repeat, occurrence, next_due_ms, delivered, version = marshal.loads(value)
    return SeriesInfo(key.decode(), target, repeat, occurrence, next_due_ms, delivered, version)


def _letter(partition: int, offset: int, value: bytes, replay: bytes | None) -> DeadLetter:
    fields = dict(zip(LETTER_FIELDS, marshal.loads(value), strict=True))
    replayed_as = ReplayMark.unpack(replay).replay_id if replay is not None else None
    return DeadLetter(partition=partition, offset=offset, replayed_as=replayed_as, **fields)


def _cursor_key(cursor: str) -> bytes:
    try:
        key = bytes.fromhex(cursor)
    except ValueError:
        key = b""
    if len(key) != _LETTER_KEY.size:
        raise ValueError(f"page cursor {cursor!r:.60} is not one this console gave: start again from the first page")
    return key
