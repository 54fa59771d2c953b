"""The ``delayq`` command line. Each sub-command group lives in ``delayq.commands.<name>``."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from rich.console import Console

from delayq.errors import DelayqError

# Every module in delayq.commands registers its own sub-commands; these come first in --help.
FIRST_COMMANDS = ("dev", "init", "node", "status", "produce", "reconcile", "demo", "bench")

err_console = Console(stderr=True)


class CommandError(DelayqError):
    """A command failed for a reason the user can act on; printed as one line, exit code 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="delayq", description="Arbitrary-time delayed delivery for Apache Kafka.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    import delayq.commands

    found = {m.name for m in pkgutil.iter_modules(delayq.commands.__path__)}
    order = [n for n in FIRST_COMMANDS if n in found] + sorted(found - set(FIRST_COMMANDS))
    for name in order:
        importlib.import_module(f"delayq.commands.{name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (DelayqError, ValueError) as err:
        err_console.print(f"[bold red]delayq {args.command}:[/] {err}", highlight=False)
        return 2
    except KeyboardInterrupt:
        err_console.print("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
