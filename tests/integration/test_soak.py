"""The 2-minute chaos soak, as `delayq soak` runs it: every fault kind happens, and the promise holds.

One run (the suite's time budget), with the soak's defaults: 3 shards, each on 2 of the 3 nodes,
and every fault kind, the broker's and ZooKeeper's pauses included.

The soak starts a stack of its own on free ports (the session's dev stack is left alone),
so this test needs Java and the cached jars, not the `dev_stack` fixture.
"""

from __future__ import annotations

import json

import pytest
from support.process_testing import run_delayq

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
    assert (result["nodes"], result["shards"], result["replicas"]) == (3, 3, 2)
    assert {kind: result["faults"][kind] >= 1 for kind in FAULT_KINDS} == dict.fromkeys(FAULT_KINDS, True), (
        f"faults injected: {result['faults']}; skipped: {result['faults_skipped']}")
    assert result["sent"] > 10_000 and result["cancelled"] > 0 and result["rescheduled"] > 0
    evidence = _evidence(result)
    # Puts the client library appended twice (twice_written) are no anomaly: the nodes apply them once.
    zero = ("duplicated", "missing", "early", "cancel_ignored", "stale_version", "lost_reschedule", "reordered",
            "unexpected", "crashes")
    assert {k: result[k] for k in zero} == dict.fromkeys(zero, 0), evidence
    scan = result["buffer_scan"]
    assert scan["error"] is None and scan["producer_puts"] >= result["sent"] - result["write_errors"], evidence
    assert result["max_stall_beyond_outages_s"] <= result["stall_limit_s"], evidence
    assert result["reconcile"]["ran"] and result["reconcile"]["agrees"], evidence
    assert result["passed"] and done.returncode == 0, evidence


def _evidence(result: dict) -> str:
    """What a failed soak shows in CI, where a long message is cut in its middle: short lines, the leads first.

    Where the missing versions' puts are and what still holds their partitions, the faults
    in one line each, then the nodes' logs; never the anomaly lists in full.
    """
    started = result["started_ms"]

    def at(ms: int) -> str:
        return f"{(ms - started) / 1000:6.1f}s"

    def logs(by_node: dict[str, list[str]]) -> list[str]:
        # "2026-11-23 22:33:05,141 WARNING ..." -> "22:33:05,141 WARNING ...": the date is the run's.
        return [f"  {node}: {line[11:]}" for node, lines in by_node.items() for line in lines]

    reconcile = result["reconcile"] or {}
    lines = [
        f"failures: {'; '.join(result['failures'])}",
        f"missing by buffer partition (put offsets; acked and due, s after the start): "
        f"{json.dumps(result['missing_by_buffer_partition'])}",
        f"open transactions once the nodes stopped (buffer and targets): {json.dumps(result['open_transactions_at_end'])}",
        f"the buffer read after the run: {json.dumps(result['buffer_scan'])}",
        f"transaction markers the broker dropped (its own log): {len(result['kafka_dropped_markers'])}",
        *(f"  {line[:400]}" for line in result["kafka_dropped_markers"][:3]),
        "faults:",
        *(f"  {at(w['start_ms'])}-{at(w['end_ms'])} {w['kind']}: {w['detail']}" for w in result["fault_windows"]),
    ]
    stall = result["stall_beyond_outages"]
    if stall:
        lines.append(f"longest stall beyond outages: {at(stall['start_ms'])}-{at(stall['end_ms'])}, "
                     f"{stall.get('beyond_outages_s')}s beyond outages; the nodes then:")
        lines += logs(stall.get("node_logs", {}))
    for kind, by_node in result["anomaly_node_logs"].items():
        lines.append(f"around the first {kind} version, the nodes:")
        lines += logs(by_node)
    lines.append(f"reconcile: ran {reconcile.get('ran')}, agrees {reconcile.get('agrees')}, "
                 f"error {reconcile.get('error')}, totals {json.dumps(reconcile.get('totals'))}")
    for side in ("soak_only", "reconcile_only"):
        flagged = reconcile.get(side) or {}
        lines.append(f"  {side}: {len(flagged)} ids, e.g. {json.dumps(dict(list(flagged.items())[:3]))}")
    lines.append(f"crashes: {json.dumps(result['node_crashes'])[:2000]}")
    for kind, items in result["anomalies"].items():
        if items:
            lines.append(f"first {kind}: {json.dumps(items[0])[:1500]}")
    lines.append(f"failures: {'; '.join(result['failures'])}")
    return "\n".join(lines)
