"""Delay levels, consumer retries, repeating messages and dispatch limits, on real nodes.

The judges are a read_committed consumer of the target topics (each delivered record's
``delayq-*`` headers and its timestamp, the master's CreateTime) and ``delayq reconcile``.
"""

from __future__ import annotations

import itertools
import json
import shutil
import signal
import time
from collections import Counter

import pytest
from confluent_kafka import Consumer
from support.kafka_testing import create_topics, read_topic
from support.process_testing import run_delayq, wait_until
from support.service_testing import Cluster, assert_reconcile_clean, now_ms

from delayq import Cron, Every, Producer, RetryPolicy, Settings, lookup, retry_later, wire
from delayq.settings import DispatchLimit

pytestmark = pytest.mark.integration


def producer(settings: Settings, **conf: str) -> Producer:
    return Producer({"bootstrap.servers": settings.bootstrap_servers, "delayq.cluster": settings.cluster,
                     "delayq.lookup.urls": "", **conf})


def header(record, name: str) -> str | None:
    value = dict(record.headers() or []).get(name)
    return None if value is None else value.decode()


def delivered_at(record) -> int:
    return record.timestamp()[1]


def occurrences(settings: Settings, target: str, expect: int, timeout_s: float = 60, idle_s: float = 2) -> list:
    return read_topic(settings.bootstrap_servers, target, expect=expect, timeout_s=timeout_s, idle_s=idle_s)


def test_delay_levels_deliver_at_their_tables_delays_and_a_cron_series_fires_on_its_matches(
        cluster: Cluster, settings: Settings, names, tmp_path):
    target, ticks = names.topic("levels"), names.topic("cron")
    create_topics(settings.bootstrap_servers, [target, ticks])
    cluster.start("node-a")
    since = now_ms()
    # The cron series first: its second occurrence waits for the next whole minute.
    default = producer(settings)
    first = now_ms() + 1000
    cron_id = default.produce(ticks, b"tick", repeat=Cron("* * * * *", times=2), deliver_at=first)
    sent = {}
    for level in (1, 2):  # 1 s and 5 s in RocketMQ's table
        sent[default.produce(target, f"default-{level}".encode(), delay_level=level)] = (now_ms(), level * 4 - 3)
    custom = producer(settings, **{"delayq.delay.levels": "2s 3s 250ms"})
    for level, seconds in ((1, 2), (2, 3), (3, 0.25)):
        sent[custom.produce(target, f"custom-{level}".encode(), delay_level=level)] = (now_ms(), seconds)
    assert custom.produce(target, b"level 0: no delay", delay_level=0) is None
    with pytest.raises(ValueError, match=r"delay_level 4 is not a level: levels are 1=2s, 2=3s, 3=250ms"):
        custom.produce(target, b"x", delay_level=4)
    default.flush(10)
    custom.flush(10)

    records = [r for r in occurrences(settings, target, len(sent) + 1) if header(r, wire.ID)]
    assert Counter(header(r, wire.ID) for r in records) == Counter(sent.keys())
    for record in records:
        produced_ms, seconds = sent[header(record, wire.ID)]
        waited = delivered_at(record) - produced_ms
        assert seconds * 1000 <= waited < seconds * 1000 + 2000, (record.value(), waited)

    minute = 60_000
    ticked = occurrences(settings, ticks, 2, timeout_s=90)
    assert [(header(r, wire.ID), header(r, wire.OCCURRENCE)) for r in ticked] == [(cron_id, "1"), (cron_id, "2")]
    dues = [int(header(r, wire.DELIVER_AT) or 0) for r in ticked]
    assert dues[0] == first and dues[1] == (first // minute + 1) * minute, dues
    assert all(delivered_at(r) >= due for r, due in zip(ticked, dues, strict=True))
    assert not lookup(cron_id, settings=settings.model_copy(update={"lookup_urls": [cluster.nodes["node-a"].url]})
                      ).pending
    assert_reconcile_clean(settings, since, tmp_path / "reconcile", len(sent) + 1)


def consume(consumer: Consumer, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        record = consumer.poll(0.2)
        if record is not None and record.error() is None:
            return record
    raise AssertionError(f"nothing consumed within {timeout_s} s")


def test_a_consumer_retrying_with_back_off_sees_attempts_1_2_3_then_dead_letters(
        cluster: Cluster, settings: Settings, names, tmp_path):
    target = names.topic("work")
    create_topics(settings.bootstrap_servers, [target, target + ".dlq"], partitions=2)
    cluster.start("node-a")
    since = now_ms()
    delayed = producer(settings)
    delayed.produce(target, b"flaky", key=b"order-1", partition=1, headers=[("trace", b"t-1")])
    delayed.flush(10)
    policy = RetryPolicy(delays=[0.5, 1, 1.5])
    consumer = Consumer({"bootstrap.servers": settings.bootstrap_servers, "group.id": names.cluster,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         "isolation.level": "read_committed"})
    consumer.subscribe([target])
    try:
        # A consumer loop that fails the record three times, committing only after retry_later returned.
        seen = []
        failed_at = None
        while True:
            record = consume(consumer, 15)
            seen.append((header(record, wire.ATTEMPT), record.partition(), header(record, "trace"),
                         record.key(), record.value()))
            if failed_at is not None:
                waited = delivered_at(record) - failed_at
                assert waited >= policy.delays[len(seen) - 2] * 1000, (seen, waited)
            if len(seen) == 4:
                consumer.commit(record, asynchronous=False)
                break  # attempt 3 succeeds
            failed_at = now_ms()
            assert retry_later(delayed, record, policy, reason="flaky dependency") is not None
            consumer.commit(record, asynchronous=False)
        assert seen == [(attempt, 1, "t-1", b"order-1", b"flaky") for attempt in (None, "1", "2", "3")]

        # A record that always fails: after its third retry fails, the dead-letter topic has it.
        delayed.produce(target, b"poison", key=b"order-2")
        delayed.flush(10)
        retries = 0
        while True:
            record = consume(consumer, 15)
            delay_id = retry_later(delayed, record, policy, reason="cannot parse")
            consumer.commit(record, asynchronous=False)
            if delay_id is None:
                break
            retries += 1
        assert retries == 3
    finally:
        consumer.close()
    dead = read_topic(settings.bootstrap_servers, target + ".dlq", expect=1, timeout_s=20)
    assert [(r.key(), r.value(), header(r, wire.ATTEMPT)) for r in dead] == [(b"order-2", b"poison", "3")]
    reason = header(dead[0], wire.DEAD_LETTER_REASON) or ""
    assert wire.Reason.of(reason) is wire.Reason.RETRIES_EXHAUSTED and "cannot parse" in reason, reason
    with pytest.raises(TypeError, match=r"confluent_kafka\.Consumer"):
        retry_later(delayed, b"not a record", policy)
    assert_reconcile_clean(settings, since, tmp_path / "reconcile", 6)  # the six retries: delayed messages


def test_every_delivers_exactly_five_occurrences_when_the_master_is_killed_after_the_second(
        cluster: Cluster, settings: Settings, names, tmp_path):
    target = names.topic("every")
    create_topics(settings.bootstrap_servers, [target])
    for node_id in ("node-a", "node-b"):
        cluster.start(node_id)
    master = cluster.master()
    since = now_ms()
    p = producer(settings)
    series = p.produce(target, b"heartbeat", key=b"k", repeat=Every(1, times=5), delay=1)
    p.flush(10)
    first_two = occurrences(settings, target, 2, idle_s=0.1)
    assert [header(r, wire.OCCURRENCE) for r in first_two] == ["1", "2"]
    master.signal(signal.SIGKILL)

    records = occurrences(settings, target, 5, timeout_s=60, idle_s=4)
    assert [(header(r, wire.ID), header(r, wire.OCCURRENCE)) for r in records] == [
        (series, str(n)) for n in range(1, 6)]
    dues = [int(header(r, wire.DELIVER_AT) or 0) for r in records]
    assert [b - a for a, b in itertools.pairwise(dues)] == [1000] * 4
    assert all(delivered_at(r) >= due for r, due in zip(records, dues, strict=True))
    assert len({header(r, wire.VERSION) for r in records}) == 5  # each occurrence its own put
    assert_reconcile_clean(settings, since, tmp_path / "reconcile", 1)


def test_a_cancel_after_the_second_occurrence_stops_the_series_and_lookup_shows_the_next(
        cluster: Cluster, settings: Settings, names, tmp_path):
    target = names.topic("every")
    create_topics(settings.bootstrap_servers, [target])
    node = cluster.start("node-a")
    since = now_ms()
    p = producer(settings)
    series = p.produce(target, b"reminder", repeat=Every(1.5, multiplier=2), delay=0.5)
    p.flush(10)
    first_two = occurrences(settings, target, 2, idle_s=0.1)
    assert [header(r, wire.OCCURRENCE) for r in first_two] == ["1", "2"]
    dues = [int(header(r, wire.DELIVER_AT) or 0) for r in first_two]
    assert dues[1] - dues[0] == 1500
    found = lookup(series, settings=settings.model_copy(update={"lookup_urls": [node.url]}))
    assert found.pending and found.occurrence == 3 and found.deliver_at_ms == dues[1] + 3000, found
    assert found.repeat == "every=1500 multiplier=2"
    p.cancel(series)
    p.flush(10)

    time.sleep(5)  # occurrence 3 was due 3 s after the second
    records = occurrences(settings, target, 2, idle_s=1)
    assert [header(r, wire.OCCURRENCE) for r in records] == ["1", "2"]
    assert not lookup(series, settings=settings.model_copy(update={"lookup_urls": [node.url]})).pending
    assert_reconcile_clean(settings, since, tmp_path / "reconcile", 0)  # cancelled: nothing more expected


@pytest.mark.settings(delivery_batch_size=500)
def test_a_topic_limited_to_500_a_second_waits_its_turn_while_another_topic_is_on_time(
        settings: Settings, names, tmp_path):
    limited, free = names.topic("limited"), names.topic("free")
    settings = settings.model_copy(update={"dispatch_limits": {limited: DispatchLimit(rate=500)}})
    create_topics(settings.bootstrap_servers, [limited, free], partitions=3)
    cluster = Cluster(settings, tmp_path / "nodes")
    try:
        cluster.start("node-a")
        since = now_ms()
        p = producer(settings)
        due = now_ms() + 3000
        for i in range(2000):
            p.produce(limited, f"l{i}".encode(), deliver_at=due)
            if i % 10 == 0:
                p.produce(free, f"f{i}".encode(), deliver_at=due + i)  # spread over the limited ones' wait
            p.poll(0)
        p.flush(30)
        held = occurrences(settings, limited, 2000, timeout_s=60, idle_s=2)
        on_time = occurrences(settings, free, 200, timeout_s=10, idle_s=1)
    finally:
        cluster.close()
    assert len(held) == 2000 and len(on_time) == 200
    times = sorted(delivered_at(r) for r in held)
    assert times[0] >= due and times[-1] - due >= 3500, (times[0] - due, times[-1] - due)
    late = sorted(delivered_at(r) - int(header(r, wire.DELIVER_AT) or 0) for r in on_time)
    print(f"2,000 due at once to {limited} at 500/s: first {times[0] - due} ms, last {times[-1] - due} ms after "
          f"the due time; the other topic's lateness p50 {late[len(late) // 2]} ms, max {late[-1]} ms")
    assert late[0] >= 0 and late[len(late) // 2] < 250 and late[-1] < 1000, late
    assert_reconcile_clean(settings, since, tmp_path / "reconcile", 2200)


def test_a_series_outlives_a_node_rebuilding_from_the_buffer(cluster: Cluster, settings: Settings, names):
    """A wiped node reads the series' latest put (the master's follows=) back as pending."""
    target = names.topic("every")
    create_topics(settings.bootstrap_servers, [target])
    node = cluster.start("node-a")
    p = producer(settings)
    series = p.produce(target, b"daily", repeat=Every(86_400), delay=0.2)
    p.flush(10)
    assert [header(r, wire.OCCURRENCE) for r in occurrences(settings, target, 1)] == ["1"]
    assert wait_until(lambda: node.get_json(f"/v1/messages/{series}")[1].get("occurrence") == 2, timeout_s=10)
    assert node.stop() == 0
    shutil.rmtree(node.data_dir)
    rebuilt = cluster.start("node-a")
    status, answer = rebuilt.get_json(f"/v1/messages/{series}")
    assert status == 200 and answer["occurrence"] == 2, answer


def test_the_command_line_sends_levels_and_series_and_shows_the_next_occurrence(cluster: Cluster, settings: Settings,
                                                                                names):
    target = names.topic("cli")
    create_topics(settings.bootstrap_servers, [target])
    node = cluster.start("node-a")
    urls = {"DELAYQ_LOOKUP_URLS": f'["{node.url}"]'}
    # First due 3 s out: the series is pending for 5 s, while the node applies the put on its own time (a busy
    # host took longer than the commands between the produce and the get).
    series = run_delayq("produce", "--topic", target, "--every", "1s", "--times", "3", "--delay", "3", "tick",
                        settings=settings)
    assert series.returncode == 0, series.stderr
    series_id = series.stdout.strip()
    level = run_delayq("produce", "--topic", target, "--level", "1", "once", settings=settings)
    assert level.returncode == 0, level.stderr
    for _ in range(3):  # a put the node has not read yet: the get says it is not pending and exits 1
        got = run_delayq("get", "--json", series_id, settings=settings, env=urls)
        if got.returncode == 0:
            break
        time.sleep(0.5)
    assert got.returncode == 0 and json.loads(got.stdout)["repeat"] == "every=1000 times=3", got.stdout
    records = occurrences(settings, target, 4)
    assert sorted((r.value(), header(r, wire.OCCURRENCE)) for r in records) == [
        (b"once", None), (b"tick", "1"), (b"tick", "2"), (b"tick", "3")]
    for bad, text in ((["--times", "3"], "add --every or --cron"), (["--level", "19"], "delay_level 19 is not a level"),
                      (["--cron", "* * *"], "five fields")):
        refused = run_delayq("produce", "--topic", target, *bad, "x", settings=settings)
        assert refused.returncode == 2 and text in refused.stderr and "Traceback" not in refused.stderr, refused.stderr
