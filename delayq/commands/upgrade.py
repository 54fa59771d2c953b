"""``delayq upgrade status`` and ``delayq upgrade finalize``: the cluster's feature level (docs/DESIGN.md, "Versions and
upgrades").

``status`` shows the finalized level, each registered node's version and the highest level it
speaks, and what ``finalize`` would do; ``finalize`` raises the level when every registered node
speaks it (election/levels.py has the rules), writing with the znode version it read.
"""

from __future__ import annotations

import argparse
import json

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from delayq import __version__
from delayq.cli import CommandError

console = Console()


def register(subparsers) -> None:
    upgrade = subparsers.add_parser("upgrade", help="the cluster's feature level: status, finalize after a rolling "
                                                    "upgrade")
    actions = upgrade.add_subparsers(dest="action", metavar="ACTION", required=True)
    status = actions.add_parser("status", help="the finalized level, each node's version and level, what finalize "
                                               "would do")
    status.add_argument("--json", action="store_true", help="print JSON")
    status.set_defaults(func=run_status)
    finalize = actions.add_parser("finalize", help="raise the finalized level once every registered node speaks it "
                                                   "(never lowered)")
    finalize.add_argument("--level", type=_level, metavar="N",
                          help="the level to finalize (default: the highest every registered node speaks, up to this "
                               "delayq's)")
    finalize.set_defaults(func=run_finalize)


def run_status(args: argparse.Namespace) -> int:
    from delayq.election import Features, Membership, connect_for, plan_finalize, version_text
    from delayq.features import SUPPORTED_LEVEL
    from delayq.settings import Settings

    settings = Settings()
    client = connect_for(settings, timeout_s=10)
    try:
        nodes = Membership.members(client, settings.zk_root)
        finalized = Features(client, settings.zk_root).read()
    finally:
        client.stop()
        client.close()
    plan = plan_finalize(nodes, finalized, settings.cluster)
    if args.json:
        print(json.dumps({
            "cluster": settings.cluster,
            "features": finalized.as_dict(),
            "supported_level": SUPPORTED_LEVEL,
            "nodes": [{"node_id": node.node_id, "version": node.version, "highest_level": node.highest_level,
                       "store_format": node.store_format} for node in nodes],
            "finalize": {"action": plan.action.value, "level": plan.level, "text": plan.text,
                         "adds": [{"level": added.level, "release": added.release, "adds": added.adds}
                                  for added in plan.adds]},
        }, indent=2, sort_keys=True))
        return 0
    console.print(f"cluster [bold]{escape(settings.cluster)}[/]: {escape(finalized.describe())}; this delayq "
                  f"({__version__}) speaks up to level {SUPPORTED_LEVEL}", highlight=False)
    table = Table("node", "version", "speaks up to level", "store format")
    for node in nodes:
        table.add_row(escape(node.node_id), escape(version_text(node.version)), str(node.highest_level),
                      "-" if node.store_format is None else str(node.store_format))
    console.print(table)
    console.print(escape(plan.text), highlight=False)
    for added in plan.adds:
        console.print(f"  level {added.level} (delayq {added.release}): {escape(added.adds)}", highlight=False)
    return 0


def run_finalize(args: argparse.Namespace) -> int:
    from delayq.election import FeatureRecord, Features, FinalizeAction, Membership, connect_for, plan_finalize
    from delayq.settings import Settings

    settings = Settings()
    client = connect_for(settings, timeout_s=10)
    try:
        features = Features(client, settings.zk_root)
        finalized = features.read()
        plan = plan_finalize(Membership.members(client, settings.zk_root), finalized, settings.cluster, args.level)
        if plan.action == FinalizeAction.REFUSED:
            raise CommandError(plan.text)
        if plan.action == FinalizeAction.RAISE and plan.level is not None:
            features.finalize(FeatureRecord.of(plan.level), finalized)
            console.print(f"cluster [bold]{escape(settings.cluster)}[/]: feature level raised from {finalized.level} "
                          f"to {plan.level} (recorded in ZooKeeper at {features.path})", highlight=False)
        else:
            console.print(escape(plan.text), highlight=False)
    finally:
        client.stop()
        client.close()
    return 0


def _level(text: str) -> int:
    """A ``--level``: a whole number from 1 (argparse says the error in one line)."""
    try:
        level = int(text)
    except ValueError:
        level = 0
    if level < 1:
        raise argparse.ArgumentTypeError(f"a feature level is a whole number from 1, not {text!r}")
    return level
