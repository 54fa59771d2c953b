"""Command-line arguments of the job, shared by ``delayq reconcile`` and ``python -m delayq.spark``."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from delayq.clock import parse_duration_ms
from delayq.errors import UsageError

from .destination import parse_out
from .options import MAVEN_CENTRAL, ReconcileOptions, parse_instant
from .report import ANOMALY_KINDS, EVIDENCE_NAMES, alert_text, count_label

if TYPE_CHECKING:
    from delayq import Settings

    from .follow import FollowOptions


def add_arguments(parser: argparse.ArgumentParser, *, default_master: str | None,
                  master_from_settings: bool = False) -> None:
    """The job's flags.

    Args:
        parser: where to add them.
        default_master: the --master default: None under spark-submit (the master it was given).
        master_from_settings: without --master, :func:`run` takes the ``spark_master`` setting
            (``DELAYQ_SPARK_MASTER``, else ``local[*]``): ``delayq reconcile``'s way.
    """
    parser.set_defaults(master_from_settings=master_from_settings)
    parser.add_argument("--since", default="24h",
                        help="window start: ISO 8601 time (UTC unless it has an offset) or a duration before now "
                             "like 24h (default: 24h)")
    parser.add_argument("--until", default="now", help="window end: ISO 8601 time, a duration before now, or now "
                                                       "(default: now)")
    parser.add_argument("--grace", default="5m",
                        help="a message due less than this before --until is not yet missing (default: 5m)")
    parser.add_argument("--early-tolerance", default="10ms",
                        help="a delivery up to this much before its due time is not early: clock skew between "
                             "producer and master hosts (default: 10ms)")
    parser.add_argument("--reorder-tolerance", default="0ms",
                        help="two producer writes of one id (puts, cancels) whose buffer offsets and creation "
                             "times disagree by this much or less are not reordered: clock skew between producer "
                             "hosts (default: 0ms)")
    parser.add_argument("--ack-grace", default="5m",
                        help="how long a producer's acknowledgement may lag its write's creation: a cancel or "
                             "reschedule created less than this before the due time of a version delivered anyway "
                             "lost the race by the master's cutoff; created earlier and appended before the "
                             "delivery's done, it was ignored (default: 5m, librdkafka's message.timeout.ms: a write "
                             "not acknowledged by then has failed)")
    parser.add_argument("--lookback", default="1h",
                        help="read target topics from this long before --since, to catch early deliveries "
                             "(default: 1h)")
    parser.add_argument("--out", default="delayq-report",
                        help="folder, or object-store URL (s3://bucket/prefix; credentials AWS_ACCESS_KEY_ID/"
                             "AWS_SECRET_ACCESS_KEY, endpoint AWS_ENDPOINT_URL), for report.json, report.html and "
                             "anomalies/*.parquet (default: ./delayq-report)")
    parser.add_argument("--topics", default=None,
                        help="comma-separated target topics (default: found from the buffer's put frames)")
    parser.add_argument("--read-uncommitted", action="store_true",
                        help="also count records of open and aborted transactions (default: read_committed)")
    shown = ("DELAYQ_SPARK_MASTER, else local[*]" if master_from_settings
             else default_master or "the one spark-submit was given")
    parser.add_argument("--master", default=default_master,
                        help=f"Spark master: local[N], spark://HOST:PORT (a standalone cluster: the job ships "
                             f"delayq's code and the Kafka source to its executors), yarn, k8s://... (default: "
                             f"{shown})")
    parser.add_argument("--list-limit", type=int, default=1000,
                        help="ids per anomaly list in report.json; Parquet has them all (default: 1000)")
    parser.add_argument("--maven-repo", default=MAVEN_CENTRAL,
                        help="Maven repository the Spark Kafka source is resolved from on the first run")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="extra Spark setting for the session the job starts (repeatable)")
    follow = parser.add_argument_group("continuous reconciliation (--follow)")
    follow.add_argument("--follow", action="store_true",
                        help="judge continuously (a Structured Streaming job) until stopped, reporting each finding "
                             "once to the findings topic and as delayq_reconcile_* metrics; a message is missing "
                             "once its due time plus --grace has passed undelivered (--since, --until, --out and "
                             "--list-limit do not apply)")
    follow.add_argument("--checkpoint", type=Path, default=None,
                        help="with --follow: folder of the job's checkpoint (offsets and each id's records); a run "
                             "on the same folder resumes where the last one stopped (required)")
    follow.add_argument("--findings-topic", default=None,
                        help="with --follow: the topic findings go to (default: delayq-<cluster>-reconcile-findings)")
    follow.add_argument("--metrics-port", type=int, default=9464,
                        help="with --follow: serve Prometheus metrics on this port, on DELAYQ_HTTP_HOST; 0: none "
                             "(default: 9464)")
    follow.add_argument("--trigger", type=float, default=10.0,
                        help="with --follow: seconds between micro-batches (default: 10)")
    follow.add_argument("--retain", default="1h",
                        help="with --follow: how long an id's records are kept after its due time plus the grace, so "
                             "a later duplicate is still told from an unknown id (default: 1h)")


def options_from_args(args: argparse.Namespace, *, now_ms: int | None = None) -> ReconcileOptions:
    """ReconcileOptions from parsed flags.

    Raises:
        UsageError: a flag's value is malformed, or flags that do not fit together (--since after
            --until, a --grace longer than the window); the message names them.
    """
    try:
        return _options(args, now_ms)
    except (TypeError, ValueError) as err:
        if isinstance(err, UsageError):
            raise
        raise UsageError(str(err)) from None


def _options(args: argparse.Namespace, now_ms: int | None) -> ReconcileOptions:
    conf = {}
    for item in args.conf:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--conf {item!r} must be KEY=VALUE, e.g. spark.sql.shuffle.partitions=8")
        conf[key.strip()] = value
    topics = None
    if args.topics is not None:
        topics = tuple(t.strip() for t in args.topics.split(",") if t.strip())
        if not topics:
            raise ValueError("--topics is empty: give comma-separated topic names, or leave it out to find them")
    return ReconcileOptions(
        since_ms=parse_instant(args.since, "--since", now_ms=now_ms),
        until_ms=parse_instant(args.until, "--until", now_ms=now_ms),
        out=parse_out(args.out),
        grace_ms=parse_duration_ms(args.grace, "--grace"),
        early_tolerance_ms=parse_duration_ms(args.early_tolerance, "--early-tolerance"),
        reorder_tolerance_ms=parse_duration_ms(args.reorder_tolerance, "--reorder-tolerance"),
        ack_grace_ms=parse_duration_ms(args.ack_grace, "--ack-grace"),
        lookback_ms=parse_duration_ms(args.lookback, "--lookback"),
        topics=topics,
        read_committed=not args.read_uncommitted,
        list_limit=args.list_limit,
        master=args.master,
        maven_repository=args.maven_repo,
        spark_conf=conf,
    )


# Flags of the batch report that mean nothing to --follow, with their defaults.
_BATCH_ONLY = {"since": "24h", "until": "now", "out": "delayq-report", "list_limit": 1000}
# Flags of --follow that mean nothing to the batch report, with their defaults.
_FOLLOW_ONLY = {"checkpoint": None, "findings_topic": None, "metrics_port": 9464, "trigger": 10.0, "retain": "1h"}


def follow_options_from_args(args: argparse.Namespace, *, now_ms: int | None = None) -> FollowOptions:
    """FollowOptions from parsed flags (``--follow``).

    Raises:
        UsageError: no --checkpoint, a flag of the batch report given, or a value out of range; the message
            names the flag.
    """
    from .follow import FOREVER_MS, FollowOptions

    given = [f"--{name.replace('_', '-')}" for name, default in _BATCH_ONLY.items()
             if getattr(args, name) != default]
    if given:
        raise UsageError(f"{', '.join(given)} cannot go with --follow: the continuous job judges every id as it "
                         "falls due, with no window and no report folder; leave them out")
    if args.checkpoint is None:
        raise UsageError("--follow needs --checkpoint DIR: the folder the job resumes from after a restart "
                         "(e.g. --checkpoint /var/lib/delayq/reconcile)")
    try:
        whole_time = argparse.Namespace(**{**vars(args), "since": "1970-01-01T00:00:00Z", "until": "now"})
        rules = options_from_args(whole_time, now_ms=now_ms)
        rules = replace(rules, since_ms=0, until_ms=FOREVER_MS)
        return FollowOptions(checkpoint=args.checkpoint, rules=rules, findings_topic=args.findings_topic,
                             metrics_port=args.metrics_port, trigger_s=args.trigger,
                             retain_ms=parse_duration_ms(args.retain, "--retain"), topics=rules.topics,
                             master=args.master, maven_repository=args.maven_repo, spark_conf=rules.spark_conf)
    except (TypeError, ValueError) as err:
        if isinstance(err, UsageError):
            raise
        raise UsageError(str(err)) from None


def chosen_master(args: argparse.Namespace, settings: Settings) -> str | None:
    """--master if given; else the ``spark_master`` setting where the flags say so (``delayq reconcile``), else None
    (under spark-submit: the master it was given)."""
    if args.master is None and getattr(args, "master_from_settings", False):
        return settings.spark_master
    return args.master


def run(args: argparse.Namespace, console: Console | None = None) -> int:
    """Run the job from parsed flags, with progress; print the summary; return the exit code (0 or 1)."""
    from delayq import Settings

    from . import reconcile
    from .progress import SparkProgress

    console = console or Console()
    settings = Settings()
    args.master = chosen_master(args, settings)
    if args.follow:
        return run_follow(settings, follow_options_from_args(args), console)
    given = [f"--{name.replace('_', '-')}" for name, default in _FOLLOW_ONLY.items()
             if getattr(args, name) != default]
    if given:
        raise UsageError(f"{', '.join(given)} only go with --follow (the continuous job); add --follow, or leave "
                         "them out for a report over a window")
    options = options_from_args(args)
    with SparkProgress() as progress:
        report = reconcile(settings, options, progress=progress.step)
    print_summary(report, console)
    return report.exit_code


def run_follow(settings: Settings, options: FollowOptions, console: Console) -> int:
    """Run ``--follow`` until SIGTERM or Ctrl-C, a line per micro-batch that read something or found something."""
    from .follow import BatchSummary, follow, lag_text

    def say(summary: BatchSummary) -> None:
        if not summary.fresh and not summary.findings:
            return
        read = ", ".join(f"{n:,} {side}" for side, n in summary.fresh.items())
        found = ", ".join(f"[bold red]{f.kind}[/] {escape(f.id)}" for f in summary.findings)
        console.print(f"batch {summary.batch}: read {read or 'nothing'}; judged {summary.ids:,} ids; lag "
                      f"{lag_text(summary.lag_s)}" + (f"; found {found}" if found else ""))

    topic = options.findings_topic_of(settings)
    where = f", metrics on http://{settings.http_host}:{options.metrics_port}/metrics" if options.metrics_port else ""
    console.print(f"following {settings.buffer_topic}: findings to {topic}{where}; checkpoint {options.checkpoint}")
    follow(settings, options, say=say)
    console.print("stopped; a run on the same --checkpoint resumes here")
    return 0


def print_summary(report, console: Console) -> None:
    """The totals and where the files are, as a person reads them in a terminal."""
    totals, lateness = report.totals, report.lateness_ms
    table = Table(title=f"delayq reconciliation, due {report.window['since']} → {report.window['until']}")
    table.add_column("finding")
    table.add_column("ids", justify="right")
    alarming = set(ANOMALY_KINDS)
    for name in ("expected", "delivered", "missing", "undeliverable", "duplicates", "unexpected", "early",
                 "cancel_ignored", "reordered", "in_grace", "cancelled", "cancelled_too_late", "rescheduled_too_late",
                 "already_due_when_written", "twice_written", "dead_lettered", "malformed_buffer_records"):
        value = str(totals.get(name, 0))
        table.add_row(count_label(name), f"[bold red]{value}[/]" if name in alarming and totals[name] else value)
        if name in ("cancelled_too_late", "rescheduled_too_late"):  # split by what shows it was too late
            for evidence, label in EVIDENCE_NAMES.items():
                table.add_row(f"  {label}", str(totals.get(f"{name}_{evidence}", 0)))
    console.print(table)
    gap = report.too_late_by_cutoff or {}
    if gap.get("count"):
        console.print(f"too late by the cutoff only, created this long before the due time, ms: p50 {gap['p50']}, "
                      f"max {gap['max']}")
    if lateness["count"]:
        console.print("lateness ms: " + ", ".join(f"{k} {lateness[k]}" for k in ("p50", "p90", "p99", "max")))
    already = report.already_due_when_written or {}
    if already.get("delivered"):
        console.print("already due when written, put to first delivery ms: "
                      + ", ".join(f"{k} {already[k]}" for k in ("p50", "p99", "max")))
    by_code = (report.dead_letters or {}).get("by_code") or {}
    if by_code:
        console.print("dead letters by reason: " + ", ".join(f"{code} {n}" for code, n in by_code.items()))
    if report.source["topics_not_found"]:
        console.print(f"[yellow]target topics not found:[/] {', '.join(report.source['topics_not_found'])}")
    verdict = "[green]OK[/]" if report.ok else f"[bold red]ALERT: {escape(alert_text(totals))}[/]"
    console.print(f"{verdict}; report: {report.files.get('html')}")
