"""Chromium and its chromedriver, for the tests that drive the web console in a real headless browser.

:func:`ensure_chromium` returns ``(chromium, chromedriver)``, two programs that run and belong together:

1. a ``chromium`` (or ``chromium-browser``, ``google-chrome``) and a ``chromedriver`` on ``PATH``
   whose major versions agree;
2. else the pair unpacked earlier into the cache (``<cache>/chromium``, the cache of the dev
   stack's jars: ``$DELAYQ_CACHE_DIR``, else ``$XDG_CACHE_HOME/delayq``, else ``~/.cache/delayq``);
3. else Debian's ``chromium`` and ``chromium-driver`` packages and each package they depend on that
   is not installed, fetched and unpacked into that cache without root by :mod:`delayq.dev.debian`
   (about 100 MB, once). The cached ``chromium`` and ``chromedriver`` are small scripts that run the
   unpacked binaries with ``LD_LIBRARY_PATH`` on the unpacked libraries (``usr/lib/x86_64-linux-gnu``,
   ``usr/lib/chromium``, ...).

Chromium's desktop helpers (GTK, xdg-utils) are left out: headless Chromium does not load them.

``python -m delayq.dev.chromium`` prints both paths (fetching them if need be).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from delayq.errors import DelayqError

from .debian import DebianError, Tool, Wanted, ensure_tools
from .runtime import cache_dir

BROWSER_NAMES = ("chromium", "chromium-browser", "google-chrome")
DRIVER_NAME = "chromedriver"
WANTED = Wanted(
    "Chromium", ("chromium", "chromium-driver"),
    fix="install Chromium and its driver (apt-get install chromium chromium-driver) and put both on PATH",
    # Loaded by a desktop session only (the GTK file picker, opening links in other programs).
    leave_out=frozenset({"libgtk-3-0", "xdg-utils"}))


class ChromiumError(DelayqError):
    """No Chromium with a matching chromedriver is on PATH and none could be fetched; the message says why."""


def chromium_dir() -> Path:
    """Where a fetched Chromium is unpacked: ``<cache>/chromium``."""
    return cache_dir() / "chromium"


def ensure_chromium(say: Callable[[str], None] = print) -> tuple[Path, Path]:
    """``(chromium, chromedriver)``: the pair on PATH, the cached one, or a freshly fetched one.

    Args:
        say: receives a line before the fetch, one per package and one after it (nothing is said otherwise).

    Raises:
        ChromiumError: none of those works; the message says why and how to fix it.
    """
    on_path = _pair_on_path()
    if on_path is not None:
        return on_path
    tools = [Tool("chromium", "usr/lib/chromium/chromium", _browser_works),
             Tool(DRIVER_NAME, "usr/bin/chromedriver", _driver_works)]
    try:
        folder = ensure_tools(WANTED, chromium_dir(), tools, say=say)
    except DebianError as err:
        raise ChromiumError(str(err)) from err
    return folder / "chromium", folder / DRIVER_NAME


def major_version(version_text: str) -> int | None:
    """The major version in ``Chromium 156.0.8078.108 built on Debian`` or ``ChromeDriver 156.0.8078.108 (...)``."""
    match = re.search(r"\b(\d+)\.\d+\.\d+\.\d+\b", version_text)
    return int(match.group(1)) if match else None


def _pair_on_path() -> tuple[Path, Path] | None:
    driver = shutil.which(DRIVER_NAME)
    if driver is None:
        return None
    driver_major = major_version(_version(Path(driver)))
    for name in BROWSER_NAMES:
        browser = shutil.which(name)
        if browser and driver_major is not None and major_version(_version(Path(browser))) == driver_major:
            return Path(browser), Path(driver)
    return None


def _browser_works(path: Path) -> bool:
    return "Chrom" in _version(path)


def _driver_works(path: Path) -> bool:
    return "ChromeDriver" in _version(path)


def _version(path: Path) -> str:
    """What ``path --version`` prints, or "" when it does not run."""
    try:
        result = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return result.stdout.strip() if result.returncode == 0 else ""


def main() -> int:
    try:
        browser, driver = ensure_chromium(say=lambda text: print(text, file=sys.stderr))
    except ChromiumError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(browser)
    print(driver)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
