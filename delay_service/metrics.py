"""The node's Prometheus metrics, in a registry of its own (one per node object)."""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

LATENESS_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60)


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
        cumulative, buckets = 0, []
        for bound, count in zip([*map(str, self.bounds), "+Inf"], counts, strict=True):
            cumulative += count
            buckets.append((bound, cumulative))
        yield HistogramMetricFamily(self.name, self.documentation, buckets=buckets, sum_value=total)


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
        self.awaiting_upgrade = Gauge("delayq_partitions_awaiting_upgrade", "buffer partitions this node stopped "
                                      "reading at a record of a feature level above its own (delayq.features): "
                                      "what follows there waits until the node is upgraded", registry=r)
        self.shards_held = Gauge("delayq_shards_held", "shards this node holds (ingests into a store of their own)",
                                 registry=r)

    def shard(self, shard: int) -> ShardMetrics:
        """The series of ``shard`` (created at 0 on first use)."""
        label = str(shard)
        return ShardMetrics(
            shard, self.delivered.labels(label), _Labelled(self.dead_lettered, label),
            self.malformed_waiting.labels(label), self.pending.labels(label), self.buffer_lag.labels(label),
            self.lateness, self.is_master.labels(label), self.epoch.labels(label), self.elections.labels(label),
            self.held_partitions.labels(label), self.partition_marks.labels(label), self.write_copies.labels(label),
            _Labelled(self.rebuilds, label), self.migrations.labels(label), self.store_format.labels(label))

    def forget_shard(self, shard: int) -> None:
        """Drop the series of a shard this node no longer holds (its counters start again at 0 if it comes back)."""
        label = str(shard)
        for metric in (self.delivered, self.malformed_waiting, self.pending, self.buffer_lag, self.is_master,
                       self.epoch, self.elections, self.held_partitions, self.partition_marks, self.write_copies,
                       self.store_format):
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
