"""The main job, shortened: real nodes, a SIGKILL of the master, and the Spark report at the end."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from confluent_kafka.admin import AdminClient
from support.process_testing import run_delayq

pytestmark = pytest.mark.integration


def test_demo_help_says_where_kafka_and_zookeeper_come_from():
    result = run_delayq("demo", "--help")

    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert "--state-dir DIR" in text and "--out DIR" in text
    assert "DELAYQ_BOOTSTRAP_SERVERS and DELAYQ_ZK_CONNECT when set" in text
    assert "else the embedded dev stack, which the demo starts" in text


@pytest.mark.slow
def test_short_demo_survives_the_master_kill_and_reconciles_clean(dev_stack, tmp_path):
    # The running dev stack, named the way a user names their own Kafka: the demo starts no stack.
    pids = [s.pid for s in dev_stack.status()]
    env = {**os.environ, "COLUMNS": "160", "DELAYQ_BOOTSTRAP_SERVERS": dev_stack.bootstrap_servers,
           "DELAYQ_ZK_CONNECT": dev_stack.zk_connect}
    result = subprocess.run(
        [sys.executable, "-m", "delayq", "demo", "--rate", "15", "--seconds", "8", "--min-delay", "2",
         "--max-delay", "6", "--out", str(tmp_path), "--seed", "7"],
        capture_output=True, text=True, env=env, timeout=600,
    )

    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert (f"Kafka at {dev_stack.bootstrap_servers}, ZooKeeper at {dev_stack.zk_connect} "
            "(DELAYQ_BOOTSTRAP_SERVERS and DELAYQ_ZK_CONNECT)") in output
    assert "starting the embedded" not in output
    assert [s.pid for s in dev_stack.status()] == pids and all(s.healthy for s in dev_stack.status())
    assert "SIGKILL to master" in output and "took over as master of shard 0, epoch 2" in output
    assert "3 shards" in output
    assert "every unpaid order timed out exactly once: True" in output
    [report_json] = tmp_path.glob("run-*/reconcile/report.json")
    assert (report_json.parent / "report.html").exists() and "report.html" in output
    report = json.loads(report_json.read_text())
    totals = report["totals"]
    assert totals["expected"] > 0 and totals["delivered"] == totals["expected"]
    assert (totals["duplicates"], totals["missing"], totals["unexpected"], totals["early"]) == (0, 0, 0, 0)
    # Nothing of the run is left on the stack: its cluster's topics and ZooKeeper folder are deleted.
    [cluster] = re.findall(r"deleted cluster (demo-[0-9a-f]+)'s topics and ZooKeeper folder", output)
    left = AdminClient({"bootstrap.servers": dev_stack.bootstrap_servers}).list_topics(timeout=10).topics
    assert not [t for t in left if t.startswith(f"delayq-{cluster}-") or t.startswith(f"{cluster}-")], sorted(left)
