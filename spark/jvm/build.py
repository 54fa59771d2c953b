"""Build spark/jvm/delayq-spark.jar, the continuous reconciliation's stateful step (FollowStep.java).

The jar is kept in the tree and shipped in the wheel: the images that run the reconciliation
have a Java runtime, not a compiler. Rebuild it after changing the source (``make jar``);
``tests/unit/spark/test_follow_step.py`` fails while the jar is not what the source compiles to.

The build is reproducible: javac for Java 17 against pyspark's own jars, the classes zipped in
name order with a fixed date, and the source's SHA-256 in the manifest.

Usage: python spark/jvm/build.py [--out PATH]
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCES = HERE / "src"
JAR = HERE / "delayq-spark.jar"
DIGEST_ATTRIBUTE = "Delayq-Source-SHA256"
# Zip entries dated the zip format's first day: the same classes make the same jar.
FIXED_DATE = (1980, 1, 1, 0, 0, 0)


def sources() -> list[Path]:
    return sorted(SOURCES.rglob("*.java"))


def source_digest() -> str:
    """SHA-256 over the sources' paths and contents, in path order."""
    digest = hashlib.sha256()
    for path in sources():
        digest.update(path.relative_to(SOURCES).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def compile_classes(out: Path) -> dict[str, bytes]:
    """javac's classes for the sources, by their path in the jar."""
    import pyspark

    javac = shutil.which("javac")
    if javac is None:
        raise SystemExit("javac not found: building the jar needs a JDK 17 "
                         "(Debian: apt-get install openjdk-17-jdk-headless)")
    classpath = str(Path(pyspark.__file__).parent / "jars" / "*")
    subprocess.run([javac, "--release", "17", "-nowarn", "-cp", classpath, "-d", str(out),
                    *map(str, sources())], check=True)
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*.class"))}


def write_jar(classes: dict[str, bytes], jar: Path) -> None:
    manifest = (f"Manifest-Version: 1.0\r\nCreated-By: spark/jvm/build.py\r\n"
                f"{DIGEST_ATTRIBUTE}: {source_digest()}\r\n\r\n")
    with zipfile.ZipFile(jar, "w", zipfile.ZIP_DEFLATED) as out:
        out.writestr(zipfile.ZipInfo("META-INF/MANIFEST.MF", FIXED_DATE), manifest)
        for name, data in sorted(classes.items()):
            out.writestr(zipfile.ZipInfo(name, FIXED_DATE), data, zipfile.ZIP_DEFLATED)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=JAR)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as work:
        write_jar(compile_classes(Path(work)), args.out)
    print(f"wrote {args.out} ({args.out.stat().st_size:,} bytes, source {source_digest()[:12]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
