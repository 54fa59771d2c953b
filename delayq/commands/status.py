"""``delayq status [--json]``: the cluster as ZooKeeper sees it."""

from __future__ import annotations

import argparse
import json

from rich.console import Console
from rich.markup import escape
from rich.table import Table

console = Console()


def register(subparsers) -> None:
    status = subparsers.add_parser("status", help="shards (master, epoch, holders), nodes, pending, lag, cursors, "
                                                    "the feature level")
    status.add_argument("--json", action="store_true", help="print JSON")
    status.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from delayq.delay_service import cluster_status, kafka_status
    from delayq.election import version_text
    from delayq.features import UNRECORDED_LEVEL
    from delayq.settings import Settings

    settings = Settings()
    status = cluster_status(settings)
    status["kafka"] = kafka = kafka_status(settings)
    if args.json:
        print(json.dumps(status, indent=2, sort_keys=True))
        return 0
    shards = status["shards"]
    mastered = sum(1 for shard in shards if shard["master"])
    if len(shards) == 1:
        console.print(f"cluster [bold]{status['cluster']}[/]: master {status['master'] or '[red]none[/]'}, "
                      f"epoch {status['epoch']}")
    else:
        color = "green" if mastered == len(shards) else "red"
        console.print(f"cluster [bold]{status['cluster']}[/]: {len(shards)} shards, [{color}]{mastered} with a "
                      f"master[/]")
        table = Table("shard", "master", "epoch", "held by", "delivered (cursor)")
        for shard in shards:
            cursor = shard["cursor"] or {}
            table.add_row(str(shard["shard"]), shard["master"] or "[red]none[/]", str(shard["epoch"]),
                          ", ".join(shard["replicas"]) or "[red]nobody[/]", str(cursor.get("delivered", "-")))
        console.print(table)
    features = status["features"]
    console.print(escape(features["text"]), style="red" if features["problem"] else None, highlight=False)
    # level: the highest feature level each node speaks (a node of 0.1.0 does not say: it speaks level 1).
    table = Table("node", "version", "level", "role", "shards", "masters", "lag", "pending", "http")
    for node in status["nodes"]:
        table.add_row(node["node_id"], escape(version_text(node["version"])),
                      str(node["feature_level"] or UNRECORDED_LEVEL), node["role"], _listed(node["shards"]),
                      _listed(node["masters"]), str(node["lag"]), str(node["pending"]), node["http"])
    console.print(table)
    if len(shards) == 1 and status["cursor"]:
        console.print(f"cursor: {json.dumps(status['cursor'], sort_keys=True)}")
    if kafka["problem"]:
        console.print(f"[red]{escape(kafka['problem'])}[/]")
    elif kafka["buffer"]:
        brokers, buffer = kafka["brokers"], kafka["buffer"]
        console.print(f"Kafka: {brokers} broker{'' if brokers == 1 else 's'}; the buffer has {buffer['partitions']} "
                      f"partitions at replication factor {buffer['replication_factor']}, every one with enough "
                      "in-sync replicas", highlight=False)
    return 0


def _listed(numbers: list[int]) -> str:
    return ",".join(map(str, numbers)) or "-"


