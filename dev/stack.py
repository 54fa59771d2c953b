"""The embedded local stack: real Apache Kafka (KRaft) and one real ZooKeeper on loopback.

One broker by default: a single Kafka process that is both broker and controller, on port P
(its controller on P+1). With ``brokers=N`` (N >= 2, ``delayq dev up --brokers N``) it is a
replicated cluster the way production runs one: N brokers on ports P .. P+N-1 and a quorum of
three dedicated KRaft controllers on the next three ports (a broker going away, or two, never
takes the cluster's metadata with it), the internal topics at replication factor min(N, 3)
and ``min.insync.replicas`` min(N, 3) - 1 from three brokers on (1 below).

Everything lives under one state folder::

    <state>/stack.json     the ports the last ``up`` was asked for (Kafka's first, ZooKeeper's), the
                           broker count, and whether the stack is secured
    <state>/secure/        a secured stack's credentials and certificates (dev/secure.py)
    <state>/kafka/{server.properties, log4j2.properties, data/, kafka.log (rolled), kafka.out, kafka.pid}   (one broker)
    <state>/kafka-<i>/..., <state>/controller-<j>/...                                   (N brokers)
    <state>/zookeeper/{zoo.cfg, logback.xml, data/, zookeeper.log (rolled), zookeeper.out, zookeeper.pid}
    <state>/spark-master/..., <state>/spark-worker-<i>/...   (with ``spark_workers``: dev/spark.py)

``up`` starts what is not running (after one broker died, just that one) and returns when every
service answers; ``down``
stops exactly the processes whose pid files ``up`` wrote, and is safe to repeat.
A ``DevStack`` made without ports uses the ports recorded in its state folder, so
``status``, ``env`` and ``down`` of a folder talk about that folder's stack. An ``up``
that fails stops what it started: the next ``up`` starts from a clean slate.

With ``spark_workers=N`` (``delayq dev up --spark``), ``up`` also starts a Spark standalone master and N
workers from the Spark pyspark ships, on free loopback ports it records beside Kafka's (dev/spark.py);
``status``, ``env`` and ``down`` cover them whenever they were started, and ``up`` without it leaves them as
they are.

A secured stack (``DevStack(secure=True)``, ``delayq dev up --secure``) has its own folder
and ports by default, so it runs beside the plain one: Kafka speaks SASL_SSL (SCRAM-SHA-512
over TLS) and enforces ACLs; ZooKeeper is the same as the plain stack's.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from . import secure as security
from . import spark as spark_cluster
from .runtime import KAFKA, ZOOKEEPER, StackError, ensure_runtime, java_executable
from .spark import SparkPorts, is_spark_service

DEFAULT_KAFKA_PORT = 9092
DEFAULT_ZK_PORT = 2181
# The secured stack's, so that it can run beside the plain one.
DEFAULT_SECURE_KAFKA_PORT = 9192
DEFAULT_SECURE_ZK_PORT = 2281
HOST = "127.0.0.1"
# The one-broker stack's services, in the order `up` starts them (DevStack.services: any stack's).
SERVICES = ("zookeeper", "kafka")
# The dedicated KRaft controllers of a stack of two or more brokers (a quorum that survives one loss),
# and the node ids they take (brokers are 1 .. N).
CONTROLLERS = 3
CONTROLLER_ID_BASE = 100
MAX_BROKERS = 9
# How long the controller of a one-broker stack waits for its broker's heartbeat before fencing it (Kafka's
# default: 9 s): above the soak's longest freeze (10 s) and a heartbeat interval (2 s), see kafka_properties.
# Not longer: a restarted broker cannot register until its previous registration's session has expired
# ("DuplicateBrokerRegistrationException"), so every restart waits this long, and with 60 s the broker gave
# up registering (initial.broker.registration.timeout.ms, 60 s) and exited.
LONE_BROKER_SESSION_MS = 15_000
# Where `up` records the ports it was asked for, in the state folder.
RECORD = "stack.json"
# Each service's log rolls at this size, and this many rolled files are kept beside it (<name>.log.1, ...): a
# stack that runs for weeks of test sessions holds at most (1 + LOG_FILES_KEPT) * LOG_FILE_MB per service.
LOG_FILE_MB = 64
LOG_FILES_KEPT = 3


def default_state_dir(secure: bool = False) -> Path:
    """The plain stack's folder (DELAYQ_DEV_DIR, else ~/.local/state/delayq/dev); the secured one adds -secure."""
    explicit = os.environ.get("DELAYQ_DEV_DIR")
    if explicit:
        plain = Path(explicit).expanduser()
    else:
        base = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
        plain = Path(base) / "delayq" / "dev"
    return plain.with_name(plain.name + "-secure") if secure else plain


@dataclass
class ServiceStatus:
    name: str
    version: str
    address: str
    pid: int | None
    running: bool
    answering: bool
    log: Path

    @property
    def healthy(self) -> bool:
        return self.running and self.answering


@dataclass(frozen=True)
class Ports:
    """The loopback ports of one stack: Kafka's first port, ZooKeeper's, and how many brokers listen.

    Brokers listen on ``kafka`` .. ``kafka + brokers - 1``; the controllers on the ports after them
    (one, inside broker 1's process, for a one-broker stack; three dedicated ones otherwise).
    """

    kafka: int
    zk: int
    brokers: int = 1

    @property
    def controller(self) -> int:
        """The first controller's port."""
        return self.kafka + self.brokers

    @property
    def broker_ports(self) -> tuple[int, ...]:
        return tuple(range(self.kafka, self.kafka + self.brokers))

    @property
    def controller_ports(self) -> tuple[int, ...]:
        return tuple(range(self.controller, self.controller + (1 if self.brokers == 1 else CONTROLLERS)))

    @property
    def last_kafka_port(self) -> int:
        return self.controller_ports[-1]


@dataclass(frozen=True)
class KafkaNode:
    """One Kafka process of the stack: a broker, a dedicated controller, or (one broker) both."""

    name: str
    node_id: int
    # Its client listener (None: a dedicated controller) and its controller listener (None: a broker only).
    broker_port: int | None
    controller_port: int | None

    @property
    def roles(self) -> str:
        return ",".join(role for role, port in (("broker", self.broker_port), ("controller", self.controller_port))
                        if port is not None)

    @property
    def address(self) -> str:
        return f"{HOST}:{self.broker_port if self.broker_port is not None else self.controller_port}"


def kafka_nodes(ports: Ports) -> tuple[KafkaNode, ...]:
    """The Kafka processes of a stack with ``ports``, controllers first (the order ``up`` starts them)."""
    if ports.brokers == 1:
        return (KafkaNode("kafka", 1, ports.kafka, ports.controller),)
    controllers = tuple(KafkaNode(f"controller-{j}", CONTROLLER_ID_BASE + j, None, port)
                        for j, port in enumerate(ports.controller_ports, start=1))
    brokers = tuple(KafkaNode(f"kafka-{i}", i, port, None) for i, port in enumerate(ports.broker_ports, start=1))
    return controllers + brokers


def internal_replication(brokers: int) -> tuple[int, int]:
    """Replication factor and min.insync.replicas of the internal topics (and auto-created ones) on ``brokers``."""
    factor = min(brokers, 3)
    return factor, factor - 1 if factor >= 3 else 1


def _record(state_dir: Path) -> dict | None:
    """What the last ``up`` in ``state_dir`` wrote to ``<state>/stack.json``; None without a readable record."""
    try:
        record = json.loads((Path(state_dir).expanduser() / RECORD).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def recorded_secure(state_dir: Path) -> bool | None:
    """Whether the stack of ``state_dir`` is secured; None if no ``up`` ran there."""
    state_dir = Path(state_dir).expanduser()
    record = _record(state_dir)
    if record is not None:
        return bool(record.get("secure", False))
    return (state_dir / security.FOLDER).is_dir() if recorded_ports(state_dir) is not None else None


def recorded_ports(state_dir: Path) -> Ports | None:
    """The ports the last ``up`` in ``state_dir`` was asked for, or None if no ``up`` ran there.

    Read from ``<state>/stack.json``; a stack started by a delayq that wrote no record is
    read from the configuration files its services run with.
    """
    state_dir = Path(state_dir).expanduser()
    record = _record(state_dir)
    try:
        if record is not None:
            return Ports(int(record["kafka_port"]), int(record["zk_port"]), int(record.get("brokers", 1)))
    except (ValueError, KeyError, TypeError):
        pass
    try:
        server_properties = (state_dir / "kafka" / "server.properties").read_text()
        zoo_cfg = (state_dir / "zookeeper" / "zoo.cfg").read_text()
    except OSError:
        return None
    kafka = re.search(r"^listeners=(?:PLAINTEXT|SASL_SSL)://[^:]+:(\d+)", server_properties, re.MULTILINE)
    zk = re.search(r"^clientPort=(\d+)", zoo_cfg, re.MULTILINE)
    return Ports(int(kafka[1]), int(zk[1])) if kafka and zk else None


def recorded_spark_ports(state_dir: Path) -> SparkPorts | None:
    """The Spark ports the last ``up --spark`` in ``state_dir`` chose, or None if Spark never ran there."""
    record = _record(state_dir)
    return SparkPorts.from_record(record.get("spark")) if record is not None else None


@dataclass
class DevStack:
    """Kafka (one broker+controller, or N brokers and three controllers) and one ZooKeeper, from cached jars.

    Ports and the broker count left out (None) are the ones the last ``up`` in ``state_dir``
    recorded, else 9092, 2181 and one broker: ``DevStack(folder)`` is whatever stack runs from
    that folder.

    Example:
        >>> stack = DevStack()
        >>> stack.up()          # returns when both answer
        >>> stack.bootstrap_servers, stack.zk_connect
        ('127.0.0.1:9092', '127.0.0.1:2181')
        >>> stack.down()
    """

    state_dir: Path | None = None
    kafka_port: int | None = None
    zk_port: int | None = None
    start_timeout_s: float = 90.0
    # Kafka brokers: 1 (a broker that is its own controller) or 2 to MAX_BROKERS (with three controllers).
    brokers: int | None = None
    # SASL_SSL and ACLs (dev/secure.py). None: as the state folder's last ``up`` recorded, else plain.
    secure: bool | None = None
    # Spark workers ``up`` starts beside a Spark standalone master (dev/spark.py); 0: ``up`` starts no Spark (and
    # leaves a Spark that runs as it is).
    spark_workers: int = 0
    # Where a new KRaft cluster id's randomness comes from (a test injects its own draws).
    draw_uuid: Callable[[], uuid.UUID] | None = field(default=None, repr=False, compare=False)
    # The processes this object started, by service: while one of them has not exited, it is
    # running, whatever /proc said of a pid just spawned (a start right after a SIGKILL once
    # read a live, fresh JVM as gone and stopped it: "exited while starting", no log line).
    _children: dict[str, subprocess.Popen] = field(default_factory=dict, init=False, repr=False, compare=False)
    # The Spark ports ``up`` chose (spark_workers > 0); None: the recorded ones are this stack's.
    _spark: SparkPorts | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.spark_workers:
            spark_cluster.check_workers(self.spark_workers)
        self.state_dir = Path(self.state_dir or default_state_dir(bool(self.secure))).expanduser().resolve()
        recorded = recorded_ports(self.state_dir)
        was_secure = recorded_secure(self.state_dir)
        if self.secure is None:
            self.secure = bool(was_secure)
        elif was_secure is not None and was_secure != self.secure:
            kind = "secured" if was_secure else "plain"
            raise StackError(
                f"the dev stack in {self.state_dir} is a {kind} one: "
                + ("add --secure to use it" if was_secure else "leave out --secure to use it")
                + f", or choose another --state-dir (or wipe it: delayq dev down --wipe --state-dir {self.state_dir})")
        if self.kafka_port is None:
            self.kafka_port = recorded.kafka if recorded else (
                DEFAULT_SECURE_KAFKA_PORT if self.secure else DEFAULT_KAFKA_PORT)
        if self.zk_port is None:
            self.zk_port = recorded.zk if recorded else (DEFAULT_SECURE_ZK_PORT if self.secure else DEFAULT_ZK_PORT)
        if self.brokers is None:
            self.brokers = recorded.brokers if recorded else 1
        _check_brokers(self.brokers, bool(self.secure))
        _check_ports(self.ports)

    @property
    def folder(self) -> Path:
        assert self.state_dir is not None  # set by __post_init__
        return self.state_dir

    # -- addresses -------------------------------------------------------

    @property
    def ports(self) -> Ports:
        assert self.kafka_port is not None and self.zk_port is not None and self.brokers  # set by __post_init__
        return Ports(self.kafka_port, self.zk_port, self.brokers)

    @property
    def kafka_nodes(self) -> tuple[KafkaNode, ...]:
        return kafka_nodes(self.ports)

    @property
    def services(self) -> tuple[str, ...]:
        """Every service's name, in the order ``up`` starts them: ZooKeeper, controllers, brokers, then the Spark
        master and workers (see :attr:`spark_services`)."""
        return (*self.kafka_services, *self.spark_services)

    @property
    def kafka_services(self) -> tuple[str, ...]:
        """ZooKeeper's and the Kafka processes' names, in the order ``up`` starts them."""
        return ("zookeeper", *(node.name for node in self.kafka_nodes))

    @property
    def spark_ports(self) -> SparkPorts | None:
        """The Spark ports ``up`` chose for this stack, else those recorded in its folder; None: no Spark ran here."""
        return self._spark or recorded_spark_ports(self.folder)

    @property
    def spark_services(self) -> tuple[str, ...]:
        """The Spark master's and workers' names (of :attr:`spark_ports`); empty when no Spark ran here."""
        ports = self.spark_ports
        return ports.services if ports else ()

    @property
    def spark_master_url(self) -> str | None:
        """``spark://127.0.0.1:<port>`` while this stack's Spark master runs, else None."""
        ports = self.spark_ports
        return ports.master_url if ports and self._running(spark_cluster.MASTER) else None

    @property
    def broker_names(self) -> tuple[str, ...]:
        """The brokers' service names: ``kafka`` on a one-broker stack, else ``kafka-1`` .. ``kafka-N``."""
        return tuple(node.name for node in self.kafka_nodes if node.broker_port is not None)

    def kafka_node(self, name: str) -> KafkaNode:
        """The Kafka process named ``name`` (a broker's or a controller's service name).

        Raises:
            ValueError: ``name`` is not a Kafka process of this stack.
        """
        for node in self.kafka_nodes:
            if node.name == name:
                return node
        raise ValueError(f"{name!r} is not a Kafka process of this stack: choose one of "
                         + ", ".join(node.name for node in self.kafka_nodes))

    @property
    def bootstrap_servers(self) -> str:
        """Every broker's address: a client reaches the cluster while any one of them is up."""
        return ",".join(f"{HOST}:{port}" for port in self.ports.broker_ports)

    @property
    def zk_connect(self) -> str:
        return f"{HOST}:{self.ports.zk}"

    @property
    def controller_port(self) -> int:
        return self.ports.controller

    def recorded_ports(self) -> Ports | None:
        """The ports the last ``up`` in this state folder was asked for (None: no ``up`` ran here)."""
        return recorded_ports(self.folder)

    def env(self, user: str | None = None, *, zk_auth: bool = True) -> dict[str, str]:
        """The ``DELAYQ_*`` settings that reach this stack; on a secured one, as ``user`` (default: the admin).

        A secured stack's include the librdkafka security settings (``DELAYQ_KAFKA__*``) and,
        with ``zk_auth``, ZooKeeper's digest credentials (a node needs them, a producer does not). While the
        stack's Spark master runs, ``DELAYQ_SPARK_MASTER`` is its URL (where ``delayq reconcile`` runs the job).

        Raises:
            StackError: ``user`` was never created on this stack (``delayq dev user NAME``).
        """
        self._check_ports_match_running()
        found = self.settings_values(user, zk_auth=zk_auth)
        env = {"DELAYQ_BOOTSTRAP_SERVERS": found["bootstrap_servers"], "DELAYQ_ZK_CONNECT": found["zk_connect"]}
        if "spark_master" in found:
            env["DELAYQ_SPARK_MASTER"] = found["spark_master"]
        for key, value in found.get("kafka", {}).items():
            env["DELAYQ_KAFKA__" + key.upper().replace(".", "_")] = value
        if "zk_auth" in found:
            env["DELAYQ_ZK_AUTH"] = found["zk_auth"]
        return env

    def settings_values(self, user: str | None = None, *, zk_auth: bool = True) -> dict:
        """``Settings`` fields reaching this stack as ``user`` (default: the admin): what :meth:`env` exports.

        Raises:
            StackError: ``user`` was never created on this stack (``delayq dev user NAME``).
        """
        found: dict = {"bootstrap_servers": self.bootstrap_servers, "zk_connect": self.zk_connect}
        if self.spark_master_url:
            found["spark_master"] = self.spark_master_url
        if not self.secure:
            return found
        stored = self._secrets()
        password = stored.admin_password if user in (None, security.ADMIN) else stored.users.get(user or "")
        if password is None:
            raise StackError(f"no user {user!r} on the secured stack in {self.folder}: create it with "
                             f"delayq dev user {user} --state-dir {self.folder}")
        found["kafka"] = security.client_conf(self.folder, user or security.ADMIN, password)
        if zk_auth:
            found["zk_auth"] = stored.zk_auth
        return found

    def client_conf(self, user: str | None = None) -> dict[str, str]:
        """librdkafka settings (bootstrap.servers included) for ``user`` (default: the admin) of this stack."""
        found = self.settings_values(user, zk_auth=False)
        return {"bootstrap.servers": found["bootstrap_servers"], **found.get("kafka", {})}

    def add_user(self, name: str) -> str:
        """Create SCRAM user ``name`` on this secured stack (again, with the same password, if it exists).

        Returns:
            its password.

        Raises:
            StackError: the stack is not secured, ``name`` is reserved or malformed, or the broker refused.
        """
        if not self.secure:
            raise StackError(f"the dev stack in {self.folder} is not secured, and has no users: start a secured "
                             "one with delayq dev up --secure")
        security.check_user_name(name)
        stored = self._secrets()
        password = stored.users.get(name) or security.new_password()
        security.upsert_scram_user(self.bootstrap_servers, self.client_conf(), name, password)
        if stored.users.get(name) != password:
            stored.users[name] = password
            stored.save(self.folder)
        return password

    def _secrets(self) -> security.Secrets:
        stored = security.Secrets.load(self.folder)
        if stored is None:
            raise StackError(f"the secured stack in {self.folder} has no credentials yet: start it with "
                             f"delayq dev up --secure --state-dir {self.folder}")
        return stored

    # -- lifecycle -------------------------------------------------------

    def up(self, *, say=print) -> list[str]:
        """Start whatever is not running; return the names of the services this call started.

        On failure (or Ctrl-C) it stops the services it started, so nothing half-started
        is left for the next ``up``.

        Raises:
            StackError: Java or Maven is missing, a download failed, a port is taken by
                something else, or a service did not answer in time (with its log's last error).
        """
        java = java_executable()
        self._check_ports_match_running()
        if self.spark_workers:
            self._spark = self._choose_spark_ports()
        wanted = (*self.kafka_services, *(self.spark_services if self.spark_workers else ()))
        missing = [name for name in wanted if not self._running(name)]
        # What can be checked first is: a taken port or damaged storage fails the call before anything starts.
        for name in missing:
            self._preflight(name)
        if missing:
            self.record_ports()
        started: list[str] = []
        try:
            for name in missing:
                if name.startswith(spark_cluster.WORKER_PREFIX) and spark_cluster.MASTER in started[-1:]:
                    # A worker that finds no master tries again only seconds later: the master answers first.
                    self._wait(spark_cluster.MASTER, self._probe(spark_cluster.MASTER),
                               time.monotonic() + self.start_timeout_s)
                self._launch(name, java, say)
                started.append(name)
            deadline = time.monotonic() + self.start_timeout_s
            for name in wanted:
                self._wait(name, self._probe(name), deadline)
        except BaseException:
            self.down(tuple(reversed(started)))
            raise
        return started

    def start(self, name: str, *, say=print) -> bool:
        """Start one service (one of :attr:`services`) unless it runs; return when it answers.

        What a chaos test needs after :meth:`kill`; :meth:`up` starts them all. On failure it
        stops the service if this call started it.

        Returns:
            True if this call started it, False if it was running already.

        Raises:
            ValueError: ``name`` is not one of :attr:`services`.
            StackError: as :meth:`up`.
        """
        self._check_service(name)
        self._check_ports_match_running()
        started = not self._running(name)
        try:
            if started:
                java = java_executable()
                self._preflight(name)
                self.record_ports()
                self._launch(name, java, say)
            self._wait(name, self._probe(name), time.monotonic() + self.start_timeout_s)
        except BaseException:
            if started:
                self.down((name,))
            raise
        return started

    def kill(self, name: str, sig: int = signal.SIGKILL, timeout_s: float = 30.0) -> bool:
        """Send ``sig`` to the process group of the service ``up`` started: a crash, by default.

        After SIGKILL (or SIGTERM) this returns once the process is gone, so a
        :meth:`start` right after finds its ports free. The pid file stays, so
        :meth:`status` shows the service as stopped rather than unknown.

        Returns:
            True if the service was running and got the signal, False if it was not running.

        Raises:
            ValueError: ``name`` is not one of :attr:`services`.
            StackError: it was still alive ``timeout_s`` after a SIGKILL or SIGTERM.
        """
        self._check_service(name)
        pid = self._pid(name)
        if pid is None or not self._is_ours(name, pid):
            return False
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return False
        if sig in (signal.SIGKILL, signal.SIGTERM) and not _wait_gone(pid, timeout_s):
            raise StackError(f"{name} (pid {pid}) was still alive {timeout_s:.0f}s after signal {sig}: "
                             f"stop it with kill -9 {pid}")
        return True

    def down(self, services: tuple[str, ...] | None = None, timeout_s: float = 30.0) -> list[str]:
        """Stop the processes ``up`` started (by pid file), all of them by default; return the names of those stopped.

        Brokers stop first (each moves its leaders away while the controllers still run), then
        the controllers, then ZooKeeper. A pid file whose process is gone, or is not the one
        ``up`` started (a reused pid), is removed and nothing is signalled.
        """
        stopped = []
        for name in services if services is not None else self.stopping_order:
            pid = self._pid(name)
            if pid is not None and self._is_ours(name, pid):
                _terminate(pid, timeout_s)
                stopped.append(name)
            self._pid_file(name).unlink(missing_ok=True)
        return stopped

    @property
    def stopping_order(self) -> tuple[str, ...]:
        """What ``down`` stops by default, in order: this stack's services and, when it was started with another
        broker count, that stack's; Spark's workers and master first (a worker's executors may be reading Kafka),
        brokers next, then controllers, then ZooKeeper (a ``down --brokers 1`` of a three-broker stack still stops
        it all)."""
        recorded = self.recorded_ports()
        names = {*self.services, *(("zookeeper", *(n.name for n in kafka_nodes(recorded))) if recorded else ())}
        rank = {spark_cluster.WORKER_PREFIX: 0, spark_cluster.MASTER: 1, "kafka": 2, "controller": 3, "zookeeper": 4}

        def order(name: str) -> tuple[int, int, str]:
            kind = next(prefix for prefix in rank if name.startswith(prefix))
            return rank[kind], int(name.rpartition("-")[2]) if name[-1].isdigit() else 0, name

        return tuple(sorted(names, key=order))

    def status(self) -> list[ServiceStatus]:
        from .runtime import KAFKA_VERSION, ZOOKEEPER_VERSION

        self._check_ports_match_running()
        result = []
        nodes = sorted(self.kafka_nodes, key=lambda node: node.broker_port is None)  # brokers first
        for name, version, address, probe in (
            *((node.name, KAFKA_VERSION, node.address, self._probe(node.name)) for node in nodes),
            ("zookeeper", ZOOKEEPER_VERSION, self.zk_connect, self._zookeeper_answers),
            # Spark, while it was started and not stopped (a pid file): an optional part, not a stopped service.
            *((name, spark_cluster.spark_version(), self._address(name), self._probe(name))
              for name in self.spark_services if self._pid(name) is not None),
        ):
            pid = self._pid(name)
            running = pid is not None and self._is_ours(name, pid)
            result.append(
                ServiceStatus(
                    name, version, address, pid if running else None, running,
                    running and probe(), self._log_file(name),
                )
            )
        return result

    def wipe(self) -> None:
        """Stop every service and delete their data (a fresh cluster on next ``up``)."""
        self.down()
        shutil.rmtree(self.folder, ignore_errors=True)

    def _launch(self, name: str, java: str, say) -> None:
        if name == "zookeeper":
            self._start_zookeeper(java, ensure_runtime(ZOOKEEPER, say=say))
        elif is_spark_service(name):
            self._start_spark(name)
        else:
            self._start_kafka(self.kafka_node(name), java, ensure_runtime(KAFKA, say=say))

    def _probe(self, name: str) -> Callable[[], bool]:
        if name == "zookeeper":
            return self._zookeeper_answers
        if is_spark_service(name):
            return self._spark_probe(name)
        node = self.kafka_node(name)
        if node.broker_port is None:
            # A dedicated controller serves no client; the brokers, which need its quorum, answer for it.
            return lambda: _port_open(node.controller_port or 0)
        return lambda: self._broker_answers(node)

    def _check_service(self, name: str) -> None:
        if name not in self.services:
            raise ValueError(f"service {name!r} is not part of the stack: choose one of {', '.join(self.services)}")

    def _address(self, name: str) -> str:
        """Where service ``name`` answers: ZooKeeper's and Kafka's client address, the Spark master's URL, a Spark
        worker's web UI."""
        if name == "zookeeper":
            return self.zk_connect
        if is_spark_service(name):
            ports = self.spark_ports
            assert ports is not None  # a Spark service's name comes from its ports
            return ports.master_url if name == spark_cluster.MASTER else f"http://{HOST}:{ports.ui_port(name)}"
        return self.kafka_node(name).address

    # -- ports -----------------------------------------------------------

    def record_ports(self) -> None:
        """Write this stack's ports, broker count and security to its state folder (``up`` does, before it starts
        anything): a later stack of this folder made without them uses them (:meth:`recorded_ports`)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        record = self.folder / RECORD
        scratch = record.with_suffix(".tmp")
        found: dict[str, object] = {"kafka_port": self.ports.kafka, "zk_port": self.ports.zk,
                                    "brokers": self.ports.brokers, "secure": bool(self.secure)}
        # Spark's ports stay recorded when an ``up`` without Spark writes the record: the next ``up --spark``
        # takes them again, and ``down`` still finds a Spark that runs.
        spark = self.spark_ports
        if spark is not None:
            found["spark"] = spark.as_record()
        scratch.write_text(json.dumps(found) + "\n")
        scratch.replace(record)

    def _check_ports_match_running(self) -> None:
        """A running service keeps its ports: asking this stack for others is a mistake, said as such."""
        recorded = self.recorded_ports()
        if recorded is None:
            return
        kafka_running = any(self._running(node.name) for node in kafka_nodes(recorded))
        for name, asked, has, option, running in (
                ("kafka", self.ports.kafka, recorded.kafka, "--kafka-port", kafka_running),
                ("zookeeper", self.ports.zk, recorded.zk, "--zk-port", self._running("zookeeper"))):
            if asked != has and running:
                raise StackError(
                    f"the {name} of the dev stack in {self.folder} runs on port {has}, not {asked}: "
                    f"leave out {option} to use it, or stop it first (delayq dev down --state-dir {self.folder})"
                )
        if recorded.brokers != self.ports.brokers:
            formatted = [node.name for node in kafka_nodes(recorded)
                         if (self.folder / node.name / "data" / "meta.properties").exists()]
            if kafka_running or formatted:
                state = "runs" if kafka_running else "has the data of"
                raise StackError(
                    f"the dev stack in {self.folder} {state} {_brokers(recorded.brokers)}, not {self.ports.brokers}: "
                    f"leave out --brokers to use it, or wipe it (delayq dev down --wipe --state-dir {self.folder}; "
                    f"every topic is lost) and start it with --brokers {self.ports.brokers}")

    def _choose_spark_ports(self) -> SparkPorts:
        """Spark's ports for ``up``: the recorded ones while their service runs on them or they are free, else free
        ones drawn anew.

        Raises:
            StackError: more Spark workers run than ``spark_workers`` asks for.
        """
        recorded = recorded_spark_ports(self.folder)
        if recorded is not None:
            extra = [name for name in recorded.services[1 + self.spark_workers:] if self._running(name)]
            if extra:
                raise StackError(
                    f"the dev stack in {self.folder} runs {recorded.workers} Spark workers, not {self.spark_workers}: "
                    f"leave out --spark-workers to use them, or stop Spark first (delayq dev down --spark "
                    f"--state-dir {self.folder})")
        return spark_cluster.choose_ports(
            self.spark_workers, recorded, keep=lambda name, port: self._running(name) or spark_cluster.port_free(port),
            draw=spark_cluster.free_port)

    def _preflight(self, name: str) -> None:
        """Refuse to start ``name`` on a taken port, or Kafka on storage it would refuse."""
        if is_spark_service(name):
            return  # its ports were chosen free just now (_choose_spark_ports)
        if name == "zookeeper":
            self._check_port_free("zookeeper", self.ports.zk, "--zk-port")
            return
        node = self.kafka_node(name)
        first = self.ports.kafka
        if node.broker_port is not None:
            self._check_port_free(name if node.broker_port == first else f"{name} (the Kafka port + "
                                  f"{node.broker_port - first})", node.broker_port, "--kafka-port")
        if node.controller_port is not None:
            what = "the kafka controller" if node.broker_port is not None else name
            self._check_port_free(f"{what} (the Kafka port + {node.controller_port - first})",
                                  node.controller_port, "--kafka-port")
        meta = self.folder / name / "data" / "meta.properties"
        if meta.exists():
            self._check_meta_properties(meta, node)

    def _check_port_free(self, name: str, port: int, option: str) -> None:
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((HOST, port))
            except OSError:
                raise StackError(
                    f"port {port} on {HOST}, wanted by {name}, is taken by a process this stack did not "
                    f"start: stop that process, or choose another port ({option})"
                ) from None

    # -- ZooKeeper -------------------------------------------------------

    def _start_zookeeper(self, java: str, libs: Path) -> None:
        home = self._home("zookeeper")
        (home / "data").mkdir(parents=True, exist_ok=True)
        # tickTime 500 ms lets clients ask for session timeouts down to 1 s (2 ticks),
        # which the failover tests and a fast-failover production setting both want.
        (home / "zoo.cfg").write_text(
            f"tickTime=500\ninitLimit=10\nsyncLimit=5\n"
            f"dataDir={home / 'data'}\nclientPort={self.ports.zk}\nclientPortAddress={HOST}\n"
            "maxSessionTimeout=60000\nadmin.enableServer=false\n"
            "4lw.commands.whitelist=ruok,srvr,stat,mntr\nmaxClientCnxns=0\n"
            "autopurge.snapRetainCount=3\nautopurge.purgeInterval=1\n"
            # No fsync per write: a process killed by a fault test loses nothing the kernel holds, and on a busy
            # disk (three brokers and three controllers flushing as a broker dies) one fsync took 2.4 s, stalling
            # every session's pings queued behind it until the nodes' ZooKeeper connections dropped.
            "forceSync=no\n"
        )
        log = self._log_file("zookeeper")
        (home / "logback.xml").write_text(
            '<configuration><appender name="FILE" class="ch.qos.logback.core.rolling.RollingFileAppender">'
            f"<file>{log}</file>"
            '<rollingPolicy class="ch.qos.logback.core.rolling.FixedWindowRollingPolicy">'
            f"<fileNamePattern>{log}.%i</fileNamePattern><minIndex>1</minIndex><maxIndex>{LOG_FILES_KEPT}</maxIndex>"
            '</rollingPolicy><triggeringPolicy class="ch.qos.logback.core.rolling.SizeBasedTriggeringPolicy">'
            f"<maxFileSize>{LOG_FILE_MB}MB</maxFileSize></triggeringPolicy>"
            "<encoder><pattern>%d{ISO8601} %-5level [%thread] %logger{36} - %msg%n</pattern></encoder>"
            '</appender><root level="INFO"><appender-ref ref="FILE"/></root></configuration>\n'
        )
        self._spawn(
            "zookeeper",
            [java, "-Xms64m", "-Xmx256m", f"-Dlogback.configurationFile={home / 'logback.xml'}",
             "-Dzookeeper.admin.enableServer=false", "-cp", f"{libs}/*",
             "org.apache.zookeeper.server.quorum.QuorumPeerMain", str(self._config_file("zookeeper"))],
        )

    def _zookeeper_answers(self) -> bool:
        try:
            with socket.create_connection((HOST, self.ports.zk), timeout=2) as sock:
                sock.sendall(b"ruok")
                if sock.recv(16) != b"imok":
                    return False
        except OSError:
            return False
        # "imok" only says the process is up; a session says it serves clients.
        from kazoo.client import KazooClient

        client = KazooClient(hosts=self.zk_connect, timeout=3, logger=_QUIET)
        try:
            client.start(timeout=3)
            client.get_children("/")
            return True
        except Exception:
            return False
        finally:
            client.stop()
            client.close()

    # -- Kafka -----------------------------------------------------------

    def _start_kafka(self, node: KafkaNode, java: str, libs: Path) -> None:
        home = self._home(node.name)
        data = home / "data"
        config = self._config_file(node.name)
        if self.secure and (data / "meta.properties").exists() and security.Secrets.load(self.folder) is None:
            raise StackError(f"the secured stack in {self.folder} has Kafka data but lost its credentials "
                             f"({security.Secrets.path(self.folder)}): wipe it (delayq dev down --wipe --secure "
                             f"--state-dir {self.folder}) and start it again")
        if self.secure:
            security.ensure_certificates(self.folder, java, security.Secrets.load_or_create(self.folder).store_password)
        # Private: a secured broker's settings hold its passwords.
        fd = os.open(config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(self.kafka_properties(node, data))
        log = self._log_file(node.name)
        (home / "log4j2.properties").write_text(log4j2_properties(log) + (
            "logger.kafka.name = kafka\nlogger.kafka.level = INFO\n"
            "logger.request.name = kafka.request.logger\nlogger.request.level = WARN\n"
        ))
        # A dedicated controller holds only the cluster's metadata, in a small heap a single-threaded collector
        # serves without taking cores from the brokers.
        gc = (["-Xms256m", "-Xmx1g", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20"] if node.broker_port is not None
              else ["-Xms64m", "-Xmx256m", "-XX:+UseSerialGC"])
        if len(self.kafka_nodes) > 1:
            # Seven JVMs on a small box: the quick compiler alone costs a restarting broker a fraction of the CPU
            # the optimising one takes in its first minute, which starved everything else on 2 cores (ZooKeeper
            # sessions of the nodes dropped while a killed broker came back).
            gc.append("-XX:TieredStopAtLevel=1")
        jvm = [java, *gc,
               "-Djava.awt.headless=true", f"-Dlog4j2.configurationFile={home / 'log4j2.properties'}",
               f"-Dkafka.logs.dir={home}", "-cp", f"{libs}/*"]
        if not (data / "meta.properties").exists():
            self._format_kafka_storage(node, jvm, config, data)
        self._spawn(node.name, [*jvm, "kafka.Kafka", str(config)])

    def _format_kafka_storage(self, node: KafkaNode, jvm: list[str], config: Path, data: Path) -> None:
        """Kafka's own StorageTool writes meta.properties and the bootstrap checkpoint into ``data``.

        It writes meta.properties last, so a folder without it holds at most what an
        interrupted format left: cleared first, and again if this format fails. A node formatted
        while others of the stack have data (a wiped broker) joins their cluster id.
        """
        shutil.rmtree(data, ignore_errors=True)
        data.mkdir(parents=True)
        cluster_id = self._existing_cluster_id() or kafka_cluster_id(self.draw_uuid)
        try:
            fmt = subprocess.run(
                [*jvm, "kafka.tools.StorageTool", "format", "--cluster-id", cluster_id,
                 "--config", str(config), "--ignore-formatted",
                 *(security.scram_bootstrap(self._secrets()) if self.secure and node.controller_port else [])],
                capture_output=True, text=True,
            )
        except BaseException:
            shutil.rmtree(data, ignore_errors=True)
            raise
        if fmt.returncode != 0 or not (data / "meta.properties").exists():
            shutil.rmtree(data, ignore_errors=True)
            said = telling_line((fmt.stdout + fmt.stderr).splitlines()) or "nothing"
            raise StackError(
                f"Kafka's StorageTool could not format {data} (exit {fmt.returncode}, cluster id {cluster_id}); "
                f"it said: {said}; fix that and run delayq dev up --state-dir {self.folder} again"
            )

    def _existing_cluster_id(self) -> str | None:
        """The cluster id in another Kafka node's storage of this stack, if one has any."""
        for other in self.kafka_nodes:
            pairs = _read_properties(self.folder / other.name / "data" / "meta.properties")
            if (pairs or {}).get("cluster.id", "").strip():
                return pairs["cluster.id"].strip()  # type: ignore[index]
        return None

    def _check_meta_properties(self, meta: Path, node: KafkaNode) -> None:
        """Refuse, in one line, a log folder Kafka would refuse with a stack trace."""
        try:
            pairs = dict(line.split("=", 1) for line in meta.read_text(errors="replace").splitlines()
                         if "=" in line and not line.startswith("#"))
        except OSError as err:
            pairs, problem = {}, f"cannot be read ({err.strerror})"
        else:
            problem = ""
        others = {other.name: _read_properties(self.folder / other.name / "data" / "meta.properties")
                  for other in self.kafka_nodes if other != node}
        cluster_ids = {name: (pairs_ or {}).get("cluster.id", "").strip() for name, pairs_ in others.items()}
        if not problem:
            if not pairs.get("cluster.id", "").strip():
                problem = "has no cluster.id"
            elif pairs.get("node.id", "").strip() != str(node.node_id):
                problem = f"names node.id {pairs.get('node.id', '(none)').strip()!r}, not '{node.node_id}'"
            else:
                strangers = [name for name, cid in cluster_ids.items() if cid and cid != pairs["cluster.id"].strip()]
                if strangers:
                    problem = f"names cluster.id {pairs['cluster.id'].strip()}, not {strangers[0]}'s"
        if problem and len(self.kafka_nodes) > 1:
            raise StackError(
                f"Kafka's storage in {meta.parent} is damaged: {meta} {problem}; delete that folder (the node copies "
                f"its data back from the others) and run delayq dev up --state-dir {self.folder} again")
        if problem:
            raise StackError(
                f"Kafka's storage in {meta.parent} is damaged: {meta} {problem}; wipe the stack's data "
                f"(delayq dev down --wipe --state-dir {self.folder}; every topic is lost) and run up again"
            )

    def kafka_properties(self, node: KafkaNode, data: Path) -> str:
        """The ``server.properties`` of Kafka process ``node`` keeping its log in ``data``: its roles, listeners,
        the controller quorum, and the replication of internal topics for this stack's broker count."""
        client, controller = (security.PROTOCOL, "SASL_PLAINTEXT") if self.secure else ("PLAINTEXT", "PLAINTEXT")
        voters = ",".join(f"{other.node_id}@{HOST}:{other.controller_port}"
                          for other in self.kafka_nodes if other.controller_port is not None)
        listeners = [f"{kind}://{HOST}:{port}" for kind, port in ((client, node.broker_port),
                                                                   ("CONTROLLER", node.controller_port)) if port]
        settings = {
            "process.roles": node.roles,
            "node.id": str(node.node_id),
            "controller.quorum.voters": voters,
            "listeners": ",".join(listeners),
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": f"{client}:{client},CONTROLLER:{controller}",
            "log.dirs": str(data),
        }
        factor, min_isr = internal_replication(self.ports.brokers)
        # On every node, controllers included: with Eligible Leader Replicas (on for clusters made since Kafka
        # 4.1) the active controller records the cluster's min.insync.replicas from its own settings.
        settings["min.insync.replicas"] = str(min_isr)
        if len(self.kafka_nodes) > 1:
            # Three controllers on a shared laptop or CI box: seconds of CPU starvation (seven JVMs, the nodes, the
            # traffic) must not read as a dead leader. Kafka's 2 s fetch timeout made the quorum elect leader
            # after leader in the middle of a broker fault, each new one activating slowly, and the dead broker
            # was fenced 21 s after it died instead of 9.
            settings["controller.quorum.fetch.timeout.ms"] = "8000"
            settings["controller.quorum.election.timeout.ms"] = "2000"
        else:
            # One process is both the broker and its controller. Frozen past Kafka's 9 s broker session (a long GC
            # pause, the soak's kafka_pause), it woke up and its controller fenced its own broker before the
            # broker's next heartbeat: every partition was leaderless for a moment, and the transaction
            # coordinator dropped the commit markers of those partitions (kafka-4.3.1: "Couldn't find leader
            # endpoint ... likely deleted already"), leaving committed records open for good (docs/DESIGN.md,
            # "Transactions Kafka leaves open for good"). There is no other broker to lead, so fencing the only
            # one never helps a client; a process that really dies takes its controller with it.
            settings["broker.session.timeout.ms"] = str(LONE_BROKER_SESSION_MS)
        if node.broker_port is not None:
            settings.update({
                "advertised.listeners": f"{client}://{HOST}:{node.broker_port}",
                "inter.broker.listener.name": client,
                "num.partitions": "1",
                # The internal topics, and topics created without settings, replicated as production runs
                # them: factor min(N, 3), min ISR one less from three brokers on (see internal_replication).
                "default.replication.factor": str(factor),
                "offsets.topic.replication.factor": str(factor),
                "offsets.topic.num.partitions": "4",
                "transaction.state.log.replication.factor": str(factor),
                "transaction.state.log.min.isr": str(min_isr),
                "transaction.state.log.num.partitions": "4",
                "share.coordinator.state.topic.replication.factor": str(factor),
                "share.coordinator.state.topic.min.isr": str(min_isr),
                "group.initial.rebalance.delay.ms": "0",
                # auto.create.topics.enable stays at Kafka's default (true), as on most users' brokers:
                # delivery must dead-letter a missing target topic without creating it.
                # Compaction runs soon after a segment rolls, so tests can watch it.
                "log.cleaner.backoff.ms": "1000",
            })
        if self.secure:
            settings.update(security.kafka_properties(self.folder, self._secrets()))
        return "".join(f"{k}={v}\n" for k, v in settings.items())

    def _broker_answers(self, node: KafkaNode) -> bool:
        """True once broker ``node`` serves metadata listing it (registered with, and unfenced by, the controllers)."""
        from confluent_kafka.admin import AdminClient

        if not _port_open(node.broker_port or 0):
            return False
        try:
            # log_level 0: a broker still starting is expected here, not worth librdkafka's stderr noise.
            admin = AdminClient({**self.client_conf(), "bootstrap.servers": node.address,
                                 "socket.timeout.ms": 3000, "log_level": 0})
            metadata = admin.list_topics(timeout=3)
            return node.node_id in metadata.brokers
        except Exception:
            return False

    # -- Spark -----------------------------------------------------------

    def _start_spark(self, name: str) -> None:
        """Start the Spark master or a worker with pyspark's ``spark-class`` (dev/spark.py has its command lines)."""
        ports = self.spark_ports
        assert ports is not None  # up chose them before starting any Spark service
        spark_home = spark_cluster.spark_home()
        home = self._home(name)
        log4j = home / "log4j2.properties"
        log4j.write_text(log4j2_properties(self._log_file(name)))
        properties = self._config_file(name)
        if name == spark_cluster.MASTER:
            properties.write_text(spark_cluster.master_properties())
            argv = spark_cluster.master_argv(spark_home, ports, properties)
        else:
            properties.write_text(spark_cluster.worker_properties())
            work = home / "work"
            work.mkdir(exist_ok=True)
            argv = spark_cluster.worker_argv(spark_home, ports, spark_cluster.worker_index(name), properties, work,
                                             cores=spark_cluster.worker_cores(ports.workers))
        self._spawn(name, argv, env=spark_cluster.daemon_env(os.environ, home, log4j))

    def _spark_probe(self, name: str) -> Callable[[], bool]:
        """The master answers when its JSON says ALIVE; a worker, when the master's JSON lists it ALIVE."""
        ports = self.spark_ports
        assert ports is not None  # a Spark service's name comes from its ports
        if name == spark_cluster.MASTER:
            return lambda: spark_cluster.master_alive(spark_cluster.master_state(ports.master_ui))
        return lambda: spark_cluster.worker_registered(spark_cluster.master_state(ports.master_ui),
                                                       ports.ui_port(name))

    # -- processes -------------------------------------------------------

    def _home(self, name: str) -> Path:
        home = self.folder / name
        home.mkdir(parents=True, exist_ok=True)
        return home

    def _config_file(self, name: str) -> Path:
        """The file the service's JVM is started with: its last argument, and how :meth:`_is_ours` knows it."""
        if is_spark_service(name):
            return self.folder / name / "spark.properties"
        return self.folder / name / ("zoo.cfg" if name == "zookeeper" else "server.properties")

    def _pid_file(self, name: str) -> Path:
        return self.folder / name / f"{name}.pid"

    def _log_file(self, name: str) -> Path:
        """The service's log, written by its logging library, which rolls it (LOG_FILE_MB, LOG_FILES_KEPT)."""
        return self.folder / name / f"{name}.log"

    def _out_file(self, name: str) -> Path:
        """What the JVM itself prints (a class it cannot load, an out-of-memory), outside its logging library."""
        return self.folder / name / f"{name}.out"

    def _pid(self, name: str) -> int | None:
        try:
            return int(self._pid_file(name).read_text().strip())
        except (OSError, ValueError):
            return None

    def _is_ours(self, name: str, pid: int) -> bool:
        """True if ``pid`` is alive and is the JVM we started for ``name`` (not a reused pid)."""
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return False
        # This folder's config file, as a whole argument: another stack's folder may contain this one's path.
        return _alive(pid) and os.fsencode(self._config_file(name)) in argv

    def _running(self, name: str) -> bool:
        pid = self._pid(name)
        return pid is not None and self._is_ours(name, pid)

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        with open(self._out_file(name), "wb") as out:
            process = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, cwd=self._home(name), env=env,
            )
        try:
            self._pid_file(name).write_text(f"{process.pid}\n")
        except BaseException:
            _terminate(process.pid, 10)
            raise
        self._children[name] = process

    def _wait(self, name: str, probe, deadline: float) -> None:
        address = self._address(name)
        while time.monotonic() < deadline:
            child = self._children.get(name)
            if child is not None and child.pid != self._pid(name):
                child = None  # started again since, by someone else
            # A child of this object is asked directly (poll() also reaps it); anything else by pid file.
            gone = child.poll() is not None if child is not None else not self._running(name)
            if gone:
                raise StackError(
                    f"{name} exited while starting; its log {self._log_file(name)} says: {self._log_says(name)}; "
                    f"fix that and run delayq dev up --state-dir {self.folder} again"
                )
            if probe():
                return
            time.sleep(0.5)
        raise StackError(
            f"{name} did not answer on {address} within {self.start_timeout_s:g}s (its log "
            f"{self._log_file(name)} last says: {self._log_says(name)}); give it longer "
            f"(delayq dev up --timeout {max(180, int(self.start_timeout_s * 2))}) or read that log"
        )

    def _log_says(self, name: str, lines: int = 200) -> str:
        """The line that best says what went wrong: the last error of the log or of the JVM's own output, else
        the log's last line."""
        tails = []
        for path in (self._log_file(name), self._out_file(name)):
            try:
                tails.append(path.read_text(errors="replace").splitlines()[-lines:])
            except OSError:
                tails.append([])
        if not any(tails):
            return "nothing (no log written)"
        log, out = tails
        return telling_line(out + log) or "nothing"


# Probing a server that is still starting fails by design; kazoo would log every attempt.
_QUIET = logging.getLogger("delayq.dev.probe")
_QUIET.addHandler(logging.NullHandler())
_QUIET.propagate = False


def log4j2_properties(log: Path) -> str:
    """A log4j2 configuration writing INFO and above to ``log``, rolled at LOG_FILE_MB, LOG_FILES_KEPT kept.

    Kafka's and Spark's processes take it; Kafka adds its own loggers' levels after it.
    """
    return (
        "status = warn\nappender.file.type = RollingFile\nappender.file.name = FILE\n"
        f"appender.file.fileName = {log}\nappender.file.filePattern = {log}.%i\n"
        "appender.file.layout.type = PatternLayout\n"
        "appender.file.layout.pattern = [%d] %p %m (%c)%n\n"
        "appender.file.policies.type = Policies\n"
        "appender.file.policies.size.type = SizeBasedTriggeringPolicy\n"
        f"appender.file.policies.size.size = {LOG_FILE_MB}MB\n"
        f"appender.file.strategy.type = DefaultRolloverStrategy\nappender.file.strategy.max = {LOG_FILES_KEPT}\n"
        "rootLogger.level = INFO\nrootLogger.appenderRef.file.ref = FILE\n"
    )


def telling_line(lines: list[str], limit: int = 300) -> str:
    """The last line that reports an error (else the last non-blank one), shortened to fit in one line."""
    lines = [line.strip() for line in lines if line.strip()]
    errors = [line for line in lines
              if re.search(r"\b(ERROR|FATAL|SEVERE)\b|Exception|Error:|error:", line) and not line.startswith("at ")]
    line = (errors or lines or [""])[-1]
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _check_ports(ports: Ports) -> None:
    highest = 65535 - (ports.last_kafka_port - ports.kafka)
    if not 1 <= ports.kafka <= highest:
        raise StackError(f"Kafka port {ports.kafka} is out of range: choose one from 1 to {highest} "
                         f"(Kafka's {_brokers(ports.brokers)} and controllers listen on it and the next "
                         f"{ports.last_kafka_port - ports.kafka}) with --kafka-port")
    if not 1 <= ports.zk <= 65535:
        raise StackError(f"ZooKeeper port {ports.zk} is out of range: choose one from 1 to 65535 with --zk-port")
    if ports.kafka <= ports.zk <= ports.last_kafka_port:
        taken = (f"{ports.kafka} and {ports.controller} (client and controller)" if ports.brokers == 1
                 else f"{ports.kafka} to {ports.last_kafka_port} (brokers, then controllers)")
        raise StackError(f"ZooKeeper port {ports.zk} collides with Kafka's ports {taken}: choose other ports "
                         "(--kafka-port/--zk-port)")


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=1):
            return True
    except OSError:
        return False


def kafka_cluster_id(draw_uuid: Callable[[], uuid.UUID] | None = None) -> str:
    # Kafka wants 16 random bytes, base64url without padding (what `kafka-storage random-uuid` prints).
    # One id in 64 begins with "-", which StorageTool's argument parser takes for an option: draw again,
    # as Kafka's own Uuid.randomUuid() does.
    import base64

    draw = draw_uuid or uuid.uuid4
    while True:
        cluster_id = base64.urlsafe_b64encode(draw().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id
def _read_properties(path: Path) -> dict[str, str] | None:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))


def _brokers(count: int) -> str:
    return f"{count} broker" + ("" if count == 1 else "s")


def _check_brokers(brokers: int, secure: bool) -> None:
    if not 1 <= brokers <= MAX_BROKERS:
        raise StackError(f"a dev stack of {brokers} brokers is not possible: choose 1 to {MAX_BROKERS} with --brokers")
    if secure and brokers > 1:
        raise StackError(f"the secured dev stack runs one broker, not {brokers}: leave out --brokers with --secure, "
                         "or leave out --secure for a replicated plain stack")


def _alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie (dead, not yet reaped by its parent) counts as gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # The state follows the parenthesised command name, which may itself hold spaces or parentheses.
    return stat[stat.rindex(")") + 2:][:1] not in ("Z", "X")


def _wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        _reap(pid)
        if not _alive(pid):
            _reap(pid)
            return True
        time.sleep(0.05)
    return False


def _terminate(pid: int, timeout_s: float) -> None:
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    if _wait_gone(pid, timeout_s):
        return
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    _reap(pid)


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
