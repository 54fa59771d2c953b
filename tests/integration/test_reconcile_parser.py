"""Node and Spark read the buffer alike: one table of valid and malformed buffer records, classified by both.

The nodes classify a buffer record with ``delayq.wire.parse_buffer_record``; the
reconciliation job must reach the same verdict on every record (the same kind, or
malformed with the same reason code), or it would judge messages the nodes never
stored, or miss ones they did. The table holds the cases where the job's earlier SQL
parser disagreed with the nodes (an unknown option, a key length past the end of the
value, a frame line ended by CRLF) and the rules the wire contract added (lower-case
UUID keys, the partition rule, due times in milliseconds from 2000 on, known
partitioners). Each record goes through the job's ``buffer_rows`` twice: built in
memory, and written to a real Kafka topic and read back by Spark's Kafka source.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest
from confluent_kafka import Producer
from support.kafka_testing import create_topics

from delayq import Settings, wire
from delayq.spark import ReconcileOptions, spark_session
from delayq.spark.job import KAFKA_SCHEMA, buffer_rows, read_topics
from delayq.spark.records import CANCEL, DONE, NEWER_LEVEL_CODE, PUT

PARTITIONS = 3
DUE = 1_800_000_000_000  # 2027-01-15T08:00:00Z, in ms
MARK = wire.mark_id(1, PARTITIONS).encode()
KINDS = {wire.OP_PUT: PUT, wire.OP_CANCEL: CANCEL, wire.OP_DONE: DONE}


@dataclass(frozen=True)
class Case:
    """One buffer record and what a node makes of it: ``kind`` (put/cancel/done) or ``code`` (malformed)."""

    name: str
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()
    code: str | None = None  # the wire.Reason of a malformed record; None: valid
    kind: bytes | None = None
    other_partition: bool = False  # written to another partition than its id's

    @property
    def partition(self) -> int:
        if self.key is None or not wire.is_delay_id(self.key):
            return 1
        own = wire.buffer_partition(self.key, PARTITIONS)
        return (own + 1) % PARTITIONS if self.other_partition else own


def _id() -> bytes:
    return wire.new_delay_id().encode()


def _put(rest: str) -> bytes:
    return f"put {DUE} orders {rest}".encode()


def cases() -> list[Case]:
    a = _id()
    done = wire.done_headers(a.decode(), 7, 9)
    return [
        # Valid, as the proxy and a master write them.
        Case("put", _id(), _put("3\nkeypayload"), kind=wire.OP_PUT),
        Case("put, null key", _id(), _put("-\npayload"), kind=wire.OP_PUT),
        Case("put, every option", _id(), _put("3 partition=2 partitioner=murmur2 value=null restores=5\nkey"),
             kind=wire.OP_PUT),
        Case("put, user headers", _id(), _put("-\nx"), (("trace", b"1"), ("trace", None)), kind=wire.OP_PUT),
        Case("put, empty payload", _id(), _put("-\n"), kind=wire.OP_PUT),
        Case("cancel", a, None, tuple(wire.control_headers(wire.OP_CANCEL, a.decode())), kind=wire.OP_CANCEL),
        Case("cancel, no delayq-id", _id(), None, ((wire.OP, b"cancel"),), kind=wire.OP_CANCEL),
        Case("done", a, None, tuple(done), kind=wire.OP_DONE),
        Case("put that expires (level 2)", _id(), _put(f"- level=2 expires={DUE + 60_000}\nx"), kind=wire.OP_PUT),
        # Of a feature level above this code's: not malformed, nothing this delayq can read or judge.
        Case("put of a newer level", _id(), _put("- level=9 warp=1\nx"), code=NEWER_LEVEL_CODE),
        Case("expires= without level=", _id(), _put(f"- expires={DUE + 60_000}\nx"), code="bad-frame"),
        # Where the SQL parser said "put" and the nodes "malformed".
        Case("put 123 t - bogus=1", _id(), b"put 123 t - bogus=1\nx", code="bad-due-time"),
        Case("unknown option", _id(), _put("- bogus=1\nx"), code="unknown-option"),
        Case("key length past the end", _id(), _put("10\nabc"), code="bad-frame"),
        Case("frame line ending CRLF", _id(), _put("-\r\npayload"), code="bad-frame"),
        # The wire contract's rules.
        Case("cancel on another partition", _id(), None, ((wire.OP, b"cancel"),), code="wrong-partition",
             other_partition=True),
        Case("put on another partition", _id(), _put("-\nx"), code="wrong-partition", other_partition=True),
        Case("non-UUID key", b"order-42", _put("-\nx"), code="bad-id"),
        Case("upper-case UUID key", str(uuid.uuid4()).upper().encode(), _put("-\nx"), code="bad-id"),
        Case("no key", None, _put("-\nx"), code="bad-id"),
        Case("put of a partition mark's id", MARK, _put("-\nx"), code="bad-id"),
        Case("cancel of a partition mark's id", MARK, None, ((wire.OP, b"cancel"),), code="bad-id"),
        Case("unknown partitioner", _id(), _put("- partitioner=java_default\nx"), code="unknown-option"),
        Case("due time in seconds", _id(), f"put {DUE // 1000} orders -\nx".encode(), code="bad-due-time"),
        # And the rest of the grammar.
        Case("no frame", _id(), b"just a payload", code="bad-frame"),
        Case("option twice", _id(), _put("- partition=1 partition=2\nx"), code="bad-frame"),
        Case("value=null and a payload", _id(), _put("- value=null\nx"), code="bad-frame"),
        Case("bad topic name", _id(), f"put {DUE} or/ders -\nx".encode(), code="bad-frame"),
        Case("put with a delayq- header", _id(), _put("-\nx"), ((wire.OP, b"put"),), code="reserved-header"),
        Case("tombstone without op", _id(), None, (("trace", b"1"),), code="bad-control"),
        Case("unknown op", _id(), None, ((wire.OP, b"launch"),), code="bad-control"),
        Case("cancel with a version", _id(), None, ((wire.OP, b"cancel"), (wire.VERSION, b"1")), code="bad-control"),
        Case("done with a null version", _id(), None, ((wire.OP, b"done"), (wire.VERSION, None)), code="bad-control"),
        Case("done with a bad cutoff", _id(), None, ((wire.OP, b"done"), (wire.CUTOFF, b"x1")), code="bad-control"),
        Case("done without version and cutoff", _id(), None, ((wire.OP, b"done"),), code="bad-control"),
        Case("done naming another id", a, None, ((wire.OP, b"done"), (wire.ID, _id())), code="bad-control"),
    ]


CASES = cases()


def node_verdict(case: Case) -> tuple[int | None, str | None]:
    """What a node makes of the record: (kind, None), or (None, reason code)."""
    try:
        record = wire.parse_buffer_record(case.key, case.value, list(case.headers) or None, 0,
                                          partition=case.partition, partitions=PARTITIONS)
    except wire.MalformedRecord as err:
        return None, err.code.value
    except wire.NewerLevelRecord:
        return None, NEWER_LEVEL_CODE
    return KINDS[record.op], None


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_table_says_what_the_nodes_parser_says(case):
    expected = (None, case.code) if case.code else (KINDS[case.kind], None)
    assert node_verdict(case) == expected


def _spark_verdicts(frame) -> dict[tuple[int, int], tuple[int | None, str | None]]:
    rows = buffer_rows(frame, PARTITIONS).collect()
    return {(r["partition"], r["offset"]): (r["kind"], r["code"]) for r in rows}


def test_spark_classifies_every_record_as_a_node_does_in_memory():
    spark = spark_session("local[2]")
    when = datetime(2027, 1, 15, tzinfo=UTC)
    rows = [(c.key, c.value, "buffer", c.partition, offset, when, 0,
             [{"key": name, "value": data} for name, data in c.headers] or None)
            for offset, c in enumerate(CASES)]

    found = _spark_verdicts(spark.createDataFrame(rows, KAFKA_SCHEMA))

    assert {c.name: found[(c.partition, offset)] for offset, c in enumerate(CASES)} == \
        {c.name: node_verdict(c) for c in CASES}


def test_the_masters_partition_marks_take_no_part_in_the_reconciliation():
    spark = spark_session("local[2]")
    when = datetime(2027, 1, 15, tzinfo=UTC)
    mark_headers = [{"key": name, "value": data} for name, data in wire.done_headers(MARK.decode(), 0, 0)]
    rows = [(MARK, None, "buffer", 1, 0, when, 0, mark_headers),
            (MARK, _put("-\nx"), "buffer", 1, 1, when, 0, None)]

    found = _spark_verdicts(spark.createDataFrame(rows, KAFKA_SCHEMA))

    assert found == {(1, 1): (None, "bad-id")}, "the mark is left out; a put of its id is malformed, as on a node"


@pytest.mark.integration
def test_spark_classifies_every_record_read_from_kafka_as_a_node_does(dev_stack, tmp_path):
    topic = f"t-reconcile-parser-{uuid.uuid4().hex[:8]}-buffer"
    create_topics(dev_stack.bootstrap_servers, [topic], partitions=PARTITIONS)
    producer = Producer({"bootstrap.servers": dev_stack.bootstrap_servers})
    where: dict[str, tuple[int, int]] = {}
    for case in CASES:
        reports: list = []
        producer.produce(topic, key=case.key, value=case.value, headers=list(case.headers) or None,
                         partition=case.partition, on_delivery=lambda err, msg, out=reports: out.append((err, msg)))
        producer.flush(30)
        err, message = reports[0]
        assert err is None, err
        where[case.name] = (message.partition(), message.offset())
    settings = Settings(bootstrap_servers=dev_stack.bootstrap_servers, buffer_topic=topic)
    options = ReconcileOptions(since_ms=DUE - 3_600_000, until_ms=DUE + 3_600_000, out=tmp_path)  # reads all

    found = _spark_verdicts(read_topics(spark_session("local[2]"), settings, options, [topic]))

    assert len(found) == len(CASES)
    assert {c.name: found[where[c.name]] for c in CASES} == {c.name: node_verdict(c) for c in CASES}
