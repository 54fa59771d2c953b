"""The node's Prometheus metrics, in a registry of its own (one per node object)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENESS_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60)


class NodeMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.ingested = Counter("delayq_ingested", "buffer records applied to the store", ["op"], registry=r)
        self.delivered = Counter("delayq_delivered", "messages delivered to their target topics", registry=r)
        self.dead_lettered = Counter("delayq_dead_lettered", "records this node, as master, sent to the "
                                     "dead-letter topic, by reason code", ["reason"], registry=r)
        self.malformed_waiting = Gauge("delayq_malformed_waiting", "malformed buffer records in the store that "
                                       "the master has not yet dead-lettered, as far as this node knows", registry=r)
        self.pending = Gauge("delayq_pending", "messages in the store waiting to fall due", registry=r)
        self.buffer_lag = Gauge("delayq_buffer_lag", "buffer records not yet ingested", registry=r)
        self.lateness = Histogram("delayq_delivery_lateness_seconds", "commit time minus due time",
                                  buckets=LATENESS_BUCKETS, registry=r)
        self.is_master = Gauge("delayq_is_master", "1 while this node is the master", registry=r)
        self.epoch = Gauge("delayq_epoch", "epoch of the current or last term this node held", registry=r)
        self.elections = Counter("delayq_elections", "elections this node won", registry=r)
        self.rebuilds = Counter("delayq_store_rebuilds", "times the store was wiped and rebuilt", ["reason"],
                                registry=r)
