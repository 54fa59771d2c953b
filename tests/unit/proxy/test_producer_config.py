"""delayq.Producer without a broker: its settings, due-time checks before sending, and delay ids.

Nothing here reaches Kafka: the producers point at a closed port and are purged. What
reaches the broker, and what must not, is tested in tests/integration/test_producer.py.
"""

from __future__ import annotations

import os
import re
import time
import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest

import delayq
from delayq import cli
from delayq.proxy import producer as producer_module
from delayq.proxy.producer import new_id
from delayq.schedule import MIN_DUE_MS
from delayq.wire import check_delay_id, new_delay_id, parse_buffer_record

NOWHERE = {"bootstrap.servers": "127.0.0.1:9", "log_level": 0}


@pytest.fixture
def producer():
    producer = delayq.Producer(dict(NOWHERE))
    yield producer
    producer.purge()


def test_delayq_conf_keys_become_settings_and_never_reach_librdkafka():
    conf = {**NOWHERE, "delayq.cluster": "orders", "delayq.max.delay.ms": 60_000,
            "delayq.lookup.urls": "http://a:1, http://b:2/"}

    producer = delayq.Producer(conf)

    # librdkafka refuses unknown properties, so constructing at all proves the keys were taken out.
    assert producer.settings.cluster == "orders"
    assert producer.settings.buffer_topic == "delayq-orders-buffer"
    assert producer.settings.max_delay_ms == 60_000
    assert producer.settings.lookup_urls == ["http://a:1", "http://b:2/"]
    assert conf["delayq.cluster"] == "orders", "the caller's conf dict was modified"


def test_delayq_keys_are_taken_from_keyword_arguments_too():
    producer = delayq.Producer(**{**NOWHERE, "delayq.buffer.topic": "my-buffer"})

    assert producer.settings.buffer_topic == "my-buffer"


def test_environment_settings_apply_and_conf_keys_override_them(monkeypatch):
    monkeypatch.setenv("DELAYQ_CLUSTER", "from-env")
    monkeypatch.setenv("DELAYQ_MAX_DELAY_MS", "5000")

    producer = delayq.Producer({**NOWHERE, "delayq.max.delay.ms": "7000"})

    assert (producer.settings.cluster, producer.settings.max_delay_ms) == ("from-env", 7000)


def test_an_unknown_delayq_key_is_refused_by_name():
    with pytest.raises(ValueError, match=r"conf key 'delayq.bufer.topic': no such setting; did you mean delayq.buffer.topic\?"):
        delayq.Producer({**NOWHERE, "delayq.bufer.topic": "x"})


def test_an_invalid_delayq_value_names_the_key():
    with pytest.raises(ValueError, match=r"conf key 'delayq\.max\.delay\.ms' = 0: Input should be greater than or equal to 1"):
        delayq.Producer({**NOWHERE, "delayq.max.delay.ms": 0})


NOW = 1_800_000_000_000
DAY = 86_400_000


def test_delay_ids_are_canonical_uuidv7_unique_and_in_creation_order(producer):
    before = time.time_ns() // 1_000_000
    ids = [producer.produce("t", b"v", delay=60) for _ in range(5000)]
    after = time.time_ns() // 1_000_000

    assert len(set(ids)) == 5000
    assert ids == sorted(ids)
    for delay_id in ids[:50] + ids[-50:]:
        parsed = uuid.UUID(check_delay_id(delay_id))
        assert (parsed.version, parsed.variant) == (7, uuid.RFC_4122)
        assert before <= parsed.int >> 80 <= after


def test_more_than_4096_ids_in_one_millisecond_stay_unique(producer, monkeypatch):
    monkeypatch.setattr(producer_module, "_time_ns", lambda: NOW * 1_000_000 + 123)
    ids = [producer.produce("t", b"v", delay=1) for _ in range(10_000)]

    assert len(set(ids)) == 10_000
    assert all(uuid.UUID(delay_id).int >> 80 == NOW for delay_id in ids)


def test_a_forked_child_draws_its_own_id_tail():
    now_ns = NOW * 1_000_000
    parent_id = new_id(now_ns)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next id in the same millisecond
        os.write(write_end, new_id(now_ns).encode())
        os._exit(0)
    os.close(write_end)
    os.waitpid(pid, 0)
    child_id = os.read(read_end, 64).decode()
    os.close(read_end)

    # One millisecond's ids share a random tail and count up before it: the child's tail is its own.
    assert child_id[:13] == parent_id[:13]  # the same millisecond
    assert child_id[19:] != parent_id[19:]


def test_produce_batch_refuses_delays_it_would_silently_ignore(producer):
    with pytest.raises(TypeError, match=r"produce_batch\(\) cannot delay messages"):
        producer.produce_batch("t", [{"value": b"now"}, {"value": b"later", "delay": 5}])


def test_produce_batch_without_delays_queues_like_confluent_kafka(producer):
    assert producer.produce_batch("t", [{"value": b"a"}, {"value": b"b", "key": b"k"}]) == 2


def test_the_remembered_frame_line_never_leaks_into_another_topic_key_or_due_time(producer, monkeypatch):
    written = []
    monkeypatch.setattr(producer_module, "_base_produce", lambda _self, *args: written.append(args))
    monkeypatch.setattr(producer_module, "_time_ns", lambda: NOW * 1_000_000 + 5)
    calls = [("a", b"k1", b"v1", 1), ("a", b"k2", b"v2", 1), ("b", b"k3", b"v3", 1), ("b", b"long key", b"v4", 1),
             ("b", None, b"v5", 1), ("b", None, b"v6", 2), ("b", "str key", "str value", 2), ("a", b"", b"", 2)]

    ids = [producer.produce(topic, value, key, delay=delay) for topic, key, value, delay in calls]

    parsed = [parse_buffer_record(args[2].encode(), args[1], None).envelope for args in written]
    assert [args[2] for args in written] == ids
    assert [(e.topic, e.key, e.value, e.deliver_at_ms) for e in parsed] == [
        (topic, key.encode() if isinstance(key, str) else key, value.encode() if isinstance(value, str) else value,
         NOW + delay * 1000) for topic, key, value, delay in calls]


# -- due times before 2000 (delayq.schedule.MIN_DUE_MS): seconds meant as milliseconds -----


@pytest.fixture
def sent(producer, monkeypatch):
    """What reaches librdkafka's produce() (arguments after the producer), instead of librdkafka."""
    calls = []
    monkeypatch.setattr(producer_module, "_base_produce", lambda _self, *args: calls.append(args))
    return calls


@pytest.mark.parametrize("call", [
    lambda p: p.produce("t", b"v", deliver_at=1_795_404_000),
    lambda p: p.produce("t", b"v", key=b"k", partition=1, headers=[("h", b"1")], on_delivery=print,
                        deliver_at=1_795_404_000),
    lambda p: p.produce("t", b"v", deliver_at=1_795_404_000, delay_id=new_delay_id()),
    lambda p: p.reschedule(new_delay_id(), "t", b"v", deliver_at=1_795_404_000),
], ids=["produce", "produce-with-everything", "delay-id-re-put", "reschedule"])
def test_every_way_to_a_put_refuses_seconds_before_sending(producer, sent, call):
    with pytest.raises(ValueError, match=r"deliver_at 1795404000 is before 2000-01-01 in epoch milliseconds: "
                                         r"did you mean seconds\? use deliver_at=1795404000000 or a datetime"):
        call(producer)

    assert sent == []


@pytest.mark.parametrize("call", [
    lambda p: p.produce("t", b"v", deliver_at=datetime(1999, 6, 1, tzinfo=UTC)),
    lambda p: p.reschedule(new_delay_id(), "t", b"v", deliver_at=datetime(1999, 6, 1, tzinfo=UTC)),
], ids=["produce", "reschedule"])
def test_every_way_to_a_put_refuses_a_datetime_before_2000(producer, sent, call):
    with pytest.raises(ValueError, match=r"deliver_at 1999-06-01T00:00:00\+00:00 is before 2000-01-01T00:00:00Z"):
        call(producer)

    assert sent == []


def test_a_put_due_exactly_at_2000_is_sent_and_parses(producer, sent):
    delay_id = producer.produce("t", b"v", deliver_at=MIN_DUE_MS)
    again = producer.reschedule(delay_id, "t", b"w", deliver_at=datetime(2000, 1, 1, tzinfo=UTC))

    assert again == delay_id
    assert [parse_buffer_record(args[2].encode(), args[1], None).envelope.deliver_at_ms for args in sent] == [
        MIN_DUE_MS, MIN_DUE_MS]


@pytest.mark.parametrize("delay", [0, 0.0, -0.0, 5e-324, 0.0004, timedelta(0), timedelta(microseconds=499)])
def test_the_fast_path_never_makes_a_due_time_before_now(producer, sent, monkeypatch, delay):
    monkeypatch.setattr(producer_module, "_time_ns", lambda: MIN_DUE_MS * 1_000_000)  # the earliest clock taken

    producer.produce("t", b"v", delay=delay)

    [args] = sent
    assert parse_buffer_record(args[2].encode(), args[1], None).envelope.deliver_at_ms == MIN_DUE_MS


@pytest.mark.parametrize("delay", [0, 30, 2.5, timedelta(seconds=1)])
def test_a_clock_before_2000_refuses_delays_before_sending(producer, sent, monkeypatch, delay):
    monkeypatch.setattr(producer_module, "_time_ns", lambda: (MIN_DUE_MS - 1) * 1_000_000)

    with pytest.raises(RuntimeError, match=r"this machine's clock reads 946684799999 ms since the epoch, "
                                           r"before 2000-01-01.*set the clock \(NTP\)"):
        producer.produce("t", b"v", delay=delay)

    assert sent == []


# -- timestamp= of a delayed message: the buffer put's, checked before sending ----------


@pytest.mark.parametrize("timestamp,shown", [
    (1.5, "float 1.5"), (0.0, "float 0.0"), ("1700000000000", "str '1700000000000'"), (None, "NoneType None"),
    (True, "bool True"), (datetime(2026, 1, 1, tzinfo=UTC), "datetime datetime.datetime(2026"),
])
def test_a_delayed_message_refuses_a_timestamp_that_is_not_an_int(producer, sent, timestamp, shown):
    with pytest.raises(TypeError, match=re.escape(f"timestamp must be epoch milliseconds as an int (0: now); "
                                                  f"got {shown}")):
        producer.produce("t", b"v", timestamp=timestamp, delay=5)

    assert sent == []


@pytest.mark.parametrize("timestamp", [1_700_000_000_000, -1, -5])
def test_a_delayed_messages_int_timestamp_goes_to_the_buffer_put_as_given(producer, sent, timestamp):
    # Negative too, as confluent-kafka sends it and Kafka keeps it (the nodes take any creation time).
    producer.produce("t", b"v", timestamp=timestamp, delay=5)

    [args] = sent
    assert args[6] == timestamp  # cimpl's order: topic, value, key, partition, callback, on_delivery, timestamp


def test_a_timestamp_beyond_64_bits_is_refused_as_confluent_kafka_refuses_it(producer):
    reports = []
    with pytest.raises(OverflowError):
        producer.produce("t", b"v", timestamp=2**63, on_delivery=lambda err, msg: reports.append(err), delay=5)
    producer.produce("t", b"v", on_delivery=lambda err, msg: reports.append(err), delay=5)  # the control

    producer.purge()
    producer.poll(0)

    assert len(reports) == 1, "the message with the overflowing timestamp was queued"


# -- `delayq produce --at` in the past: a warning on stderr, and it still sends ---------


@pytest.fixture
def cli_sends(monkeypatch):
    """``delayq produce`` in this process, its producer at a closed port; returns what it queued."""
    monkeypatch.setenv("DELAYQ_BOOTSTRAP_SERVERS", NOWHERE["bootstrap.servers"])
    queued = []

    def send_and_wait(producer, send, timeout):
        reports = []
        send(lambda err, msg: reports.append(err))
        producer.purge()  # each queued message reports, purged, at the next poll
        producer.poll(0)
        queued.append(len(reports))

    monkeypatch.setattr(producer_module, "send_and_wait", send_and_wait)
    # No broker here: the buffer topic's existence is tested on the real stack (tests/integration/test_producer.py).
    from delayq.commands import produce as produce_command

    monkeypatch.setattr(produce_command, "require_buffer_topic", lambda producer, settings, timeout_s: None)
    return queued


def test_produce_at_a_past_time_warns_on_stderr_in_one_line_and_still_sends(cli_sends, capsys):
    at = (datetime.now(UTC) - timedelta(hours=3, minutes=12, seconds=30)).replace(microsecond=0)
    text = at.isoformat().replace("+00:00", "Z")

    code = cli.main(["produce", "--topic", "t", "--at", text, "later"])

    out, err = capsys.readouterr()
    assert code == 0 and cli_sends == [1]
    check_delay_id(out.strip())
    assert err == f"warning: --at {text} is 3h12m in the past; the message is delivered at once\n"


def test_produce_at_a_past_time_in_another_offset_names_it_as_given(cli_sends, capsys):
    at = datetime.now(timezone(timedelta(hours=2))).replace(microsecond=0) - timedelta(seconds=42)

    assert cli.main(["produce", "--topic", "t", "--at", at.isoformat(), "v"]) == 0

    assert re.fullmatch(rf"warning: --at {re.escape(at.isoformat())} is 4[2-4]s in the past; "
                        r"the message is delivered at once\n", capsys.readouterr().err)


def test_produce_at_a_future_time_prints_no_warning(cli_sends, capsys):
    at = (datetime.now(UTC) + timedelta(hours=1)).isoformat()

    assert cli.main(["produce", "--topic", "t", "--at", at, "v"]) == 0

    assert capsys.readouterr().err == "" and cli_sends == [1]


@pytest.mark.parametrize("at", ["1999-12-31T23:59:59Z", "2000-01-01T00:30:00+01:00", "1970-01-01T00:00:00Z"])
def test_produce_at_a_time_before_2000_is_an_error_line_with_exit_2(cli_sends, capsys, at):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["produce", "--topic", "t", "--at", at, "v"])

    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and cli_sends == []
    assert f"argument --at: '{at}' is before 2000-01-01T00:00:00Z: delayq refuses due times before 2000\n" in err
    assert "Traceback" not in err


# -- the buffer's per-id order: every buffer writer is idempotent -------------------------------


def test_a_producer_built_as_the_readme_shows_is_made_idempotent():
    assert producer_module.ordered_conf({"bootstrap.servers": "k:9092"}) == {"enable.idempotence": True}


@pytest.mark.parametrize("conf", [
    {"enable.idempotence": True}, {"enable.idempotence": "true"}, {"acks": "all"}, {"acks": -1},
    {"request.required.acks": "-1"}, {"max.in.flight.requests.per.connection": 5}, {"max.in.flight": "1"},
    {"retries": 3}, {"transactional.id": "t"},
])
def test_a_conf_that_keeps_order_is_taken(conf):
    added = producer_module.ordered_conf({"bootstrap.servers": "k:9092", **conf})

    assert added == ({} if "enable.idempotence" in conf else {"enable.idempotence": True})


@pytest.mark.parametrize(("conf", "named"), [
    ({"enable.idempotence": False}, "enable.idempotence=False"),
    ({"enable.idempotence": "false"}, "enable.idempotence='false'"),
    ({"acks": 1}, "acks=1"),
    ({"acks": "0"}, "acks='0'"),
    ({"default.topic.config": {"request.required.acks": 1}}, "request.required.acks=1"),
    ({"max.in.flight.requests.per.connection": 1000000}, "max.in.flight.requests.per.connection=1000000"),
    ({"max.in.flight": "6"}, "max.in.flight='6'"),
    ({"retries": 0}, "retries=0"),
    ({"message.send.max.retries": "0"}, "message.send.max.retries='0'"),
])
def test_a_conf_that_cannot_keep_each_ids_order_is_refused_in_one_line_by_every_producer(conf, named):
    from delayq.aio import AIOProducer

    for make in (lambda c: delayq.Producer(c), lambda c: AIOProducer(c),
                 lambda c: delayq.Producer(**c)):
        with pytest.raises(ValueError) as refused:
            make({**NOWHERE, **conf})
        text = str(refused.value)
        assert "\n" not in text
        assert text.startswith(f"conf {named}: delayq's buffer writes need an idempotent producer"), text
        assert "leave" in text

