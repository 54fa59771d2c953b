"""What `delayq status` reports: master, epoch, cursor and live nodes, read from ZooKeeper."""

from __future__ import annotations

from typing import Any

from delayq.election import Cursor, Epoch, Leadership, Membership, connect
from delayq.settings import Settings


def cluster_status(settings: Settings) -> dict[str, Any]:
    """``{"cluster", "master", "epoch", "cursor", "nodes": [{"node_id", "role", "lag", "pending", "http"}]}``."""
    client = connect(settings.zk_connect, session_timeout_ms=settings.zk_session_timeout_ms, auth=settings.zk_auth,
                     timeout_s=10)
    try:
        root = settings.zk_root
        cursor = Cursor(client, root).read() if client.exists(f"{root}/shards/0/cursor") else None
        nodes = [
            {key: member.get(key) for key in ("node_id", "role", "lag", "pending", "http", "epoch", "updated_at_ms")}
            for member in Membership.members(client, root)
        ]
        return {
            "cluster": settings.cluster,
            "master": Leadership.master(client, root),
            "epoch": Epoch(client, root).current(),
            "cursor": cursor,
            "nodes": nodes,
        }
    finally:
        client.stop()
        client.close()
