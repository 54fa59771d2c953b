"""The soak's faults: a plan drawn from the seed, and the thread that carries it out.

Each kind at least once per run, one at a time (never two overlapping). On one broker (the
default), eight kinds:

* ``master_kill``: SIGKILL to a shard's master; a standby takes over; the node restarts from its store.
  On nodes of member processes (``--processes``) the process killed is the member mastering the
  shard, mid-transaction as it delivers, and its node starts it again (a worker process lost).
* ``master_pause``: SIGSTOP to a shard's master for longer than the ZooKeeper session timeout, then SIGCONT
  (the master's member process, on nodes of member processes).
* ``standby_term``: SIGTERM to a standby (a clean stop), then a restart.
* ``standby_wipe``: a standby stopped, its data folder deleted, restarted (it copies the store of a node holding its
  shards, or rebuilds from the buffer when none answers).
* ``kafka_kill``: SIGKILL to the Kafka broker, a few seconds down, restarted.
* ``zookeeper_kill``: SIGKILL to ZooKeeper, a few seconds down, restarted.
* ``kafka_pause``: SIGSTOP to the Kafka broker (a long GC pause: 6-10 s, 3-8 s in runs of 5 minutes or
  less), then SIGCONT.
* ``zookeeper_pause``: SIGSTOP to ZooKeeper (8-12 s, 5-8 s in short runs: past the soak's 5 s
  session timeout), then SIGCONT.

On a replicated cluster (``--brokers N``, N >= 2: N brokers, three KRaft controllers), the
replicated cluster's kinds replace ``kafka_kill`` and ``kafka_pause`` (which would hit one
broker of N, as ``broker_kill`` and ``broker_pause`` do, choosing it better); the other six stay:

* ``broker_kill``: SIGKILL to one broker, restarted after 5-15 s (3-8 s in short runs). The
  victim, by the fault's pick: the leader of the most buffer partitions, the transaction
  coordinator of a shard master (the leader of the ``__transaction_state`` partition its
  transactional id hashes to), or any broker.
* ``broker_pause``: SIGSTOP to one broker (chosen the same way) for 10-14 s, past its broker
  session (``broker.session.timeout.ms``, 9 s: the controllers fence it and move its
  leaders), then SIGCONT.
* ``rolling_restart``: every broker in turn SIGTERMed (a controlled shutdown: its leaders
  move first), restarted, and every partition of the buffer, the target topics and
  ``__transaction_state`` back to its full ISR before the next one.
* ``leader_move``: every partition of the buffer and the target topics reassigned to its own
  replicas, the one after its leader first, then a preferred-leader election: every leader moves
  (:class:`.soak_brokers.LeaderMover`).
* ``two_brokers_down`` (three brokers or more): SIGKILL to two brokers at once, so the
  in-sync replicas fall below ``min.insync.replicas`` (2): producers and masters must wait,
  not fail or lose a record. After 5-15 s (3-8 s) one is restarted, and once the cluster
  serves again (or 30 s on), the other.

With ``--upgrade-from <release>`` (``delayq soak --upgrade-from 0.1.0``) the cluster starts as
that release (its ``delayq init`` and its nodes, from :func:`delayq.release_env.ensure_release_env`),
and one more kind runs once, as the first or the second fault of the first round (drawn from
the seed), so that most of the run is on the upgraded cluster:

* ``upgrade_roll``: each node in turn stopped cleanly (SIGTERM) and started again with this
  code on the same data folder (:meth:`delayq.testing.LocalCluster.replace`), ready and the
  cluster healthy (below) before the next; then ``delayq upgrade finalize``. From the
  finalize on, a tenth of the workload's plain puts carry ``expire_after=`` (feature level
  2), far longer than any lateness the soak allows: they must be delivered as any other
  message. The stores each new process rebuilt from the buffer (its log's "will be
  rebuilt from the buffer") are counted: any, on a node no ``standby_wipe`` wiped, fails
  the run, as does a roll that did not finish with the level finalized
  (:meth:`UpgradeRoll.problems`).

Every restart of a node (after a kill, a crash, a wipe) runs the node's version of the time:
the release before its replacement, this code after it.

During a broker fault a watch reads the metadata every half second: while some partition of
the buffer, the targets or ``__transaction_state`` cannot take an acknowledged write (no
leader, a leader that is down, fewer in-sync replicas than min.insync.replicas, or a
broker that is down still in sync: :func:`.soak_brokers.serving_problems`), the cluster is
out, and those times are the fault's outages, as a killed single broker's downtime is:
stalls are judged beyond them.

A standby is a node that holds a shard and masters none; when every node masters a shard
(three shards on three nodes), a node that holds a shard it does not master, the standby
of that shard. A node that holds no shard is nobody's standby. A paused process (a node,
a broker, ZooKeeper) is always continued: when the pause is over, when the soak stops or
fails in the middle of it (:meth:`Chaos.release`), never left stopped behind.

A fault's window runs from the moment it is done until the cluster is healthy again
(every node running and ready, exactly one master per shard, each shard held by its
replicas; on a replicated cluster also every broker registered and every watched
partition with its full ISR), or until the heal limit. The same thread watches for node
processes that exit without the soak having stopped them: each such crash is recorded
with its node's log tail, and the node restarted.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException

from delayq.clock import now_ms
from delayq.dev import DevStack
from delayq.testing import (
    LocalCluster,
    NodeError,
    NodeProcess,
    master_members,
    master_series,
    mastered_shards,
    settings_env,
)

from .soak_brokers import (
    TRANSACTION_STATE_TOPIC,
    ClusterState,
    LeaderMoveError,
    LeaderMover,
    choose_broker,
    min_insync_replicas,
    read_cluster,
    replication_problems,
    serving_problems,
)
from .soak_check import FaultWindow
from .suites import BROKER_FAULTS, FAULT_TEXT, ONE_BROKER_FAULTS, UPGRADE_FAULTS

# The one-broker stack's kinds (the default); fault_kinds(N) gives a replicated cluster's.
FAULT_KINDS = tuple(kind for kind in FAULT_TEXT if kind not in BROKER_FAULTS and kind not in UPGRADE_FAULTS)
DESCRIPTIONS = FAULT_TEXT
# How long a rolling restart waits for every partition's full ISR after restarting a broker.
FULL_ISR_WITHIN_S = 90.0


def fault_kinds(brokers: int = 1, *, upgrade: bool = False) -> tuple[str, ...]:
    """The kinds of a run on ``brokers`` brokers, each at least once (module docstring); ``upgrade``: a run
    with ``--upgrade-from``, which has ``upgrade_roll`` too (last here; the plan puts it early)."""
    if brokers <= 1:
        kinds = FAULT_KINDS
    else:
        kinds = tuple(kind for kind in FAULT_TEXT if kind not in ONE_BROKER_FAULTS and kind not in UPGRADE_FAULTS
                      and BROKER_FAULTS.get(kind, 0) <= brokers)
    return kinds + UPGRADE_FAULTS if upgrade else kinds
# A node that crashes this often is left down: restarting it again only repeats the crash.
MAX_RESTARTS_AFTER_CRASH = 5
LOG_TAIL_LINES = 40
READY_WITHIN_S = 3.0
# How long a node of member processes may take to start a killed member again (interpreter start, election).
MEMBER_BACK_S = 30.0
# How long the upgrade roll watches the nodes after its finalize: they read the finalized level every 5 s.
FINALIZE_FOLLOWED_S = 10.0



@dataclass(frozen=True)
class PlannedFault:
    """One fault of the plan: what, after how long a quiet gap, held how long, on which standby."""

    kind: str
    gap_s: float
    hold_s: float
    pick: float

    def estimate_s(self, session_timeout_s: float, brokers: int = 1) -> float:
        """About how long the fault takes until the cluster is healthy (for fitting the plan in the run).

        A broker restarts in 10-20 s on a busy machine and then catches up its replicas; a
        rolling restart does that for each of the ``brokers``.
        """
        return self.hold_s + {"master_kill": session_timeout_s + 6, "master_pause": 6, "standby_term": 5,
                              "standby_wipe": 8, "kafka_kill": 20, "zookeeper_kill": 10,
                              "kafka_pause": 12, "zookeeper_pause": session_timeout_s + 6,
                              "broker_kill": 25, "broker_pause": 20, "rolling_restart": 30 * brokers,
                              "leader_move": 20, "two_brokers_down": 45, "upgrade_roll": 60}[self.kind]

    def describe(self) -> str:
        held = f", held {self.hold_s:.1f}s" if self.hold_s else ""
        return f"{self.kind} after {self.gap_s:.1f}s{held}"


def plan_faults(seed: int, duration_s: float, session_timeout_s: float, brokers: int = 1, *,
                upgrade: bool = False) -> list[PlannedFault]:
    """The faults of a run: rounds of every kind (:func:`fault_kinds`) in a seeded order, more rounds than a run
    can use.

    Gaps scale with the run and the number of kinds: a few seconds in a 2-minute run, up to a
    minute in long ones. The first round always runs whole (every kind once); later ones as
    long as time is left. Holds: a master's pause outlasts the session; a single broker's
    pause is a long GC pause, 6-10 s (3-8 s in runs of 5 minutes or less); ZooKeeper's 8-12 s
    (5-8 s), past the session; a broker of a replicated cluster is paused 10-14 s (past its
    9 s broker session) and killed for 5-15 s (3-8 s), as are the two of ``two_brokers_down``.
    On one broker the plan is the same as before replicated clusters had kinds of their own.

    ``upgrade`` (``--upgrade-from``): ``upgrade_roll`` joins the first round, once, as its first
    or second fault, drawn from the seed apart from the rest: the other faults are those of
    the same run without it.
    """
    rng = random.Random(f"{seed}/faults")
    kinds_of_run = fault_kinds(brokers)
    short = duration_s <= 300
    # Eight kinds on one broker: a 24th of the run, as it always was.
    gap_max = min(60.0, max(3.0, duration_s / (3 * len(kinds_of_run))))
    down_max = 5.0 if short else 15.0
    broker_down = (3.0, 8.0) if short else (5.0, 15.0)
    holds = {"kafka_pause": (3.0, 8.0) if short else (6.0, 10.0),
             "zookeeper_pause": (5.0, 8.0) if short else (8.0, 12.0),
             "broker_pause": (10.0, 14.0), "broker_kill": broker_down, "two_brokers_down": broker_down}
    plan = []
    for _ in range(max(1, math.ceil(duration_s / 30))):
        kinds = list(kinds_of_run)
        rng.shuffle(kinds)
        for kind in kinds:
            gap = rng.uniform(gap_max / 2, gap_max)
            if kind == "master_pause":
                hold = session_timeout_s * rng.uniform(1.5, 2.5)
            elif kind in ("kafka_kill", "zookeeper_kill"):
                hold = rng.uniform(2.0, down_max)
            elif kind in holds:
                hold = rng.uniform(*holds[kind])
            else:
                hold = 0.0
            plan.append(PlannedFault(kind, round(gap, 1), round(hold, 1), rng.random()))
    if upgrade:
        draw = random.Random(f"{seed}/upgrade")
        slot = draw.randrange(2)
        plan.insert(slot, PlannedFault("upgrade_roll", round(draw.uniform(gap_max / 2, gap_max), 1), 0.0,
                                       draw.random()))
    return plan


class FaultSkipped(Exception):
    """The fault could not be done now (no master, no standby); the message says why."""


@dataclass
class NodeCrash:
    """A node process that exited although the soak had not stopped it (or exited badly when it had)."""

    node_id: str
    pid: int
    exit_code: int
    at_ms: int
    during_fault: str | None
    cause: str
    log_tail: str

    def as_dict(self) -> dict[str, Any]:
        return {"node": self.node_id, "pid": self.pid, "exit_code": self.exit_code, "at_ms": self.at_ms,
                "during_fault": self.during_fault, "cause": self.cause, "log_tail": self.log_tail}


@dataclass
class Replacement:
    """One node of an ``upgrade_roll``: the release's process stopped, this code's started on the same data.

    ``settled_s``: from the stop until the cluster was healthy again (None: it was not, within the heal
    limit). ``stores_rebuilt``: the lines of the node's log, from the new process's start to the roll's
    end, saying a store will be rebuilt from the buffer. From the node's ``/metrics`` then (None: it
    did not answer): ``rebuilds_metric`` (``delayq_store_rebuilds_total``), ``migrations``
    (``delayq_store_migrations_total``: stores migrated in place, as a finalize brings a new store
    format) and ``store_formats``, each held store's (``delayq_store_format``).
    """

    node_id: str
    old_pid: int
    new_pid: int | None = None
    ready_s: float | None = None
    settled_s: float | None = None
    problem: str | None = None
    stores_rebuilt: int | None = None
    rebuilds_metric: float | None = None
    migrations: float | None = None
    store_formats: tuple[int, ...] = ()
    wiped_before: bool = False  # a standby_wipe emptied its data folder earlier: a rebuild is by design
    process: NodeProcess | None = field(default=None, repr=False)

    @property
    def rebuilt(self) -> int:
        return max(self.stores_rebuilt or 0, round(self.rebuilds_metric or 0))

    def describe(self) -> str:
        if self.new_pid is None:
            return f"{self.node_id} (pid {self.old_pid}) NOT replaced: {self.problem}"
        settled = (f"the cluster healthy {self.settled_s:.1f}s" if self.settled_s is not None
                   else f"the cluster NOT healthy within the heal limit ({self.problem})")
        return (f"{self.node_id} pid {self.old_pid} -> {self.new_pid}: ready {self.ready_s:.1f}s and {settled} "
                "after its SIGTERM")

    def as_dict(self) -> dict[str, Any]:
        return {"node": self.node_id, "old_pid": self.old_pid, "new_pid": self.new_pid, "ready_s": self.ready_s,
                "settled_s": self.settled_s, "problem": self.problem, "stores_rebuilt": self.stores_rebuilt,
                "rebuilds_metric": self.rebuilds_metric, "migrations": self.migrations,
                "store_formats": list(self.store_formats), "wiped_before": self.wiped_before}


@dataclass
class UpgradeRoll:
    """The ``upgrade_roll`` of a run with ``--upgrade-from``: the nodes it replaced, one at a time, and the finalize.

    ``python``: the interpreter of this code, which replaces the release's. ``finalized`` is set once
    ``delayq upgrade finalize`` succeeded: the workload then puts with ``expire_after=``.
    """

    from_version: str
    python: str
    finalized: threading.Event = field(default_factory=threading.Event)
    replaced: list[Replacement] = field(default_factory=list)
    finalize: str | None = None  # what finalize printed (its last lines, joined)
    finalize_exit: int | None = None
    stopped: str | None = None  # why the roll stopped before its last node

    def problems(self) -> list[str]:
        """Why the roll fails the run, one line each: not finalized, or a store rebuilt on a node not wiped."""
        found = []
        if not self.finalized.is_set():
            why = self.stopped or (f"finalize exited {self.finalize_exit}: {self.finalize}" if self.finalize
                                   else "it never ran")
            found.append(f"the upgrade from {self.from_version} did not end finalized: {why}")
        rebuilt = [f"{r.node_id} {r.rebuilt}" for r in self.replaced if r.rebuilt and not r.wiped_before]
        if rebuilt:
            found.append(f"stores rebuilt from the buffer in the upgrade roll: {', '.join(rebuilt)}")
        return found

    def as_dict(self) -> dict[str, Any]:
        return {"from": self.from_version, "replaced": [r.as_dict() for r in self.replaced],
                "stores_rebuilt": sum(r.rebuilt for r in self.replaced),
                "stores_rebuilt_unwiped": sum(r.rebuilt for r in self.replaced if not r.wiped_before),
                "stores_migrated": sum(round(r.migrations or 0) for r in self.replaced),
                "finalize": self.finalize,
                "finalize_exit": self.finalize_exit, "finalized": self.finalized.is_set(), "stopped": self.stopped}


class OutageWatch(threading.Thread):
    """While a broker fault runs: the times the cluster could not serve (module docstring), as intervals.

    The fault says which brokers it has down (:meth:`set_down`) before it signals them; the
    watch reads the metadata every ``every_s`` from the others and judges it with that set,
    less those the controllers fenced meanwhile and that are registered again (restarted,
    they are back before the fault's restart call returns). A read that fails leaves the
    last verdict standing. A read begun before the set changed is not judged (it may show a
    broker up that is down now).

    Args:
        read: the cluster as seen from the brokers not down (:func:`.soak_brokers.read_cluster`).
        min_insync: each watched topic's min.insync.replicas.
    """

    def __init__(self, read: Callable[[frozenset[int]], ClusterState], min_insync: Mapping[str, int],
                 every_s: float = 0.5):
        super().__init__(name="soak-outage-watch", daemon=True)
        self.read = read
        self.min_insync = min_insync
        self.every_s = every_s
        self.intervals: list[tuple[int, int]] = []
        self.problems = ""  # why the cluster was last seen out
        self.unregistered_ms: dict[int, int] = {}  # a down broker -> when the metadata first left it out
        self._down: frozenset[int] = frozenset()
        self._generation = 0
        self._since: int | None = None
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._changed = threading.Event()

    def set_down(self, brokers: Iterable[int], *, out: bool = False) -> None:
        """The brokers the fault has down from now on; ``out``: the cluster is out from this moment (a kill:
        the dead broker is in sync somewhere until the controllers fence it) until a read says otherwise."""
        with self._lock:
            self._down = frozenset(brokers)
            self._generation += 1
            if out and self._since is None:
                self._since = now_ms()
        self._changed.set()

    @property
    def down(self) -> frozenset[int]:
        return self._down

    @property
    def out(self) -> bool:
        return self._since is not None

    def run(self) -> None:
        while not self._stopping.is_set():
            with self._lock:
                down, generation = self._down, self._generation
            try:
                state = self.read(down)
            except KafkaException:  # Kafka did not answer: the last verdict stands
                state = None
            if state is not None:
                at = now_ms()
                for broker in down - state.brokers:
                    self.unregistered_ms.setdefault(broker, at)
                # A down broker the controllers fenced and that is registered again is back: restarted (or
                # continued) and unfenced, it leads or is in sync only once it caught up.
                back = {broker for broker in down if broker in self.unregistered_ms and broker in state.brokers}
                problems = serving_problems(state, self.min_insync, down - back)
                with self._lock:
                    if generation == self._generation:
                        self._mark(at, problems)
            self._changed.wait(self.every_s)
            self._changed.clear()

    def _mark(self, at: int, problems: list[str]) -> None:
        if problems:
            self.problems = "; ".join(problems)
            if self._since is None:
                self._since = at
        elif self._since is not None:
            self.intervals.append((self._since, at))
            self._since = None

    def wait_serving(self, timeout_s: float, stop: threading.Event) -> bool:
        """Wait until a read finds the cluster serving; False after ``timeout_s`` (or once ``stop`` is set)."""
        deadline = time.monotonic() + timeout_s
        while self.out and time.monotonic() < deadline and not stop.is_set():
            stop.wait(0.2)
        return not self.out

    def finish(self) -> list[tuple[int, int]]:
        """Stop watching; the outages seen (one still open ends now)."""
        self._stopping.set()
        self._changed.set()
        if self.is_alive():
            self.join(10)
        with self._lock:
            if self._since is not None:
                self.intervals.append((self._since, now_ms()))
                self._since = None
        return self.intervals


class Chaos(threading.Thread):
    """Carries out the plan against the soak's own stack and nodes, and watches the nodes for crashes.

    Args:
        plan: from :func:`plan_faults`.
        stack: the soak's own Kafka and ZooKeeper.
        cluster: the soak's nodes; this thread alone starts and stops them once it runs.
        session_timeout_s: the nodes' ZooKeeper session timeout.
        heal_limit_s: how long after a fault is undone the cluster may take to be healthy; the window
            ends then either way (and half of it is waited, before a fault, for a healthy start).
        warmup_s: quiet time before the first fault.
        deadline: ``time.monotonic()`` after which no fault beyond the first round starts.
        say: progress lines (one per fault).
        brokers: the stack's brokers; from 2 on, the replicated cluster's kinds (:func:`fault_kinds`).
        target_topics: the soak's target topics (a replicated cluster's faults watch their partitions).
        leader_mover: what ``leader_move`` moves leaders with (prepared by the soak; a replicated cluster).
        roll: a run with ``--upgrade-from``: what ``upgrade_roll`` replaces the nodes with, and its record.
    """

    def __init__(self, plan: list[PlannedFault], stack: DevStack, cluster: LocalCluster, *,
                 session_timeout_s: float, heal_limit_s: float, warmup_s: float, deadline: float,
                 say: Callable[[str], None], brokers: int = 1, target_topics: Iterable[str] = (),
                 leader_mover: LeaderMover | None = None, roll: UpgradeRoll | None = None):
        super().__init__(name="soak-chaos", daemon=True)
        self.plan = plan
        self.stack = stack
        self.cluster = cluster
        self.brokers = brokers
        self.kinds = fault_kinds(brokers, upgrade=roll is not None)
        self.roll = roll
        self.wiped: set[str] = set()  # nodes whose data folder a standby_wipe deleted
        self.target_topics = list(target_topics)
        self.leader_mover = leader_mover
        self.session_timeout_s = session_timeout_s
        self.heal_limit_s = heal_limit_s
        self.warmup_s = warmup_s
        self.deadline = deadline
        self.say = say
        self.windows: list[FaultWindow] = []
        self.skipped: list[str] = []
        self.crashes: list[NodeCrash] = []
        self.done = Counter[str]()
        self.current: tuple[str, float] | None = None
        self.planned_first_round = len(self.kinds)
        self.finished = threading.Event()
        self.stop = threading.Event()
        self.failure: BaseException | None = None
        self._expected_exits: set[int] = set()
        self._handled_exits: set[int] = set()
        self._paused: set[int] = set()  # pids stopped by master_pause: nodes', or member processes'
        self._paused_services: set[str] = set()  # "kafka", "zookeeper" while stopped by their pause
        # Held while a process is stopped or continued, so that release() never races a pause.
        self._pause_lock = threading.Lock()
        self._released = False
        self._last_ready: dict[int, float] = {}  # pid -> when it last answered ready (monotonic)
        self._restarts = Counter[str]()
        self._outage: tuple[int, int] | None = None
        self._watch: OutageWatch | None = None  # during a replicated cluster's broker fault
        self._min_insync: dict[str, int] | None = None  # the watched topics', read on first need
        # Broker node id -> its service name (kafka-1 ..), on a replicated cluster.
        self._broker_names: dict[int, str] = (
            {stack.kafka_node(name).node_id: name for name in stack.broker_names} if brokers > 1 else {})

    # -- the plan ------------------------------------------------------------

    def run(self) -> None:
        try:
            self._idle(self.warmup_s)
            first_round = self.plan[:len(self.kinds)]
            for fault in first_round:
                self._idle(fault.gap_s)
                self.inject(fault)
            # A kind the first round had to skip (no master, no standby just then) gets one more try.
            for fault in first_round:
                if not self.done[fault.kind]:
                    self._idle(fault.gap_s)
                    self.inject(fault)
            for fault in self.plan[len(self.kinds):]:
                if (time.monotonic() + fault.gap_s + fault.estimate_s(self.session_timeout_s, self.brokers)
                        > self.deadline):
                    break
                self._idle(fault.gap_s)
                self.inject(fault)
        except Exception as err:  # the soak reports it: a dead chaos thread is no quiet run
            self.failure = err
        finally:
            self.finished.set()
        # Keep watching for crashes until the soak ends.
        while not self.stop.wait(0.25):
            self.check_crashes()

    def _idle(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while not self.stop.is_set() and time.monotonic() < end:
            self.check_crashes()
            self.stop.wait(min(0.25, max(0.0, end - time.monotonic())))

    def inject(self, fault: PlannedFault) -> None:
        """Carry out ``fault``, recording its window or why it was skipped (health first, up to heal_limit_s / 2)."""
        if self.stop.is_set():
            return
        healthy, problems = self._wait_healthy(self.heal_limit_s / 2)
        before = "" if healthy else f"cluster not healthy before the fault ({problems}); "
        start = now_ms()
        self.current = (fault.kind, time.monotonic())
        self._outage = None
        if fault.kind in BROKER_FAULTS:
            self._watch = OutageWatch(self._read_cluster, self._watched_min_insync())
            self._watch.start()
        outages: list[tuple[int, int]] = []
        try:
            try:
                detail = getattr(self, f"_{fault.kind}")(fault)
            except FaultSkipped as skipped:
                self.skipped.append(f"{fault.kind}: {skipped} ({problems})")
                self.say(f"[yellow]fault {fault.kind} skipped: {skipped}[/]")
                return
            healthy, problems = self._wait_healthy(self.heal_limit_s)
            if self._watch is not None:
                outages = self._watch.finish()
                detail += "; " + _outage_text(outages, start, self._watch.problems)
            took = (now_ms() - start) / 1000
            after = f"; healthy {took:.1f}s after it began" if healthy else (
                f"; NOT healthy {self.heal_limit_s:.0f}s after it was undone: {problems}")
            if outages:
                first, *later = outages
                window = FaultWindow(fault.kind, start, now_ms(), before + detail + after, first, tuple(later))
            else:
                window = FaultWindow(fault.kind, start, now_ms(), before + detail + after, self._outage)
            self.windows.append(window)
            self.done[fault.kind] += 1
            self.say(f"fault {fault.kind}: {detail}{after}")
        finally:
            self.current = None
            if self._watch is not None:
                self._watch.finish()
                self._watch = None

    # -- the kinds -----------------------------------------------------------

    def _master_kill(self, fault: PlannedFault) -> str:
        target = self._master_target()
        if target is None:
            raise FaultSkipped("no master to kill")
        master, name, pid, shards = target
        killed_at = time.monotonic()
        if name == master.node_id:
            self.stop_node(master, signal.SIGKILL)
        else:  # a member process: its node starts it again
            os.kill(pid, signal.SIGKILL)
        took_over = self._master(self.session_timeout_s + 20, other_than=name, of=shards)
        successor = (f"{_successor(*took_over, shards)} master of shard {_taken(took_over[1], shards)} "
                     f"{time.monotonic() - killed_at:.1f}s later" if took_over else "no other master")
        if name == master.node_id:
            back = f"restarted as pid {self._restart(master.node_id)}"
        else:
            back = self._member_back(master, name, pid)
        return f"SIGKILL to master {name} of shards {list(shards)} (pid {pid}); {successor}; {back}"

    def _master_pause(self, fault: PlannedFault) -> str:
        target = self._master_target()
        if target is None:
            raise FaultSkipped("no master to pause")
        _, name, pid, shards = target
        with self._pause_lock:
            if self._released:
                raise FaultSkipped("the soak is stopping")
            self._paused.add(pid)
            os.kill(pid, signal.SIGSTOP)
        paused_at = time.monotonic()
        try:
            took_over = self._master(fault.hold_s, other_than=name, of=shards)
            successor = (f"{_successor(*took_over, shards)} took over shard {_taken(took_over[1], shards)} "
                         f"{time.monotonic() - paused_at:.1f}s later" if took_over else "no other node took over")
            self._idle(fault.hold_s - (time.monotonic() - paused_at))
        finally:
            with self._pause_lock:
                if pid in self._paused:
                    _continue(pid)
                    self._paused.discard(pid)
        return (f"SIGSTOP to master {name} of shards {list(shards)} (pid {pid}) for "
                f"{time.monotonic() - paused_at:.1f}s, then SIGCONT; {successor}")

    def _master_target(self) -> tuple[NodeProcess, str, int, tuple[int, ...]] | None:
        """What a master fault hits: a master's node, its name, the pid and the shards of the process mastering.

        On a node of member processes (``--processes``) that is the member mastering the node's
        first mastered shard, not the node: each master runs in a member of its own, and the
        node (their supervisor) starts a member that died again. None if no master is found.
        """
        found_master = self._master()
        if found_master is None:
            return None
        master, found = found_master
        member = found.master_members.get(found.masters[0], "")
        if not member:
            return master, master.node_id, master.running.pid, found.masters
        pid = master.members().get(member)
        if pid is None:
            return None
        return master, member, pid, tuple(k for k in found.masters if found.master_members.get(k) == member)

    def _member_back(self, node: NodeProcess, member: str, killed_pid: int) -> str:
        """Wait for ``node`` to start its killed ``member`` again; a node that does not is a crash of the soak's."""
        deadline = time.monotonic() + MEMBER_BACK_S
        while time.monotonic() < deadline and not self.stop.is_set():
            pid = node.members().get(member)
            if pid is not None and pid != killed_pid:
                return f"started again by {node.node_id} as pid {pid}"
            self._idle(0.2)
        if self.stop.is_set():
            return "the soak stopped before it was started again"
        self._record_crash(node, f"did not start its member {member} again within {MEMBER_BACK_S:.0f}s")
        return f"not started again within {MEMBER_BACK_S:.0f}s"

    def _standby_term(self, fault: PlannedFault) -> str:
        return self._restart_standby(fault, wipe=False)

    def _standby_wipe(self, fault: PlannedFault) -> str:
        return self._restart_standby(fault, wipe=True)

    def _restart_standby(self, fault: PlannedFault, *, wipe: bool) -> str:
        """SIGTERM a standby and restart it; with ``wipe``, its data directory is deleted in between."""
        found = self._standby(fault.pick)
        if found is None:
            raise FaultSkipped("no standby (no node holds a shard it does not master)")
        standby, seen = found
        pid = standby.running.pid
        what = f"standby {standby.node_id} of shards {list(seen.standby_of)}" + (
            f" (master of {list(seen.masters)})" if seen.masters else "")
        code = self.stop_node(standby, signal.SIGTERM)
        if wipe:
            shutil.rmtree(standby.data_dir, ignore_errors=True)
            self.wiped.add(standby.node_id)
        restarted = self._restart(standby.node_id)
        if wipe:
            return (f"{what}, pid {pid}, stopped (exit {code}), {standby.data_dir} deleted; "
                    f"restarted as pid {restarted}")
        return f"SIGTERM to {what}, pid {pid} (exit {code}); restarted as pid {restarted}"

    def _kafka_kill(self, fault: PlannedFault) -> str:
        return self._service_kill("kafka", fault.hold_s)

    def _zookeeper_kill(self, fault: PlannedFault) -> str:
        return self._service_kill("zookeeper", fault.hold_s)

    def _kafka_pause(self, fault: PlannedFault) -> str:
        return self._service_pause("kafka", fault.hold_s)

    def _zookeeper_pause(self, fault: PlannedFault) -> str:
        return self._service_pause("zookeeper", fault.hold_s)

    def _service_pause(self, name: str, hold_s: float) -> str:
        """SIGSTOP ``name`` (its process group, as the kills signal it) for ``hold_s``, then SIGCONT.

        The SIGCONT comes whatever ends the hold: its time, the soak stopping (Ctrl-C, an
        error elsewhere) or an exception here; :meth:`release` sends it if this thread cannot.
        """
        with self._pause_lock:
            if self._released:
                raise FaultSkipped("the soak is stopping")
            stopped_at = now_ms()
            if not self.stack.kill(name, signal.SIGSTOP):
                raise FaultSkipped(f"{name} was not running")
            self._paused_services.add(name)
        try:
            self._idle(hold_s)
        finally:
            self._continue(name)
        self._outage = (stopped_at, now_ms())
        held = (self._outage[1] - stopped_at) / 1000
        cut = f" (cut short: the soak is stopping; {hold_s:.1f}s planned)" if held < hold_s - 0.5 else ""
        return f"SIGSTOP to {name} for {held:.1f}s{cut}, then SIGCONT"

    def _continue(self, name: str) -> None:
        with self._pause_lock:
            if name in self._paused_services:
                self.stack.kill(name, signal.SIGCONT)
                self._paused_services.discard(name)

    def release(self) -> None:
        """Continue (SIGCONT) every process a pause stopped, and pause nothing more.

        The soak's teardown calls it, after Ctrl-C or an error as after a whole run: a
        stopped broker or ZooKeeper would ignore the SIGTERM that stops the stack.
        """
        with self._pause_lock:
            self._released = True
            for name in sorted(self._paused_services):
                self.stack.kill(name, signal.SIGCONT)
            self._paused_services.clear()
            for pid in sorted(self._paused):
                _continue(pid)
            self._paused.clear()

    def _service_kill(self, name: str, down_s: float) -> str:
        killed_at = now_ms()
        if not self.stack.kill(name, signal.SIGKILL):
            raise FaultSkipped(f"{name} was not running")
        self._idle(down_s)
        began = time.monotonic()
        self.stack.start(name, say=lambda _text: None)
        self._outage = (killed_at, now_ms())
        return f"SIGKILL to {name}, down {down_s:.1f}s, answering {time.monotonic() - began:.1f}s after its restart"

    # -- the rolling upgrade (--upgrade-from) -----------------------------------

    def _upgrade_roll(self, fault: PlannedFault) -> str:
        """Each node of the release, in turn, replaced by this code (:meth:`_replace`); then the finalize."""
        roll = self.roll
        if roll is None:
            raise FaultSkipped("the run has no --upgrade-from")
        if roll.finalized.is_set():
            raise FaultSkipped("the cluster is upgraded and finalized already")
        for node_id in sorted(self.cluster.nodes):
            if self.cluster.nodes[node_id].python == roll.python:
                continue  # replaced by an earlier try of this fault
            if self.stop.is_set():
                roll.stopped = "the soak is stopping"
                break
            step = self._replace(node_id, roll.python)
            roll.replaced.append(step)
            self.say(f"upgrade_roll: {step.describe()}")
            if step.settled_s is None:
                roll.stopped = f"{step.node_id}: {step.problem}"
                break
        else:
            roll.stopped = None
            self._finalize(roll)
            if roll.finalized.is_set():
                # The nodes follow a finalize within seconds (a store format it brings, migrated in place): what
                # that does to the stores is the roll's too.
                self._idle(FINALIZE_FOLLOWED_S)
        for step in roll.replaced:
            if step.process is not None:
                step.stores_rebuilt = step.process.stores_rebuilt()
            step.rebuilds_metric, step.migrations, step.store_formats = store_figures(self.cluster.nodes[step.node_id])
            step.wiped_before = step.node_id in self.wiped
        steps = "; ".join(step.describe() for step in roll.replaced)
        end = (f"the roll stops there ({roll.stopped})" if roll.stopped
               else f"`delayq upgrade finalize` exit {roll.finalize_exit}: {roll.finalize}")
        formats = sorted({f for step in roll.replaced for f in step.store_formats})
        return (f"nodes of delayq {roll.from_version} replaced by this code one at a time: {steps}; {end}; stores "
                f"rebuilt {sum(step.rebuilt for step in roll.replaced)}, migrated in place "
                f"{sum(round(step.migrations or 0) for step in roll.replaced)}, store formats now "
                f"{', '.join(map(str, formats)) or '?'}")

    def _replace(self, node_id: str, python: str) -> Replacement:
        """Stop ``node_id`` cleanly, start ``python``'s delayq on its data, wait until the cluster is healthy."""
        node = self.cluster.nodes[node_id]
        step = Replacement(node_id, node.running.pid)
        began = time.monotonic()
        try:
            new = self.cluster.replace(node_id, python, stop=self.stop_node,
                                       ready_within_s=max(60.0, self.heal_limit_s))
        except NodeError as err:
            step.problem = str(err).splitlines()[0]
            if self.cluster.nodes[node_id] is node:  # it did not stop cleanly (a crash, recorded): run it again
                self._restart(node_id)
            else:  # the new process exited or was not ready: the crash watch restarts an exited one
                step.new_pid = self.cluster.nodes[node_id].running.pid
                step.process = self.cluster.nodes[node_id]
            return step
        step.new_pid, step.process = new.running.pid, new
        step.ready_s = round(time.monotonic() - began, 1)
        healthy, problems = self._wait_healthy(self.heal_limit_s)
        if healthy:
            step.settled_s = round(time.monotonic() - began, 1)
        else:
            step.problem = problems[:300]
        return step

    def _finalize(self, roll: UpgradeRoll) -> None:
        """``delayq upgrade finalize`` of this code; sets ``roll.finalized`` when it exits 0."""
        env = {**os.environ, **settings_env(self.cluster.settings), "COLUMNS": "200"}
        try:
            done = subprocess.run([roll.python, "-m", "delayq", "upgrade", "finalize"], env=env,
                                  cwd=self.cluster.root, capture_output=True, text=True, timeout=60, check=False)
        except subprocess.TimeoutExpired:
            roll.finalize = "no answer within 60s"
            return
        roll.finalize_exit = done.returncode
        roll.finalize = " ".join((done.stdout + done.stderr).split()) or "no output"
        if done.returncode == 0:
            roll.finalized.set()

    # -- a replicated cluster's kinds ------------------------------------------

    def _broker_kill(self, fault: PlannedFault) -> str:
        broker, why = self._choose_broker(fault.pick)
        name = self._broker_names[broker]
        assert self._watch is not None
        self._watch.set_down({broker}, out=True)
        if not self.stack.kill(name, signal.SIGKILL):
            raise FaultSkipped(f"{name} was not running")
        self._idle(fault.hold_s)
        back = self._start_broker(name)
        return f"SIGKILL to {name} (broker {broker}, {why}), down {fault.hold_s:.1f}s, {back}"

    def _broker_pause(self, fault: PlannedFault) -> str:
        broker, why = self._choose_broker(fault.pick)
        name = self._broker_names[broker]
        assert self._watch is not None
        with self._pause_lock:
            if self._released:
                raise FaultSkipped("the soak is stopping")
            self._watch.set_down({broker}, out=True)
            stopped_at = now_ms()
            if not self.stack.kill(name, signal.SIGSTOP):
                raise FaultSkipped(f"{name} was not running")
            self._paused_services.add(name)
        try:
            self._idle(fault.hold_s)
        finally:
            self._continue(name)
            self._watch.set_down(())
        held = (now_ms() - stopped_at) / 1000
        cut = f" (cut short: the soak is stopping; {fault.hold_s:.1f}s planned)" if held < fault.hold_s - 0.5 else ""
        fenced = self._watch.unregistered_ms.get(broker)
        fence = (f"fenced by the controllers {(fenced - stopped_at) / 1000:.1f}s in" if fenced is not None
                 else "never seen fenced")
        return f"SIGSTOP to {name} (broker {broker}, {why}) for {held:.1f}s{cut}, then SIGCONT; {fence}"

    def _rolling_restart(self, fault: PlannedFault) -> str:
        assert self._watch is not None
        steps = []
        for name in self.stack.broker_names:
            if self.stop.is_set():
                steps.append("stopped: the soak is stopping")
                break
            broker = self.stack.kafka_node(name).node_id
            began = time.monotonic()
            # Down once it has exited: until then it shuts down in a controlled way, serving while its
            # leaders move away.
            if not self.stack.kill(name, signal.SIGTERM, timeout_s=120):
                raise FaultSkipped(f"{name} was not running")
            self._watch.set_down({broker})
            stopped = time.monotonic() - began
            back = self._start_broker(name)
            began = time.monotonic()
            full, problems = self._wait_full_isr(FULL_ISR_WITHIN_S)
            if not full:
                steps.append(f"{name}: stopped in {stopped:.1f}s, {back}, full ISR NOT back within "
                             f"{FULL_ISR_WITHIN_S:.0f}s ({problems}): the restart stops here")
                break
            steps.append(f"{name}: stopped in {stopped:.1f}s, {back}, full ISR {time.monotonic() - began:.1f}s later")
        return "SIGTERM and restart, one broker at a time: " + "; ".join(steps)

    def _leader_move(self, fault: PlannedFault) -> str:
        if self.leader_mover is None:
            raise FaultSkipped("no leader mover (a replicated cluster's soak prepares one)")
        try:
            return self.leader_mover.move(self._live_addresses(), [self.cluster.settings.buffer_topic,
                                                                   *self.target_topics])
        except LeaderMoveError as err:
            raise FaultSkipped(f"leaders not moved: {err}") from err

    def _two_brokers_down(self, fault: PlannedFault) -> str:
        first, why_first = self._choose_broker(fault.pick)
        # A second draw from the same pick: another broker, by the same rules.
        second, why_second = self._choose_broker((fault.pick * 7919) % 1, exclude=(first,))
        names = [self._broker_names[first], self._broker_names[second]]
        assert self._watch is not None
        self._watch.set_down({first, second}, out=True)
        for name in names:
            if not self.stack.kill(name, signal.SIGKILL):
                raise FaultSkipped(f"{name} was not running")
        self._idle(fault.hold_s)
        back_first = self._start_broker(names[0], still_down=(second,))
        began = time.monotonic()
        serving = self._watch.wait_serving(30, self.stop)
        waited = time.monotonic() - began
        serves = (f"the cluster served again {waited:.1f}s later" if serving
                  else f"the cluster still not serving {waited:.0f}s later ({self._watch.problems})")
        back_second = self._start_broker(names[1])
        return (f"SIGKILL to {names[0]} (broker {first}, {why_first}) and {names[1]} (broker {second}, "
                f"{why_second}), down {fault.hold_s:.1f}s; {names[0]} {back_first}, {serves}; "
                f"{names[1]} {back_second}")

    def _start_broker(self, name: str, still_down: Iterable[int] = ()) -> str:
        """Start broker ``name`` (returns once it is registered and unfenced); what it took, as text."""
        began = time.monotonic()
        self.stack.start(name, say=lambda _text: None)
        if self._watch is not None:
            self._watch.set_down(still_down)
        return f"registered again {time.monotonic() - began:.1f}s after its restart"

    def _choose_broker(self, pick: float, exclude: Iterable[int] = ()) -> tuple[int, str]:
        """The broker a fault hits (:func:`.soak_brokers.choose_broker`), by the cluster as it is now."""
        settings = self.cluster.settings
        try:
            state = self._read_cluster(frozenset(), timeout_s=10)
        except KafkaException as err:
            raise FaultSkipped(f"Kafka did not answer to choose a broker: {err}") from err
        return choose_broker(pick, state, settings.buffer_topic,
                             [settings.transactional_id(k) for k in range(settings.shards)],
                             sorted(self._broker_names), exclude)

    def _watched_topics(self) -> list[str]:
        return [self.cluster.settings.buffer_topic, *self.target_topics, TRANSACTION_STATE_TOPIC]

    def _watched_min_insync(self) -> dict[str, int]:
        if self._min_insync is None:
            self._min_insync = min_insync_replicas(self._live_addresses(), self._watched_topics())
        return self._min_insync

    def _live_addresses(self, down: Iterable[int] = ()) -> list[str]:
        """The addresses of the brokers neither ``down`` nor paused by a fault."""
        left_out = set(down) | {broker for broker, name in self._broker_names.items()
                                if name in self._paused_services}
        return [self.stack.kafka_node(name).address for broker, name in sorted(self._broker_names.items())
                if broker not in left_out]

    def _read_cluster(self, down: frozenset[int], timeout_s: float = 3.0) -> ClusterState:
        addresses = self._live_addresses(down)
        if not addresses:
            return ClusterState(frozenset(), ())
        return read_cluster(addresses, self._watched_topics(), timeout_s)

    def _kafka_problems(self) -> list[str]:
        """A replicated cluster's part of :meth:`health`: every broker running, registered and in sync."""
        problems = []
        for name in self._broker_names.values():
            if name in self._paused_services:
                problems.append(f"{name} paused")
            elif not self.stack.kill(name, 0):  # signal 0: is its process there
                problems.append(f"{name} not running")
        try:
            state = self._read_cluster(frozenset())
        except KafkaException as err:
            return [*problems, f"Kafka did not answer ({err})"]
        return problems + replication_problems(state, self._broker_names)

    def _wait_full_isr(self, limit_s: float) -> tuple[bool, str]:
        deadline = time.monotonic() + limit_s
        problems: list[str] = []
        while not self.stop.is_set():
            problems = self._kafka_problems()
            if not problems or time.monotonic() >= deadline:
                break
            self._idle(0.5)
        return not problems, "; ".join(problems)

    # -- nodes ---------------------------------------------------------------

    def _live_nodes(self) -> list[NodeProcess]:
        return [n for n in self.cluster.nodes.values()
                if n.process is not None and n.process.poll() is None and n.process.pid not in self._paused]

    def _master(self, timeout_s: float = 15.0, *, other_than: str | None = None,
                of: tuple[int, ...] = ()) -> tuple[NodeProcess, Probe] | None:
        """A live node mastering a shard (one of ``of``, if given) other than ``other_than`` (a node's or a member's
        name), with the probe that said so; None after the timeout."""
        deadline = time.monotonic() + timeout_s
        while not self.stop.is_set():
            for node in self._live_nodes():
                found = probe(node)
                if any(found.master_process(k, node.node_id) != other_than for k in found.masters if not of or k in of):
                    return node, found
            if time.monotonic() >= deadline:
                return None
            self._idle(0.2)
        return None

    def _standby(self, pick: float) -> tuple[NodeProcess, Probe] | None:
        """A standby (:func:`standbys`) drawn by ``pick`` (0 to 1), and what its probe said; None if there is none."""
        probes = {node.node_id: probe(node) for node in self._live_nodes()}
        candidates = standbys(probes)
        if not candidates:
            return None
        chosen = candidates[min(len(candidates) - 1, int(pick * len(candidates)))]
        return self.cluster.nodes[chosen], probes[chosen]

    def stop_node(self, node: NodeProcess, sig: int = signal.SIGTERM) -> int:
        """Signal a node the soak means to stop, and wait for it; its exit is no crash (unless unclean)."""
        process = node.process
        assert process is not None
        self._expected_exits.add(process.pid)
        process.send_signal(signal.SIGCONT)  # a paused process would not act on SIGTERM
        process.send_signal(sig)
        deadline = time.monotonic() + 60
        while process.poll() is None and time.monotonic() < deadline:
            self.check_crashes()
            time.sleep(0.1)
        if process.poll() is None:
            process.kill()
            process.wait(10)
            self._record_crash(node, "ignored SIGTERM for 60s (then SIGKILL)")
        elif sig == signal.SIGTERM and process.returncode != 0:
            self._record_crash(node, f"exit code {process.returncode} on SIGTERM (a clean stop exits 0)")
        self._handled_exits.add(process.pid)
        return process.returncode

    def _restart(self, node_id: str) -> int:
        old = self.cluster.nodes.get(node_id)
        if old is not None and not old.log.closed:
            old.log.close()
        node = self.cluster.start(node_id, wait=False)
        assert node.process is not None
        return node.process.pid

    def check_crashes(self) -> None:
        """Record and restart every node process that exited on its own since the last look."""
        for node in list(self.cluster.nodes.values()):
            process = node.process
            if process is None or process.poll() is None or process.pid in self._handled_exits:
                continue
            self._handled_exits.add(process.pid)
            if process.pid in self._expected_exits:
                continue
            self._record_crash(node, "exited on its own")
            self._restarts[node.node_id] += 1
            if self._restarts[node.node_id] <= MAX_RESTARTS_AFTER_CRASH and not self.stop.is_set():
                self._restart(node.node_id)

    def _record_crash(self, node: NodeProcess, cause: str) -> None:
        process = node.process
        assert process is not None
        fault = self.current[0] if self.current else None
        crash = NodeCrash(node.node_id, process.pid, process.returncode if process.returncode is not None else -1,
                          now_ms(), fault, cause, node.log_tail(LOG_TAIL_LINES))
        self.crashes.append(crash)
        self.say(f"[red]node {node.node_id} (pid {process.pid}) {cause}, exit code {crash.exit_code}"
                 + (f", during {fault}" if fault else "") + "[/]")

    # -- health --------------------------------------------------------------

    def _wait_healthy(self, limit_s: float) -> tuple[bool, str]:
        deadline = time.monotonic() + limit_s
        problems = ""
        while not self.stop.is_set():
            healthy, problems = self.health()
            if healthy or time.monotonic() >= deadline:
                return healthy, problems
            self._idle(0.5)
        return False, "stopped"

    def health(self) -> tuple[bool, str]:
        """Every node running and ready, exactly one master per shard, each shard held by its replicas; else
        what is wrong (:func:`shard_problems`).

        Under steady traffic a standby's ``/readyz`` flickers ("1 records behind the buffer")
        as records land between its polls, so a node counts as ready if it said so within
        the last :data:`READY_WITHIN_S` seconds.
        """
        problems = []
        probes: dict[str, Probe] = {}
        for node in sorted(self.cluster.nodes.values(), key=lambda n: n.node_id):
            if node.process is None or node.process.poll() is not None:
                problems.append(f"{node.node_id} not running")
                continue
            if node.process.pid in self._paused:
                problems.append(f"{node.node_id} paused")
                continue
            answer = probes[node.node_id] = probe(node)
            now = time.monotonic()
            if answer.ready:
                self._last_ready[node.process.pid] = now
            elif now - self._last_ready.get(node.process.pid, -math.inf) > READY_WITHIN_S:
                problems.append(f"{node.node_id} not ready" + (f" ({answer.reason[:160]})" if answer.reason else ""))
        settings = self.cluster.settings
        problems += shard_problems(probes, settings.shards, settings.replicas)
        if self._broker_names:
            problems += self._kafka_problems()
        return not problems, "; ".join(problems)


def _successor(node: NodeProcess, found: Probe, shards: tuple[int, ...]) -> str:
    """Who on ``node`` masters the first of ``shards`` it masters, by its probe ``found``: the member, or the node."""
    return next((found.master_process(k, node.node_id) for k in found.masters if k in shards), node.node_id)


def _taken(found: Probe, shards: tuple[int, ...]) -> str:
    """Which of ``shards`` a node masters, by its probe ``found``, as text."""
    return ", ".join(str(k) for k in found.masters if k in shards) or "?"


def _continue(pid: int) -> None:
    """SIGCONT to ``pid``, which may have exited meanwhile (a member replaced, a node killed)."""
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass


def _outage_text(outages: list[tuple[int, int]], start_ms: int, problems: str) -> str:
    """A broker fault's outages, as the detail line tells them."""
    if not outages:
        return "every partition served throughout"
    spans = ", ".join(f"{(a - start_ms) / 1000:.1f}-{(b - start_ms) / 1000:.1f}s" for a, b in outages)
    total = sum(b - a for a, b in outages) / 1000
    return f"out {total:.1f}s (at {spans}; last seen: {problems[:300]})"


def standbys(probes: Mapping[str, Probe]) -> list[str]:
    """The nodes a standby fault may hit, by id, from the probes of the live nodes.

    Those that hold a shard and master none; when there is none such (every node masters a
    shard, as three shards on three nodes do), those that hold a shard they do not master:
    that shard's standby, whatever else they master. A node holding no shard is nobody's
    standby (with replicas, a shard's standbys are its other holders).
    """
    holding = {node: found for node, found in sorted(probes.items()) if found.held}
    idle = [node for node, found in holding.items() if not found.masters]
    return idle or [node for node, found in holding.items() if found.standby_of]


def shard_problems(probes: Mapping[str, Probe], shards: int, replicas: int) -> list[str]:
    """What is wrong with the shards, by the probes of the running nodes; empty when nothing is.

    Each shard must have exactly one master and as many holders as its replicas: ``replicas``
    of the nodes (all of them while fewer run), every node with 0.
    """
    problems = []
    wanted = len(probes) if replicas == 0 else min(replicas, len(probes))
    for shard in range(shards):
        masters = [node for node, found in sorted(probes.items()) if shard in found.masters]
        if len(masters) != 1:
            problems.append(f"{len(masters)} masters of shard {shard} ({', '.join(masters) or 'none'})")
        holders = [node for node, found in sorted(probes.items()) if shard in found.held]
        if len(holders) < wanted:
            problems.append(f"shard {shard} held by {len(holders)} node(s) ({', '.join(holders) or 'none'}), "
                            f"not {wanted}")
    return problems


def log_excerpt(path: Path, start_ms: int, end_ms: int, max_lines: int = 15,
                loggers: tuple[str, ...] = ("delayq.election",)) -> list[str]:
    """A node log's warnings and errors, and the lines of ``loggers``, written between ``start_ms`` and ``end_ms``.

    Node logs start each line with ``logging``'s local ``asctime`` (``2026-11-23 11:10:53,739``);
    librdkafka's own lines (``%3|...``) are left out: during a broker outage they are mostly
    "connection refused", which the fault already says.
    """
    found: list[str] = []
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return found
    for line in lines:
        stamp = _log_time_ms(line)
        if stamp is None or not start_ms <= stamp <= end_ms:
            continue
        level = line[24:].split(" ", 1)[0]
        if level in ("WARNING", "ERROR", "CRITICAL") or any(f" {name} " in line for name in loggers):
            found.append(line)
    return found[:max_lines] + ([f"... {len(found) - max_lines} more"] if len(found) > max_lines else [])


def log_warnings(path: Path, limit: int = 10) -> list[dict[str, Any]]:
    """A node log's warnings and errors grouped by their text with the numbers left out, most frequent first.

    Each group: how many lines, the first and the last one. What a node complained about
    during the run, for the report, without reading the whole log.
    """
    groups: dict[str, dict[str, Any]] = {}
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    for line in lines:
        if _log_time_ms(line) is None:
            continue
        level, _, rest = line[24:].partition(" ")
        # kazoo's connection warnings are what a ZooKeeper fault does, not something the node did.
        if level not in ("WARNING", "ERROR", "CRITICAL") or rest.startswith("kazoo."):
            continue
        key = f"{level} {_NUMBERS.sub('N', rest)}"
        group = groups.setdefault(key, {"count": 0, "first": line, "last": line})
        group["count"] += 1
        group["last"] = line
    return sorted(groups.values(), key=lambda g: -g["count"])[:limit]


# What Kafka's transaction coordinator logs when it drops a transaction's markers for partitions it finds no
# leader of (kafka-4.3.1: it takes them for deleted topics): those partitions keep the transaction open until
# the producer's next marker there, whatever its kind (docs/DESIGN.md, "Transactions Kafka leaves open for good").
DROPPED_MARKERS = "likely deleted already and hence can be skipped"


def kafka_dropped_markers(stack_folder: Path) -> list[str]:
    """The lines of the stack's broker logs saying a transaction's markers were dropped: evidence not delayq's."""
    return [line for log in sorted(stack_folder.glob("kafka*/kafka*.log"))
            for line in log.read_text(errors="replace").splitlines() if DROPPED_MARKERS in line]


_NUMBERS = re.compile(r"\d+")


def _log_time_ms(line: str) -> int | None:
    try:
        moment = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
    except ValueError:
        return None
    return round(moment.timestamp() * 1000)  # naive: local time, as logging wrote it


@dataclass(frozen=True)
class Probe:
    """What a node's own HTTP endpoints say: ready (and why not), the shards it masters and those it holds."""

    ready: bool
    masters: tuple[int, ...] = ()
    reason: str = ""
    held: tuple[int, ...] = ()
    # Shard -> the member process mastering it (a node of member processes; "" for a node of one process).
    master_members: Mapping[int, str] = field(default_factory=dict)

    def master_process(self, shard: int, node_id: str) -> str:
        """Who masters ``shard`` on this node: the member's id, or the node's for a node of one process."""
        return self.master_members.get(shard) or node_id

    @property
    def master(self) -> bool:
        """Master of any shard."""
        return bool(self.masters)

    @property
    def standby_of(self) -> tuple[int, ...]:
        """The shards it holds and does not master."""
        return tuple(shard for shard in self.held if shard not in self.masters)


def held_shards(metrics: str) -> tuple[int, ...]:
    """The shards a node's ``/metrics`` text says it holds, in order.

    A node has a ``delayq_is_master{shard="k"}`` series (0 or 1) for each shard it holds, and
    removes it when it drops the shard.
    """
    return tuple(sorted({shard for shard, _, _ in master_series(metrics)}))


def store_figures(node: NodeProcess, timeout_s: float = 2.0) -> tuple[float | None, float | None, tuple[int, ...]]:
    """A node's stores as its ``/metrics`` says: rebuilds and in-place migrations (counts since its process
    started), and each held store's format; (None, None, ()) when it does not answer."""
    try:
        with urllib.request.urlopen(node.url + "/metrics", timeout=timeout_s) as response:
            metrics = response.read().decode()
    except OSError:
        return None, None, ()
    rebuilds = migrations = 0.0
    formats = []
    for line in metrics.splitlines():
        name, _, value = line.rpartition(" ")
        if name.startswith("delayq_store_rebuilds_total{"):
            rebuilds += float(value)
        elif name.startswith("delayq_store_migrations_total{"):
            migrations += float(value)
        elif name.startswith("delayq_store_format{"):
            formats.append(round(float(value)))
    return rebuilds, migrations, tuple(sorted(formats))


def probe(node: NodeProcess, timeout_s: float = 1.0) -> Probe:
    """Ask ``/readyz`` and ``/metrics`` of ``node``; a node that does not answer is neither ready nor master."""
    reason = ""
    try:
        with urllib.request.urlopen(node.url + "/readyz", timeout=timeout_s) as response:
            ready = response.status == 200
    except urllib.error.HTTPError as err:
        ready = False
        try:
            reason = str(json.loads(err.read()).get("reason") or "")
        except ValueError:
            reason = f"HTTP {err.code}"
    except OSError as err:
        return Probe(False, (), f"no answer ({err})")
    try:
        with urllib.request.urlopen(node.url + "/metrics", timeout=timeout_s) as response:
            metrics = response.read().decode()
    except OSError:
        return Probe(ready, (), reason)
    return Probe(ready, mastered_shards(metrics), reason, held_shards(metrics), master_members(metrics))
