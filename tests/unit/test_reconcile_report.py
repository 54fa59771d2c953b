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
from delayq.spark.report import build_report, write_outputs
from delayq.spark.summary import histogram

SINCE = 1_800_000_000_000
HOUR = 3_600_000
SCHEMA = pa.schema([
    ("id", pa.string()), ("topic", pa.string()), ("state", pa.string()), ("due_ms", pa.int64()),
    ("version", pa.int64()), ("delivered_count", pa.int64()), ("versions_delivered", pa.int64()),
    ("duplicate_records", pa.int64()), ("first_ms", pa.int64()), ("last_ms", pa.int64()),
    ("lateness_ms", pa.int64()), ("first_epoch", pa.int64()), ("last_epoch", pa.int64()),
    ("cancel_offset", pa.int64()), ("cancel_ms", pa.int64()), ("cutoff", pa.int64()),
    ("cancel_too_late", pa.bool_()), ("rescheduled_too_late", pa.bool_()), ("ignored", pa.string()),
    ("is_expected", pa.bool_()), ("in_grace", pa.bool_()), ("is_delivered", pa.bool_()), ("is_missing", pa.bool_()),
    ("is_duplicate", pa.bool_()), ("is_unexpected", pa.bool_()), ("is_early", pa.bool_()),
    ("is_cancel_ignored", pa.bool_()),
])
FLAGS = ("in_grace", "cancel_too_late", "rescheduled_too_late")


def anomaly(delay_id: str, *, flag: str, topic: str = "orders", copies: int = 1, first: int | None = None,
            **changes) -> dict:
    row = {name: False for name in SCHEMA.names if name.startswith("is_") or name in FLAGS}
    row.update(id=delay_id, topic=topic, state="scheduled", due_ms=SINCE + HOUR, version=7, delivered_count=copies,
               versions_delivered=1 if copies else 0, duplicate_records=max(copies - 1, 0), first_ms=first,
               last_ms=first, lateness_ms=None if first is None else first - SINCE - HOUR,
               first_epoch=3 if copies else None, last_epoch=3 + copies - 1 if copies else None, cancel_offset=None,
               cancel_ms=None, cutoff=None, ignored=None, is_expected=True, **{flag: True})
    row.update(changes)
    return row


def counts(**anomalies: int) -> dict[str, int]:
    base = dict.fromkeys(("expected", "delivered", "delivered_records", "duplicates", "duplicate_records", "missing",
                          "unexpected", "unknown", "early", "cancel_ignored", "cancelled", "cancelled_too_late",
                          "rescheduled_too_late", "in_grace", "buffer_records", "malformed_buffer_records"), 0)
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


def test_clean_report_exits_zero_and_writes_json_html_and_an_empty_parquet_file_per_kind(tmp_path):
    chosen = options(tmp_path)
    report = write_outputs(build_report(findings([]), Settings(), chosen), pa.Table.from_pylist([], schema=SCHEMA),
                           chosen.out)

    assert report.ok and report.exit_code == 0
    document = load_report(chosen.out)
    assert set(document["totals"]) >= {"expected", "delivered", "duplicates", "missing", "unexpected", "early",
                                       "cancel_ignored", "cancelled_too_late", "rescheduled_too_late"}
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
                                               "early": False, "cancel_ignored": False}
    assert document["anomalies"]["missing"] == ["lost-1"]
    duplicates = pq.read_table(chosen.out / "anomalies" / "duplicates.parquet").to_pylist()
    assert [r["id"] for r in duplicates] == [f"dup-{i}" for i in range(5)]
    assert (duplicates[0]["delivered_count"], duplicates[0]["first_epoch"], duplicates[0]["last_epoch"]) == (2, 3, 4)
    assert str(duplicates[0]["due"]) == "2027-01-15 09:00:00+00:00"
    assert pq.read_table(chosen.out / "anomalies" / "missing.parquet").column("id").to_pylist() == ["lost-1"]


@pytest.mark.parametrize("kind", ANOMALY_KINDS)
def test_each_anomaly_kind_alone_makes_the_exit_code_1(tmp_path, kind):
    assert build_report(findings([]), Settings(), options(tmp_path)).exit_code == 0
    report = build_report(findings([], **{kind: 1}), Settings(), options(tmp_path))
    assert (report.ok, report.exit_code) == (False, 1)


def test_informational_counts_do_not_alert(tmp_path):
    quiet = findings([], cancelled=3, cancelled_too_late=2, rescheduled_too_late=4, in_grace=5, unknown=0)
    assert build_report(quiet, Settings(), options(tmp_path)).exit_code == 0


def test_ignored_cancels_and_reschedules_are_listed_apart_and_named_in_the_page(tmp_path):
    rows = [anomaly("c-1", flag="is_cancel_ignored", first=SINCE + HOUR + 5, state="cancelled", ignored="cancel",
                    cancel_offset=41, cutoff=43),
            anomaly("r-1", flag="is_cancel_ignored", copies=2, first=SINCE + HOUR - 60_000, ignored="reschedule",
                    versions_delivered=2),
            anomaly("m-1", flag="is_missing", copies=0)]
    chosen = options(tmp_path)
    table = pa.Table.from_pylist(rows, schema=SCHEMA)

    report = write_outputs(build_report(findings(rows, cancel_ignored=2, missing=1), Settings(), chosen), table,
                           chosen.out)

    assert report.exit_code == 1
    assert report.anomalies["cancel_ignored"] == ["c-1", "r-1"] and report.anomalies["missing"] == ["m-1"]
    ignored = pq.read_table(chosen.out / "anomalies" / "cancel_ignored.parquet").to_pylist()
    assert [(r["id"], r["ignored"], r["cancel_offset"], r["cutoff"]) for r in ignored] == \
        [("c-1", "cancel", 41, 43), ("r-1", "reschedule", None, None)]
    page = (chosen.out / "report.html").read_text()
    assert "ALERT: 1 missing, 2 cancel or reschedule ignored (exit code 1)" in page
    assert "Cancel ignored: 2" in page and "cancelled, cancel ignored" in page and "scheduled, reschedule ignored" in page


def test_html_shows_status_totals_two_inline_charts_and_escapes_names(tmp_path):
    rows = [anomaly("<img src=x>", flag="is_missing", copies=0, topic="<orders>")]
    chosen = options(tmp_path)

    write_outputs(build_report(findings(rows, missing=1), Settings(), chosen),
                  pa.Table.from_pylist(rows, schema=SCHEMA), chosen.out)

    page = (chosen.out / "report.html").read_text()
    assert "ALERT: 1 missing (exit code 1)" in page
    assert page.count("<svg") == 2 and "Lateness of first delivery" in page and "Messages per hour" in page
    assert "<img src=x>" not in page and "&lt;img src=x&gt;" in page
    assert "&lt;orders&gt;" in page and "late-1" in page
    assert "<td class=l>3–4</td>" not in page  # the missing one was never delivered: no epochs


def test_terminal_summary_shows_every_kind_and_names_the_alert(tmp_path):
    from rich.console import Console

    from delayq.spark.cli import print_summary

    console = Console(record=True, width=120)
    report = build_report(findings([], cancel_ignored=2, early=1), Settings(), options(tmp_path))
    print_summary(report, console)

    text = console.export_text()
    assert "cancel ignored" in text and "rescheduled too late" in text and "cancelled too late" in text
    assert "ALERT: 1 early, 2 cancel or reschedule ignored" in text
