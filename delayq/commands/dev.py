"""``delayq dev up|down|status|env``: the embedded local stack."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.table import Table

from delayq.dev import DevStack, default_state_dir

console = Console()


def register(subparsers) -> None:
    dev = subparsers.add_parser("dev", help="the embedded local stack: real Kafka (KRaft) and ZooKeeper on loopback")
    actions = dev.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name, func, text in (
        ("up", _up, "start Kafka and ZooKeeper (downloads the jars once) and wait until both answer"),
        ("down", _down, "stop the processes `up` started"),
        ("status", _status, "say what runs where"),
        ("env", _env, "print export lines for DELAYQ_BOOTSTRAP_SERVERS and DELAYQ_ZK_CONNECT"),
    ):
        action = actions.add_parser(name, help=text)
        action.add_argument("--state-dir", type=Path, default=default_state_dir(), help="where data and logs live")
        action.add_argument("--kafka-port", type=int, default=9092)
        action.add_argument("--zk-port", type=int, default=2181)
        action.set_defaults(func=func)
    actions.choices["up"].add_argument("--timeout", type=float, default=90.0, help="seconds to wait for both to answer")


def stack_from(args: argparse.Namespace) -> DevStack:
    return DevStack(args.state_dir, kafka_port=args.kafka_port, zk_port=args.zk_port,
                    start_timeout_s=getattr(args, "timeout", 90.0))


def _up(args: argparse.Namespace) -> int:
    stack = stack_from(args)
    with console.status("starting Kafka and ZooKeeper"):
        started = stack.up(say=console.print)
    what = ", ".join(started) if started else "nothing (both were running)"
    console.print(f"started {what}; Kafka at {stack.bootstrap_servers}, ZooKeeper at {stack.zk_connect}")
    return 0


def _down(args: argparse.Namespace) -> int:
    stopped = stack_from(args).down()
    console.print(f"stopped {', '.join(stopped)}" if stopped else "nothing was running")
    return 0


def _status(args: argparse.Namespace) -> int:
    table = Table(title=f"delayq dev stack ({args.state_dir})")
    for column in ("service", "version", "address", "pid", "state", "log"):
        table.add_column(column)
    healthy = True
    for status in stack_from(args).status():
        state = "healthy" if status.healthy else ("running, not answering" if status.running else "stopped")
        healthy &= status.healthy
        table.add_row(status.name, status.version, status.address, str(status.pid or "-"), state, str(status.log))
    console.print(table)
    return 0 if healthy else 1


def _env(args: argparse.Namespace) -> int:
    for key, value in stack_from(args).env().items():
        print(f"export {key}={value}")
    return 0
