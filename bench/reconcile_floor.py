"""What reading the reconciliation's input costs before any judging: the floor under issue 33's 10M figure.

On the data set ``reconcile_bench.py`` writes (and keeps), three Spark jobs on ``local[2]``, each
timed alone with the CPU the whole machine spent meanwhile (broker included, from /proc/stat):

1. the buffer topic read by Spark's Kafka source, every column of every record hashed (no delayq code);
2. the target topics, likewise;
3. the buffer read and classified by :func:`delayq.spark.job.buffer_rows` (the nodes' parser in Python
   workers), every column hashed: what the job's buffer step does before caching.

Two cores give 600 CPU-seconds in 5 minutes; when the first two alone take a third of that, and the third
most of it, the judgement (a shuffle of every record by id and its aggregations) has nothing left.

Usage (a dev stack holding the data set: ``reconcile_bench.py --messages 10M --runs 1`` wrote it)::

    DELAYQ_BOOTSTRAP_SERVERS=127.0.0.1:29092 .venv/bin/python -m delayq.bench.reconcile_floor --messages 10M
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from pathlib import Path

from delayq import Settings
from delayq.bench import reconcile_bench
from delayq.bench.proc import machine_ticks

TICK = os.sysconf("SC_CLK_TCK")


def timed(name: str, job: Callable[[], object]) -> None:
    """Run ``job``; print its wall seconds and the machine's busy CPU seconds meanwhile."""
    started, before = time.monotonic(), machine_ticks()
    job()
    wall_s, cpu_s = time.monotonic() - started, (machine_ticks()[0] - before[0]) / TICK
    print(f"{name}: {wall_s:.1f} s, the machine busy for {cpu_s:.1f} CPU-s", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=reconcile_bench.parse_messages, default=1_000_000)
    args = parser.parse_args()

    from pyspark.sql import functions as F

    from delayq.spark import job
    from delayq.spark.options import ReconcileOptions
    from delayq.spark.session import spark_session

    buffer_topic, targets = reconcile_bench.topic_names(args.messages)
    settings = Settings(buffer_topic=buffer_topic)
    options = ReconcileOptions(since_ms=reconcile_bench.BASE_MS,
                               until_ms=reconcile_bench.BASE_MS + reconcile_bench.WINDOW_MS, out=Path("unused"))
    spark = spark_session(reconcile_bench.LOCAL_MASTER)
    partitions = job.topics_with_the_buffer(settings, [])[buffer_topic]

    def hashed(frame) -> object:
        # A sum of each row's hash (mod 1000: no overflow) needs every column of every record.
        return frame.select(F.sum(F.xxhash64(*frame.columns) % 1000)).first()

    def raw(topics: list[str]):
        return job.read_topics(spark, settings, options, topics).drop("timestampType")

    timed("Spark's Kafka source, the buffer", lambda: hashed(raw([buffer_topic])))
    timed("Spark's Kafka source, the targets", lambda: hashed(raw(targets)))
    timed("the buffer through buffer_rows (the nodes' parser)",
          lambda: hashed(job.buffer_rows(raw([buffer_topic]), partitions)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
