"""The node's stored form of a pending message (delay_service/stored.py): round trip and refusal."""

from __future__ import annotations

import marshal

import pytest

from delayq.delay_service.stored import STORED_FORM, MalformedStoredEntry, PendingMessage, pack, unpack
from delayq.wire import Envelope


def sample(**changes) -> Envelope:
    fields = {"delay_id": "0190a3e4-5b6c-7d8e-9f00-112233445566", "topic": "orders", "deliver_at_ms": 1_800_000_000_123,
              "value": b"payload", "key": b"k", "partition": 2, "headers": [("h", b"1"), ("n", None)],
              "created_at_ms": 1_799_000_000_000, "partitioner": "murmur2_random"}
    return Envelope(**{**fields, **changes})


@pytest.mark.parametrize("changes", [{}, {"key": None, "partition": None, "headers": []}, {"value": None},
                                     {"partitioner": None}])
def test_stored_form_round_trips_with_partition_and_version(changes):
    message = sample(**changes)
    assert unpack(pack(5, 711, message)) == PendingMessage(5, 711, message)


@pytest.mark.parametrize("value", [
    b"", b"\x00", b"garbage", marshal.dumps((2, "id", "t")), marshal.dumps([STORED_FORM]),
    marshal.dumps((STORED_FORM, -1, 0, "id", "t", 5, b"v", None, None, [], 0, None)),
    marshal.dumps((STORED_FORM, 0, 0, "id", "t", 5, "not bytes", None, None, [], 0, None)),
    marshal.dumps((STORED_FORM, 0, 0, "id", "t", 5, b"v", None, None, [("h",)], 0, None)),
])
def test_anything_else_is_a_malformed_stored_entry(value):
    with pytest.raises(MalformedStoredEntry, match="rebuild the store"):
        unpack(value)


def test_an_expiring_message_is_stored_in_form_5_and_every_other_stays_in_form_4_which_0_1_0_reads():
    from delayq.delay_service.stored import EXPIRING_FORM

    expiring = sample(expires_at_ms=1_800_000_060_000)
    packed = pack(3, 17, expiring)
    assert marshal.loads(packed)[0] == EXPIRING_FORM
    assert unpack(packed) == PendingMessage(3, 17, expiring)
    assert marshal.loads(pack(3, 17, sample()))[0] == STORED_FORM == 4
