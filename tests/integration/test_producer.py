"""delayq.Producer on the real broker: drop-in for immediate messages, the envelope for delayed ones.

Delivery by the delay service is in test_producer_delivery.py; here the buffer topic is
read directly, so what the proxy wrote is checked bit for bit.
"""

from __future__ import annotations

import subprocess
import time
from datetime import UTC, datetime, timedelta, timezone

import pytest
from confluent_kafka import KafkaException
from confluent_kafka import Producer as PlainProducer
from support.kafka_testing import create_topics, end_offsets, read_topic
from support.process_testing import run_delayq, wait_until

import delayq
from delayq import wire
from delayq.delay_service import ensure_topics
from delayq.wire import Envelope, buffer_partition, parse_buffer_record

pytestmark = pytest.mark.integration

DAY_S = 86_400


@pytest.fixture
def buffer(settings) -> str:
    ensure_topics(settings)
    return settings.buffer_topic


@pytest.fixture
def target(settings, names) -> str:
    topic = names.topic("target")
    create_topics(settings.bootstrap_servers, [topic], partitions=3)
    # A topic this new may still show no partitions in metadata: a test comparing its end
    # offsets before and after would see {} turn into {0: 0, 1: 0, 2: 0}.
    assert wait_until(lambda: len(end_offsets(settings.bootstrap_servers, topic)) == 3)
    return topic


def make_producer(settings, **conf) -> delayq.Producer:
    return delayq.Producer({"bootstrap.servers": settings.bootstrap_servers, "delayq.cluster": settings.cluster,
                            "linger.ms": 1, **conf})


@pytest.fixture
def producer(settings, buffer) -> delayq.Producer:
    return make_producer(settings)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def as_bytes(value) -> bytes | None:
    return value.encode() if isinstance(value, str) else value


# The Producer example from confluent-kafka-python's README, verbatim.
README_EXAMPLE = '''
from confluent_kafka import Producer


p = Producer({'bootstrap.servers': 'mybroker1,mybroker2'})

def delivery_report(err, msg):
    """ Called once for each message produced to indicate delivery result.
        Triggered by poll() or flush(). """
    if err is not None:
        print('Message delivery failed: {}'.format(err))
    else:
        print('Message delivered to {} [{}]'.format(msg.topic(), msg.partition()))

for data in some_data_source:
    # Trigger any available delivery report callbacks from previous produce() calls
    p.poll(0)

    # Asynchronously produce a message, the delivery report callback
    # will be triggered from poll() above, or flush() below, when the message has
    # been successfully delivered or failed permanently.
    p.produce('mytopic', data.encode('utf-8'), callback=delivery_report)

# Wait for any outstanding messages to be delivered and delivery report
# callbacks to be triggered.
p.flush()
'''


def test_confluent_readme_producer_example_runs_unchanged_with_only_the_import_swapped(settings, names, capsys):
    topic = names.topic("mytopic")
    create_topics(settings.bootstrap_servers, [topic])
    source = README_EXAMPLE.replace("from confluent_kafka import Producer", "from delayq import Producer")
    assert source.count("delayq") == 1
    # Only the example's placeholders are filled in: the broker list and the topic name.
    source = source.replace("mybroker1,mybroker2", settings.bootstrap_servers).replace("'mytopic'", repr(topic))

    exec(compile(source, "confluent-kafka-python/README.md", "exec"), {"some_data_source": ["one", "two", "3"]})

    assert capsys.readouterr().out == f"Message delivered to {topic} [0]\n" * 3
    records = read_topic(settings.bootstrap_servers, topic, expect=3)
    assert [(r.value(), r.key(), r.headers()) for r in records] == [(b"one", None, None), (b"two", None, None),
                                                                     (b"3", None, None)]


def test_immediate_message_lands_on_its_topic_at_once_untouched(producer, settings, buffer, target):
    buffer_ends = end_offsets(settings.bootstrap_servers, buffer)
    reports = []
    headers = [("trace", b"\x00\x01"), ("trace", b"again"), ("delayq-id", b"forwarded from upstream")]
    sent_at = now_ms()

    returned = producer.produce(target, b"\xffnow", b"k1", 2, lambda err, msg: reports.append((err, msg)),
                                headers=headers)
    producer.flush(10)

    assert returned is None
    assert [(err, msg.topic(), msg.partition()) for err, msg in reports] == [(None, target, 2)]
    [record] = read_topic(settings.bootstrap_servers, target, expect=1, idle_s=0.5)
    assert (record.partition(), record.key(), record.value(), record.headers()) == (2, b"k1", b"\xffnow", headers)
    assert record.timestamp()[1] - sent_at < 1000
    assert end_offsets(settings.bootstrap_servers, buffer) == buffer_ends


def expected_envelope(record, topic, value, key, partition, headers, partitioner) -> Envelope:
    """The envelope the proxy must have written for this record, built by the envelope module itself."""
    if isinstance(headers, dict):
        headers = list(headers.items())
    # The due time is the one thing the test cannot know in advance; the frame line's second field.
    deliver_at_ms = int(record.value().split(b" ", 2)[1])
    return Envelope(delay_id=record.key().decode(), topic=topic, deliver_at_ms=deliver_at_ms,
                    value=as_bytes(value), key=as_bytes(key), partition=None if partition == -1 else partition,
                    headers=[(name, as_bytes(v)) for name, v in headers or []],
                    created_at_ms=record.timestamp()[1], partitioner=partitioner)


@pytest.mark.parametrize("conf,message,delay", [
    ({}, dict(value=b"\x00pay", key=b"\xffk", headers=[("trace", b"a"), ("trace", b"b"), ("empty", None)]), 30),
    ({}, dict(value=None, partition=2, headers={"h1": b"x", "h2": "text"}), 0.0015),
    ({}, dict(value="str value", key="str key", timestamp=1_700_000_000_000), timedelta(hours=2)),
    ({"partitioner": "murmur2_random"}, dict(value=b"v", key=b"order-17"), 2.5),
    ({"partitioner": "consistent"}, dict(value=b"", key=None), DAY_S),
], ids=["bytes-headers-list", "partition-null-value-dict-headers", "str-key-value-timestamp",
        "murmur2-partitioner", "consistent-null-key"])
def test_delayed_message_lands_in_the_buffer_in_the_exact_envelope(settings, buffer, target, conf, message, delay):
    producer = make_producer(settings, **conf)
    before = now_ms()

    delay_id = producer.produce(target, delay=delay, **message)
    after = now_ms()
    assert producer.flush(10) == 0

    [record] = read_topic(settings.bootstrap_servers, buffer, expect=1, idle_s=0.5)
    partitioner = conf.get("partitioner")
    expected = expected_envelope(record, target, message.get("value"), message.get("key"),
                                 message.get("partition", -1), message.get("headers"), partitioner)
    assert record.key() == delay_id.encode()
    assert record.partition() == buffer_partition(delay_id, settings.buffer_partitions)
    assert record.value() == expected.buffer_value()
    assert (record.headers() or []) == [(n, as_bytes(v)) for n, v in expected.buffer_headers()]
    assert parse_buffer_record(record.key(), record.value(), record.headers(), record.timestamp()[1]).envelope == expected
    # The put's creation time is its record timestamp: the user's, or the producer's clock.
    if "timestamp" in message:
        assert record.timestamp()[1] == expected.created_at_ms == message["timestamp"]
    else:
        assert before <= expected.created_at_ms <= after
    span_ms = round((delay if isinstance(delay, timedelta) else timedelta(seconds=delay)) / timedelta(milliseconds=1))
    assert before + span_ms <= expected.deliver_at_ms <= after + span_ms


def test_deliver_at_datetime_and_epoch_ms_are_stored_to_the_millisecond(producer, settings, buffer, target):
    when = datetime.now(timezone(timedelta(hours=5, minutes=30))) + timedelta(minutes=10)
    first = producer.produce(target, b"at datetime", deliver_at=when)
    epoch_ms = now_ms() + 3_600_123
    second = producer.produce(target, b"at epoch ms", deliver_at=epoch_ms)
    past = producer.produce(target, b"already due", deliver_at=datetime(2020, 1, 1, tzinfo=UTC))
    producer.flush(10)

    due = {r.key().decode(): parse_buffer_record(r.key(), r.value(), r.headers(), r.timestamp()[1]).envelope.deliver_at_ms
           for r in read_topic(settings.bootstrap_servers, buffer, expect=3, idle_s=0.5)}
    # Rounded up: a due time between two milliseconds is not reached before the later one.
    when_ms = -((when - datetime(1970, 1, 1, tzinfo=UTC)) // -timedelta(milliseconds=1))
    assert due == {first: when_ms, second: epoch_ms, past: 1_577_836_800_000}


def test_on_delivery_reports_the_buffer_write_keyed_by_the_delay_id(producer, buffer, target):
    reports, aliased = [], []

    delay_id = producer.produce(target, b"v", on_delivery=lambda err, msg: reports.append((err, msg)), delay=60)
    other_id = producer.produce(target, b"w", delay=60, callback=lambda err, msg: aliased.append((err, msg)))
    producer.flush(10)

    [(err, msg)] = reports
    assert (err, msg.topic(), msg.key()) == (None, buffer, delay_id.encode())
    # The value is the buffer record's: the envelope's frame line, then the payload.
    assert msg.value().startswith(f"put {msg.value().split()[1].decode()} {target} -\n".encode())
    assert msg.value().endswith(b"\nv")
    assert msg.partition() == buffer_partition(delay_id, 3) and msg.offset() is not None
    assert [(e, m.key().decode()) for e, m in aliased] == [(None, other_id)]


def test_cancel_writes_a_tombstone_on_the_put_partition(producer, settings, buffer, target):
    delay_id = producer.produce(target, b"to cancel", key=b"k", delay=60)
    producer.cancel(delay_id)
    producer.flush(10)
    report = delayq.cancel(delay_id, conf={"bootstrap.servers": settings.bootstrap_servers,
                                           "delayq.cluster": settings.cluster})

    put, cancel, again = read_topic(settings.bootstrap_servers, buffer, expect=3, idle_s=0.5)
    assert {put.partition(), cancel.partition(), again.partition(), report.partition()} == {
        buffer_partition(delay_id, 3)}
    for tombstone in (cancel, again):
        assert (tombstone.key(), tombstone.value()) == (delay_id.encode(), None)
        assert tombstone.headers() == [(wire.OP, wire.OP_CANCEL), (wire.ID, delay_id.encode())]
    assert report.offset() == again.offset()


def test_reschedule_puts_the_same_id_again_with_the_new_due_time(producer, settings, buffer, target):
    delay_id = producer.produce(target, b"first", key=b"k", delay=60)
    producer.flush(10)

    returned = producer.reschedule(delay_id, target, b"second", key=b"k", headers=[("v", b"2")], delay=120)
    producer.flush(10)

    first, second = (parse_buffer_record(r.key(), r.value(), r.headers(), r.timestamp()[1])
                     for r in read_topic(settings.bootstrap_servers, buffer, expect=2, idle_s=0.5))
    assert returned == delay_id == first.delay_id == second.delay_id
    assert (second.op, second.envelope.value, second.envelope.headers) == (wire.OP_PUT, b"second", [("v", b"2")])
    # The due time is the proxy's clock plus the delay; the creation time is the record
    # timestamp librdkafka takes an instant later, so it can be a millisecond or so past.
    for record, delay_ms in ((second, 120_000), (first, 60_000)):
        accepted_at = record.envelope.deliver_at_ms - delay_ms
        assert accepted_at <= record.envelope.created_at_ms <= accepted_at + 50


def test_puts_and_cancels_agree_on_the_partition_whatever_the_partitioner(settings, buffer, target):
    producers = [make_producer(settings, partitioner=name) for name in ("murmur2_random", "fnv1a", "random")]
    ids = [p.produce(target, b"v", key=f"k{i}".encode(), delay=60) for i, p in enumerate(producers)]
    for delay_id in ids:
        producers[0].cancel(delay_id)
    for p in producers:
        p.flush(10)

    partitions = {}
    for record in read_topic(settings.bootstrap_servers, buffer, expect=6, idle_s=0.5):
        partitions.setdefault(record.key().decode(), set()).add(record.partition())
    assert partitions == {delay_id: {buffer_partition(delay_id, 3)} for delay_id in ids}


def test_buffer_partition_is_librdkafkas_consistent_hash(settings, names):
    topic = names.topic("five")
    create_topics(settings.bootstrap_servers, [topic], partitions=5)
    plain = PlainProducer({"bootstrap.servers": settings.bootstrap_servers, "partitioner": "consistent"})
    ids = [wire.new_delay_id() for _ in range(40)]
    for delay_id in ids:
        plain.produce(topic, b"", delay_id)
    plain.flush(10)

    placed = {r.key().decode(): r.partition() for r in read_topic(settings.bootstrap_servers, topic, expect=40)}
    assert placed == {delay_id: buffer_partition(delay_id, 5) for delay_id in ids}


def test_delayed_messages_ride_the_producers_transaction(settings, buffer, target, names):
    producer = make_producer(settings, **{"transactional.id": names.topic("tx")})
    producer.init_transactions(30)
    producer.begin_transaction()
    aborted = producer.produce(target, b"aborted", delay=60)
    producer.abort_transaction(30)
    producer.begin_transaction()
    committed = producer.produce(target, b"committed", delay=60)
    producer.commit_transaction(30)

    seen = [r.key().decode() for r in read_topic(settings.bootstrap_servers, buffer, expect=1, idle_s=1)]
    assert seen == [committed] and aborted != committed


BAD_INPUTS = [
    (dict(delay=-1), ValueError, r"delay must be >= 0 seconds; got -1"),
    (dict(delay=timedelta(seconds=-1)), ValueError, r"delay must be >= 0"),
    (dict(delay=float("nan")), ValueError, r"delay must be a finite number of seconds; got nan"),
    (dict(delay=float("inf")), ValueError, r"delay must be a finite number of seconds; got inf"),
    (dict(delay=True), TypeError, r"delay must be seconds as an int or float, or a timedelta; got bool True"),
    (dict(delay="30"), TypeError, r"delay must be seconds .*; got str '30'"),
    (dict(delay=5, deliver_at=1_900_000_000_000), ValueError, r"give delay or deliver_at, not both"),
    (dict(deliver_at=datetime(2030, 1, 1)), ValueError, r"deliver_at must be a timezone-aware datetime"),
    (dict(deliver_at=1.9e12), TypeError, r"deliver_at must be a timezone-aware datetime or epoch milliseconds"),
    (dict(deliver_at=-1), ValueError, r"deliver_at -1 is before 2000-01-01 in epoch milliseconds"),
    (dict(deliver_at=1_795_404_000), ValueError, r"deliver_at 1795404000 is before 2000-01-01 in epoch milliseconds: "
                                                 r"did you mean seconds\? use deliver_at=1795404000000 or a datetime"),
    (dict(deliver_at=datetime(1999, 12, 31, 23, tzinfo=UTC)), ValueError,
     r"deliver_at 1999-12-31T23:00:00\+00:00 is before 2000-01-01T00:00:00Z"),
    (dict(delay=5, timestamp=1.7e12), TypeError, r"timestamp must be epoch milliseconds as an int \(0: now\); "
                                                 r"got float"),
    (dict(delay=5, timestamp="now"), TypeError, r"timestamp must be epoch milliseconds as an int"),
    (dict(delay=366 * DAY_S), ValueError, r"delay 31622400 is 366 days .* beyond the maximum delay of 365 days"),
    (dict(delay=timedelta(days=365, seconds=1)), ValueError, r"beyond the maximum delay of 365 days"),
    (dict(deliver_at=datetime.now(UTC) + timedelta(days=400)), ValueError, r"deliver_at .* beyond the maximum"),
    (dict(delay=5, headers=[("ok", b"1"), ("delayq-id", b"x")]), ValueError,
     r"headers: name 'delayq-id' starts with 'delayq-', which delayq reserves"),
    (dict(delay=5, headers={"delayq-anything": b"x"}), ValueError, r"name 'delayq-anything' starts with 'delayq-'"),
    (dict(delay=5, headers=[(b"delayq-op", b"cancel")]), ValueError, r"name b'delayq-op' starts with 'delayq-'"),
    (dict(delay=5, partition=-2), ValueError, r"partition must be -1 .* or a partition number >= 0"),
    (dict(delay=5, headers="trace=1"), TypeError, r"headers must be a dict or a list of \(name, value\) tuples"),
    (dict(delay=5, key=17), TypeError, r"key must be str, bytes or None; got int"),
    (dict(delay=5, value={"a": 1}), TypeError, r"value must be str, bytes or None; got dict"),
    (dict(delay=5, topic="orders and more"), ValueError, r"topic 'orders and more' is not a valid Kafka topic name"),
    (dict(delay=5, topic=b"orders"), TypeError, r"topic must be a str; got bytes"),
    (dict(delay_id="0190a3e4-5b6c-7d8e-9f00-112233445566"), ValueError, r"delay_id needs delay or deliver_at"),
    (dict(delay=5, delay_id="order-17"), ValueError, r"delay_id 'order-17' is not a delay id"),
]


@pytest.mark.parametrize("kwargs,error,message", BAD_INPUTS, ids=[m[:40] for _, _, m in BAD_INPUTS])
def test_bad_input_raises_and_sends_nothing(producer, settings, buffer, target, kwargs, error, message):
    ends = {topic: end_offsets(settings.bootstrap_servers, topic) for topic in (buffer, target)}

    with pytest.raises(error, match=message):
        producer.produce(**{"topic": target, "value": b"v", **kwargs})
    producer.flush(5)

    assert {topic: end_offsets(settings.bootstrap_servers, topic) for topic in (buffer, target)} == ends


@pytest.mark.parametrize("call,error,message", [
    (lambda p: p.cancel("not-an-id"), ValueError, r"delay_id 'not-an-id' is not a delay id"),
    (lambda p: p.cancel(12345), TypeError, r"delay_id must be a str"),
    (lambda p: p.cancel("0190A3E4-5B6C-7D8E-9F00-112233445566"), ValueError, r"is not a delay id"),
    (lambda p: delayq.cancel("nope", conf={}), ValueError, r"delay_id 'nope' is not a delay id"),
    (lambda p: p.reschedule("nope", "t", b"v", delay=5), ValueError, r"delay_id 'nope' is not a delay id"),
    (lambda p: p.reschedule(wire.new_delay_id(), "t", b"v"), ValueError, r"give delay .* or deliver_at"),
    (lambda p: p.reschedule(wire.new_delay_id(), "t", b"v", deliver_at=1_795_404_000), ValueError,
     r"deliver_at 1795404000 is before 2000-01-01 in epoch milliseconds: did you mean seconds\?"),
    (lambda p: p.produce("t", b"v", deliver_at=946_684_799_999, delay_id=wire.new_delay_id()), ValueError,
     r"deliver_at 946684799999 is before 2000-01-01"),
    (lambda p: p.produce_batch("t", [{"value": b"v", "delay": 5}]), TypeError, r"cannot delay messages"),
], ids=["cancel-malformed", "cancel-int", "cancel-uppercase", "module-cancel", "reschedule-malformed",
        "reschedule-no-time", "reschedule-seconds", "re-put-before-2000", "batch-delay"])
def test_bad_ids_and_calls_raise_and_send_nothing(producer, settings, buffer, call, error, message):
    ends = end_offsets(settings.bootstrap_servers, buffer)

    with pytest.raises(error, match=message):
        call(producer)
    producer.flush(5)

    assert end_offsets(settings.bootstrap_servers, buffer) == ends


def test_max_delay_comes_from_the_conf(settings, buffer, target):
    producer = make_producer(settings, **{"delayq.max.delay.ms": 1000})
    ends = end_offsets(settings.bootstrap_servers, buffer)

    producer.produce(target, b"ok", delay=1)
    with pytest.raises(ValueError, match=r"delay 1.5 is 1.5 s \(1500 ms\) ahead, beyond the maximum delay of 1 s"):
        producer.produce(target, b"too late", delay=1.5)
    producer.flush(10)

    assert sum(end_offsets(settings.bootstrap_servers, buffer).values()) == sum(ends.values()) + 1


def test_missing_buffer_topic_says_to_run_delayq_init(settings, target):
    producer = make_producer(settings, partitioner="murmur2_random")

    with pytest.raises(KafkaException, match=rf"buffer topic '{settings.buffer_topic}' does not exist: "
                                             r"create it with `delayq init`"):
        producer.produce(target, b"v", delay=5)


def delayq_cli(settings, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return run_delayq(*args, settings=settings, stdin=stdin, text=False)


def test_produce_command_delays_with_key_and_headers_and_prints_the_id(settings, buffer, target):
    result = delayq_cli(settings, "produce", "--topic", target, "--delay", "1h30m", "--key", "order-9",
                        "--header", "trace=abc", "--header", "kind=a=b", "payload")

    assert result.returncode == 0, result.stderr
    delay_id = result.stdout.decode().strip()
    [record] = read_topic(settings.bootstrap_servers, buffer, expect=1, idle_s=0.5)
    message = parse_buffer_record(record.key(), record.value(), record.headers(), record.timestamp()[1]).envelope
    assert (message.delay_id, message.topic, message.value, message.key) == (delay_id, target, b"payload", b"order-9")
    assert message.headers == [("trace", b"abc"), ("kind", b"a=b")]
    assert 5_400_000 - 50 <= message.deliver_at_ms - message.created_at_ms <= 5_400_000


def test_produce_command_at_a_time_reads_the_value_from_stdin(settings, buffer, target):
    result = delayq_cli(settings, "produce", "--topic", target, "--at", "2027-05-01T12:00:00.250+02:00", "-",
                        stdin=b"\x00binary\xff")

    assert result.returncode == 0, result.stderr
    [record] = read_topic(settings.bootstrap_servers, buffer, expect=1, idle_s=0.5)
    message = parse_buffer_record(record.key(), record.value(), record.headers(), record.timestamp()[1]).envelope
    assert (message.value, message.deliver_at_ms) == (b"\x00binary\xff", 1_809_165_600_250)


def test_produce_command_at_a_past_time_warns_in_one_stderr_line_and_still_sends(settings, buffer, target):
    at = (datetime.now(UTC) - timedelta(hours=3, minutes=12, seconds=30)).replace(microsecond=0)
    text = at.isoformat().replace("+00:00", "Z")

    result = delayq_cli(settings, "produce", "--topic", target, "--at", text, "late")

    assert result.returncode == 0, result.stderr
    assert result.stderr.decode() == f"warning: --at {text} is 3h12m in the past; the message is delivered at once\n"
    [record] = read_topic(settings.bootstrap_servers, buffer, expect=1, idle_s=0.5)
    message = parse_buffer_record(record.key(), record.value(), record.headers(), record.timestamp()[1]).envelope
    assert (message.delay_id, message.value) == (result.stdout.decode().strip(), b"late")
    assert message.deliver_at_ms == int(at.timestamp() * 1000)


def test_produce_command_without_delay_sends_at_once(settings, buffer, target):
    ends = end_offsets(settings.bootstrap_servers, buffer)

    result = delayq_cli(settings, "produce", "--topic", target, "--key", "k", "now")

    assert result.returncode == 0, result.stderr
    assert result.stdout.decode().startswith(f"delivered to {target} [")
    [record] = read_topic(settings.bootstrap_servers, target, expect=1, idle_s=0.5)
    assert (record.key(), record.value(), record.headers()) == (b"k", b"now", None)
    assert end_offsets(settings.bootstrap_servers, buffer) == ends


def test_cancel_command_writes_the_tombstone(settings, producer, buffer, target):
    delay_id = producer.produce(target, b"v", delay=600)
    producer.flush(10)

    result = delayq_cli(settings, "cancel", delay_id)

    assert result.returncode == 0, result.stderr
    assert f"cancel of {delay_id} written to {buffer}" in result.stdout.decode()
    _put, cancel = read_topic(settings.bootstrap_servers, buffer, expect=2, idle_s=0.5)
    assert (cancel.key(), cancel.value(), dict(cancel.headers())[wire.OP]) == (delay_id.encode(), None, b"cancel")


@pytest.mark.parametrize("args,message", [
    (("produce", "--topic", "t", "--delay", "400d", "v"), "beyond the maximum delay of 365 days"),
    (("produce", "--topic", "t", "--delay", "soon", "v"), "'soon' is not a duration"),
    (("produce", "--topic", "t", "--at", "2030-01-01T00:00:00", "v"), "has no timezone"),
    (("produce", "--topic", "t", "--at", "1999-12-31T23:59:59Z", "v"),
     "'1999-12-31T23:59:59Z' is before 2000-01-01T00:00:00Z: delayq refuses due times before 2000"),
    (("produce", "--topic", "t", "--delay", "5s", "--header", "delayq-op=put", "v"), "reserves for its envelope"),
    (("cancel", "not-an-id"), "is not a delay id"),
    (("get", "not-an-id"), "is not a delay id"),
])
def test_commands_refuse_bad_input_with_exit_2_and_send_nothing(settings, buffer, args, message):
    ends = end_offsets(settings.bootstrap_servers, buffer)

    result = delayq_cli(settings, *args)

    assert result.returncode == 2
    assert message in " ".join(result.stderr.decode().split())
    assert b"Traceback" not in result.stderr
    assert end_offsets(settings.bootstrap_servers, buffer) == ends


@pytest.mark.parametrize("command", [("produce", "--topic", "t", "--delay", "30s", "v"),
                                     ("cancel", "0190a3e4-5b6c-7d8e-9f00-112233445566")])
def test_produce_and_cancel_without_a_buffer_topic_fail_fast_naming_it_and_delayq_init(settings, command):
    started = time.monotonic()
    done = run_delayq(*command, settings=settings)  # this test's cluster: no `delayq init` ran
    took = time.monotonic() - started
    assert done.returncode == 2 and took < 15, (done.returncode, took)
    assert done.stderr.strip().count("\n") == 0, done.stderr
    assert f"buffer topic {settings.buffer_topic!r} does not exist" in done.stderr
    assert "delayq init" in done.stderr and "Traceback" not in done.stderr
