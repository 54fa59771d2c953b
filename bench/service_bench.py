"""Delay-service benchmarks on the embedded stack (issue 3's figures).

    .venv/bin/python bench/service_bench.py [--runs 3] [--only ingest,delivery,lateness,failover]

- ingest: msg/s into one node's store (200-byte payloads), buffer pre-filled;
- delivery: msg/s out of the master, transactions and done tombstones included;
- lateness: broker append time (LogAppendTime target) minus deliver-at, at 2,000 msg/s falling due;
- failover: SIGKILL of the master with three nodes, time until the new epoch's first delivery.

Figures are medians of --runs runs with min/max beside them; the machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from rich.console import Console
from rich.progress import Progress

from delayq import Settings
from delayq.delay_service import LocalCluster, Node, ensure_topics
from delayq.delay_service.ingest import Ingest
from delayq.delay_service.metrics import NodeMetrics
from delayq.delay_service.topics import admin_client, buffer_info
from delayq.dev import DevStack
from delayq.proxy import Envelope, new_delay_id
from delayq.store import TimeIndex

console = Console()
PAYLOAD = b"x" * 200


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def fresh_settings(stack: DevStack, **overrides) -> Settings:
    return Settings(bootstrap_servers=stack.bootstrap_servers, zk_connect=stack.zk_connect,
                    cluster=f"bench-{uuid.uuid4().hex[:8]}", buffer_partitions=6, **overrides)


def fill_buffer(settings: Settings, target: str, count: int, due_ms, progress: Progress) -> None:
    producer = Producer(settings.kafka_conf(**{"linger.ms": 20, "batch.size": 1_000_000,
                                               "compression.type": "lz4", "queue.buffering.max.messages": 500_000}))
    task = progress.add_task(f"producing {count:,} buffer records", total=count)
    for i in range(count):
        message = Envelope(new_delay_id(), target, due_ms(i), PAYLOAD, key=f"k{i}".encode(),
                           created_at_ms=now_ms(), partitioner="consistent_random")
        while True:
            try:
                producer.produce(settings.buffer_topic, key=message.delay_id.encode(), value=message.buffer_value(),
                                 headers=message.buffer_headers())
                break
            except BufferError:
                producer.poll(0.05)
        if i % 10_000 == 0:
            producer.poll(0)
            progress.update(task, completed=i)
    producer.flush(120)
    progress.update(task, completed=count)


def create_target(settings: Settings, topic: str, partitions: int = 6) -> None:
    admin = AdminClient({"bootstrap.servers": settings.bootstrap_servers})
    admin.create_topics([NewTopic(topic, partitions, 1, config={"message.timestamp.type": "LogAppendTime"})])[topic].result(30)


def bench_ingest(stack: DevStack, count: int, progress: Progress) -> float:
    settings = fresh_settings(stack)
    ensure_topics(settings)
    fill_buffer(settings, "nowhere", count, lambda i: now_ms() + 3_600_000, progress)
    with tempfile.TemporaryDirectory() as tmp:
        store = TimeIndex(Path(tmp) / "store")
        admin = admin_client(settings)
        info = buffer_info(settings, admin)
        ingest = Ingest(settings, store, NodeMetrics(), admin, info.partitions)
        task = progress.add_task("ingesting", total=count)
        started = time.perf_counter()
        while store.pending_count() < count:
            ingest.poll_once(0.1)
            progress.update(task, completed=store.pending_count())
        elapsed = time.perf_counter() - started
        ingest.close()
        store.close()
    return count / elapsed


def bench_delivery(stack: DevStack, count: int, progress: Progress) -> float:
    settings = fresh_settings(stack, zk_session_timeout_ms=6000)
    ensure_topics(settings)
    target = f"{settings.cluster}-target"
    create_target(settings, target)
    fill_buffer(settings, target, count, lambda i: now_ms() - 1000, progress)
    with tempfile.TemporaryDirectory() as tmp:
        node = Node(settings.model_copy(update={"data_dir": Path(tmp), "http_port": 0, "node_id": "bench"}))
        node.start()
        task = progress.add_task("delivering", total=count)
        while node.metrics.is_master._value.get() != 1 or node.ingest.lag != 0:
            time.sleep(0.01)
        delivered = node.metrics.delivered._value
        started = time.perf_counter()
        while delivered.get() < count:
            time.sleep(0.02)
            progress.update(task, completed=delivered.get())
        elapsed = time.perf_counter() - started
        node.stop()
    return count / elapsed


def read_append_times(settings: Settings, topic: str, count: int, timeout_s: float) -> list[tuple[int, int, int]]:
    """(append time, deliver_at, epoch) of every delivered record."""
    consumer = Consumer({"bootstrap.servers": settings.bootstrap_servers, "group.id": f"bench-{uuid.uuid4()}",
                         "isolation.level": "read_committed", "enable.auto.commit": False})
    partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    found = []
    deadline = time.monotonic() + timeout_s
    while len(found) < count and time.monotonic() < deadline:
        for record in consumer.consume(5000, 0.2):
            if record.error() is None:
                headers = dict(record.headers())
                found.append((record.timestamp()[1], int(headers["delayq-deliver-at"]), int(headers["delayq-epoch"])))
    consumer.close()
    return found


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def bench_lateness(stack: DevStack, rate: int, seconds: int, progress: Progress) -> dict:
    settings = fresh_settings(stack)
    ensure_topics(settings)
    target = f"{settings.cluster}-target"
    create_target(settings, target)
    count = rate * seconds
    with tempfile.TemporaryDirectory() as tmp:
        node = Node(settings.model_copy(update={"data_dir": Path(tmp), "http_port": 0, "node_id": "bench"}))
        node.start()
        while node.metrics.is_master._value.get() != 1:
            time.sleep(0.01)
        start = now_ms() + 8000
        fill_buffer(settings, target, count, lambda i: start + i * 1000 // rate, progress)
        task = progress.add_task(f"{rate} msg/s falling due for {seconds}s", total=count)
        records = []
        reader = threading.Thread(target=lambda: records.extend(
            read_append_times(settings, target, count, timeout_s=seconds + 60)))
        reader.start()
        while reader.is_alive():
            reader.join(0.5)
            progress.update(task, completed=node.metrics.delivered._value.get())
        node.stop()
    lateness = [appended - due for appended, due, _ in records]
    return {"count": len(records), "p50_ms": percentile(lateness, 0.5), "p99_ms": percentile(lateness, 0.99),
            "max_ms": max(lateness), "early": sum(1 for x in lateness if x < 0)}


def bench_failover(stack: DevStack, progress: Progress) -> dict:
    settings = fresh_settings(stack, zk_session_timeout_ms=6000)
    target = f"{settings.cluster}-target"
    with tempfile.TemporaryDirectory() as tmp:
        cluster = LocalCluster(settings, Path(tmp))
        create_target(settings, target)
        try:
            for node_id in ("node-a", "node-b", "node-c"):
                cluster.start(node_id)
            master = cluster.master()
            rate, seconds = 500, 20
            start = now_ms() + 4000
            fill_buffer(settings, target, rate * seconds, lambda i: start + i * 1000 // rate, progress)
            time.sleep(max(0, (start - now_ms()) / 1000) + 3)
            killed_at = now_ms()
            master.process.send_signal(signal.SIGKILL)
            records = read_append_times(settings, target, rate * seconds, timeout_s=seconds + 60)
        finally:
            cluster.close()
    after = sorted(t for t, _, epoch in records if epoch == 2)
    ids = len(records)
    return {"resumed_after_ms": after[0] - killed_at if after else None,
            "session_timeout_ms": settings.zk_session_timeout_ms, "delivered": ids, "expected": rate * seconds}


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": len(values)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--ingest-count", type=int, default=200_000)
    parser.add_argument("--delivery-count", type=int, default=100_000)
    parser.add_argument("--only", default="ingest,delivery,lateness,failover")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("service_results.json"))
    args = parser.parse_args()
    only = set(args.only.split(","))
    stack = DevStack()
    stack.up(say=console.print)
    results: dict = {"machine": {"cores": os.cpu_count()}, "date": time.strftime("%Y-%m-%d")}
    with Progress(console=console, transient=True) as progress:
        if "ingest" in only:
            results["ingest_msg_s"] = summary([bench_ingest(stack, args.ingest_count, progress)
                                               for _ in range(args.runs)])
            console.print("ingest msg/s", results["ingest_msg_s"])
        if "delivery" in only:
            results["delivery_msg_s"] = summary([bench_delivery(stack, args.delivery_count, progress)
                                                 for _ in range(args.runs)])
            console.print("delivery msg/s", results["delivery_msg_s"])
        if "lateness" in only:
            runs = [bench_lateness(stack, 2000, 10, progress) for _ in range(args.runs)]
            results["lateness_2000_msg_s"] = {
                key: summary([r[key] for r in runs]) for key in ("p50_ms", "p99_ms", "max_ms", "early")}
            console.print("lateness at 2000 msg/s", results["lateness_2000_msg_s"])
        if "failover" in only:
            runs = [bench_failover(stack, progress) for _ in range(args.runs)]
            results["failover_sigkill"] = runs
            console.print("failover after SIGKILL", runs)
    args.out.write_text(json.dumps(results, indent=2))
    console.print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
