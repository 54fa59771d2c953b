"""The README's shell blocks, run as a person pastes them: "Running nodes" on the real stack."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from support.process_testing import wait_until

from delayq.testing import free_server_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def shell_block(section: str) -> str:
    """The first ```sh block under the README heading ``section``."""
    text = (ROOT / "README.md").read_text()
    body = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```sh\n(.*?)```", body, re.S).group(1)


def test_running_nodes_works_when_pasted_and_the_nodes_stop_as_it_says(settings, tmp_path):
    block = shell_block("Running nodes")
    # The same lines, on ports free on this machine (8081/8082 may be taken here) and a cluster of this test's own.
    first, second = free_server_port(), free_server_port()
    block = block.replace("DELAYQ_HTTP_PORT=808$n", "DELAYQ_HTTP_PORT=$(eval echo \\$PORT_$n)")
    nodes = tmp_path / "nodes"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DELAYQ_") and k != "VIRTUAL_ENV"}
    env.update({"NODES": str(nodes), "PORT_1": str(first), "PORT_2": str(second), "DELAYQ_CLUSTER": settings.cluster,
                "PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", str(tmp_path))})
    try:
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=240)
        assert done.returncode == 0, done.stderr
        assert "master" in done.stdout, done.stdout

        def status() -> dict:
            shown = subprocess.run(["bash", "-c", 'source .venv/bin/activate && eval "$(delayq dev env)" && '
                                    "delayq status --json"], cwd=ROOT, env=env, capture_output=True, text=True)
            return json.loads(shown.stdout) if shown.returncode == 0 else {}

        assert wait_until(lambda: sorted(n["node_id"] for n in status().get("nodes", [])) == ["node-1", "node-2"],
                          timeout_s=30)
        assert {n["http"].rsplit(":", 1)[1] for n in status()["nodes"]} == {str(first), str(second)}
        assert sorted(p.name for p in (nodes / "node-1" / "shards").iterdir()) == ["0", "1", "2"]
        assert (nodes / "node-2.log").is_file()
        assert wait_until(lambda: all(s["master"] for s in status().get("shards", [{}])), timeout_s=30)
        assert len(status()["shards"]) == 3, "the README's init --shards 3"

        def console_answers() -> bool:  # the README's nodes serve the web console on their own port
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{first}/console/", timeout=10) as page:
                    return page.status == 200 and b'id="shards"' in page.read()
            except OSError:
                return False

        assert wait_until(console_answers, timeout_s=30), "node-1 serves no console at /console/"
    finally:
        pids = [int(p.read_text()) for p in nodes.glob("node-*.pid")]
        for pid in pids:  # the README's way to stop them: SIGTERM
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 60
        while any(Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]
                  for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.2)
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z", \
            f"node {pid} still runs 60 s after SIGTERM"
    assert "stopping" in (nodes / "node-1.log").read_text()
