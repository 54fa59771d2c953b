"""``delayq status [--json]``: the cluster as ZooKeeper sees it."""

from __future__ import annotations

import argparse
import json

from rich.console import Console
from rich.table import Table

console = Console()


def register(subparsers) -> None:
    status = subparsers.add_parser("status", help="master, epoch, nodes, pending, lag, cursor")
    status.add_argument("--json", action="store_true", help="print JSON")
    status.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from delayq.delay_service import cluster_status
    from delayq.settings import Settings

    status = cluster_status(Settings())
    if args.json:
        print(json.dumps(status, indent=2, sort_keys=True))
        return 0
    console.print(f"cluster [bold]{status['cluster']}[/]: master {status['master'] or '[red]none[/]'}, "
                  f"epoch {status['epoch']}")
    table = Table()
    for column in ("node", "role", "lag", "pending", "http"):
        table.add_column(column)
    for node in status["nodes"]:
        table.add_row(node["node_id"], node["role"], str(node["lag"]), str(node["pending"]), node["http"])
    console.print(table)
    if status["cursor"]:
        console.print(f"cursor: {json.dumps(status['cursor'], sort_keys=True)}")
    return 0
