"""The Java runtimes of the embedded stack: Apache Kafka and Apache ZooKeeper jars.

Both come from Maven Central, resolved with their runtime dependencies by Maven
itself, into a cache folder outside the repository, once. A finished download is
marked by a ``.complete`` file, so an interrupted one is redone, and a second
``delayq dev up`` downloads nothing.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from delayq.errors import DelayqError
from delayq.paths import cache_dir, cache_lock

KAFKA_VERSION = "4.3.1"
ZOOKEEPER_VERSION = "3.9.4"
LOG4J_VERSION = "2.24.3"


class StackError(DelayqError):
    """The embedded stack cannot be installed, started or reached. The message says why and what to do."""


@dataclass(frozen=True)
class Artifact:
    group: str
    name: str
    version: str

    def xml(self) -> str:
        return (
            f"<dependency><groupId>{self.group}</groupId><artifactId>{self.name}</artifactId>"
            f"<version>{self.version}</version></dependency>"
        )


@dataclass(frozen=True)
class Runtime:
    """A named set of jars to put on one JVM's class path."""

    name: str
    version: str
    artifacts: tuple[Artifact, ...]


KAFKA = Runtime(
    "kafka",
    KAFKA_VERSION,
    (
        Artifact("org.apache.kafka", "kafka_2.13", KAFKA_VERSION),
        # Kafka 4 logs through slf4j 1.x to log4j2, as its own distribution does.
        Artifact("org.apache.logging.log4j", "log4j-slf4j-impl", LOG4J_VERSION),
        Artifact("org.apache.logging.log4j", "log4j-core", LOG4J_VERSION),
    ),
)

ZOOKEEPER = Runtime(
    "zookeeper",
    ZOOKEEPER_VERSION,
    (
        Artifact("org.apache.zookeeper", "zookeeper", ZOOKEEPER_VERSION),
        # Optional in ZooKeeper's pom, yet the server needs both to start.
        Artifact("io.dropwizard.metrics", "metrics-core", "4.1.12.1"),
        Artifact("org.xerial.snappy", "snappy-java", "1.1.10.7"),
        Artifact("ch.qos.logback", "logback-classic", "1.3.15"),
    ),
)


def java_executable() -> str:
    """The ``java`` to run, checked to be Java 17 or newer."""
    java_home = os.environ.get("JAVA_HOME")
    java = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
    if java_home and java and not Path(java).exists():
        raise StackError(f"JAVA_HOME is {java_home}, which has no bin/java: point it at a Java 17 or newer, "
                         "or unset it to use the java on PATH")
    if not java or not Path(java).exists():
        raise StackError(
            "Java 17 or newer is needed to run Kafka and ZooKeeper and none was found: "
            "install it (Debian: apt-get install openjdk-17-jre-headless) or set JAVA_HOME."
        )
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    except OSError as err:
        raise StackError(f"cannot run {java} ({err.strerror}): point JAVA_HOME at a Java 17 or newer, "
                         "or install one (Debian: apt-get install openjdk-17-jre-headless)") from None
    match = re.search(r'version "(\d+)', out)
    if match and int(match.group(1)) < 17:
        raise StackError(f"Kafka 4 needs Java 17 or newer, but {java} is Java {match.group(1)}: install Java 17+ "
                         "(Debian: apt-get install openjdk-17-jre-headless) or point JAVA_HOME at one")
    return java


def _pom(runtime: Runtime) -> str:
    deps = "\n    ".join(a.xml() for a in runtime.artifacts)
    return f"""<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>delayq.dev</groupId><artifactId>{runtime.name}-runtime</artifactId>
  <version>{runtime.version}</version><packaging>pom</packaging>
  <dependencies>
    {deps}
  </dependencies>
</project>
"""


def ensure_runtime(runtime: Runtime, *, say=print) -> Path:
    """Return the folder of ``runtime``'s jars, downloading them from Maven Central on first use.

    Raises:
        StackError: Maven is missing or the download failed; the message names which.
    """
    target = cache_dir() / f"{runtime.name}-{runtime.version}"
    libs = target / "libs"
    marker = target / ".complete"
    wanted = " ".join(a.xml() for a in runtime.artifacts)
    if marker.exists() and marker.read_text() == wanted:
        return libs
    with cache_lock(target):
        if marker.exists() and marker.read_text() == wanted:
            return libs  # filled meanwhile by another process
        _download(runtime, target, say)
        marker.write_text(wanted)
    return libs


def _download(runtime: Runtime, target: Path, say) -> None:
    """Fill ``target/libs`` with ``runtime``'s jars from Maven Central (its marker is the caller's)."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise StackError(
            f"Maven is needed once to download {runtime.name} {runtime.version} from Maven Central "
            "and was not found: install it (Debian: apt-get install maven)."
        )
    say(f"downloading {runtime.name} {runtime.version} and its dependencies from Maven Central into {target}")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{runtime.name}-") as scratch:
        pom = Path(scratch) / "pom.xml"
        pom.write_text(_pom(runtime))
        staged = Path(scratch) / "libs"
        result = subprocess.run(
            [mvn, "-B", "-q", "-f", str(pom), "dependency:copy-dependencies",
             f"-DoutputDirectory={staged}", "-DincludeScope=runtime"],
            capture_output=True, text=True,
        )
        if result.returncode != 0 or not any(staged.glob("*.jar")):
            raise StackError(
                f"downloading {runtime.name} {runtime.version} from Maven Central failed "
                f"(mvn exit {result.returncode}; Maven said: {maven_says(result.stdout + result.stderr)}): "
                "check the network or Maven's proxy settings (~/.m2/settings.xml), then run delayq dev up again"
            )
        if target.exists():
            shutil.rmtree(target)
        target.mkdir()
        staged.rename(target / "libs")


def maven_says(output: str, limit: int = 300) -> str:
    """Maven's first error line (the later ones repeat it or point at help pages), in one line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("[ERROR]") and "-> [Help" not in line
              and not line.startswith("[ERROR] Re-run") and line != "[ERROR]"]
    line = (errors or lines or ["nothing"])[0]
    return line if len(line) <= limit else line[: limit - 3] + "..."
