"""The reconciliation's classifier of buffer records (spark/records.py) against the nodes' parser, without Spark.

classify_buffer must say of each record what ``delayq.wire.parse_buffer_record`` says, whatever
Arrow hands it: batches with null keys, values and header values, records without headers, and
batches Arrow sliced out of a larger one (their list offsets do not start at 0).
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from delayq import wire
from delayq.spark.records import BUFFER_INPUT, CANCEL, DONE, PUT, _values, classify_buffer

PARTITIONS = 12
HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


def _records() -> list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]] | None, int]]:
    """A put, a cancel and a done of one id each, on the id's own partition, then malformed ones of every sort."""
    records = []
    for i in range(30):
        delay_id = wire.new_delay_id(1_767_225_600_000 + i)
        key = delay_id.encode()
        due = 1_767_225_600_000 + 60_000 * i
        records.append((key, wire.put_value(due, f"orders-{i % 3}", b"k%d" % i, b"payload %d" % i),
                        [("trace", b"t%d" % i)] if i % 2 else None, due - 1_000))
        records.append((key, None, wire.control_headers(wire.OP_CANCEL, delay_id), due - 500))
        records.append((key, None, wire.done_headers(delay_id, 100 + i, 200 + i), due + 5))
    some_id = wire.new_delay_id(1_767_225_600_000).encode()
    records += [
        (None, b"put 1767225600000 orders - \n", None, 1),                      # no key
        (b"not-an-id", b"put 1767225600000 orders - \n", None, 2),              # key that is no delay id
        (some_id, b"garbage", None, 3),                                          # bad frame
        (some_id, wire.put_value(1_767_225_600_000, "orders", None, b"x"), [("delayq-op", b"put")], 4),
        (some_id, None, [("delayq-op", b"done"), ("delayq-version", None)], 5),  # a null header value
        (some_id, None, None, 6),                                                # a tombstone without its op
    ]
    return records


def _batch(records) -> pa.RecordBatch:
    partition = [wire.buffer_partition(key, PARTITIONS) if key and wire.is_delay_id(key) else 0
                 for key, _, _, _ in records]
    return pa.RecordBatch.from_arrays(
        [pa.array([r[0] for r in records], pa.binary()), pa.array([r[1] for r in records], pa.binary()),
         pa.array([None if r[2] is None else [{"key": k, "value": v} for k, v in r[2]] for r in records], HEADERS),
         pa.array(partition, pa.int32()), pa.array(range(len(records)), pa.int64()),
         pa.array([r[3] for r in records], pa.int64()), pa.array([7] * len(records), pa.int64())],
        names=list(BUFFER_INPUT))


def _expected(batch: pa.RecordBatch) -> list[tuple]:
    """(kind, code, due, put_topic, version, cutoff) of each row, by the nodes' parser."""
    rows = []
    for row in batch.to_pylist():
        headers = [(h["key"], h["value"]) for h in row["headers"]] if row["headers"] else None
        try:
            record = wire.parse_buffer_record(row["key"], row["value"], headers, row["ts"],
                                              partition=row["partition"], partitions=PARTITIONS)
        except wire.MalformedRecord as err:
            rows.append((None, err.code.value, None, None, None, None))
            continue
        if record.op == wire.OP_PUT:
            assert record.envelope is not None
            rows.append((PUT, None, record.envelope.deliver_at_ms, record.envelope.topic, None, None))
        elif record.op == wire.OP_CANCEL:
            rows.append((CANCEL, None, None, None, None, None))
        else:
            rows.append((DONE, None, None, None, record.closes_version, record.cutoff))
    return rows


def _classified(batch: pa.RecordBatch) -> list[tuple]:
    out = pa.Table.from_batches(list(classify_buffer([batch], PARTITIONS)))
    assert out.column("offset").to_pylist() == batch.column(4).to_pylist()  # passed through, in order
    assert out.column("key").to_pylist() == batch.column(0).to_pylist()
    return list(zip(*(out.column(c).to_pylist() for c in ("kind", "code", "due", "put_topic", "version", "cutoff")),
                    strict=True))


def test_each_record_is_classified_as_the_nodes_parser_reads_it():
    batch = _batch(_records())
    classified = _classified(batch)
    assert classified == _expected(batch)
    kinds = [row[0] for row in classified]
    assert kinds.count(PUT) == kinds.count(CANCEL) == kinds.count(DONE) == 30
    assert kinds.count(None) == 6  # every malformed one has a code
    assert all(row[1] for row in classified if row[0] is None)


@pytest.mark.parametrize("start, length", [(2, 40), (31, 50), (85, 11)])
def test_a_batch_arrow_sliced_out_of_a_larger_one_is_classified_the_same(start, length):
    whole = _batch(_records())
    part = whole.slice(start, length)
    assert part.column(2).offsets[0].as_py() > 0  # the case this test is about: offsets not from 0
    assert _classified(part) == _expected(part)


@pytest.mark.parametrize("array", [
    pa.array([b"a", None, b"", b"\x00\xff"], pa.binary()),
    pa.array(["delayq-op", None, "", "ü"], pa.string()),
    pa.array([0, 5, 2**40], pa.int64()),
    pa.array([3, 1], pa.int32()),
    pa.array([b"x", None, b"yz", b"w"], pa.binary()).slice(1, 2),
    pa.array([], pa.binary()),
], ids=["binary", "string", "int64", "int32", "sliced", "empty"])
def test_values_are_what_to_pylist_gives(array):
    got = _values(array)
    assert got == array.to_pylist()
    assert [type(v) for v in got] == [type(v) for v in array.to_pylist()]
