"""``delayq soak``: delayed messages through a cluster under faults, every one checked against the promise.

One run, on an embedded stack of its own (so it runs beside ``delayq dev``)::

    stack up (own ports) -> topics -> N nodes -> traffic + consumer + faults
      -> drain -> nodes stopped -> judge -> Spark reconciliation -> verdict beside the soak's

The cluster is ``--nodes`` nodes (3) holding ``--shards`` shards (3), each shard on
``--replicas`` of them (2; 0: every node holds every shard), on ``--brokers`` Kafka brokers
(1: one broker that is its own controller, the faults hitting "the" broker; 2 or more: a
replicated cluster with three KRaft controllers, the buffer and the target topics at
replication factor min(N, 3) and min.insync.replicas one less, and the replicated
cluster's broker faults instead of the one broker's). The traffic
(:mod:`.soak_workload`) is the public ``delayq.Producer``, configured as a user
configures it (the bootstrap servers and the cluster, nothing else: whatever order and
no-duplicate guarantee the buffer gets must come from delayq itself), at ``--rate``,
delays 0.5 s to ``min(60 s, duration / 3)``, 10 % cancelled and 5 % rescheduled, some
of those within a second of the due time, and 2 % repeating messages (2 to 5 occurrences,
a third of them cancelled). The faults (:mod:`.soak_faults`) come
from the seed, every kind at least once. The judge (:mod:`.soak_check`) applies the
product's rules to every message, and to the buffer, read once the nodes have stopped.
The seed is printed first: the same seed replays the same traffic and fault plan (the
timings of a real cluster still vary).

With ``--upgrade-from <release>`` the cluster starts as that release (its ``delayq init``
and its nodes, run from an environment built from its recorded commit) and the fault
``upgrade_roll`` rolls it to this code and finalizes it, early in the run (:mod:`.soak_faults`).
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic
from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from delayq import Producer
from delayq.delay_service import ensure_shards
from delayq.delay_service.topics import committed_end_offsets
from delayq.dev import DevStack
from delayq.errors import DelayqError
from delayq.release_env import ensure_release_env
from delayq.releases import find_release
from delayq.settings import Settings
from delayq.signals import sigterm_interrupts
from delayq.testing import InitError, LocalCluster, NodeError, free_stack_ports, init_cluster, settings_env

from .soak_brokers import LeaderMover
from .soak_check import (
    ANOMALY_KINDS,
    BufferScan,
    Comparison,
    Findings,
    Stall,
    compare_with_reconcile,
    failures,
    judge,
    missing_by_buffer_partition,
    owed_versions,
)
from .soak_faults import Chaos, UpgradeRoll, fault_kinds, kafka_dropped_markers, log_excerpt, log_warnings, plan_faults
from .soak_workload import Recorder, Watcher, Workload, WorkloadOptions, now_ms, read_buffer

# Anomalies shown per kind in the summary and in --json (soak-report.json has them all).
SHOWN_PER_KIND = 20
RECONCILE_TIMEOUT_S = 900


class SoakError(DelayqError):
    """The soak itself could not run (its stack, its nodes, its own threads); the message says which."""


def default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(base) / "delayq" / "soak"


# Partitions of each target topic the soak creates.
TARGET_PARTITIONS = 3


@dataclass
class SoakOptions:
    """One soak run. ``duration_s`` is the traffic and fault phase; draining and the reconciliation follow."""

    duration_s: float = 1800.0
    rate: float = 500.0
    nodes: int = 3
    seed: int | None = None
    reconcile: bool = True
    state_dir: Path = field(default_factory=default_state_dir)
    zk_session_timeout_ms: int = 5000
    buffer_partitions: int = 6
    # Three shards, each on two of the three nodes: every node masters one shard and is the standby of
    # another, and holds two thirds of the buffer.
    shards: int = 3
    replicas: int = 2
    target_topics: int = 3
    keep_runs: int = 3
    # Kafka brokers: 1 (the stack's one combined broker) or 2 and more (a replicated cluster, its own fault kinds).
    brokers: int = 1
    # A release (delayq/releases.toml) the cluster starts as; the fault upgrade_roll rolls it to this code.
    upgrade_from: str | None = None
    # Member processes per node (DELAYQ_PROCESSES): 1 is a node of one process.
    processes: int = 1

    def __post_init__(self) -> None:
        from delayq.dev.stack import MAX_BROKERS

        if not 1 <= self.brokers <= MAX_BROKERS:
            raise ValueError(f"--brokers {self.brokers}: give 1 (one broker) to {MAX_BROKERS}")
        if self.upgrade_from is not None:
            find_release(self.upgrade_from)  # an UnknownRelease (a ValueError) names the releases there are
        # Three minutes fit a roll of the nodes (about a minute) early on, and the rest of the run after it.
        shortest = 60 if self.brokers == 1 and self.upgrade_from is None else 180
        if self.duration_s < shortest:
            raise ValueError(f"--duration {self.duration_s:g}s is too short to fit every fault kind"
                             + (f" of {self.brokers} brokers" if self.brokers > 1 else "")
                             + (" with the upgrade roll" if self.upgrade_from is not None else "")
                             + f": give {shortest // 60}m or more")
        if self.rate <= 0:
            raise ValueError(f"--rate must be positive, got {self.rate:g}")
        if self.nodes < 2:
            raise ValueError(f"--nodes {self.nodes}: a soak needs a master and at least one standby (2 or more)")
        if self.shards < 1 or self.buffer_partitions % self.shards:
            raise ValueError(f"--shards {self.shards}: give a divisor of the soak's {self.buffer_partitions} buffer "
                             "partitions (1, 2, 3 or 6)")
        if isinstance(self.processes, bool) or not isinstance(self.processes, int) or self.processes < 1:
            raise ValueError(f"--processes {self.processes}: give 1 (a node of one process) or more member processes")
        if self.processes > 1 and self.upgrade_from is not None:
            raise ValueError(f"--processes {self.processes} with --upgrade-from {self.upgrade_from}: member processes "
                             "need feature level 2, which the roll finalizes only at its end; give one of them")
        if self.replicas == 1 or not 0 <= self.replicas <= self.nodes:
            raise ValueError(f"--replicas {self.replicas}: give 0 (every node holds every shard) or 2 to --nodes "
                             f"({self.nodes}); with 1 a shard has no standby to fail over to")

    @property
    def max_delay_s(self) -> float:
        """Longest delay: a third of the run (at most 60 s), so most messages fall due while it runs."""
        return min(60.0, self.duration_s / 3)

    @property
    def produce_s(self) -> float:
        """New messages stop one longest delay before the end: everything falls due within the run."""
        return self.duration_s - self.max_delay_s

    @property
    def warmup_s(self) -> float:
        return min(15.0, self.duration_s / 12)

    @property
    def drain_s(self) -> float:
        """How long past the run and the last due time the soak waits for what is still owed."""
        return min(60.0, max(30.0, self.duration_s / 4))

    @property
    def session_timeout_s(self) -> float:
        return self.zk_session_timeout_ms / 1000

    @property
    def heal_limit_s(self) -> float:
        """How long the cluster may take to be healthy after a fault: failover plus a margin that grows
        with the run (a broken cluster must not stretch a 2-minute soak much beyond its budget)."""
        return self.session_timeout_s + min(40.0, max(15.0, self.duration_s / 8))

    @property
    def stall_limit_s(self) -> float:
        """A longer stall fails the run: failover takes a session timeout, anything else is a stuck node."""
        return self.session_timeout_s + 10


def run_soak(options: SoakOptions, *, as_json: bool = False, out: Console | None = None,
             err: Console | None = None) -> int:
    """Run one soak; print the summary (or one JSON object); return 0 if every rule held, else 1.

    Raises:
        SoakError, StackError: the soak could not run (a port taken, no Java, a node that never started).
    """
    soak = Soak(options, out or Console(), err or Console(stderr=True), as_json)
    # SIGTERM tears down like Ctrl-C: the stack and nodes this run started must not outlive it.
    with sigterm_interrupts():
        return soak.run()


class Soak:
    def __init__(self, options: SoakOptions, out: Console, err: Console, as_json: bool):
        self.options = options
        self.out = out
        self.err = err
        self.as_json = as_json
        self.seed = options.seed if options.seed is not None else random.SystemRandom().randrange(1, 2**31)
        self.run_dir = options.state_dir / time.strftime(f"run-%Y%m%d-%H%M%S-seed{self.seed}")
        self.recorder = Recorder()
        self.stack: DevStack | None = None
        self.cluster: LocalCluster | None = None
        self.chaos: Chaos | None = None
        self.workload: Workload | None = None
        self.watcher: Watcher | None = None
        self.topics = [f"soak-{self.seed}-target-{i}" for i in range(options.target_topics)]
        self.kinds = fault_kinds(options.brokers, upgrade=options.upgrade_from is not None)
        self.roll: UpgradeRoll | None = None  # with --upgrade-from, once the release's environment is there
        self.leader_mover: LeaderMover | None = None
        self.started = time.monotonic()  # of the traffic, once it starts
        self.phase = "starting"
        self.owed_left = 0  # while draining: versions that must still arrive
        # Read once the nodes have stopped: partitions whose last stable offset is below their high watermark.
        self.open_transactions: dict[str, Any] = {}
        self.buffer_scan: BufferScan | None = None  # the buffer read once the nodes have stopped
        self._producer_log_handler: logging.Handler | None = None

    # -- the run -------------------------------------------------------------

    def run(self) -> int:
        o = self.options
        self.err.print(f"[bold]soak seed {self.seed}[/] (replay: delayq soak --seed {self.seed} "
                       f"--duration {o.duration_s:g}s --rate {o.rate:g} --nodes {o.nodes} --shards {o.shards} "
                       f"--replicas {o.replicas}" + (f" --brokers {o.brokers}" if o.brokers > 1 else "")
                       + (f" --upgrade-from {o.upgrade_from}" if o.upgrade_from else "")
                       + (f" --processes {o.processes}" if o.processes > 1 else "") + ")",
                       highlight=False)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        try:
            settings = self._start_cluster()
            started_ms = now_ms()
            self._start_traffic(settings)
            until_ms = self._watch()
            findings, comparison = self._finish(settings, started_ms, until_ms)
            return self._report(findings, comparison, started_ms, until_ms)
        finally:
            self._tear_down()

    def _release_python(self) -> str:
        """With --upgrade-from, the release's interpreter (its environment built first if it is not cached)."""
        o = self.options
        if o.upgrade_from is None:
            return sys.executable
        try:
            env = ensure_release_env(find_release(o.upgrade_from), console=self.err)
        except DelayqError as err:
            raise SoakError(f"--upgrade-from {o.upgrade_from}: {err}") from err
        self.roll = UpgradeRoll(o.upgrade_from, sys.executable)
        self.err.print(f"the cluster starts as delayq {o.upgrade_from} ({env.root}); upgrade_roll rolls it to "
                       f"this code ({sys.executable})", highlight=False)
        return str(env.python)

    def _start_cluster(self) -> Settings:
        o = self.options
        python = self._release_python()
        kafka_port, zk_port = free_ports(o.brokers)
        if o.brokers > 1:
            # Compiled before anything starts: a missing JDK fails the run at once, not at its first leader_move.
            self.leader_mover = LeaderMover(self.run_dir / "java")
            try:
                with self.err.status("compiling the leader mover (kafka-clients' Admin)"):
                    self.leader_mover.prepare()
            except DelayqError as err:
                raise SoakError(f"--brokers {o.brokers} moves leaders with a few lines of Java: {err}") from err
        self.stack = DevStack(self.run_dir / "stack", kafka_port=kafka_port, zk_port=zk_port, start_timeout_s=120,
                              brokers=o.brokers)
        kafka = (f":{kafka_port}" if o.brokers == 1 else
                 f"{o.brokers} brokers on :{kafka_port}-{kafka_port + o.brokers - 1}, three controllers after them")
        with self.err.status(f"starting the soak's own Kafka ({kafka}) and ZooKeeper (:{zk_port})"):
            self.stack.up(say=self.err.print)
        settings = Settings(bootstrap_servers=self.stack.bootstrap_servers, zk_connect=self.stack.zk_connect,
                            cluster=f"soak-{self.seed}", buffer_partitions=o.buffer_partitions, shards=o.shards,
                            replicas=o.replicas, zk_session_timeout_ms=o.zk_session_timeout_ms,
                            data_dir=self.run_dir / "nodes", processes=o.processes)
        admin = AdminClient({"bootstrap.servers": settings.bootstrap_servers, "log_level": 0})
        # Replicated as the buffer is (RF min(N, 3), min ISR one less): a broker fault must not take a target away.
        factor = min(o.brokers, 3)
        config = {"min.insync.replicas": str(max(1, factor - 1))} if o.brokers > 1 else {}
        for future in admin.create_topics([NewTopic(t, TARGET_PARTITIONS, factor, config=config)
                                           for t in self.topics]).values():
            future.result(30)
        self.cluster = LocalCluster(settings, self.run_dir / "nodes")  # creates the buffer and dead-letter topics
        version = f" of delayq {o.upgrade_from}" if o.upgrade_from else ""
        if o.upgrade_from is None:
            ensure_shards(settings)  # what `delayq init --shards N` records
        else:
            try:
                with self.err.status(f"delayq {o.upgrade_from} init (the cluster as that release makes it)"):
                    init_cluster(settings, self.cluster.root, python=python)
            except InitError as err:
                raise SoakError(f"the soak's cluster was not set up: {err}") from err
        try:
            with self.err.status(f"starting {o.nodes} nodes{version}"):
                for i in range(o.nodes):
                    self.cluster.start(f"node-{chr(ord('a') + i)}", python=python)
                master = self.cluster.master(60)
        except NodeError as err:
            raise SoakError(f"the soak's nodes did not start: {err}") from err
        shards = f"{o.shards} shard{'s' if o.shards > 1 else ''}"
        holders = f"each on {o.replicas} nodes" if o.replicas else "each on every node"
        self.err.print(f"{o.nodes} nodes{version} up, {shards} {holders}, {master.node_id} is a master; "
                       f"logs in {self.run_dir / 'nodes'}")
        return settings

    def _start_traffic(self, settings: Settings) -> None:
        o = self.options
        assert self.stack is not None and self.cluster is not None
        plan = plan_faults(self.seed, o.duration_s, o.session_timeout_s, o.brokers, upgrade=self.roll is not None)
        first_round = ", ".join(f.describe() for f in plan[:len(self.kinds)])
        self.err.print(f"faults (first round, in order): {first_round}", highlight=False)
        self.started = time.monotonic()
        self.watcher = Watcher(settings.bootstrap_servers, self.topics, self.recorder)
        self.watcher.start()
        # As the README shows a user: the brokers, the cluster and its ZooKeeper (which a put of level 2 asks for
        # the finalized level), nothing that would make the buffer's order the soak's doing rather than delayq's.
        # librdkafka's complaints while Kafka is down go to a file.
        producer = Producer({"bootstrap.servers": settings.bootstrap_servers, "delayq.cluster": settings.cluster,
                             "delayq.zk.connect": settings.zk_connect}, logger=self._producer_log())
        options = WorkloadOptions(rate=o.rate, produce_s=o.produce_s, max_delay_s=o.max_delay_s,
                                  latest_due_ms=now_ms() + round(o.duration_s * 1000))
        self.workload = Workload(producer, self.topics, options, self.seed, self.recorder,
                                 level_two=self.roll.finalized if self.roll is not None else None)
        self.workload.start()
        self.chaos = Chaos(plan, self.stack, self.cluster, session_timeout_s=o.session_timeout_s,
                           heal_limit_s=o.heal_limit_s, warmup_s=o.warmup_s, deadline=self.started + o.duration_s,
                           say=self._say, brokers=o.brokers, target_topics=self.topics,
                           leader_mover=self.leader_mover, roll=self.roll)
        self.chaos.start()
        self.phase = "running"

    def _producer_log(self) -> logging.Logger:
        """The workload producer's librdkafka log, to ``producer.log`` in the run's folder (not the terminal).

        Its ZooKeeper client's (kazoo's, once a put of level 2 asked for the finalized level) goes there too:
        it complains of every ZooKeeper fault.
        """
        logger = logging.getLogger(f"delayq.soak.producer.{self.seed}")
        self._producer_log_handler = logging.FileHandler(self.run_dir / "producer.log")
        # The nodes' timestamp format: log_excerpt reads both.
        self._producer_log_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
        for each in (logger, logging.getLogger("kazoo")):
            each.propagate = False
            each.setLevel(logging.INFO)
            each.addHandler(self._producer_log_handler)
        return logger

    def _watch(self) -> int:
        """Show progress until the run and its drain are over; return the judging cutoff (epoch ms)."""
        o = self.options
        assert self.chaos is not None and self.workload is not None and self.watcher is not None
        end = self.started + o.duration_s
        owed: set[tuple[str, int]] | None = None
        drain_deadline = 0.0
        with Live(self._progress(), console=self.err, refresh_per_second=2, transient=True) as live:
            while True:
                self._check_threads()
                now = time.monotonic()
                if owed is None and now >= end and not self.workload.is_alive() and self.chaos.finished.is_set():
                    # Acks are all in: which versions must arrive is known now.
                    self.phase = "draining"
                    owed = set(owed_versions(self.recorder.messages.values()))
                    last_due = (self.recorder.last_due_ms - now_ms()) / 1000
                    drain_deadline = now + max(0.0, last_due) + o.drain_s
                if owed is not None:
                    seen = self.recorder.seen_versions
                    owed = {version for version in owed if version not in seen}
                    self.owed_left = len(owed)
                    if not owed or now >= drain_deadline:
                        break
                live.update(self._progress())
                time.sleep(0.5)
        return now_ms()

    def _check_threads(self) -> None:
        for name, thread in (("traffic", self.workload), ("watcher", self.watcher), ("fault", self.chaos)):
            failure = getattr(thread, "failure", None)
            if failure is not None:
                raise SoakError(f"the soak's {name} thread failed: {failure!r}") from failure

    def _finish(self, settings: Settings, started_ms: int, until_ms: int) -> tuple[Findings, Comparison | None]:
        assert self.chaos is not None and self.cluster is not None and self.watcher is not None
        self.phase = "stopping nodes"
        self.chaos.stop.set()
        self.chaos.join(30)
        self.chaos.release()
        self.chaos.check_crashes()
        with self.err.status("stopping the nodes, reading the target topics to their end"):
            for node in self.cluster.nodes.values():
                if node.process is not None and node.process.poll() is None:
                    self.chaos.stop_node(node)
            self.watcher.read_to_end()
        self.open_transactions = self._open_transactions(settings)
        with self.err.status("reading the buffer for puts written twice"):
            self.buffer_scan = read_buffer(settings.bootstrap_servers, settings.buffer_topic,
                                           settings.buffer_partitions)
        history = self.recorder.history(until_ms, now_ms(), self.chaos.windows, self.buffer_scan)
        findings = judge(history)
        comparison = None
        if self.options.reconcile:
            with self.err.status("reconciling with Spark (delayq reconcile)"):
                comparison = self._reconcile(settings, findings, started_ms, until_ms)
        return findings, comparison

    def _reconcile(self, settings: Settings, findings: Findings, started_ms: int, until_ms: int) -> Comparison:
        from delayq.spark.options import iso

        out = self.run_dir / "reconcile"
        command = [sys.executable, "-m", "delayq", "reconcile", "--since", iso(started_ms - 60_000),
                   "--until", iso(until_ms), "--grace", "0ms", "--early-tolerance", "0ms", "--lookback", "10m",
                   "--out", str(out), "--topics", ",".join(self.topics), "--master", "local[2]",
                   "--list-limit", "10000000"]
        log = self.run_dir / "reconcile.log"
        env = {**os.environ, **settings_env(settings), "COLUMNS": "160"}
        try:
            with open(log, "wb") as sink:
                done = subprocess.run(command, env=env, stdout=sink, stderr=subprocess.STDOUT,
                                      timeout=RECONCILE_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            return compare_with_reconcile(findings, None, None, f"no answer within {RECONCILE_TIMEOUT_S}s; see {log}")
        report_path = out / "report.json"
        if done.returncode not in (0, 1) or not report_path.exists():
            tail = " / ".join(log.read_text(errors="replace").strip().splitlines()[-3:])
            return compare_with_reconcile(findings, None, done.returncode,
                                          f"exit code {done.returncode}: {tail} (log: {log})")
        report = json.loads(report_path.read_text())
        return compare_with_reconcile(findings, report, done.returncode)

    def _tear_down(self) -> None:
        for thread in (self.chaos, self.workload, self.watcher):
            if thread is not None:
                thread.stop.set()
        if self.chaos is not None:
            self.chaos.join(30)
            self.chaos.release()  # a broker or ZooKeeper stopped mid-pause would ignore the stack's SIGTERM
        if self.cluster is not None:
            self.cluster.close()  # SIGCONT then SIGKILL whatever still runs
        if self.stack is not None:
            self.stack.down()
        if self._producer_log_handler is not None:
            logging.getLogger(f"delayq.soak.producer.{self.seed}").removeHandler(self._producer_log_handler)
            kazoo = logging.getLogger("kazoo")
            kazoo.removeHandler(self._producer_log_handler)
            kazoo.propagate = True
            kazoo.setLevel(logging.NOTSET)
            self._producer_log_handler.close()
        _clean_runs(self.options.state_dir, self.options.keep_runs)

    def _open_transactions(self, settings: Settings) -> dict[str, Any]:
        """The partitions (buffer and targets) a transaction still holds open now that the nodes have stopped.

        There the last stable offset is below the high watermark: every read_committed reader
        (ingest, the watcher, the reconciliation) stops at it, so what lies behind it looks
        missing. Each: ``{"stable": LSO, "high": HW}``; an error if Kafka did not answer.
        """
        admin = AdminClient({"bootstrap.servers": settings.bootstrap_servers, "log_level": 0})
        found: dict[str, Any] = {}
        topics = [(settings.buffer_topic, settings.buffer_partitions), *((t, TARGET_PARTITIONS) for t in self.topics)]
        for topic, count in topics:
            partitions = list(range(count))
            try:
                stable = committed_end_offsets(admin, topic, partitions, 10)
                high = committed_end_offsets(admin, topic, partitions, 10, committed=False)
            except KafkaException as err:
                found[topic] = f"end offsets not read: {err.args[0].str()}"
                continue
            for p in partitions:
                if stable[p] != high[p]:
                    found[f"{topic}/{p}"] = {"stable": stable[p], "high": high[p]}
        return found

    def _stall_evidence(self, stall: Stall | None) -> dict[str, Any] | None:
        """A stall, with what each node logged from 5 s before it until it ended."""
        if stall is None:
            return None
        logs = {}
        for folder in sorted((self.run_dir / "nodes").glob("node-*")):
            excerpt = log_excerpt(folder / f"{folder.name}.log", stall.start_ms - 5000, stall.end_ms)
            if excerpt:
                logs[folder.name] = excerpt
        return {**stall.as_dict(), "node_logs": logs}

    def _anomaly_evidence(self, findings: Findings) -> dict[str, dict[str, list[str]]]:
        """For the first anomaly of each kind: what each node logged around its deliveries (or due time).

        From 30 s before its first delivery's timestamp to 2 s after its last one: the terms,
        covers and Kafka errors a duplicate or an ignored cancel comes from. For writes the
        buffer holds out of order, around the writes' acknowledgements, with the producer's
        own warnings (``producer``) beside the nodes'.
        """
        evidence: dict[str, dict[str, list[str]]] = {}
        for kind in ANOMALY_KINDS:
            first = findings.by_kind(kind)[:1]
            if not first:
                continue
            found = first[0].evidence
            writes = [w["acked_ms"] for w in found.get("writes", []) if w.get("acked_ms") is not None]
            # A missing version has no delivery: its due time then.
            stamps = (writes or [d["timestamp_ms"] for d in found.get("deliveries", [])]
                      or [v["due_ms"] for v in found.get("versions", [])])
            if not stamps:
                continue
            logs = {}
            if writes:
                excerpt = log_excerpt(self.run_dir / "producer.log", min(stamps) - 30_000, max(stamps) + 2000,
                                      max_lines=40)
                if excerpt:
                    logs["producer"] = excerpt
            for folder in sorted((self.run_dir / "nodes").glob("node-*")):
                excerpt = log_excerpt(folder / f"{folder.name}.log", min(stamps) - 30_000, max(stamps) + 2000,
                                      max_lines=40, loggers=("delayq.election", "delayq.delivery", "delayq.node"))
                if excerpt:
                    logs[folder.name] = excerpt
            evidence[kind] = logs
        return evidence

    # -- what the user sees --------------------------------------------------

    def _say(self, text: str) -> None:
        elapsed = time.monotonic() - self.started
        self.err.print(f"[dim]{elapsed:6.1f}s[/] {text}", highlight=False)

    def _progress(self) -> Text:
        o, r = self.options, self.recorder
        chaos = self.chaos
        elapsed = time.monotonic() - self.started
        faults = sum(chaos.done.values()) if chaos else 0
        current = "-"
        if chaos is not None and chaos.current is not None:
            kind, since = chaos.current
            current = f"{kind} ({time.monotonic() - since:.0f}s)"
        line = (f"{self.phase} {_clock(elapsed)}/{_clock(o.duration_s)} · sent {r.puts:,} · acked {r.acked:,} · "
                f"delivered {len(r.deliveries):,} · pending {max(0, r.pending):,} · dup {r.duplicates} · "
                f"early {r.early} · faults {faults} · now {current}")
        if self.phase == "draining":
            line += f" · owed {self.owed_left:,}"
        return Text(line)

    def _report(self, findings: Findings, comparison: Comparison | None, started_ms: int, until_ms: int) -> int:
        assert self.chaos is not None
        o, chaos = self.options, self.chaos
        crashes = [c.as_dict() for c in chaos.crashes]
        missing_kinds = [k for k in self.kinds if not chaos.done[k]]
        scan = self.buffer_scan
        reasons = failures(findings, crashes=len(crashes), stall_limit_s=o.stall_limit_s, comparison=comparison,
                           missing_fault_kinds=missing_kinds, buffer_error=scan.error if scan else "not read",
                           upgrade_problems=self.roll.problems() if self.roll is not None else ())
        counts = findings.counts
        anomalies = {kind: [a.as_dict() for a in findings.by_kind(kind)] for kind in ANOMALY_KINDS}
        document: dict[str, Any] = {
            "seed": self.seed,
            "duration_s": o.duration_s, "rate": o.rate, "nodes": o.nodes, "shards": o.shards, "replicas": o.replicas,
            "brokers": o.brokers, "upgrade_from": o.upgrade_from, "processes": o.processes,
            "max_delay_s": o.max_delay_s,
            "started_ms": started_ms, "judged_until_ms": until_ms,
            "sent": counts["messages"], "cancelled": counts["cancelled"], "rescheduled": counts["rescheduled"],
            "series": counts["series"], "expiring": counts["expiring"], "write_errors": self.recorder.write_errors,
            "versions": {"total": counts["versions"], "must": counts["must"], "may": counts["may"],
                         "must_not": counts["must_not"]},
            "delivered": counts["delivered"], "delivered_records": counts["delivered_records"],
            **{kind: counts[kind] for kind in ANOMALY_KINDS},
            # Puts the client library appended twice, which the nodes apply once: no anomaly.
            "twice_written": counts["twice_written"], "written_twice": findings.written_twice,
            "crashes": len(crashes),
            "max_stall_s": round(findings.max_stall_s, 3),
            "max_stall_beyond_outages_s": round(findings.max_stall_beyond_outages_s, 3),
            "stall_limit_s": o.stall_limit_s,
            "stall": self._stall_evidence(findings.stall),
            "stall_beyond_outages": self._stall_evidence(findings.stall_beyond_outages),
            "anomaly_node_logs": self._anomaly_evidence(findings),
            "missing_by_buffer_partition": missing_by_buffer_partition(findings, started_ms),
            "open_transactions_at_end": self.open_transactions,
            "kafka_dropped_markers": kafka_dropped_markers(self.run_dir / "stack"),
            "buffer_scan": scan.as_dict() if scan else None,
            "lateness_ms": {"in_faults": findings.lateness_in_faults.as_dict(),
                            "outside_faults": findings.lateness_outside_faults.as_dict()},
            "faults": {kind: chaos.done[kind] for kind in self.kinds},
            "by_fault_kind": {kind: findings.by_fault_kind[kind].as_dict() for kind in self.kinds
                              if kind in findings.by_fault_kind},
            "fault_windows": [{"kind": w.kind, "start_ms": w.start_ms, "end_ms": w.end_ms,
                               "seconds": round((w.end_ms - w.start_ms) / 1000, 1), "outage_ms": w.outage_ms,
                               "outages_ms": w.outages, "outage_s": round(w.outage_s, 1), "detail": w.detail}
                              for w in chaos.windows],
            "node_crashes": crashes,
            "faults_skipped": chaos.skipped,
            "upgrade": self.roll.as_dict() if self.roll is not None else None,
            "node_log_warnings": {folder.name: log_warnings(folder / f"{folder.name}.log")
                                  for folder in sorted((self.run_dir / "nodes").glob("node-*"))},
            "reconcile": comparison.as_dict() if comparison else None,
            "failures": reasons,
            "passed": not reasons,
            "run_dir": str(self.run_dir),
            "report": str(self.run_dir / "soak-report.json"),
        }
        (self.run_dir / "soak-report.json").write_text(json.dumps({**document, "anomalies": anomalies}, indent=2)
                                                        + "\n")
        shown = {kind: items[:SHOWN_PER_KIND] for kind, items in anomalies.items() if items}
        if self.as_json:
            # Plain print: a console would wrap long strings (log tails) at its width.
            print(json.dumps({**document, "anomalies": shown}, indent=2), flush=True)
        else:
            self._print_summary(document, shown, comparison)
        return 1 if reasons else 0

    def _print_summary(self, doc: dict[str, Any], shown: dict[str, list[dict[str, Any]]],
                       comparison: Comparison | None) -> None:
        table = Table(title=f"delayq soak, seed {doc['seed']}", show_header=True)
        table.add_column("figure")
        table.add_column("soak", justify="right")
        table.add_column("reconcile", justify="right")
        rec = comparison.totals if comparison and comparison.ran else {}

        def bad(value: Any) -> str:
            return f"[bold red]{value}[/]" if value else str(value)

        for label, value, other in (
            ("sent", f"{doc['sent']:,}", ""),
            ("cancelled", f"{doc['cancelled']:,}", _show(rec.get("cancelled"))),
            ("rescheduled", f"{doc['rescheduled']:,}", ""),
            ("repeating (series)", f"{doc.get('series', 0):,}", ""),
            *([("with expire_after (level 2, after finalize)", f"{doc['expiring']:,}", "")]
              if doc["upgrade"] else []),
            ("delivered (versions)", f"{doc['delivered']:,}", _show(rec.get("delivered"))),
            ("duplicated", bad(doc["duplicated"]), _show(rec.get("duplicated"))),
            ("missing", bad(doc["missing"]), _show(rec.get("missing"))),
            ("early", bad(doc["early"]), _show(rec.get("early"))),
            ("cancel ignored", bad(doc["cancel_ignored"]), _show(rec.get("cancel_ignored"))),
            ("stale version delivered", bad(doc["stale_version"]), "(in cancel ignored)" if rec else ""),
            ("lost reschedule", bad(doc["lost_reschedule"]), "(in missing)" if rec else ""),
            ("reordered in the buffer", bad(doc["reordered"]), _show(rec.get("reordered"))),
            ("written twice, applied once", f"{doc['twice_written']:,}", _show(rec.get("twice_written"))),
            ("unexpected", bad(doc["unexpected"]), _show(rec.get("unexpected"))),
        ):
            table.add_row(label, value, other)
        for where in ("in_faults", "outside_faults"):
            late = doc["lateness_ms"][where]
            table.add_row(f"lateness ms p50/p99/max {where.replace('_', ' ')}",
                          f"{_show(late['p50'])} / {_show(late['p99'])} / {_show(late['max'])}", "")
        for label, key in (("longest stall", "stall"),
                           ("longest stall beyond Kafka/ZK outages", "stall_beyond_outages")):
            stall = doc[key]
            seconds = stall["seconds" if key == "stall" else "beyond_outages_s"] if stall else 0.0
            text = f"{seconds:.1f}s" + (f" (during {', '.join(stall['during_faults'])})"
                                        if stall and stall["during_faults"] else "")
            too_long = key == "stall_beyond_outages" and seconds > doc["stall_limit_s"]
            table.add_row(label, bad(text) if too_long else text, "")
        table.add_row("faults", str(sum(doc["faults"].values())), "")
        scan = doc["buffer_scan"] or {}
        table.add_row("buffer read after the run",
                      bad(scan.get("error") or "not read") if scan.get("error") or not scan
                      else f"{scan['records']:,} records, {scan['producer_puts']:,} puts", "")
        table.add_row("unexplained node crashes", bad(doc["crashes"]), "")
        # Not a finding: the broker's own word that it left a transaction open on some partitions (docs/DESIGN.md).
        table.add_row("transaction markers the broker dropped", f"{len(doc['kafka_dropped_markers'])} (its log)", "")
        upgrade = doc["upgrade"]
        if upgrade:
            table.add_row(f"upgrade from {upgrade['from']}",
                          "finalized" if upgrade["finalized"] else bad("not finalized"), "")
            table.add_row("stores rebuilt in the roll (nodes not wiped)", bad(upgrade["stores_rebuilt_unwiped"]), "")
        if comparison is not None:
            verdict = (f"exit {comparison.exit_code}, " + ("agrees" if comparison.agrees else "[bold red]disagrees[/]")
                       if comparison.ran else f"[bold red]did not run[/]: {comparison.error}")
            table.add_row("reconciliation", "", verdict)
        self.out.print(table)
        stall = doc["stall_beyond_outages"]
        if stall and stall["beyond_outages_s"] > doc["stall_limit_s"] and stall["node_logs"]:
            self.out.print(f"stall of {stall['seconds']:.1f}s ({stall['beyond_outages_s']:.1f}s beyond outages), "
                           f"first owed {stall['first_owed_id']}; node logs then:", highlight=False)
            for node, lines in stall["node_logs"].items():
                self.out.print(Text(f"  {node}:\n    " + "\n    ".join(lines)))
        self.out.print("faults by kind: " + ", ".join(f"{k} {n}" for k, n in doc["faults"].items()), highlight=False)
        self._print_by_kind(doc)
        for window in doc["fault_windows"]:
            self.out.print(f"  {window['kind']:<15} {window['seconds']:6.1f}s  {window['detail']}", highlight=False)
        for kind, items in shown.items():
            self.out.print(f"[bold]{kind}[/] ({doc[kind]}; first {len(items)}):")
            for item in items:
                self.out.print(f"  {item['id']}: {item['rule']}; faults: {', '.join(item.get('faults', [])) or '-'}",
                               highlight=False)
        for crash in doc["node_crashes"]:
            self.out.print(f"[bold red]crash[/] {crash['node']} pid {crash['pid']} exit {crash['exit_code']} "
                           f"({crash['cause']}, during {crash['during_fault'] or 'no fault'}); log tail:")
            self.out.print(Text("    " + crash["log_tail"].replace("\n", "\n    ")))
        for node, groups in doc["node_log_warnings"].items():
            for group in groups[:3]:
                self.out.print(Text(f"{node} logged {group['count']}x: {group['first'][:240]}"))
        if comparison is not None and comparison.ran and not comparison.agrees:
            for side, ids in (("soak only", comparison.soak_only), ("reconcile only", comparison.reconcile_only)):
                sample = list(ids.items())[:SHOWN_PER_KIND]
                if sample:
                    self.out.print(f"flagged by {side} ({len(ids)}): "
                                   + "; ".join(f"{i} {'/'.join(k)}" for i, k in sample), highlight=False)
        verdict = "[bold green]PASS[/]" if doc["passed"] else "[bold red]FAIL[/]: " + "; ".join(doc["failures"])
        self.out.print(f"{verdict}\nfull report: {doc['report']}", highlight=False)


    def _print_by_kind(self, doc: dict[str, Any]) -> None:
        """The figures per fault kind: how many, how long, outages, lateness and stalls during them."""
        table = Table(title="by fault kind", show_header=True)
        for column in ("kind", "faults", "longest window", "outage", "lateness ms p50/p99/max during",
                       "longest stall", "beyond outages"):
            table.add_column(column, justify="left" if column == "kind" else "right")
        for kind, figures in doc["by_fault_kind"].items():
            late = figures["lateness_ms"]
            beyond = figures["max_stall_beyond_outages_s"]
            table.add_row(kind, str(figures["faults"]), f"{figures['longest_s']:.1f}s", f"{figures['outage_s']:.1f}s",
                          f"{_show(late['p50'])} / {_show(late['p99'])} / {_show(late['max'])}",
                          f"{figures['max_stall_s']:.1f}s",
                          f"[bold red]{beyond:.1f}s[/]" if beyond > doc["stall_limit_s"] else f"{beyond:.1f}s")
        self.out.print(table)


def _show(value: Any) -> str:
    return "-" if value is None else f"{value:,}" if isinstance(value, int) else str(value)


def _clock(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 60}:{seconds % 60:02d}"


def free_ports(brokers: int = 1) -> tuple[int, int]:
    """The soak's stack's ports (:func:`delayq.testing.free_stack_ports`: outside the ephemeral range, where a
    killed broker's port could meanwhile be some client's local port)."""
    try:
        return free_stack_ports(brokers)
    except RuntimeError as err:
        raise SoakError(str(err)) from err


def _clean_runs(state_dir: Path, keep: int) -> None:
    """Old runs (node logs, Kafka data) are only for looking at; keep the last few."""
    runs = sorted(state_dir.glob("run-*"))
    for old in runs[:-keep] if keep else runs:
        shutil.rmtree(old, ignore_errors=True)
