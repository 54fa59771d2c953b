"""``delayq acls``: the Kafka ACLs each role of the cluster needs; ``--apply`` creates them."""

from __future__ import annotations

import argparse

from rich.console import Console

console = Console(soft_wrap=True)


def register(subparsers) -> None:
    acls = subparsers.add_parser(
        "acls", help="print (or --apply) the Kafka ACLs a node, a producer, the reconciliation and the console need",
        description="Print the Kafka ACLs each role of this cluster (DELAYQ_CLUSTER) needs, prefixed where Kafka "
                    "allows and nothing wider, each with its reason; --apply creates them through the Admin API "
                    "(run it as the Kafka admin).")
    acls.add_argument("--node", metavar="PRINCIPAL", help="the nodes' principal, e.g. User:delayq-node")
    acls.add_argument("--producer", metavar="PRINCIPAL", help="the producers' principal, e.g. User:orders-app")
    acls.add_argument("--reconcile", metavar="PRINCIPAL", help="the reconciliation's principal")
    acls.add_argument("--console", metavar="PRINCIPAL",
                      help="the web console's principal (delayq console; the nodes' own when they serve /console)")
    acls.add_argument("--targets", nargs="+", metavar="PATTERN",
                      help="target topics the nodes deliver to and the reconciliation and the console read: names, "
                           "prefixes ending in '*', or '*' (default: DELAYQ_TARGET_TOPICS)")
    acls.add_argument("--apply", action="store_true", help="create the ACLs (existing ones stay as they are)")
    acls.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from delayq.delay_service import apply_acls, required_acls
    from delayq.settings import Settings

    settings = Settings()
    lines = required_acls(settings, node=args.node, producer=args.producer, reconcile=args.reconcile,
                          console=args.console, targets=args.targets)
    print(f"# cluster {settings.cluster}: buffer {settings.buffer_topic}, dead letters {settings.dead_letter_topic}")
    for line in lines:
        print(line.text())
    if args.apply:
        created = apply_acls(settings, lines)
        console.print(f"created {created} ACLs on {settings.bootstrap_servers} (existing ones were left as they were)",
                      highlight=False)
    return 0
