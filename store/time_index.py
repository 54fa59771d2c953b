"""The RocksDB time index every delay-service node keeps (docs/DESIGN.md, "Store").

Layout, one column family each:

- ``time``: ``deliver_at_ms`` (8 bytes big-endian) + delay id (ASCII) -> payload.
  Byte order is (time, id) order, so iterating from the front yields what is due next.
- ``ids``: delay id -> ``deliver_at_ms`` then the version (8 bytes big-endian each):
  cancel, reschedule, lookup, and recognising a re-read `put`. The version is the
  buffer offset of the put stored, so a `done` removes only the version it closes.
- ``offsets``: buffer partition (4 bytes big-endian) -> next offset to read (8 bytes).
- ``meta``: ``sys/...`` for the store's own bookkeeping (format, pending count, last
  ingest time, ``sys/shadowed/<id>`` marks, ``sys/malformed/<partition><offset>``
  records waiting to be dead-lettered, ``sys/newest/<partition>`` the newest record
  time read there) and ``user/<name>`` for :meth:`TimeIndex.set_meta`.
- ``written`` (store format 5 on): ``<time><digest>`` -> partition and offset, the producer
  writes of the last ``COPY_WINDOW_MS`` or so, so that a write a client library appended
  twice is applied once (:func:`producer_write`). Store format 4 keeps them in meta, under
  ``sys/written/``.

Store formats: a store records its format in meta (``sys/format``). This code opens format 4
and 5, creates a new store in the format it is given (the node gives the one of the cluster's
finalized feature level, delayq/features.py), and migrates a format-4 store to 5 in place
(:meth:`TimeIndex.upgrade_format`). An older store is refused with :class:`StoreFormatError`:
the node rebuilds it from the buffer and says why.

The store is a view of the buffer topic: every change arrives through :meth:`TimeIndex.apply`
together with the buffer offsets that produced it, in one WriteBatch.

Example:
    >>> with TimeIndex(tmp / "store") as store:                      # doctest: +SKIP
    ...     store.apply([Put("id-1", 1_700_000_000_000, b"...")], {0: 1})
    ...     store.due(up_to_ms=now_ms, limit=1000)
"""

from __future__ import annotations

import os
import shutil
import struct
import threading
import time
from collections.abc import Callable, Container, Generator, Iterable, Iterator, Mapping
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, Protocol, cast

import rocksdict

from delayq.errors import DelayqError
from delayq.wire import COPY_WINDOW_MS

from .ops import (
    MAX_DELIVER_AT_MS,
    MAX_PARTITION,
    PLACE,
    WRITTEN,
    WRITTEN_PLACE,
    Malformed,
    Put,
    Remove,
    StoreOp,
    check_id,
    check_ms,
)
from .options import COLUMN_FAMILIES, IDS_CF, META_CF, OFFSETS_CF, TIME_CF, WRITTEN_CF, StoreOptions
from .pending_by_due import DueCounts, PendingByDue, check_days, summarize

# Store formats, in sys/format as b"delayq-time-index-<n>":
# 3: malformed records are kept (sys/malformed/) and ingest enforces the wire contract's partition,
#    id and due-time rules; a store ingested under older rules is rebuilt rather than trusted.
# 4: stored values of form 4 (delay_service/stored.py: a repeating message's schedule, a retry's
#    attempt). delayq 0.1.0's. From 0.2.0 on also stored form 5 (an expiring message), written only
#    at feature level 2, and the producer writes in meta (sys/written/).
# 5: the producer writes in a column family of their own (written): their churn and range deletes
#    stay out of the meta family that every open reads, and delayq 0.1.0, which opens only format
#    4's families, refuses such a store instead of rebuilding it (a node rolled back after finalizing
#    would dead-letter frames of level 2). Feature level 2's store format: until the cluster is
#    finalized at 2 a node keeps format 4, so that it can go back to 0.1.0 on its data directory.
OLDEST_FORMAT = 4  # the oldest format this code opens; older ones have no in-place migration
NEWEST_FORMAT = 5
_FAMILIES = {4: COLUMN_FAMILIES, 5: (*COLUMN_FAMILIES, WRITTEN_CF)}
_FORMAT_MARKER = b"delayq-time-index-"
_META_FORMAT = b"sys/format"
_META_PENDING = b"sys/pending"
_META_LAST_INGEST = b"sys/last_ingest_ms"
_META_SHADOWED = b"sys/shadowed/"
_META_MALFORMED = b"sys/malformed/"
_META_NEWEST = b"sys/newest/"
_META_WRITTEN = b"sys/written/"  # store format 4's place of the producer writes
_META_WRITTEN_END = b"sys/written0"  # the first key after them ("/" + 1)
# Producer writes moved to the written family per batch by a migration (a batch of ~1 MB, some milliseconds
# of apply() waiting).
MIGRATE_BATCH = 20_000
_USER_META = b"user/"


class StoreError(DelayqError):
    """The store cannot be opened, read or written; the message says why and what to do."""


class StoreFormatError(StoreError):
    """The directory holds a delayq store of a format this code cannot open or migrate (two or more formats
    older, or newer): it must be deleted and rebuilt from the buffer, or opened by the delayq that wrote it."""


def _format_marker(store_format: int) -> bytes:
    return _FORMAT_MARKER + str(store_format).encode()


def _check_format(store_format: object) -> int:
    if not isinstance(store_format, int) or isinstance(store_format, bool):
        raise TypeError(f"store_format must be an int, not {type(store_format).__name__}")
    if not OLDEST_FORMAT <= store_format <= NEWEST_FORMAT:
        raise ValueError(f"store_format {store_format} is not one this delayq writes ({OLDEST_FORMAT} to "
                         f"{NEWEST_FORMAT})")
    return store_format


@dataclass(frozen=True, slots=True)
class MalformedEntry:
    """A malformed buffer record waiting to be dead-lettered (:meth:`TimeIndex.malformed`)."""

    partition: int
    offset: int
    payload: bytes


class StoredEntry(NamedTuple):
    """One pending message as stored (a named tuple: due() builds one per entry it returns)."""

    delay_id: str
    deliver_at_ms: int
    payload: bytes
    version: int = 0


class Upcoming(NamedTuple):
    """A page of :meth:`TimeIndex.upcoming`: the entries, where the next page starts (None: no more), entries read."""

    entries: list[StoredEntry]
    next: tuple[int, str] | None
    scanned: int


@dataclass(frozen=True)
class ApplyResult:
    """What one :meth:`TimeIndex.apply` did, op by op.

    ``moved`` counts puts of a stored id with another time, payload or version (a
    reschedule); ``unchanged`` counts a put identical to what is stored (a re-read
    record) and a remove of an id that is not stored (e.g. a `done` after a `cancel`);
    ``kept`` counts removes of an older version than the one stored (the newer stays).
    ``copies`` counts producer writes applied as a copy of an earlier one (no write; also
    counted as ``kept`` or ``unchanged``).
    """

    added: int
    moved: int
    removed: int
    unchanged: int
    kept: int = 0
    copies: int = 0


# The deliver_at_ms of a time key, as a 1-tuple (twice as fast as int.from_bytes(key[:8])).
_key_time = struct.Struct(">Q").unpack_from


def _u64(value: int) -> bytes:
    return value.to_bytes(8, "big")


def _time_key(deliver_at_ms: int, id_bytes: bytes) -> bytes:
    return deliver_at_ms.to_bytes(8, "big") + id_bytes


# An ids-CF value: (deliver_at_ms, version).
_id_value = struct.Struct(">QQ")

# Shadow marks as stored: write the stored put again, or close a copy (its payload follows).
_REPUT = b""
_COPY = b"c"
_UNMARKED = b"-"  # in memory only, compared by identity




class _Plan(NamedTuple):
    """What :meth:`TimeIndex._plan` found a batch of ops to do."""

    batch: rocksdict.WriteBatch  # the net writes
    result: ApplyResult
    pending: int  # the pending count after it
    lowest_put: bytes | None  # the lowest time key it writes, if any
    moved_away: list[str]  # the ids whose time key it deletes (removed or rescheduled)
    arrived: list[int]  # the due times of the time keys it adds (a new id, or one rescheduled)
    left: list[int]  # the due times of the time keys it deletes
    shadow: dict[str, bytes]  # id -> its shadow mark after it (or _UNMARKED)


@dataclass
class _ProducerWrites:
    """What one apply learns of producer writes (:meth:`TimeIndex._producer_writes`)."""

    copies: dict[int, int]  # index of an op that is a copy -> the offset of the write it copies
    records: list[tuple[bytes, bytes]]  # (identity, place) of each write seen for the first time
    newest: dict[int, int]  # partition -> newest record time, after the ops


def _malformed_key(partition: int, offset: int) -> bytes:
    return _META_MALFORMED + PLACE.pack(partition, offset)


def _check_positive(value: object, argument: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{argument} must be an int, not {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{argument} must be at least 1, got {value}")
    return value


def _holds_all(skip: Container[str], ids: Iterable[str]) -> bool:
    """Whether every one of ``ids`` is in ``skip``; a set is asked in C (the master's skip run is thousands long)."""
    if isinstance(skip, (set, frozenset)):
        return skip.issuperset(ids)
    return all(delay_id in skip for delay_id in ids)


def _shadow_mark(stored: bytes) -> bytes | None:
    return None if stored == _REPUT else stored[len(_COPY):]


class _Family(Protocol):
    """A column family of the store, as the time index uses it: keys and values are bytes.

    rocksdict's stubs type them for its default mode, where they are pickled Python values
    (a key any scalar, a value Any); the store opens every family with ``raw_mode=True``
    (:class:`StoreOptions`), where both are plain bytes.
    """

    def get(self, key: bytes) -> bytes | None: ...

    def __getitem__(self, keys: list[bytes]) -> list[bytes | None]: ...  # a multi-get

    def __setitem__(self, key: bytes, value: bytes) -> None: ...

    def put(self, key: bytes, value: bytes, write_opt: rocksdict.WriteOptions | None = None) -> None: ...

    def keys(self, *, from_key: bytes | None = None,
             read_opt: rocksdict.ReadOptions | None = None) -> Iterator[bytes]: ...

    def items(self, *, from_key: bytes | None = None,
              read_opt: rocksdict.ReadOptions | None = None) -> Iterator[tuple[bytes, bytes]]: ...

    def property_int_value(self, name: str) -> int | None: ...


class TimeIndex:
    """The time index of one node, in a RocksDB directory of its own.

    One writer: :meth:`apply` and :meth:`set_meta` must not be called from two threads at
    once (they are serialised by a lock anyway); reads (:meth:`due`, :meth:`get`, ...) may
    run in other threads meanwhile and see each batch whole or not at all.

    Args:
        path: The store's directory. Created if missing; if it exists it must be empty or
            hold a delayq store.
        options: RocksDB tuning; :class:`StoreOptions` defaults when None.
        store_format: The format of a new store, and the one an older store is migrated to
            in place when it is opened (:meth:`upgrade_format`); a store of a newer format
            than this keeps its own.

    Raises:
        TypeError: ``path``, ``options`` or ``store_format`` has the wrong type.
        ValueError: ``store_format`` is not one this code writes.
        StoreFormatError: the store is of a format this code cannot open (two or more
            formats old, or newer): delete it and rebuild it from the buffer.
        StoreError: the path is not a delayq store, is locked by another process (another
            node using the same data directory), or RocksDB fails to open it.
    """

    def __init__(self, path: Path | str, options: StoreOptions | None = None, *,
                 store_format: int = NEWEST_FORMAT):
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a str or Path, not {type(path).__name__}")
        if options is None:
            options = StoreOptions()
        elif not isinstance(options, StoreOptions):
            raise TypeError(f"options must be a StoreOptions, not {type(options).__name__}")
        _check_format(store_format)
        self.path = Path(path)
        self.options = options
        families = self._check_is_store_or_new() or _FAMILIES[store_format]
        every = options.column_families()
        try:
            self._db = rocksdict.Rdict(str(self.path), options.db_options(),
                                       column_families={name: every[name] for name in families})
        except Exception as err:  # rocksdict raises bare Exception for every RocksDB status
            raise self._open_error(err) from err
        self._closed = False
        self._cfs = {name: cast(_Family, self._db.get_column_family(name)) for name in families}
        self._handles = {name: self._db.get_column_family_handle(name) for name in families}
        self._time, self._ids = self._cfs[TIME_CF], self._cfs[IDS_CF]
        self._meta, self._offsets_cf = self._cfs[META_CF], self._cfs[OFFSETS_CF]
        self._write_opts = rocksdict.WriteOptions()
        self._write_opts.sync = options.sync_writes
        # rocksdict's stub declares disable_wal a method; the binding has a property, as for sync.
        self._write_opts.disable_wal = not options.uses_wal  # type: ignore[method-assign,assignment]
        # set_meta's values are not re-read from the buffer (a lost one would mean a rebuild): logged always.
        self._meta_write_opts = rocksdict.WriteOptions()
        self._meta_write_opts.sync = options.sync_writes

        # apply()/set_meta() hold _write_lock from their first read to their write. _view_lock
        # makes "write a batch + lower the scan start" and "read the scan start + open an
        # iterator" exclusive, so a scan never starts after a key that the iterator can see.
        self._write_lock = threading.Lock()
        self._view_lock = threading.Lock()
        # Scan state, guarded by _view_lock; _version counts applied batches, so a scan only
        # records what it learnt if no batch landed while it ran.
        # - Every time key below _scan_from is deleted: scans seek there instead of stepping
        #   over the tombstones that delivered-and-done entries leave at the front.
        # - _skipped (id -> time key, in key order) is the run of live keys at the front that
        #   the last scans found all in `skip`, up to _skipped_end. If the next `skip` still
        #   holds every one of them, the scan seeks past the run instead of reading it
        #   again: the master's skip set is exactly such a run, thousands long.
        self._version = 0
        self._scan_from = b""
        self._skipped: dict[str, bytes] = {}
        self._skipped_end: bytes | None = None
        try:
            self._load_meta(store_format)
        except BaseException:
            self._release()  # refused (a format it cannot open): the directory is unlocked, it may be deleted
            raise
        # Pending entries per minute of due time, counted once asked (pending_by_due), then kept by apply().
        self._due = DueCounts(self._view_lock, empty=self._pending == 0)

    # -- opening -------------------------------------------------------------

    def _check_is_store_or_new(self) -> tuple[str, ...] | None:
        """The column families of the store at the path (without ``default``), or None for a new store."""
        path = self.path
        if path.exists() and not path.is_dir():
            raise StoreError(f"store path {path} is a file, not a directory: set another data directory")
        if TimeIndex.exists(path):
            try:
                families = set(rocksdict.Rdict.list_cf(str(path), rocksdict.Options(raw_mode=True)))
            except Exception as err:
                raise StoreError(f"{path} looks like a RocksDB directory but cannot be read ({err}); "
                                 "if it is a delayq store, delete it (TimeIndex.destroy) and let the node "
                                 "rebuild it from the buffer topic") from err
            for known in _FAMILIES.values():
                if families == {*known, "default"}:
                    return known
            # A format-4 store half way through its migration to 5 has format 5's families.
            expected = " or ".join(str(sorted({*known, "default"})) for known in _FAMILIES.values())
            raise StoreError(f"{path} is a RocksDB database but not a delayq store (column families "
                             f"{sorted(families)}, expected {expected}): point the node at another data directory")
        if path.is_dir() and any(path.iterdir()):
            raise StoreError(f"{path} is not empty and holds no delayq store: point the node at an empty or "
                             "new directory")
        return None

    def _open_error(self, err: Exception) -> StoreError:
        text = str(err)
        # RocksDB reports every failure as a Status string; a lock conflict is the one the
        # operator can act on, and "LOCK" is in both its forms ("While lock file: .../LOCK:
        # Resource temporarily unavailable" and "lock hold by current process").
        if "LOCK" in text or "lock hold" in text:
            return StoreError(f"the store {self.path} is locked by another process or another TimeIndex in this "
                              f"one (two nodes share a data directory?): stop it, or give each node its own "
                              f"data directory ({text})")
        return StoreError(f"cannot open the store {self.path}: {text}; if it is damaged, delete it "
                          "(TimeIndex.destroy) and let the node rebuild it from the buffer topic")

    def _load_meta(self, store_format: int) -> None:
        marker = self._meta.get(_META_FORMAT)
        if marker is None:
            # A new store, or one whose creation stopped before this first write.
            if next(iter(self._time.keys()), None) is not None:
                raise StoreError(f"{self.path} has delayq column families and data but no format marker: "
                                 "delete it (TimeIndex.destroy) and rebuild it from the buffer topic")
            if WRITTEN_CF in self._cfs:
                store_format = max(store_format, 5)
            self._meta[_META_FORMAT] = _format_marker(store_format)
            self._format = store_format
        else:
            self._format = self._stored_format(marker)
        self._found_format = self._format
        self._place_written()
        pending = self._meta.get(_META_PENDING)
        self._pending = int.from_bytes(pending, "big") if pending is not None else 0
        last = self._meta.get(_META_LAST_INGEST)
        self._last_ingest = int.from_bytes(last, "big") if last is not None else None
        self._offsets = {int.from_bytes(k, "big"): int.from_bytes(v, "big") for k, v in self._offsets_cf.items()}
        self._shadowed: dict[str, bytes | None] = {
            key[len(_META_SHADOWED):].decode("ascii"): _shadow_mark(value)
            for key, value in self._meta_items(_META_SHADOWED)}
        self._malformed = sum(1 for _ in self._meta_items(_META_MALFORMED))
        # partition -> the newest record time read there (the record time copies are judged by).
        self._newest: dict[int, int] = {
            int.from_bytes(key[len(_META_NEWEST):], "big"): int.from_bytes(value, "big")
            for key, value in self._meta_items(_META_NEWEST)}
        # Writes recorded below this time are gone (a range delete, once per apply that moves it on).
        self._writes_pruned_to = 0
        # A migration to 5 that stopped half way (the family is there, the marker still says 4) goes on
        # whatever the format asked for: the cluster was finalized at the level of format 5 when it began.
        if self._format < store_format or self._moving:
            self._begin_move()
            while not self._move_some():
                pass

    def _stored_format(self, marker: bytes) -> int:
        """The store format ``marker`` names, if this code opens it.

        Raises:
            StoreFormatError: the format is unknown, newer, or older than :data:`OLDEST_FORMAT`.
        """
        number = marker[len(_FORMAT_MARKER):] if marker.startswith(_FORMAT_MARKER) else b""
        if not number.isdigit():
            raise StoreFormatError(f"{self.path} has the format marker {marker!r:.60}, which no delayq writes: "
                                   "delete the store and let the node rebuild it from the buffer topic")
        found = int(number)
        if found > NEWEST_FORMAT:
            raise StoreFormatError(f"{self.path} has store format {found}, written by a newer delayq; this one "
                                   f"opens formats {OLDEST_FORMAT} to {NEWEST_FORMAT}: run that delayq or a newer "
                                   "one, or delete the store and let the node rebuild it from the buffer topic")
        if found < OLDEST_FORMAT:
            raise StoreFormatError(f"{self.path} has store format {found}, two or more formats older than this "
                                   f"delayq's {NEWEST_FORMAT}, which migrates only format {OLDEST_FORMAT} in place: "
                                   "it is rebuilt from the buffer topic")
        return found

    def _place_written(self) -> None:
        """Where the producer writes live: meta under sys/written/ (format 4), or their family (5, and while a
        migration to 5 moves them, when those still in meta are looked up there too: ``_moving``)."""
        self._moving = self._format == 4 and WRITTEN_CF in self._cfs
        if self._format >= 5 or self._moving:
            self._written_family, self._written_prefix = WRITTEN_CF, b""
        else:
            self._written_family, self._written_prefix = META_CF, _META_WRITTEN

    @property
    def store_format(self) -> int:
        """The store's format (see the module's docstring): 4 or 5."""
        return self._format

    @property
    def migrating(self) -> bool:
        """Whether a migration to a newer format is under way (:meth:`upgrade_format`, between its batches)."""
        return self._moving

    @property
    def found_format(self) -> int:
        """The format the store had when it was opened (older than :attr:`store_format` if the open migrated it)."""
        return self._found_format

    def upgrade_format(self, store_format: int, *, batch: int = MIGRATE_BATCH) -> int | None:
        """Migrate the store in place to ``store_format``, while other threads use it.

        Format 4 to 5 moves the producer writes (the last minutes' of them) from meta to
        their own column family. New writes go to the family at once, and a lookup finds
        the ones not moved yet in meta; the move takes batches of ``batch`` entries,
        each under the write lock, so :meth:`apply` waits for one batch at a time, never
        for the whole move. Crash-safe: each batch puts entries in the family and deletes
        them from meta together, through the WAL; the format marker changes with the last,
        and a store opened with the family there and the marker at 4 finishes the move.

        Returns:
            The format the store had, or None when it is at ``store_format`` or newer already.

        Raises:
            TypeError, ValueError: ``store_format`` is not one this code writes, or ``batch`` is below 1.
            StoreError: the store is closed or RocksDB failed (the store is still of its old format).
        """
        _check_format(store_format)
        if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
            raise ValueError(f"batch must be an int of at least 1, got {batch!r}")
        with self._write_lock:
            self._check_open()
            if self._format >= store_format:
                return None
            before = self._format
            self._begin_move()
        done = False
        while not done:
            started = time.monotonic()
            with self._write_lock:
                self._check_open()
                done = self._move_some(batch)
            # A lock is not fair: re-taken at once, a waiting apply() would seldom get it. Waiting as long as the
            # batch took lets the writers have at least half the time until the move is done.
            time.sleep(min(time.monotonic() - started, 0.05))
        return before

    def _begin_move(self) -> None:
        """Format 4 to 5 (the only step there is), first part: the written family, where new writes go from now on."""
        if WRITTEN_CF not in self._cfs:
            try:
                self._db.create_column_family(WRITTEN_CF, self.options.column_families()[WRITTEN_CF])
            except Exception as err:
                raise StoreError(f"migrating the store {self.path} from format 4 to 5 failed, it is still of format "
                                 f"4: {err}") from err
            self._cfs[WRITTEN_CF] = cast(_Family, self._db.get_column_family(WRITTEN_CF))
            self._handles[WRITTEN_CF] = self._db.get_column_family_handle(WRITTEN_CF)
        self._place_written()

    def _move_some(self, limit: int = MIGRATE_BATCH) -> bool:
        """Move up to ``limit`` producer writes from meta to their family in one batch; when none is left,
        mark the store format 5. Whether the move is done."""
        written_cf, meta_cf = self._handles[WRITTEN_CF], self._handles[META_CF]
        batch = rocksdict.WriteBatch(raw_mode=True)
        last = None
        for count, (key, place) in enumerate(self._meta_items(_META_WRITTEN), start=1):
            batch.put(key[len(_META_WRITTEN):], place, written_cf)
            last = key
            if count == limit:
                break
        if last is not None:
            batch.delete_range(_META_WRITTEN, last + b"\0", meta_cf)
        else:
            batch.put(_META_FORMAT, _format_marker(5), meta_cf)
        try:
            # Through the WAL: a crash keeps each batch whole, and never the marker without the writes moved.
            self._db.write(batch, self._meta_write_opts)
        except Exception as err:
            raise StoreError(f"migrating the store {self.path} from format 4 to 5 failed, it is still of format 4 "
                             f"(the next open goes on with it): {err}") from err
        if last is not None:
            return False
        self._format = 5
        self._place_written()
        return True

    # -- writing -------------------------------------------------------------

    def apply(self, ops: Iterable[StoreOp], offsets: Mapping[int, int], *,
              ingested_at_ms: int | None = None) -> ApplyResult:
        """Apply buffer records and advance the buffer offsets, atomically.

        Ops take effect in order: a later op sees the earlier ones (a put then a remove
        of one id leaves nothing; two puts leave the second). Everything, including the
        id index, the pending count, the offsets and ``ingested_at_ms``, goes into one
        RocksDB WriteBatch: after a crash the store holds all of it or none of it, so the
        stored offsets always say exactly which records the store reflects.

        Args:
            ops: Puts, removes and malformed records, in buffer order.
            offsets: Buffer partition -> next offset to read. Merged with the stored
                offsets; an offset lower than the stored one is ignored (offsets only rise).
            ingested_at_ms: Wall-clock time of this ingest, kept for :meth:`last_ingest_ms`.

        Returns:
            Counts of what the ops did.

        Raises:
            TypeError: an op is not a Put, Remove or Malformed, or an argument has the wrong type.
            ValueError: a partition or offset is out of range. Nothing is written then.
            StoreError: the store is closed or RocksDB failed to write (nothing was written).
        """
        ops = self._check_ops(ops)
        new_offsets = self._check_offsets(offsets)
        if ingested_at_ms is not None:
            check_ms(ingested_at_ms, "ingested_at_ms")
        with self._write_lock:
            self._check_open()
            writes = self._producer_writes(ops)
            plan = self._plan(ops, writes.copies)
            batch, result, pending, shadow = plan.batch, plan.result, plan.pending, plan.shadow
            pruned_to = self._record_writes(batch, writes)
            meta_cf = self._handles[META_CF]
            malformed = 0
            for op in ops:
                if type(op) is Malformed:
                    batch.put(_malformed_key(op.partition, op.offset), op.payload, meta_cf)
                    malformed += 1
            merged = dict(self._offsets)
            offsets_cf = self._handles[OFFSETS_CF]
            for partition, offset in new_offsets.items():
                if offset > merged.get(partition, -1):
                    merged[partition] = offset
                    batch.put(partition.to_bytes(4, "big"), _u64(offset), offsets_cf)
            if pending != self._pending:
                batch.put(_META_PENDING, _u64(pending), meta_cf)
            if ingested_at_ms is not None:
                batch.put(_META_LAST_INGEST, _u64(ingested_at_ms), meta_cf)
            if batch.is_empty():
                return result
            with self._view_lock:
                self._before_write(plan.lowest_put, plan.moved_away)
                try:
                    self._db.write(batch, self._write_opts)
                except Exception as err:
                    raise StoreError(f"writing a batch of {len(ops)} ops to {self.path} failed, nothing was "
                                     f"applied: {err}") from err
                self._pending = pending
                self._due.changed(plan.arrived, plan.left)
                self._offsets = merged
                self._newest = writes.newest
                self._writes_pruned_to = pruned_to
                self._malformed += malformed
                for delay_id, mark in shadow.items():
                    if mark is _UNMARKED:
                        self._shadowed.pop(delay_id, None)
                    else:
                        self._shadowed[delay_id] = _shadow_mark(mark)
                if ingested_at_ms is not None:
                    self._last_ingest = ingested_at_ms
        return result

    @staticmethod
    def _check_ops(ops: Iterable[StoreOp]) -> list[StoreOp]:
        # A lone op is a (named) tuple, iterable too: refused as what it is, not read as its fields.
        if isinstance(ops, (str, bytes, Put, Remove, Malformed)) or not isinstance(ops, Iterable):
            raise TypeError(f"ops must be an iterable of Put/Remove/Malformed, not {type(ops).__name__}")
        ops = list(ops)
        for index, op in enumerate(ops):
            if type(op) is not Put and type(op) is not Remove and type(op) is not Malformed:
                raise TypeError(f"ops[{index}] must be a Put, Remove or Malformed, not {type(op).__name__}")
        return ops

    @staticmethod
    def _check_offsets(offsets: Mapping[int, int]) -> dict[int, int]:
        if not isinstance(offsets, Mapping):
            raise TypeError(f"offsets must be a mapping partition -> next offset, not {type(offsets).__name__}")
        for partition, offset in offsets.items():
            if not isinstance(partition, int) or isinstance(partition, bool):
                raise TypeError(f"offsets: partition {partition!r} must be an int")
            if not 0 <= partition <= MAX_PARTITION:
                raise ValueError(f"offsets: partition {partition} is outside [0, 2**31)")
            if not isinstance(offset, int) or isinstance(offset, bool):
                raise TypeError(f"offsets[{partition}] must be an int, not {type(offset).__name__}")
            if not 0 <= offset <= MAX_DELIVER_AT_MS:
                raise ValueError(f"offsets[{partition}] = {offset} is outside [0, 2**63)")
        return dict(offsets)

    def _before_write(self, lowest_put: bytes | None, moved_away: list[str]) -> None:
        """Keep the scan state true for the batch about to be written (under _view_lock).

        Args:
            lowest_put: The lowest time key the batch writes, if any.
            moved_away: Ids whose time key the batch deletes (removed or rescheduled).
        """
        self._version += 1
        if lowest_put is not None:
            if lowest_put < self._scan_from:
                self._scan_from = lowest_put
            if self._skipped_end is not None and lowest_put <= self._skipped_end:
                # A new entry inside the run (e.g. a short delay already due): the run now
                # ends before it, the rest of the old run is read again by the next scan.
                kept = {}
                for delay_id, key in self._skipped.items():
                    if key >= lowest_put:
                        break
                    kept[delay_id] = key
                self._skipped = kept
                self._skipped_end = next(reversed(kept.values())) if kept else None
        if self._skipped:
            for delay_id in moved_away:
                self._skipped.pop(delay_id, None)

    def _plan(self, ops: list[StoreOp], copies: Mapping[int, int]) -> _Plan:
        """The WriteBatch that takes the store from its state to the state after ``ops``.

        The ops are replayed on an in-memory view of the ids they touch, so later ops see
        earlier ones; only the net difference per id is written. ``copies``: the ops that are
        copies of a producer write (index -> the offset of the write they copy).
        """
        touched = list(dict.fromkeys(op.delay_id for op in ops if op.delay_id is not None))
        id_keys = [delay_id.encode("ascii") for delay_id in touched]
        stored = self._multi_get(IDS_CF, id_keys)
        # before[id] = (deliver_at_ms, version) as stored, or None.
        before: dict[str, tuple[int, int] | None] = {
            delay_id: None if raw is None else _id_value.unpack(raw) for delay_id, raw in zip(touched, stored)
        }
        # A put at the stored time is a no-op only if its payload matches too.
        # same_time[id] = the stored time of a put's id, when the put has that time too.
        same_time = {op.delay_id: at[0] for op in ops
                     if type(op) is Put and (at := before[op.delay_id]) is not None and at[0] == op.deliver_at_ms}
        stored_payload: dict[str, bytes | None] = {}
        if same_time:
            names = list(same_time)
            keys = [_time_key(at_ms, name.encode("ascii")) for name, at_ms in same_time.items()]
            stored_payload = dict(zip(names, self._multi_get(TIME_CF, keys), strict=True))

        # now[id] = (deliver_at_ms, version, payload) or None; payload None = as stored.
        now: dict[str, tuple[int, int, bytes | None] | None] = {
            delay_id: None if at is None else (at[0], at[1], stored_payload.get(delay_id))
            for delay_id, at in before.items()
        }
        # Shadow marks after the ops (stored value, or _UNMARKED): any record of an id after
        # the one that shadowed it settles it again, unless it shadows it anew.
        shadow: dict[str, bytes] = {}
        added = moved = removed = unchanged = kept = 0
        for index, op in enumerate(ops):
            if type(op) is Malformed:
                if op.delay_id is not None and now[op.delay_id] is not None:
                    # The id's newest record is one no node applies: write the stored put again.
                    shadow[op.delay_id] = _REPUT
                continue
            current = now[op.delay_id]
            if index in copies:
                # A write applied already, appended again by the client library: no write, but
                # the id's newest record. Pending: write the stored put again (after it). A put's
                # copy, nothing pending: close the copy with a done. A cancel's: nothing to do.
                if current is not None:
                    shadow[op.delay_id] = _REPUT
                elif type(op) is Put:
                    shadow[op.delay_id] = _COPY + op.payload
                else:
                    shadow[op.delay_id] = _UNMARKED
                # Counted as what it leaves: the version it copies still stored, or nothing, is unchanged.
                if (current is None) if type(op) is Remove else (current is not None and current[1] == copies[index]):
                    unchanged += 1
                else:
                    kept += 1
                continue
            if type(op) is Put and op.restores is not None and (current is None or current[1] != op.restores):
                # A stale copy: nothing of it is stored, but it is now the id's newest record.
                # Pending: write the stored put again; not pending: close the copy with a done.
                shadow[op.delay_id] = _REPUT if current is not None else _COPY + op.payload
                kept += 1
                continue
            if type(op) is Put:
                shadow[op.delay_id] = _UNMARKED
                if current is None:
                    added += 1
                elif current[0] != op.deliver_at_ms or current[1] != op.version or current[2] != op.payload:
                    moved += 1
                else:
                    unchanged += 1
                    continue
                now[op.delay_id] = (op.deliver_at_ms, op.version, op.payload)
            elif current is None:
                shadow[op.delay_id] = _UNMARKED
                unchanged += 1
            elif op.version is not None and op.version < current[1]:
                shadow[op.delay_id] = _REPUT
                kept += 1
            else:
                shadow[op.delay_id] = _UNMARKED
                removed += 1
                now[op.delay_id] = None

        batch = rocksdict.WriteBatch(raw_mode=True)
        time_cf, ids_cf, meta_cf = self._handles[TIME_CF], self._handles[IDS_CF], self._handles[META_CF]
        pending = self._pending
        lowest_put: bytes | None = None
        moved_away: list[str] = []
        arrived: list[int] = []
        left: list[int] = []
        for delay_id, id_key in zip(touched, id_keys):
            mark = shadow.get(delay_id)
            if mark is _UNMARKED:
                if delay_id in self._shadowed:
                    batch.delete(_META_SHADOWED + id_key, meta_cf)
            elif mark is not None:
                batch.put(_META_SHADOWED + id_key, mark, meta_cf)
            old, new = before[delay_id], now[delay_id]
            if new is None:
                if old is not None:
                    batch.delete(_time_key(old[0], id_key), time_cf)
                    batch.delete(id_key, ids_cf)
                    moved_away.append(delay_id)
                    left.append(old[0])
                    pending -= 1
                continue
            new_at, new_version, payload = new
            if old is not None and old == (new_at, new_version) and payload == stored_payload.get(delay_id):
                continue
            if old is None:
                pending += 1
                arrived.append(new_at)
            elif old[0] != new_at:
                batch.delete(_time_key(old[0], id_key), time_cf)
                moved_away.append(delay_id)
                left.append(old[0])
                arrived.append(new_at)
            key = _time_key(new_at, id_key)
            batch.put(key, payload, time_cf)
            if old != (new_at, new_version):
                batch.put(id_key, _id_value.pack(new_at, new_version), ids_cf)
            if lowest_put is None or key < lowest_put:
                lowest_put = key
        result = ApplyResult(added, moved, removed, unchanged, kept, len(copies))
        return _Plan(batch, result, pending, lowest_put, moved_away, arrived, left, shadow)

    def _producer_writes(self, ops: list[StoreOp]) -> _ProducerWrites:
        """Which of ``ops`` are copies of a producer write applied before, and what to record of the others.

        A write is a copy when a write of its identity (id, value, headers, timestamp: the
        digest) was read at another place, and its timestamp is at most ``COPY_WINDOW_MS``
        older than the newest record time read on its partition: every node decides it
        from the buffer alone, the same way live and in a rebuild.
        """
        writes = _ProducerWrites({}, [], self._newest)
        indexed = [(index, op.written) for index, op in enumerate(ops)
                   if type(op) is not Malformed and op.written is not None]
        if not indexed:
            return writes
        newest = writes.newest = dict(self._newest)
        prefix = self._written_prefix
        found = self._multi_get(self._written_family, [prefix + written[WRITTEN_PLACE:] for _, written in indexed])
        if self._moving:  # a migration to format 5 under way: the writes not moved yet are in meta
            missed = [i for i, place in enumerate(found) if place is None]
            in_meta = self._multi_get(META_CF, [_META_WRITTEN + indexed[i][1][WRITTEN_PLACE:] for i in missed])
            for i, place in zip(missed, in_meta, strict=True):
                found[i] = place
        in_batch: dict[bytes, bytes] = {}
        for (index, written), stored_place in zip(indexed, found, strict=True):
            partition, _, timestamp_ms, _ = WRITTEN.unpack(written)
            if timestamp_ms > newest.get(partition, 0):
                newest[partition] = timestamp_ms
            identity, place = written[WRITTEN_PLACE:], written[:WRITTEN_PLACE]
            first = in_batch.get(identity, stored_place)
            if first is not None and first != place and timestamp_ms >= newest[partition] - COPY_WINDOW_MS:
                writes.copies[index] = PLACE.unpack(first)[1]
            else:
                in_batch[identity] = place
                writes.records.append((identity, place))
        return writes

    def _record_writes(self, batch: rocksdict.WriteBatch, writes: _ProducerWrites) -> int:
        """Add the producer writes and the newest record times to ``batch``; drop writes too old for a copy.

        Returns:
            The time below which no producer write is kept once ``batch`` is written.
        """
        meta_cf, written_cf, prefix = self._handles[META_CF], self._handles[self._written_family], self._written_prefix
        for identity, place in writes.records:
            batch.put(prefix + identity, place, written_cf)
        for partition, timestamp_ms in writes.newest.items():
            if self._newest.get(partition) != timestamp_ms:
                batch.put(_META_NEWEST + partition.to_bytes(4, "big"), _u64(timestamp_ms), meta_cf)
        # A copy's timestamp is within the window of its own partition's newest; kept twice as long
        # below the newest of any partition, a write is gone only where a copy could not be
        # recognised anyway, unless a partition's record time lags the others' by a whole window.
        prune_to = max(writes.newest.values(), default=0) - 2 * COPY_WINDOW_MS
        if prune_to - self._writes_pruned_to < COPY_WINDOW_MS // 10:
            return self._writes_pruned_to
        batch.delete_range(prefix, prefix + _u64(prune_to), written_cf)
        if self._moving:
            batch.delete_range(_META_WRITTEN, _META_WRITTEN + _u64(prune_to), meta_cf)
        return prune_to

    def _multi_get(self, family: str, keys: list[bytes]) -> list[bytes | None]:
        if not keys:
            return []
        try:
            return self._cfs[family][keys]
        except Exception as err:
            raise StoreError(f"reading the {family} column family of {self.path} failed: {err}") from err

    def set_meta(self, name: str, value: bytes) -> None:
        """Store ``value`` under ``name`` (e.g. the identity of the buffer topic this store reflects).

        Raises:
            TypeError: ``name`` is not a str or ``value`` not bytes.
            ValueError: ``name`` is empty.
            StoreError: the store is closed or the write failed.
        """
        key = self._user_meta_key(name)
        if not isinstance(value, bytes):
            raise TypeError(f"value must be bytes, not {type(value).__name__}")
        with self._write_lock:
            self._check_open()
            try:
                self._meta.put(key, value, self._meta_write_opts)
            except Exception as err:
                raise StoreError(f"writing meta {name!r} to {self.path} failed: {err}") from err

    # -- reading -------------------------------------------------------------

    def due(self, up_to_ms: int, limit: int, *, skip: Container[str] = ()) -> list[StoredEntry]:
        """The earliest entries due at or before ``up_to_ms``, in (deliver_at_ms, delay_id) order.

        Args:
            up_to_ms: Include entries with ``deliver_at_ms <= up_to_ms``.
            limit: At most this many entries.
            skip: Ids to leave out, e.g. those delivered whose `done` has not been read
                back yet. Use a set: it is probed once per scanned entry.

        Raises:
            TypeError, ValueError: ``up_to_ms`` is not a time in [0, 2**63) or ``limit`` not an int >= 0.
            StoreError: the store is closed or RocksDB failed to read.
        """
        check_ms(up_to_ms, "up_to_ms")
        if not isinstance(limit, int) or isinstance(limit, bool):
            raise TypeError(f"limit must be an int, not {type(limit).__name__}")
        if limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        if limit == 0:
            self._check_open()
            return []
        entries = []
        with closing(self._scan(up_to_ms, skip)) as scan:
            for delay_id, key, payload in scan:
                entries.append(StoredEntry(delay_id, _key_time(key)[0], payload))
                if len(entries) == limit:
                    break
        return entries

    def next_due_ms(self, *, skip: Container[str] = ()) -> int | None:
        """The earliest ``deliver_at_ms`` stored (leaving out ids in ``skip``), or None when empty.

        Raises:
            StoreError: the store is closed or RocksDB failed to read.
        """
        with closing(self._scan(None, skip)) as scan:
            for _, key, _ in scan:
                return _key_time(key)[0]
        return None

    def _scan(self, up_to_ms: int | None, skip: Container[str]) -> Generator[tuple[str, bytes, bytes], None, None]:
        """(delay id, time key, payload) from the front, up to ``up_to_ms`` if given, minus ``skip``."""
        read_opts = rocksdict.ReadOptions()
        upper = None
        if up_to_ms is not None and up_to_ms < MAX_DELIVER_AT_MS:
            upper = _u64(up_to_ms + 1)
            # Only the upper bound: rocksdict 0.3.x's set_iterate_lower_bound sets the upper
            # bound instead; the lower bound is the seek position (from_key) below.
            read_opts.set_iterate_upper_bound(upper)
        with self._view_lock:
            self._check_open()
            version = self._version
            end = self._skipped_end
            # Just past the cached skipped run, if `skip` still holds all of it; else None.
            resumed_at = None
            if end is not None and _holds_all(skip, self._skipped):
                resumed_at = end + b"\x00"
            # What this scan adds to the run (merged into the cached one by _learn, not copied:
            # a master holding back a long run, a dispatch limit's backlog, scans it very often).
            run: dict[str, bytes] = {}
            seek = self._scan_from if resumed_at is None else resumed_at
            try:
                items = self._time.items(from_key=seek, read_opt=read_opts)
            except Exception as err:
                raise StoreError(f"reading the time index of {self.path} failed: {err}") from err
        first = last = None
        in_run = True
        try:
            for key, payload in items:
                if first is None:
                    first = key
                delay_id = key[8:].decode("ascii")
                if delay_id in skip:
                    if in_run:
                        run[delay_id] = last = key
                    continue
                in_run = False
                yield delay_id, key, payload
        finally:
            with self._view_lock:
                if self._version == version and not self._closed:
                    self._learn(resumed_at, first, upper, run, last)

    def _learn(self, resumed_at: bytes | None, first: bytes | None, upper: bytes | None,
               run: dict[str, bytes], last: bytes | None) -> None:
        """Record what a scan found at the front (under _view_lock, no batch written since).

        Args:
            resumed_at: Where the scan sought past the cached skipped run, or None if it
                started at _scan_from.
            first: The first key the scan saw, if any.
            upper: The scan's exclusive upper bound, if any.
            run: The skipped keys this scan found at the front: they extend the cached run if it
                resumed past it, else they are the run.
            last: The last key this scan added to the run, if any.
        """
        if resumed_at is not None:
            self._skipped.update(run)
            run = self._skipped
        # Keys that are not live: everything before the run, or before the first key seen,
        # or (nothing seen) everything below the bound.
        lowest = next(iter(run.values())) if run else first if first is not None else upper
        if lowest is not None and lowest > self._scan_from:
            self._scan_from = lowest
        self._skipped = run
        if last is not None:
            self._skipped_end = last
        elif resumed_at is not None:
            self._skipped_end = resumed_at[:-1]
        else:
            self._skipped_end = None

    def pending_by_due(self, now_ms: int, days: int) -> PendingByDue | None:
        """The pending entries by due time around ``now_ms``: the last minutes, the next hour, ``days`` days, later.

        From counts kept in memory (store/pending_by_due.py): a call costs a pass over the
        minutes that have entries, never a read of the store. The first call starts counting
        the store in a thread (:meth:`count_pending_by_due` starts it before) and answers
        None until that has ended; :attr:`pending_counted` tells how far it is.

        Raises:
            TypeError, ValueError: ``now_ms`` is not a time in [0, 2**63) or ``days`` not in [1, 31].
            StoreError: the store is closed, or the count failed (the next call counts again).
        """
        check_ms(now_ms, "now_ms")
        check_days(days)
        with self._view_lock:
            self._check_open()
            tally = self._due.tally()
            if tally is None:
                self._count_due()
                return None
        counts, emptied = tally.net()  # outside the lock: a pass over every minute with entries
        if emptied:
            with self._view_lock:
                self._due.forget(emptied)
        return summarize(counts, now_ms, days)

    def count_pending_by_due(self) -> None:
        """Start counting the pending entries by due time now, in a thread, if not counted or counting yet.

        Raises:
            StoreError: the store is closed, or the last count failed (this call counts again).
        """
        with self._view_lock:
            self._check_open()
            if not self._due.known:
                self._count_due()

    @property
    def pending_counted(self) -> int:
        """How many entries the running count of :meth:`pending_by_due` has counted so far."""
        return self._due.counted

    def _count_due(self) -> None:
        """Start the count's pass over a snapshot of the time keys (under _view_lock: no batch lands meanwhile)."""
        if self._due.counting:
            return
        failure = self._due.take_failure()
        read_opts = rocksdict.ReadOptions()
        # One pass over everything would push the hot blocks out of the cache. (rocksdict's stub forgets the argument.)
        read_opts.fill_cache(False)  # type: ignore[call-arg]
        try:
            # Every key below _scan_from is deleted: the pass starts past the tombstones at the front.
            keys = self._time.keys(from_key=self._scan_from, read_opt=read_opts)
        except Exception as err:
            raise StoreError(f"reading the time index of {self.path} failed: {err}") from err
        self._due.start(keys, f"count-due-{self.path.name}")
        if failure is not None:
            raise StoreError(f"counting the pending entries of {self.path} by due time failed ({failure}); "
                             "counting again")

    def upcoming(self, after: tuple[int, str] | None, limit: int, *, keep: Callable[[bytes], bool] | None = None,
                 scan_limit: int | None = None) -> Upcoming:
        """The entries after ``after`` in due order (time, then id), ``limit`` at most: a page of what falls due next.

        A page goes on where the last one ended (its ``next``), never counting or reading the
        store from its front again. ``keep`` picks entries by their stored value (the caller
        decodes it: a node filters by topic); ``scan_limit`` bounds how many entries one
        call looks at, so a filter that matches little answers with what it found and where
        to go on, instead of reading the whole store.

        Args:
            after: ``(deliver_at_ms, delay_id)`` of the entry before the page (excluded); None: from the first.
            limit: At most this many entries, at least 1.
            keep: Whether an entry's stored value belongs on the page; None: every entry.
            scan_limit: At most this many entries looked at (kept or not); None: no bound.

        Returns:
            The entries (version 0: the time index does not hold it, the stored value does), the
            ``(deliver_at_ms, delay_id)`` to go on from (None once past the last entry), and how
            many entries were looked at.

        Raises:
            TypeError, ValueError: an argument has the wrong type or is out of range.
            StoreError: the store is closed or RocksDB failed to read.
        """
        seek = None
        if after is not None:
            if not isinstance(after, tuple) or len(after) != 2:
                raise TypeError(f"after must be a (deliver_at_ms, delay_id) tuple or None, not {after!r:.80}")
            # The smallest key above the one named: that key with a 0 byte after it.
            seek = _time_key(check_ms(after[0], "after[0]"), check_id(after[1], "after[1]").encode("ascii")) + b"\0"
        _check_positive(limit, "limit")
        if scan_limit is not None:
            _check_positive(scan_limit, "scan_limit")
        with self._view_lock:
            self._check_open()
            if seek is None or seek < self._scan_from:
                seek = self._scan_from
            try:
                items = self._time.items(from_key=seek)
            except Exception as err:
                raise StoreError(f"reading the time index of {self.path} failed: {err}") from err
        entries: list[StoredEntry] = []
        scanned = 0
        last = b""
        for key, payload in items:
            if len(entries) == limit or scanned == scan_limit:
                # There is more: the next page starts after the last entry looked at.
                return Upcoming(entries, (_key_time(last)[0], last[8:].decode("ascii")), scanned)
            scanned += 1
            last = key
            if keep is None or keep(payload):
                entries.append(StoredEntry(key[8:].decode("ascii"), _key_time(key)[0], payload))
        return Upcoming(entries, None, scanned)

    def get(self, delay_id: str) -> StoredEntry | None:
        """The stored entry of ``delay_id``, or None if it is not pending.

        Raises:
            TypeError, ValueError: ``delay_id`` is not a non-empty ASCII str.
            StoreError: the store is closed or RocksDB failed to read.
        """
        id_key = check_id(delay_id).encode("ascii")
        self._check_open()
        # The two reads are not one snapshot: an apply() may move the entry in between,
        # so look again at its new time (a move always rewrites the id index).
        for _ in range(3):
            raw = self._ids.get(id_key)
            if raw is None:
                return None
            deliver_at_ms, version = _id_value.unpack(raw)
            payload = self._time.get(_time_key(deliver_at_ms, id_key))
            if payload is not None:
                return StoredEntry(delay_id, deliver_at_ms, payload, version)
        raise StoreError(f"{delay_id} kept moving while being read from {self.path}; the id index and the "
                         "time index may disagree: rebuild the store from the buffer topic")

    def shadowed(self) -> dict[str, bytes | None]:
        """Ids whose newest buffer record does not say what is stored of them, and what would.

        Compaction keeps only the newest record of a key. ``None``: the id is pending here,
        but a `done` of an older version (or a stale copy) follows its put in the buffer;
        the master writes the stored put again. Bytes: nothing is pending, but a master's
        copy is the id's newest record; the value is that copy's payload (as its
        :class:`Put` had it), and the master closes the copy with a `done` of its version.
        The mark goes when ingest reads any later record of the id.
        """
        self._check_open()
        return dict(self._shadowed)

    def _meta_items(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """The meta entries whose key starts with ``prefix``, in key order (and none after them)."""
        for key, value in self._meta.items(from_key=prefix):
            if not key.startswith(prefix):
                return
            yield key, value

    @property
    def malformed_count(self) -> int:
        """How many malformed records wait to be dead-lettered (kept as a counter)."""
        self._check_open()
        return self._malformed

    def malformed(self, limit: int = 1000) -> list[MalformedEntry]:
        """Up to ``limit`` malformed records waiting to be dead-lettered, by partition, then offset."""
        self._check_open()
        found: list[MalformedEntry] = []
        for key, value in self._meta_items(_META_MALFORMED):
            if len(found) >= limit:
                break
            partition, offset = PLACE.unpack_from(key, len(_META_MALFORMED))
            found.append(MalformedEntry(partition, offset, value))
        return found

    def forget_malformed(self, handled: Mapping[int, int]) -> int:
        """Drop the malformed records below ``handled`` (partition -> offset): the cluster has dead-lettered them.

        Returns:
            How many were dropped.
        """
        with self._write_lock:
            self._check_open()
            batch = rocksdict.WriteBatch(raw_mode=True)
            meta_cf = self._handles[META_CF]
            dropped = kept = 0
            for key, _ in self._meta_items(_META_MALFORMED):
                partition, offset = PLACE.unpack_from(key, len(_META_MALFORMED))
                if offset < handled.get(partition, 0):
                    batch.delete(key, meta_cf)
                    dropped += 1
                else:
                    kept += 1
            if dropped:
                try:
                    self._db.write(batch, self._write_opts)
                except Exception as err:
                    raise StoreError(f"dropping dead-lettered records from {self.path} failed: {err}") from err
            # Recounted, not decremented: a record read twice (a rebuild racing this) is one key.
            self._malformed = kept
        return dropped

    def pending_count(self) -> int:
        """How many entries are stored (kept as a counter, not counted)."""
        self._check_open()
        return self._pending

    def flushing(self) -> bool:
        """Whether RocksDB is still flushing memtables in the background (one runs, or a full memtable waits).

        Raises:
            StoreError: the store is closed.
        """
        self._check_open()
        return bool(self._db.property_int_value("rocksdb.num-running-flushes")
                    or any(family.property_int_value("rocksdb.num-immutable-mem-table")
                           for family in self._cfs.values()))

    def offsets(self) -> dict[int, int]:
        """Buffer partition -> next offset to read, as of the last applied batch."""
        self._check_open()
        return dict(self._offsets)

    def last_ingest_ms(self) -> int | None:
        """The ``ingested_at_ms`` of the last batch that gave one, or None if none did."""
        self._check_open()
        return self._last_ingest

    def get_meta(self, name: str) -> bytes | None:
        """The value :meth:`set_meta` stored under ``name``, or None.

        Raises:
            TypeError, ValueError: ``name`` is not a non-empty str.
        """
        key = self._user_meta_key(name)
        self._check_open()
        return self._meta.get(key)

    @staticmethod
    def _user_meta_key(name: str) -> bytes:
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, not {type(name).__name__}")
        if not name:
            raise ValueError("name must not be empty")
        return _USER_META + name.encode("utf-8")

    # -- lifecycle -----------------------------------------------------------

    def checkpoint(self, dest: Path | str) -> Path:
        """A consistent copy of the store at ``dest`` (hard links where the filesystem allows).

        The copy opens as a :class:`TimeIndex` with the same entries, offsets and meta.

        Raises:
            TypeError: ``dest`` is not a str or Path.
            FileExistsError: ``dest`` exists already.
            StoreError: the store is closed or RocksDB failed to make the checkpoint.
        """
        if not isinstance(dest, (str, os.PathLike)):
            raise TypeError(f"dest must be a str or Path, not {type(dest).__name__}")
        dest = Path(dest)
        if dest.exists():
            raise FileExistsError(f"checkpoint destination {dest} exists already: give a new path")
        self._check_open()
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            rocksdict.Checkpoint(self._db).create_checkpoint(str(dest))
        except Exception as err:
            raise StoreError(f"checkpoint of {self.path} into {dest} failed: {err}") from err
        return dest

    def flush(self) -> None:
        """Persist every batch applied so far, all column families together: a crash keeps them from now on.

        Batches skip the WAL (:attr:`StoreOptions.wal`), so until RocksDB flushes a full
        memtable they are in memory only, and a quiet node that crashes would roll back
        far (ingest calls this every few minutes). rocksdict has no flush of several
        column families at once; a checkpoint flushes them all (atomically, under
        atomic_flush), and its scratch copy, hard links beside the store, is deleted at once.
        Does nothing when batches go through the WAL.

        Raises:
            StoreError: the store is closed or the flush failed.
        """
        if self.options.uses_wal:
            return
        scratch = self.path.parent / f".{self.path.name}.flush"
        shutil.rmtree(scratch, ignore_errors=True)
        try:
            self.checkpoint(scratch)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def close(self) -> None:
        """Release the directory lock; RocksDB flushes the memtables first (batches skip the WAL). Idempotent."""
        self._due.stop()  # before the locks: a count that ends takes the view lock
        with self._write_lock, self._view_lock:
            if self._closed:
                return
            self._closed = True
            self._release()

    def _release(self) -> None:
        """Close the database after dropping every reference to it: RocksDB releases the directory lock only with
        the last one, and a column family holds one."""
        self._cfs.clear()
        self._handles.clear()
        del self._time, self._ids, self._meta, self._offsets_cf
        self._db.close()

    def __enter__(self) -> TimeIndex:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"pending={self._pending}"
        return f"TimeIndex({str(self.path)!r}, {state})"

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"the store {self.path} is closed")

    @staticmethod
    def exists(path: Path | str) -> bool:
        """Whether a RocksDB store was ever created at ``path`` (its CURRENT file is there)."""
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a str or Path, not {type(path).__name__}")
        return (Path(path) / "CURRENT").is_file()

    @staticmethod
    def destroy(path: Path | str) -> None:
        """Delete the store at ``path`` (the node then rebuilds it from the buffer topic).

        Does nothing if ``path`` does not exist.

        Raises:
            TypeError: ``path`` is not a str or Path.
            StoreError: ``path`` holds files but no store (refusing to delete them), or the
                store is open (in this or another process).
        """
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a str or Path, not {type(path).__name__}")
        path = Path(path)
        if not path.exists():
            return
        if not TimeIndex.exists(path):
            if path.is_dir() and not any(path.iterdir()):
                path.rmdir()
                return
            raise StoreError(f"refusing to delete {path}: it is not a delayq store")
        try:
            rocksdict.Rdict.destroy(str(path), rocksdict.Options(raw_mode=True))
        except Exception as err:
            raise StoreError(f"cannot delete the store {path} (is a node still running on it? close it "
                             f"first): {err}") from err
        # DestroyDB may leave files RocksDB does not own (e.g. an older rocksdict's config).
        if path.exists():
            shutil.rmtree(path)
