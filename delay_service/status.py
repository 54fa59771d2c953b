"""What `delayq status` reports: the shards (master, epoch, holders), the cursors and the live nodes, from ZooKeeper."""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaException

from delayq.election import Cursor, Epoch, Features, Layout, Leadership, Membership, connect_for
from delayq.settings import Settings


def cluster_status(settings: Settings) -> dict[str, Any]:
    """JSON-ready: ``{"cluster", "shards_count", "master", "epoch", "cursor", "shards": [...], "nodes": [...],
    "features"}``.

    ``shards``: ``{"shard", "master", "epoch", "replicas", "cursor"}`` per shard (replicas: the
    nodes holding it). ``master``, ``epoch`` and ``cursor`` are shard 0's: the cluster's
    with one shard. ``features``: the finalized feature level ``{"level", "record", "problem", "text"}``.
    Records: delayq.election.records.
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
            "features": Features(client, root).read().as_dict(),
        }
    finally:
        client.stop()
        client.close()


def kafka_status(settings: Settings, timeout_s: float = 5.0) -> dict[str, Any]:
    """JSON-ready: ``{"brokers", "buffer": {"replication_factor", "min_insync_replicas"}, "shortfalls": [...],
    "problem"}``: whether the buffer, the dead-letter topic and Kafka's transaction state can take acknowledged
    writes now (``shortfalls``: partitions with fewer in-sync replicas than min.insync.replicas), and the one line
    that says why not (``problem``, None when they can).
    """
    from .topics import TRANSACTION_STATE_TOPIC, admin_client, insync_shortfalls, shortfall_text

    admin = admin_client(settings)
    try:
        metadata = admin.list_topics(timeout=timeout_s)
        buffer = metadata.topics.get(settings.buffer_topic)
        shortfalls = insync_shortfalls(admin, dict.fromkeys([settings.buffer_topic, settings.dead_letter_topic,
                                                             TRANSACTION_STATE_TOPIC]), timeout_s, metadata=metadata)
    except (KafkaException, TimeoutError) as err:
        return {"brokers": None, "buffer": None, "shortfalls": [],
                "problem": f"Kafka at {settings.bootstrap_servers} did not answer ({_said(err)})"}
    factor = min((len(p.replicas) for p in buffer.partitions.values()), default=0) if buffer is not None else None
    return {
        "brokers": len(metadata.brokers),
        "buffer": None if buffer is None else {"partitions": len(buffer.partitions), "replication_factor": factor},
        "shortfalls": [{"topic": s.topic, "partitions": list(s.partitions), "in_sync": s.in_sync,
                        "min_insync_replicas": s.min_insync} for s in shortfalls],
        "problem": shortfall_text(shortfalls) if shortfalls else None,
    }


def _said(err: Exception) -> str:
    return err.args[0].str() if isinstance(err, KafkaException) else str(err) or type(err).__name__
