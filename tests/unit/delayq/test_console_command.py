"""`delayq console`: refused in one line when actions are on and nobody can log in; otherwise it serves the console,
says where, and stops cleanly on SIGTERM. Its index and its reads find no Kafka or ZooKeeper here: pages say so."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from delayq.cli import main


@pytest.fixture(autouse=True)
def no_login(monkeypatch):
    for name in ("DELAYQ_CONSOLE_USER", "DELAYQ_CONSOLE_PASSWORD", "DELAYQ_CONSOLE_TOKEN"):
        monkeypatch.delenv(name, raising=False)


def test_actions_on_without_a_login_refuse_to_start_in_one_line(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("DELAYQ_CONSOLE_ACTIONS", "true")
    assert main(["console", "--port", "0", "--data-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == (
        "delayq console: DELAYQ_CONSOLE_ACTIONS=true needs a login: set DELAYQ_CONSOLE_USER and "
        "DELAYQ_CONSOLE_PASSWORD, or DELAYQ_CONSOLE_TOKEN (or turn actions off)")
    assert list(tmp_path.iterdir()) == []  # no index opened


def test_the_console_serves_says_its_url_and_stops_on_sigterm(tmp_path):
    env = {**os.environ, "DELAYQ_CLUSTER": "t-console", "DELAYQ_BOOTSTRAP_SERVERS": "127.0.0.1:1",
           "DELAYQ_ZK_CONNECT": "127.0.0.1:1", "DELAYQ_CONSOLE_ACTIONS": "false"}
    process = subprocess.Popen([sys.executable, "-m", "delayq", "console", "--port", "0", "--data-dir",
                                str(tmp_path / "index")], env=env, stderr=subprocess.PIPE, text=True)
    try:
        url = None
        deadline = time.monotonic() + 30
        while url is None and time.monotonic() < deadline:
            line = process.stderr.readline()
            found = re.search(r"console of cluster t-console: (http://127\.0\.0\.1:\d+/console/) \(actions off\)",
                              line)
            url = found.group(1) if found else None
        assert url is not None, "no line with the console's URL"
        with urllib.request.urlopen(url + "login", timeout=10) as response:
            assert response.status == 200 and b'id="login"' in response.read()
        process.send_signal(signal.SIGTERM)
        assert process.wait(20) == 0
        assert "console stopped" in process.stderr.read()
    finally:
        process.kill()
        process.wait()
