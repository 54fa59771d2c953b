"""The node's Prometheus metrics, in a registry of its own (one per node object)."""

from __future__ import annotations

import gc
import math
import threading
import time
from bisect import bisect_left
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from . import collector

LATENESS_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60)
# What a shard's master delivered lately (RecentDeliveries, the console's "now"): the window, and how many
# lateness values it keeps at most over the window (a systematic sample above that, each value standing for
# as many deliveries as the sampling stride).
RECENT_WINDOW_MS = 60_000
RECENT_MAX_SAMPLES = 50_000
GC_PAUSE_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
GC_GENERATIONS = (0, 1, 2)


class BatchHistogram(Collector):
    """A Prometheus histogram filled a batch at a time: :meth:`observe_many` takes one lock per batch.

    prometheus_client's Histogram.observe takes a lock and walks the buckets per value
    (0.8 us each); the master observes one lateness per delivered message. Exposed
    exactly as a Histogram of the same name and buckets (``_bucket``, ``_count``, ``_sum``).
    """

    def __init__(self, name: str, documentation: str, buckets: Iterable[float], registry: CollectorRegistry):
        self.name = name
        self.documentation = documentation
        self.bounds = tuple(sorted(float(b) for b in buckets))
        self._counts = [0] * (len(self.bounds) + 1)  # the last one: above every bound (+Inf)
        self._sum = 0.0
        self._lock = threading.Lock()
        registry.register(self)

    def observe_many(self, values: Iterable[float]) -> None:
        # A value equal to a bound counts in that bound's bucket (le: less than or equal).
        counts: dict[int, int] = {}
        total = 0.0
        bounds = self.bounds
        for value in values:
            index = bisect_left(bounds, value)
            counts[index] = counts.get(index, 0) + 1
            total += value
        with self._lock:
            for index, count in counts.items():
                self._counts[index] += count
            self._sum += total

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            counts, total = list(self._counts), self._sum
        yield HistogramMetricFamily(self.name, self.documentation, buckets=cumulative_buckets(self.bounds, counts),
                                    sum_value=total)


def cumulative_buckets(bounds: Iterable[float], counts: list[int]) -> list[tuple[str, int]]:
    """Per-bucket counts (the last one above every bound) as Prometheus's cumulative ``le`` buckets."""
    cumulative, buckets = 0, []
    for bound, count in zip([*map(str, bounds), "+Inf"], counts, strict=True):
        cumulative += count
        buckets.append((bound, cumulative))
    return buckets


class CollectorPauses(Collector):
    """This process's collections as Prometheus series: how long each paused it, by generation, and what is frozen.

    ``delayq_gc_pause_seconds{generation}`` (a histogram: a pause is a lateness of everything falling due
    meanwhile) and ``delayq_gc_frozen_objects``. Timed by a ``gc.callbacks`` hook, which is the process's: only
    a node that is the process (``Node.run``) calls :meth:`watch`; a node embedded in another program reports
    no pauses. The hook runs inside a collection, so it takes no lock (a scrape holding one in the same thread
    would deadlock): it updates lists in place, which the GIL keeps whole.
    """

    def __init__(self, registry: CollectorRegistry):
        self._counts = {g: [0] * (len(GC_PAUSE_BUCKETS) + 1) for g in GC_GENERATIONS}
        self._sums = dict.fromkeys(GC_GENERATIONS, 0.0)
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
        self._counts[generation][bisect_left(GC_PAUSE_BUCKETS, pause)] += 1
        self._sums[generation] += pause

    def collect(self) -> Iterator[Metric]:
        pauses = HistogramMetricFamily("delayq_gc_pause_seconds", "how long each of this process's cyclic garbage "
                                       "collections paused it, by generation (2: full)", labels=["generation"])
        for generation in GC_GENERATIONS:
            buckets = cumulative_buckets(GC_PAUSE_BUCKETS, list(self._counts[generation]))
            pauses.add_metric([str(generation)], buckets, self._sums[generation])
        yield pauses
        yield GaugeMetricFamily("delayq_gc_frozen_objects", "objects this process froze once started: no "
                                "collection walks them (collector.py)", value=collector.frozen_at_start())


@dataclass(frozen=True)
class Recent:
    """What :class:`RecentDeliveries` saw in its window: deliveries, and lateness percentiles (None: none)."""

    window_s: float
    delivered: int
    lateness_p50_s: float | None
    lateness_p99_s: float | None


class RecentDeliveries:
    """A shard master's commits of the last minute: delivered counts exactly, lateness as a bounded sample.

    :meth:`add` keeps the list of lateness values the commit made for the Prometheus histogram
    (no copy, no work per value), or every ``stride``-th of them once the window holds more than
    ``max_samples`` values: then the values kept are halved in place and the stride doubled, so
    memory stays bounded at any delivery rate and a value costs O(1) amortized. The stride
    comes down again as the rate does. Percentiles weigh each value by the stride it was kept at.
    """

    def __init__(self, window_ms: int = RECENT_WINDOW_MS, max_samples: int = RECENT_MAX_SAMPLES):
        self.window_ms = window_ms
        self.max_samples = max_samples
        # (commit time ms, delivered, stride, the lateness values kept), oldest first.
        self._commits: deque[tuple[int, int, int, list[float]]] = deque()
        self._kept = 0
        self._stride = 1
        self._phase = 0  # where the next commit's sample starts, so that commits smaller than the stride are fair
        self._lock = threading.Lock()

    def add(self, committed_at_ms: int, lateness_s: list[float]) -> None:
        """A commit at ``committed_at_ms`` delivered messages this late (seconds each); the list is kept, not copied."""
        if not lateness_s:
            return
        with self._lock:
            self._trim(committed_at_ms)
            stride = self._stride
            if stride == 1:
                sample = lateness_s
            else:
                sample = lateness_s[self._phase::stride]
                self._phase = (self._phase - len(lateness_s)) % stride
            self._commits.append((committed_at_ms, len(lateness_s), stride, sample))
            self._kept += len(sample)
            if self._kept > self.max_samples:
                self._thin()

    def _thin(self) -> None:
        """Keep every other value of the window (counted across commits), and from now on half as many."""
        kept = parity = 0
        for index, (at, delivered, stride, sample) in enumerate(self._commits):
            thinned = sample[parity::2]
            parity = (parity + len(sample)) % 2
            self._commits[index] = (at, delivered, stride * 2, thinned)
            kept += len(thinned)
        self._kept = kept
        # After an odd count the next value the old stride would keep is dropped: the one after it is kept.
        self._phase += parity * self._stride
        self._stride *= 2

    def _trim(self, now_ms: int) -> None:
        commits = self._commits
        while commits and commits[0][0] <= now_ms - self.window_ms:
            self._kept -= len(commits.popleft()[3])
        if self._stride > 1 and self._kept < self.max_samples // 4:
            self._stride //= 2
            self._phase %= self._stride

    def recent(self, now_ms: int) -> Recent:
        """What was delivered in the window up to ``now_ms``."""
        with self._lock:
            self._trim(now_ms)
            commits = list(self._commits)
        delivered = sum(commit[1] for commit in commits)
        p50, p99 = _weighted_percentiles([(stride, sample) for _, _, stride, sample in commits], (0.5, 0.99))
        return Recent(self.window_ms / 1000, delivered, p50, p99)


def _weighted_percentiles(samples: list[tuple[int, list[float]]], quantiles: tuple[float, ...]) -> list[float | None]:
    """Nearest-rank ``quantiles`` of the values, each weighing its sample's stride (the deliveries it stands for)."""
    strides = {stride for stride, values in samples if values}
    if not strides:
        return [None] * len(quantiles)
    if len(strides) == 1:  # all of one weight (the common case): a plain sort
        ordered = sorted(value for _, values in samples for value in values)
        return [ordered[max(0, math.ceil(q * len(ordered)) - 1)] for q in quantiles]
    weighted = sorted((value, stride) for stride, values in samples for value in values)
    total = sum(stride for _, stride in weighted)
    found: list[float | None] = []
    for q in quantiles:
        below = 0
        for value, stride in weighted:
            below += stride
            if below >= q * total:
                found.append(value)
                break
    return found


@dataclass(frozen=True)
class ShardMetrics:
    """The series of one shard (label ``shard``): what its feed and its master update."""

    shard: int
    delivered: Counter
    dead_lettered: _Labelled  # still wants .labels(reason)
    malformed_waiting: Gauge
    pending: Gauge
    buffer_lag: Gauge
    lateness: BatchHistogram
    is_master: Gauge
    epoch: Gauge
    elections: Counter
    held_partitions: Gauge
    partition_marks: Counter
    write_copies: Counter
    rebuilds: _Labelled  # still wants .labels(reason)
    migrations: Counter
    store_format: Gauge
    store_copies: Counter
    store_copy_seconds: Gauge
    recent: RecentDeliveries  # not a series: the last minute's deliveries, which the console asks for


class NodeMetrics:
    """The node's registry. Series that mean something per shard carry the label ``shard``."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.ingested = Counter("delayq_ingested", "buffer records applied to the stores", ["op"], registry=r)
        self.delivered = Counter("delayq_delivered", "messages delivered to their target topics", ["shard"],
                                 registry=r)
        self.dead_lettered = Counter("delayq_dead_lettered", "records this node, as a shard's master, sent to the "
                                     "dead-letter topic, by reason code", ["reason", "shard"], registry=r)
        self.malformed_waiting = Gauge("delayq_malformed_waiting", "malformed buffer records in a shard's store that "
                                       "its master has not yet dead-lettered, as far as this node knows", ["shard"],
                                       registry=r)
        self.pending = Gauge("delayq_pending", "messages in a shard's store waiting to fall due", ["shard"],
                             registry=r)
        self.buffer_lag = Gauge("delayq_buffer_lag", "buffer records of a held shard not yet ingested", ["shard"],
                                registry=r)
        self.lateness = BatchHistogram("delayq_delivery_lateness_seconds", "commit time minus due time",
                                       buckets=LATENESS_BUCKETS, registry=r)
        self.is_master = Gauge("delayq_is_master", "1 while this node is the shard's master", ["shard"], registry=r)
        self.epoch = Gauge("delayq_epoch", "epoch of the current or last term this node held of the shard", ["shard"],
                           registry=r)
        self.elections = Counter("delayq_elections", "elections of the shard this node won", ["shard"], registry=r)
        self.held_partitions = Gauge("delayq_held_partitions", "buffer partitions of the shard its master's last "
                                     "cover could not read to their high watermark (an open transaction, or ingest "
                                     "lagging): what falls due there waits", ["shard"], registry=r)
        self.partition_marks = Counter("delayq_partition_marks", "partition marks the shard's master committed to "
                                       "buffer partitions an open transaction held back (see delayq.wire.mark_id)",
                                       ["shard"], registry=r)
        self.write_copies = Counter("delayq_write_copies", "producer writes (puts, cancels) a client library appended "
                                    "to the buffer again, same id, value, headers and timestamp: applied once "
                                    "(see delayq.wire.COPY_WINDOW_MS)", ["shard"], registry=r)
        self.rebuilds = Counter("delayq_store_rebuilds", "times a shard's store was wiped and rebuilt",
                                ["reason", "shard"], registry=r)
        self.migrations = Counter("delayq_store_migrations", "times a shard's store was migrated in place to a newer "
                                  "store format (delayq.store; a cluster finalized at a feature level with a new "
                                  "store format), instead of being rebuilt from the buffer", ["shard"], registry=r)
        self.store_format = Gauge("delayq_store_format", "the store format of the shard's store (4: delayq 0.1.0's; "
                                  "5: feature level 2's)", ["shard"], registry=r)
        self.store_copies = Counter("delayq_store_copies", "copies of a shard's store this node received from a node "
                                    "holding it (store_copies.py) instead of reading the buffer from its start; one "
                                    "it then cannot trust is rebuilt, counted in delayq_store_rebuilds_total too",
                                    ["shard"], registry=r)
        self.store_copy_seconds = Gauge("delayq_store_copy_seconds", "how long the last copy of a shard's store "
                                        "took to arrive", ["shard"], registry=r)
        self.awaiting_upgrade = Gauge("delayq_partitions_awaiting_upgrade", "buffer partitions this node stopped "
                                      "reading at a record of a feature level above its own (delayq.features): "
                                      "what follows there waits until the node is upgraded", registry=r)
        self.shards_held = Gauge("delayq_shards_held", "shards this node holds (ingests into a store of their own)",
                                 registry=r)
        self.gc_pauses = CollectorPauses(r)  # fed once the node's process watches its collector (Node.run)
        self._recent: dict[int, RecentDeliveries] = {}

    def shard(self, shard: int) -> ShardMetrics:
        """The series of ``shard`` (created at 0 on first use)."""
        label = str(shard)
        return ShardMetrics(
            shard, self.delivered.labels(label), _Labelled(self.dead_lettered, label),
            self.malformed_waiting.labels(label), self.pending.labels(label), self.buffer_lag.labels(label),
            self.lateness, self.is_master.labels(label), self.epoch.labels(label), self.elections.labels(label),
            self.held_partitions.labels(label), self.partition_marks.labels(label), self.write_copies.labels(label),
            _Labelled(self.rebuilds, label), self.migrations.labels(label), self.store_format.labels(label),
            self.store_copies.labels(label), self.store_copy_seconds.labels(label),
            self._recent.setdefault(shard, RecentDeliveries()))

    def forget_shard(self, shard: int) -> None:
        """Drop the series of a shard this node no longer holds (its counters start again at 0 if it comes back)."""
        label = str(shard)
        self._recent.pop(shard, None)
        for metric in (self.delivered, self.malformed_waiting, self.pending, self.buffer_lag, self.is_master,
                       self.epoch, self.elections, self.held_partitions, self.partition_marks, self.write_copies,
                       self.store_format, self.store_copy_seconds):
            try:
                metric.remove(label)
            except KeyError:
                pass


class _Labelled:
    """A labelled metric with its ``shard`` label bound: ``.labels(reason)`` gives the series of (reason, shard)."""

    def __init__(self, metric: Counter, shard: str):
        self._metric = metric
        self._shard = shard

    def labels(self, reason: str) -> Counter:
        return self._metric.labels(reason, self._shard)
