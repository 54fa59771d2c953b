"""``delayq reconcile``: the Spark job that proves every delayed message was delivered once, on time."""

from __future__ import annotations

import argparse


def register(subparsers) -> None:
    from delayq.spark.cli import add_arguments

    parser = subparsers.add_parser(
        "reconcile",
        help="Spark report: expected vs delivered per delay id (duplicates, missing, unexpected, early, "
             "cancel_ignored, lateness)",
        description="Read the buffer and target topics with Spark, judge every delay id (and every version of it: "
                    "a reschedule is a newer put) due in the window, and write report.json, report.html and "
                    "anomalies/*.parquet. Exit code 0 when nothing is missing, duplicated, early or unexpected and "
                    "no cancel or reschedule acknowledged in time was ignored; 1 otherwise.")
    add_arguments(parser, default_master=None, master_from_settings=True)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from delayq.cli import CommandError
    from delayq.spark import ReconcileError
    from delayq.spark.cli import run as run_job

    try:
        return run_job(args)
    except ReconcileError as err:
        raise CommandError(str(err)) from err
