"""kcat, the librdkafka command-line client, for the wire-format examples and their tests.

:func:`ensure_kcat` returns a path to a working ``kcat``:

1. ``$DELAYQ_KCAT``, if set (it must work);
2. the ``kcat`` on ``PATH``;
3. one unpacked earlier into the cache (``<cache>/kcat``, the cache of the dev stack's jars:
   ``$DELAYQ_CACHE_DIR``, else ``$XDG_CACHE_HOME/delayq``, else ``~/.cache/delayq``);
4. else Debian's ``kcat`` package and each package it depends on that is not installed
   (librdkafka1, libyajl2), fetched with ``apt-get download`` and unpacked with
   ``dpkg-deb -x`` into that cache: no root needed. The cached ``kcat`` is a small
   script that runs the unpacked binary with ``LD_LIBRARY_PATH`` on the unpacked libraries.
   Only when apt's package lists lack kcat and we are root does it run ``apt-get update`` first.

``python -m delayq.dev.kcat`` prints the path (fetching it if need be).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from delayq.errors import DelayqError

from .runtime import cache_dir

PACKAGE = "kcat"
ENV_OVERRIDE = "DELAYQ_KCAT"
_MARKER = ".complete"
_WRAPPER = """#!/bin/sh
# kcat from Debian's package, unpacked without root by delayq.dev.kcat; its libraries ride along.
here=$(dirname -- "$(readlink -f -- "$0")")
LD_LIBRARY_PATH="{libs}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}" exec "$here/root/{binary}" "$@"
"""


class KcatError(DelayqError):
    """kcat is not on PATH and could not be fetched; the one-line message says why and what to do."""


def kcat_dir() -> Path:
    """Where a fetched kcat is unpacked: ``<cache>/kcat``."""
    return cache_dir() / "kcat"


def ensure_kcat(say: Callable[[str], None] = print) -> Path:
    """A path to a kcat that runs: ``$DELAYQ_KCAT``, the one on PATH, the cached one, or a freshly fetched one.

    Args:
        say: receives a line before and after a fetch (nothing is said otherwise).

    Raises:
        KcatError: none of those works; the message says why and how to fix it.
    """
    explicit = os.environ.get(ENV_OVERRIDE)
    if explicit:
        if not _works(Path(explicit)):
            raise KcatError(f"${ENV_OVERRIDE} is {explicit}, which does not run as kcat (`{explicit} -V` failed)")
        return Path(explicit)
    on_path = shutil.which(PACKAGE)
    if on_path and _works(Path(on_path)):
        return Path(on_path)
    target = kcat_dir()
    cached = target / PACKAGE
    if (target / _MARKER).is_file() and _works(cached):
        return cached
    return _fetch(target, say)


# -- fetching Debian's package ---------------------------------------------------------


def _fetch(target: Path, say: Callable[[str], None]) -> Path:
    for tool in ("apt-get", "apt-cache", "dpkg-deb", "dpkg-query"):
        if shutil.which(tool) is None:
            raise KcatError(f"kcat is not on PATH and there is no {tool} to fetch Debian's kcat package: install kcat "
                            f"(apt-get install kcat, brew install kcat) or set ${ENV_OVERRIDE} to its path")
    packages = _packages_to_fetch()
    say(f"kcat is not on PATH: fetching {', '.join(packages)} with `apt-get download` into {target} (no root needed)")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".kcat-") as scratch:
        debs = Path(scratch) / "debs"
        tree = Path(scratch) / "kcat"
        debs.mkdir()
        (tree / "root").mkdir(parents=True)
        _apt_download(packages, debs)
        for deb in sorted(debs.glob("*.deb")):
            _run(["dpkg-deb", "-x", str(deb), str(tree / "root")], f"`dpkg-deb -x {deb.name}` failed")
        binary = tree / "root" / "usr" / "bin" / PACKAGE
        if not binary.is_file():
            raise KcatError(f"Debian's kcat package holds no usr/bin/kcat (fetched: {', '.join(packages)})")
        libs = sorted({p.parent.relative_to(tree) for p in (tree / "root").rglob("*.so*") if p.is_file()})
        wrapper = tree / PACKAGE
        wrapper.write_text(_WRAPPER.format(libs=":".join(f"$here/{d}" for d in libs), binary="usr/bin/kcat"))
        wrapper.chmod(0o755)
        _check_libraries(binary, [tree / d for d in libs])
        if not _works(wrapper):
            raise KcatError(f"the kcat unpacked from Debian's package does not run (`{wrapper} -V` failed)")
        (tree / _MARKER).write_text("\n".join(sorted(d.name for d in debs.glob("*.deb"))) + "\n")
        if target.exists():
            if (target / _MARKER).is_file() and _works(target / PACKAGE):
                return target / PACKAGE  # fetched meanwhile by another process
            shutil.rmtree(target)
        os.replace(tree, target)
    say(f"kcat ready: {target / PACKAGE}")
    return target / PACKAGE


def _packages_to_fetch() -> list[str]:
    """kcat, and every package in its dependency closure that is not installed."""
    if not _apt_knows(PACKAGE):
        if os.geteuid() == 0:
            _run(["apt-get", "update", "-qq"], "`apt-get update` failed")
        if not _apt_knows(PACKAGE):
            fix = "(check the APT sources)" if os.geteuid() == 0 else "(run `sudo apt-get update`, or install kcat)"
            raise KcatError(f"kcat is not on PATH and apt's package lists hold no kcat package {fix}")
    wanted, queue = [PACKAGE], [PACKAGE]
    while queue:
        for group in _dependencies(queue.pop()):
            if any(name in wanted or _installed(name) for name in group):
                continue
            wanted.append(group[0])
            queue.append(group[0])
    return wanted


def _apt_knows(package: str) -> bool:
    out = subprocess.run(["apt-cache", "policy", package], capture_output=True, text=True).stdout
    match = re.search(r"Candidate:\s*(\S+)", out)
    return match is not None and match.group(1) != "(none)"


def _dependencies(package: str) -> list[list[str]]:
    """The Depends/Pre-Depends of ``package``: groups of alternatives, virtual names left out."""
    out = subprocess.run(
        ["apt-cache", "depends", "--no-recommends", "--no-suggests", "--no-conflicts", "--no-breaks",
         "--no-replaces", "--no-enhances", package], capture_output=True, text=True).stdout
    groups: list[list[str]] = []
    continues = False
    for line in out.splitlines():
        match = re.match(r"\s*(\|?)(?:Pre)?Depends:\s*(\S+)", line)
        if not match:
            continue
        name = match.group(2).split(":")[0]
        if continues:
            groups[-1].append(name)
        else:
            groups.append([name])
        continues = match.group(1) == "|"
    real = [[name for name in group if not name.startswith("<")] for group in groups]
    return [group for group in real if group]


def _installed(package: str) -> bool:
    out = subprocess.run(["dpkg-query", "-W", "-f=${db:Status-Status}\n", package], capture_output=True, text=True)
    return out.returncode == 0 and "installed" in out.stdout.split()


def _apt_download(packages: list[str], into: Path) -> None:
    command = ["apt-get", "download", "-q", *packages]
    result = subprocess.run(command, cwd=into, capture_output=True, text=True)
    if result.returncode != 0 and os.geteuid() == 0:
        # Stale lists name files the mirror no longer has.
        _run(["apt-get", "update", "-qq"], "`apt-get update` failed")
        result = subprocess.run(command, cwd=into, capture_output=True, text=True)
    if result.returncode != 0:
        raise KcatError(f"`apt-get download {' '.join(packages)}` failed (exit {result.returncode}): "
                        f"{_last_line(result)}")


def _check_libraries(binary: Path, lib_dirs: list[Path]) -> None:
    if shutil.which("ldd") is None:
        return
    env = {**os.environ, "LD_LIBRARY_PATH": ":".join(str(d) for d in lib_dirs)}
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, env=env).stdout
    missing = [line.split()[0] for line in out.splitlines() if "not found" in line]
    if missing:
        raise KcatError(f"the kcat unpacked from Debian's package needs libraries this system lacks: "
                        f"{', '.join(missing)} (install kcat with apt-get install kcat)")


def _works(path: Path) -> bool:
    try:
        result = subprocess.run([str(path), "-V"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0 and "kcat" in result.stdout + result.stderr


def _run(command: list[str], what: str) -> None:
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise KcatError(f"{what} (exit {result.returncode}): {_last_line(result)}")


def _last_line(result: subprocess.CompletedProcess) -> str:
    lines = [line for line in (result.stderr + result.stdout).splitlines() if line.strip()]
    return lines[-1].strip() if lines else "no output"


def main() -> int:
    try:
        print(ensure_kcat(say=lambda text: print(text, file=sys.stderr)))
    except KcatError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
