"""Time-index throughput: apply() of 200k puts in batches of 1000, then due() scans.

Not a test: run it by hand and read the figures.

    .venv/bin/python bench/store_bench.py [--puts 200000] [--batch 1000] [--payload 300] [--runs 3]

Each run uses a fresh store in a temporary directory. Reported: median over the runs
and the spread (min..max) of
- apply: puts per second, through TimeIndex.apply with offsets and ingest time;
- due: entries per second returned by due(limit=batch) scans over the whole index,
  each scanned batch then removed (as `done` records would), so every scan starts at a
  front of fresh tombstones; and the rate of those removes;
- due+skip: milliseconds per due(limit=batch) with the first 5,000 due ids in `skip`,
  for the first such call and for the calls after it.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
import uuid

from delayq.store import Put, Remove, TimeIndex

BASE_MS = 1_800_000_000_000


def make_puts(count: int, payload_size: int) -> list[Put]:
    rng = random.Random(7)
    # Due times spread over a day in random order, as independent producers would send them.
    return [
        Put(str(uuid.UUID(int=rng.getrandbits(128))), BASE_MS + rng.randrange(86_400_000), rng.randbytes(payload_size))
        for _ in range(count)
    ]


def one_run(puts: list[Put], batch: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="delayq-store-bench-") as tmp, TimeIndex(os.path.join(tmp, "s")) as store:
        started = time.perf_counter()
        for offset in range(0, len(puts), batch):
            store.apply(puts[offset:offset + batch], {0: offset + batch}, ingested_at_ms=BASE_MS)
        apply_s = time.perf_counter() - started
        assert store.pending_count() == len(puts)

        # The master's case: the first 5,000 due ids are delivered but their `done` is not
        # read back yet. The first scan reads past them once; later scans seek past them.
        horizon = BASE_MS + 86_400_000
        skip = {entry.delay_id for entry in store.due(horizon, 5000)}
        started = time.perf_counter()
        store.due(horizon, batch, skip=skip)
        skip_first_s = time.perf_counter() - started
        started = time.perf_counter()
        rounds = 20
        for _ in range(rounds):
            got = store.due(horizon, batch, skip=skip)
        skip_s = (time.perf_counter() - started) / rounds
        assert len(got) == batch and not skip & {entry.delay_id for entry in got}

        scanned = 0
        due_s = remove_s = 0.0
        while True:
            started = time.perf_counter()
            entries = store.due(horizon, batch)
            due_s += time.perf_counter() - started
            if not entries:
                break
            scanned += len(entries)
            started = time.perf_counter()
            store.apply([Remove(entry.delay_id) for entry in entries], {})
            remove_s += time.perf_counter() - started
        assert scanned == len(puts) and store.pending_count() == 0
        return {
            "apply puts/s": len(puts) / apply_s,
            "due entries/s": scanned / due_s,
            "apply removes/s": scanned / remove_s,
            f"due(limit={batch}, skip=5000) first ms": skip_first_s * 1000,
            f"due(limit={batch}, skip=5000) next ms": skip_s * 1000,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--puts", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--payload", type=int, default=300, help="payload bytes per message")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()

    puts = make_puts(args.puts, args.payload)
    runs = [one_run(puts, args.batch) for _ in range(args.runs)]
    print(f"{args.puts} puts, batches of {args.batch}, {args.payload}-byte payloads, {args.runs} runs")
    for name in runs[0]:
        values = [run[name] for run in runs]
        print(f"  {name:38s} median {statistics.median(values):>12,.1f}   "
              f"spread {min(values):,.1f} .. {max(values):,.1f}")


if __name__ == "__main__":
    main()
