"""CPython's cyclic garbage collector, set for the processes of a node (its own and its buffer reader's).

With Python's defaults (a young collection every 700 net allocations of containers) a delivering node spent
3.4% of its life in collections, the full ones up to 108 ms each, a lateness p99 by themselves: the messages of
a batch in flight outlive two young collections, so they are promoted and every few of those batches sets off a
full collection, which walks the node's whole heap, the ~50,000 objects its imports and clients made at start
included (BENCHMARKS.md, "Issue 31's figures"). So a node's processes:

- collect the young generation every :data:`YOUNG_EVERY` allocations: a batch's objects are freed by their
  reference counts before a collection sees them, and fewer are promoted;
- once started, collect once and freeze what lives (:func:`freeze_started`): modules, settings, clients and
  stores are never walked again.

What this costs is time: garbage in a reference cycle lives until the next collection of its generation, later
than with the defaults. Nothing of delayq waits for the collector to release a resource: every Kafka client,
ZooKeeper session and store is closed explicitly where its owner ends (a term's producer by
``retire_producer``, the spares by ``SpareProducer.close``, ...). An object frozen at start that later ends in
a cycle is never collected: a seat the node held at start and gave up keeps its few kilobytes, once.

``DELAYQ_GC_TUNED=false`` keeps Python's defaults (``Settings.gc_tuned``), for a comparison or a doubt.
"""
from __future__ import annotations

import gc
import time
from bisect import bisect_left
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

# Young collections every YOUNG_EVERY net allocations of containers (Python: 700); the middle generation every
# 20 young ones, the oldest every 100 of the middle (Python: 10 and 10, and a full collection also waits until
# the objects promoted since the last one are a quarter of those that survived it).
YOUNG_EVERY = 50_000
OLDER_EVERY = (20, 100)
PAUSE_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
GENERATIONS = (0, 1, 2)


def tune() -> None:
    """Set this process's collection thresholds; call it first thing in the process."""
    gc.set_threshold(YOUNG_EVERY, *OLDER_EVERY)


def freeze_started() -> None:
    """Collect once, then keep everything alive now out of every later collection; call it once started."""
    gc.collect()
    gc.freeze()


class CollectorPauses(Collector):
    """This process's collections as Prometheus series: how long each paused it, by generation, and what is frozen.

    ``delayq_gc_pause_seconds{generation}`` (a histogram: a pause is a lateness of everything falling due
    meanwhile) and ``delayq_gc_frozen_objects``. Timed by a ``gc.callbacks`` hook, which is the process's: only
    a node that is the process (``Node.run``) calls :meth:`watch`; a node embedded in another program reports
    no pauses. The hook runs inside a collection, so it takes no lock (a scrape holding one in the same thread
    would deadlock): it updates lists in place, which the GIL keeps whole.
    """

    def __init__(self, registry: CollectorRegistry):
        self._counts = {g: [0] * (len(PAUSE_BUCKETS) + 1) for g in GENERATIONS}
        self._sums = dict.fromkeys(GENERATIONS, 0.0)
        self._started = 0.0
        registry.register(self)

    def watch(self) -> None:
        if self._timed not in gc.callbacks:
            gc.callbacks.append(self._timed)

    def unwatch(self) -> None:
        if self._timed in gc.callbacks:
            gc.callbacks.remove(self._timed)

    def _timed(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        pause = time.perf_counter() - self._started
        generation = info["generation"]
        self._counts[generation][bisect_left(PAUSE_BUCKETS, pause)] += 1
        self._sums[generation] += pause

    def collect(self) -> Iterator[Metric]:
        pauses = HistogramMetricFamily("delayq_gc_pause_seconds", "how long each of this process's cyclic garbage "
                                       "collections paused it, by generation (2: full)", labels=["generation"])
        for generation in GENERATIONS:
            cumulative, buckets = 0, []
            for bound, count in zip([*map(str, PAUSE_BUCKETS), "+Inf"], list(self._counts[generation]),
                                    strict=True):
                cumulative += count
                buckets.append((bound, cumulative))
            pauses.add_metric([str(generation)], buckets, self._sums[generation])
        yield pauses
        yield GaugeMetricFamily("delayq_gc_frozen_objects", "objects this process froze once started: no "
                                "collection walks them (delay_service/collector.py)", value=gc.get_freeze_count())
