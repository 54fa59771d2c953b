"""The main job, shortened: real nodes, a SIGKILL of the master, and the Spark report at the end."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_short_demo_survives_the_master_kill_and_reconciles_clean(dev_stack, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "delayq", "demo", "--rate", "15", "--seconds", "8", "--min-delay", "2",
         "--max-delay", "6", "--state-dir", str(tmp_path), "--seed", "7"],
        capture_output=True, text=True, env={**os.environ, "COLUMNS": "160"}, timeout=600,
    )

    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "SIGKILL to master" in output and "took over as master, epoch 2" in output
    assert "every unpaid order timed out exactly once: True" in output
    [report_json] = tmp_path.glob("run-*/reconcile/report.json")
    assert (report_json.parent / "report.html").exists() and "report.html" in output
    report = json.loads(report_json.read_text())
    totals = report["totals"]
    assert totals["expected"] > 0 and totals["delivered"] == totals["expected"]
    assert (totals["duplicates"], totals["missing"], totals["unexpected"], totals["early"]) == (0, 0, 0, 0)
