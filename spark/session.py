"""The Spark session of the job, with Spark's Kafka source resolved once into delayq's cache.

The Kafka source is not part of pyspark: it is the Maven artifact
``org.apache.spark:spark-sql-kafka-0-10_2.13`` at exactly the pyspark version,
resolved by Spark's own Ivy (``spark.jars.packages``) into ``<cache>/spark/ivy``,
so the second run resolves from that cache and downloads nothing. The Ivy
settings name one repository (Maven Central by default): the default chain also
tries ``~/.m2``, where a stray pom without its jar breaks the resolution.

delayq's own jar (:data:`STEP_JAR`, the continuous reconciliation's stateful step, built from
spark/jvm/src) is on the class path of every session this module starts: the driver's
(``spark.driver.extraClassPath``, at the JVM's start) and, on a cluster, the executors', which
fetch it from the driver (``addJar``, with delayq's code in :func:`ship_code`). Not through
``spark.jars``: the session's own setting of it would replace the list spark-submit made of
the Kafka source's resolved jars, and the executors would go without them.
"""

from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

from delayq.errors import DelayqError, UsageError
from delayq.paths import cache_dir, cache_lock

from .options import MAVEN_CENTRAL

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from delayq import Settings

# pyspark's own jars already hold these; a second copy on the class path only invites conflicts.
BUNDLED_WITH_PYSPARK = (
    "org.apache.hadoop:hadoop-client-runtime",
    "org.apache.hadoop:hadoop-client-api",
    "org.slf4j:slf4j-api",
    "org.xerial.snappy:snappy-java",
    "org.lz4:lz4-java",
    "com.google.code.findbugs:jsr305",
    "org.scala-lang.modules:scala-parallel-collections_2.13",
)

# The continuous reconciliation's stateful step (delayq.spark.FollowStep), compiled from spark/jvm/src (make jar).
STEP_JAR = Path(__file__).resolve().parent / "jvm" / "delayq-spark.jar"
# Records a Python worker gets per Arrow batch (spark.sql.execution.arrow.maxRecordsPerBatch; Spark's default 10,000).
ARROW_RECORDS_PER_BATCH = 1_000
# Options Spark's Kafka source refuses or manages itself (it would fail the whole run).
_REFUSED_BY_SPARK = frozenset({
    "group.id", "auto.offset.reset", "enable.auto.commit", "interceptor.classes",
    "key.deserializer", "value.deserializer", "key.serializer", "value.serializer", "isolation.level",
    "bootstrap.servers",
})
# librdkafka names whose Java client spelling differs.
_JAVA_NAMES = {"sasl.mechanisms": "sasl.mechanism"}
_JAAS_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}


_started_log: Path | None = None


def jvm_log() -> Path | None:
    """The log file of the JVM this process started (Ivy's resolution report first), or None."""
    return _started_log


class ReconcileError(DelayqError):
    """The reconciliation could not run: Kafka, the buffer topic or the Spark Kafka source is not there."""


def kafka_package(version: str | None = None) -> str:
    """Maven coordinates of Spark's Kafka source matching ``version`` (the installed pyspark by default)."""
    if version is None:
        import pyspark

        version = pyspark.__version__
    return f"org.apache.spark:spark-sql-kafka-0-10_2.13:{version}"


def spark_home_dir() -> Path:
    """Where the job keeps the Ivy cache, its settings and the JVM logs: ``<delayq cache>/spark``."""
    return cache_dir() / "spark"


def ivy_settings_xml(repository: str = MAVEN_CENTRAL) -> str:
    """Ivy settings that resolve from ``repository`` alone (a Maven 2 layout)."""
    if not repository.startswith(("https://", "http://", "file:")):
        raise ValueError(f"maven_repository {repository!r} must be an http(s):// or file: URL")
    root = repository if repository.endswith("/") else repository + "/"
    return (
        "<ivysettings>\n"
        '  <settings defaultResolver="delayq-maven"/>\n'
        "  <resolvers>\n"
        f'    <ibiblio name="delayq-maven" m2compatible="true" root="{root}"/>\n'
        "  </resolvers>\n"
        "</ivysettings>\n"
    )


def kafka_source_options(settings: Settings, *, isolation_level: str) -> dict[str, str]:
    """``kafka.``-prefixed options for Spark's Kafka source, from the one Settings model.

    ``Settings.kafka`` holds librdkafka settings; most have the same name in the Java
    client Spark uses. ``sasl.mechanisms`` becomes ``sasl.mechanism``, and
    ``sasl.username``/``sasl.password`` become a ``sasl.jaas.config`` for PLAIN and
    SCRAM. Options the Kafka source manages itself (group.id, offsets reset,
    deserializers) are left out rather than failing the run.

    Args:
        settings: bootstrap servers and pass-through client settings.
        isolation_level: ``read_committed`` or ``read_uncommitted``.

    Raises:
        ValueError: ``isolation_level`` is neither, or SASL credentials come without a supported mechanism.
    """
    if isolation_level not in ("read_committed", "read_uncommitted"):
        raise ValueError(f"isolation_level {isolation_level!r} must be read_committed or read_uncommitted")
    conf = settings.kafka_passthrough()
    username, password = conf.pop("sasl.username", None), conf.pop("sasl.password", None)
    java: dict[str, str] = {}
    for name, value in conf.items():
        name = _JAVA_NAMES.get(name, name)
        if name not in _REFUSED_BY_SPARK:
            java[name] = str(value)
    if username is not None and "sasl.jaas.config" not in java:
        mechanism = java.get("sasl.mechanism", "PLAIN").upper()
        if mechanism not in _JAAS_MODULES:
            raise ValueError(f"kafka settings give sasl.username with sasl.mechanisms={mechanism!r}; "
                             f"the reconciliation can build a JAAS config for {sorted(_JAAS_MODULES)} only: "
                             "set kafka.sasl.jaas.config yourself")
        java["sasl.jaas.config"] = (f'{_JAAS_MODULES[mechanism]} required username="{_escape(username)}" '
                                    f'password="{_escape(password or "")}";')
    ca = java.pop("ssl.ca.location", None)
    if ca is not None and "ssl.truststore.location" not in java:
        # librdkafka takes the CA as a PEM file; the Java client as a PEM trust store.
        java["ssl.truststore.type"] = "PEM"
        java["ssl.truststore.location"] = ca
    java["bootstrap.servers"] = settings.bootstrap_servers
    java["isolation.level"] = isolation_level
    return {f"kafka.{name}": value for name, value in java.items()}


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def spark_session(master: str | None = "local[*]", *, maven_repository: str = MAVEN_CENTRAL,
                  conf: dict[str, str] | None = None) -> SparkSession:
    """The active Spark session, or a new one able to read Kafka.

    When this process already runs inside Spark (``spark-submit`` started it, or a
    session exists), that session is returned as it is: its master and packages
    were chosen by whoever started it. Otherwise a JVM is started with the Kafka
    source from the cache (resolved on the first run), its output going to a log
    file under :func:`spark_home_dir` rather than the terminal. Either way, when the
    executors run elsewhere than in this process (any master but ``local``), delayq's own
    code is added to the session for them (:func:`ship_code`).

    Args:
        master: the Spark master for a new session (``local[*]``, ``spark://host:7077``); None: Spark's default.
        maven_repository: where Ivy resolves the Kafka source from on the first run.
        conf: extra Spark settings for a new session.

    Raises:
        ReconcileError: a ``spark://`` master does not answer, the JVM did not start or the Kafka source
            could not be resolved; the message names the log file with Ivy's and Spark's own words.
        UsageError: ``master`` is a malformed ``spark://`` URL.
    """
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    if SparkContext._active_spark_context is not None:
        # A JVM is up in this process: its jars and master were fixed when it started.
        return ship_code(SparkSession.builder.getOrCreate())
    if master:
        check_master(master)
    home = spark_home_dir()
    home.mkdir(parents=True, exist_ok=True)
    settings_file = home / "ivysettings.xml"
    text = ivy_settings_xml(maven_repository)
    if not settings_file.exists() or settings_file.read_text() != text:
        settings_file.write_text(text)
    builder = SparkSession.builder.appName("delayq-reconcile")
    settings: dict[str, str] = {
        "spark.sql.session.timeZone": "UTC",
        # The Kafka source's options carry the SASL credentials (kafka.sasl.jaas.config): plans, the UI
        # and event logs show them redacted, as they do Spark's own secrets.
        "spark.sql.redaction.options.regex": "(?i)url|jaas|password|secret|token|key\\.pem",
        "spark.redaction.regex": "(?i)secret|password|token|access[.]key|jaas",
        # HotSpot does not compile a method above 8,000 bytes of bytecode: a whole-stage method that
        # large would run interpreted, about twice as slow (the judging stage, job.judge, is near it).
        # Above the limit Spark runs that stage operator by operator instead, compiled.
        "spark.sql.codegen.hugeMethodLimit": "8000",
        # Records handed to a Python worker per Arrow batch (the buffer's parse, records.py). Spark 4.0 checks
        # its byte limit per batch (maxBytesPerBatch, 256 MB: kept, it bounds a batch of large records) by
        # sizing every vector after each row, and a list column (the headers) costs more the fuller the batch:
        # 2M buffer records took 18-19 s to Python and back at the default 10,000 a batch, 13-14 s at 1,000
        # (JFR: a fifth of the whole job's JVM time was that check).
        "spark.sql.execution.arrow.maxRecordsPerBatch": str(ARROW_RECORDS_PER_BATCH),
    }
    # Under spark-submit the JVM is already up with the --master, --packages and class path it was given.
    launching = "PYSPARK_GATEWAY_PORT" not in os.environ
    if launching:
        # The buffer is parsed by delayq's own parser in Python workers (records.py): on this machine they
        # must run this interpreter, which has delayq and pyarrow, not whatever "python3" is on the PATH.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        if master:
            builder = builder.master(master)
        settings.update({
            "spark.jars.packages": kafka_package(),
            "spark.jars.ivy": str(home / "ivy"),
            "spark.jars.ivySettings": str(settings_file),
            "spark.jars.excludes": ",".join(BUNDLED_WITH_PYSPARK),
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.shuffle.partitions": "16",
            "spark.driver.memory": "2g",
            # A batch job on a small heap: the throughput collector costs less CPU than G1 (bench/
            # reconcile_bench.py: about 7 s of 90 for 1M messages on local[2]).
            "spark.driver.extraJavaOptions": "-XX:+UseParallelGC",
        })
        if master and _on_loopback(master):
            # The executors of a master on loopback run on this machine: they reach the driver there too, whatever
            # address the host name resolves to.
            settings["spark.driver.host"] = "127.0.0.1"
    settings = {**settings, **(conf or {})}
    if launching:
        # Besides whatever class path the caller asked for.
        key = "spark.driver.extraClassPath"
        settings[key] = os.pathsep.join(filter(None, (settings.get(key), str(STEP_JAR))))
    for key, value in settings.items():
        builder = builder.config(key, value)
    log = home / "logs" / f"spark-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    global _started_log
    _started_log = log
    try:
        # Ivy keeps no lock on its cache: two JVMs resolving the Kafka source into it at once (two
        # reconciliations starting together on a fresh machine) could each find the other's half-written files.
        with _output_to(log), cache_lock(home / "ivy") if launching else nullcontext():
            session = builder.getOrCreate()
    except Exception as err:
        raise ReconcileError(f"Spark did not start with the Kafka source {kafka_package()} "
                             f"(resolved from {maven_repository} into {home / 'ivy'}): {err}; "
                             f"see {log} for Ivy's and Spark's own messages") from err
    session.sparkContext.setLogLevel("ERROR")
    return ship_code(session)


def is_local(master: str) -> bool:
    """True for a master that runs the executors inside the driver's JVM (``local``, ``local[N]``, ...)."""
    return master == "local" or master.startswith("local[")


def ship_code(session: SparkSession) -> SparkSession:
    """Add delayq's own code to ``session`` (shipping.py) and its jar unless its executors run in this process;
    once per session.

    Local executors import delayq as this process does, and load the jar from the driver's class path.
    Anywhere else (a standalone cluster, YARN, Kubernetes) the executors fetch the zip and the jar
    from the driver, as they fetch the Kafka source's jars (``spark.jars``, which
    ``spark.jars.packages`` filled).
    """
    from .shipping import code_zip

    context = session.sparkContext
    if is_local(context.master or "local"):
        return session
    path = str(code_zip(spark_home_dir()))
    if (context.applicationId, path) not in _shipped:
        context.addPyFile(path)
        context._jsc.sc().addJar(str(STEP_JAR))
        _shipped.add((context.applicationId, path))
    return session


# The code zips added to each application (a second reconcile in one session adds nothing).
_shipped: set[tuple[str, str]] = set()


def master_addresses(master: str) -> list[tuple[str, int]]:
    """The host and port of each master of a ``spark://`` URL (several for a standby pair); [] for any other master.

    Raises:
        UsageError: a ``spark://`` URL that names no ``HOST:PORT``.
    """
    if not master.startswith("spark://"):
        return []
    found = []
    for part in master.removeprefix("spark://").split(","):
        host, colon, port = part.strip().rpartition(":")
        if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise UsageError(f"--master {master!r}: a standalone master is spark://HOST:PORT "
                             "(spark://HOST1:PORT1,HOST2:PORT2 for a standby pair), e.g. spark://127.0.0.1:7077")
        found.append((host.strip("[]"), int(port)))
    return found


def check_master(master: str, timeout_s: float = 3.0) -> None:
    """Refuse, in one line, a ``spark://`` master that does not answer: Spark itself would try for a minute.

    Raises:
        UsageError: the URL is malformed.
        ReconcileError: no master of the URL accepts a connection.
    """
    import socket

    addresses = master_addresses(master)
    problems = []
    for host, port in addresses:
        try:
            with socket.create_connection((host, port), timeout=timeout_s):
                return
        except OSError as err:
            problems.append(err.strerror or type(err).__name__)
    if addresses:
        fix = ("start the dev stack's Spark (delayq dev up --spark) and give the URL it prints (delayq dev env: "
               "DELAYQ_SPARK_MASTER)" if all(_loopback(host) for host, _ in addresses)
               else "check that the Spark master runs and this machine reaches it")
        raise ReconcileError(f"the Spark master {master} does not answer ({'; '.join(problems)}): {fix}, "
                             "or run the job here with --master local[*]")


def _on_loopback(master: str) -> bool:
    try:
        addresses = master_addresses(master)
    except UsageError:
        return False
    return bool(addresses) and all(_loopback(host) for host, _ in addresses)


def _loopback(host: str) -> bool:
    return host in ("127.0.0.1", "localhost", "::1") or host.startswith("127.")


@contextmanager
def _output_to(path: Path):
    """Send this process's stdout and stderr, and so the JVM's it starts, to ``path`` meanwhile.

    The JVM keeps the file as its stdout/stderr for its whole life: Ivy's resolution
    report and Spark's warnings land there instead of between the progress lines.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for descriptor in (fd, *saved):
            os.close(descriptor)
