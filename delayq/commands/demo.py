"""``delayq demo``: unpaid orders time out through delayq while its master is killed; Spark proves it."""

from __future__ import annotations

import argparse
from pathlib import Path

from delayq.demo.options import DemoOptions

_DEFAULTS = DemoOptions()

_WHERE = """\
Kafka and ZooKeeper: with --state-dir DIR, the dev stack `delayq dev up --state-dir DIR`
started (at the ports it recorded there); else DELAYQ_BOOTSTRAP_SERVERS and
DELAYQ_ZK_CONNECT when set (both); else the embedded dev stack, which the demo starts
if it is not running and stops at the end if it started it. With --secure, the secured
dev stack (delayq dev up --secure): the nodes, the orders app and the reconciliation
each run as their own SCRAM user, with the ACLs `delayq acls` gives them.
"""


def register(subparsers) -> None:
    demo = subparsers.add_parser(
        "demo", help="the main job end to end on the embedded stack (about two minutes)",
        description="Unpaid orders time out through delayq while its master is killed; Spark proves the run.",
        epilog=_WHERE, formatter_class=argparse.RawDescriptionHelpFormatter)
    demo.add_argument("--rate", type=float, default=_DEFAULTS.orders_per_second, help="orders per second")
    demo.add_argument("--seconds", type=float, default=_DEFAULTS.order_seconds, help="how long orders arrive")
    demo.add_argument("--min-delay", type=float, default=_DEFAULTS.min_delay_s, help="shortest payment deadline, s")
    demo.add_argument("--max-delay", type=float, default=_DEFAULTS.max_delay_s, help="longest payment deadline, s")
    demo.add_argument("--pay-ratio", type=float, default=_DEFAULTS.pay_ratio, help="share of orders paid in time")
    demo.add_argument("--nodes", type=int, default=_DEFAULTS.nodes)
    demo.add_argument("--no-kill", action="store_true", help="do not kill the master midway")
    demo.add_argument("--no-reconcile", action="store_true", help="skip the Spark reconciliation at the end")
    demo.add_argument("--state-dir", type=Path, metavar="DIR",
                      help="use the running dev stack of this state folder (delayq dev up --state-dir DIR) "
                           "instead of DELAYQ_BOOTSTRAP_SERVERS/DELAYQ_ZK_CONNECT or the default dev stack")
    demo.add_argument("--secure", action="store_true",
                      help="run on the secured dev stack: SASL_SSL, Kafka ACLs, ZooKeeper ACLs, a principal per part")
    demo.add_argument("--out", type=Path, default=_DEFAULTS.out_dir, metavar="DIR",
                      help="where node data and reports go (default %(default)s)")
    demo.add_argument("--seed", type=int, help="random seed, for a repeatable run")
    demo.add_argument("--keep", action="store_true",
                      help="keep the demo cluster's topics and ZooKeeper folder afterwards (deleted by default)")
    demo.add_argument("--no-console", action="store_true",
                      help="the nodes do not serve the web console (by default they do, read-only, and the demo "
                           "prints its URL)")
    demo.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from delayq.demo import run_demo

    options = DemoOptions(
        orders_per_second=args.rate, order_seconds=args.seconds, min_delay_s=args.min_delay,
        max_delay_s=args.max_delay, pay_ratio=args.pay_ratio, nodes=args.nodes, kill_master=not args.no_kill,
        reconcile=not args.no_reconcile, out_dir=args.out, seed=args.seed, stack_dir=args.state_dir,
        secure=args.secure, keep=args.keep, console=not args.no_console,
    )
    return run_demo(options)
