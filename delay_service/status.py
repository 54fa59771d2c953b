"""What `delayq status` reports: the shards (master, epoch, holders), the cursors and the live nodes, from ZooKeeper."""

from __future__ import annotations

from typing import Any

from delayq.election import Cursor, Epoch, Layout, Leadership, Membership, connect_for
from delayq.settings import Settings


def cluster_status(settings: Settings) -> dict[str, Any]:
    """JSON-ready: ``{"cluster", "shards_count", "master", "epoch", "cursor", "shards": [...], "nodes": [...]}``.

    ``shards``: ``{"shard", "master", "epoch", "replicas", "cursor"}`` per shard (replicas: the
    nodes holding it). ``master``, ``epoch`` and ``cursor`` are shard 0's: the cluster's
    with one shard. Records: delayq.election.records.
    """
    client = connect_for(settings, timeout_s=10)
    try:
        root = settings.zk_root
        layout = Layout(client, root).read()
        count = layout.shards if layout is not None else 1
        members = Membership.members(client, root)
        shards = []
        for shard in range(count):
            cursor = Cursor(client, root, shard).peek()
            shards.append({
                "shard": shard,
                "master": Leadership.master(client, root, shard),
                "epoch": Epoch(client, root, shard).current(),
                "replicas": [m.node_id for m in members if shard in m.shards],
                "cursor": cursor.as_dict() if cursor is not None else None,
            })
        return {
            "cluster": settings.cluster,
            "shards_count": count,
            "replicas_setting": settings.replicas,
            "partitions": layout.partitions if layout is not None else None,
            "master": shards[0]["master"],
            "epoch": shards[0]["epoch"],
            "cursor": shards[0]["cursor"],
            "shards": shards,
            "nodes": [member.as_dict() for member in members],
        }
    finally:
        client.stop()
        client.close()
