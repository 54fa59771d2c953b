"""Stand-ins (``spec_set``) for unit tests of the master's logic: no Kafka, no RocksDB."""

from __future__ import annotations

from unittest import mock

from delayq.delay_service.ingest import ShardFeed
from delayq.delay_service.metrics import NodeMetrics
from delayq.store import TimeIndex

# The attributes ShardFeed.__init__ sets, beside its methods and properties.
_FEED_ATTRIBUTES = ["shard", "shards", "store", "metrics", "partitions", "partition_count", "ledger", "lag",
                    "ready"]


def shard_feed(partitions: list[int], partition_count: int | None = None, shard: int = 0) -> mock.Mock:
    """A stand-in ShardFeed of ``shard`` over ``partitions``, with a stand-in store and real metrics."""
    feed = mock.Mock(spec_set=[*dir(ShardFeed), *_FEED_ATTRIBUTES])
    feed.shard, feed.store, feed.metrics = shard, mock.Mock(spec_set=TimeIndex), NodeMetrics().shard(shard)
    feed.partitions = list(partitions)
    feed.partition_count = partition_count if partition_count is not None else len(partitions)
    feed.shards = feed.partition_count // len(partitions) if partitions else 1
    return feed
