"""``delayq reconcile --follow`` on the real Kafka: findings as they become certain, once each, across a kill.

Histories are written straight to Kafka (TrafficWriter, as in test_reconcile.py); the job runs
as users run it, ``delayq reconcile --follow`` in a process of its own on local Spark. What it
found is read from the findings topic and its metrics endpoint, never from its own output.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from prometheus_client.parser import text_string_to_metric_families
from support.kafka_testing import read_topic
from support.process_testing import wait_until
from support.reconcile_testing import MINUTE, stage_topics

from delayq.spark.follow import BATCH_HEADER, KIND_HEADER
from delayq.spark.synthetic import Envelope, TrafficWriter, healthy_traffic, new_message
from delayq.testing import free_server_port, settings_env

pytestmark = pytest.mark.integration

GRACE_MS = 10_000
# A finding is certain at once (a duplicate, an early delivery) or at due + grace (a missing message); the
# issue's bound from then to its record on the findings topic, with the job already running.
FOUND_WITHIN_S = 60
# From a restart of the job (a fresh JVM, the Kafka source, the state store) to its first micro-batch.
RESTARTED_WITHIN_S = 180


def now_ms() -> int:
    return int(time.time() * 1000)


def deliver_again(bootstrap: str, message: Envelope, version: int, at_ms: int) -> None:
    """A second delivery of ``message``'s ``version``, written by hand in a committed transaction, as a
    fenced-but-alive master's would be."""
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"t-planter-{uuid.uuid4().hex[:8]}"})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(message.topic, key=message.key, value=message.value, timestamp=at_ms,
                     headers=message.delivery_headers(2, version))
    producer.commit_transaction(30)


class Follower:
    """``delayq reconcile --follow`` as a child process, its output in a file."""

    def __init__(self, env: dict[str, str], args: list[str], log: Path):
        self.env, self.args, self.log = env, args, log
        self.process: subprocess.Popen | None = None

    def start(self) -> Follower:
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen([sys.executable, "-m", "delayq", "reconcile", "--follow", *self.args],
                                            env=self.env, stdout=out, stderr=subprocess.STDOUT)
        return self

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


def findings_on(bootstrap: str, topic: str) -> list[tuple[str, dict, dict[str, bytes]]]:
    """Every committed record of the findings topic: key, value as JSON, headers (none before the job made it)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    if topic not in admin.list_topics(timeout=10).topics:
        return []
    return [(record.key().decode(), json.loads(record.value()), dict(record.headers() or []))
            for record in read_topic(bootstrap, topic, idle_s=0.5)]


def findings_metric(port: int) -> dict[str, float]:
    """``delayq_reconcile_findings_total`` by kind, from the job's metrics endpoint."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return {sample.labels["kind"]: sample.value for family in text_string_to_metric_families(text)
            if family.name == "delayq_reconcile_findings" for sample in family.samples
            if sample.name == "delayq_reconcile_findings_total"}


def test_follow_reports_each_finding_once_within_a_minute_and_a_restart_from_its_checkpoint_neither_repeats_nor_misses(
        dev_stack, tmp_path):
    settings, (a, b), _, _ = stage_topics(dev_stack, f"t-follow-{uuid.uuid4().hex[:8]}")
    findings_topic = f"{settings.buffer_topic}-findings"
    start = now_ms()
    with TrafficWriter(settings.bootstrap_servers, settings.buffer_topic) as writer:
        healthy_traffic(writer, 30, [a, b], start - 20 * MINUTE, start - MINUTE)
        # Missing since long ago: certain in the first micro-batch.
        lost = new_message(a, start - 5 * MINUTE)
        lost_version = writer.put(lost, lost.created_at_ms, wait=True)
        # Missing once due + grace has passed, with no record of it meanwhile: the job's timeout must judge it.
        overdue = new_message(b, start + 40_000, created_ms=start)
        overdue_version = writer.put(overdue, start, wait=True)
        # Delivered once, on time; a duplicate of each is planted later, one while the job runs, one while it is down.
        first, first_version = writer.delivered(topic=a, due_ms=start - 2 * MINUTE, delivered_ms=start - 2 * MINUTE + 7)
        second, second_version = writer.delivered(topic=b, due_ms=start - 3 * MINUTE,
                                                  delivered_ms=start - 3 * MINUTE + 9)
        # Pending for an hour: delivered early while the job is down.
        early = new_message(a, start + 60 * MINUTE, created_ms=start)
        early_version = writer.put(early, start, wait=True)
        writer.flush()
    assert None not in (lost_version, overdue_version, early_version)

    port = free_server_port()
    env = {**os.environ, **settings_env(settings), "DELAYQ_HTTP_HOST": "127.0.0.1",
           "DELAYQ_BUFFER_TOPIC": settings.buffer_topic, "DELAYQ_DEAD_LETTER_TOPIC": settings.dead_letter_topic}
    follower = Follower(env, ["--checkpoint", str(tmp_path / "checkpoint"), "--findings-topic", findings_topic,
                              "--metrics-port", str(port), "--trigger", "2", "--grace", f"{GRACE_MS}ms",
                              "--topics", f"{a},{b}"], tmp_path / "follow.log").start()
    try:
        def keys() -> list[str]:
            return [key for key, _, _ in findings_on(settings.bootstrap_servers, findings_topic)]

        def waited(condition, timeout_s: float, what: str) -> None:
            assert wait_until(condition, timeout_s, 1.0), f"no {what} in {timeout_s:.0f} s:\n{follower.output()}"

        waited(lambda: f"missing:{lost.delay_id}:" in "\n".join(keys()) or not follower.alive(),
                   RESTARTED_WITHIN_S, "the first micro-batch's missing message on the findings topic")
        assert follower.alive(), follower.output()

        planted = time.monotonic()
        deliver_again(settings.bootstrap_servers, first, first_version, now_ms())
        duplicate = f"duplicated:{first.delay_id}:{first_version}"
        waited(lambda: duplicate in keys(), FOUND_WITHIN_S, "the planted duplicate's finding")
        found_after_s = time.monotonic() - planted
        waited(lambda: findings_metric(port).get("duplicated") == 1, FOUND_WITHIN_S, "the duplicate's metric")

        # The overdue message: certain at due + grace, found by the timeout, within the bound after that.
        certain = (overdue.deliver_at_ms + GRACE_MS) / 1000
        overdue_key = f"missing:{overdue.delay_id}:"
        waited(lambda: overdue_key in "\n".join(keys()),
                   max(0.0, certain - time.time()) + FOUND_WITHIN_S, "the overdue message's missing finding")

        # Killed outright; while it is down, a second duplicate and an early delivery.
        assert follower.process is not None
        follower.process.send_signal(signal.SIGKILL)
        follower.process.wait(30)
        deliver_again(settings.bootstrap_servers, second, second_version, now_ms())
        deliver_again(settings.bootstrap_servers, early, early_version, now_ms())
        follower.start()
        later = [f"duplicated:{second.delay_id}:{second_version}", f"early:{early.delay_id}:{early_version}"]
        waited(lambda: all(key in keys() for key in later) or not follower.alive(), RESTARTED_WITHIN_S,
                   "the findings made while the job was down, after its restart")
        assert follower.alive(), follower.output()
        time.sleep(6)  # a few more micro-batches: anything reported twice would show now

        records = findings_on(settings.bootstrap_servers, findings_topic)
        found = [key for key, _, _ in records]
        assert len(found) == len(set(found)), f"a finding reported twice: {found}"
        assert sorted(found) == sorted([f"missing:{lost.delay_id}:{lost_version}",
                                        f"missing:{overdue.delay_id}:{overdue_version}", duplicate, *later]), found
        by_key = {key: (value, headers) for key, value, headers in records}
        value, headers = by_key[duplicate]
        assert (value["kind"], value["id"], value["delivered_count"]) == ("duplicated", first.delay_id, 2)
        assert headers[KIND_HEADER] == b"duplicated" and int(headers[BATCH_HEADER]) >= 0
        assert by_key[later[1]][0]["state"] == "scheduled"
        # The restarted job counts what it reported itself: the duplicate found before the kill is not counted again.
        metric = findings_metric(port)
        assert (metric["duplicated"], metric["early"], metric["missing"]) == (1, 1, 0), metric
        assert found_after_s < FOUND_WITHIN_S

        follower.process.send_signal(signal.SIGTERM)
        assert follower.process.wait(60) == 0, follower.output()
    finally:
        if follower.alive():
            follower.process.kill()

