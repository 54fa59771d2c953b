"""The cache's folder and the lock that makes processes filling one entry take turns."""

from __future__ import annotations

import subprocess
import sys
import time

from delayq.paths import cache_dir, cache_lock


def test_the_cache_folder_is_the_variable_else_xdg_else_home(monkeypatch, tmp_path):
    monkeypatch.setenv("DELAYQ_CACHE_DIR", str(tmp_path / "mine"))
    assert cache_dir() == tmp_path / "mine"
    monkeypatch.delenv("DELAYQ_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "delayq"


def test_a_second_process_waits_for_the_entrys_lock_until_its_holder_lets_go(tmp_path):
    entry = tmp_path / "cache" / "kafka-4.3.1"
    waiter = [sys.executable, "-c",
              "import sys, time; from pathlib import Path; from delayq.paths import cache_lock\n"
              f"with cache_lock(Path({str(entry)!r})): print(time.monotonic(), flush=True)"]
    with cache_lock(entry):
        held_until = time.monotonic() + 1.0
        process = subprocess.Popen(waiter, stdout=subprocess.PIPE, text=True)
        time.sleep(1.0)
        assert process.poll() is None, "the second process took the lock its holder still held"
    out, _ = process.communicate(timeout=30)
    assert process.returncode == 0
    assert float(out) >= held_until, "the second process got the lock before the first let go"
    assert (tmp_path / "cache" / ".kafka-4.3.1.lock").exists()
