"""``delayq soak``: a chaos soak: delayed traffic through an embedded cluster under faults, every message checked."""

from __future__ import annotations

import argparse
from pathlib import Path


def _seconds(text: str) -> float:
    from delayq.clock import parse_duration_ms
    from delayq.errors import UsageError

    try:
        return parse_duration_ms(text, "--duration") / 1000
    except UsageError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def register(subparsers) -> None:
    from delayq.bench.suites import FAULT_TEXT

    faults = "\n".join(f"  {name:<16} {text}" for name, text in FAULT_TEXT.items())
    soak = subparsers.add_parser(
        "soak", help="chaos soak test: delayed traffic under faults, every message checked, Spark verdict beside",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Start an embedded Kafka + ZooKeeper of its own (free loopback ports, beside `delayq dev`)\n"
                    "and N nodes (3 shards, each on 2 of 3 nodes, by default); produce delayed messages with a\n"
                    "plain delayq.Producer (10% cancelled, 5% rescheduled, some within a second of the due time,\n"
                    "2% repeating) while a seeded plan of faults hits the cluster; judge every message with a\n"
                    "read_committed consumer, and each id's writes in the buffer (in the order they were sent\n"
                    "and acknowledged, each once); then run `delayq reconcile` on the same topics and compare.\n"
                    "With --brokers N (2 or more) Kafka is a replicated cluster (N brokers, three KRaft\n"
                    "controllers; the buffer and the target topics at RF min(N, 3), min.insync.replicas one less)\n"
                    "and the broker faults below replace kafka_kill and kafka_pause; during them the times no\n"
                    "acknowledged write was possible count as outages, and every figure is also given per fault kind.\n"
                    "With --upgrade-from RELEASE the cluster starts as that release (built from its recorded commit)\n"
                    "and the fault upgrade_roll replaces its nodes by this code one at a time, then finalizes.\n"
                    "Exit code 0 when every rule held, 1 when one broke, 2 when the soak could not run.\n\n"
                    f"faults (each of the run's kinds at least once, never two at once):\n{faults}")
    soak.add_argument("--duration", type=_seconds, default=1800.0, metavar="DURATION",
                      help="traffic and faults phase, e.g. 2m, 30m, 1h (default 30m); draining and the "
                           "reconciliation follow")
    soak.add_argument("--rate", type=float, default=500.0, help="delayed messages per second (default 500)")
    soak.add_argument("--nodes", type=int, default=3, help="delay-service nodes (default 3)")
    soak.add_argument("--shards", type=int, default=3,
                      help="shards of the soak's cluster, each with its own master (default 3; 1, 2, 3 or 6)")
    soak.add_argument("--replicas", type=int, default=2,
                      help="nodes holding each shard (default 2; 0: every node holds every shard)")
    soak.add_argument("--brokers", type=int, default=1,
                      help="Kafka brokers of the soak's own stack (default 1; 2 or more: a replicated cluster with "
                           "its own broker faults, 3 for all of them; needs a JDK's javac for leader_move)")
    soak.add_argument("--processes", type=int, default=1, metavar="K",
                      help="member processes per node (DELAYQ_PROCESSES; default 1): each shard's master in a "
                           "process of its own, and master_kill/master_pause hit that member, not its node")
    soak.add_argument("--upgrade-from", metavar="RELEASE",
                      help="start the cluster as this release (e.g. 0.1.0; delayq/releases.toml) and roll it to this "
                           "code as a fault (upgrade_roll), then finalize; needs --duration 3m or more")
    soak.add_argument("--seed", type=int, help="seed of the traffic and the fault plan (default: random, printed)")
    soak.add_argument("--json", action="store_true", help="print one JSON object instead of the summary table")
    soak.add_argument("--no-reconcile", dest="reconcile", action="store_false",
                      help="skip the Spark reconciliation at the end")
    soak.add_argument("--state-dir", type=Path, help="where runs keep stack data, node logs and reports "
                                                     "(default ~/.local/state/delayq/soak)")
    soak.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from delayq.bench.soak import SoakOptions, run_soak
    from delayq.cli import CommandError

    try:
        options = SoakOptions(duration_s=args.duration, rate=args.rate, nodes=args.nodes, seed=args.seed,
                              reconcile=args.reconcile, shards=args.shards, replicas=args.replicas,
                              brokers=args.brokers, upgrade_from=args.upgrade_from,
                              processes=args.processes)
    except (ValueError, TypeError) as err:  # options that do not fit together (a duration too short, ...)
        raise CommandError(str(err)) from None
    if args.state_dir is not None:
        options.state_dir = args.state_dir
    return run_soak(options, as_json=args.json)
