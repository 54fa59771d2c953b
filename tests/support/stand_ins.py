"""Stand-ins (``spec_set``) for unit tests: the master's logic without Kafka or RocksDB, ZooKeeper's records without a server."""

from __future__ import annotations

from unittest import mock

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError
from kazoo.protocol.states import ZnodeStat

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


def zookeeper(znodes: dict[str, bytes], master: str | None = None) -> mock.Mock:
    """A KazooClient over ``znodes`` (path: data), which its writes change; ``master`` first in line for every lock.

    It reads (``get``, ``exists``, ``get_children``), creates, and sets with ZooKeeper's compare-and-set:
    each znode has a version, 0 when created (or put in ``znodes`` by the test) and one more per
    ``set``, and a ``set`` naming another version raises BadVersionError. ``DataWatch(path, func)`` calls ``func`` at once, as
    kazoo's does; a test calls it again (``client.DataWatch.call_args``) to play a change.
    """
    client = mock.Mock(spec_set=[*dir(KazooClient), "Lock", "DataWatch"])  # both set per instance by __init__
    versions: dict[str, int] = {}  # of the znodes set since; the others are at version 0

    def stat(path: str) -> ZnodeStat:
        return ZnodeStat(0, 0, 0, 0, versions.get(path, 0), 0, 0, 0, len(znodes[path]), 0, 0)

    def get(path: str, watch=None) -> tuple[bytes, ZnodeStat]:
        if path not in znodes:
            raise NoNodeError(path)
        return znodes[path], stat(path)

    def exists(path: str, watch=None) -> ZnodeStat | None:
        return stat(path) if path in znodes else None

    def get_children(folder: str, watch=None) -> list[str]:
        return sorted({path[len(folder) + 1:].split("/")[0] for path in znodes if path.startswith(f"{folder}/")})

    def create(path: str, value: bytes = b"", acl=None, ephemeral=False, sequence=False, makepath=False,
               include_data=False) -> str:
        if path in znodes:
            raise NodeExistsError(path)
        znodes[path] = value
        versions.pop(path, None)
        return path

    def set_data(path: str, value: bytes, version: int = -1) -> ZnodeStat:
        if path not in znodes:
            raise NoNodeError(path)
        if version not in (-1, versions.get(path, 0)):
            raise BadVersionError(path)
        znodes[path] = value
        versions[path] = versions.get(path, 0) + 1
        return stat(path)

    def data_watch(path: str, func) -> None:
        data, found = get(path) if path in znodes else (None, None)
        func(data, found)

    client.get.side_effect = get
    client.exists.side_effect = exists
    client.get_children.side_effect = get_children
    client.create.side_effect = create
    client.set.side_effect = set_data
    client.DataWatch.side_effect = data_watch
    client.Lock.return_value.contenders.return_value = [master] if master is not None else []
    return client
