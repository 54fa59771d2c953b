"""Shards and nodes: delivery and ingest of a 6-shard cluster on 1, 2 and 3 nodes (``delayq bench --only scale``).

Each run starts a fresh cluster (``delayq init --shards 6``, a 12-partition buffer, replicas
R) with N nodes as child processes (``delayq node``), on an empty buffer, and waits until it
is *settled*: every node ready, every node holding its final shards (all 6 with R = 0, 6 / N
with R = 1) and the masters balanced (one per shard, none with more than ceil(6 / N)).

- delivery: ``count`` messages, all due at one instant T, are written to the buffer; T is
  planned after the cluster settled, far enough ahead that every holder has stored every
  message before it (:class:`LeadPlanner` learns how far from the configuration's earlier
  runs). At T the masters deliver. msg/s is timed from the target topic's broker
  timestamps, as ``bench_delivery`` times one master (:func:`service_bench.delivery_rate`).
  The run is refused (:class:`BenchRunInvalid`) if the cluster did not settle, if a message
  was stored after T, if the masters changed before T or while they delivered (a shard's
  records under more than one epoch), or if a record was appended before T.
- ingest: the buffer readers of the settled nodes are paused (SIGSTOP) while ``count``
  messages due in a day are written, then resumed (SIGCONT): msg/s is ``count`` over the time
  from the resume until every holder has stored every message of its shards (the nodes'
  ``delayq_ingested_total{op="put"}`` summed reaches ``count x copies``, copies = N with R = 0,
  1 with R = 1). Node start-up and the placement settling are not in it; the backlog is
  read as a running cluster reads a burst.

Per-node CPU (every process of the node, from /proc) over each timed window is kept
beside the figures, in cores, and in seconds by role (node or supervisor, member, reader).

A configuration may run each node as ``processes`` member processes (``DELAYQ_PROCESSES``, the
``members`` suite): the node's process is then their supervisor, and what a node says (its
masterships, its counters) is read from each member's own HTTP port, so the supervisor's merged
scrape is not what the bench times.
"""

from __future__ import annotations

import math
import os
import signal
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from rich.progress import Progress

from delayq import Settings, wire
from delayq.clock import now_ms
from delayq.delay_service import ensure_shards, ensure_topics
from delayq.delay_service.members import member_id, member_port
from delayq.dev import DevStack
from delayq.testing import (
    LocalCluster,
    NodeProcess,
    child_processes,
    free_ports,
    mastered_shards,
    reader_processes,
)

from .proc import busy_cores_between, cpu_seconds, machine_ticks
from .service_bench import (
    DAY_MS,
    BenchRunInvalid,
    bench_cluster,
    create_target,
    delivered_records,
    delivery_rate,
    fill_buffer,
    node_metric,
    wait_for,
)

SHARDS = 6
PARTITIONS = 12  # two per shard
NODE_COUNTS = (1, 2, 3)
REPLICAS = (0, 1)
# The members suite: one node of 1, then of 2 member processes, on a cluster of 2 shards (4 partitions), R = 0.
MEMBER_PROCESSES = (1, 2)
MEMBER_SHARDS = 2
MEMBER_PARTITIONS = 4
# After every node is ready, how long the holders and masters may take to settle (the integration
# tests' bound for balance after a join).
SETTLE_TIMEOUT_S = 30.0
# A run whose own records contradict it is measured again, this many times in all, before the suite fails.
TRIES = 3

T = TypeVar("T")


@dataclass(frozen=True, order=True)
class ScaleConfig:
    """One configuration: ``nodes`` nodes, ``replicas`` R (0: every node holds every shard), each node run as
    ``processes`` member processes (1: a plain node), on a cluster of ``shards`` shards and ``partitions``
    buffer partitions."""

    nodes: int
    replicas: int
    processes: int = 1
    shards: int = SHARDS
    partitions: int = PARTITIONS

    @property
    def copies(self) -> int:
        """How many nodes store each message: all of them with R = 0, else R (all while fewer are live)."""
        return self.nodes if self.replicas == 0 else min(self.replicas, self.nodes)

    @property
    def key(self) -> str:
        return f"n{self.nodes}.r{self.replicas}" + (f".p{self.processes}" if self.processes != 1 else "")

    @property
    def label(self) -> str:
        of = f" of {self.processes} processes" if self.processes != 1 else ""
        return f"{self.nodes} node{'s' if self.nodes > 1 else ''}{of}, R={self.replicas}"

    @property
    def masters(self) -> int:
        """How many processes master shards: every member of every node."""
        return self.nodes * self.processes

    def held_per_node(self, shards: int | None = None) -> int:
        """The most shards a node (all its members together) holds once settled: all with R = 0, else
        ceil(S x R / N)."""
        shards = self.shards if shards is None else shards
        return shards if self.replicas == 0 else math.ceil(shards * self.copies / self.nodes)


def configurations() -> list[ScaleConfig]:
    """The suite's configurations, in the order a run measures them: R = 0 on 1, 2, 3 nodes, then R = 1."""
    return [ScaleConfig(nodes, replicas) for replicas in REPLICAS for nodes in NODE_COUNTS]


def member_configurations() -> list[ScaleConfig]:
    """The members suite's: one node on 2 shards, R = 0, as 1 and as 2 processes, in the order a run measures them."""
    return [ScaleConfig(1, 0, processes, MEMBER_SHARDS, MEMBER_PARTITIONS) for processes in MEMBER_PROCESSES]


def unsettled(config: ScaleConfig, owners: dict[int, list[str]], held: dict[str, float],
              shards: int | None = None) -> str | None:
    """Why the cluster is not settled yet, or None when it is.

    Args:
        owners: shard -> the processes that say they master it (:meth:`Settled.masterships`: the nodes, or with
            member processes, the members).
        held: node id -> its ``delayq_shards_held``, its members' together (0 for a node that does not answer).
        shards: the cluster's shards (default ``config.shards``).
    """
    shards = config.shards if shards is None else shards
    missing = [k for k in range(shards) if not owners.get(k)]
    if missing:
        return f"shards {missing} have no master"
    doubled = {k: nodes for k, nodes in owners.items() if len(nodes) > 1}
    if doubled:
        return f"shards with more than one master: {doubled}"
    quota = math.ceil(shards / config.masters)
    load = Counter(nodes[0] for nodes in owners.values())
    over = {node: count for node, count in load.items() if count > quota}
    if over:
        return f"masters not balanced (at most {quota} each): {dict(sorted(load.items()))}"
    want = shards * config.copies
    if sum(held.values()) != want or any(h > config.held_per_node(shards) for h in held.values()):
        return f"holders not final ({want} shard copies, at most {config.held_per_node(shards)} a node): held {held}"
    return None


def shard_windows(records: list[tuple[int, int, int]], due_ms: int) -> dict[int, list[int]]:
    """Shard -> [first, last] append time of its delivered records, in ms after ``due_ms``.

    Shows a master that started late or finished early (the span of the whole run is the figure's).
    """
    windows: dict[int, list[int]] = {}
    for appended, shard, _ in records:
        window = windows.setdefault(shard, [appended, appended])
        window[0], window[1] = min(window[0], appended), max(window[1], appended)
    return {shard: [first - due_ms, last - due_ms] for shard, (first, last) in sorted(windows.items())}


def shards_with_handovers(records: list[tuple[int, int, int]]) -> dict[int, list[int]]:
    """Shard -> its epochs, for each shard whose records were delivered under more than one epoch.

    Args:
        records: (append time, shard, epoch) of each delivered record.
    """
    epochs: dict[int, set[int]] = {}
    for _, shard, epoch in records:
        epochs.setdefault(shard, set()).add(epoch)
    return {shard: sorted(found) for shard, found in sorted(epochs.items()) if len(found) > 1}


@dataclass
class LeadPlanner:
    """How long after the fill starts a delivery run's messages fall due.

    Every holder must have stored every message before then, and each second beyond is idle.
    From a configuration's earlier runs, per message written: ``factor`` x the slowest time
    from the fill's start until all was stored (a delivery run's), else ``factor`` x the
    slowest fill plus ingest time (an ingest run's: the same work, one after the other), plus
    ``margin_s``. A configuration not seen yet assumes ``assumed_rate`` store writes a second.
    """

    assumed_rate: float = 10_000.0
    factor: float = 1.5
    margin_s: float = 2.0
    stored: dict[ScaleConfig, float] = field(default_factory=dict)  # seconds per message
    ingested: dict[ScaleConfig, float] = field(default_factory=dict)  # seconds per message

    def lead_s(self, config: ScaleConfig, count: int) -> float:
        per_message = self.stored.get(config, self.ingested.get(config))
        if per_message is None:
            return self.margin_s + count * config.copies / self.assumed_rate
        return self.margin_s + self.factor * per_message * count

    def saw_stored(self, config: ScaleConfig, count: int, seconds: float) -> None:
        """A delivery run of ``config`` stored its ``count`` messages ``seconds`` after its fill started."""
        self.stored[config] = max(seconds / count, self.stored.get(config, 0.0))

    def saw_ingest(self, config: ScaleConfig, count: int, seconds: float) -> None:
        """An ingest run of ``config`` took ``seconds`` to write ``count`` messages and then ingest them."""
        self.ingested[config] = max(seconds / count, self.ingested.get(config, 0.0))


class StoredLate(BenchRunInvalid):
    """A delivery run's messages were not all stored by their due time; ``took_s`` is how long storing took."""

    def __init__(self, message: str, took_s: float):
        super().__init__(message)
        self.took_s = took_s


def first_valid(measure: Callable[[], T], invalid: list[str], tries: int = TRIES,
                say: Callable[[str], object] = print) -> T:
    """``measure()``, again while it raises BenchRunInvalid, up to ``tries`` times; reasons go to ``invalid``.

    Raises:
        BenchRunInvalid: every try was invalid (the last one's).
    """
    for attempt in range(1, tries + 1):
        try:
            return measure()
        except BenchRunInvalid as err:
            invalid.append(str(err))
            say(f"run invalid ({attempt}/{tries}): {err}")
            if attempt == tries:
                raise
    raise AssertionError("unreachable")


# -- processes ----------------------------------------------------------------------------------------------------


def process_roles(root: int) -> dict[int, str]:
    """Every live process of a node, from its process ``root`` down: pid -> ``node`` (a node of one process),
    ``supervisor`` (a node of member processes), ``member`` or ``reader`` (a buffer reader, a node's or a
    member's child)."""
    roles: dict[int, str] = {}

    def walk(pid: int, role: str) -> None:
        roles[pid] = role
        readers = set(reader_processes(pid))
        for child in child_processes(pid):
            walk(child, "reader" if child in readers else "member")

    walk(root, "node")
    if "member" in roles.values():
        roles[root] = "supervisor"
    return roles


class CpuWindow:
    """CPU of each node (every process of it: :func:`process_roles`) from construction until :meth:`close`.

    ``machine`` beside: the cores the whole machine was busy meanwhile (the broker, the bench,
    anything else running), which says whether the nodes were short of CPU. The processes are
    those found at construction; one that ended meanwhile is in :attr:`gone`.
    """

    def __init__(self, nodes: list[NodeProcess]):
        self.roles = {node.node_id: process_roles(node.running.pid) for node in nodes}
        self.started = time.monotonic()
        self.before = {pid: cpu_seconds([pid]) for roles in self.roles.values() for pid in roles}
        self.machine_before = machine_ticks()
        self.used: dict[int, float] | None = None
        self.wall = 0.0
        self.machine = 0.0
        self.gone: list[int] = []

    def close(self) -> CpuWindow:
        """End the window (once; later calls keep the first end)."""
        if self.used is None:
            self.wall = max(time.monotonic() - self.started, 1e-6)
            self.machine = busy_cores_between(self.machine_before, machine_ticks())
            self.gone = [pid for pid in self.before if not Path(f"/proc/{pid}").exists()]
            self.used = {pid: max(0.0, cpu_seconds([pid]) - before) for pid, before in self.before.items()}
        return self

    def cores(self) -> dict[str, float]:
        """Node id -> the cores its processes used; ``machine`` -> the machine's busy cores."""
        used = self.close().used or {}
        found = {node_id: round(sum(used[pid] for pid in roles) / self.wall, 2)
                 for node_id, roles in self.roles.items()}
        found["machine"] = round(self.machine, 2)
        return found

    def seconds(self) -> dict[str, float]:
        """Role (node, supervisor, member, reader) -> CPU seconds of the nodes' processes of that role."""
        used = self.close().used or {}
        found: dict[str, float] = {}
        for roles in self.roles.values():
            for pid, role in roles.items():
                found[role] = found.get(role, 0.0) + used[pid]
        return found


def readers_of(node: NodeProcess) -> list[int]:
    """Pids of the node's buffer readers (its members' with member processes)."""
    return [pid for pid, role in process_roles(node.running.pid).items() if role == "reader"]


def total(nodes: list[NodeProcess], name: str, **labels: str) -> float:
    return sum(node_metric(node, name, **labels) for node in nodes)


def speakers(node: NodeProcess, processes: int) -> list[NodeProcess]:
    """The processes that answer for ``node``'s shards: the node itself, or each of its ``processes`` members (a
    view on the member's own HTTP port, not a process of the bench's)."""
    if processes == 1:
        return [node]
    at = node.settings.model_copy(update={"node_id": node.node_id, "http_port": node.http_port})
    return [NodeProcess(node.settings, member_id(node.node_id, i), node.data_dir / "members" / str(i),
                        http_port=member_port(at, i)) for i in range(processes)]


def masterships(processes: list[NodeProcess]) -> dict[int, list[str]]:
    """Shard -> the ``processes`` that say they master it (one each, in a healthy cluster); one not answering
    (stopped, frozen, not started yet) says nothing."""
    found: dict[int, list[str]] = {}
    for process in processes:
        try:
            _, body = process.get("/metrics")
        except OSError:
            continue
        for shard in mastered_shards(body.decode()):
            found.setdefault(shard, []).append(process.node_id)
    return found


def kill_nodes(cluster: LocalCluster) -> None:
    """SIGKILL every process of the cluster's nodes: a node first (a supervisor would start its members again),
    then its members and readers (a member would otherwise stop slowly, on SIGTERM, while the next run starts)."""
    for node in cluster.nodes.values():
        if node.process is None or node.process.poll() is not None:
            continue
        rest = [pid for pid in process_roles(node.process.pid) if pid != node.process.pid]
        node.kill()
        for pid in rest:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@dataclass
class Settled:
    """A settled cluster of one run, and how long it took to get there."""

    config: ScaleConfig
    settings: Settings
    cluster: LocalCluster
    nodes: list[NodeProcess]
    target: str
    ready_s: float
    settled_s: float
    owners: dict[int, list[str]]

    @property
    def speakers(self) -> list[NodeProcess]:
        """Every process that answers for shards: the nodes, or their members."""
        return [one for node in self.nodes for one in speakers(node, self.config.processes)]

    def total(self, name: str, **labels: str) -> float:
        """Metric ``name`` summed over the cluster (its members' own ports: the supervisors do not add work)."""
        return total(self.speakers, name, **labels)

    def masterships(self) -> dict[int, list[str]]:
        return masterships(self.speakers)

    def why_not(self) -> str | None:
        config = self.config
        held = {node.node_id: total(speakers(node, config.processes), "delayq_shards_held") for node in self.nodes}
        why = unsettled(config, self.masterships(), held)
        if why is None and config.processes != 1:
            members = {node.node_id: sorted(node.members()) for node in self.nodes}
            want = {node.node_id: sorted(member_id(node.node_id, i) for i in range(config.processes))
                    for node in self.nodes}
            if members != want:
                return f"member processes {members}, expected {want}"
        return why


@contextmanager
def settled_cluster(stack: DevStack, config: ScaleConfig, progress: Progress) -> Iterator[Settled]:
    """A fresh cluster of ``config`` (shards, partitions, replicas), ``config.nodes`` nodes of ``config.processes``
    processes each, ready, holding their final shards, masters balanced over every process.

    Its topics and ZooKeeper folder go afterwards, its nodes are killed.

    Raises:
        BenchRunInvalid: it did not settle within SETTLE_TIMEOUT_S of every node being ready.
    """
    with bench_cluster(stack, shards=config.shards, buffer_partitions=config.partitions, replicas=config.replicas,
                       processes=config.processes) as settings, \
            tempfile.TemporaryDirectory(prefix="delayq-bench-scale-") as tmp:
        ensure_topics(settings)
        ensure_shards(settings)  # what `delayq init --shards S` records
        target = f"{settings.cluster}-target"
        create_target(settings, target)
        cluster = LocalCluster(settings, Path(tmp))
        try:
            task = progress.add_task(f"starting {config.label}", total=None)
            started = time.monotonic()
            # A node of member processes listens on its port and its members' after it.
            ports = config.processes + 1 if config.processes != 1 else 1
            for i in range(config.nodes):
                node_id = f"node-{i}"
                cluster.nodes[node_id] = NodeProcess(settings, node_id, cluster.root / node_id / "data",
                                                     http_port=free_ports(ports)).start()
            nodes = list(cluster.nodes.values())
            for node in nodes:
                node.wait_ready(90)
            ready = time.monotonic()
            progress.update(task, description=f"{config.label}: waiting for holders and masters to settle")
            run = Settled(config, settings, cluster, nodes, target, ready - started, 0.0, {})
            while (why := run.why_not()) is not None:
                if time.monotonic() - ready > SETTLE_TIMEOUT_S:
                    raise BenchRunInvalid(f"{config.label}: not settled {SETTLE_TIMEOUT_S:.0f} s after every node "
                                          f"was ready: {why}")
                time.sleep(0.1)
            run.settled_s = time.monotonic() - ready
            run.owners = run.masterships()
            progress.remove_task(task)
            yield run
        finally:
            kill_nodes(cluster)
            cluster.close()


def read_deliveries(settings: Settings, topic: str, count: int,
                    timeout_s: float) -> tuple[list[tuple[int, int, int]], int]:
    """(append time, shard, epoch) of every delivered record on ``topic`` (read_committed), and how many ids.

    The shard is computed from the id with ``settings``' partitions and shards.
    """
    found: list[tuple[int, int, int]] = []
    ids: set[bytes] = set()
    for appended, headers in delivered_records(settings, topic, count, timeout_s):
        delay_id, epoch = headers.get(wire.ID), headers.get(wire.EPOCH)
        # A record without an id is no delivery of delayq's: shard -1, refused by the caller.
        shard = wire.shard_of(wire.buffer_partition(delay_id, settings.buffer_partitions), settings.shards) \
            if delay_id else -1
        found.append((appended, shard, int(epoch) if epoch else 0))
        ids.add(delay_id or b"")
    return found, len(ids)


# -- the measurements ---------------------------------------------------------------------------------------------


def bench_scale_delivery(stack: DevStack, config: ScaleConfig, count: int, lead_s: float,
                         progress: Progress) -> dict:
    """``count`` messages due at one instant, stored on a settled cluster: the masters' msg/s together.

    The messages fall due ``lead_s`` after the fill starts (see :class:`LeadPlanner`).

    Raises:
        BenchRunInvalid: not settled; stored after the due time (:class:`StoredLate`); masters changed
            before or during delivery; a record appended before the due time, or delivered twice; see also
            ``delivery_rate`` (not ``count`` records, a span too short).
    """
    with settled_cluster(stack, config, progress) as run:
        nodes = run.nodes
        fill_started = now_ms()
        due = fill_started + round(lead_s * 1000)
        fill_buffer(run.settings, run.target, count, lambda i: due, progress)
        copies = count * config.copies
        task = progress.add_task(f"{config.label}: storing", total=copies)
        while (stored := run.total("delayq_ingested_total", op="put")) < copies:
            if now_ms() >= due:
                took = (now_ms() - fill_started) / 1000
                raise StoredLate(f"{config.label}: {stored:,.0f} of {copies:,} copies stored at the due time, "
                                 f"{lead_s:.1f} s after the fill started: plan a longer lead", took)
            progress.update(task, completed=stored)
            time.sleep(0.05)
        stored_ms = now_ms()
        why = run.why_not()
        owners = run.masterships()
        if why is not None or owners != run.owners:
            raise BenchRunInvalid(f"{config.label}: masters or holders changed before the due time: "
                                  f"{why or f'{run.owners} then {owners}'}")
        time.sleep(max(0.0, (due - now_ms()) / 1000))
        cpu = CpuWindow(nodes)
        wait_for(progress, f"{config.label}: delivering", count, lambda: run.total("delayq_delivered_total"),
                 timeout_s=120 + count / 1000, interval_s=0.1)
        cores = cpu.cores()
        owners_after = run.masterships()
        kill_nodes(run.cluster)
        records, ids = read_deliveries(run.settings, run.target, count, timeout_s=120)
    if owners_after != run.owners:
        raise BenchRunInvalid(f"{config.label}: masters changed while delivering: {run.owners} then {owners_after}")
    if cpu.gone:
        raise BenchRunInvalid(f"{config.label}: processes {cpu.gone} of the nodes ended while delivering: a member "
                              "or reader started again")
    strangers = sum(1 for _, shard, _ in records if shard < 0)
    if strangers or ids != len(records):
        raise BenchRunInvalid(f"{config.label}: {len(records):,} records on the target, {ids:,} ids among them, "
                              f"{strangers} without a delayq id: duplicates or strangers")
    handovers = shards_with_handovers(records)
    if handovers:
        raise BenchRunInvalid(f"{config.label}: shards delivered under more than one epoch {handovers}: "
                              "a master changed while delivering")
    appended = [t for t, _, _ in records]
    if appended and min(appended) < due:
        raise BenchRunInvalid(f"{config.label}: a record was appended {due - min(appended)} ms before its due time")
    return {"msg_s": delivery_rate(appended, count, started_ms=due), "ready_s": round(run.ready_s, 2),
            "settled_s": round(run.settled_s, 2), "lead_s": round(lead_s, 2),
            "stored_s": round((stored_ms - fill_started) / 1000, 2), "stored_ahead_ms": due - stored_ms,
            "span_ms": max(appended) - min(appended), "shard_windows_ms": shard_windows(records, due),
            "cpu_cores": cores, "cpu_s": {role: round(s, 3) for role, s in cpu.seconds().items()}}


def bench_scale_ingest(stack: DevStack, config: ScaleConfig, count: int, progress: Progress) -> dict:
    """A settled cluster's readers paused while ``count`` messages (due in a day) are written, then resumed: msg/s.

    Raises:
        BenchRunInvalid: not settled, a reader restarted or the placement changed while it ingested, or the
            holders' pending counts do not add up to ``count x copies`` at the end.
    """
    with settled_cluster(stack, config, progress) as run:
        nodes = run.nodes
        readers = {node.node_id: readers_of(node) for node in nodes}
        if not all(readers.values()):
            raise RuntimeError(f"{config.label}: a node without a buffer reader process: {readers}")
        paused = [pid for pids in readers.values() for pid in pids]
        for pid in paused:
            os.kill(pid, signal.SIGSTOP)
        try:
            fill_started = time.monotonic()
            due = now_ms() + DAY_MS
            fill_buffer(run.settings, f"{run.settings.cluster}-nowhere", count, lambda i: due, progress)
            fill_s = time.monotonic() - fill_started
            cpu = CpuWindow(nodes)
            started = time.perf_counter()
        finally:
            for pid in paused:
                os.kill(pid, signal.SIGCONT)
        copies = count * config.copies
        wait_for(progress, f"{config.label}: ingesting", copies,
                 lambda: run.total("delayq_ingested_total", op="put"), timeout_s=120 + copies / 1000,
                 interval_s=0.05)
        elapsed = time.perf_counter() - started
        cores = cpu.cores()
        pending = run.total("delayq_pending")
        why = run.why_not()
        now_readers = {node.node_id: readers_of(node) for node in nodes}
    if now_readers != readers:
        raise BenchRunInvalid(f"{config.label}: a buffer reader was replaced while ingesting: {readers} then "
                              f"{now_readers}")
    if why is not None:
        raise BenchRunInvalid(f"{config.label}: the placement changed while ingesting: {why}")
    if pending != copies:
        raise BenchRunInvalid(f"{config.label}: {pending:,.0f} pending on the holders, expected {copies:,}")
    return {"msg_s": count / elapsed, "store_writes_s": copies / elapsed, "elapsed_s": round(elapsed, 3),
            "fill_s": round(fill_s, 2), "ready_s": round(run.ready_s, 2), "settled_s": round(run.settled_s, 2),
            "cpu_cores": cores}


# The idle suite: a settled cluster of 3 nodes on 6 shards, R = 1, with nothing to do.
IDLE_CONFIG = ScaleConfig(3, 1)
# How long the idle suite lets the cluster's start-up work end before it measures, and how long it measures.
IDLE_QUIET_S = 10.0
IDLE_WINDOW_S = 20.0


def broker_pids(stack: DevStack) -> list[int]:
    """The pids of the stack's Kafka processes (brokers and controllers) that run."""
    return [s.pid for s in stack.status() if s.name.startswith("kafka") and s.pid is not None]


def bench_idle(stack: DevStack, progress: Progress) -> dict:
    """What a settled cluster with nothing to do costs: cores of its processes by role, and the broker's beyond
    what it spends without the cluster (measured first, for as long)."""
    brokers = broker_pids(stack)
    task = progress.add_task("idle: the broker alone", total=None)
    before, started = cpu_seconds(brokers), time.monotonic()
    time.sleep(IDLE_WINDOW_S)
    broker_alone = (cpu_seconds(brokers) - before) / (time.monotonic() - started)
    progress.remove_task(task)
    with settled_cluster(stack, IDLE_CONFIG, progress) as run:
        task = progress.add_task(f"idle: {IDLE_CONFIG.label}, 6 shards, nothing due", total=None)
        time.sleep(IDLE_QUIET_S)
        window = CpuWindow(run.nodes)
        before = cpu_seconds(brokers)
        time.sleep(IDLE_WINDOW_S)
        window.close()
        broker = (cpu_seconds(brokers) - before) / window.wall
        progress.remove_task(task)
        by_role = {role: round(seconds / window.wall, 3) for role, seconds in window.seconds().items()}
    return {"delayq_cores": round(sum(by_role.values()), 3), "by_role_cores": by_role,
            "broker_added_cores": round(max(0.0, broker - broker_alone), 3),
            "broker_alone_cores": round(broker_alone, 3), "machine_cores": round(window.machine, 2)}
