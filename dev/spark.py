"""A Spark standalone cluster beside the dev stack's Kafka: one master and N workers, from the Spark pyspark ships.

``delayq dev up --spark`` runs them with pyspark's own ``bin/spark-class``, every port on loopback::

    <state>/spark-master/{spark.properties, log4j2.properties, spark-master.log (rolled), spark-master.out, .pid}
    <state>/spark-worker-<i>/{spark.properties, log4j2.properties, work/, spark-worker-<i>.log, ...}

The master's RPC port and web UI port and each worker's web UI port are chosen free on the first
``up --spark`` and recorded in ``<state>/stack.json`` beside Kafka's: a later ``up`` takes the same ones
while they are free. The master's web UI answers JSON at ``/json/`` (its workers, running and finished
applications): what says the master is up, and that a worker has registered with it.

This module holds what needs no process: the ports, their choice, the command lines, the readiness rules.
:class:`delayq.dev.DevStack` starts, waits for and stops the processes as it does Kafka's.
"""

from __future__ import annotations

import json
import os
import socket
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .runtime import StackError

HOST = "127.0.0.1"
MASTER = "spark-master"
WORKER_PREFIX = "spark-worker-"
MAX_WORKERS = 8
# Each worker offers this much memory to executors: one executor of Spark's default 1g fits, with room for a
# job that asks for more (spark.executor.memory).
WORKER_MEMORY = "2g"
# The heap of the master and of each worker process themselves (executors have their own).
DAEMON_MEMORY = "512m"


@dataclass(frozen=True)
class SparkPorts:
    """The loopback ports of the dev stack's Spark: the master's RPC and web UI ports, each worker's web UI port.

    A worker's own RPC port is Spark's choice (free, on loopback): nothing connects to it but the master,
    which the worker tells.
    """

    master: int
    master_ui: int
    worker_uis: tuple[int, ...]

    @property
    def workers(self) -> int:
        return len(self.worker_uis)

    @property
    def master_url(self) -> str:
        """What a driver is given as its master: ``spark://127.0.0.1:<port>``."""
        return f"spark://{HOST}:{self.master}"

    @property
    def master_ui_url(self) -> str:
        return f"http://{HOST}:{self.master_ui}"

    @property
    def services(self) -> tuple[str, ...]:
        """The master's service name, then the workers', in the order ``up`` starts them."""
        return spark_services(self.workers)

    def ui_port(self, name: str) -> int:
        """The web UI port of service ``name`` (the master or a worker)."""
        return self.master_ui if name == MASTER else self.worker_uis[worker_index(name) - 1]

    def as_record(self) -> dict[str, Any]:
        return {"master_port": self.master, "master_ui_port": self.master_ui, "worker_ui_ports": list(self.worker_uis)}

    @classmethod
    def from_record(cls, record: Any) -> SparkPorts | None:
        """The ports of a ``stack.json`` entry written by :meth:`as_record`; None when it holds none (or garbage)."""
        try:
            return cls(int(record["master_port"]), int(record["master_ui_port"]),
                       tuple(int(port) for port in record["worker_ui_ports"]))
        except (TypeError, KeyError, ValueError):
            return None


def worker_name(index: int) -> str:
    """Worker ``index``'s service name (1-based): ``spark-worker-1``."""
    return f"{WORKER_PREFIX}{index}"


def worker_index(name: str) -> int:
    return int(name.removeprefix(WORKER_PREFIX))


def is_spark_service(name: str) -> bool:
    return name == MASTER or name.startswith(WORKER_PREFIX)


def spark_services(workers: int) -> tuple[str, ...]:
    return (MASTER, *(worker_name(i) for i in range(1, workers + 1)))


def check_workers(workers: int) -> None:
    if not 1 <= workers <= MAX_WORKERS:
        raise StackError(f"a dev Spark cluster of {workers} workers is not possible: choose 1 to {MAX_WORKERS} "
                         "with --spark-workers")


def choose_ports(workers: int, recorded: SparkPorts | None, *, keep: Callable[[str, int], bool],
                 draw: Callable[[], int]) -> SparkPorts:
    """The ports of a Spark of ``workers`` workers: the recorded ones that ``keep(service, port)`` allows, else drawn.

    ``keep`` says whether a recorded port can stay (its service runs on it, or it is free); ``draw`` gives a free
    port. No port is given twice.

    Raises:
        StackError: ``draw`` gave only ports already chosen, a hundred times over.
    """
    chosen: list[int] = []

    def take(service: str, port: int | None) -> int:
        if port is not None and port not in chosen and keep(service, port):
            chosen.append(port)
            return port
        for _ in range(100):
            port = draw()
            if port not in chosen:
                chosen.append(port)
                return port
        raise StackError("no free loopback port found for the dev stack's Spark: free some ports and run up again")

    old_workers = recorded.worker_uis if recorded else ()
    master = take(MASTER, recorded.master if recorded else None)
    master_ui = take(MASTER, recorded.master_ui if recorded else None)
    worker_uis = tuple(take(worker_name(i), old_workers[i - 1] if i <= len(old_workers) else None)
                       for i in range(1, workers + 1))
    return SparkPorts(master, master_ui, worker_uis)


def free_port() -> int:
    """A port nothing listens on now, chosen by the kernel, on loopback."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def port_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def spark_home() -> Path:
    """The Spark that pyspark ships (its ``bin/spark-class`` and ``jars/``).

    Raises:
        StackError: pyspark is not installed, or is a build without its launcher scripts.
    """
    try:
        import pyspark
    except ImportError:
        raise StackError("delayq dev up --spark needs pyspark, of delayq's 'reconcile' extra: "
                         "pip install 'delayq[reconcile]'") from None
    home = Path(pyspark.__file__).parent
    if not (home / "bin" / "spark-class").is_file():
        raise StackError(f"the pyspark in {home} has no bin/spark-class to start a Spark master with: "
                         "reinstall it (pip install --force-reinstall 'delayq[reconcile]')")
    return home


def spark_version() -> str:
    try:
        import pyspark
    except ImportError:
        return "-"
    return pyspark.__version__


def worker_cores(workers: int, cpus: int | None = None) -> int:
    """Cores each of ``workers`` workers offers: the machine's, shared between them (at least one each)."""
    return max(1, (cpus or os.cpu_count() or 1) // workers)


def master_argv(home: Path, ports: SparkPorts, properties: Path) -> list[str]:
    """The command line of the master: loopback host, its two ports, its properties file (how its process is known)."""
    return [str(home / "bin" / "spark-class"), "org.apache.spark.deploy.master.Master",
            "--host", HOST, "--port", str(ports.master), "--webui-port", str(ports.master_ui),
            "--properties-file", str(properties)]


def worker_argv(home: Path, ports: SparkPorts, index: int, properties: Path, work_dir: Path, *,
                cores: int, memory: str = WORKER_MEMORY) -> list[str]:
    """The command line of worker ``index`` (1-based), registering with this stack's master."""
    return [str(home / "bin" / "spark-class"), "org.apache.spark.deploy.worker.Worker", ports.master_url,
            "--host", HOST, "--webui-port", str(ports.worker_uis[index - 1]),
            "--cores", str(cores), "--memory", memory, "--work-dir", str(work_dir),
            "--properties-file", str(properties)]


def daemon_env(environ: Mapping[str, str], conf_dir: Path, log4j: Path) -> dict[str, str]:
    """The environment of a master or worker process: ``environ`` with Spark's daemon settings.

    ``SPARK_LOCAL_IP`` keeps the web UIs on loopback (they bind to it, else to every address); the
    log4j2 file sends Spark's log to a rolled file; ``SPARK_CONF_DIR`` is the service's own folder,
    so no ``spark-env.sh`` or ``spark-defaults.conf`` of the machine changes what runs.
    """
    return {**environ, "SPARK_LOCAL_IP": HOST, "SPARK_CONF_DIR": str(conf_dir),
            "SPARK_DAEMON_MEMORY": DAEMON_MEMORY,
            "SPARK_DAEMON_JAVA_OPTS": f'-Dlog4j2.configurationFile="{log4j}" -XX:+UseSerialGC'}


def master_properties() -> str:
    # No REST submission server (port 6066): jobs come from drivers, and nothing else listens.
    return "spark.master.rest.enabled=false\n"


def worker_properties() -> str:
    # A dev stack runs for weeks of test sessions: finished applications' folders (executor logs, the
    # files shipped with the job) go after a day.
    return ("spark.worker.cleanup.enabled=true\nspark.worker.cleanup.interval=3600\n"
            "spark.worker.cleanup.appDataTtl=86400\n")


def master_state(ui_port: int, timeout_s: float = 2.0) -> dict[str, Any] | None:
    """The master's own JSON (``/json/``: status, workers, activeapps, completedapps), or None if it does not answer."""
    return _json(f"http://{HOST}:{ui_port}/json/", timeout_s)


def worker_state(ui_port: int, timeout_s: float = 2.0) -> dict[str, Any] | None:
    """A worker's own JSON (``/json/``: masterurl, executors, finishedexecutors), or None if it does not answer."""
    return _json(f"http://{HOST}:{ui_port}/json/", timeout_s)


def master_alive(state: dict[str, Any] | None) -> bool:
    return state is not None and state.get("status") == "ALIVE"


def worker_registered(state: dict[str, Any] | None, ui_port: int) -> bool:
    """True if the master's JSON ``state`` lists the worker whose web UI is on ``ui_port`` as ALIVE."""
    address = f"http://{HOST}:{ui_port}"
    return any(worker.get("state") == "ALIVE" and worker.get("webuiaddress") == address
               for worker in (state or {}).get("workers", []))


def _json(url: str, timeout_s: float) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as answer:
            found = json.loads(answer.read())
    except (OSError, ValueError, urllib.error.URLError):
        return None
    return found if isinstance(found, dict) else None
