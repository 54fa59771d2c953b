"""Nodes as local child processes (``delayq node``), for the demo, the benchmarks and the tests."""

from __future__ import annotations

import json
import logging
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from delayq.delay_service import ensure_topics
from delayq.delay_service.members import children, free_port
from delayq.dev import Ports
from delayq.election import connect_for
from delayq.settings import Settings

log = logging.getLogger("delayq.testing")


def free_stack_ports(brokers: int = 1) -> tuple[int, int]:
    """A Kafka port whose next ones are free too, and a ZooKeeper port, for a dev stack of ``brokers``.

    One broker: its port and its controller's (the next one); N >= 2: the brokers' N ports and the
    three controllers' after them.

    Raises:
        RuntimeError: no such ports were found.
    """
    span = Ports(kafka=0, zk=0, brokers=brokers).last_kafka_port + 1  # the brokers' ports, then the controllers'
    for _ in range(200):
        kafka, zk = free_ports(span), free_ports(1)
        if not kafka <= zk < kafka + span:
            return kafka, zk
    raise RuntimeError(f"found no {span} free consecutive loopback ports for a dev stack's Kafka")


def free_ports(count: int) -> int:
    """The first of ``count`` consecutive loopback ports free now, for servers that may restart on them.

    Drawn outside the range the kernel takes clients' local ports from (``ip_local_port_range``): a
    broker, ZooKeeper or node killed by a fault must find its port free when it restarts, and one in
    that range can meanwhile be some client's local port (seen twice: a broker's restart refused, its
    port taken by a connection of the clients retrying it; a node's return refused, its HTTP port
    taken). A node of member processes listens on ``count`` of them.

    Raises:
        RuntimeError: no such ports were found.
    """
    low, high = ephemeral_ports()
    ranges = [(start, end) for start, end in ((10_000, low), (high + 1, 65_536)) if end - start > count + 1]
    draw = random.SystemRandom()
    for _ in range(200):
        if ranges:
            start, end = draw.choice(ranges)
            first = draw.randrange(start, end - count)
        else:  # a kernel lending every port to clients: the best left is a port free now
            first = free_port()
        if first + count <= 65_536 and all(_port_free(first + i) for i in range(count)):
            return first
    raise RuntimeError(f"found no {count} free consecutive loopback ports")


def ephemeral_ports() -> tuple[int, int]:
    """The kernel's range of clients' local ports (Linux's default where it cannot be read)."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def _port_free(port: int) -> bool:
    try:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
    except OSError:
        return False
    return True


def free_server_port() -> int:
    """A port for one local server (a node's HTTP port, Redis): see free_ports, it may be killed and restarted on it."""
    return free_ports(1)


def child_processes(parent: int) -> list[int]:
    """Pids of ``parent``'s live children (zombies left out)."""
    alive = []
    for child in children(parent):
        try:
            if Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                alive.append(child)
        except OSError:
            continue
    return alive


def drop_cluster(settings: Settings) -> None:
    """Delete the cluster's buffer, dead-letter and ``<cluster>-*`` topics and its ZooKeeper folder (best effort).

    What the bench and the demo leave on a stack otherwise: a buffer of up to gigabytes per run.
    """
    admin = AdminClient(settings.kafka_conf())
    try:
        topics = [t for t in admin.list_topics(timeout=10).topics
                  if t in (settings.buffer_topic, settings.dead_letter_topic) or t.startswith(f"{settings.cluster}-")]
        for future in (admin.delete_topics(topics, operation_timeout=30).values() if topics else ()):
            future.result(60)
    except KafkaException as err:  # leftovers cost disk, not correctness
        log.warning("topics of %s not deleted: %s", settings.cluster, err)
    zk = connect_for(settings)
    try:
        zk.delete(settings.zk_root, recursive=True)
    except Exception as err:  # kazoo's NoNodeError and friends: same reasoning as above
        log.warning("ZooKeeper folder %s not deleted: %s", settings.zk_root, err)
    finally:
        zk.stop()
        zk.close()


class NodeError(RuntimeError):
    """A local node exited, did not get ready, or ignored SIGTERM; the message carries its log's tail."""


class InitError(RuntimeError):
    """``delayq init`` of a local cluster failed; the message carries its last lines."""


# What a node logs when it wipes a shard's store and reads the buffer again (delay_service/node.py).
STORE_REBUILT = "will be rebuilt from the buffer"


def init_cluster(settings: Settings, cwd: Path, python: str = sys.executable, timeout_s: float = 120.0) -> None:
    """Run ``python``'s ``delayq init`` for ``settings``' cluster: a release's interpreter makes the cluster as
    that release does (its layout; 0.1.0 records no feature level).

    ``cwd``: where it runs (made if missing); not a checkout of delayq, whose package ``python -m`` would
    import instead of the interpreter's own.

    Raises:
        InitError: it exited other than 0, or ran longer than ``timeout_s``.
    """
    cwd.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run([python, "-m", "delayq", "init"], env={**os.environ, **settings_env(settings)},
                              cwd=cwd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise InitError(f"{python} -m delayq init did not finish within {timeout_s:.0f}s") from None
    if done.returncode != 0:
        last = " / ".join((done.stderr or done.stdout).strip().splitlines()[-5:]) or "no output"
        raise InitError(f"{python} -m delayq init exited with {done.returncode}: {last}")


def reader_processes(parent: int) -> list[int]:
    """Pids of ``parent``'s children running the buffer reader (delayq.delay_service.reader), zombies left out."""
    found = []
    for child in child_processes(parent):
        try:
            if b"delayq.delay_service.reader" in Path(f"/proc/{child}/cmdline").read_bytes():
                found.append(child)
        except OSError:
            continue
    return found


_LABEL = re.compile(r'(\w+)="([^"]*)"')


def master_series(metrics: str) -> list[tuple[int, str, bool]]:
    """A node's ``delayq_is_master`` series in its ``/metrics`` text: (shard, member, mastered) each.

    A node has one for each shard it holds (0 or 1); a node of member processes
    (``DELAYQ_PROCESSES`` > 1) answers for its members, each series labelled with the
    member holding the shard (``member=""`` for a node of one process).
    """
    found = []
    for line in metrics.splitlines():
        if not line.startswith("delayq_is_master{"):
            continue
        labels_text, _, value = line[len("delayq_is_master{"):].rpartition("} ")
        labels = dict(_LABEL.findall(labels_text))
        if "shard" in labels:
            found.append((int(labels["shard"]), labels.get("member", ""), float(value) == 1))
    return found


def mastered_shards(metrics: str) -> tuple[int, ...]:
    """The shards a node's ``/metrics`` text says it masters (``delayq_is_master{shard="k"} 1.0``), in order."""
    return tuple(sorted(shard for shard, _, mastered in master_series(metrics) if mastered))


def master_members(metrics: str) -> dict[int, str]:
    """Shard -> the member process mastering it, by a node's ``/metrics`` text ("" on a node of one process)."""
    return {shard: member for shard, member, mastered in master_series(metrics) if mastered}


def settings_env(settings: Settings) -> dict[str, str]:
    env = {
        "DELAYQ_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "DELAYQ_ZK_CONNECT": settings.zk_connect,
        "DELAYQ_CLUSTER": settings.cluster,
        "DELAYQ_BUFFER_PARTITIONS": str(settings.buffer_partitions),
        "DELAYQ_SHARDS": str(settings.shards),
        "DELAYQ_REPLICAS": str(settings.replicas),
        "DELAYQ_ZK_SESSION_TIMEOUT_MS": str(settings.zk_session_timeout_ms),
        "DELAYQ_DELIVERY_MAX_ATTEMPTS": str(settings.delivery_max_attempts),
        "DELAYQ_DELIVERY_RETRY_BACKOFF_MS": str(settings.delivery_retry_backoff_ms),
    }
    if settings.processes != 1:
        env["DELAYQ_PROCESSES"] = str(settings.processes)
    if settings.dispatch_limits:
        env["DELAYQ_DISPATCH_LIMITS"] = json.dumps(
            {topic: limit.model_dump(exclude_none=True) for topic, limit in settings.dispatch_limits.items()})
    if settings.target_topics != ["*"]:
        env["DELAYQ_TARGET_TOPICS"] = ",".join(settings.target_topics)
    # A secured cluster's: librdkafka's security settings and ZooKeeper's credentials, as a node reads them.
    for key, value in settings.kafka_passthrough().items():
        env["DELAYQ_KAFKA__" + key.upper().replace(".", "_")] = value
    if settings.zk_credentials is not None:
        env["DELAYQ_ZK_AUTH"] = settings.zk_credentials
    return env


@dataclass
class NodeProcess:
    """One ``delayq node`` child process with its own data folder and HTTP port.

    ``python``: the interpreter whose delayq runs the node; another environment's (a release's, see
    delayq.release_env) runs that version on the same data folder and settings. ``console``: the node also
    serves the web console under /console on its HTTP port (DELAYQ_CONSOLE=true; :attr:`console_url`).
    """

    settings: Settings
    node_id: str
    data_dir: Path
    http_port: int = field(default_factory=free_server_port)
    process: subprocess.Popen | None = None
    python: str = sys.executable
    console: bool = False
    env: dict[str, str] = field(default_factory=dict)  # more of the node's settings (DELAYQ_...), this run only

    def start(self) -> NodeProcess:
        env = {**os.environ, **settings_env(self.settings), "DELAYQ_NODE_ID": self.node_id,
               "DELAYQ_DATA_DIR": str(self.data_dir), "DELAYQ_HTTP_PORT": str(self.http_port),
               "DELAYQ_HTTP_HOST": "127.0.0.1"}
        # Named only when on: a node of an earlier release (the upgrade tests run them) knows no such setting.
        env.pop("DELAYQ_CONSOLE", None)
        if self.console:
            env["DELAYQ_CONSOLE"] = "true"
        env.update(self.env)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log = open(self.data_dir.parent / f"{self.node_id}.log", "ab")  # noqa: SIM115 - the child's, kept open
        # Every run of the node appends to one log: this process's part starts here (own_log).
        self.log_start = self.log.tell()
        # Run in the node's own folder: `python -m` puts the working folder first on sys.path, and a release's
        # python started in this checkout would import this checkout's delayq instead of its own.
        self.process = subprocess.Popen([self.python, "-m", "delayq", "node"], env=env, cwd=self.data_dir.parent,
                                        stdout=self.log, stderr=subprocess.STDOUT)
        return self

    @property
    def running(self) -> subprocess.Popen:
        """The child process.

        Raises:
            NodeError: :meth:`start` has not been called.
        """
        if self.process is None:
            raise NodeError(f"node {self.node_id} was never started: call start() first")
        return self.process

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def console_url(self) -> str:
        """Where the node serves the web console (when started with ``console``)."""
        return f"{self.url}/console/"

    def get(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=2) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()

    def get_json(self, path: str) -> tuple[int, dict]:
        status, body = self.get(path)
        return status, json.loads(body)

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        process = self.running
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise NodeError(f"node {self.node_id} exited with {process.returncode}:\n{self.log_tail()}")
            try:
                if self.get("/readyz")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise NodeError(f"node {self.node_id} not ready after {timeout_s}s:\n{self.log_tail()}")

    def metric(self, name: str, **labels: str) -> float:
        """The sum of metric ``name`` over the series whose labels include ``labels``."""
        _, body = self.get("/metrics")
        total = 0.0
        wanted = [f'{label}="{value}"' for label, value in labels.items()]
        for line in body.decode().splitlines():
            if line.startswith(name) and (line[len(name)] in " {") and all(w in line for w in wanted):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def mastered(self) -> list[int]:
        """The shards this node says it masters now (its ``delayq_is_master{shard}`` series at 1)."""
        _, body = self.get("/metrics")
        return list(mastered_shards(body.decode()))

    def signal(self, sig: int) -> None:
        self.running.send_signal(sig)

    def stop(self, timeout_s: float = 60.0) -> int:
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else 0
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
            raise NodeError(f"node {self.node_id} ignored SIGTERM:\n{self.log_tail()}") from None

    def kill(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.kill()
            self.process.wait(10)

    def members(self) -> dict[str, int]:
        """A node of member processes (``DELAYQ_PROCESSES`` > 1): member node id -> its pid."""
        found = {}
        for child in child_processes(self.running.pid):
            try:
                environ = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
                if b"delayq.delay_service.reader" in Path(f"/proc/{child}/cmdline").read_bytes():
                    continue  # a killed member's reader, orphaned to the node until it exits
            except OSError:
                continue
            for entry in environ:
                if entry.startswith(b"DELAYQ_NODE_ID="):
                    found[entry.split(b"=", 1)[1].decode()] = child
        return found

    def readers(self) -> list[int]:
        """Pids of this node's buffer reader processes."""
        return reader_processes(self.running.pid)

    def log_tail(self, lines: int = 40) -> str:
        self.log.flush()
        path = self.data_dir.parent / f"{self.node_id}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def own_log(self) -> str:
        """What this process logged (the node's earlier runs logged to the same file before it)."""
        self.log.flush()
        with open(self.data_dir.parent / f"{self.node_id}.log", "rb") as log:
            log.seek(self.log_start)
            return log.read().decode(errors="replace")

    def stores_rebuilt(self) -> int:
        """How many times this process said it rebuilds a shard's store from the buffer (node.py's warning)."""
        return self.own_log().count(STORE_REBUILT)


class LocalCluster:
    """Nodes of one cluster on this machine; :meth:`close` kills whatever is still running."""

    def __init__(self, settings: Settings, root: Path, *, create_topics: bool = True, console: bool = False):
        """``create_topics``: make the buffer and dead-letter topics first (False: someone else made them, as
        the admin of a secured cluster does, where the nodes' principal may not). ``console``: every node
        also serves the web console on its HTTP port (:attr:`NodeProcess.console_url`)."""
        self.settings = settings
        self.root = root
        self.console = console
        self.nodes: dict[str, NodeProcess] = {}
        if create_topics:
            ensure_topics(settings)

    def start(self, node_id: str, *, wait: bool = True, python: str | None = None,
              env: dict[str, str] | None = None) -> NodeProcess:
        """Start ``node_id`` on its data folder (the one it had if it ran before), run by ``python``'s delayq.

        ``python`` defaults to the interpreter the node last ran with (a restart keeps a node's version), and
        to this one for a node never started. ``env``: more of its settings (``DELAYQ_...``), this run only.
        """
        previous = self.nodes.get(node_id)
        if python is None:
            python = previous.python if previous is not None else sys.executable
        node = NodeProcess(self.settings, node_id, self.root / node_id / "data", python=python,
                           console=self.console, env=dict(env or {})).start()
        self.nodes[node_id] = node
        if wait:
            node.wait_ready()
        return node

    def replace(self, node_id: str, python: str, *, stop: Callable[[NodeProcess], int] | None = None,
                ready_within_s: float = 120.0) -> NodeProcess:
        """One step of a rolling upgrade: stop ``node_id`` cleanly, start ``python``'s delayq on its data folder.

        Returns once the new process is ready; whether the shards have settled is the caller's to wait for.

        Args:
            stop: stops the node and returns its exit code (default :meth:`NodeProcess.stop`: SIGTERM, wait).
            ready_within_s: how long the new process may take to answer ``/readyz`` with 200.

        Raises:
            NodeError: the node did not exit 0 (it is left stopped), or the new process exited or was not
                ready in time; the message carries the log's tail.
        """
        node = self.nodes[node_id]
        code = (stop or NodeProcess.stop)(node)
        if code != 0:
            raise NodeError(f"node {node_id} exited with {code} when stopped, not 0 (a clean stop):\n"
                            f"{node.log_tail()}")
        node.log.close()
        started = self.start(node_id, python=python, wait=False)
        started.wait_ready(ready_within_s)
        return started

    def master(self, timeout_s: float = 30.0, *, other_than: NodeProcess | None = None) -> NodeProcess:
        """A node that says it is master of a shard (other than ``other_than``), waiting up to ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for node in self.nodes.values():
                if node.running.poll() is None and node is not other_than:
                    try:
                        if node.metric("delayq_is_master") >= 1:  # of any shard
                            return node
                    except OSError:
                        pass
            time.sleep(0.1)
        raise NodeError(f"no master within {timeout_s}s")

    def masterships(self) -> dict[int, list[str]]:
        """Shard -> the running nodes that say they master it (one each, in a healthy cluster)."""
        found: dict[int, list[str]] = {}
        for node in self.nodes.values():
            if node.process is None or node.process.poll() is not None:
                continue
            try:
                shards = node.mastered()
            except OSError:  # stopped, or frozen (SIGSTOP): it answers nothing
                continue
            for shard in shards:
                found.setdefault(shard, []).append(node.node_id)
        return found

    def close(self) -> None:
        for node in self.nodes.values():
            node.kill()
