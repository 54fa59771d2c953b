"""A probe of CPython's cyclic garbage collector in every Python process of a bench run (issue 31).

Not part of delayq: put this folder first on ``PYTHONPATH`` and Python imports it at start-up in every
process that inherits the environment (the bench, its nodes, their buffer readers)::

    PYTHONPATH=bench/gc_probe GCPROBE_DIR=/tmp/gc-a delayq bench --only lateness,delivery --runs 1 --no-peer
    PYTHONPATH=bench/gc_probe GCPROBE_DIR=/tmp/gc-b GCPROBE_POLICY=1 delayq bench --only lateness,delivery ...

Each process writes ``gc-<pid>.json`` to ``GCPROBE_DIR`` every 2 s (a node is killed, not stopped, at the end
of a suite): its command line, uptime, and per generation the collections, their total and longest time,
how many took over 5 and over 20 ms, and the objects the collector tracks and holds frozen.
delayq's nodes now set their collector themselves (``delay_service/collector.py``; ``DELAYQ_GC_TUNED=false`` for
Python's defaults), so the probe alone compares the two. ``GCPROBE_POLICY=1`` tries the policy as first
measured: the young generation collected every 50,000 allocations instead of 700 (the older ones every 20 and
100 collections of the one below), and everything alive 6 s after start (imports, settings, clients) frozen out
of every later collection.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import threading
import time

OUT = os.environ.get("GCPROBE_DIR")
DUMP_EVERY_S = 2.0
FREEZE_AFTER_S = 6.0


def _probe(out: str) -> None:
    stats = {generation: {"n": 0, "total_ms": 0.0, "max_ms": 0.0, "over_5ms": 0, "over_20ms": 0}
             for generation in (0, 1, 2)}
    started_at = [0.0]
    born = time.time()

    def timed(phase: str, info: dict) -> None:
        if phase == "start":
            started_at[0] = time.perf_counter()
            return
        ms = (time.perf_counter() - started_at[0]) * 1000
        of = stats[info["generation"]]
        of["n"] += 1
        of["total_ms"] += ms
        of["max_ms"] = max(of["max_ms"], ms)
        of["over_5ms"] += ms > 5
        of["over_20ms"] += ms > 20

    def dump() -> None:
        path = os.path.join(out, f"gc-{os.getpid()}.json")
        while True:
            time.sleep(DUMP_EVERY_S)
            record = {"argv": sys.argv, "uptime_s": time.time() - born, "threshold": gc.get_threshold(),
                      "stats": stats, "tracked": len(gc.get_objects()), "frozen": gc.get_freeze_count()}
            with open(path + ".tmp", "w") as file:
                json.dump(record, file)
            os.replace(path + ".tmp", path)

    gc.callbacks.append(timed)
    threading.Thread(target=dump, name="gc-probe", daemon=True).start()


def _policy() -> None:
    gc.set_threshold(50_000, 20, 100)

    def freeze_later() -> None:
        time.sleep(FREEZE_AFTER_S)
        gc.collect()
        gc.freeze()

    threading.Thread(target=freeze_later, name="gc-freeze", daemon=True).start()


if OUT:
    _probe(OUT)
    if os.environ.get("GCPROBE_POLICY") == "1":
        _policy()
