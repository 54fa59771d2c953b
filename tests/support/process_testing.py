"""Helpers tests share for running delayq's command line and for waiting on a condition."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from delayq import Settings
from delayq.testing import settings_env


def run_delayq(*args: str, settings: Settings | None = None, env: dict[str, str] | None = None,
               stdin: bytes | None = None, text: bool = True, timeout_s: float = 180) -> subprocess.CompletedProcess:
    """``python -m delayq ARGS`` as a person runs it: the settings' DELAYQ_* variables, then ``env``, a wide terminal."""
    full_env = {**os.environ, "COLUMNS": "200", **(settings_env(settings) if settings else {}), **(env or {})}
    return subprocess.run([sys.executable, "-m", "delayq", *args], input=stdin, capture_output=True, text=text,
                          env=full_env, timeout=timeout_s)


def wait_until(condition, timeout_s: float = 10.0, interval_s: float = 0.05) -> bool:
    """Poll ``condition()`` until it is true (True) or ``timeout_s`` passes (False)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval_s)
    return False


def assert_one_command_error(result: subprocess.CompletedProcess, command: str) -> None:
    """A command's error: one line on stderr, ``delayq <command>: ...``, no traceback."""
    assert result.stderr.count("\n") == 1 and result.stderr.startswith(f"delayq {command}: "), result.stderr


def assert_one_error_line(result: subprocess.CompletedProcess) -> str:
    """The node's reason is one log line at ERROR, and nothing else went wrong loudly (no traceback)."""
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1, result.stderr
    assert "cannot start" in errors[0]
    return errors[0]
