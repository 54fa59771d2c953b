"""Compile and run small Java Kafka clients (docs/examples/*.java) against the embedded stack.

The class path is kafka-clients and its runtime dependencies, taken from the Kafka jars the
dev stack already caches (:data:`delayq.dev.runtime.KAFKA`); nothing else is downloaded.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from .runtime import KAFKA, StackError, ensure_runtime, java_executable

# kafka-clients' runtime dependencies (compression codecs, the logging API), plus a log4j2 binding so the
# client logs warnings and errors only, instead of slf4j's complaint about having no binding.
CLIENT_JARS = ("kafka-clients", "lz4-java", "snappy-java", "zstd-jni", "slf4j-api", "log4j-slf4j-impl",
               "log4j-api", "log4j-core")
JVM_OPTIONS = ("-Dlog4j2.level=WARN", "-Dlog4j2.statusLoggerLevel=OFF")


def javac_executable() -> str:
    """The ``javac`` of a JDK 11 or newer: ``$JAVA_HOME/bin/javac``, else the one on PATH.

    Raises:
        StackError: there is none; the message says what to install.
    """
    java_home = os.environ.get("JAVA_HOME")
    javac = str(Path(java_home) / "bin" / "javac") if java_home else shutil.which("javac")
    if not javac or not Path(javac).exists():
        raise StackError("javac (a JDK, 17 here) is needed to compile the Java examples and none was found: "
                         "install one (Debian: apt-get install openjdk-17-jdk-headless) or set JAVA_HOME to a JDK")
    return javac


def client_classpath(say=print) -> list[Path]:
    """kafka-clients and its runtime dependencies from the cached Kafka jars (downloaded on first use).

    Raises:
        StackError: the jars cannot be had, or one of :data:`CLIENT_JARS` is not among them.
    """
    libs = ensure_runtime(KAFKA, say=say)
    jars = []
    for name in CLIENT_JARS:
        versioned = re.compile(rf"{re.escape(name)}-\d[\w.+-]*\.jar")
        found = sorted(p for p in libs.glob(f"{name}-*.jar") if versioned.fullmatch(p.name))
        if not found:
            raise StackError(f"{name}-*.jar is not among the cached Kafka jars in {libs}: remove that folder "
                             "and run `delayq dev up` to download them again")
        jars.append(found[-1])
    return jars


def compile_java(source: Path, out_dir: Path, say=print) -> list[Path]:
    """Compile ``source`` into ``out_dir``; return the class path to run it with (``out_dir`` first).

    Raises:
        StackError: no javac, no jars, or the compiler refused the source (its output is in the message).
    """
    classpath = client_classpath(say)
    out_dir.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        [javac_executable(), "-encoding", "UTF-8", "-Xlint:all", "-Werror", "-cp", os.pathsep.join(map(str, classpath)),
         "-d", str(out_dir), str(source)],
        capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise StackError(f"javac {source.name} failed (exit {result.returncode}):\n{result.stdout}{result.stderr}")
    return [out_dir, *classpath]


def run_java(classpath: list[Path], main_class: str, *args: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
    """Run ``main_class`` with ``args`` on ``classpath``; the completed process (text output)."""
    return subprocess.run(
        [java_executable(), *JVM_OPTIONS, "-cp", os.pathsep.join(map(str, classpath)), main_class, *args],
        capture_output=True, text=True, timeout=timeout_s)
