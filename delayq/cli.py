"""The ``delayq`` command line. Each sub-command group lives in ``delayq.commands.<name>``."""

from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import sys

from rich.console import Console
from rich.text import Text

from delayq import __version__
from delayq.errors import DelayqError
from delayq.extras import require_for_command

# Every module in delayq.commands registers its own sub-commands; these come first in --help.
FIRST_COMMANDS = ("dev", "init", "node", "status", "produce", "reconcile", "demo", "bench")

# soft_wrap: an error is one line, also in a log or CI (rich would wrap it at 80 columns there).
err_console = Console(stderr=True, soft_wrap=True)


class CommandError(DelayqError):
    """A command failed for a reason the user can act on; printed as one line, exit code 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="delayq", description="Arbitrary-time delayed delivery for Apache Kafka.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    import delayq.commands

    found = {m.name for m in pkgutil.iter_modules(delayq.commands.__path__)}
    order = [n for n in FIRST_COMMANDS if n in found] + sorted(found - set(FIRST_COMMANDS))
    for name in order:
        importlib.import_module(f"delayq.commands.{name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Log lines of the libraries (librdkafka through delayq.kafka, kazoo) as one readable line each;
    # `delayq node` sets its own format and level.
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # Only errors a user can act on are one line; anything else is a bug and keeps its traceback.
    try:
        require_for_command(args.command)
        return int(args.func(args) or 0)
    except DelayqError as err:
        return _user_error(args.command, str(err))
    except Exception as err:
        problem = _settings_problem(err)
        if problem is None:
            raise
        return _user_error(args.command, problem)
    except KeyboardInterrupt:
        err_console.print("interrupted")
        return 130


def _settings_problem(err: Exception) -> str | None:
    """One line for an invalid setting; None for any other error (a bug keeps its traceback)."""
    from pydantic import ValidationError

    from delayq.settings import settings_problem

    return settings_problem(err) if isinstance(err, ValidationError) else None


def _user_error(command: str, text: str) -> int:
    # A Text, not markup: the message may quote brackets from the user's input.
    err_console.print(Text.assemble((f"delayq {command}:", "bold red"), " ", text), highlight=False)
    return 2


if __name__ == "__main__":
    sys.exit(main())
