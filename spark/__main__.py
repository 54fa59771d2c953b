"""``python -m delayq.spark``, or this file given to spark-submit: the reconciliation job alone.

Under spark-submit the master and the Kafka source come from spark-submit's own
``--master`` and ``--packages``; the connection comes from DELAYQ_* settings as
for every delayq part. Exit code 0: no anomaly (missing, duplicated, early,
unexpected, cancel or reschedule ignored); 1: some; 2: the job could not run.
"""

import argparse
import sys

from rich.console import Console

from delayq.errors import DelayqError
from delayq.spark.cli import add_arguments, run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="delayq.spark", description=__doc__.splitlines()[0])
    add_arguments(parser, default_master=None)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except (DelayqError, ValueError) as err:
        Console(stderr=True).print(f"[bold red]delayq.spark:[/] {err}", highlight=False)
        return 2


if __name__ == "__main__":
    sys.exit(main())
