"""The report files: report.json's schema, report.html for a person, anomalies/*.parquet, the exit code."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from delayq import Settings
from delayq.spark import ANOMALY_KINDS, ReconcileOptions, load_report
from delayq.spark.job import Findings
from delayq.spark.summary import histogram
from delayq.spark.report import build_report, write_outputs

SINCE = 1_800_000_000_000
HOUR = 3_600_000
SCHEMA = pa.schema([
    ("id", pa.string()), ("topic", pa.string()), ("state", pa.string()), ("due_ms", pa.int64()),
    ("delivered_count", pa.int64()), ("first_ms", pa.int64()), ("last_ms", pa.int64()), ("lateness_ms", pa.int64()),
    ("first_epoch", pa.int64()), ("last_epoch", pa.int64()), ("cancel_ms", pa.int64()),
    ("cancel_too_late", pa.bool_()), ("is_expected", pa.bool_()), ("in_grace", pa.bool_()),
    ("is_delivered", pa.bool_()), ("is_missing", pa.bool_()), ("is_duplicate", pa.bool_()),
    ("is_unexpected", pa.bool_()), ("is_early", pa.bool_()),
])


def anomaly(delay_id: str, *, flag: str, topic: str = "orders", copies: int = 1, first: int | None = None) -> dict:
    row = {name: False for name in SCHEMA.names if name.startswith("is_") or name in ("in_grace", "cancel_too_late")}
    row.update(id=delay_id, topic=topic, state="scheduled", due_ms=SINCE + HOUR, delivered_count=copies,
               first_ms=first, last_ms=first, lateness_ms=None if first is None else first - SINCE - HOUR,
               first_epoch=3 if copies else None, last_epoch=3 + copies - 1 if copies else None, cancel_ms=None,
               is_expected=True, **{flag: True})
    return row


def counts(**anomalies: int) -> dict[str, int]:
    base = dict.fromkeys(("expected", "delivered", "delivered_records", "duplicates", "duplicate_records", "missing",
                          "unexpected", "unknown", "early", "cancelled", "cancelled_too_late", "in_grace",
                          "buffer_records", "malformed_buffer_records"), 0)
    base.update(expected=100, delivered=100, delivered_records=100, buffer_records=200)
    base.update(anomalies)
    return base


def findings(rows: list[dict], **anomalies: int) -> Findings:
    lateness = {"p50": 12, "p90": 40, "p99": 95, "max": 180, "min": 0, "count": 100}
    return Findings(
        totals=counts(**anomalies), lateness=lateness,
        by_topic={"<orders>": {**counts(**anomalies), "lateness_ms": lateness}},
        per_hour=[{"hour_ms": SINCE + h * HOUR, **counts(**anomalies), "lateness_ms": lateness} for h in range(3)],
        histogram=histogram({3: 60, 7: 30, 150: 10}),
        worst_late=[{"id": "late-1", "topic": "orders", "due_ms": SINCE, "first_ms": SINCE + 180,
                     "lateness_ms": 180, "delivered_count": 1, "first_epoch": 3, "last_epoch": 3}],
        anomalies=pa.Table.from_pylist(rows, schema=SCHEMA), target_topics=["<orders>"], missing_topics=[],
        timings_s={"judge": 1.0}, spark_version="4.0.0")


def options(tmp_path: Path, **changes) -> ReconcileOptions:
    return ReconcileOptions(since_ms=SINCE, until_ms=SINCE + 24 * HOUR, out=tmp_path / "report", **changes)


def test_clean_report_exits_zero_and_writes_json_html_and_four_empty_parquet_files(tmp_path):
    chosen = options(tmp_path)
    report = write_outputs(build_report(findings([]), Settings(), chosen), pa.Table.from_pylist([], schema=SCHEMA),
                           chosen.out)

    assert report.ok and report.exit_code == 0
    document = load_report(chosen.out)
    assert set(document["totals"]) >= {"expected", "delivered", "duplicates", "missing", "unexpected", "early"}
    assert set(document["lateness_ms"]) >= {"p50", "p90", "p99", "max"}
    assert document["anomalies"] == {kind: [] for kind in ANOMALY_KINDS}
    assert document["exit_code"] == 0 and document["ok"] is True
    assert document["window"]["since"] == "2027-01-15T08:00:00.000Z" and document["window"]["grace_ms"] == 300_000
    for kind in ANOMALY_KINDS:
        table = pq.read_table(chosen.out / "anomalies" / f"{kind}.parquet")
        assert table.num_rows == 0 and {"id", "due", "first_delivery", "last_epoch"} <= set(table.column_names)
    assert "OK: every expected message was delivered" in (chosen.out / "report.html").read_text()


def test_anomalies_are_listed_capped_in_json_and_complete_in_parquet(tmp_path):
    rows = [anomaly(f"dup-{i}", flag="is_duplicate", copies=2, first=SINCE + HOUR + 5) for i in range(5)]
    rows.append(anomaly("lost-1", flag="is_missing", copies=0))
    chosen = options(tmp_path, list_limit=3)
    table = pa.Table.from_pylist(rows, schema=SCHEMA)

    report = write_outputs(build_report(findings(rows, duplicates=5, missing=1), Settings(), chosen), table,
                           chosen.out)

    assert report.exit_code == 1
    document = json.loads((chosen.out / "report.json").read_text())
    assert document["anomalies"]["duplicates"] == ["dup-0", "dup-1", "dup-2"]
    assert document["anomalies_truncated"] == {"duplicates": True, "missing": False, "unexpected": False,
                                               "early": False}
    assert document["anomalies"]["missing"] == ["lost-1"]
    duplicates = pq.read_table(chosen.out / "anomalies" / "duplicates.parquet").to_pylist()
    assert [r["id"] for r in duplicates] == [f"dup-{i}" for i in range(5)]
    assert (duplicates[0]["delivered_count"], duplicates[0]["first_epoch"], duplicates[0]["last_epoch"]) == (2, 3, 4)
    assert str(duplicates[0]["due"]) == "2027-01-15 09:00:00+00:00"
    assert pq.read_table(chosen.out / "anomalies" / "missing.parquet").column("id").to_pylist() == ["lost-1"]


@pytest.mark.parametrize("duplicates,missing,unexpected,early,code", [
    (0, 0, 0, 0, 0), (1, 0, 0, 0, 1), (0, 1, 0, 0, 1), (0, 0, 4, 2, 0),
])
def test_exit_code_alerts_on_duplicates_and_missing_only(tmp_path, duplicates, missing, unexpected, early, code):
    report = build_report(findings([], duplicates=duplicates, missing=missing, unexpected=unexpected, early=early),
                          Settings(), options(tmp_path))
    assert report.exit_code == code


def test_html_shows_status_totals_two_inline_charts_and_escapes_names(tmp_path):
    rows = [anomaly("<img src=x>", flag="is_missing", copies=0, topic="<orders>")]
    chosen = options(tmp_path)

    write_outputs(build_report(findings(rows, missing=1), Settings(), chosen),
                  pa.Table.from_pylist(rows, schema=SCHEMA), chosen.out)

    page = (chosen.out / "report.html").read_text()
    assert "ALERT: 1 missing, 0 duplicated (exit code 1)" in page
    assert page.count("<svg") == 2 and "Lateness of first delivery" in page and "Messages per hour" in page
    assert "<img src=x>" not in page and "&lt;img src=x&gt;" in page
    assert "&lt;orders&gt;" in page and "late-1" in page
    assert "<td class=l>3–4</td>" not in page  # the missing one was never delivered: no epochs
