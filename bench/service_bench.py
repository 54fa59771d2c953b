"""Delay-service benchmarks on the embedded stack (issue 3's figures; ``delayq bench`` runs them all).

    .venv/bin/python bench/service_bench.py [--runs 3] [--only ingest,delivery,lateness,failover]

- ingest: msg/s into one node's store (random 200-byte values), buffer pre-filled;
- delivery: msg/s out of the master, transactions and done tombstones included;
- lateness: broker append time (LogAppendTime target) minus deliver-at, at 2,000 msg/s falling due;
- failover: SIGKILL of the master with three nodes, time until the new epoch's first delivery.

``delayq bench`` also uses: bench_mass_expiry (many messages due in one millisecond),
bench_failover with SIGTERM, bench_capacity (disk and RSS of one node holding N pending)
and bench_rebuild (a wiped node reading N pending back from the buffer, and one copying a holding node's store).

Figures are medians of --runs runs with min/max beside them; the machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from rich.console import Console
from rich.progress import Progress

from delayq import Settings, wire
from delayq.clock import now_ms
from delayq.delay_service import apply_acls, ensure_topics, required_acls
from delayq.delay_service.ingest import Ingest
from delayq.delay_service.metrics import NodeMetrics
from delayq.delay_service.topics import EndOffsets, admin_client, buffer_info
from delayq.dev import DevStack
from delayq.store import TimeIndex
from delayq.testing import LocalCluster, NodeProcess, drop_cluster
from delayq.wire import Envelope, new_delay_id

from .proc import cpu_seconds

console = Console()
log = logging.getLogger("delayq.bench")
PAYLOAD_SIZE = 200
DAY_MS = 86_400_000


# The nodes' SCRAM user on a secured stack (the delivery suites).
BENCH_NODE_USER = "bench-node"


def payload() -> bytes:
    """A message value: random bytes, so no compression (Kafka's lz4, RocksDB's) flatters a size figure."""
    return os.urandom(PAYLOAD_SIZE)



def fresh_settings(stack: DevStack, **overrides) -> Settings:
    """A new cluster on ``stack``, as its admin (on a secured stack: SASL_SSL and ZooKeeper's credentials)."""
    return Settings(**stack.settings_values(), cluster=f"bench-{uuid.uuid4().hex[:8]}",
                    **{"buffer_partitions": 6, **overrides})


@contextmanager
def bench_cluster(stack: DevStack, **overrides) -> Iterator[Settings]:
    """Settings of a fresh cluster for one measurement; its topics and ZooKeeper folder go afterwards.

    Without this every run would leave its buffer (up to gigabytes) on the shared broker.
    """
    settings = fresh_settings(stack, **overrides)
    try:
        yield settings
    finally:
        drop_cluster(settings)


def lead_ms(count: int) -> int:
    """How far ahead of the first due time a schedule of ``count`` messages starts.

    Filling the buffer and storing it in the node must be over before anything falls due,
    or lateness would measure the fill; 5,000 msg/s for both is slow on a busy 2-core machine.
    """
    return 5_000 + count // 5


def steady(rate: int) -> Callable[[int, int], int]:
    """Due time of message ``i`` when ``rate`` messages per second fall due from ``start``."""
    return lambda start, i: start + i * 1000 // rate


def same_instant(start: int, i: int) -> int:
    """Due time of message ``i`` when all fall due in one millisecond (mass expiry)."""
    return start


# How often a wait for deliveries asks the node: those figures come from the broker's append times, not from
# when the wait saw the count, and each scrape of a node's /metrics costs its GIL 1 to 4 ms (py-spy: 1.9% of a
# delivering node's samples at five scrapes a second).
DELIVERING_POLL_S = 1.0


def wait_for(progress: Progress, label: str, total: int, done: Callable[[], float], timeout_s: float,
             interval_s: float = 0.05) -> None:
    """Show ``done()`` against ``total`` until it gets there.

    Raises:
        TimeoutError: it did not within ``timeout_s``; the message says how far it got.
    """
    task = progress.add_task(label, total=total)
    deadline = time.monotonic() + timeout_s
    while (reached := done()) < total:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{label}: {reached:,.0f} of {total:,} after {timeout_s:.0f} s")
        progress.update(task, completed=reached)
        time.sleep(interval_s)
    progress.update(task, completed=total)


def fill_buffer(settings: Settings, target: str, count: int, due_ms, progress: Progress) -> None:
    producer = Producer(settings.kafka_conf(**{"linger.ms": 20, "batch.size": 1_000_000,
                                               "compression.type": "lz4", "queue.buffering.max.messages": 500_000}))
    task = progress.add_task(f"producing {count:,} buffer records", total=count)
    for i in range(count):
        message = Envelope(new_delay_id(), target, due_ms(i), payload(), key=f"k{i}".encode(),
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
    admin = AdminClient(settings.kafka_conf())
    new = NewTopic(topic, partitions, 1, config={"message.timestamp.type": "LogAppendTime"})
    admin.create_topics([new])[topic].result(30)


def bench_ingest(stack: DevStack, count: int, progress: Progress) -> float:
    with bench_cluster(stack) as settings, tempfile.TemporaryDirectory() as tmp:
        ensure_topics(settings)
        fill_buffer(settings, "nowhere", count, lambda i: now_ms() + 3_600_000, progress)
        store = TimeIndex(Path(tmp) / "store")
        admin = admin_client(settings)
        info = buffer_info(settings, admin)
        # Returns once its reader process is up (consumer assigned), as it returned once the consumer was
        # made when ingest consumed in the node's own process: the clock starts at the first poll either way.
        metrics = NodeMetrics()
        ingest = Ingest(settings, 1, metrics, EndOffsets(settings, info.partitions, admin))
        ingest.hold([ingest.feed(0, store, metrics.shard(0))])  # one shard: the whole buffer
        try:
            task = progress.add_task("ingesting", total=count)
            started = time.perf_counter()
            while store.pending_count() < count:
                ingest.poll_once(0.1)
                progress.update(task, completed=store.pending_count())
            elapsed = time.perf_counter() - started
        finally:
            ingest.close()  # its reader process too: a failed run must not leave one consuming
            store.close()
    return count / elapsed


class BenchRunInvalid(RuntimeError):
    """A run whose own records contradict its figure (a count or a time span that does not add up): not reported."""


def delivery_rate(append_times_ms: list[int], count: int, started_ms: int) -> float:
    """Messages per second of one delivery run, from the target's broker timestamps (LogAppendTime).

    The span runs from the first delivered record's append time to the last one's, so no
    signal the bench reads late (a metric refreshed every half second, a lag check) can
    start the clock after part of the work was done.

    Raises:
        BenchRunInvalid: not exactly ``count`` records, a record appended before the run
            started, or a span too short to time (every record in one millisecond).
    """
    if len(append_times_ms) != count:
        raise BenchRunInvalid(f"read {len(append_times_ms):,} delivered records, expected {count:,}")
    first, last = min(append_times_ms), max(append_times_ms)
    if first < started_ms:
        raise BenchRunInvalid(f"a record was appended {started_ms - first} ms before the node started: "
                              "the target topic holds another run's records")
    if last - first < 1:
        raise BenchRunInvalid(f"all {count:,} records were appended within one millisecond: nothing to time")
    return (count - 1) / ((last - first) / 1000)


def bench_delivery(stack: DevStack, count: int, progress: Progress) -> float:
    """One master (a node process, as users run it) delivers ``count`` messages, all due and stored: msg/s.

    Timed from the delivered records' broker timestamps (see :func:`delivery_rate`). The
    node runs in a child process so the bench's own Python (its producer, its progress
    display) does not share the node's GIL.
    """
    with bench_cluster(stack, zk_session_timeout_ms=6000) as settings, tempfile.TemporaryDirectory() as tmp:
        ensure_topics(settings)
        target = f"{settings.cluster}-target"
        create_target(settings, target)
        fill_buffer(settings, target, count, lambda i: now_ms() - 1000, progress)
        cluster = LocalCluster(node_principal(stack, settings, target), Path(tmp), create_topics=False)
        started_ms = now_ms()
        try:
            node = cluster.start("bench", wait=False)
            wait_for(progress, "delivering", count, lambda: node_metric(node, "delayq_delivered_total"),
                     timeout_s=600, interval_s=DELIVERING_POLL_S)
        finally:
            cluster.close()
        records = read_append_times(settings, target, count, timeout_s=120)
    return delivery_rate([appended for appended, _, _ in records], count, started_ms)


def node_principal(stack: DevStack, settings: Settings, target: str) -> Settings:
    """``settings`` as a node runs them: on a secured stack as SCRAM user ``bench-node``, with its role's ACLs."""
    if not stack.secure:
        return settings
    stack.add_user(BENCH_NODE_USER)
    apply_acls(settings, required_acls(settings, node=f"User:{BENCH_NODE_USER}", targets=[target]))
    given = {name: getattr(settings, name) for name in settings.model_fields_set}
    return Settings(**{**given, **stack.settings_values(BENCH_NODE_USER)})


def node_metric(node: NodeProcess, name: str, **labels: str) -> float:
    """A metric of a node process, 0 while it does not serve HTTP yet."""
    try:
        return node.metric(name, **labels)
    except OSError:
        return 0.0


def delivered_records(settings: Settings, topic: str, count: int, timeout_s: float) -> list[tuple[int, dict]]:
    """(append time, headers) of the records on ``topic``, read_committed from the start, up to ``count``."""
    consumer = Consumer(settings.kafka_conf(**{"group.id": f"bench-{uuid.uuid4()}", "isolation.level": "read_committed",
                                               "enable.auto.commit": False}))
    partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    found = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(found) < count and time.monotonic() < deadline:
            for record in consumer.consume(5000, 0.2):
                if record.error() is None:
                    found.append((record.timestamp()[1], dict(record.headers() or [])))
    finally:
        consumer.close()
    return found


def read_append_times(settings: Settings, topic: str, count: int, timeout_s: float, *,
                      due_header: str = wire.DELIVER_AT) -> list[tuple[int, int, int]]:
    """(append time, due time from ``due_header``, delayq epoch or 0) of every delivered record."""
    return [(appended, int(headers[due_header]), int(headers.get(wire.EPOCH, 0)))
            for appended, headers in delivered_records(settings, topic, count, timeout_s)]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def lateness_figures(records: list[tuple[int, int, int]], expected: int, stored_ahead_ms: int) -> dict:
    """Lateness (append time minus due time) of delivered records, with the checks that make it valid.

    ``stored_ahead_ms`` is how long before the first due time every message was stored: a
    negative value means the fill was still running and the figure measures the fill.
    """
    lateness = [appended - due for appended, due, _ in records]
    return {"count": len(records), "expected": expected, "p50_ms": percentile(lateness, 0.5),
            "p99_ms": percentile(lateness, 0.99), "max_ms": max(lateness), "early": sum(1 for x in lateness if x < 0),
            "stored_ahead_ms": stored_ahead_ms}


@contextmanager
def one_node(stack: DevStack, targets: tuple[str, ...] = ("target",), **overrides) -> Iterator[tuple[Settings,
                                                                                                   NodeProcess]]:
    """A fresh cluster of one node, once it is master, with target topics ``<cluster>-<name>`` for ``targets``.

    Everything goes on leaving; read what the node delivered back inside, once it is done
    (reading while it delivers would cost it).
    """
    with bench_cluster(stack, **overrides) as settings, tempfile.TemporaryDirectory() as tmp:
        ensure_topics(settings)
        for name in targets:
            create_target(settings, f"{settings.cluster}-{name}")
        cluster = LocalCluster(settings, Path(tmp))
        try:
            node = cluster.start("bench")
            cluster.master()
            yield settings, node
        finally:
            cluster.close()


def run_schedule(stack: DevStack, count: int, due_at: Callable[[int, int], int], label: str,
                 progress: Progress) -> dict:
    """One master (a node process) delivers ``count`` messages due at ``due_at(start, i)``; their lateness figures.

    The records are read back after the last one was delivered (the broker stamps their append
    time), so reading costs the node nothing while it delivers.
    """
    count_timeout_s = 120 + count / 1000
    with one_node(stack) as (settings, node):
        target = f"{settings.cluster}-target"
        start = now_ms() + lead_ms(count)
        fill_buffer(settings, target, count, lambda i: due_at(start, i), progress)
        wait_for(progress, "storing", count, lambda: node_metric(node, "delayq_ingested_total", op="put"),
                 count_timeout_s, interval_s=0.2)
        stored_ahead_ms = start - now_ms()
        wait_for(progress, label, count, lambda: node_metric(node, "delayq_delivered_total"), count_timeout_s,
                 interval_s=DELIVERING_POLL_S)
        records = read_append_times(settings, target, count, timeout_s=60)
    return lateness_figures(records, count, stored_ahead_ms)


def bench_lateness(stack: DevStack, rate: int, seconds: int, progress: Progress) -> dict:
    return run_schedule(stack, rate * seconds, steady(rate), f"{rate} msg/s falling due for {seconds}s", progress)


def bench_mass_expiry(stack: DevStack, count: int, progress: Progress) -> dict:
    """``count`` messages due in the same millisecond; ``max_ms`` is the time until all were delivered."""
    return run_schedule(stack, count, same_instant, f"{count:,} due at once", progress)


def bench_limited_expiry(stack: DevStack, count: int, rate: int, progress: Progress) -> dict:
    """``count`` messages due at once to a topic limited to ``rate``/s, and a hundredth as many to another topic
    falling due over the same time: how long the limited ones take, and how late the others are."""
    count_timeout_s = 120 + count / 1000
    others = count // 100
    span_ms = count * 1000 // rate
    with one_node(stack, ("limited", "target"), dispatch_limits={"*-limited": {"rate": rate}}) as (settings, node):
        limited, other = f"{settings.cluster}-limited", f"{settings.cluster}-target"
        start = now_ms() + lead_ms(count)
        fill_buffer(settings, limited, count, lambda i: start, progress)
        fill_buffer(settings, other, others, lambda i: start + i * span_ms // others, progress)
        wait_for(progress, "storing", count + others, lambda: node_metric(node, "delayq_ingested_total", op="put"),
                 count_timeout_s, interval_s=0.2)
        stored_ahead_ms = start - now_ms()
        cpu_before = cpu_seconds([node.running.pid])
        wait_for(progress, f"{count:,} due at once, limited to {rate:,}/s", count + others,
                 lambda: node_metric(node, "delayq_delivered_total"), count_timeout_s + span_ms / 1000,
                 interval_s=DELIVERING_POLL_S)
        cpu_s = cpu_seconds([node.running.pid]) - cpu_before
        held = read_append_times(settings, limited, count, timeout_s=60)
        on_time = read_append_times(settings, other, others, timeout_s=60)
    ideal_ms = (count - max(1, rate // 10)) * 1000 / rate  # after the burst (a tenth of a second's worth)
    return {"limited_ms": max(t for t, _, _ in held) - start, "ideal_ms": round(ideal_ms), "master_cpu_s": cpu_s,
            "limited": lateness_figures(held, count, stored_ahead_ms),
            "other": lateness_figures(on_time, others, stored_ahead_ms)}



def bench_failover(stack: DevStack, progress: Progress, sig: signal.Signals = signal.SIGKILL) -> dict:
    """Three nodes, 500 msg/s falling due; the master gets ``sig``; the gap until the next epoch delivers."""
    with bench_cluster(stack, zk_session_timeout_ms=6000) as settings, tempfile.TemporaryDirectory() as tmp:
        target = f"{settings.cluster}-target"
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
            master.process.send_signal(sig)
            records = read_append_times(settings, target, rate * seconds, timeout_s=seconds + 60)
        finally:
            cluster.close()
    first_epoch = min((epoch for _, _, epoch in records), default=0)
    after = sorted(t for t, _, epoch in records if epoch > first_epoch)
    ids = len(records)
    return {"resumed_after_ms": after[0] - killed_at if after else None, "signal": sig.name,
            "session_timeout_ms": settings.zk_session_timeout_ms, "delivered": ids, "expected": rate * seconds}


def process_memory(pid: int) -> dict[str, int]:
    """Resident set size now (VmRSS) and at its peak (VmHWM), in bytes, from /proc."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0]) * 1024
    return {"rss": fields["VmRSS"], "peak_rss": fields["VmHWM"]}


def dir_bytes(path: Path) -> int:
    """Bytes the files under ``path`` take on disk (allocated blocks, as du counts them)."""
    return sum(f.stat().st_blocks * 512 for f in path.rglob("*") if f.is_file())


def node_pending(node: NodeProcess) -> float:
    return node_metric(node, "delayq_pending")


def pending_node(cluster: LocalCluster, node_id: str, count: int, progress: Progress) -> NodeProcess:
    """A node of ``cluster`` holding ``count`` messages due in a day, filled while it ingests."""
    node = cluster.start(node_id)
    due = now_ms() + DAY_MS
    fill_buffer(cluster.settings, f"{cluster.settings.cluster}-nowhere", count, lambda i: due, progress)
    wait_for(progress, f"{node_id} storing", count, lambda: node_pending(node), 600 + count / 1000, interval_s=0.5)
    return node


def bench_capacity(stack: DevStack, count: int, progress: Progress, settle_s: float = 10.0) -> dict:
    """One node (a child process) holding ``count`` pending: its store's bytes on disk and its RSS.

    Measured ``settle_s`` after the last message was stored, once RocksDB's flushes after the
    burst are done; the peak RSS (the ingest burst included) is reported beside.
    """
    with bench_cluster(stack) as settings, tempfile.TemporaryDirectory() as tmp:
        cluster = LocalCluster(settings, Path(tmp))
        try:
            node = pending_node(cluster, "capacity", count, progress)
            time.sleep(settle_s)
            memory = process_memory(node.running.pid)
            # The node's buffer reader is part of the node: its memory counts too.
            readers = [process_memory(pid) for pid in node.readers()]
            reader_rss = sum(r["rss"] for r in readers)
            disk = dir_bytes(node.data_dir)
        finally:
            cluster.close()
    rss = memory["rss"] + reader_rss
    return {"pending": count, "disk_bytes": disk, "disk_bytes_per_message": disk / count,
            "rss_bytes": rss, "rss_bytes_per_message": rss / count, "node_rss_bytes": memory["rss"],
            "reader_rss_bytes": reader_rss, "peak_rss_bytes": memory["peak_rss"] + sum(r["peak_rss"] for r in readers)}


def bench_rebuild(stack: DevStack, count: int, runs: int, progress: Progress) -> dict[str, list[float]]:
    """Seconds until a wiped node is ready again with ``count`` pending, once per run and way.

    The buffer is filled once. ``buffer``: the only node stops, its data folder is deleted and it
    starts again, reading the buffer from its start. ``copy``: a second node, wiped before each
    run, starts beside the first (which holds the shard) and copies its store
    (delay_service/store_copies.py). Each timed from the start of the process (interpreter
    start-up included) to /readyz = 200, and each checks the node then holds ``count``.
    """
    times: dict[str, list[float]] = {"buffer": [], "copy": []}
    with bench_cluster(stack) as settings, tempfile.TemporaryDirectory() as tmp:
        cluster = LocalCluster(settings, Path(tmp))
        try:
            node = pending_node(cluster, "rebuild", count, progress)
            for _ in range(runs):
                node.stop()
                shutil.rmtree(node.data_dir)
                node = timed_ready(cluster, "rebuild", count, times["buffer"])
            copier = None
            for _ in range(runs):
                if copier is not None:
                    copier.stop()
                    shutil.rmtree(copier.data_dir)
                copier = timed_ready(cluster, "copier", count, times["copy"])
            if copier is not None and copier.metric("delayq_store_copies_total") != 1:
                raise RuntimeError("the second node read the buffer instead of copying the first node's store")
        finally:
            cluster.close()
    return times


def timed_ready(cluster: LocalCluster, node_id: str, count: int, times: list[float]) -> NodeProcess:
    """Start ``node_id`` (no data of its own) and add to ``times`` how long it took to be ready holding ``count``."""
    started = time.perf_counter()
    node = cluster.start(node_id, wait=False)
    node.wait_ready(timeout_s=600 + count / 1000)
    times.append(time.perf_counter() - started)
    if node_pending(node) != count:
        raise RuntimeError(f"the wiped node {node_id} holds {node_pending(node):,.0f} messages, not {count:,}")
    return node


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
