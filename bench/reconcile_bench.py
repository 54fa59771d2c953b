"""Benchmark of the reconciliation job: 1,000,000 delayed messages reconciled on local[2].

Each message is a ``put`` and a ``done`` in the buffer topic and one delivery on one
of four target topics, so the default run reads 2,000,000 buffer records and
1,000,000 deliveries; a few anomalies of each kind are mixed in and checked. The
data is written once and kept (topics named after the message count and a data
version, with unlimited retention); later runs reuse it. Each timed run is
``delayq reconcile`` as a user starts it, in a fresh process: Spark start-up, the
Kafka reads and the report included.

Usage::

    .venv/bin/python bench/reconcile_bench.py                  # 1,000,000 messages, 3 runs
    .venv/bin/python bench/reconcile_bench.py --messages 100000 --runs 1

Target (issue 5): under 3 minutes per run on this 2-core machine; since every buffer record
is parsed by the nodes' own parser in Python workers (issue 13), under 60 s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from delayq import Settings
from delayq.spark import iso
from delayq.spark.synthetic import TrafficWriter, healthy_traffic, new_message

# The cached topics' wire format: 2 = the envelope as a frame in the put's value; 3 = every delivery and
# done names its put's offset (delayq-version, delayq-cutoff), as masters write them.
DATA_VERSION = 3
BASE_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z: fixed, so the cached data keeps one window
WINDOW_MS = 24 * 3_600_000
TARGETS = 4
INJECTED = 10  # of each anomaly kind
TARGET_S = 60


def topic_names(messages: int) -> tuple[str, list[str]]:
    prefix = f"delayq-bench-reconcile-{messages}-v{DATA_VERSION}"
    return f"{prefix}-buffer", [f"{prefix}-target-{i}" for i in range(TARGETS)]


def record_counts(bootstrap: str, topics: list[str]) -> dict[str, int]:
    """Records per topic (end minus start offsets); -1 for a topic that does not exist."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "delayq-bench-count"})
    try:
        metadata = consumer.list_topics(timeout=10).topics
        counts = {}
        for topic in topics:
            if topic not in metadata:
                counts[topic] = -1
                continue
            total = 0
            for partition in metadata[topic].partitions:
                low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
                total += high - low
            counts[topic] = total
        return counts
    finally:
        consumer.close()


def expected_counts(messages: int) -> tuple[int, int]:
    """(buffer records, deliveries) that a complete data set holds."""
    buffer = 2 * messages + 2 * INJECTED + 2 * INJECTED + INJECTED + 3 * INJECTED  # healthy, dup, early, lost, cancel
    deliveries = messages + 2 * INJECTED + INJECTED + INJECTED
    return buffer, deliveries


def ensure_data(bootstrap: str, messages: int) -> None:
    """Write the data set unless a complete one is already there."""
    buffer, targets = topic_names(messages)
    want_buffer, want_deliveries = expected_counts(messages)
    counts = record_counts(bootstrap, [buffer, *targets])
    if counts[buffer] == want_buffer and sum(counts[t] for t in targets) == want_deliveries:
        print(f"reusing {buffer} ({want_buffer:,} buffer records, {want_deliveries:,} deliveries)")
        return
    admin = AdminClient({"bootstrap.servers": bootstrap})
    present = [t for t, c in counts.items() if c >= 0]
    if present:  # an interrupted earlier generation: start over
        for future in admin.delete_topics(present).values():
            future.result(60)
        time.sleep(2)
    # Unlimited retention: the records carry fixed 2026-01-01 timestamps and must not age out.
    config = {"retention.ms": "-1", "retention.bytes": "-1"}
    new = [NewTopic(buffer, 12, 1, config=config)] + [NewTopic(t, 3, 1, config=config) for t in targets]
    for future in admin.create_topics(new).values():
        future.result(60)
    started = time.monotonic()
    since, until = BASE_MS, BASE_MS + WINDOW_MS
    with TrafficWriter(bootstrap, buffer) as writer:
        healthy_traffic(writer, messages, targets, since, until - 30 * 60_000)
        for i in range(INJECTED):
            due = since + 3_600_000 + i * 1000
            duplicate, version = writer.delivered(topic=targets[0], due_ms=due, delivered_ms=due + 5)
            writer.deliver(duplicate, due + 900, epoch=2, version=version)
            writer.delivered(topic=targets[1], due_ms=due + 100, delivered_ms=due - 400)  # early
            lost = new_message(targets[2], due + 200)
            writer.put(lost, lost.created_at_ms)
            # A cancel the master had read (below its done's cutoff), delivered anyway.
            cancelled = new_message(targets[3], due + 300)
            put = writer.put(cancelled, cancelled.created_at_ms, wait=True)
            cancel = writer.cancel(cancelled.delay_id, due - 60_000, wait=True)
            writer.deliver(cancelled, due + 310, version=put)
            writer.done(cancelled.delay_id, due + 310, version=put, cutoff=cancel + 1)
    print(f"wrote {want_buffer:,} buffer records and {want_deliveries:,} deliveries in "
          f"{time.monotonic() - started:.0f} s")


def timed_run(bootstrap: str, messages: int, master: str, out: Path) -> tuple[float, dict]:
    buffer, _targets = topic_names(messages)
    env = {**os.environ, "DELAYQ_BOOTSTRAP_SERVERS": bootstrap, "DELAYQ_BUFFER_TOPIC": buffer}
    command = [sys.executable, "-m", "delayq", "reconcile", "--master", master, "--since", iso(BASE_MS),
               "--until", iso(BASE_MS + WINDOW_MS), "--out", str(out)]
    started = time.monotonic()
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    elapsed = time.monotonic() - started
    if result.returncode not in (0, 1):
        raise SystemExit(f"delayq reconcile failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return elapsed, json.loads((out / "report.json").read_text())


def check(report: dict, messages: int) -> None:
    totals = report["totals"]
    want = {"expected": messages + 3 * INJECTED, "missing": INJECTED, "duplicates": INJECTED,
            "early": INJECTED, "unexpected": 0, "cancel_ignored": INJECTED, "undeliverable": 0,
            "already_due_when_written": 0,
            "malformed_buffer_records": 0}
    got = {k: totals[k] for k in want}
    if got != want:
        raise SystemExit(f"wrong findings: {got}, expected {want}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()
    bootstrap = Settings().bootstrap_servers
    ensure_data(bootstrap, args.messages)
    times = []
    with tempfile.TemporaryDirectory(prefix="delayq-bench-") as folder:
        for run in range(args.runs):
            elapsed, report = timed_run(bootstrap, args.messages, args.master, Path(folder) / f"run{run}")
            check(report, args.messages)
            times.append(elapsed)
            print(f"run {run + 1}/{args.runs}: {elapsed:.1f} s  (stages: {report['timings_s']})")
    buffer_records, deliveries = expected_counts(args.messages)
    median = statistics.median(times)
    print(json.dumps({
        "messages": args.messages, "buffer_records": buffer_records, "deliveries": deliveries,
        "master": args.master, "runs_s": [round(t, 1) for t in times], "median_s": round(median, 1),
        "min_s": round(min(times), 1), "max_s": round(max(times), 1), "target_s": TARGET_S,
        "within_target": median < TARGET_S,
    }, indent=2))
    return 0 if median < TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
