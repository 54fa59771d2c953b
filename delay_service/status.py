"""What `delayq status` reports: master, epoch, cursor and live nodes, read from ZooKeeper."""

from __future__ import annotations

from typing import Any

from delayq.election import Cursor, Epoch, Leadership, Membership, connect
from delayq.settings import Settings


def cluster_status(settings: Settings) -> dict[str, Any]:
    """``{"cluster", "master", "epoch", "cursor", "nodes": [...]}``: JSON-ready (records: delayq.election.records)."""
    client = connect(settings.zk_connect, session_timeout_ms=settings.zk_session_timeout_ms, auth=settings.zk_auth,
                     timeout_s=10)
    try:
        root = settings.zk_root
        cursor = Cursor(client, root).read() if client.exists(f"{root}/shards/0/cursor") else None
        return {
            "cluster": settings.cluster,
            "master": Leadership.master(client, root),
            "epoch": Epoch(client, root).current(),
            "cursor": cursor.as_dict() if cursor is not None else None,
            "nodes": [member.as_dict() for member in Membership.members(client, root)],
        }
    finally:
        client.stop()
        client.close()
