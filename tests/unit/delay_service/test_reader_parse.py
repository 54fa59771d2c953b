"""The buffer reader's parse (delay_service/reader.py): consumed records in, store ops out, as ingest applies them.

confluent_kafka.Message is built directly (it has a constructor): no broker needed.
The reader process itself, killed and replaced, is in tests/integration/test_reader_process.py.
"""

from __future__ import annotations

import marshal
from unittest import mock

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, TopicPartition
from support import wire_cases

from delayq import wire
from delayq.delay_service import reader as reader_module
from delayq.delay_service import stored
from delayq.delay_service.reader import Assignment, Frame, ShardBatch, pack_frame, parse_batch, unpack_frame
from delayq.store import Malformed, Put, Remove, decode, producer_write

P = wire_cases.PARTITIONS
ID = wire_cases.ID
OWN = wire_cases.OWN


def record(offset: int, value: bytes | None, headers: list | None = None, *, key: bytes | None = ID.encode(),
           partition: int = OWN, timestamp: int = 1_700_000_000_000) -> Message:
    return Message(topic="buffer", partition=partition, offset=offset, key=key, value=value, headers=headers,
                   timestamp=(1, timestamp))


def put_value(due: int, topic: str = "orders", *, restores: int | None = None) -> bytes:
    return wire.put_value(due, topic, b"k", b"payload", None, None, restores)


def parse_one_shard(messages: list) -> ShardBatch:
    """The batch of a cluster of one shard: everything is shard 0's."""
    batch = parse_batch(messages, P)
    assert list(batch.shards) == [0]
    return batch.shards[0]


def test_a_put_becomes_a_put_op_with_its_stored_form_offset_as_version_and_earliest_due():
    whole = parse_batch([record(7, put_value(1_800_000_000_500)), record(8, put_value(1_800_000_000_100))], P)
    batch = whole.shards[0]

    ops = decode(batch.ops)
    assert [(type(op), op.delay_id, op.deliver_at_ms) for op in ops] == [(Put, ID, 1_800_000_000_500),
                                                                         (Put, ID, 1_800_000_000_100)]
    put = ops[0]
    assert (put.version, put.restores) == (7, None)
    assert put.written == producer_write(OWN, 7, 1_700_000_000_000,
                                         wire.write_digest(ID.encode(), put_value(1_800_000_000_500), None))
    pending = stored.unpack(put.payload)
    assert (pending.buffer_partition, pending.version) == (OWN, 7)
    assert (pending.message.topic, pending.message.key, pending.message.value) == ("orders", b"k", b"payload")
    assert pending.message.created_at_ms == 1_700_000_000_000
    assert batch.offsets == {OWN: 9}
    assert batch.earliest_put == 1_800_000_000_100
    assert batch.settled == []  # a producer's put settles nothing of the master's
    assert whole.counts[b"put"] == 2 and whole.records == 2


def test_cancel_done_and_a_masters_copy_settle_their_ids():
    done = wire.done_headers(ID, 7, 9)
    whole = parse_batch([
        record(10, None, wire.control_headers(wire.OP_CANCEL, ID)),
        record(11, None, done),
        record(12, put_value(1_800_000_000_000, restores=7)),
    ], P)
    batch = whole.shards[0]

    cancel_written = producer_write(OWN, 10, 1_700_000_000_000,
                                    wire.write_digest(ID.encode(), None, wire.control_headers(wire.OP_CANCEL, ID)))
    ops = decode(batch.ops)
    assert ops[0] == Remove(ID, None, cancel_written) and type(ops[0]) is Remove
    assert ops[1] == Remove(ID, 7), "a done is the master's write, never a producer's copy"
    assert type(ops[2]) is Put and ops[2].restores == 7 and ops[2].written is None
    assert batch.settled == [ID, ID, ID]
    assert (whole.counts[b"cancel"], whole.counts[b"done"], whole.counts[b"put"]) == (1, 1, 1)


def test_one_write_read_at_two_offsets_has_one_identity_and_another_value_headers_or_time_another():
    value = put_value(1_800_000_000_000)
    batch = parse_one_shard([record(1, value, [("h", b"1")]), record(5, value, [("h", b"1")]),
                             record(6, value, [("h", b"2")]), record(7, put_value(1_800_000_000_001), [("h", b"1")]),
                             record(8, value, [("h", b"1")], timestamp=1_700_000_000_001)])
    identities = [op.written[12:] for op in decode(batch.ops)]

    assert identities[0] == identities[1]
    assert len(set(identities)) == 4


def test_malformed_records_become_malformed_ops_with_the_reason_and_own_id_only_when_valid():
    other = wire_cases.OTHER
    whole = parse_batch([
        record(3, b"bogus"),  # bad frame of a valid id on its own partition: the id's newest record
        record(4, put_value(1_800_000_000_000), partition=other),  # wrong partition: not this id's
    ], P)
    batch = whole.shards[0]

    first, second = decode(batch.ops)
    assert (type(first), first.partition, first.offset, first.delay_id) == (Malformed, OWN, 3, ID)
    kept = stored.unpack_malformed(first.payload)
    assert (kept.key, kept.value, kept.code) == (ID.encode(), b"bogus", wire.Reason.BAD_FRAME.value)
    assert (type(second), second.partition, second.offset, second.delay_id) == (Malformed, other, 4, None)
    assert stored.unpack_malformed(second.payload).code == wire.Reason.WRONG_PARTITION.value
    assert whole.counts[b"malformed"] == 2
    assert batch.offsets == {OWN: 4, other: 5}


def test_partition_eof_and_errors_are_not_records():
    eof = Message(topic="buffer", partition=OWN, offset=5, error=KafkaError(KafkaError._PARTITION_EOF))
    batch = parse_batch([eof, record(5, put_value(1_800_000_000_000))], P)
    assert batch.records == 1 and batch.shards[0].offsets == {OWN: 6} and len(batch.shards[0].ops) == 1


def test_every_case_of_the_wire_table_parses_as_the_node_reads_it():
    """Each valid record of the shared table becomes the op of its kind; each malformed one a Malformed op."""
    for offset, case in enumerate(wire_cases.CASES):
        batch = parse_one_shard([record(offset, case.value, case.headers or None, key=case.key,
                                        partition=case.partition)])
        (op,) = decode(batch.ops)
        if isinstance(case.expected, wire.Reason):
            assert type(op) is Malformed, case.name
            assert stored.unpack_malformed(op.payload).code == case.expected.value, case.name
        else:
            assert type(op) is (Put if case.expected == wire.OP_PUT else Remove), case.name


def test_a_frame_carries_the_batch_and_positions_through_marshal_unchanged():
    batch = parse_batch([record(1, put_value(1_800_000_000_000)),
                         record(2, None, wire.control_headers(wire.OP_CANCEL, ID))], P)
    assert unpack_frame(pack_frame([(OWN, 3)], batch)) == Frame({OWN: 3}, batch, {})
    assert unpack_frame(pack_frame([(0, 1)], None, {2: (7, 3)})) == Frame({0: 1}, None, {2: (7, 3)})


def test_a_record_of_a_newer_level_holds_its_partition_there_and_nothing_of_it_is_dead_lettered():
    newer = b"put 1800000000000 orders - level=9 warp=1\nx"
    other = wire.new_delay_id()
    while wire.buffer_partition(other, P) == OWN:
        other = wire.new_delay_id()
    elsewhere = record(4, put_value(1_800_000_000_000), key=other.encode(), partition=wire.buffer_partition(other, P))
    batch = parse_batch([record(1, put_value(1_800_000_000_000)), record(2, newer),
                         record(3, None, wire.control_headers(wire.OP_CANCEL, ID)), elsewhere], P)

    assert batch.held == {OWN: (2, 9)}
    ops = batch.shards[0].ops
    assert [(type(op), op.delay_id) for op in decode(ops)] == [(Put, ID), (Put, other)], (
        "the cancel after it waits with it")
    assert batch.shards[0].offsets == {OWN: 2, wire.buffer_partition(other, P): 5}, "read again from the held record"
    assert batch.counts[b"malformed"] == 0 and batch.records == 2
    later = parse_batch([record(5, None, wire.control_headers(wire.OP_CANCEL, ID))], P, held=batch.held)
    assert later.shards == {} and later.held == {}, "a held partition stays held"


def test_a_batch_is_split_by_shard_each_with_its_own_ops_offsets_settled_and_earliest_due():
    shards = 3
    ids = {}
    while len(ids) < shards:  # an id of each shard
        delay_id = wire.new_delay_id()
        ids.setdefault(wire.shard_of(wire.buffer_partition(delay_id, P), shards), delay_id)

    def put(offset: int, shard: int, due: int) -> Message:
        delay_id = ids[shard]
        return record(offset, put_value(due), key=delay_id.encode(), partition=wire.buffer_partition(delay_id, P))

    def cancel(offset: int, shard: int) -> Message:
        delay_id = ids[shard]
        return record(offset, None, wire.control_headers(wire.OP_CANCEL, delay_id), key=delay_id.encode(),
                      partition=wire.buffer_partition(delay_id, P))

    batch = parse_batch([put(1, 0, 1_800_000_000_900), put(2, 2, 1_800_000_000_100), cancel(3, 0),
                         put(4, 0, 1_800_000_000_500)], P, shards)

    assert sorted(batch.shards) == [0, 2], "shard 1 had no record"
    zero, two = batch.shards[0], batch.shards[2]
    assert [type(op) for op in decode(zero.ops)] == [Put, Remove, Put] and [type(op) for op in decode(two.ops)] == [Put]
    assert zero.earliest_put == 1_800_000_000_500 and two.earliest_put == 1_800_000_000_100
    assert zero.settled == [ids[0]] and two.settled == []
    assert zero.offsets == {wire.buffer_partition(ids[0], P): 5}
    assert two.offsets == {wire.buffer_partition(ids[2], P): 3}
    assert batch.records == 4 and batch.counts[b"put"] == 3
    assert unpack_frame(pack_frame([], batch)) == Frame({}, batch, {})


def test_a_frame_carries_the_generation_of_the_assignment_it_was_read_under():
    assert unpack_frame(pack_frame([(0, 1)], None, None, 7)).generation == 7


def test_each_assignment_reads_its_partitions_from_their_starts_with_a_consumer_of_its_own(monkeypatch):
    made: list[mock.Mock] = []

    def consumer(conf: dict) -> mock.Mock:
        made.append(mock.create_autospec(Consumer, spec_set=True, instance=True))
        return made[-1]

    monkeypatch.setattr(reader_module, "Consumer", consumer)
    conf = {"bootstrap.servers": "kafka:9092"}
    first = Assignment(conf, "buffer", 0, [0, 2], {0: 5, 2: OFFSET_BEGINNING})
    made[0].assign.assert_called_once_with([TopicPartition("buffer", 0, 5),
                                            TopicPartition("buffer", 2, OFFSET_BEGINNING)])

    first.held[2] = (11, 9)  # stopped at a record of a newer feature level
    second = first.replaced(conf, marshal.dumps((1, [0, 1], {0: 6, 1: OFFSET_BEGINNING})))
    made[0].close.assert_called_once_with()
    made[0].assign.assert_called_once()  # never assigned twice: see Assignment
    assert second.consumer is made[1] and len(made) == 2
    made[1].assign.assert_called_once_with([TopicPartition("buffer", 0, 6),
                                            TopicPartition("buffer", 1, OFFSET_BEGINNING)])
    assert (second.generation, second.held, second.sent) == (1, {}, None), "a new consumer holds nothing back"
