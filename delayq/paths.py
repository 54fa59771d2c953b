"""Where delayq keeps what it downloads once: jars, helm, kcat (``DELAYQ_CACHE_DIR``, else ~/.cache/delayq)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """The cache folder (not created here)."""
    explicit = os.environ.get("DELAYQ_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "delayq"
