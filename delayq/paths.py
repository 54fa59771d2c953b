"""Where delayq keeps what it downloads once: jars, helm, kcat (``DELAYQ_CACHE_DIR``, else ~/.cache/delayq)."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def cache_dir() -> Path:
    """The cache folder (not created here)."""
    explicit = os.environ.get("DELAYQ_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "delayq"


@contextmanager
def cache_lock(entry: Path) -> Iterator[None]:
    """Hold the lock of the cache entry ``entry`` (a folder) while filling it: processes filling it take turns.

    Without it, two that found the entry missing at once (two ``delayq dev up``, two reconciliations
    starting together) each cleared and refilled the same folder under the other. The lock is an ``flock`` on
    ``.<name>.lock`` beside the entry, which the system releases when its holder dies.
    """
    entry.parent.mkdir(parents=True, exist_ok=True)
    with open(entry.parent / f".{entry.name}.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
