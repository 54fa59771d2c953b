"""``delayq bench``: the benchmark suite, writing bench/results.json and the table in BENCHMARKS.md."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers) -> None:
    from delayq.bench.suites import SUITE_TEXT

    suites = "\n".join(f"  {name:<10} {text}" for name, text in SUITE_TEXT.items())
    bench = subparsers.add_parser(
        "bench", help="the benchmark suite (figures in BENCHMARKS.md), beside a Redis sorted-set peer",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run the benchmark suite on the embedded stack. Each figure is the median of --runs runs with "
                    "its spread; the Redis peer runs alternately with delayq where it has a counterpart. Writes "
                    "bench/results.json and the table in BENCHMARKS.md (a run with --only updates its own figures "
                    f"and keeps the others).\n\nsuites:\n{suites}")
    bench.add_argument("--only", metavar="NAME[,NAME]",
                       type=lambda text: [n.strip() for n in text.split(",") if n.strip()],
                       help="run these suites only")
    bench.add_argument("--runs", type=int, default=3, help="runs per figure (default 3)")
    bench.add_argument("--capacity-runs", type=int, default=1,
                       help="runs of the capacity suite, 10M pending each (default 1)")
    bench.add_argument("--quick", action="store_true",
                       help="small sizes for a smoke run of a few minutes (100k pending instead of 10M, ...); "
                            "written to ~/.local/state/delayq/bench-quick unless --results/--markdown say otherwise")
    bench.add_argument("--no-peer", dest="peer", action="store_false", help="leave the Redis peer out")
    bench.add_argument("--results", type=Path, help="results.json to write (default bench/results.json)")
    bench.add_argument("--markdown", type=Path, help="markdown file for the table (default BENCHMARKS.md)")
    bench.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from delayq.bench.runner import BenchOptions, run_bench

    options = BenchOptions(only=args.only, runs=args.runs, quick=args.quick, peer=args.peer,
                           capacity_runs=args.capacity_runs, results=args.results, markdown=args.markdown)
    return run_bench(options)
