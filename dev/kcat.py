"""kcat, the librdkafka command-line client, for the wire-format examples and their tests.

:func:`ensure_kcat` returns a path to a working ``kcat``:

1. ``$DELAYQ_KCAT``, if set (it must work);
2. the ``kcat`` on ``PATH``;
3. one unpacked earlier into the cache (``<cache>/kcat``, the cache of the dev stack's jars:
   ``$DELAYQ_CACHE_DIR``, else ``$XDG_CACHE_HOME/delayq``, else ``~/.cache/delayq``);
4. else Debian's ``kcat`` package and each package it depends on that is not installed
   (librdkafka1, libyajl2), fetched and unpacked into that cache without root by
   :mod:`delayq.dev.debian`; the cached ``kcat`` is a small script that runs the unpacked
   binary with ``LD_LIBRARY_PATH`` on the unpacked libraries.

``python -m delayq.dev.kcat`` prints the path (fetching it if need be).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from delayq.errors import DelayqError

from .debian import DebianError, Tool, Wanted, ensure_tools
from .runtime import cache_dir

PACKAGE = "kcat"
ENV_OVERRIDE = "DELAYQ_KCAT"
WANTED = Wanted(PACKAGE, (PACKAGE,),
                fix=f"install kcat (apt-get install kcat, brew install kcat) or set ${ENV_OVERRIDE} to its path")


class KcatError(DelayqError):
    """kcat is not on PATH and could not be fetched; the one-line message says why and what to do."""


def kcat_dir() -> Path:
    """Where a fetched kcat is unpacked: ``<cache>/kcat``."""
    return cache_dir() / "kcat"


def ensure_kcat(say: Callable[[str], None] = print) -> Path:
    """A path to a kcat that runs: ``$DELAYQ_KCAT``, the one on PATH, the cached one, or a freshly fetched one.

    Args:
        say: receives a line before the fetch, one per package and one after it (nothing is said otherwise).

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
    try:
        return ensure_tools(WANTED, kcat_dir(), [Tool(PACKAGE, "usr/bin/kcat", _works)], say=say) / PACKAGE
    except DebianError as err:
        raise KcatError(str(err)) from err


def _works(path: Path) -> bool:
    try:
        result = subprocess.run([str(path), "-V"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0 and "kcat" in result.stdout + result.stderr


def main() -> int:
    try:
        print(ensure_kcat(say=lambda text: print(text, file=sys.stderr)))
    except KcatError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
