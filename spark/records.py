"""Buffer and dead-letter records read as a node reads them: ``delayq.wire`` applied to Arrow batches.

The reconciliation must classify every buffer record exactly as a node does (a put, a
cancel, a done, or malformed with a reason code), so it does not re-implement the
grammar: :func:`classify_buffer` runs :func:`delayq.wire.parse_buffer_record`, the
nodes' own parser, on each record, inside Spark's ``mapInArrow``. It runs in the
executors' Python workers, which therefore need delayq: on a cluster they import it from
the zip the job ships (shipping.py), locally as the driver does (the job sets
``PYSPARK_PYTHON`` to its own interpreter when it starts Spark itself).

The loops are written for speed: each Arrow column becomes one Python list, through
NumPy (:func:`_values`: about 0.02 us a value, where ``to_pylist``, which makes an
Arrow scalar of each value first, took 0.3 to 0.7 us: 4 of the 14.5 us a buffer record
cost here), the headers are sliced out of the flat list of all header names and values
by the list offsets, the columns Python does not need to look at (key, offset,
timestamp, partition, the hash of value and headers) go back to Spark as the very Arrow
arrays that came in, and each output column is built once per batch.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from delayq import wire

if TYPE_CHECKING:
    import pyarrow as pa

# Kinds of record in the union of both sides (small ints: cheap to compare and aggregate).
PUT, CANCEL, DONE, DELIVERY, DEAD_LETTER = 0, 1, 2, 3, 4
# A producer's put or cancel identical to an earlier one of its id (value, headers, timestamp): the same
# write appended twice (a client library's resend), which nodes apply once. A put copy is no version of its
# own, a cancel copy cancels nothing. The job gives them these kinds; the parser never does.
PUT_COPY, CANCEL_COPY = 5, 6

# Dead-letter reason codes of messages the master could not deliver (the rest are malformed records).
UNDELIVERABLE = frozenset(code.value for code in wire.UNDELIVERABLE)
# Codes a malformed buffer record can have (what parse_buffer_record raises).
MALFORMED_CODES = tuple(r.value for r in wire.Reason if r.value not in UNDELIVERABLE)
# A dead letter whose reason header starts with no known code.
UNKNOWN_CODE = wire.UNKNOWN_CODE
# The code of a buffer record of a feature level above this code's (wire.NewerLevelRecord): not
# malformed, but nothing this delayq can judge; the job refuses to judge a buffer holding one.
NEWER_LEVEL_CODE = "newer-level"

# What buffer_rows() selects from Spark's Kafka source, in this order, and what classify_buffer returns.
# ``written``: a hash of the record's value and headers, which with its timestamp tells a write appended twice.
BUFFER_INPUT = ("key", "value", "headers", "partition", "offset", "ts", "written")
BUFFER_SCHEMA = ("key BINARY, partition INT, offset BIGINT, ts BIGINT, kind INT, code STRING, due BIGINT, "
                 "put_topic STRING, restores BIGINT, version BIGINT, cutoff BIGINT, follows BIGINT, "
                 "follows_cutoff BIGINT, written BIGINT")
DEAD_LETTER_SCHEMA = ("id STRING, key_text STRING, partition INT, offset BIGINT, ts BIGINT, code STRING, "
                      "text STRING, source STRING, version BIGINT, due BIGINT, put_topic STRING, "
                      "undeliverable BOOLEAN")


def _values(column: pa.Array) -> list:
    """An Arrow array's values as a Python list, nulls as None: what ``to_pylist`` gives, 20 to 30 times faster.

    Binary and string values become ``bytes`` and ``str``, integers ``int`` (the integer
    columns converted here have no nulls: offsets, partitions, timestamps).
    """
    return column.to_numpy(zero_copy_only=False).tolist()


def _header_lists(column: pa.ListArray) -> tuple[list[int], list[str], list[bytes | None]]:
    """The list offsets of an ``array<struct<key, value>>`` column and all its header names and values, flat."""
    starts = _values(column.offsets)
    names, values = column.values.flatten()
    return starts, _values(names), _values(values)


def classify_buffer(batches: Iterable[pa.RecordBatch], partitions: int) -> Iterator[pa.RecordBatch]:
    """Each buffer record as a node reads it: :data:`BUFFER_SCHEMA` rows from :data:`BUFFER_INPUT` batches.

    ``kind`` is PUT, CANCEL or DONE, or null with ``code`` the :class:`delayq.wire.Reason`
    of a malformed record. A put has ``due``, ``put_topic`` and ``restores`` (the version
    it replaces only: a master's copy, or a series' next occurrence, which also has
    ``follows`` and ``follows_cutoff``); a done has ``version`` (the put it closes) and ``cutoff``
    (a done without either is malformed). ``written`` is passed through untouched.

    Args:
        batches: Arrow batches of :data:`BUFFER_INPUT` (``ts``: the record timestamp in ms).
        partitions: the buffer topic's partition count: a record off its id's partition is malformed.
    """
    import pyarrow as pa

    parse = wire.parse_buffer_record
    malformed = wire.MalformedRecord
    op_put, op_cancel = wire.OP_PUT, wire.OP_CANCEL
    int32, int64, string = pa.int32(), pa.int64(), pa.string()
    for batch in batches:
        n = batch.num_rows
        keys = _values(batch.column(0))
        values = _values(batch.column(1))
        starts, names, header_values = _header_lists(batch.column(2))
        where = _values(batch.column(3))
        stamps = _values(batch.column(5))
        kind: list[int | None] = [None] * n
        code: list[str | None] = [None] * n
        due: list[int | None] = [None] * n
        topic: list[str | None] = [None] * n
        restores: list[int | None] = [None] * n
        version: list[int | None] = [None] * n
        cutoff: list[int | None] = [None] * n
        follows: list[int | None] = [None] * n
        follows_cutoff: list[int | None] = [None] * n
        start = starts[0] if n else 0
        for i in range(n):
            end = starts[i + 1]
            headers = list(zip(names[start:end], header_values[start:end])) if end > start else None
            start = end
            try:
                record = parse(keys[i], values[i], headers, stamps[i], partition=where[i], partitions=partitions)
            except malformed as err:
                code[i] = err.code.value
                continue
            except wire.NewerLevelRecord:
                code[i] = NEWER_LEVEL_CODE
                continue
            op = record.op
            if op == op_put:
                kind[i] = PUT
                message = record.envelope
                assert message is not None  # a put has its envelope
                due[i] = message.deliver_at_ms
                topic[i] = message.topic
                # A series' next occurrence (follows=N) replaces N only, as a copy (restores=N) does.
                restores[i] = record.restores if record.restores is not None else record.follows
                follows[i] = record.follows
                follows_cutoff[i] = record.cutoff
            elif op == op_cancel:
                kind[i] = CANCEL
            else:
                kind[i] = DONE
                version[i] = record.closes_version
                cutoff[i] = record.cutoff
        yield pa.RecordBatch.from_arrays(
            [batch.column(0), batch.column(3), batch.column(4), batch.column(5), pa.array(kind, int32),
             pa.array(code, string), pa.array(due, int64), pa.array(topic, string), pa.array(restores, int64),
             pa.array(version, int64), pa.array(cutoff, int64), pa.array(follows, int64),
             pa.array(follows_cutoff, int64), batch.column(6)],
            names=["key", "partition", "offset", "ts", "kind", "code", "due", "put_topic", "restores", "version",
                   "cutoff", "follows", "follows_cutoff", "written"])


def dead_letter(key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes | None]] | None
                ) -> tuple[str | None, str, str, str | None, int | None, int | None, str | None, bool]:
    """What a dead-letter record says: (id, code, text, source, version, due, topic, undeliverable).

    Read by :func:`delayq.wire.read_dead_letter`, as the console reads it.
    """
    facts = wire.read_dead_letter(key, value, headers)
    return (facts.delay_id, facts.code, facts.text, facts.source, facts.version, facts.due_ms, facts.topic,
            facts.undeliverable)


def classify_dead_letters(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """:data:`DEAD_LETTER_SCHEMA` rows from batches of (key, value, headers, partition, offset, ts)."""
    import pyarrow as pa

    for batch in batches:
        keys = _values(batch.column(0))
        values = _values(batch.column(1))
        starts, names, header_values = _header_lists(batch.column(2))
        columns: list[list] = [[] for _ in range(9)]
        for i, key in enumerate(keys):
            start, end = starts[i], starts[i + 1]
            found = dead_letter(key, values[i], list(zip(names[start:end], header_values[start:end], strict=True)))
            delay_id, code, text, source, version, due, topic, undeliverable = found
            shown = None if key is None else key[:80].decode(errors="replace")
            for column, item in zip(columns, (delay_id, shown, code, text, source, version, due, topic,
                                              undeliverable), strict=True):
                column.append(item)
        string, int64 = pa.string(), pa.int64()
        yield pa.RecordBatch.from_arrays(
            [pa.array(columns[0], string), pa.array(columns[1], string), batch.column(3), batch.column(4),
             batch.column(5), pa.array(columns[2], string), pa.array(columns[3], string),
             pa.array(columns[4], string), pa.array(columns[5], int64), pa.array(columns[6], int64),
             pa.array(columns[7], string), pa.array(columns[8], pa.bool_())],
            names=["id", "key_text", "partition", "offset", "ts", "code", "text", "source", "version", "due",
                   "put_topic", "undeliverable"])
