"""The wire contract (delayq.wire): what the proxy writes, the nodes and Spark read back alike."""

from __future__ import annotations

import uuid

import pytest
from support.wire_cases import CASES, PARTITIONS, Case

from delayq import wire
from delayq.schedule import MIN_DUE_MS
from delayq.wire import Envelope, MalformedRecord, check_delay_id, new_delay_id, parse_buffer_record


def sample(**changes) -> Envelope:
    base = dict(delay_id=new_delay_id(), topic="orders", deliver_at_ms=1_800_000_000_123, value=b"\x00payload",
                key=b"\xffkey", partition=2, headers=[("trace", b"abc"), ("trace", b"dup"), ("empty", None)],
                created_at_ms=1_700_000_000_000, partitioner="murmur2_random")
    base.update(changes)
    return Envelope(**base)


def test_delivery_headers_keep_user_headers_in_order_then_add_id_due_time_epoch_version():
    original = sample()
    assert original.delivery_headers(7, 711) == [
        *original.headers, (wire.ID, original.delay_id.encode()),
        (wire.DELIVER_AT, b"1800000000123"), (wire.EPOCH, b"7"), (wire.VERSION, b"711"),
    ]


def test_a_done_names_the_version_it_closes_and_its_cutoff_and_a_cancel_closes_any():
    delay_id = sample().delay_id
    done = wire.parse_buffer_record(delay_id.encode(), None, wire.done_headers(delay_id, 711, 790))
    cancel = wire.parse_buffer_record(delay_id.encode(), None, wire.control_headers(wire.OP_CANCEL, delay_id))

    assert (done.op, done.delay_id, done.envelope, done.closes_version, done.cutoff) == (
        wire.OP_DONE, delay_id, None, 711, 790)
    assert (cancel.op, cancel.delay_id, cancel.envelope, cancel.closes_version, cancel.cutoff) == (
        wire.OP_CANCEL, delay_id, None, None, None)


@pytest.mark.parametrize("headers,missing", [
    ([(wire.OP, wire.OP_DONE)], "no delayq-version and no delayq-cutoff"),
    ([(wire.OP, wire.OP_DONE), (wire.VERSION, b"7")], "no delayq-cutoff"),
    ([(wire.OP, wire.OP_DONE), (wire.CUTOFF, b"9")], "no delayq-version"),
])
def test_a_done_without_its_version_or_cutoff_is_malformed(headers, missing):
    delay_id = new_delay_id()
    with pytest.raises(MalformedRecord, match=f"bad-control: a done needs headers .*; it has {missing}$") as bad:
        parse_buffer_record(delay_id.encode(), None, [*headers, (wire.ID, delay_id.encode())])
    assert bad.value.code is wire.Reason.BAD_CONTROL


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_every_record_of_the_shared_table_parses_or_is_refused_with_its_reason_code(case: Case):
    if isinstance(case.expected, wire.Reason):
        with pytest.raises(MalformedRecord) as refused:
            parse_buffer_record(case.key, case.value, case.headers, partition=case.partition, partitions=PARTITIONS)
        assert refused.value.code is case.expected
        assert case.text in refused.value.text
        assert refused.value.reason == f"{case.expected.value}: {refused.value.text}"
        assert wire.Reason.of(refused.value.reason.encode()) is case.expected
    else:
        record = parse_buffer_record(case.key, case.value, case.headers, partition=case.partition,
                                     partitions=PARTITIONS)
        assert record.op == case.expected


def test_the_partition_rule_is_crc32_of_the_id_bytes():
    import zlib

    for _ in range(50):
        delay_id = new_delay_id()
        assert wire.buffer_partition(delay_id, 7) == zlib.crc32(delay_id.encode()) % 7
        assert wire.buffer_partition(delay_id.encode(), 7) == wire.buffer_partition(delay_id, 7)


def test_a_record_read_without_its_partition_is_not_judged_by_the_partition_rule():
    case = next(c for c in CASES if c.name == "cancel on the wrong partition")
    assert parse_buffer_record(case.key, case.value, case.headers).op == wire.OP_CANCEL


def test_every_reason_code_is_a_stable_lower_case_word_and_reads_back():
    assert [r.value for r in wire.Reason] == [
        "wrong-partition", "bad-id", "bad-frame", "unknown-option", "bad-due-time", "reserved-header", "bad-control",
        "missing-topic", "bad-partition", "rejected", "forbidden-topic", "expired", "retries-exhausted"]
    for reason in wire.Reason:
        assert wire.Reason.of(wire.reason_text(reason, "why")) is reason
    assert wire.Reason.of(b"malformed: old text") is None and wire.Reason.of(None) is None


def test_the_due_time_bound_is_2000_01_01_in_ms():
    from datetime import UTC, datetime

    assert int(datetime(2000, 1, 1, tzinfo=UTC).timestamp() * 1000) == MIN_DUE_MS
    key = new_delay_id().encode()
    assert parse_buffer_record(key, b"put %d t -\n" % MIN_DUE_MS, []).envelope.deliver_at_ms == MIN_DUE_MS
    with pytest.raises(MalformedRecord) as refused:
        parse_buffer_record(key, b"put %d t -\n" % (MIN_DUE_MS - 1), [])
    assert refused.value.code is wire.Reason.BAD_DUE_TIME


def test_delay_ids_are_uuid7_and_sort_by_time():
    first, second = new_delay_id(1_000), new_delay_id(2_000)
    assert uuid.UUID(first).version == 7 and uuid.UUID(second).version == 7
    assert first < second
    assert check_delay_id(first) == first


@pytest.mark.parametrize("bad,error", [(42, TypeError), ("not-an-id", ValueError),
                                       (str(uuid.uuid4()).upper(), ValueError)],
                         ids=["an-int", "not-an-id", "an-upper-case-uuid4"])  # the same ids in every collection
def test_check_delay_id_refuses_what_is_not_an_id(bad, error):
    with pytest.raises(error, match="delay_id"):
        check_delay_id(bad)


@pytest.mark.parametrize("partitions", [1, 2, 6, 12, 64])
def test_each_partition_has_a_mark_id_that_lands_on_it_and_no_new_id_is_one(partitions):
    marks = [wire.mark_id(p, partitions) for p in range(partitions)]

    assert [wire.buffer_partition(mark, partitions) for mark in marks] == list(range(partitions))
    assert all(wire.is_mark_id(mark.encode()) and uuid.UUID(mark).version == 7 for mark in marks)
    assert not wire.is_mark_id(new_delay_id(1).encode()), "an id stamped even 1 ms after 1970 is a message's"
    with pytest.raises(ValueError, match="is not one of the buffer's"):
        wire.mark_id(partitions, partitions)


def test_a_mark_is_a_done_that_closes_nothing_and_a_put_or_cancel_of_its_id_is_malformed():
    mark = wire.mark_id(3, 6)
    record = wire.parse_buffer_record(mark.encode(), None, wire.done_headers(mark, 0, 0), partition=3, partitions=6)
    assert (record.op, record.delay_id, record.envelope) == (wire.OP_DONE, mark, None)

    with pytest.raises(wire.MalformedRecord, match="partition mark") as put:
        wire.parse_buffer_record(mark.encode(), wire.put_value(1_795_000_000_000, "orders", None, b"v"), None,
                                partition=3, partitions=6)
    with pytest.raises(wire.MalformedRecord, match="partition mark") as cancel:
        wire.parse_buffer_record(mark.encode(), None, wire.control_headers(wire.OP_CANCEL, mark),
                                partition=3, partitions=6)
    assert put.value.code is cancel.value.code is wire.Reason.BAD_ID
    with pytest.raises(ValueError, match="reserved"):
        check_delay_id(mark)


# -- feature level 2: level= and expires= ---------------------------------------


def test_an_expiring_message_round_trips_through_its_frame_which_says_the_level_it_needs():
    original = sample(expires_at_ms=1_800_000_060_000)
    value = original.buffer_value()

    assert b" level=2 expires=1800000060000" in value.split(b"\n")[0]
    parsed = parse_buffer_record(original.delay_id.encode(), value, original.headers, original.created_at_ms)
    assert parsed.envelope == original
    assert b"level=" not in sample().buffer_value().split(b"\n")[0], "a level-1 message says no level"


@pytest.mark.parametrize("frame", [
    b"put 1800000000000 orders - level=3",
    b"put 1800000000000 orders - level=3 warp=9",              # an option this code does not know
    b"put 1800000000000 orders - warp=9 level=3 warp=9",        # and what would be malformed at level 2
    b"put 1800000000000 orders - level=12 expires=5",
])
def test_a_frame_of_a_newer_level_is_not_malformed_but_one_this_code_cannot_read_yet(frame):
    with pytest.raises(wire.NewerLevelRecord) as raised:
        parse_buffer_record(new_delay_id().encode(), frame + b"\nx", None)

    assert raised.value.level == int(frame.split(b"level=")[1].split(b" ")[0])
    assert not isinstance(raised.value, MalformedRecord)
    assert "upgrade" in str(raised.value)


def test_the_wire_level_and_option_levels_come_from_the_feature_table():
    assert wire.WIRE_LEVEL == max(wire.OPTION_LEVELS.values()) == 2
    assert wire.OPTION_LEVELS == {wire.EXPIRES_OPTION: 2}
