"""The ``delayq`` command line. Each sub-command group lives in ``delayq.commands.<name>``."""

from __future__ import annotations

import argparse
import importlib
import sys

from rich.console import Console

# Order is the order of `delayq --help`.
COMMAND_MODULES = ("dev", "demo")

err_console = Console(stderr=True)


class CommandError(Exception):
    """A command failed for a reason the user can act on; printed as one line, exit code 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="delayq", description="Arbitrary-time delayed delivery for Apache Kafka.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(f"delayq.commands.{name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from delayq.dev import StackError

    try:
        return int(args.func(args) or 0)
    except (CommandError, StackError, ValueError) as err:
        err_console.print(f"[bold red]delayq {args.command}:[/] {err}", highlight=False)
        return 2
    except KeyboardInterrupt:
        err_console.print("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
