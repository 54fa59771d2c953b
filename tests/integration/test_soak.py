"""The 2-minute chaos soak, as `delayq soak` runs it: every fault kind happens, and the promise holds.

The soak starts a stack of its own on free ports (the session's dev stack is left alone),
so this test needs Java and the cached jars, not the `dev_stack` fixture.
"""

from __future__ import annotations

import json

import pytest
from process_testing import run_delayq

from delayq.bench.soak_faults import FAULT_KINDS

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SEED = 20261123


@pytest.mark.timeout(900)
def test_a_two_minute_soak_injects_every_fault_and_breaks_no_rule(tmp_path):
    done = run_delayq("soak", "--duration", "2m", "--seed", str(SEED), "--json", "--state-dir", str(tmp_path),
                      timeout_s=880)

    assert done.returncode in (0, 1), f"the soak could not run (exit {done.returncode}):\n{done.stderr[-3000:]}"
    result = json.loads(done.stdout)
    assert result["seed"] == SEED
    assert {kind: result["faults"][kind] >= 1 for kind in FAULT_KINDS} == dict.fromkeys(FAULT_KINDS, True), (
        f"faults injected: {result['faults']}; skipped: {result['faults_skipped']}")
    assert result["sent"] > 10_000 and result["cancelled"] > 0 and result["rescheduled"] > 0
    # The node logs first: the anomalies' own records can fill any budget.
    first_anomalies = {kind: items[:1] for kind, items in result["anomalies"].items()}
    evidence = json.dumps({"failures": result["failures"], "fault_windows": result["fault_windows"],
                           "anomaly_node_logs": result["anomaly_node_logs"], "anomalies": first_anomalies,
                           **{k: result[k] for k in ("stall_beyond_outages", "node_crashes", "reconcile")}},
                          indent=1)[:30_000]
    assert {k: result[k] for k in ("duplicated", "missing", "early", "cancel_ignored", "unexpected", "crashes")} == {
        "duplicated": 0, "missing": 0, "early": 0, "cancel_ignored": 0, "unexpected": 0, "crashes": 0}, evidence
    assert result["max_stall_beyond_outages_s"] <= result["stall_limit_s"], evidence
    assert result["reconcile"]["ran"] and result["reconcile"]["agrees"], evidence
    assert result["passed"] and done.returncode == 0, evidence
