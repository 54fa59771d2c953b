"""The soak's faults: a plan drawn from the seed, and the thread that carries it out.

Eight kinds, each at least once per run, one at a time (never two overlapping):

* ``master_kill``: SIGKILL to a shard's master; a standby takes over; the node restarts from its store.
* ``master_pause``: SIGSTOP to a shard's master for longer than the ZooKeeper session timeout, then SIGCONT.
* ``standby_term``: SIGTERM to a standby (a clean stop), then a restart.
* ``standby_wipe``: a standby stopped, its data folder deleted, restarted (it rebuilds from the buffer).
* ``kafka_kill``: SIGKILL to the Kafka broker, a few seconds down, restarted.
* ``zookeeper_kill``: SIGKILL to ZooKeeper, a few seconds down, restarted.
* ``kafka_pause``: SIGSTOP to the Kafka broker (a long GC pause: 6-10 s, 3-8 s in runs of 5 minutes or
  less), then SIGCONT.
* ``zookeeper_pause``: SIGSTOP to ZooKeeper (8-12 s, 5-8 s in short runs: past the soak's 5 s
  session timeout), then SIGCONT.

A standby is a node that holds a shard and masters none; when every node masters a shard
(three shards on three nodes), a node that holds a shard it does not master, the standby
of that shard. A node that holds no shard is nobody's standby. A paused process is always
continued: when the pause is over, when the soak stops or fails in the middle of it
(:meth:`Chaos.release`), never left stopped behind.

A fault's window runs from the moment it is done until the cluster is healthy again
(every node running and ready, exactly one master per shard, each shard held by its
replicas), or until the heal limit. The same thread watches for node processes that exit
without the soak having stopped them: each such crash is recorded with its node's log
tail, and the node restarted.
"""

from __future__ import annotations

import json
import math
import random
import re
import shutil
import signal
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from delayq.clock import now_ms
from delayq.dev import DevStack
from delayq.testing import LocalCluster, NodeProcess, mastered_shards

from .soak_check import FaultWindow
from .suites import FAULT_TEXT

FAULT_KINDS = tuple(FAULT_TEXT)
DESCRIPTIONS = FAULT_TEXT
# A node that crashes this often is left down: restarting it again only repeats the crash.
MAX_RESTARTS_AFTER_CRASH = 5
LOG_TAIL_LINES = 40
READY_WITHIN_S = 3.0



@dataclass(frozen=True)
class PlannedFault:
    """One fault of the plan: what, after how long a quiet gap, held how long, on which standby."""

    kind: str
    gap_s: float
    hold_s: float
    pick: float

    def estimate_s(self, session_timeout_s: float) -> float:
        """About how long the fault takes until the cluster is healthy (for fitting the plan in the run)."""
        return self.hold_s + {"master_kill": session_timeout_s + 6, "master_pause": 6, "standby_term": 5,
                              "standby_wipe": 8, "kafka_kill": 20, "zookeeper_kill": 10,
                              "kafka_pause": 12, "zookeeper_pause": session_timeout_s + 6}[self.kind]

    def describe(self) -> str:
        held = f", held {self.hold_s:.1f}s" if self.hold_s else ""
        return f"{self.kind} after {self.gap_s:.1f}s{held}"


def plan_faults(seed: int, duration_s: float, session_timeout_s: float) -> list[PlannedFault]:
    """The faults of a run: rounds of every kind in a seeded order, more rounds than a run can use.

    Gaps scale with the run: a few seconds in a 2-minute run, up to a minute in long ones.
    The first round always runs whole (every kind once); later ones as long as time is left.
    Holds: a master's pause outlasts the session; a broker's pause is a long GC pause, 6-10 s
    (3-8 s in runs of 5 minutes or less); ZooKeeper's 8-12 s (5-8 s), past the session.
    """
    rng = random.Random(f"{seed}/faults")
    short = duration_s <= 300
    gap_max = min(60.0, max(3.0, duration_s / 24))
    down_max = 5.0 if short else 15.0
    holds = {"kafka_pause": (3.0, 8.0) if short else (6.0, 10.0),
             "zookeeper_pause": (5.0, 8.0) if short else (8.0, 12.0)}
    plan = []
    for _ in range(max(1, math.ceil(duration_s / 30))):
        kinds = list(FAULT_KINDS)
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
    """

    def __init__(self, plan: list[PlannedFault], stack: DevStack, cluster: LocalCluster, *,
                 session_timeout_s: float, heal_limit_s: float, warmup_s: float, deadline: float,
                 say: Callable[[str], None]):
        super().__init__(name="soak-chaos", daemon=True)
        self.plan = plan
        self.stack = stack
        self.cluster = cluster
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
        self.planned_first_round = len(FAULT_KINDS)
        self.finished = threading.Event()
        self.stop = threading.Event()
        self.failure: BaseException | None = None
        self._expected_exits: set[int] = set()
        self._handled_exits: set[int] = set()
        self._paused: set[int] = set()  # node pids stopped by master_pause
        self._paused_services: set[str] = set()  # "kafka", "zookeeper" while stopped by their pause
        # Held while a process is stopped or continued, so that release() never races a pause.
        self._pause_lock = threading.Lock()
        self._released = False
        self._last_ready: dict[int, float] = {}  # pid -> when it last answered ready (monotonic)
        self._restarts = Counter[str]()

    # -- the plan ------------------------------------------------------------

    def run(self) -> None:
        try:
            self._idle(self.warmup_s)
            first_round = self.plan[:len(FAULT_KINDS)]
            for fault in first_round:
                self._idle(fault.gap_s)
                self._inject(fault)
            # A kind the first round had to skip (no master, no standby just then) gets one more try.
            for fault in first_round:
                if not self.done[fault.kind]:
                    self._idle(fault.gap_s)
                    self._inject(fault)
            for fault in self.plan[len(FAULT_KINDS):]:
                if time.monotonic() + fault.gap_s + fault.estimate_s(self.session_timeout_s) > self.deadline:
                    break
                self._idle(fault.gap_s)
                self._inject(fault)
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

    def _inject(self, fault: PlannedFault) -> None:
        if self.stop.is_set():
            return
        healthy, problems = self._wait_healthy(self.heal_limit_s / 2)
        before = "" if healthy else f"cluster not healthy before the fault ({problems}); "
        start = now_ms()
        self.current = (fault.kind, time.monotonic())
        self._outage: tuple[int, int] | None = None
        try:
            try:
                detail = getattr(self, f"_{fault.kind}")(fault)
            except FaultSkipped as skipped:
                self.skipped.append(f"{fault.kind}: {skipped} ({problems})")
                self.say(f"[yellow]fault {fault.kind} skipped: {skipped}[/]")
                return
            healthy, problems = self._wait_healthy(self.heal_limit_s)
            took = (now_ms() - start) / 1000
            after = f"; healthy {took:.1f}s after it began" if healthy else (
                f"; NOT healthy {self.heal_limit_s:.0f}s after it was undone: {problems}")
            self.windows.append(FaultWindow(fault.kind, start, now_ms(), before + detail + after, self._outage))
            self.done[fault.kind] += 1
            self.say(f"fault {fault.kind}: {detail}{after}")
        finally:
            self.current = None

    # -- the kinds -----------------------------------------------------------

    def _master_kill(self, fault: PlannedFault) -> str:
        master = self._master()
        if master is None:
            raise FaultSkipped("no master to kill")
        pid = master.process.pid
        shards = probe(master).masters
        killed_at = time.monotonic()
        self.stop_node(master, signal.SIGKILL)
        took_over = self._master(self.session_timeout_s + 20, other_than=master.node_id, of=shards)
        successor = (f"{took_over.node_id} master of shard {self._taken(took_over, shards)} "
                     f"{time.monotonic() - killed_at:.1f}s later" if took_over else "no other master")
        restarted = self._restart(master.node_id)
        return (f"SIGKILL to master {master.node_id} of shards {list(shards)} (pid {pid}); {successor}; "
                f"restarted as pid {restarted}")

    def _master_pause(self, fault: PlannedFault) -> str:
        master = self._master()
        if master is None:
            raise FaultSkipped("no master to pause")
        process = master.running
        pid = process.pid
        shards = probe(master).masters
        with self._pause_lock:
            if self._released:
                raise FaultSkipped("the soak is stopping")
            self._paused.add(pid)
            process.send_signal(signal.SIGSTOP)
        paused_at = time.monotonic()
        try:
            took_over = self._master(fault.hold_s, other_than=master.node_id, of=shards)
            successor = (f"{took_over.node_id} took over shard {self._taken(took_over, shards)} "
                         f"{time.monotonic() - paused_at:.1f}s later" if took_over else "no other node took over")
            self._idle(fault.hold_s - (time.monotonic() - paused_at))
        finally:
            with self._pause_lock:
                if pid in self._paused:
                    process.send_signal(signal.SIGCONT)
                    self._paused.discard(pid)
        return (f"SIGSTOP to master {master.node_id} of shards {list(shards)} (pid {pid}) for "
                f"{time.monotonic() - paused_at:.1f}s, then SIGCONT; {successor}")

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
            for node in self.cluster.nodes.values():
                if node.process is not None and node.process.pid in self._paused:
                    node.process.send_signal(signal.SIGCONT)
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

    # -- nodes ---------------------------------------------------------------

    def _live_nodes(self) -> list[NodeProcess]:
        return [n for n in self.cluster.nodes.values()
                if n.process is not None and n.process.poll() is None and n.process.pid not in self._paused]

    def _master(self, timeout_s: float = 15.0, *, other_than: str | None = None,
                of: tuple[int, ...] = ()) -> NodeProcess | None:
        """A live node mastering a shard (one of ``of``, if given) other than ``other_than``; None after the timeout."""
        deadline = time.monotonic() + timeout_s
        while not self.stop.is_set():
            for node in self._live_nodes():
                masters = probe(node).masters
                if node.node_id != other_than and (set(masters) & set(of) if of else masters):
                    return node
            if time.monotonic() >= deadline:
                return None
            self._idle(0.2)
        return None

    @staticmethod
    def _taken(node: NodeProcess, shards: tuple[int, ...]) -> str:
        """Which of ``shards`` ``node`` masters now, as text."""
        return ", ".join(str(k) for k in probe(node).masters if k in shards) or "?"

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
        return not problems, "; ".join(problems)


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
    found = set()
    for line in metrics.splitlines():
        if line.startswith('delayq_is_master{shard="'):
            found.add(int(line.split('"', 2)[1]))
    return tuple(sorted(found))


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
    return Probe(ready, mastered_shards(metrics), reason, held_shards(metrics))
