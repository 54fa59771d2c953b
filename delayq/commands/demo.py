"""``delayq demo``: unpaid orders time out through delayq while its master is killed; Spark proves it."""

from __future__ import annotations

import argparse
from pathlib import Path

from delayq.demo import DemoOptions, run_demo

_DEFAULTS = DemoOptions()


def register(subparsers) -> None:
    demo = subparsers.add_parser("demo", help="the main job end to end on the embedded stack (about two minutes)")
    demo.add_argument("--rate", type=float, default=_DEFAULTS.orders_per_second, help="orders per second")
    demo.add_argument("--seconds", type=float, default=_DEFAULTS.order_seconds, help="how long orders arrive")
    demo.add_argument("--min-delay", type=float, default=_DEFAULTS.min_delay_s, help="shortest payment deadline, s")
    demo.add_argument("--max-delay", type=float, default=_DEFAULTS.max_delay_s, help="longest payment deadline, s")
    demo.add_argument("--pay-ratio", type=float, default=_DEFAULTS.pay_ratio, help="share of orders paid in time")
    demo.add_argument("--nodes", type=int, default=_DEFAULTS.nodes)
    demo.add_argument("--no-kill", action="store_true", help="do not kill the master midway")
    demo.add_argument("--no-reconcile", action="store_true", help="skip the Spark reconciliation at the end")
    demo.add_argument("--state-dir", type=Path, default=_DEFAULTS.state_dir, help="where node data and reports go")
    demo.add_argument("--seed", type=int, help="random seed, for a repeatable run")
    demo.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    options = DemoOptions(
        orders_per_second=args.rate, order_seconds=args.seconds, min_delay_s=args.min_delay,
        max_delay_s=args.max_delay, pay_ratio=args.pay_ratio, nodes=args.nodes, kill_master=not args.no_kill,
        reconcile=not args.no_reconcile, state_dir=args.state_dir, seed=args.seed,
    )
    return run_demo(options)
