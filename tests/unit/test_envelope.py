"""The envelope codec: what the proxy writes, the nodes read back bit for bit."""

from __future__ import annotations

import enum
import uuid

import pytest

from delayq.proxy import Envelope, MalformedRecord, check_delay_id, new_delay_id, parse_buffer_record
from delayq.proxy import envelope as env


def sample(**changes) -> Envelope:
    base = dict(delay_id=new_delay_id(), topic="orders", deliver_at_ms=1_800_000_000_123, value=b"\x00payload",
                key=b"\xffkey", partition=2, headers=[("trace", b"abc"), ("trace", b"dup"), ("empty", None)],
                created_at_ms=1_700_000_000_000, partitioner="murmur2_random")
    base.update(changes)
    return Envelope(**base)


@pytest.mark.parametrize("changes", [{}, {"key": None, "partition": None, "partitioner": None, "headers": []},
                                     {"value": None}, {"value": b""}])
def test_put_round_trips_through_buffer_headers(changes):
    original = sample(**changes)

    parsed = parse_buffer_record(original.delay_id.encode(), original.buffer_value(), original.buffer_headers(),
                                 original.created_at_ms)

    assert parsed.op == env.OP_PUT and parsed.delay_id == original.delay_id
    assert parsed.envelope == original


def test_a_put_value_is_the_frame_line_then_key_then_payload():
    message = sample(key=b"k 1\n", partition=None, partitioner=None, value=b"\x00pay")
    assert message.buffer_value() == b"put 1800000000123 orders 4\nk 1\n\x00pay"
    assert message.buffer_headers() == message.headers


def test_options_carry_partition_partitioner_and_null_value():
    assert sample(key=None, partition=3, partitioner="murmur2", value=None).buffer_value() == (
        b"put 1800000000123 orders - partition=3 partitioner=murmur2 value=null\n")


def test_frame_head_is_the_line_before_key_and_payload():
    assert env.frame_head(5, "a", 1) == b"put 5 a 1\n"
    assert env.frame_head(5, "b", None) == b"put 5 b -\n"
    assert env.frame_head(6, "b", 1500, env.frame_options(2, None, True)) == b"put 6 b 1500 partition=2 value=null\n"
    assert env.put_value(6, "b", b"x" * 1500, b"") == b"put 6 b 1500\n" + b"x" * 1500


def test_a_str_enum_topic_is_framed_by_its_value():
    class Topic(str, enum.Enum):
        ORDERS = "orders"

    assert env.put_value(5, Topic.ORDERS, None, b"v") == b"put 5 orders -\nv"


@pytest.mark.parametrize("topic,error", [
    ("", ValueError), ("a b", ValueError), ("a\nb", ValueError), ("..", ValueError), ("x" * 250, ValueError),
    ("caf\u00e9", ValueError), (b"orders", TypeError), (None, TypeError),
])
def test_topics_kafka_refuses_are_refused_before_framing(topic, error):
    with pytest.raises(error, match="topic"):
        env.put_value(5, topic, None, b"v")


@pytest.mark.parametrize("changes", [{}, {"key": None, "partition": None, "headers": []}, {"value": None}])
def test_store_form_round_trips(changes):
    original = sample(**changes)
    assert Envelope.from_bytes(original.to_bytes()) == original


def test_delivery_headers_keep_user_headers_in_order_then_add_id_due_time_epoch():
    original = sample()
    assert original.delivery_headers(7) == [
        *original.headers, (env.ID, original.delay_id.encode()),
        (env.DELIVER_AT, b"1800000000123"), (env.EPOCH, b"7"),
    ]


def test_cancel_and_done_parse_as_tombstones():
    delay_id = new_delay_id()
    for op in (env.OP_CANCEL, env.OP_DONE):
        parsed = parse_buffer_record(delay_id.encode(), None, env.control_headers(op, delay_id))
        assert (parsed.op, parsed.delay_id, parsed.envelope) == (op, delay_id, None)


@pytest.mark.parametrize("key,value,headers,reason", [
    (None, b"put 1 t -\nx", None, "no key"),
    (b"", b"put 1 t -\nx", None, "no key"),
    (b"\xff", None, [(env.OP, b"cancel")], "not ASCII"),
    (b"id", None, [], "needs header delayq-op"),
    (b"id", None, [(env.OP, b"launch")], "expected cancel or done"),
    (b"id", None, [(env.OP, b"put")], "expected cancel or done"),
    (b"id", None, [(env.OP, b"cancel"), (env.OP, b"cancel")], "appears twice"),
    (b"id", None, [(env.OP, b"cancel"), (env.ID, b"other")], "differs from the record key"),
    (b"id", b"", None, "must start with 'put <deliver-at ms> <topic> <key length or ->"),
    (b"id", b"payload without a frame", None, "must start with 'put"),
    (b"id", b"put 1 t\nx", None, "must start with 'put"),
    (b"id", b"cancel 1 t -\n", None, "must start with 'put"),
    (b"id", b"put 1 t -" + b" " * 600 + b"\n", None, "must start with 'put"),
    (b"id", b"put soon t -\nx", None, "deliver-at time is b'soon'; expected ASCII digits"),
    (b"id", b"put -5 t -\nx", None, "deliver-at time is b'-5'"),
    (b"id", b"put  5 t -\nx", None, "expected ASCII digits"),
    (b"id", b"put 1 \xff -\nx", None, "topic in the frame is not UTF-8"),
    (b"id", b"put 1 t x\nx", None, "key length is b'x'"),
    (b"id", b"put 1 t 5\nabc", None, "key length 5 runs past the end of the value"),
    (b"id", b"put 1 t - partition=x\n", None, "partition is b'x'"),
    (b"id", b"put 1 t - colour=red\n", None, "unknown frame option b'colour=red'"),
    (b"id", b"put 1 t -\nx", [(env.OP, b"put")], "carries header delayq-op"),
    (b"id", b"put 1 t -\nx", [("ok", b"1"), (env.ID, b"id")], "carries header delayq-id"),
])
def test_malformed_records_are_refused_with_a_reason(key, value, headers, reason):
    with pytest.raises(MalformedRecord, match=reason):
        parse_buffer_record(key, value, headers)


def test_delay_ids_are_uuid7_and_sort_by_time():
    first, second = new_delay_id(1_000), new_delay_id(2_000)
    assert uuid.UUID(first).version == 7 and uuid.UUID(second).version == 7
    assert first < second
    assert check_delay_id(first) == first


@pytest.mark.parametrize("bad,error", [(42, TypeError), ("not-an-id", ValueError),
                                       (str(uuid.uuid4()).upper(), ValueError)])
def test_check_delay_id_refuses_what_is_not_an_id(bad, error):
    with pytest.raises(error, match="delay_id"):
        check_delay_id(bad)
