"""Hostile input, fuzzed: every parser of outside bytes gives a verdict and never crashes.

Property-based (hypothesis, profile "ci" in tests/conftest.py: the same examples every run):

- ``parse_buffer_record``: any key, value and headers give a BufferRecord or a MalformedRecord with
  a short reason, and the verdict is the one docs/DESIGN.md ("Wire format") gives, checked against a
  reference reading of the frame written from that table;
- ``stored.unpack``: any bytes give a PendingMessage or a MalformedStoredEntry;
- ``GET /v1/messages/{id}`` on a real NodeHTTPServer: any path gets a JSON 200, 400 or 404 (500 for
  a damaged stored entry), and the server keeps answering;
- ``check_delay_id``: accepts exactly the canonical UUID text.
"""

from __future__ import annotations

import json
import marshal
import re
import socket
import time
import urllib.parse
from dataclasses import dataclass

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from delayq import wire
from delayq.delay_service import stored
from delayq.delay_service.http import NodeHTTPServer
from delayq.delay_service.metrics import NodeMetrics
from delayq.schedule import MIN_DUE_MS
from delayq.store import Put, TimeIndex
from delayq.wire import BufferRecord, Envelope, MalformedRecord, check_delay_id, parse_buffer_record

# The parsers are cheap: search them five times as long as the profile says.
MORE = settings(max_examples=settings().max_examples * 5)

# -- strategies --------------------------------------------------------------

TOPIC_ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-"
topics = st.one_of(
    st.text(TOPIC_ALPHABET, min_size=1, max_size=30),
    st.sampled_from(["a" * 249, "orders", "_x", "-", "...", ".a", "a..b"]),
).filter(lambda t: t not in (".", ".."))
delay_ids = st.uuids().map(str)
ID = b"0190a3e4-5b6c-7d8e-9f00-112233445566"
user_bytes = st.one_of(
    st.binary(max_size=64),
    st.sampled_from([b"", b"\n", b"\r\n", b"\n\n", b" ", b"\x00", b"put 1 t -\n", "é".encode(), b"\xff" * 3]),
    st.binary(min_size=500, max_size=2000),
)
offsets = st.integers(0, 10**18 - 1)  # what the frame's and the headers' 18 digits hold
dues = st.one_of(st.integers(MIN_DUE_MS, 10**18 - 1), st.just(MIN_DUE_MS))  # a due time nodes take
PARTITIONERS = ["consistent", "consistent_random", "murmur2", "murmur2_random", "fnv1a", "fnv1a_random", "random"]
partitioners = st.one_of(st.none(), st.sampled_from(PARTITIONERS))
user_header_names = st.text(max_size=20).filter(lambda name: not name.startswith(wire.RESERVED_PREFIX))
user_headers = st.lists(st.tuples(user_header_names, st.none() | st.binary(max_size=20)), max_size=5)
# Kafka's CreateTime is an int64 the producer chooses: -1 and other negatives reach the nodes.
timestamps = st.one_of(st.integers(-(2**63), 2**63 - 1), st.sampled_from([-1, 0, 1_800_000_000_000]))

RESERVED_NAMES = [wire.OP, wire.ID, wire.VERSION, wire.CUTOFF, wire.EPOCH, wire.DELIVER_AT, wire.DEAD_LETTER_REASON,
                  "delayq-", "delayq-x", "Delayq-op", "DELAYQ-OP", "delayq-op ", " delayq-op"]
header_names = st.one_of(st.sampled_from(RESERVED_NAMES), st.text(max_size=20),
                         st.text(min_size=1, max_size=20).map(lambda s: wire.RESERVED_PREFIX + s))
header_values = st.one_of(st.none(), st.binary(max_size=30),
                          st.sampled_from([b"cancel", b"done", b"put", b"CANCEL", b"done ", b"", b"0", b"7",
                                           b"-1", b"1" * 18, b"1" * 19, b"007", "٣".encode()]))
any_headers = st.one_of(st.none(), st.lists(st.tuples(header_names, header_values), max_size=6))
any_keys = st.one_of(st.none(), st.binary(max_size=40), delay_ids.map(str.encode),
                     st.sampled_from([b"", b"\x00", b"\x80", "é".encode(), b"id with space", b"\n"]))

# Fields of a frame line: the right thing mostly, wrong digits, huge numbers, spaces, bytes.
numbers = st.one_of(
    offsets.map(lambda n: str(n).encode()),
    dues.map(lambda n: str(n).encode()),
    st.sampled_from([str(MIN_DUE_MS).encode(), str(MIN_DUE_MS - 1).encode(), b"1795404000"]),
    st.integers(10**18, 10**40).map(lambda n: str(n).encode()),
    st.integers(-(10**6), -1).map(lambda n: str(n).encode()),
    st.sampled_from([b"", b"0", b"00", b"007", b"1e3", b"0x10", b"1_000", b"+5", b"1.5", b" 1", b"1 ", b"\xff",
                     "١٢".encode(), "１".encode(), "²".encode(), b"9" * 18, b"9" * 19]),
    st.binary(max_size=6),
)
topic_fields = st.one_of(
    topics.map(str.encode),
    st.sampled_from([b"", b".", b"..", b"a/b", b"a b", b"a" * 250, "é".encode(), "ordérs".encode(), b"\xff\xfe",
                     b"t\r", b"t\x00", b"t\t", "ｔ".encode()]),
    st.binary(max_size=12),
)
options = st.one_of(
    offsets.map(lambda n: b"partition=%d" % n),
    offsets.map(lambda n: b"restores=%d" % n),
    st.sampled_from(PARTITIONERS).map(lambda name: b"partitioner=" + name.encode()),
    st.from_regex(r"[a-z0-9_]{1,24}", fullmatch=True).map(lambda name: b"partitioner=" + name.encode()),
    st.just(b"value=null"),
    st.sampled_from([b"partition=", b"partition", b"partitioner=", b"partitioner", b"value=NULL", b"value=",
                     b"value", b"colour=red", b"", b"partition=-1", b"partition=1=2", b"partition=" + b"1" * 19,
                     b"partitioner=\xff", b"partitioner=" + b"x" * 600, b"=", b"value=null=1", b"Partition=1",
                     b"restores=", b"restores", b"restores=-1"]),
    st.binary(max_size=10).map(lambda raw: b"partition=" + raw),
    st.binary(max_size=10),
)


@st.composite
def frames(draw) -> bytes:
    """A put's value built to be nearly right: one field, separator or line end off, or none."""
    key = draw(st.none() | user_bytes)
    op = draw(st.sampled_from([b"put"] * 8 + [b"PUT", b"put\r", b"", b"cancel", b"done", b"pu", b"puts"]))
    length = b"-" if key is None else str(len(key)).encode()
    key_length = draw(st.one_of(
        st.just(length), st.just(length), numbers,
        st.sampled_from([b"-", b"--", b"-1", b"+1", b"0" + length, str(len(key or b"") + 1).encode(),
                         str(len(key or b"") + 10**6).encode()]),
    ))
    fields = [op, draw(numbers), draw(topic_fields), key_length, *draw(st.lists(options, max_size=4))]
    separator = draw(st.sampled_from([b" "] * 12 + [b"  ", b"\t", b" \r"]))
    line_end = draw(st.sampled_from([b"\n"] * 10 + [b"\r\n", b"", b"\n\n", b" \n", b"\r"]))
    line = separator.join(fields)
    if draw(st.integers(0, 9)) == 9:  # a frame line longer than MAX_FRAME_LINE, or just within it
        line += b" partitioner=" + b"x" * draw(st.integers(wire.MAX_FRAME_LINE - len(line) - 20, 2 * wire.MAX_FRAME_LINE))
    return line + line_end + (key or b"") + draw(user_bytes)


any_values = st.one_of(st.none(), st.binary(max_size=600), frames())

# -- the reference verdict (docs/DESIGN.md, "Wire format") --------------------------

_DIGITS = re.compile(rb"[0-9]{1,18}")  # the frame's numbers: ASCII digits, at most 18 (an int64 always)
_UUID = re.compile(rb"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")  # a delay id, lower-case
_TOPIC = re.compile(rb"[a-zA-Z0-9._-]{1,249}")  # Kafka's rule for topic names


def expected(key: bytes | None, value: bytes | None, headers, timestamp_ms: int) -> BufferRecord | None:
    """What the design says a buffer record is: a BufferRecord, or None for malformed."""
    if not key or not _UUID.fullmatch(key):
        return None
    delay_id = key.decode()
    if value is None:
        return expected_tombstone(key, headers or [])
    if any(name.startswith(wire.RESERVED_PREFIX) for name, _ in headers or []):
        return None
    line_end = value.find(b"\n")
    if not 0 <= line_end < wire.MAX_FRAME_LINE:  # at most 512 bytes, newline included
        return None
    fields = value[:line_end].split(b" ")
    if len(fields) < 4 or fields[0] != b"put" or not _DIGITS.fullmatch(fields[1]):
        return None
    if int(fields[1]) < MIN_DUE_MS:  # 2000-01-01 in ms: below it, seconds were meant
        return None
    if not _TOPIC.fullmatch(fields[2]) or fields[2] in (b".", b".."):
        return None
    rest = value[line_end + 1:]
    if fields[3] == b"-":
        key_bytes = None
    elif _DIGITS.fullmatch(fields[3]) and int(fields[3]) <= len(rest):
        key_bytes, rest = rest[:int(fields[3])], rest[int(fields[3]):]
    else:
        return None
    found: dict[str, bytes] = {}
    for option in fields[4:]:
        match = re.fullmatch(rb"(partition|restores)=([0-9]{1,18})|(partitioner)=(.+)|(value)=(null)", option,
                             re.DOTALL)
        if match is None:
            return None
        name, text = [group for group in match.groups() if group is not None]
        if name.decode() in found:
            return None
        found[name.decode()] = text
    if "value" in found and rest:
        return None
    if "partitioner" in found and found["partitioner"].decode(errors="replace") not in PARTITIONERS:
        return None
    partition = int(found["partition"]) if "partition" in found else None
    partitioner = found["partitioner"].decode(errors="replace") if "partitioner" in found else None
    message = Envelope(delay_id, fields[2].decode(), int(fields[1]), None if "value" in found else rest, key_bytes,
                       partition, headers or [], timestamp_ms, partitioner)
    restores = int(found["restores"]) if "restores" in found else None
    return BufferRecord(wire.OP_PUT, delay_id, message, None, restores)


def expected_tombstone(key: bytes, headers) -> BufferRecord | None:
    found: dict[str, bytes | None] = {}
    for name, value in headers:
        if name in (wire.OP, wire.ID, wire.VERSION, wire.CUTOFF):
            if name in found:
                return None
            found[name] = value
    op = found.get(wire.OP)
    if op not in (b"cancel", b"done"):
        return None
    # delayq-id names the record key; a null one says nothing (the key is the id).
    if found.get(wire.ID) is not None and found[wire.ID] != key:
        return None
    if op == b"cancel":
        return None if wire.VERSION in found or wire.CUTOFF in found else BufferRecord(op, key.decode())
    # A done names the version it closes and the master's cutoff, both in digits.
    version, cutoff = found.get(wire.VERSION), found.get(wire.CUTOFF)
    if version is None or cutoff is None or not _DIGITS.fullmatch(version) or not _DIGITS.fullmatch(cutoff):
        return None
    return BufferRecord(op, key.decode(), None, int(version), cutoff=int(cutoff))


def verdict(key, value, headers, timestamp_ms: int = 0) -> BufferRecord | None:
    """parse_buffer_record's answer, None for MalformedRecord; any other exception fails the test."""
    try:
        return parse_buffer_record(key, value, headers, timestamp_ms)
    except MalformedRecord as bad:
        assert isinstance(bad.reason, str) and bad.reason.strip(), "a MalformedRecord without a reason"
        assert bad.code in wire.Reason and bad.reason.startswith(f"{bad.code.value}: ")
        # The reason travels in a header of the dead-letter copy, beside the whole original record:
        # it must stay short whatever the record holds.
        assert len(bad.reason.encode()) <= 400, f"a {len(bad.reason.encode())}-byte reason: {bad.reason[:200]}"
        return None


# -- parse_buffer_record -------------------------------------------------------


@given(delay_id=delay_ids, deliver_at_ms=dues, topic=topics, key=st.none() | user_bytes,
       value=st.none() | user_bytes, partition=st.none() | offsets, partitioner=partitioners,
       restores=st.none() | offsets, headers=user_headers, timestamp_ms=timestamps)
@MORE
def test_a_put_parses_back_to_exactly_what_was_encoded(delay_id, deliver_at_ms, topic, key, value, partition,
                                                       partitioner, restores, headers, timestamp_ms):
    raw = wire.put_value(deliver_at_ms, topic, key, value, partition, partitioner, restores)

    record = parse_buffer_record(delay_id.encode(), raw, headers, timestamp_ms)

    message = Envelope(delay_id, topic, deliver_at_ms, value, key, partition, headers, timestamp_ms, partitioner)
    assert record == BufferRecord(wire.OP_PUT, delay_id, message, None, restores)
    assert record.envelope.buffer_value(restores) == raw


@given(delay_id=delay_ids, version=offsets, cutoff=offsets, extra=user_headers, data=st.data())
def test_cancel_and_done_parse_back_to_their_op_and_version_in_any_header_order(delay_id, version, cutoff, extra,
                                                                               data):
    key = delay_id.encode()
    for headers, wanted in [
        (wire.control_headers(wire.OP_CANCEL, delay_id), BufferRecord(wire.OP_CANCEL, delay_id)),
        (wire.done_headers(delay_id, version, cutoff), BufferRecord(wire.OP_DONE, delay_id, None, version,
                                                                    cutoff=cutoff)),
    ]:
        shuffled = data.draw(st.permutations(headers + extra))
        assert parse_buffer_record(key, None, shuffled) == wanted


@given(key=any_keys, value=any_values, headers=any_headers, timestamp_ms=timestamps)
@MORE
@example(key=ID, value=b"put 1800000000000 t -\nx", headers=[("delayq-" + "x" * 5_000, b"")], timestamp_ms=0)
def test_any_record_is_parsed_or_malformed_as_the_design_says(key, value, headers, timestamp_ms):
    got = verdict(key, value, headers, timestamp_ms)

    assert got == expected(key, value, headers, timestamp_ms)
    if got is not None and got.envelope is not None:
        # A put that passes can be delivered and, if need be, dead-lettered as it was written.
        assert wire.check_topic(got.envelope.topic) == got.envelope.topic
        again = parse_buffer_record(key, got.envelope.buffer_value(got.restores), headers, timestamp_ms)
        assert again == got


@given(key=delay_ids.map(str.encode), value=frames(), headers=st.none() | user_headers)
@MORE
def test_nearly_right_frames_are_parsed_or_malformed_as_the_design_says(key, value, headers):
    assert verdict(key, value, headers) == expected(key, value, headers, 0)


@given(key=delay_ids.map(str.encode), headers=st.lists(st.tuples(st.sampled_from(RESERVED_NAMES[:4]) | header_names,
                                                                 header_values), max_size=6))
@MORE
def test_tombstones_with_any_headers_are_parsed_or_malformed_as_the_design_says(key, headers):
    assert verdict(key, None, headers) == expected(key, None, headers, 0)


@pytest.mark.parametrize("value,reason", [
    # Each once parsed as a put; the first killed every master in turn (delivery could not dead-letter it).
    (b"put 1800000000000 a/b -\nx", "not a Kafka topic name"),
    (b"put 1800000000000  -\nx", "not a Kafka topic name"),
    ("put 1800000000000 ordérs -\nx".encode(), "not a Kafka topic name"),
    (b"put 1800000000000 .. -\nx", "not a Kafka topic name"),
    (b"put 1800000000000 t - value=null\nforgotten", "value=null but 9 bytes follow"),
    (b"put 1800000000000 t - partition=1 partition=2\nx", "partition appears twice"),
    (b"put 1800000000000 t - partitioner=murmur2 partitioner=fnv1a\nx", "partitioner appears twice"),
    (b"put 1800000000000 t - value=null value=null\n", "value appears twice"),
    # Each was delivered at once: a due time in seconds, and a partitioner no node knows.
    (b"put 1795404000 t -\nx", "were seconds meant"),
    (b"put 1800000000000 t - partitioner=sticky\nx", "unknown partitioner 'sticky'"),
])
def test_frames_that_once_passed_are_malformed(value, reason):
    with pytest.raises(MalformedRecord, match=reason):
        parse_buffer_record(ID, value, [])


@pytest.mark.parametrize("headers,reason", [
    # A null delayq-version was taken for an absent one: the done closed whatever version was stored.
    ([(wire.OP, b"done"), (wire.VERSION, None), (wire.CUTOFF, b"3")], "delayq-version is b''"),
    ([(wire.OP, b"done"), (wire.VERSION, b"3"), (wire.CUTOFF, None)], "delayq-cutoff is b''"),
    ([(wire.OP, b"cancel"), (wire.CUTOFF, None)], "only a done has"),
])
def test_a_null_version_or_cutoff_header_is_malformed_not_absent(headers, reason):
    with pytest.raises(MalformedRecord, match=reason):
        parse_buffer_record(ID, None, headers)


def test_the_reason_names_a_long_reserved_header_in_short():
    # It once quoted the whole name: a put with a 500 kB header name got a dead-letter copy twice that size.
    with pytest.raises(MalformedRecord) as bad:
        parse_buffer_record(ID, b"put 1800000000000 t -\n", [("delayq-" + "x" * 500_000, b"")])
    assert len(bad.value.reason) < 300


# -- the stored form ----------------------------------------------------------

envelopes = st.builds(
    Envelope, delay_id=delay_ids | st.text(st.characters(max_codepoint=127), min_size=1, max_size=40), topic=topics,
    deliver_at_ms=st.integers(0, 2**63 - 1), value=st.none() | user_bytes, key=st.none() | user_bytes,
    partition=st.none() | st.integers(0, 2**63 - 1), headers=user_headers, created_at_ms=timestamps,
    partitioner=st.none() | st.text(max_size=30),
)


@given(buffer_partition=st.integers(0, 2**31 - 1), version=st.integers(0, 2**63 - 1), message=envelopes)
def test_the_stored_form_round_trips(buffer_partition, version, message):
    assert stored.unpack(stored.pack(buffer_partition, version, message)) == stored.PendingMessage(
        buffer_partition, version, message)


@given(key=delay_ids.map(str.encode), value=frames(), headers=user_headers, timestamp_ms=timestamps,
       version=st.integers(0, 2**63 - 1))
def test_every_put_ingest_accepts_round_trips_through_the_store(key, value, headers, timestamp_ms, version):
    record = verdict(key, value, headers, timestamp_ms)
    if record is not None:
        assert stored.unpack(stored.pack(1, version, record.envelope)).message == record.envelope


marshalled = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.binary(max_size=10), st.text(max_size=10)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.lists(inner, max_size=12).map(tuple),
                            st.frozensets(st.integers() | st.text(max_size=4), max_size=4),
                            st.dictionaries(st.text(max_size=4), inner, max_size=3)),
    max_leaves=20,
).map(marshal.dumps)


# Bytes that damage writes. Not 0x02-0x7F, and no deletions (which shift such a byte in): as the
# top byte of the headers list's length they make marshal allocate gigabytes and spend seconds
# before it fails (reported; reachable only through a damaged store).
DAMAGE = st.sampled_from([0x00, 0x01, 0x80, 0xA9, 0xE9, 0xFF])


@st.composite
def damaged(draw) -> bytes:
    """A stored value (or a marshal of something else) with a few bytes set or inserted, or cut short."""
    data = bytearray(draw(st.one_of(envelopes.map(lambda m: stored.pack(0, 1, m)), marshalled)))
    for _ in range(draw(st.integers(1, 4))):
        # Where, as a share of the length: marshal's output for equal objects can differ in length
        # (its ref flags follow reference counts), and a draw must not depend on that.
        at = draw(st.integers(0, 1 << 16)) * len(data) >> 16
        edit = draw(st.sampled_from(["set", "insert", "cut"]))
        if edit == "insert" or at == len(data):
            data.insert(at, draw(DAMAGE))
        elif edit == "set":
            data[at] = draw(DAMAGE)
        else:
            del data[at:]
    return bytes(data)


def unpacked(value: bytes) -> stored.PendingMessage | None:
    try:
        return stored.unpack(value)
    except stored.MalformedStoredEntry as bad:
        assert "rebuild the store" in str(bad)
        return None


@given(value=st.one_of(st.binary(max_size=300), marshalled, damaged()))
@MORE
def test_any_bytes_unpack_to_a_pending_message_or_a_malformed_stored_entry(value):
    message = unpacked(value)
    if message is not None:
        again = stored.pack(message.buffer_partition, message.version, message.message)
        assert stored.unpack(again) == message


def single_byte_damage(value: bytes):
    for at in range(len(value)):
        for byte in (0x00, 0x01, 0x80, 0xFF):  # see DAMAGE
            yield value[:at] + bytes([byte]) + value[at + 1:]


def test_every_single_byte_damage_of_a_stored_value_is_a_verdict():
    message = Envelope("0190a3e4-5b6c-7d8e-9f00-112233445566", "orders", 1_800_000_000_123, b"v", b"k", 2,
                       [("h", b"1"), ("n", None)], -1, "murmur2_random")
    for value in single_byte_damage(stored.pack(5, 711, message)):
        unpacked(value)


def test_a_damaged_code_object_in_a_stored_value_is_a_malformed_stored_entry():
    # marshal builds code objects, and a damaged one raises SystemError, which unpack let through.
    value = marshal.dumps((stored.STORED_FORM, compile("1", "x", "eval")))
    for damaged_value in single_byte_damage(value):
        unpacked(damaged_value)


def test_a_value_claiming_a_list_of_a_billion_items_is_refused_at_once():
    started = time.monotonic()
    with pytest.raises(stored.MalformedStoredEntry):
        stored.unpack(b"[" + (2**30).to_bytes(4, "little") + b"\xe9\x01\x00\x00\x00")
    assert time.monotonic() - started < 0.5


def test_a_put_with_a_negative_kafka_timestamp_is_readable_from_the_store():
    # Kafka keeps a producer's CreateTime of -1 or -5; unpack refused it and the put was never delivered.
    record = parse_buffer_record(ID, b"put 1800000000000 t -\nx", [], -5)
    assert stored.unpack(stored.pack(0, 3, record.envelope)).message.created_at_ms == -5


# -- check_delay_id --------------------------------------------------------------

CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
uuid_variants = st.uuids().flatmap(lambda u: st.sampled_from([
    str(u), str(u).upper(), "{" + str(u) + "}", "urn:uuid:" + str(u), u.hex, str(u) + "\n", " " + str(u),
    str(u).replace("-", "", 1), str(u)[:-1], str(u) + "0", str(u).replace("0", "０"), str(u).replace("-", "_"),
]))
any_text = st.text(st.characters(exclude_categories=()), max_size=60)  # surrogates included


@given(candidate=st.one_of(uuid_variants, any_text, st.binary(max_size=40), st.integers(), st.none(),
                           st.uuids()))
@MORE
def test_check_delay_id_accepts_exactly_the_canonical_uuid_text(candidate):
    try:
        result = check_delay_id(candidate, "id")
    except TypeError as err:
        assert not isinstance(candidate, str) and "id must be a str" in str(err)
    except ValueError as err:
        assert isinstance(candidate, str) and not CANONICAL_UUID.fullmatch(candidate)
        assert str(err).startswith("id ")
    else:
        assert result == candidate and CANONICAL_UUID.fullmatch(candidate)


# -- GET /v1/messages/{id} on a real server -----------------------------------------


class StandInNode:
    """delay_service.http.NodeView: the slice of a node the HTTP handler may use; any other attribute fails loudly."""

    __slots__ = ("registry", "store")

    def __init__(self, store: TimeIndex):
        self.store = store
        self.registry = NodeMetrics().registry

    def shard_of(self, delay_id: str) -> tuple[int, bool]:
        return 0, True  # one shard, held

    def entry(self, delay_id: str):
        return self.store.get(delay_id)

    def alive(self) -> bool:
        return True

    def ready(self) -> tuple[bool, str]:
        return True, "caught up (standby)"


PENDING = "0190a3e4-5b6c-7d8e-9f00-112233445566"
DAMAGED = "0190a3e4-5b6c-7d8e-9f00-1122334455ff"


def store_message(store: TimeIndex, delay_id: str, deliver_at_ms: int, topic: str = "orders") -> None:
    message = Envelope(delay_id, topic, deliver_at_ms, b"v", None, None, [], 0, None)
    store.apply([Put(delay_id, deliver_at_ms, stored.pack(0, 7, message), 7)], {})


@dataclass
class Served:
    port: int
    store: TimeIndex


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A real NodeHTTPServer on a free port, its node a stand-in around a real store."""
    store = TimeIndex(tmp_path_factory.mktemp("http") / "store")
    store_message(store, PENDING, 1_800_000_000_123)
    store.apply([Put(DAMAGED, 1_800_000_000_000, b"not a stored value", 1)], {})
    http = NodeHTTPServer(StandInNode(store), "127.0.0.1", 0)
    http.start()
    yield Served(http.port, store)
    http.stop()
    store.close()


def request(port: int, target: bytes) -> tuple[int, bytes, bytes]:
    """GET ``target`` (the raw request target) over a socket: status, content type, body."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"GET " + target + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        response = b""
        while chunk := sock.recv(65536):
            response += chunk
    assert response, f"no answer to GET {target[:80]!r}: the handler raised"
    head, _, body = response.partition(b"\r\n\r\n")
    status_line, *header_lines = head.split(b"\r\n")
    headers = dict(line.lower().split(b": ", 1) for line in header_lines)
    return int(status_line.split(b" ")[1]), headers.get(b"content-type", b""), body


def answer(port: int, target: bytes) -> tuple[int, dict]:
    status, content_type, body = request(port, target)
    assert content_type == b"application/json", (status, body[:200])
    return status, json.loads(body)


def expected_status(path: str) -> int:
    """The lookup's answer for the request path (before any '?'), per docs/DESIGN.md."""
    path = path.split("?", 1)[0]
    delay_id = path[len("/v1/messages/"):]
    if not path.startswith("/v1/messages/") or not CANONICAL_UUID.fullmatch(delay_id):
        return 404 if not path.startswith("/v1/messages/") else 400
    return {PENDING: 200, DAMAGED: 500}.get(delay_id, 404)


def still_answers(port: int) -> None:
    assert request(port, b"/livez")[:2] == (200, b"text/plain")
    assert answer(port, b"/v1/messages/" + PENDING.encode()) == (200, {
        "id": PENDING, "status": "pending", "deliver_at_ms": 1_800_000_000_123,
        "deliver_at": "2027-01-15T08:00:00.123Z", "topic": "orders"})


@given(suffix=st.one_of(st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=80),
                        uuid_variants.filter(lambda text: not any(c.isspace() for c in text)),
                        st.sampled_from([PENDING, DAMAGED, PENDING + "?x=1", PENDING + "#f"])))
def test_any_printable_lookup_path_gets_a_json_200_400_or_404(server, suffix):
    target = "/v1/messages/" + suffix
    status, body = answer(server.port, target.encode())

    assert status == expected_status(target)
    assert ("error" in body) if status in (400, 500) else body["id"] == target.split("?")[0][13:]


@given(text=any_text.filter(lambda t: not any(0xD800 <= ord(c) <= 0xDFFF for c in t)) | uuid_variants)
def test_any_percent_encoded_unicode_path_gets_a_json_answer(server, text):
    quoted = urllib.parse.quote(text, safe="")
    status, _ = answer(server.port, b"/v1/messages/" + quoted.encode())

    assert status == expected_status("/v1/messages/" + quoted)


@given(raw=st.binary(max_size=120).filter(lambda raw: b"\r" not in raw and b"\n" not in raw)
       | st.text(max_size=40).map(lambda t: t.replace("\r", "").replace("\n", "").encode()))
def test_raw_bytes_in_the_path_never_take_the_server_down(server, raw):
    target = b"/v1/messages/" + raw
    status, content_type, body = request(server.port, target)

    # http.server decodes the request line as Latin-1 and splits it on whitespace (0x85 and 0xA0
    # too): a path with whitespace inside is refused as a bad request line before delayq's handler runs.
    words = target.decode("latin-1").split()
    if len(words) == 1:
        assert content_type == b"application/json"
        assert status == expected_status(words[0])
        json.loads(body)
    else:
        assert status == 400


@pytest.mark.parametrize("length", [36, 1_000, 10_000, 65_490, 65_510, 1_000_000])
def test_overlong_paths_are_refused_and_the_server_goes_on(server, length):
    try:
        status, _, _ = request(server.port, b"/v1/messages/" + b"a" * length)
    except (ConnectionResetError, BrokenPipeError):
        status = 414  # http.server answered 414 and closed while the rest was still being sent
    # A request line past 65536 bytes is http.server's to refuse: 414, in its own HTML.
    line = len(b"GET /v1/messages/ HTTP/1.1\r\n") + length
    assert status == (400 if line <= 65_536 else 414)
    still_answers(server.port)


@given(delay_id=delay_ids, deliver_at_ms=offsets, topic=topics)
@example(delay_id="0190a3e4-5b6c-7d8e-9f00-000000000001", deliver_at_ms=10**18 - 1, topic="t")
@example(delay_id="0190a3e4-5b6c-7d8e-9f00-000000000002", deliver_at_ms=253_402_300_800_000, topic="t")
def test_a_stored_message_at_any_due_time_answers_200(server, delay_id, deliver_at_ms, topic):
    store_message(server.store, delay_id, deliver_at_ms, topic)

    status, body = answer(server.port, b"/v1/messages/" + delay_id.encode())

    assert (status, body["deliver_at_ms"], body["topic"]) == (200, deliver_at_ms, topic)
    # Past year 9999 datetime cannot write the time: deliver_at_ms alone says it.
    assert body["deliver_at"] is None or body["deliver_at"].endswith("Z")


@given(delay_id=delay_ids, value=st.one_of(st.binary(max_size=200), damaged()))
def test_a_damaged_stored_entry_answers_500_with_a_json_error(server, delay_id, value):
    server.store.apply([Put(delay_id, 5, value, 1)], {})

    status, body = answer(server.port, b"/v1/messages/" + delay_id.encode())

    assert status in (200, 500)
    assert ("error" in body) if status == 500 else body["status"] == "pending"


def test_the_server_still_answers_after_all_that(server):
    still_answers(server.port)
