"""The envelope codec: what the proxy writes, the nodes read back bit for bit."""

from __future__ import annotations

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
    (None, b"x", [(env.OP, b"put")], "no key"),
    (b"", b"x", [(env.OP, b"put")], "no key"),
    (b"\xff", None, [(env.OP, b"cancel")], "not ASCII"),
    (b"id", b"x", [], "delayq-op is missing"),
    (b"id", b"x", [(env.OP, b"launch")], "expected one of put, cancel, done"),
    (b"id", b"x", [(env.OP, b"put"), (env.DELIVER_AT, b"1")], "without header delayq-topic"),
    (b"id", b"x", [(env.OP, b"put"), (env.TOPIC, b"t")], "without header delayq-deliver-at"),
    (b"id", b"x", [(env.OP, b"put"), (env.TOPIC, b"t"), (env.DELIVER_AT, b"soon")], "expected ASCII digits"),
    (b"id", b"x", [(env.OP, b"put"), (env.TOPIC, b"t"), (env.DELIVER_AT, b"-5")], "expected ASCII digits"),
    (b"id", b"x", [(env.OP, b"put"), (env.TOPIC, b"t"), (env.DELIVER_AT, b"1"), (env.PARTITION, b"x")], "delayq-partition"),
    (b"id", b"x", [(env.OP, b"put"), (env.OP, b"put")], "appears twice"),
    (b"id", b"x", [(env.OP, b"cancel")], "must have a null value"),
    (b"id", None, [(env.OP, b"cancel"), (env.ID, b"other")], "differs from the record key"),
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
