"""The embedded local stack: one real Apache Kafka (KRaft) and one real ZooKeeper on loopback.

Everything lives under one state folder::

    <state>/kafka/{server.properties, log4j2.properties, data/, kafka.log, kafka.pid}
    <state>/zookeeper/{zoo.cfg, logback.xml, data/, zookeeper.log, zookeeper.pid}

``up`` starts what is not running and returns when both services answer; ``down``
stops exactly the processes whose pid files ``up`` wrote, and is safe to repeat.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from .runtime import KAFKA, ZOOKEEPER, StackError, ensure_runtime, java_executable

DEFAULT_KAFKA_PORT = 9092
DEFAULT_ZK_PORT = 2181
HOST = "127.0.0.1"
# The stack's services, in the order `up` starts them.
SERVICES = ("zookeeper", "kafka")


def default_state_dir() -> Path:
    explicit = os.environ.get("DELAYQ_DEV_DIR")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(base) / "delayq" / "dev"


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


@dataclass
class DevStack:
    """One Kafka broker+controller and one ZooKeeper, started from cached jars.

    Example:
        >>> stack = DevStack()
        >>> stack.up()          # returns when both answer
        >>> stack.bootstrap_servers, stack.zk_connect
        ('127.0.0.1:9092', '127.0.0.1:2181')
        >>> stack.down()
    """

    state_dir: Path = field(default_factory=default_state_dir)
    kafka_port: int = DEFAULT_KAFKA_PORT
    zk_port: int = DEFAULT_ZK_PORT
    start_timeout_s: float = 90.0

    def __post_init__(self) -> None:
        self.state_dir = Path(self.state_dir).expanduser().resolve()

    # -- addresses -------------------------------------------------------

    @property
    def bootstrap_servers(self) -> str:
        return f"{HOST}:{self.kafka_port}"

    @property
    def zk_connect(self) -> str:
        return f"{HOST}:{self.zk_port}"

    @property
    def controller_port(self) -> int:
        return self.kafka_port + 1

    def env(self) -> dict[str, str]:
        return {"DELAYQ_BOOTSTRAP_SERVERS": self.bootstrap_servers, "DELAYQ_ZK_CONNECT": self.zk_connect}

    # -- lifecycle -------------------------------------------------------

    def up(self, *, say=print) -> list[str]:
        """Start whatever is not running; return the names of the services this call started.

        Raises:
            StackError: Java or Maven is missing, a download failed, a port is taken by
                something else, or a service did not answer in time (with its log's last lines).
        """
        java = java_executable()
        started: list[str] = []
        for name in SERVICES:
            if not self._running(name):
                self._launch(name, java, say)
                started.append(name)
        deadline = time.monotonic() + self.start_timeout_s
        for name in SERVICES:
            self._wait(name, self._probe(name), deadline)
        return started

    def start(self, name: str, *, say=print) -> bool:
        """Start one service (``"kafka"`` or ``"zookeeper"``) unless it runs; return when it answers.

        What a chaos test needs after :meth:`kill`; :meth:`up` starts both.

        Returns:
            True if this call started it, False if it was running already.

        Raises:
            ValueError: ``name`` is not one of :data:`SERVICES`.
            StackError: as :meth:`up`.
        """
        _check_service(name)
        started = not self._running(name)
        if started:
            self._launch(name, java_executable(), say)
        self._wait(name, self._probe(name), time.monotonic() + self.start_timeout_s)
        return started

    def kill(self, name: str, sig: int = signal.SIGKILL, timeout_s: float = 30.0) -> bool:
        """Send ``sig`` to the process group of the service ``up`` started: a crash, by default.

        After SIGKILL (or SIGTERM) this returns once the process is gone, so a
        :meth:`start` right after finds its ports free. The pid file stays, so
        :meth:`status` shows the service as stopped rather than unknown.

        Returns:
            True if the service was running and got the signal, False if it was not running.

        Raises:
            ValueError: ``name`` is not one of :data:`SERVICES`.
            StackError: it was still alive ``timeout_s`` after a SIGKILL or SIGTERM.
        """
        _check_service(name)
        pid = self._pid(name)
        if pid is None or not self._is_ours(name, pid):
            return False
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return False
        if sig in (signal.SIGKILL, signal.SIGTERM) and not _wait_gone(pid, timeout_s):
            raise StackError(f"{name} (pid {pid}) was still alive {timeout_s:.0f}s after signal {sig}")
        return True

    def down(self, services: tuple[str, ...] = ("kafka", "zookeeper"), timeout_s: float = 30.0) -> list[str]:
        """Stop the processes ``up`` started (by pid file); return the names of those stopped."""
        stopped = []
        for name in services:
            pid = self._pid(name)
            if pid is not None and self._is_ours(name, pid):
                _terminate(pid, timeout_s)
                stopped.append(name)
            self._pid_file(name).unlink(missing_ok=True)
        return stopped

    def status(self) -> list[ServiceStatus]:
        from .runtime import KAFKA_VERSION, ZOOKEEPER_VERSION

        result = []
        for name, version, address, probe in (
            ("kafka", KAFKA_VERSION, self.bootstrap_servers, self._kafka_answers),
            ("zookeeper", ZOOKEEPER_VERSION, self.zk_connect, self._zookeeper_answers),
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
        """Stop both services and delete their data (a fresh cluster on next ``up``)."""
        import shutil

        self.down()
        shutil.rmtree(self.state_dir, ignore_errors=True)

    def _launch(self, name: str, java: str, say) -> None:
        if name == "zookeeper":
            self._start_zookeeper(java, ensure_runtime(ZOOKEEPER, say=say))
        else:
            self._start_kafka(java, ensure_runtime(KAFKA, say=say))

    def _probe(self, name: str):
        return self._zookeeper_answers if name == "zookeeper" else self._kafka_answers

    # -- ZooKeeper -------------------------------------------------------

    def _start_zookeeper(self, java: str, libs: Path) -> None:
        home = self._home("zookeeper")
        (home / "data").mkdir(parents=True, exist_ok=True)
        self._check_port_free("zookeeper", self.zk_port)
        # tickTime 500 ms lets clients ask for session timeouts down to 1 s (2 ticks),
        # which the failover tests and a fast-failover production setting both want.
        (home / "zoo.cfg").write_text(
            f"tickTime=500\ninitLimit=10\nsyncLimit=5\n"
            f"dataDir={home / 'data'}\nclientPort={self.zk_port}\nclientPortAddress={HOST}\n"
            "maxSessionTimeout=60000\nadmin.enableServer=false\n"
            "4lw.commands.whitelist=ruok,srvr,stat,mntr\nmaxClientCnxns=0\n"
            "autopurge.snapRetainCount=3\nautopurge.purgeInterval=1\n"
        )
        (home / "logback.xml").write_text(
            '<configuration><appender name="OUT" class="ch.qos.logback.core.ConsoleAppender">'
            "<encoder><pattern>%d{ISO8601} %-5level [%thread] %logger{36} - %msg%n</pattern></encoder>"
            '</appender><root level="INFO"><appender-ref ref="OUT"/></root></configuration>\n'
        )
        self._spawn(
            "zookeeper",
            [java, "-Xms64m", "-Xmx256m", f"-Dlogback.configurationFile={home / 'logback.xml'}",
             "-Dzookeeper.admin.enableServer=false", "-cp", f"{libs}/*",
             "org.apache.zookeeper.server.quorum.QuorumPeerMain", str(home / "zoo.cfg")],
        )

    def _zookeeper_answers(self) -> bool:
        try:
            with socket.create_connection((HOST, self.zk_port), timeout=2) as sock:
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

    def _start_kafka(self, java: str, libs: Path) -> None:
        home = self._home("kafka")
        data = home / "data"
        data.mkdir(parents=True, exist_ok=True)
        self._check_port_free("kafka", self.kafka_port)
        self._check_port_free("kafka controller", self.controller_port)
        config = home / "server.properties"
        config.write_text(self._kafka_properties(data))
        (home / "log4j2.properties").write_text(
            "status = warn\nappender.out.type = Console\nappender.out.name = OUT\n"
            "appender.out.layout.type = PatternLayout\n"
            "appender.out.layout.pattern = [%d] %p %m (%c)%n\n"
            "rootLogger.level = INFO\nrootLogger.appenderRef.out.ref = OUT\n"
            "logger.kafka.name = kafka\nlogger.kafka.level = INFO\n"
            "logger.request.name = kafka.request.logger\nlogger.request.level = WARN\n"
        )
        jvm = [java, "-Xms256m", "-Xmx1g", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
               "-Djava.awt.headless=true", f"-Dlog4j2.configurationFile={home / 'log4j2.properties'}",
               f"-Dkafka.logs.dir={home}", "-cp", f"{libs}/*"]
        if not (data / "meta.properties").exists():
            # Kafka's own StorageTool writes meta.properties and the bootstrap checkpoint.
            cluster_id = _kafka_cluster_id()
            fmt = subprocess.run(
                [*jvm, "kafka.tools.StorageTool", "format", "--cluster-id", cluster_id,
                 "--config", str(config), "--ignore-formatted"],
                capture_output=True, text=True,
            )
            if fmt.returncode != 0:
                raise StackError(
                    f"Kafka's StorageTool could not format {data} (exit {fmt.returncode}):\n"
                    + "\n".join((fmt.stdout + fmt.stderr).strip().splitlines()[-10:])
                )
        self._spawn("kafka", [*jvm, "kafka.Kafka", str(config)])

    def _kafka_properties(self, data: Path) -> str:
        settings = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@{HOST}:{self.controller_port}",
            "listeners": f"PLAINTEXT://{HOST}:{self.kafka_port},CONTROLLER://{HOST}:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{HOST}:{self.kafka_port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(data),
            "num.partitions": "1",
            # One broker: every internal topic has one replica.
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "4",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            # A missing target topic must stay missing, as in production: delivery dead-letters it.
            "auto.create.topics.enable": "false",
            # Compaction runs soon after a segment rolls, so tests can watch it.
            "log.cleaner.backoff.ms": "1000",
        }
        return "".join(f"{k}={v}\n" for k, v in settings.items())

    def _kafka_answers(self) -> bool:
        from confluent_kafka.admin import AdminClient

        if not _port_open(self.kafka_port):
            return False
        try:
            # log_level 0: a broker still starting is expected here, not worth librdkafka's stderr noise.
            admin = AdminClient({"bootstrap.servers": self.bootstrap_servers, "socket.timeout.ms": 3000,
                                 "log_level": 0})
            metadata = admin.list_topics(timeout=3)
            return bool(metadata.brokers)
        except Exception:
            return False

    # -- processes -------------------------------------------------------

    def _home(self, name: str) -> Path:
        home = self.state_dir / name
        home.mkdir(parents=True, exist_ok=True)
        return home

    def _pid_file(self, name: str) -> Path:
        return self.state_dir / name / f"{name}.pid"

    def _log_file(self, name: str) -> Path:
        return self.state_dir / name / f"{name}.log"

    def _pid(self, name: str) -> int | None:
        try:
            return int(self._pid_file(name).read_text().strip())
        except (OSError, ValueError):
            return None

    def _is_ours(self, name: str, pid: int) -> bool:
        """True if ``pid`` is alive and is the JVM we started for ``name`` (not a reused pid)."""
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            return False
        return str(self.state_dir / name) in cmdline

    def _running(self, name: str) -> bool:
        pid = self._pid(name)
        return pid is not None and self._is_ours(name, pid)

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self._log_file(name), "ab")
        process = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, cwd=self._home(name),
        )
        log.close()
        self._pid_file(name).write_text(f"{process.pid}\n")

    def _check_port_free(self, name: str, port: int) -> None:
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((HOST, port))
            except OSError:
                raise StackError(
                    f"port {port} on {HOST}, wanted by {name}, is taken by a process this stack did not "
                    f"start: stop it, or choose other ports (delayq dev up --kafka-port/--zk-port)."
                ) from None

    def _wait(self, name: str, probe, deadline: float) -> None:
        while time.monotonic() < deadline:
            if not self._running(name):
                raise StackError(f"{name} exited while starting. Last lines of {self._log_file(name)}:\n"
                                 + self._log_tail(name))
            if probe():
                return
            time.sleep(0.5)
        raise StackError(
            f"{name} did not answer within {self.start_timeout_s:.0f}s. Last lines of "
            f"{self._log_file(name)}:\n" + self._log_tail(name)
        )

    def _log_tail(self, name: str, lines: int = 25) -> str:
        try:
            return "\n".join(self._log_file(name).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log written)"


# Probing a server that is still starting fails by design; kazoo would log every attempt.
_QUIET = logging.getLogger("delayq.dev.probe")
_QUIET.addHandler(logging.NullHandler())
_QUIET.propagate = False


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=1):
            return True
    except OSError:
        return False


def _kafka_cluster_id() -> str:
    # Kafka wants 16 random bytes, base64url without padding (what `kafka-storage random-uuid` prints).
    # One id in 64 begins with "-", which StorageTool's argument parser takes for an option: draw again.
    import base64

    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def _check_service(name: str) -> None:
    if name not in SERVICES:
        raise ValueError(f"service {name!r} is not part of the stack: choose one of {', '.join(SERVICES)}")


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
