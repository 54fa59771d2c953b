"""The cluster's shard layout: how many shards, recorded in ZooKeeper once and checked by every init and node.

``delayq init`` of a new cluster also records its feature level (delayq/features.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from kazoo.client import KazooClient

from delayq.clock import now_ms
from delayq.election import FeatureRecord, Features, FinalizedLevel, Layout, ShardLayout
from delayq.errors import ConfigurationError
from delayq.features import SUPPORTED_LEVEL
from delayq.settings import Settings


@dataclass(frozen=True, slots=True)
class ClusterRecords:
    """What ``delayq init`` leaves in ZooKeeper: the shard layout and the cluster's feature level."""

    layout: ShardLayout
    features: FinalizedLevel


def check_divides(settings: Settings, shards: int, partitions: int) -> None:
    """Raises: ConfigurationError: ``partitions`` is not a multiple of ``shards``."""
    if partitions % shards:
        divisors = [n for n in range(1, partitions + 1) if partitions % n == 0]
        raise ConfigurationError(
            f"buffer topic {settings.buffer_topic} has {partitions} partitions, not a multiple of the cluster's "
            f"{shards} shards (every shard gets as many partitions): use DELAYQ_SHARDS one of "
            f"{', '.join(map(str, divisors))}, or a buffer of a multiple of {shards} partitions "
            "(DELAYQ_BUFFER_PARTITIONS, when `delayq init` creates it)")


def ensure_layout(settings: Settings, zk: KazooClient, partitions: int) -> ShardLayout:
    """The cluster's shard layout, recorded from ``settings.shards`` if none is yet (a cluster's first init or node).

    A recorded layout is taken as it is, unless ``shards`` was set (DELAYQ_SHARDS, ``--shards``) to
    another count: that is refused, since the count never changes. Whoever records a new
    cluster's layout records its feature level too: the newest this code speaks, as Kafka's
    ``metadata.version`` starts a new cluster at its newest (no node of an older release has
    run there). A cluster with a layout and no level ran 0.1.0: nothing is recorded for it.

    Raises:
        ConfigurationError: the buffer's partition count is not a multiple of the shard count, or
            ZooKeeper records another shard count than the one set, or another partition count.
    """
    layout = Layout(zk, settings.zk_root)
    recorded = layout.read()
    planned = _planned(settings, layout, recorded, partitions)
    if recorded is not None:
        return planned
    ensured = layout.ensure(planned)
    Features(zk, settings.zk_root).record_new_cluster(FeatureRecord.of(SUPPORTED_LEVEL))
    return ensured


def _planned(settings: Settings, layout: Layout, recorded: ShardLayout | None, partitions: int) -> ShardLayout:
    """The layout the cluster keeps (``recorded``) or gets, for a buffer of ``partitions``; nothing is written.

    Raises:
        ConfigurationError: see :func:`ensure_layout`.
    """
    if recorded is None:
        check_divides(settings, settings.shards, partitions)
        return ShardLayout(shards=settings.shards, partitions=partitions, created_at_ms=now_ms())
    if recorded.partitions != partitions:
        raise ConfigurationError(
            f"buffer topic {settings.buffer_topic} has {partitions} partitions, but cluster {settings.cluster} was "
            f"set up on one of {recorded.partitions} (recorded in ZooKeeper at {settings.zk_root}/layout): a buffer "
            "topic's partitions never change; recreate it with that count, or give the new one a new DELAYQ_CLUSTER")
    if "shards" in settings.model_fields_set:
        layout.refuse_change(recorded, settings.shards)
    return recorded


def ensure_shards(settings: Settings, *, check_only: bool = False) -> ClusterRecords:
    """What ``delayq init`` records: the layout for the buffer topic as it is (or as init will create it), and a new
    cluster's feature level.

    A new cluster (no layout recorded yet) starts at the newest level this code speaks, as Kafka's
    ``metadata.version`` does. A cluster with a layout and no level ran 0.1.0, and its nodes of
    0.1.0 may still run (an upgrade in progress): nothing is recorded, ``delayq upgrade finalize``
    raises its level once every node speaks it.

    With ``check_only``, nothing is written: the checks run against the buffer's partition
    count if the topic exists, else against ``buffer_partitions`` (what init will create), and
    the level is the one recorded now.

    Raises:
        ConfigurationError: see :func:`ensure_layout`.
        UnavailableError: Kafka or ZooKeeper did not answer.
    """
    from delayq.election import connect_for, ensure_cluster_root

    from .topics import admin_client, buffer_partition_count

    partitions = buffer_partition_count(settings, admin_client(settings))
    zk = connect_for(settings, timeout_s=10)
    try:
        layout = Layout(zk, settings.zk_root)
        features = Features(zk, settings.zk_root)
        if check_only:
            count = partitions if partitions is not None else settings.buffer_partitions
            return ClusterRecords(_planned(settings, layout, layout.read(), count), features.read())
        if partitions is None:
            raise ConfigurationError(f"buffer topic {settings.buffer_topic} does not exist: create it with "
                                     "`delayq init`")
        # init also protects a cluster created before it had credentials (election/access.py).
        ensure_cluster_root(zk, settings.zk_root, settings.zk_credentials, protect_existing=True)
        recorded = ensure_layout(settings, zk, partitions)
        return ClusterRecords(recorded, features.read())
    finally:
        zk.stop()
        zk.close()
