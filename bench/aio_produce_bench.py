"""Per-call cost of ``await delayq.aio.AIOProducer.produce(..., delay=...)`` against confluent-kafka's plain one.

The asyncio twin of ``produce_bench.py``: both producers run in one event loop against the
real broker with the same settings, payload and key; each run awaits ``--calls`` produce()
calls per case (what confluent-kafka's batching does inside them included, the flush after
the loop not), cases alternate order from run to run, and the figure is the median of the
per-run ratios. The clock is the whole process's CPU time (``time.process_time``): an
AIOProducer hands its batches to a thread pool, whose work belongs to the call as much as
the event loop's. Wall time is reported beside it.

    .venv/bin/python -m delayq.bench.aio_produce_bench --json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import uuid

from confluent_kafka.admin import AdminClient
from confluent_kafka.aio import AIOProducer as PlainAIOProducer

from delayq.aio import AIOProducer

from .produce_bench import busy_cores, make_topics, summary, timing_parser, wait_until_quiet


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    return timing_parser(__doc__, runs=11).parse_args(argv)


async def plain_loop(producer, calls: int, topic: str, value: bytes, key: bytes) -> None:
    for _ in range(calls):
        await producer.produce(topic, value, key)


async def delayed_loop(producer, calls: int, topic: str, value: bytes, key: bytes) -> None:
    for _ in range(calls):
        await producer.produce(topic, value, key, delay=30)


async def time_calls(producer, loop, calls: int, message: tuple) -> tuple[float, float]:
    """(process CPU, wall) seconds per call for ``calls`` awaited calls; flushed afterwards, untimed."""
    cpu, wall = time.process_time(), time.perf_counter()
    await loop(producer, calls, *message)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    await producer.flush(60)
    return cpu / calls, wall / calls


async def measure(args: argparse.Namespace, target: str, cluster: str) -> dict:
    conf = {"bootstrap.servers": args.bootstrap, "queue.buffering.max.messages": max(100_000, 2 * args.calls)}
    async with PlainAIOProducer(conf) as plain, AIOProducer({**conf, "delayq.cluster": cluster}) as delayed:
        shapes = {"plain": (plain, plain_loop), "delayed": (delayed, delayed_loop)}
        message = (target, b"v" * args.payload, b"order-12345")
        for producer, loop in shapes.values():  # warm-up: metadata, connections, the buffer's partition count
            await time_calls(producer, loop, min(args.calls, 2000), message)
        background = wait_until_quiet(args.quiet_wait) if args.quiet_wait > 0 else busy_cores()
        cpu: dict[str, list[float]] = {name: [] for name in shapes}
        wall: dict[str, list[float]] = {name: [] for name in shapes}
        for run in range(args.runs):
            for name in shapes if run % 2 == 0 else reversed(list(shapes)):
                cpu_s, wall_s = await time_calls(*shapes[name], args.calls, message)
                cpu[name].append(cpu_s)
                wall[name].append(wall_s)
    return {"calls": args.calls, "runs": args.runs, "payload": args.payload, "background_cores": background,
            "cpu": summary(cpu), "wall": summary(wall)}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cluster = f"bench-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": args.bootstrap})
    target, buffer = make_topics(admin, cluster)
    try:
        result = asyncio.run(measure(args, target, cluster))
    finally:
        admin.delete_topics([target, buffer])
    if args.json:
        print(json.dumps(result))
        return 0
    for clock in ("cpu", "wall"):
        rows = result[clock]
        print(f"{clock}: plain {rows['plain']['median_us']:.2f} us/call, delayed {rows['delayed']['median_us']:.2f} "
              f"us/call, {rows['delayed']['x_plain']:.2f}x (IQR {rows['delayed']['x_plain_q1']:.2f}-"
              f"{rows['delayed']['x_plain_q3']:.2f})")
    print(f"background: {statistics.fmean([result['background_cores']]):.2f} cores")
    return 0


if __name__ == "__main__":
    sys.exit(main())
