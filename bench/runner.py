"""``delayq bench``: run the suite, keep every figure as the median of its runs with the spread.

Each suite measures one thing (ingest, delivery, lateness, ...) through the functions of
:mod:`delayq.bench.service_bench`, :mod:`delayq.bench.redis_peer`, ``scale_bench``, ``produce_bench``
and ``reconcile_bench``; this module only repeats them, shows progress, and writes
``bench/results.json`` and the table in ``BENCHMARKS.md``. A run with ``--only`` updates
the figures it measured and keeps the others, so slow figures can be measured apart.
"""

from __future__ import annotations

import itertools
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from importlib import metadata
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from delayq.dev import KAFKA_VERSION, ZOOKEEPER_VERSION, DevStack

from . import scale_bench as scale
from . import service_bench as service
from .report import PEER, Figure, render_markdown, write_markdown
from .suites import OPT_IN_SUITES, SUITE_TEXT

console = Console()

BENCH_DIR = Path(__file__).resolve().parent
RESULTS_PATH = BENCH_DIR / "results.json"
MARKDOWN_PATH = BENCH_DIR.parent / "BENCHMARKS.md"
QUICK_DIR = Path.home() / ".local" / "state" / "delayq" / "bench-quick"


@dataclass(frozen=True)
class Sizes:
    """How much each suite moves. ``QUICK`` is a smoke run of a few minutes; the default is the real suite."""

    ingest: int = 200_000
    delivery: int = 100_000
    lateness_rates: tuple[int, ...] = (1_000, 5_000, 20_000)
    lateness_seconds: int = 10
    expiry: int = 100_000
    limit_rate: int = 20_000  # the limits suite's dispatch limit: the expiry above takes 5 s at it
    produce_calls: int = 10_000
    produce_runs: int = 21
    produce_quiet_wait_s: float = 120.0
    capacity: int = 10_000_000
    capacity_large: int = 100_000_000  # issue 15: "measured once at 100,000,000 pending on one node"
    rebuild: int = 10_000_000  # issue 15: "measure it at 10M"
    reconcile: int = 1_000_000  # issue 33's 10M: BENCH_RECONCILE_MESSAGES=10M (reconcile_bench.messages_from)
    # The scale suite, per run of each configuration: messages delivered (and moved by the peer), and ingested
    # (more: the fastest configuration must take over a second, timed by polling the nodes every 50 ms).
    scale_delivery: int = 100_000
    scale_ingest: int = 400_000
    # The console suite: pending messages on its node and dead letters (issue 34's figure).
    console: int = 10_000_000
    console_dead_letters: int = 100_000


QUICK = Sizes(ingest=20_000, delivery=10_000, lateness_seconds=1, expiry=10_000, limit_rate=5_000,
              produce_calls=2_000, produce_runs=5, produce_quiet_wait_s=3.0, capacity=100_000, capacity_large=200_000,
              rebuild=50_000, reconcile=20_000, scale_delivery=10_000, scale_ingest=20_000,
              console=100_000, console_dead_letters=10_000)


@dataclass
class BenchOptions:
    """What ``delayq bench`` was asked for.

    Args:
        only: suite names to run (None: all of them, in order).
        runs: runs per figure; each figure is the median of its runs.
        quick: small sizes (QUICK), written beside the real results unless paths are given.
        peer: also measure the Redis sorted-set peer where delayq has a counterpart.
        capacity_runs: runs of the capacity suite, which holds 10M messages per run.
        results: where results.json goes (None: bench/results.json, or the quick folder).
        markdown: where the BENCHMARKS.md table goes (None: the repository's, or the quick folder).

    Raises:
        ValueError: an unknown suite name in ``only``, or ``runs``/``capacity_runs`` below 1.
    """

    only: list[str] | None = None
    runs: int = 3
    quick: bool = False
    peer: bool = True
    capacity_runs: int = 1
    results: Path | None = None
    markdown: Path | None = None

    def __post_init__(self) -> None:
        if self.only is not None:
            unknown = [name for name in self.only if name not in SUITES]
            if unknown or not self.only:
                raise ValueError(f"only: unknown suite {', '.join(map(repr, unknown)) or '(none given)'}; "
                                 f"choose from {', '.join(SUITES)}")
        for name in ("runs", "capacity_runs"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a whole number of at least 1, not {value!r}")

    @property
    def sizes(self) -> Sizes:
        return QUICK if self.quick else Sizes()

    @property
    def results_path(self) -> Path:
        return self.results or (QUICK_DIR / "results.json" if self.quick else RESULTS_PATH)

    @property
    def markdown_path(self) -> Path:
        return self.markdown or (QUICK_DIR / "BENCHMARKS.md" if self.quick else MARKDOWN_PATH)

    def suites(self) -> list[str]:
        if self.only is None:
            return [name for name in SUITES if name not in OPT_IN_SUITES]
        return [name for name in SUITES if name in self.only]


@dataclass
class Context:
    """What a suite needs: the stack, sizes, run count, the progress display, the Redis peer."""

    stack: DevStack
    options: BenchOptions
    progress: Progress
    exits: ExitStack
    versions: dict[str, str] = field(default_factory=dict)
    _redis: object | None = None
    _secured: DevStack | None = None

    @property
    def sizes(self) -> Sizes:
        return self.options.sizes

    @property
    def runs(self) -> int:
        return self.options.runs

    def redis(self):
        """The peer's redis-server, started on first use and stopped when the bench ends."""
        if self._redis is None:
            from .redis_peer import RedisServer, redis

            with self.progress.console.status("starting redis-server (installing it first if it is missing)"):
                self._redis = self.exits.enter_context(RedisServer.start())
            self.versions["Redis"] = self._redis.version
            self.versions["redis-py"] = redis.__version__
        return self._redis

    def secured(self) -> DevStack:
        """A secured dev stack (SASL_SSL, ACLs) on free ports, started on first use, stopped and wiped at the end."""
        if self._secured is None:
            from delayq.testing import free_stack_ports

            folder = Path(self.exits.enter_context(tempfile.TemporaryDirectory(prefix="delayq-bench-secure-")))
            kafka_port, zk_port = free_stack_ports()
            stack = DevStack(folder / "stack", kafka_port=kafka_port, zk_port=zk_port, secure=True)
            with self.progress.console.status("starting the secured dev stack"):
                stack.up(say=self.progress.console.print)
            self.exits.callback(stack.down)
            self._secured = stack
        return self._secured

    def step(self, label: str, measure: Callable[[], object]):
        """One measurement, under ``label`` in the progress display; the bars it adds go when it ends."""
        before = set(self.progress.task_ids)
        self.progress.add_task(label, total=None)
        try:
            return measure()
        finally:
            for task_id in set(self.progress.task_ids) - before:
                self.progress.remove_task(task_id)

    def repeat(self, label: str, measure: Callable[[], object], runs: int | None = None) -> list:
        runs = runs or self.runs
        return [self.step(f"{label} ({run + 1}/{runs})", measure) for run in range(runs)]

    def paired(self, label: str, measure: Callable[[], object], measure_peer: Callable[[], object],
               runs: int | None = None) -> tuple[list, list | None]:
        """delayq's and the peer's runs, alternating, so the machine's load swings hit both alike."""
        runs = runs or self.runs
        ours, theirs = [], []
        for run in range(runs):
            ours.append(self.step(f"{label}: delayq ({run + 1}/{runs})", measure))
            if self.options.peer:
                self.redis()
                theirs.append(self.step(f"{label}: Redis peer ({run + 1}/{runs})", measure_peer))
        return ours, (theirs if self.options.peer else None)


# -- the suites: each returns its figures ------------------------------------------------------------------


def suite_ingest(ctx: Context) -> list[Figure]:
    n = ctx.sizes.ingest
    values = ctx.repeat("ingest", lambda: service.bench_ingest(ctx.stack, n, ctx.progress))
    return [Figure("ingest", f"ingest into one node's store ({n:,} buffer records)", "msg/s", "higher", values)]


def suite_delivery(ctx: Context) -> list[Figure]:
    from .redis_peer import peer_throughput

    n = ctx.sizes.delivery
    ours, theirs = ctx.paired("delivery", lambda: service.bench_delivery(ctx.stack, n, ctx.progress),
                              lambda: peer_throughput(ctx.redis(), ctx.stack, n, ctx.progress))
    return [Figure("delivery", f"delivery of {n:,} due messages to Kafka (master / poller)", "msg/s", "higher",
                   ours, peer=theirs)]


def _lateness_figures(key: str, label: str, ours: list[dict], theirs: list[dict] | None) -> list[Figure]:
    checks = {"delivered": [r["count"] for r in ours], "expected": ours[0]["expected"],
              "early": [r["early"] for r in ours], "stored_ahead_ms": [r["stored_ahead_ms"] for r in ours]}
    if theirs is not None:
        checks["peer"] = {"delivered": [r["count"] for r in theirs], "early": [r["early"] for r in theirs]}
    for who, runs in (("delayq", ours), (PEER, theirs or [])):
        for r in runs:
            if r["early"] or r["count"] != r["expected"] or r["stored_ahead_ms"] < 0:
                console.log(f"[bold red]{label}, {who}: {r['early']} early, {r['count']:,} of {r['expected']:,} "
                            f"delivered, stored {r['stored_ahead_ms']} ms ahead of the first due time[/]")
    return [Figure(f"{key}.{stat}", f"{label}: {name}", "ms", "lower", [r[stat] for r in ours],
                   peer=[r[stat] for r in theirs] if theirs is not None else None, details=checks)
            for stat, name in (("p50_ms", "p50"), ("p99_ms", "p99"), ("max_ms", "max"))]


def suite_lateness(ctx: Context) -> list[Figure]:
    from .redis_peer import peer_lateness

    seconds = ctx.sizes.lateness_seconds
    figures = []
    for rate in ctx.sizes.lateness_rates:
        ours, theirs = ctx.paired(
            f"lateness at {rate:,} msg/s",
            lambda rate=rate: service.bench_lateness(ctx.stack, rate, seconds, ctx.progress),
            lambda rate=rate: peer_lateness(ctx.redis(), ctx.stack, rate, seconds, ctx.progress))
        figures += _lateness_figures(f"lateness.{rate}", f"lateness at {rate:,} msg/s falling due for {seconds} s",
                                     ours, theirs)
    return figures


def suite_expiry(ctx: Context) -> list[Figure]:
    from .redis_peer import peer_mass_expiry

    n = ctx.sizes.expiry
    ours, theirs = ctx.paired("mass expiry", lambda: service.bench_mass_expiry(ctx.stack, n, ctx.progress),
                              lambda: peer_mass_expiry(ctx.redis(), ctx.stack, n, ctx.progress))
    figure = _lateness_figures("expiry", f"mass expiry: {n:,} due in the same millisecond", ours, theirs)[2]
    return [replace(figure, label=f"mass expiry: {n:,} due in the same ms, time until all delivered")]


def suite_limits(ctx: Context) -> list[Figure]:
    n, rate = ctx.sizes.expiry, ctx.sizes.limit_rate
    runs = ctx.repeat("limited expiry", lambda: service.bench_limited_expiry(ctx.stack, n, rate, ctx.progress))
    for run in runs:
        for part in ("limited", "other"):
            if run[part]["count"] != run[part]["expected"] or run[part]["early"] or run[part]["stored_ahead_ms"] < 0:
                raise RuntimeError(f"limited expiry run is not valid ({part}): {run[part]}")
    label = f"dispatch limit: {n:,} due in the same ms to a topic limited to {rate:,}/s"
    return [
        Figure("limits.limited", f"{label}, time until all delivered (the bucket's ideal: "
               f"{runs[0]['ideal_ms']:,} ms)", "ms", "lower", [r["limited_ms"] for r in runs],
               details={"master_cpu_s": [r["master_cpu_s"] for r in runs]}),
        Figure("limits.other.p50", f"{label}: lateness of another topic's {n // 100:,} falling due meanwhile, p50",
               "ms", "lower", [r["other"]["p50_ms"] for r in runs]),
        Figure("limits.other.max", f"{label}: lateness of another topic's {n // 100:,} falling due meanwhile, max",
               "ms", "lower", [r["other"]["max_ms"] for r in runs]),
    ]


def suite_security(ctx: Context) -> list[Figure]:
    n = ctx.sizes.delivery
    secured = ctx.secured()
    plain, sasl = [], []
    for run in range(ctx.runs):  # alternating: the machine's load swings hit both alike
        plain.append(ctx.step(f"delivery, plain stack ({run + 1}/{ctx.runs})",
                              lambda: service.bench_delivery(ctx.stack, n, ctx.progress)))
        sasl.append(ctx.step(f"delivery, secured stack ({run + 1}/{ctx.runs})",
                             lambda: service.bench_delivery(secured, n, ctx.progress)))
    ratios = [round(s / p, 3) for s, p in zip(sasl, plain, strict=True)]
    label = f"delivery of {n:,} due messages"
    return [
        Figure("security.plain", f"{label}, plain stack (PLAINTEXT, no ACLs)", "msg/s", "higher", plain),
        Figure("security.sasl_ssl", f"{label}, secured stack (SASL_SSL SCRAM-SHA-512, ACLs, node as its own user)",
               "msg/s", "higher", sasl, details={"secured_over_plain_per_run": ratios}),
        Figure("security.ratio", "delivery on the secured stack / the plain one (per run, same run)", "x", "higher",
               ratios),
    ]


def suite_failover(ctx: Context) -> list[Figure]:
    figures = []
    for sig in (signal.SIGKILL, signal.SIGTERM):
        runs = ctx.repeat(f"failover after {sig.name}",
                          lambda sig=sig: service.bench_failover(ctx.stack, ctx.progress, sig))
        gaps = [r["resumed_after_ms"] for r in runs]
        if None in gaps:
            raise RuntimeError(f"after {sig.name} no other node delivered: {runs}")
        figures.append(Figure(f"failover.{sig.name.lower()}",
                              f"failover gap after {sig.name} of the master (3 nodes, ZooKeeper session "
                              f"{runs[0]['session_timeout_ms'] / 1000:g} s)", "ms", "lower", gaps,
                              details={"delivered": [r["delivered"] for r in runs], "expected": runs[0]["expected"]}))
    return figures


def suite_produce(ctx: Context) -> list[Figure]:
    # produce_bench times its own runs (many short ones, order alternating); its medians are the figures.
    command = [sys.executable, "-m", "delayq.bench.produce_bench", "--json", "--bootstrap",
               ctx.stack.bootstrap_servers, "--calls", str(ctx.sizes.produce_calls),
               "--runs", str(ctx.sizes.produce_runs), "--quiet-wait", str(ctx.sizes.produce_quiet_wait_s)]
    done = ctx.step("delayed produce() vs plain", lambda: subprocess.run(command, capture_output=True, text=True))
    if done.returncode != 0:
        raise RuntimeError(f"produce_bench failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    runs = result["runs"]
    per_call = f"{result['calls']:,} calls of a {result['payload']}-byte value, CPU time of the calling thread"
    cpu = result["cpu"]
    figures = [Figure(f"produce.{key}", f"{name} produce() per call ({per_call})", "µs", "lower",
                      stats={"median": cpu[case]["median_us"], "min": cpu[case]["min_us"],
                             "max": cpu[case]["max_us"], "runs": runs})
               for key, name, case in (("plain", "plain confluent-kafka", "plain"),
                                       ("delayed", "delayq.Producer delay=", "delayed"))]
    figures.append(Figure("produce.ratio", "delayed produce() / plain produce(), CPU (per-run ratios)", "x", "lower",
                          stats={"median": cpu["delayed"]["x_plain"], "min": cpu["delayed"]["x_plain_q1"],
                                 "max": cpu["delayed"]["x_plain_q3"], "runs": runs}, spread="IQR",
                          details={"wall_x_plain": result["wall"]["delayed"]["x_plain"],
                                   "background_cores": result["background_cores"]}))
    return figures + aio_produce_figures(ctx)


def aio_produce_figures(ctx: Context) -> list[Figure]:
    """The asyncio producer's per-call cost: delayq.aio's delayed produce against confluent-kafka's plain one."""
    command = [sys.executable, "-m", "delayq.bench.aio_produce_bench", "--json", "--bootstrap",
               ctx.stack.bootstrap_servers, "--calls", str(ctx.sizes.produce_calls),
               "--runs", str(max(3, ctx.sizes.produce_runs // 2)), "--quiet-wait", str(ctx.sizes.produce_quiet_wait_s)]
    done = ctx.step("delayed AIOProducer.produce() vs plain", lambda: subprocess.run(command, capture_output=True,
                                                                                    text=True))
    if done.returncode != 0:
        raise RuntimeError(f"aio_produce_bench failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    runs, cpu = result["runs"], result["cpu"]
    per_call = f"{result['calls']:,} awaited calls of a {result['payload']}-byte value, CPU time of the process"
    figures = [Figure(f"produce.aio.{key}", f"{name} per call ({per_call})", "µs", "lower",
                      stats={"median": cpu[key]["median_us"], "min": cpu[key]["min_us"], "max": cpu[key]["max_us"],
                             "runs": runs})
               for key, name in (("plain", "confluent-kafka AIOProducer.produce()"),
                                 ("delayed", "delayq.aio.AIOProducer.produce(delay=)"))]
    figures.append(Figure("produce.aio.ratio", "delayed / plain AIOProducer.produce(), CPU (per-run ratios)", "x",
                          "lower", stats={"median": cpu["delayed"]["x_plain"], "min": cpu["delayed"]["x_plain_q1"],
                                          "max": cpu["delayed"]["x_plain_q3"], "runs": runs}, spread="IQR",
                          details={"wall_x_plain": result["wall"]["delayed"]["x_plain"],
                                   "wall_us": {k: result["wall"][k]["median_us"] for k in ("plain", "delayed")},
                                   "background_cores": result["background_cores"]}))
    return figures


def suite_capacity(ctx: Context) -> list[Figure]:
    from .redis_peer import peer_capacity

    n = ctx.sizes.capacity
    ours, theirs = ctx.paired(f"capacity, {n:,} pending", lambda: service.bench_capacity(ctx.stack, n, ctx.progress),
                              lambda: peer_capacity(ctx.redis(), ctx.stack, n, ctx.progress),
                              runs=ctx.options.capacity_runs)
    peer_ram = [r["used_memory_bytes_per_message"] for r in theirs] if theirs is not None else None
    peer_rss = [r["rss_bytes"] / 2**20 for r in theirs] if theirs is not None else None
    return [
        Figure("capacity.ram_per_message", f"RAM per pending message, {n:,} pending (node and reader RSS / Redis "
               "used_memory)",
               "B", "lower", [r["rss_bytes_per_message"] for r in ours], peer=peer_ram),
        Figure("capacity.rss", f"process RSS with {n:,} pending (node and its buffer reader / redis-server)", "MiB",
               "lower", [r["rss_bytes"] / 2**20 for r in ours], peer=peer_rss,
               details={"peak_rss_mib": [r["peak_rss_bytes"] / 2**20 for r in ours],
                        "reader_rss_mib": [r["reader_rss_bytes"] / 2**20 for r in ours]}),
        Figure("capacity.disk_per_message", f"disk per pending message, {n:,} pending (the node's store)", "B",
               "lower", [r["disk_bytes_per_message"] for r in ours]),
    ]


def suite_capacity_large(ctx: Context) -> list[Figure]:
    """Issue 15's one-off: RSS and disk of one node holding 100M pending. No peer: Redis would need ~36 GB of RAM."""
    n = ctx.sizes.capacity_large
    ours = ctx.repeat(f"capacity, {n:,} pending", lambda: service.bench_capacity(ctx.stack, n, ctx.progress), runs=1)
    payload = service.PAYLOAD_SIZE
    return [
        Figure("capacity_large.rss", f"process RSS with {n:,} pending (the node and its buffer reader)", "MiB",
               "lower", [r["rss_bytes"] / 2**20 for r in ours],
               details={"peak_rss_mib": [r["peak_rss_bytes"] / 2**20 for r in ours],
                        "reader_rss_mib": [r["reader_rss_bytes"] / 2**20 for r in ours]}),
        Figure("capacity_large.disk_per_message", f"disk per pending message, {n:,} pending (the node's store; "
               f"{payload}-byte random payloads)", "B", "lower", [r["disk_bytes_per_message"] for r in ours],
               details={"payload_bytes": payload,
                        "disk_per_payload_byte": [r["disk_bytes_per_message"] / payload for r in ours]}),
    ]


def suite_rebuild(ctx: Context) -> list[Figure]:
    n = ctx.sizes.rebuild
    values = ctx.step(f"rebuild of a wiped node with {n:,} pending, from the buffer and from a copy ({ctx.runs} "
                      "runs each)", lambda: service.bench_rebuild(ctx.stack, n, ctx.runs, ctx.progress))
    return [Figure("rebuild", f"rebuild of a wiped node with {n:,} pending, start to ready", "s", "lower",
                   values["buffer"]),
            Figure("rebuild_copy", f"a wiped node with {n:,} pending beside a node holding them (it copies that "
                   "node's store), start to ready", "s", "lower", values["copy"])]


def suite_reconcile(ctx: Context) -> list[Figure]:
    """``delayq reconcile`` on local[2] and, with DELAYQ_SPARK_MASTER set (``delayq dev env``), on that standalone
    master too, runs alternating; the size is Sizes.reconcile unless BENCH_RECONCILE_MESSAGES says (10M)."""
    from . import reconcile_bench

    n = reconcile_bench.messages_from(os.environ, ctx.sizes.reconcile)
    masters = reconcile_bench.masters_to_time(os.environ.get(reconcile_bench.SPARK_MASTER_ENV))
    bootstrap = ctx.stack.bootstrap_servers

    def write() -> None:
        task = ctx.progress.add_task(f"writing {n:,} messages' puts, deliveries and dones", total=None)
        reconcile_bench.ensure_data(bootstrap, n, lambda done, total: ctx.progress.update(task, completed=done,
                                                                                            total=total))

    ctx.step(f"reconciliation data set of {n:,} messages", write)
    runs: dict[str, list[dict]] = {master: [] for master in masters}
    with tempfile.TemporaryDirectory(prefix="delayq-bench-reconcile-") as folder:
        outs = (Path(folder) / f"run{i}" for i in itertools.count())
        for run in range(ctx.runs):  # alternating: the machine's load swings hit both masters alike
            for master in masters:
                runs[master].append(ctx.step(
                    f"reconciliation on {master} ({run + 1}/{ctx.runs})",
                    lambda master=master: reconcile_bench.measured_run(bootstrap, n, master, next(outs))))
    return [reconcile_figure(n, master, results) for master, results in runs.items()]


def reconcile_figure(messages: int, master: str, runs: list[dict]) -> Figure:
    """The figure of one master's reconciliation runs (reconcile_bench.measured_run's), keyed by
    reconcile_bench.figure_key; results.json keeps each run's step timings, the load around it and its CPU."""
    from . import reconcile_bench

    buffer_records, deliveries = reconcile_bench.expected_counts(messages)
    where = "local[2]" if master.startswith("local") else "a Spark standalone master (DELAYQ_SPARK_MASTER)"
    return Figure(reconcile_bench.figure_key(master),
                  f"reconciliation of {messages:,} messages ({buffer_records:,} buffer records, {deliveries:,} "
                  f"deliveries), `delayq reconcile` on {where}", "s", "lower", [r["elapsed_s"] for r in runs],
                  details={"messages": messages, "master": master, "target_s": reconcile_bench.target_s(messages),
                           # per run: timings_s, load_before/after, cpu_s, machine_busy_cores
                           **{key: [r[key] for r in runs] for key in runs[0] if key != "elapsed_s"}})


def suite_follow(ctx: Context) -> list[Figure]:
    """``delayq reconcile --follow`` under live healthy traffic (issue 33: 20k msg/s), each trigger in turn per run:
    the rate the generator reached, the lag p50/p95/max and its slope (keeps up or falls behind), CPU per record;
    any finding is an error. BENCH_FOLLOW_RATE, BENCH_FOLLOW_SECONDS, BENCH_FOLLOW_TRIGGERS pick the run."""
    from . import follow_bench

    rate, seconds, warmup, triggers = follow_bench.settings_from(os.environ, ctx.options.quick)
    runs: dict[float, list[dict]] = {trigger: [] for trigger in triggers}
    for run in range(ctx.runs):  # alternating: the machine's load swings hit both triggers alike
        for trigger in triggers:
            result = ctx.step(f"follow at {rate:,.0f} msg/s, trigger {trigger:g} s ({run + 1}/{ctx.runs})",
                              lambda trigger=trigger: follow_bench.measured_run(
                                  ctx.stack.bootstrap_servers, rate, seconds, trigger, warmup_s=warmup,
                                  say=ctx.progress.console.print))
            console.log(follow_bench.one_line(result))
            if result["findings"]:
                _say_invalid(f"follow, trigger {trigger:g} s: findings on healthy traffic {result['findings']}: "
                             f"{result['finding_keys'][:10]}")
            runs[trigger].append(result)
    return [figure for trigger, results in runs.items() for figure in follow_bench.figures(trigger, results)]


def suite_console(ctx: Context) -> list[Figure]:
    """The web console's pages timed on one node holding Sizes.console pending and Sizes.console_dead_letters dead
    letters (BENCH_CONSOLE_PENDING, BENCH_CONSOLE_DEAD_LETTERS say otherwise; BENCH_CONSOLE_NODE=1 adds the node's
    /console): once, each page's 30 timed requests its sample (console_bench)."""
    from . import console_bench

    pending, dead_letters = console_bench.sizes_from(os.environ, ctx.sizes.console, ctx.sizes.console_dead_letters)
    node_console = console_bench.node_console_from(os.environ)
    result = ctx.step(f"console pages, {pending:,} pending and {dead_letters:,} dead letters",
                      lambda: console_bench.measured_run(ctx.stack, pending, dead_letters, ctx.progress,
                                                         node_console=node_console, say=ctx.progress.console.print))
    for page in result["pages"]:
        if not page["passed"]:
            _say_invalid(f"console: {page['label']} fails the {console_bench.TARGET_MS:.0f} ms target: p95 "
                         f"{page['p95_ms']:.0f} ms, answers {page['statuses']}, its table "
                         f"{'found' if page['marked'] else 'missing'}")
    # The machine beside the figures: a run of this suite alone writes its machine over the whole file's.
    return console_bench.figures({**result, "machine": machine()})


def _say_invalid(text: str) -> None:
    console.log(f"[bold red]{escape(text)}[/]")  # the reasons hold brackets: shard lists, masterships


@dataclass
class ScaleDeliveries:
    """The delivery runs of the scale and members suites: each configuration's valid runs, the reasons of the
    invalid ones, and the lead each run plans from the configuration's earlier runs (scale_bench.LeadPlanner)."""

    ctx: Context
    count: int
    planner: scale.LeadPlanner = field(default_factory=scale.LeadPlanner)
    runs: dict[scale.ScaleConfig, list[dict]] = field(default_factory=dict)
    invalid: dict[scale.ScaleConfig, list[str]] = field(default_factory=dict)

    def measure(self, suite: str, config: scale.ScaleConfig, of: str) -> dict:
        """One valid delivery run of ``config`` (measured again while invalid, scale_bench.first_valid)."""
        planner, n = self.planner, self.count

        def once() -> dict:
            try:
                result = scale.bench_scale_delivery(self.ctx.stack, config, n, planner.lead_s(config, n),
                                                    self.ctx.progress)
            except scale.StoredLate as late:
                planner.saw_stored(config, n, late.took_s)
                raise
            planner.saw_stored(config, n, result["stored_s"])
            return result

        invalid = self.invalid.setdefault(config, [])
        result = self.ctx.step(f"{suite}, {config.label}: delivery {of}",
                               lambda: scale.first_valid(once, invalid, say=_say_invalid))
        self.runs.setdefault(config, []).append(result)
        return result

    def details(self, config: scale.ScaleConfig) -> dict:
        """What results.json keeps beside a configuration's delivery figure: its invalid runs' reasons, and per run
        the checks and side values."""
        runs = self.runs[config]
        return {"invalid_runs": self.invalid[config],
                **{k: [r[k] for r in runs] for k in ("span_ms", "stored_ahead_ms", "lead_s", "ready_s", "settled_s",
                                                     "cpu_cores", "shard_windows_ms")}}

    def peer(self, suite: str, of: str) -> dict:
        """One delivery run of the Redis peer, the same count (redis_peer.peer_delivery)."""
        from .redis_peer import peer_delivery

        self.ctx.redis()
        return self.ctx.step(f"{suite}: Redis peer delivery {of}",
                             lambda: peer_delivery(self.ctx.redis(), self.ctx.stack, self.count, self.ctx.progress))


def suite_scale(ctx: Context) -> list[Figure]:
    """Every configuration (nodes, R) in turn, then the peer, once per run: load swings hit them alike."""
    n, n_ingest = ctx.sizes.scale_delivery, ctx.sizes.scale_ingest
    configs = scale.configurations()
    deliveries = ScaleDeliveries(ctx, n)
    planner = deliveries.planner
    ingest: dict[scale.ScaleConfig, list[dict]] = {c: [] for c in configs}
    invalid_ingest: dict[scale.ScaleConfig, list[str]] = {c: [] for c in configs}
    peer: list[float] | None = [] if ctx.options.peer else None

    def measure_ingest(config: scale.ScaleConfig) -> dict:
        result = scale.bench_scale_ingest(ctx.stack, config, n_ingest, ctx.progress)
        planner.saw_ingest(config, n_ingest, result["fill_s"] + result["elapsed_s"])
        return result

    for run in range(ctx.runs):
        of = f"({run + 1}/{ctx.runs})"
        for config in configs:
            ingest[config].append(ctx.step(f"scale, {config.label}: ingest {of}", lambda config=config: (
                scale.first_valid(lambda: measure_ingest(config), invalid_ingest[config], say=_say_invalid))))
            deliveries.measure("scale", config, of)
        if peer is not None:
            peer.append(deliveries.peer("scale", of)["msg_s"])
    figures = []
    for config in configs:
        shape = {"nodes": config.nodes, "replicas": config.replicas, "copies": config.copies,
                 "shards": scale.SHARDS, "partitions": scale.PARTITIONS}
        runs_d, runs_i = deliveries.runs[config], ingest[config]
        figures.append(Figure(
            f"scale.delivery.{config.key}", f"scale: delivery with {config.label} (6 shards, {n:,} due at once)",
            "msg/s", "higher", [r["msg_s"] for r in runs_d], peer=peer,
            details={**shape, "measure": "delivery", "count": n, **deliveries.details(config)}))
        figures.append(Figure(
            f"scale.ingest.{config.key}", f"scale: ingest with {config.label} (6 shards, {n_ingest:,} pending, "
            f"stored {config.copies}x)", "msg/s", "higher", [r["msg_s"] for r in runs_i],
            details={**shape, "measure": "ingest", "count": n_ingest, "invalid_runs": invalid_ingest[config],
                     **{k: [r[k] for r in runs_i] for k in ("store_writes_s", "elapsed_s", "fill_s", "ready_s",
                                                             "settled_s", "cpu_cores")}}))
    return figures


def suite_members(ctx: Context) -> list[Figure]:
    """One node of 1 and of 2 member processes on 2 shards, then the peer, once per run: delivery msg/s and the
    CPU each delivered message cost every process of the node (the peer's: its poller and redis-server)."""
    n = ctx.sizes.scale_delivery
    one, two = configs = scale.member_configurations()
    deliveries = ScaleDeliveries(ctx, n)
    peer: list[dict] = []
    for run in range(ctx.runs):
        of = f"({run + 1}/{ctx.runs})"
        for config in configs:
            deliveries.measure("members", config, of)
        if ctx.options.peer:
            peer.append(deliveries.peer("members", of))
    peer_msg_s = [r["msg_s"] for r in peer] or None
    peer_us = [per_message_us(r["cpu_s"], n) for r in peer] or None
    figures = []
    for config in configs:
        runs = deliveries.runs[config]
        p = config.processes
        shape = {"processes": p, "nodes": config.nodes, "replicas": config.replicas, "shards": config.shards,
                 "partitions": config.partitions, "count": n}
        what = f"1 node as {p} process{'es' if p > 1 else ''}"
        parts = "supervisor, members, their readers" if p > 1 else "node, its reader"
        figures.append(Figure(
            f"members.delivery.p{p}", f"members: delivery by {what} ({config.shards} shards, R={config.replicas}, "
            f"{n:,} due at once)", "msg/s", "higher", [r["msg_s"] for r in runs], peer=peer_msg_s,
            details={**shape, **deliveries.details(config)}))
        figures.append(Figure(
            f"members.cpu_us.p{p}", f"members: CPU per delivered message, {what} (all its processes: {parts}; "
            "broker excluded)", "µs", "lower", [per_message_us(r["cpu_s"], n) for r in runs], peer=peer_us,
            details={**shape, "by_role_us": [per_message_split(r["cpu_s"], n) for r in runs]}))
    ratios = [round(b["msg_s"] / a["msg_s"], 3)
              for a, b in zip(deliveries.runs[one], deliveries.runs[two], strict=True)]
    figures.append(Figure("members.delivery.ratio", "members: delivery by 1 node as 2 processes / as 1 process "
                          "(per run, same run)", "x", "higher", ratios))
    if peer_us is not None:
        figures.append(Figure(
            "members.cpu_us.peer", "members: the Redis peer's CPU per moved message (its poller thread with its "
            "producer's threads, and redis-server; broker excluded)", "µs", "lower", peer_us,
            details={"count": n, "by_part_us": [per_message_split(r["cpu_s"], n) for r in peer]}))
    return figures


def suite_idle(ctx: Context) -> list[Figure]:
    """A settled cluster with nothing to do, once per run: the cores of its processes and the broker's extra."""
    runs = ctx.repeat("idle", lambda: scale.bench_idle(ctx.stack, ctx.progress))
    shape = {"nodes": scale.IDLE_CONFIG.nodes, "replicas": scale.IDLE_CONFIG.replicas, "shards": scale.SHARDS,
             "window_s": scale.IDLE_WINDOW_S}
    return [
        Figure("idle.delayq_cores", f"idle: cores used by {scale.IDLE_CONFIG.label}, 6 shards, nothing due (every "
               "node process and reader)", "cores", "lower", [r["delayq_cores"] for r in runs],
               details={**shape, "by_role_cores": [r["by_role_cores"] for r in runs],
                        "machine_cores": [r["machine_cores"] for r in runs]}),
        Figure("idle.broker_cores", "idle: cores the same cluster costs the broker beyond its own idle", "cores",
               "lower", [r["broker_added_cores"] for r in runs],
               details={**shape, "broker_alone_cores": [r["broker_alone_cores"] for r in runs]}),
    ]


def per_message_us(cpu_s: dict[str, float], count: int) -> float:
    """Microseconds of CPU per message: the seconds of every part, summed, over ``count``."""
    return round(sum(cpu_s.values()) * 1e6 / count, 2)


def per_message_split(cpu_s: dict[str, float], count: int) -> dict[str, float]:
    """Microseconds of CPU per message of each part (a role of the node's processes, a part of the peer)."""
    return {part: round(seconds * 1e6 / count, 2) for part, seconds in cpu_s.items()}


_SUITE_RUNS: dict[str, Callable[[Context], list[Figure]]] = {
    "ingest": suite_ingest, "delivery": suite_delivery, "lateness": suite_lateness, "expiry": suite_expiry,
    "limits": suite_limits, "security": suite_security, "failover": suite_failover, "scale": suite_scale,
    "members": suite_members,
    "idle": suite_idle,
    "produce": suite_produce, "capacity": suite_capacity, "rebuild": suite_rebuild, "reconcile": suite_reconcile,
    "capacity-100m": suite_capacity_large,
    "follow": suite_follow,
    "console": suite_console,
}
assert list(_SUITE_RUNS) == list(SUITE_TEXT), "bench/suites.py and the suites here disagree"
SUITES: dict[str, tuple[Callable[[Context], list[Figure]], str]] = {
    name: (_SUITE_RUNS[name], text) for name, text in SUITE_TEXT.items()}


# -- machine, versions, files --------------------------------------------------------------------------------


def machine() -> dict:
    """Cores, memory, CPU model, OS and the load when the run started (the machine may be shared)."""
    cpu = next((line.split(":", 1)[1].strip() for line in _read("/proc/cpuinfo").splitlines()
                if line.startswith("model name")), platform.processor() or "unknown")
    mem_kb = next((int(line.split()[1]) for line in _read("/proc/meminfo").splitlines()
                   if line.startswith("MemTotal:")), 0)
    os_name = next((line.split("=", 1)[1].strip('"') for line in _read("/etc/os-release").splitlines()
                    if line.startswith("PRETTY_NAME=")), platform.system())
    return {"cores": os.cpu_count(), "memory_gib": round(mem_kb / 2**20, 1), "cpu": cpu, "os": os_name,
            "kernel": platform.release(), "load_average_at_start": round(os.getloadavg()[0], 2)}


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def versions() -> dict[str, str]:
    import confluent_kafka

    return {"delayq": metadata.version("delayq"), "Kafka": KAFKA_VERSION, "ZooKeeper": ZOOKEEPER_VERSION,
            "confluent-kafka": metadata.version("confluent-kafka"), "librdkafka": confluent_kafka.libversion()[0],
            "rocksdict": metadata.version("rocksdict"), "Python": platform.python_version()}


def load_results(path: Path) -> dict:
    """The results file as it is, or an empty one when it is missing or unreadable."""
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) and isinstance(data.get("figures"), dict) else {"figures": {}}
    except (OSError, ValueError):
        return {"figures": {}}


def merge_results(old: dict, figures: list[Figure], env: dict, options: BenchOptions, date: str) -> dict:
    """The new results: this run's figures replace theirs, figures this run did not measure stay."""
    merged = {key: value for key, value in old.get("figures", {}).items()}
    for suite, suite_figures in _by_suite(figures).items():
        for key in [k for k, v in merged.items() if v.get("suite") == suite]:
            del merged[key]
        for figure in suite_figures:
            # Each figure says on which CPU it was measured: a run of some suites on another host keeps the rest.
            merged[figure.key] = {**figure.to_json(date=date, quick=options.quick), "cpu": env["machine"]["cpu"]}
    order = {name: i for i, name in enumerate(SUITES)}
    merged = dict(sorted(merged.items(), key=lambda item: order.get(item[1].get("suite"), len(order))))
    # The versions of the figures kept stay named (a run without the peer leaves Redis's figures in the table).
    return {"date": date, **env, "versions": {**old.get("versions", {}), **env["versions"]}, "figures": merged}


def _by_suite(figures: list[Figure]) -> dict[str, list[Figure]]:
    grouped: dict[str, list[Figure]] = {}
    for figure in figures:
        grouped.setdefault(figure.suite, []).append(figure)
    return grouped


def print_summary(results: dict) -> None:
    table = Table(title="delayq bench")
    for column in ("figure", "delayq", "spread", "Redis peer", "delayq / Redis"):
        table.add_column(column)
    for row in render_markdown(results, rows_only=True):
        table.add_row(row["label"], row["ours"], row["spread"], row["peer"], row["ratio"])
    console.print(table)


def run_bench(options: BenchOptions, stack: DevStack | None = None) -> int:
    """Run the chosen suites and write the results; 0 when every suite produced its figures, else 1."""
    stack = stack or DevStack()
    stack.up(say=console.print)
    date = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    env = {"machine": machine(), "versions": versions()}
    figures: list[Figure] = []
    failed: list[str] = []
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    with ExitStack() as exits, Progress(*columns, console=console) as progress:
        ctx = Context(stack, options, progress, exits, versions=env["versions"])
        names = options.suites()
        overall = progress.add_task("suites", total=len(names))
        for name in names:
            run, _ = SUITES[name]
            progress.update(overall, description=f"suite {name}")
            started = time.monotonic()
            try:
                for figure in run(ctx):
                    figure.suite = name
                    figures.append(figure)
                    console.log(figure.one_line())
            except (Exception, SystemExit):  # one broken suite must not throw away an hour of the others' figures
                failed.append(name)
                console.print(f"[bold red]suite {name} failed:[/]\n{traceback.format_exc()}")
            console.log(f"suite {name}: {time.monotonic() - started:.0f} s")
            progress.advance(overall)
    results = merge_results(load_results(options.results_path), figures, env, options, date)
    options.results_path.parent.mkdir(parents=True, exist_ok=True)
    options.results_path.write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n")
    write_markdown(options.markdown_path, results)
    print_summary(results)
    console.print(f"results: {options.results_path}\ntable:   {options.markdown_path}")
    if failed:
        console.print(f"[bold red]failed suites: {', '.join(failed)}[/]")
    return 1 if failed else 0
