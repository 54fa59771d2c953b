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

``DELAYQ_GC_TUNED=false`` keeps Python's defaults (``Settings.gc_tuned``), for a comparison or a doubt. The
collections' pauses are on the node's /metrics (``metrics.CollectorPauses``); this module imports nothing
more than ``gc``, since every buffer reader process imports it at its start.
"""
from __future__ import annotations

import gc

# Young collections every YOUNG_EVERY net allocations of containers (Python: 700); the middle generation every
# 20 young ones, the oldest every 100 of the middle (Python: 10 and 10, and a full collection also waits until
# the objects promoted since the last one are a quarter of those that survived it).
YOUNG_EVERY = 50_000
OLDER_EVERY = (20, 100)

# How many objects freeze_started froze, counted once: gc.get_freeze_count() walks the whole frozen list (about
# 50,000 objects in a node) each call, which cost a busy node milliseconds of its GIL at every /metrics scrape.
_frozen_at_start = 0


def tune() -> None:
    """Set this process's collection thresholds; call it first thing in the process."""
    gc.set_threshold(YOUNG_EVERY, *OLDER_EVERY)


def freeze_started() -> None:
    """Collect once, then keep everything alive now out of every later collection; call it once started."""
    global _frozen_at_start
    gc.collect()
    gc.freeze()
    _frozen_at_start = gc.get_freeze_count()


def frozen_at_start() -> int:
    """How many objects :func:`freeze_started` froze (0 before it ran)."""
    return _frozen_at_start
