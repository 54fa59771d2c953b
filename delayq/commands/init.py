"""``delayq init``: create the buffer and dead-letter topics, or check existing ones; record the shard count (and a new
cluster's feature level)."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console
from rich.markup import escape

console = Console()


def register(subparsers) -> None:
    init = subparsers.add_parser("init", help="create or check the buffer and dead-letter topics; record the shards "
                                              "(and a new cluster's feature level)")
    init.add_argument("--partitions", type=int, help="buffer partitions at creation (DELAYQ_BUFFER_PARTITIONS)")
    init.add_argument("--shards", type=int,
                      help="shards of the cluster (DELAYQ_SHARDS), recorded in ZooKeeper at the first init and never "
                           "changed; must divide the buffer's partitions")
    init.add_argument("--replication-factor", type=int, metavar="N",
                      help="replicas of each buffer and dead-letter partition at creation "
                           "(DELAYQ_BUFFER_REPLICATION_FACTOR; default min(brokers, 3))")
    init.add_argument("--min-insync-replicas", type=int, metavar="N",
                      help="min.insync.replicas of both topics (DELAYQ_BUFFER_MIN_INSYNC_REPLICAS; default the "
                           "replication factor - 1, at least 1)")
    init.add_argument("--strict", action="store_true", help="exit 1 when an existing topic differs from the settings")
    init.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from delayq.delay_service import ensure_shards, ensure_topics
    from delayq.settings import Settings

    overrides: dict[str, Any] = {}
    if args.partitions:
        overrides["buffer_partitions"] = args.partitions
    if args.shards is not None:
        overrides["shards"] = args.shards
    if args.replication_factor is not None:
        overrides["buffer_replication_factor"] = args.replication_factor
    if args.min_insync_replicas is not None:
        overrides["buffer_min_insync_replicas"] = args.min_insync_replicas
    settings = Settings(**overrides)
    differs = False
    # Refused before anything is created: a new buffer whose partitions the shards do not divide.
    ensure_shards(settings, check_only=True)
    for check in ensure_topics(settings):
        facts = f" ({check.found.describe()})" if check.found else ""
        if check.created:
            console.print(f"created [bold]{check.topic}[/]{facts}")
        elif check.differences:
            differs = True
            console.print(f"[yellow]{check.topic} exists and differs:[/]{facts}")
            for line in check.differences:
                console.print(f"  - {line}")
        else:
            console.print(f"{check.topic} exists with the right configuration{facts}")
        for warning in check.warnings:
            console.print(f"[yellow]warning:[/] {warning}")
    records = ensure_shards(settings)
    layout, features = records.layout, records.features
    console.print(f"cluster [bold]{settings.cluster}[/]: {layout.shards} shard{'s' if layout.shards > 1 else ''} of "
                  f"{layout.partitions // layout.shards} buffer partitions each (recorded in ZooKeeper at "
                  f"{settings.zk_root}/layout)")
    if features.problem is not None:
        console.print(f"[yellow]warning:[/] {escape(features.problem)}")
    else:
        # A cluster without a level ran 0.1.0: its nodes may still run, so init leaves raising it to finalize.
        raise_later = "" if features.recorded else (": once every node runs this delayq, `delayq upgrade finalize` "
                                                    "raises it (`delayq upgrade status` says whether it can)")
        console.print(f"cluster [bold]{settings.cluster}[/]: {features.describe()}{raise_later}")
    return 1 if differs and args.strict else 0
