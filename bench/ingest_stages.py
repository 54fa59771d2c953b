"""Ingest's CPU per buffer record, stage by stage: what bounds ingest and a wiped node's rebuild.

Not a test: run it by hand against the dev stack and read the figures.

    .venv/bin/python -m bench.ingest_stages [--records 200000] [--runs 3]

Each run fills a fresh cluster's buffer with ``--records`` puts as producers write them (due
times spread over ten minutes an hour ahead), then does in one process, batch by batch,
what a node and its reader do: consume (the reader's librdkafka consumer, read_committed),
parse (``reader.parse_batch``: the wire parser, the stored form, the write digest), the
frame between the two processes (``marshal`` there and back), and apply (``TimeIndex.apply``
of the decoded ops into a fresh store). Each stage is timed with ``time.process_time``,
the CPU of every thread of the process (librdkafka's and RocksDB's flushes and compactions
included), not the wall clock: a busy machine slows a stage but does not change what it
costs. Reported: microseconds of CPU per record, median over the runs and the spread.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from rich.console import Console
from rich.progress import Progress

from delayq.clock import now_ms
from delayq.delay_service import ensure_topics
from delayq.delay_service.reader import pack_frame, parse_batch, unpack_frame
from delayq.dev import DevStack
from delayq.store import TimeIndex, decode

from .service_bench import bench_cluster, fill_buffer

STAGES = ("consume", "parse", "frame", "apply")
BATCH = 2_000  # records per consume(), as ingest's reader asks


def measure(stack: DevStack, records: int, progress: Progress) -> dict[str, float]:
    """Microseconds of CPU per record of each stage, over one fresh buffer of ``records`` puts."""
    with bench_cluster(stack) as settings, tempfile.TemporaryDirectory() as tmp:
        ensure_topics(settings)
        start = now_ms() + 3_600_000
        fill_buffer(settings, "nowhere", records, lambda i: start + (i * 7919) % 600_000, progress)
        partitions = settings.buffer_partitions
        consumer = Consumer(settings.kafka_conf(**{"group.id": "ingest-stages", "enable.auto.commit": False,
                                                   "isolation.level": "read_committed", "fetch.wait.max.ms": 5}))
        consumer.assign([TopicPartition(settings.buffer_topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        store = TimeIndex(Path(tmp) / "store")
        spent = dict.fromkeys(STAGES, 0.0)
        task = progress.add_task(f"ingesting {records:,} records stage by stage", total=records)
        read = 0
        try:
            while read < records:
                began = time.process_time()
                messages = consumer.consume(BATCH, 1.0)
                consumed = time.process_time()
                if not messages:
                    continue
                batch = parse_batch(messages, partitions, 1, settings.min_compaction_lag_ms)
                parsed = time.process_time()
                frame = unpack_frame(pack_frame([], batch))
                framed = time.process_time()
                assert frame.batch is not None
                for part in frame.batch.shards.values():
                    store.apply(decode(part.ops), part.offsets)
                applied = time.process_time()
                for stage, (a, b) in zip(STAGES, ((began, consumed), (consumed, parsed), (parsed, framed),
                                                  (framed, applied)), strict=True):
                    spent[stage] += b - a
                read += batch.records
                progress.update(task, completed=read)
            if store.pending_count() != records:
                raise RuntimeError(f"the store holds {store.pending_count():,} pending, not {records:,}")
        finally:
            consumer.close()
            store.close()
    return {stage: seconds / records * 1e6 for stage, seconds in spent.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    console = Console()
    stack = DevStack()
    stack.up(say=console.print)
    with Progress(console=console, transient=True) as progress:
        runs = [measure(stack, args.records, progress) for _ in range(args.runs)]
    for stage in (*STAGES, "total"):
        values = [sum(run.values()) if stage == "total" else run[stage] for run in runs]
        console.print(f"{stage:8s} {statistics.median(values):6.2f} us of CPU a record "
                      f"({min(values):.2f}-{max(values):.2f}, {len(values)} runs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
