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


def test_delivery_headers_keep_user_headers_in_order_then_add_id_due_time_epoch_version():
    original = sample()
    assert original.delivery_headers(7, 711) == [
        *original.headers, (env.ID, original.delay_id.encode()),
        (env.DELIVER_AT, b"1800000000123"), (env.EPOCH, b"7"), (env.VERSION, b"711"),
    ]


def test_a_done_names_the_version_it_closes_and_a_cancel_closes_any():
    delay_id = sample().delay_id
    done = env.parse_buffer_record(delay_id.encode(), None, env.done_headers(delay_id, 711, 790))
    cancel = env.parse_buffer_record(delay_id.encode(), None, env.control_headers(env.OP_CANCEL, delay_id))
    old_done = env.parse_buffer_record(delay_id.encode(), None, env.control_headers(env.OP_DONE, delay_id))

    assert (done.op, done.closes_version) == (env.OP_DONE, 711)
    assert (cancel.op, cancel.closes_version) == (env.OP_CANCEL, None)
    assert (old_done.op, old_done.closes_version) == (env.OP_DONE, None)


@pytest.mark.parametrize("headers,reason", [
    ([(env.OP, b"done"), (env.VERSION, b"7x")], "delayq-version"),
    ([(env.OP, b"done"), (env.VERSION, b"1"), (env.CUTOFF, b"-1")], "delayq-cutoff"),
    ([(env.OP, b"done"), (env.VERSION, b"1"), (env.VERSION, b"2")], "twice"),
    ([(env.OP, b"cancel"), (env.VERSION, b"1")], "only a done"),
])
def test_bad_version_or_cutoff_headers_make_a_tombstone_malformed(headers, reason):
    with pytest.raises(env.MalformedRecord, match=reason):
        env.parse_buffer_record(b"k", None, headers)


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
