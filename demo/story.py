"""The main job, end to end: unpaid orders time out through delayq while its master dies.

Every order sends "cancel order N if unpaid" delayed 5-30 s to ``order-timeouts``;
orders paid in time cancel that message. Three nodes run as child processes, each the
master of one of the cluster's three shards; midway the master of shard 0 is killed
with SIGKILL, another node takes its shard over, and the dead node comes back and
takes its share back. A read_committed consumer of ``order-timeouts`` judges every delivery as
it lands, and the Spark reconciliation proves the run at the end.

Kafka and ZooKeeper (:func:`choose_stack`): the dev stack of ``stack_dir`` if one is
named, else ``DELAYQ_BOOTSTRAP_SERVERS`` and ``DELAYQ_ZK_CONNECT`` if set, else the
embedded dev stack, which the demo starts (and stops at the end) only then. On a
secured dev stack (``--secure``) the nodes, the orders app and the reconciliation each
run as their own SCRAM user with exactly the ACLs ``delayq acls`` gives their role.
"""

from __future__ import annotations

import heapq
import json
import logging
import os
import random
import shutil
import signal
import statistics
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table

from delayq import Producer, wire
from delayq.clock import now_ms
from delayq.dev import DevStack, StackError
from delayq.errors import ConfigurationError, DelayqError, UnavailableError
from delayq.settings import Settings
from delayq.signals import sigterm_interrupts
from delayq.testing import LocalCluster, NodeError, NodeProcess, drop_cluster

from .options import DemoOptions

BOOTSTRAP_VARIABLE = "DELAYQ_BOOTSTRAP_SERVERS"
# The demo's cluster: 3 shards of 2 buffer partitions, so each of the 3 nodes masters one.
DEMO_PARTITIONS = 6
DEMO_SHARDS = 3
ZK_VARIABLE = "DELAYQ_ZK_CONNECT"
# On a secured dev stack each part runs as its own SCRAM user (only the nodes get ZooKeeper's credentials).
DEMO_USERS = {"node": "demo-node", "producer": "demo-orders-app", "reconcile": "demo-reconcile"}


@dataclass(frozen=True)
class StackChoice:
    """Where the demo finds Kafka and ZooKeeper, and whether it brings them up itself."""

    bootstrap_servers: str
    zk_connect: str
    source: str  # said to the user: where the addresses came from
    stack: DevStack | None = None  # the dev stack behind the addresses, if any
    start: bool = False  # the demo starts ``stack`` (and stops, at the end, what it started)


def choose_stack(stack_dir: Path | None = None, environ: Mapping[str, str] | None = None, *,
                 secure: bool = False) -> StackChoice:
    """Which Kafka and ZooKeeper the demo uses: a named dev stack, else the environment's, else its own.

    1. ``stack_dir``: the dev stack ``delayq dev up --state-dir stack_dir`` started, at the
       ports it recorded there; the demo does not start it.
    2. ``DELAYQ_BOOTSTRAP_SERVERS`` and ``DELAYQ_ZK_CONNECT`` (both): those addresses (and
       whatever security settings the environment gives, ``DELAYQ_KAFKA__*``, ``DELAYQ_ZK_AUTH``).
    3. Neither: the embedded dev stack of the default state folder (the secured one's with
       ``secure``), started if it is not running.

    Raises:
        StackError: ``stack_dir`` holds no dev stack, or (with ``secure``) a plain one.
        ConfigurationError: only one of the two variables is set, or both with ``secure``.
    """
    environ = os.environ if environ is None else environ
    if stack_dir is not None:
        stack = DevStack(stack_dir, secure=True if secure else None)
        if stack.recorded_ports() is None:
            secured = " --secure" if secure else ""
            raise StackError(f"no dev stack has run in {stack.folder} (no ports recorded there): start one with "
                             f"delayq dev up{secured} --state-dir {stack.folder}, or leave out --state-dir")
        return StackChoice(stack.bootstrap_servers, stack.zk_connect, f"the dev stack in {stack.folder}", stack)
    bootstrap = environ.get(BOOTSTRAP_VARIABLE, "").strip()
    zk_connect = environ.get(ZK_VARIABLE, "").strip()
    if secure and (bootstrap or zk_connect):
        raise ConfigurationError(f"--secure runs on the secured dev stack, but {BOOTSTRAP_VARIABLE}/{ZK_VARIABLE} "
                                 "name another cluster: unset them, or leave out --secure and export that "
                                 "cluster's security settings (DELAYQ_KAFKA__*, DELAYQ_ZK_AUTH)")
    if bootstrap and zk_connect:
        return StackChoice(bootstrap, zk_connect, f"{BOOTSTRAP_VARIABLE} and {ZK_VARIABLE}")
    if bootstrap or zk_connect:
        given, missing = (BOOTSTRAP_VARIABLE, ZK_VARIABLE) if bootstrap else (ZK_VARIABLE, BOOTSTRAP_VARIABLE)
        raise ConfigurationError(f"{given} is set but {missing} is not: the demo needs both Kafka and ZooKeeper; "
                                 f"set {missing} too, or unset {given} to have the demo start its own dev stack")
    stack = DevStack(secure=secure)
    return StackChoice(stack.bootstrap_servers, stack.zk_connect, f"the dev stack in {stack.folder}", stack,
                       start=True)


@dataclass
class Tally:
    """What the story has done so far; written by the workload and the watcher, read by the view."""

    orders: int = 0
    paid: int = 0
    expected_ids: set[str] = field(default_factory=set)
    last_due_ms: int = 0
    delivered: Counter = field(default_factory=Counter)
    lateness_ms: deque = field(default_factory=lambda: deque(maxlen=50_000))
    early: int = 0
    by_shard_epoch: Counter = field(default_factory=Counter)  # (shard, epoch) -> deliveries
    events: deque = field(default_factory=lambda: deque(maxlen=8))
    started: float = field(default_factory=time.monotonic)

    def event(self, text: str) -> None:
        self.events.append(f"[dim]{time.monotonic() - self.started:6.1f}s[/] {text}")

    @property
    def duplicates(self) -> int:
        return sum(1 for n in self.delivered.values() if n > 1)


class Orders(threading.Thread):
    """The shop: orders come in, some are paid before their deadline (their timeout is cancelled)."""

    def __init__(self, producer: Producer, target: str, options: DemoOptions, tally: Tally, rng: random.Random):
        super().__init__(name="orders", daemon=True)
        self.producer, self.target, self.options, self.tally, self.rng = producer, target, options, tally, rng
        self.payments: list[tuple[float, str]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        o = self.options
        interval = 1 / o.orders_per_second
        end = time.monotonic() + o.order_seconds
        next_order = time.monotonic()
        while not self.stop.is_set() and (time.monotonic() < end or self.payments):
            now = time.monotonic()
            if now >= next_order and now < end:
                self._place_order()
                next_order += interval
            while self.payments and self.payments[0][0] <= now:
                _, delay_id = heapq.heappop(self.payments)
                self.producer.cancel(delay_id)
                self.tally.paid += 1
                self.tally.expected_ids.discard(delay_id)
            self.producer.poll(0)
            wake = min([next_order if now < end else now + 0.05] + [p[0] for p in self.payments[:1]])
            self.stop.wait(max(0.0, min(0.05, wake - time.monotonic())))
        self.producer.flush(30)

    def _place_order(self) -> None:
        o = self.options
        number = self.tally.orders + 1
        delay = self.rng.uniform(o.min_delay_s, o.max_delay_s)
        order = {"order": number, "action": "cancel-if-unpaid", "amount": round(self.rng.uniform(5, 500), 2)}
        delay_id = self.producer.produce(self.target, json.dumps(order).encode(), key=f"order-{number}", delay=delay,
                                         headers=[("source", b"delayq-demo")])
        self.tally.orders = number
        self.tally.last_due_ms = max(self.tally.last_due_ms, now_ms() + int(delay * 1000))
        if self.rng.random() < o.pay_ratio:
            # Paid at least a second before the deadline: a cancel that is not racing delivery.
            heapq.heappush(self.payments, (time.monotonic() + self.rng.uniform(0.5, delay - 1.0), delay_id))
        else:
            self.tally.expected_ids.add(delay_id)


class Watcher(threading.Thread):
    """A user's read_committed consumer of the target topic, judging each delivery as it lands."""

    def __init__(self, settings: Settings, target: str, tally: Tally):
        super().__init__(name="watcher", daemon=True)
        self.settings, self.target, self.tally = settings, target, tally
        self.stop = threading.Event()

    def run(self) -> None:
        consumer = Consumer(self.settings.kafka_conf(**{
            # Under the reconciliation's group prefix: its principal may read the target with it.
            "group.id": f"{self.settings.reconcile_group_prefix}-watcher-{uuid.uuid4().hex[:6]}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False, "auto.offset.reset": "earliest"}))
        partitions = consumer.list_topics(self.target, timeout=10).topics[self.target].partitions
        consumer.assign([TopicPartition(self.target, p, 0) for p in partitions])
        try:
            while not self.stop.is_set():
                for record in consumer.consume(1000, 0.2):
                    if record.error() is None:
                        self._judge(record)
        finally:
            consumer.close()

    def _judge(self, record) -> None:
        headers = dict(record.headers() or [])
        delay_id = headers[wire.ID].decode()
        lateness = record.timestamp()[1] - int(headers[wire.DELIVER_AT])
        self.tally.delivered[delay_id] += 1
        shard = wire.shard_of(wire.buffer_partition(delay_id, DEMO_PARTITIONS), DEMO_SHARDS)
        self.tally.by_shard_epoch[shard, int(headers[wire.EPOCH])] += 1
        self.tally.lateness_ms.append(lateness)
        if lateness < 0:
            self.tally.early += 1


class Story:
    def __init__(self, options: DemoOptions, console: Console):
        self.options = options
        self.console = console
        self.tally = Tally()
        self.rng = random.Random(options.seed)
        self.run_dir = options.out_dir / time.strftime("run-%Y%m%d-%H%M%S")
        self.settings: Settings | None = None  # the admin's: creates the topics, records the shards
        self.made_topics = False
        self.roles: dict[str, Settings] = {}  # node, producer, reconcile: each part's own principal
        self.cluster: LocalCluster | None = None
        self.status: dict = {}
        self.stack_started: list[str] = []

    # -- the story -------------------------------------------------------

    def run(self) -> int:
        choice = choose_stack(self.options.stack_dir, secure=self.options.secure)
        try:
            if choice.start:
                with self.console.status("starting the embedded Kafka + ZooKeeper"):
                    self.stack_started = choice.stack.up(say=self.console.print)
            elif choice.stack is not None and not all(s.healthy for s in choice.stack.status()):
                raise StackError(f"the dev stack in {choice.stack.folder} is not running: start it with "
                                 f"delayq dev up --state-dir {choice.stack.folder}")
            secured = choice.stack is not None and choice.stack.secure
            self.console.print(f"Kafka at {choice.bootstrap_servers}, ZooKeeper at {choice.zk_connect} "
                               f"({choice.source}{', SASL_SSL with ACLs' if secured else ''})",
                               highlight=False, markup=False)
            cluster = f"demo-{uuid.uuid4().hex[:6]}"
            self.target = f"{cluster}-order-timeouts"
            self.settings = self._settings_as(choice, None, cluster)
            if not choice.start:
                self._check_reachable(choice)
            self.made_topics = True  # from here on, something of the cluster may be on the stack
            self._prepare_topics()
            self._prepare_roles(choice, cluster)
            return self._tell()
        finally:
            if self.cluster is not None:
                self.cluster.close()
            if self.made_topics:
                self._clean_up()
            if self.stack_started:
                choice.stack.down(tuple(reversed(self.stack_started)))

    def _clean_up(self) -> None:
        """Delete the demo cluster's topics and ZooKeeper folder (a buffer per run would pile up), unless kept."""
        settings = self.settings
        assert settings is not None  # set before any topic is made
        if self.options.keep:
            self.console.print(f"kept cluster {settings.cluster}: topics {settings.buffer_topic}, "
                               f"{settings.dead_letter_topic}, {self.target}; ZooKeeper {settings.zk_root}",
                               highlight=False, markup=False)
            return
        try:
            drop_cluster(settings)
        except DelayqError as err:  # ZooKeeper gone meanwhile: leftovers cost disk, not the story
            self.console.print(f"could not delete cluster {settings.cluster}: {err}", highlight=False, markup=False)
            return
        self.console.print(f"deleted cluster {settings.cluster}'s topics and ZooKeeper folder (--keep keeps them)",
                           highlight=False, markup=False)

    def _check_reachable(self, choice: StackChoice, timeout_s: float = 10.0) -> None:
        """Kafka and ZooKeeper the demo did not start answer, or the demo says in one line which does not."""
        from kazoo.client import KazooClient

        admin = AdminClient(self.settings.kafka_conf(**{"log_level": 0}))
        try:
            admin.list_topics(timeout=timeout_s)
        except KafkaException:
            raise UnavailableError(f"no Kafka answered at {choice.bootstrap_servers} ({choice.source}) within "
                                   f"{timeout_s:g}s: start it, or point the demo at another") from None
        quiet = logging.getLogger("delayq.demo.probe")  # kazoo would log every failed attempt
        quiet.addHandler(logging.NullHandler())
        quiet.propagate = False
        client = KazooClient(hosts=choice.zk_connect, timeout=timeout_s, logger=quiet)
        try:
            client.start(timeout=timeout_s)
        except Exception:
            raise UnavailableError(f"no ZooKeeper answered at {choice.zk_connect} ({choice.source}) within "
                                   f"{timeout_s:g}s: start it, or point the demo at another") from None
        finally:
            client.stop()
            client.close()

    def _settings_as(self, choice: StackChoice, user: str | None, cluster: str) -> Settings:
        """The demo cluster's settings as ``user`` of a secured dev stack (None: its admin, or the environment's)."""
        reach = (choice.stack.settings_values(user, zk_auth=user in (None, DEMO_USERS["node"]))
                 if choice.stack is not None else
                 {"bootstrap_servers": choice.bootstrap_servers, "zk_connect": choice.zk_connect})
        return Settings(**reach, cluster=cluster, buffer_partitions=DEMO_PARTITIONS, shards=DEMO_SHARDS,
                        zk_session_timeout_ms=4000, target_topics=[self.target])

    def _prepare_roles(self, choice: StackChoice, cluster: str) -> None:
        """Each part's settings; on a secured dev stack its own SCRAM user, with the ACLs of its role."""
        if choice.stack is None or not choice.stack.secure:
            self.roles = dict.fromkeys(("node", "producer", "reconcile"), self.settings)
            return
        from delayq.delay_service import apply_acls, required_acls

        users = DEMO_USERS
        for user in users.values():
            choice.stack.add_user(user)
        # The nodes serve the console too (--no-console: not): their principal reads what the console reads.
        console = {"console": f"User:{users['node']}"} if self.options.console else {}
        lines = required_acls(self.settings, **{role: f"User:{user}" for role, user in users.items()}, **console)
        apply_acls(self.settings, lines)
        self.roles = {role: self._settings_as(choice, user, cluster) for role, user in users.items()}
        self.tally.event(f"secured: SCRAM users {', '.join(users.values())}, {len(lines)} ACLs (delayq acls), "
                         "ZooKeeper ACLs on the cluster's znodes")

    def _prepare_topics(self) -> None:
        admin = AdminClient(self.settings.kafka_conf())
        # LogAppendTime: lateness is measured against the broker's clock, as a consumer sees it.
        futures = admin.create_topics([NewTopic(self.target, 3, 1,
                                                config={"message.timestamp.type": "LogAppendTime"})])
        futures[self.target].result(30)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        from delayq.delay_service import ensure_shards, ensure_topics  # load kazoo: only when the demo runs

        ensure_topics(self.settings)  # what `delayq init --shards 3` creates and records
        ensure_shards(self.settings)

    def _tell(self) -> int:
        o, tally = self.options, self.tally
        self.cluster = LocalCluster(self.roles["node"], self.run_dir, create_topics=False,  # the admin made them
                                    console=o.console)
        with self.console.status(f"starting {o.nodes} delay-service nodes"):
            for i in range(o.nodes):
                self.cluster.start(f"node-{chr(ord('a') + i)}", wait=False)
            for node in self.cluster.nodes.values():
                node.wait_ready()
            owners = self._wait_for_masters()
        tally.event(f"{o.nodes} nodes up, {DEMO_SHARDS} shards; masters: " +
                    ", ".join(f"shard {k} [bold]{owners[k]}[/]" for k in sorted(owners)))
        if o.console:
            self.console.print(f"console: {self._console_node(owners).console_url}", highlight=False, markup=False)
        app = self.roles["producer"]
        producer = Producer(app.kafka_conf(**{"delayq.cluster": app.cluster, "linger.ms": 5}))
        orders = Orders(producer, self.target, o, tally, self.rng)
        watcher = Watcher(self.roles["reconcile"], self.target, tally)
        watcher.start()
        orders.start()
        tally.event(f"orders arriving at {o.orders_per_second:g}/s for {o.order_seconds:g}s; "
                    f"{o.pay_ratio:.0%} get paid in time")
        kill_at = time.monotonic() + o.order_seconds / 2
        killed = None
        try:
            with Live(self._view(), console=self.console, refresh_per_second=4, transient=False) as live:
                while True:
                    self._refresh_status()
                    if o.kill_master and killed is None and time.monotonic() >= kill_at:
                        killed = self._kill_master()
                    if killed is not None:
                        killed = self._watch_handover(*killed)
                    live.update(self._view())
                    if not orders.is_alive() and now_ms() > tally.last_due_ms + 2000 and self._all_delivered():
                        break
                    if now_ms() > tally.last_due_ms + 60_000 and not orders.is_alive():
                        tally.event("[red]gave up waiting: some deliveries never came[/]")
                        break
                    time.sleep(0.25)
                time.sleep(1.0)  # one more look for late duplicates
                live.update(self._view())
        finally:
            orders.stop.set()
            watcher.stop.set()
            orders.join(10)
            watcher.join(10)
        ok = self._all_delivered() and tally.duplicates == 0 and tally.early == 0
        self.console.print(("[green]" if ok else "[red]") +
                           f"every unpaid order timed out exactly once: {ok}[/]")
        if o.reconcile:
            return self._reconcile(ok)
        return 0 if ok else 1

    def _wait_for_masters(self, timeout_s: float = 60.0) -> dict[int, str]:
        """Shard -> its master, once every shard has one."""
        deadline = time.monotonic() + timeout_s
        while True:
            owners = self.cluster.masterships()
            if len(owners) == DEMO_SHARDS and all(len(nodes) == 1 for nodes in owners.values()):
                return {shard: nodes[0] for shard, nodes in owners.items()}
            if time.monotonic() > deadline:
                raise NodeError(f"not every shard had a master {timeout_s:.0f}s after the nodes were ready: {owners}")
            time.sleep(0.2)

    def _console_node(self, owners: dict[int, str]) -> NodeProcess:
        """The node whose console the demo points to: one the story will not kill (shard 0's master is killed)."""
        nodes = self.cluster.nodes
        return next((node for node_id, node in nodes.items() if node_id != owners.get(0)), next(iter(nodes.values())))

    def _kill_master(self):
        master_id = self.status.get("master")  # shard 0's
        node = self.cluster.nodes.get(master_id) if master_id else None
        if node is None:
            return None
        shards = [s["shard"] for s in self.status.get("shards", []) if s["master"] == master_id]
        node.process.send_signal(signal.SIGKILL)
        node.process.wait(10)
        self.tally.event(f"[red]SIGKILL[/] to master [bold]{master_id}[/] (shards {shards}) with "
                         f"{self.status.get('pending_total', '?')} messages pending")
        return (node, time.monotonic(), shards)

    def _watch_handover(self, node, killed_at: float, shards):
        """Say who took each of the killed node's shards; once all are taken, restart it (once)."""
        if not shards:
            return (node, killed_at, shards)
        taken = {s["shard"]: (s["master"], s["epoch"]) for s in self.status.get("shards", [])
                 if s["shard"] in shards and s["master"] and s["master"] != node.node_id}
        for shard in sorted(taken):
            master, epoch = taken[shard]
            self.tally.event(f"[green]{master}[/] took over as master of shard {shard}, epoch {epoch}, "
                             f"{time.monotonic() - killed_at:.1f}s after the kill")
        left = [k for k in shards if k not in taken]
        if not left:
            self.cluster.start(node.node_id, wait=False)
            self.tally.event(f"{node.node_id} restarted from its own stores; it takes its share of shards back")
        return (node, killed_at, left)

    def _refresh_status(self) -> None:
        try:
            from delayq.delay_service import cluster_status  # loads kazoo: only when the demo runs

            self.status = cluster_status(self.settings)
            self.status["pending_total"] = max((n.get("pending") or 0 for n in self.status["nodes"]), default=0)
        except Exception as err:  # ZooKeeper hiccup: keep showing the last view
            self.tally.event(f"[yellow]status unavailable: {err}[/]")

    def _all_delivered(self) -> bool:
        return self.tally.expected_ids <= set(self.tally.delivered)

    # -- the view --------------------------------------------------------

    def _view(self) -> Group:
        tally, status = self.tally, self.status
        nodes = Table(title=f"cluster {status.get('cluster', '')} · {DEMO_SHARDS} shards", expand=True)
        for column in ("node", "role", "masters of shards (epoch)", "pending", "lag"):
            nodes.add_column(column)
        epochs = {s["shard"]: s["epoch"] for s in status.get("shards", [])}
        live_ids = {n["node_id"] for n in status.get("nodes", [])}
        for node_id in sorted(self.cluster.nodes if self.cluster else []):
            info = next((n for n in status.get("nodes", []) if n["node_id"] == node_id), None)
            if info is None or node_id not in live_ids:
                nodes.add_row(node_id, "[red]down[/]", "-", "-", "-")
            else:
                role = "[bold green]master[/]" if info["role"] == "master" else info["role"]
                mastered = ", ".join(f"{k} ({epochs.get(k, '?')})" for k in info.get("masters", [])) or "-"
                nodes.add_row(node_id, role, mastered, str(info.get("pending")), str(info.get("lag")))
        lateness = list(tally.lateness_ms)
        p50 = statistics.median(lateness) if lateness else None
        p99 = sorted(lateness)[int(0.99 * (len(lateness) - 1))] if lateness else None
        numbers = Table.grid(padding=(0, 2))
        numbers.add_column(justify="right")
        numbers.add_column()
        for label, value in (
            ("orders placed", f"{tally.orders:,}"),
            ("paid in time (cancelled)", f"{tally.paid:,}"),
            ("timeouts expected so far", f"{len(tally.expected_ids):,}"),
            ("timeouts delivered", f"{sum(tally.delivered.values()):,}"),
            ("duplicates", f"{tally.duplicates}"),
            ("early", f"{tally.early}"),
            ("lateness p50 / p99 / max", "-" if p50 is None else f"{p50:.0f} / {p99:.0f} / {max(lateness):.0f} ms"),
            ("delivered per shard (epoch: count)", _per_shard(tally.by_shard_epoch)),
        ):
            numbers.add_row(label, value)
        events = "\n".join(tally.events) or "-"
        return Group(nodes, Panel(numbers, title="order timeouts"), Panel(events, title="what happened"))

    # -- the proof -------------------------------------------------------

    def _reconcile(self, live_ok: bool) -> int:
        from delayq.spark import ReconcileOptions, reconcile

        out = self.run_dir / "reconcile"
        until = now_ms()
        options = ReconcileOptions(since_ms=int((time.time() - 600) * 1000), until_ms=until, out=out,
                                   grace_ms=1000, topics=(self.target,), master="local[2]")
        with self.console.status("reconciling with Spark (buffer vs. deliveries)") as spinner:
            report = reconcile(self.roles["reconcile"], options,
                               progress=lambda text: spinner.update(f"reconcile: {text}"))
        totals = report.totals
        table = Table(title="reconciliation (Spark)")
        for key in ("expected", "delivered", "duplicates", "missing", "unexpected", "early"):
            table.add_column(key)
        table.add_row(*(str(totals.get(k)) for k in ("expected", "delivered", "duplicates", "missing",
                                                    "unexpected", "early")))
        self.console.print(table)
        self.console.print(f"lateness ms: {report.lateness_ms}")
        self.console.print(f"report: [bold]{out / 'report.html'}[/]")
        clean_runs(self.options.out_dir)
        return 0 if live_ok and report.ok else 1


def run_demo(options: DemoOptions, console: Console | None = None) -> int:
    """Tell the story; return 0 when every unpaid order timed out exactly once, on time."""
    console = console or Console()
    story = Story(options, console)
    with sigterm_interrupts():
        return story.run()


def clean_runs(out_dir: Path, keep: int = 3) -> None:
    """Old runs' node data are only for looking at; keep the last few."""
    runs = sorted(out_dir.glob("run-*"))
    for old in runs[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def _per_shard(by_shard_epoch: Counter) -> str:
    """``0: 1: 310, 2: 95; 1: 1: 402`` (shard: epoch: deliveries, ...); ``-`` before any delivery."""
    epochs: dict[int, list[str]] = {}
    for (shard, epoch), count in sorted(by_shard_epoch.items()):
        epochs.setdefault(shard, []).append(f"{epoch}: {count}")
    return "; ".join(f"{shard}: " + ", ".join(listed) for shard, listed in epochs.items()) or "-"
