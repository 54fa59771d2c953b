"""CPU of processes and of the machine, from Linux /proc: what the bench suites read beside their figures."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path


def cpu_seconds(pids: list[int]) -> float:
    """User plus system CPU seconds of ``pids`` so far, all their threads (a pid that is gone counts 0)."""
    return _stat_seconds(Path(f"/proc/{pid}/stat") for pid in pids)


def thread_cpu_seconds(tids: list[int]) -> float:
    """User plus system CPU seconds of this process's threads ``tids`` (native ids) so far (one gone counts 0)."""
    return _stat_seconds(Path(f"/proc/self/task/{tid}/stat") for tid in tids)


def threads_named(prefix: str) -> set[int]:
    """Native ids of this process's threads whose name starts with ``prefix`` (librdkafka's: ``rdk:``)."""
    found = set()
    for task in Path("/proc/self/task").iterdir():
        try:
            if (task / "comm").read_text().startswith(prefix):
                found.add(int(task.name))
        except OSError:  # the thread ended meanwhile
            continue
    return found


def _stat_seconds(paths: Iterable[Path]) -> float:
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for path in paths:
        try:
            fields = path.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    return total / tick


def machine_ticks() -> tuple[int, int]:
    """(busy, all) clock ticks of every core so far, from /proc/stat (idle and iowait are not busy)."""
    try:
        fields = [int(f) for f in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return 0, 0
    return sum(fields) - fields[3] - fields[4], sum(fields)


def busy_cores_between(before: tuple[int, int], after: tuple[int, int]) -> float:
    """Cores' worth of CPU the machine spent outside idle between two :func:`machine_ticks` samples."""
    busy, every = after[0] - before[0], after[1] - before[1]
    return busy / every * (os.cpu_count() or 1) if every > 0 else 0.0
