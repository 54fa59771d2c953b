"""Debian packages unpacked without root into delayq's cache, for the tools tests and examples run (kcat, Chromium).

:func:`ensure_tools` returns a cache folder holding a working wrapper script for each :class:`Tool`:

1. the folder as an earlier fetch left it, when its ``.complete`` marker is there and every tool runs;
2. else the packages asked for and each package of their dependency closure that is not installed
   (nor left out), fetched with ``apt-get download`` and unpacked with ``dpkg-deb -x`` into
   ``<folder>/root``: no root needed. Each tool's wrapper runs its unpacked binary with
   ``LD_LIBRARY_PATH`` on every unpacked folder that holds libraries. Only when apt's package lists
   lack a package and we are root does it run ``apt-get update`` first.

The fetch is built in a scratch folder beside the target and moved into place whole, so an
interrupted fetch leaves nothing half done and two processes fetching at once both end well.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from delayq.errors import DelayqError
from delayq.paths import cache_lock

MARKER = ".complete"
# The tree the packages are unpacked into, inside the target folder; wrappers sit beside it.
ROOT = "root"
_WRAPPER = """#!/bin/sh
# {name} from Debian's packages, unpacked without root by delayq.dev.debian; its libraries ride along.
here=$(dirname -- "$(readlink -f -- "$0")")
LD_LIBRARY_PATH="{libs}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}" exec "$here/{binary}" "$@"
"""
_APT_TOOLS = ("apt-get", "apt-cache", "dpkg-deb", "dpkg-query")


class DebianError(DelayqError):
    """Debian's packages could not be fetched, unpacked or run; the one-line message says why and what to do."""


@dataclass(frozen=True)
class Tool:
    """A program of the fetched packages, run through a wrapper script named ``name`` in the cache folder.

    Attributes:
        name: the wrapper's file name in the folder (``kcat``, ``chromium``).
        binary: the program inside the unpacked tree (``usr/bin/kcat``, ``usr/lib/chromium/chromium``).
        works: given a path to the wrapper, whether it runs (a ``--version`` call, say).
    """

    name: str
    binary: str
    works: Callable[[Path], bool]


@dataclass(frozen=True)
class Wanted:
    """What to fetch and how to talk about it.

    Attributes:
        what: the name used in messages ("kcat", "Chromium").
        packages: the Debian packages to fetch; their dependencies come along.
        fix: what a person can do instead when the fetch fails ("install kcat (apt-get install kcat)").
        leave_out: dependencies never fetched (ones the tools do not load: desktop helpers, say).
    """

    what: str
    packages: tuple[str, ...]
    fix: str
    leave_out: frozenset[str] = frozenset()


class Apt:
    """apt and dpkg as subprocesses, a few packages a call; a stand-in with the same methods serves unit tests."""

    def knows(self, package: str) -> bool:
        """Whether apt's lists hold a candidate version of ``package``."""
        out = subprocess.run(["apt-cache", "policy", package], capture_output=True, text=True).stdout
        match = re.search(r"Candidate:\s*(\S+)", out)
        return match is not None and match.group(1) != "(none)"

    def depends(self, packages: Sequence[str]) -> dict[str, list[list[str]]]:
        """Each package's Depends and Pre-Depends (see :func:`parse_depends`)."""
        out = subprocess.run(
            ["apt-cache", "depends", "--no-recommends", "--no-suggests", "--no-conflicts", "--no-breaks",
             "--no-replaces", "--no-enhances", *packages], capture_output=True, text=True).stdout
        return parse_depends(out)

    def installed(self, packages: Sequence[str]) -> set[str]:
        """Which of ``packages`` dpkg has installed."""
        out = subprocess.run(["dpkg-query", "-W", "-f=${Package} ${db:Status-Status}\n", *packages],
                             capture_output=True, text=True).stdout
        return {line.split()[0] for line in out.splitlines() if line.split()[1:] == ["installed"]}

    def update(self) -> None:
        run(["apt-get", "update", "-qq"], "`apt-get update` failed")

    def download(self, package: str, into: Path) -> subprocess.CompletedProcess:
        return subprocess.run(["apt-get", "download", "-q", package], cwd=into, capture_output=True, text=True)


def ensure_tools(wanted: Wanted, target: Path, tools: Sequence[Tool], say: Callable[[str], None] = print,
                 apt: Apt | None = None) -> Path:
    """``target``, holding a working wrapper for each of ``tools``: as an earlier fetch left it, or fetched now.

    Args:
        wanted: the packages and how to name them in messages.
        target: the cache folder (``<cache>/kcat``, ``<cache>/chromium``).
        tools: the programs to wrap; each must run before the fetch counts as done.
        say: receives one line before the fetch, one per package, and one when ready (nothing if cached).
        apt: apt and dpkg (a stand-in in unit tests).

    Raises:
        DebianError: a package cannot be had, or a tool does not run from the unpacked tree.
    """
    if _ready(target, tools):
        return target
    with cache_lock(target):
        if _ready(target, tools):
            return target  # fetched meanwhile by another process
        return _fetch(wanted, target, tools, say, apt or Apt())


def _fetch(wanted: Wanted, target: Path, tools: Sequence[Tool], say: Callable[[str], None], apt: Apt) -> Path:
    """Fetch ``wanted``'s packages into ``target`` and wrap ``tools`` (the caller holds the entry's lock)."""
    for program in _APT_TOOLS:
        if shutil.which(program) is None:
            raise DebianError(f"{wanted.what} is not on PATH and there is no {program} to fetch Debian's "
                              f"{' and '.join(wanted.packages)} packages: {wanted.fix}")
    packages = packages_to_fetch(wanted, apt)
    say(f"{wanted.what} is not on PATH: fetching {len(packages)} Debian packages with `apt-get download` into "
        f"{target} (no root needed)")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{target.name}-") as scratch:
        debs = Path(scratch) / "debs"
        tree = Path(scratch) / target.name
        debs.mkdir()
        (tree / ROOT).mkdir(parents=True)
        for number, package in enumerate(packages, start=1):
            deb = _download(wanted, package, debs, apt)
            run(["dpkg-deb", "-x", str(deb), str(tree / ROOT)], f"`dpkg-deb -x {deb.name}` failed")
            say(f"  [{number}/{len(packages)}] {deb.name} ({_size(deb.stat().st_size)})")
        _wrap(wanted, tree, tools)
        (tree / MARKER).write_text("\n".join(sorted(deb.name for deb in debs.glob("*.deb"))) + "\n")
        if target.exists():
            shutil.rmtree(target)  # an unfinished or broken fetch: no process uses it (they check _ready)
        os.replace(tree, target)
    say(f"{wanted.what} ready: {', '.join(str(target / tool.name) for tool in tools)}")
    return target


def packages_to_fetch(wanted: Wanted, apt: Apt) -> list[str]:
    """The packages asked for, then every package of their dependency closure not installed nor left out.

    Of a group of alternatives (``a | b``), nothing is fetched when one is installed or already
    wanted, else the first. Dependencies are asked a level at a time: one ``apt-cache`` and one
    ``dpkg-query`` call per level, not per package.
    """
    for package in wanted.packages:
        _check_known(wanted, package, apt)
    chosen = list(wanted.packages)
    level = list(wanted.packages)
    while level:
        depends = apt.depends(level)
        groups = [group for package in level for group in depends.get(package, [])]
        installed = apt.installed(sorted({name for group in groups for name in group}))
        level = []
        for group in groups:
            if any(name in chosen or name in installed for name in group):
                continue
            first = group[0]
            if first in wanted.leave_out:
                continue
            chosen.append(first)
            level.append(first)
    return chosen


def parse_depends(output: str) -> dict[str, list[list[str]]]:
    """``apt-cache depends`` output for one or more packages -> each package's groups of alternatives.

    A group is the names of one Depends/Pre-Depends line and the lines it continues with ``|``;
    virtual names (``<name>``) are left out, and a group of only virtual names with them;
    architecture qualifiers (``:any``) are dropped.
    """
    found: dict[str, list[list[str]]] = {}
    groups: list[list[str]] = []
    continues = False
    for line in output.splitlines():
        if line and not line[0].isspace():
            groups = found.setdefault(line.strip(), [])
            continues = False
            continue
        match = re.match(r"\s*(\|?)(?:Pre)?Depends:\s*(\S+)", line)
        if not match:
            continue
        name = match.group(2).split(":")[0]
        if continues:
            groups[-1].append(name)
        else:
            groups.append([name])
        continues = match.group(1) == "|"
    return {package: [real for real in ([name for name in group if not name.startswith("<")] for group in groups)
                      if real]
            for package, groups in found.items()}


def wrapper_script(name: str, binary: str, library_dirs: Iterable[str]) -> str:
    """The shell script that runs ``binary`` (relative to the script's folder) with ``library_dirs`` loadable."""
    return _WRAPPER.format(name=name, libs=":".join(f"$here/{folder}" for folder in library_dirs), binary=binary)


def missing_libraries(binary: Path, library_dirs: Sequence[Path]) -> list[str]:
    """The shared libraries ``binary`` needs that neither the system nor ``library_dirs`` has (none without ldd)."""
    if shutil.which("ldd") is None:
        return []
    env = {**os.environ, "LD_LIBRARY_PATH": ":".join(str(folder) for folder in library_dirs)}
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, env=env).stdout
    return [line.split()[0] for line in out.splitlines() if "not found" in line]


def run(command: list[str], what: str) -> None:
    """Run ``command``; on failure raise :class:`DebianError` with ``what`` and the last line it printed."""
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise DebianError(f"{what} (exit {result.returncode}): {last_line(result)}")


def last_line(result: subprocess.CompletedProcess) -> str:
    lines = [line for line in (result.stderr + result.stdout).splitlines() if line.strip()]
    return lines[-1].strip() if lines else "no output"


# -- steps of a fetch ----------------------------------------------------------------------


def _ready(target: Path, tools: Collection[Tool]) -> bool:
    return (target / MARKER).is_file() and all(tool.works(target / tool.name) for tool in tools)


def _check_known(wanted: Wanted, package: str, apt: Apt) -> None:
    if apt.knows(package):
        return
    if os.geteuid() == 0:
        apt.update()
        if apt.knows(package):
            return
    fix = "check the APT sources" if os.geteuid() == 0 else "run `sudo apt-get update`"
    raise DebianError(f"{wanted.what} is not on PATH and apt's package lists hold no {package} package "
                      f"({fix}, or {wanted.fix})")


def _download(wanted: Wanted, package: str, into: Path, apt: Apt) -> Path:
    before = set(into.glob("*.deb"))
    result = apt.download(package, into)
    if result.returncode != 0 and os.geteuid() == 0:
        apt.update()  # stale lists name files the mirror no longer has
        result = apt.download(package, into)
    fetched = sorted(set(into.glob("*.deb")) - before)
    if result.returncode != 0 or not fetched:
        raise DebianError(f"`apt-get download {package}` failed (exit {result.returncode}): {last_line(result)}; "
                          f"{wanted.fix}")
    return fetched[0]


def _size(size: int) -> str:
    return f"{size / 1e6:.1f} MB" if size >= 1e6 else f"{size / 1e3:.0f} kB"


def _wrap(wanted: Wanted, tree: Path, tools: Sequence[Tool]) -> None:
    """A wrapper per tool in ``tree``, each checked to find its libraries and to run."""
    library_dirs = sorted({found.parent.relative_to(tree) for found in (tree / ROOT).rglob("*.so*")
                           if found.is_file()})
    for tool in tools:
        binary = tree / ROOT / tool.binary
        if not binary.is_file():
            raise DebianError(f"Debian's {', '.join(wanted.packages)} packages hold no {tool.binary}; {wanted.fix}")
        missing = missing_libraries(binary, [tree / folder for folder in library_dirs])
        if missing:
            raise DebianError(f"the {tool.name} unpacked from Debian's packages needs libraries this system lacks: "
                              f"{', '.join(missing)}; {wanted.fix}")
        wrapper = tree / tool.name
        wrapper.write_text(wrapper_script(tool.name, f"{ROOT}/{tool.binary}", (str(d) for d in library_dirs)))
        wrapper.chmod(0o755)
        if not tool.works(wrapper):
            raise DebianError(f"the {tool.name} unpacked from Debian's packages does not run ({wrapper}); "
                              f"{wanted.fix}")
