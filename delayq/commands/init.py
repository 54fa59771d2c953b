"""``delayq init``: create the buffer and dead-letter topics, or check existing ones."""

from __future__ import annotations

import argparse

from rich.console import Console

console = Console()


def register(subparsers) -> None:
    init = subparsers.add_parser("init", help="create or check the buffer and dead-letter topics")
    init.add_argument("--partitions", type=int, help="buffer partitions at creation (DELAYQ_BUFFER_PARTITIONS)")
    init.add_argument("--strict", action="store_true", help="exit 1 when an existing topic differs from the settings")
    init.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from delayq.delay_service import ensure_topics
    from delayq.settings import Settings

    overrides = {"buffer_partitions": args.partitions} if args.partitions else {}
    settings = Settings(**overrides)
    differs = False
    for check in ensure_topics(settings):
        if check.created:
            console.print(f"created [bold]{check.topic}[/]")
        elif check.differences:
            differs = True
            console.print(f"[yellow]{check.topic} exists and differs:[/]")
            for line in check.differences:
                console.print(f"  - {line}")
        else:
            console.print(f"{check.topic} exists with the right configuration")
    return 1 if differs and args.strict else 0
