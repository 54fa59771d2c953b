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
from delayq.spark.report import HTML_ROWS, build_report, write_outputs
from delayq.spark.summary import COUNT_FIELDS, histogram

SINCE = 1_800_000_000_000
HOUR = 3_600_000
SCHEMA = pa.schema([
    ("id", pa.string()), ("topic", pa.string()), ("state", pa.string()), ("due_ms", pa.int64()),
    ("version", pa.int64()), ("put_ms", pa.int64()), ("already_due", pa.bool_()),
    ("put_to_delivery_ms", pa.int64()), ("dead_letters", pa.int64()),
    ("delivered_count", pa.int64()), ("versions_delivered", pa.int64()),
    ("duplicate_records", pa.int64()), ("first_ms", pa.int64()), ("last_ms", pa.int64()),
    ("lateness_ms", pa.int64()), ("first_epoch", pa.int64()), ("last_epoch", pa.int64()),
    ("cancel_offset", pa.int64()), ("cancel_ms", pa.int64()), ("cutoff", pa.int64()),
    ("cancel_too_late", pa.bool_()), ("cancel_late_by", pa.string()), ("rescheduled_too_late", pa.bool_()),
    ("reschedule_late_by", pa.string()), ("too_late_gap_ms", pa.int64()), ("ignored", pa.string()),
    ("reorder_low_offset", pa.int64()), ("reorder_low_ms", pa.int64()), ("reorder_high_offset", pa.int64()),
    ("reorder_high_ms", pa.int64()), ("twice_written_offset", pa.int64()), ("twice_written_copy_offset", pa.int64()),
    ("is_expected", pa.bool_()), ("in_grace", pa.bool_()), ("is_delivered", pa.bool_()), ("is_missing", pa.bool_()),
    ("is_duplicate", pa.bool_()), ("is_unexpected", pa.bool_()), ("is_early", pa.bool_()),
    ("is_cancel_ignored", pa.bool_()), ("is_reordered", pa.bool_()), ("is_twice_written", pa.bool_()),
    ("is_undeliverable", pa.bool_()),
])
FLAGS = ("in_grace", "cancel_too_late", "rescheduled_too_late")


def anomaly(delay_id: str, *, flag: str, topic: str = "orders", copies: int = 1, first: int | None = None,
            **changes) -> dict:
    row = {name: False for name in SCHEMA.names if name.startswith("is_") or name in FLAGS}
    row.update(id=delay_id, topic=topic, state="scheduled", due_ms=SINCE + HOUR, version=7, put_ms=SINCE,
               already_due=False, put_to_delivery_ms=None, dead_letters=0, delivered_count=copies,
               versions_delivered=1 if copies else 0, duplicate_records=max(copies - 1, 0), first_ms=first,
               last_ms=first, lateness_ms=None if first is None else first - SINCE - HOUR,
               first_epoch=3 if copies else None, last_epoch=3 + copies - 1 if copies else None, cancel_offset=None,
               cancel_ms=None, cutoff=None, ignored=None, is_expected=True, **{flag: True})
    row.update(changes)
    return row


def counts(**anomalies: int) -> dict[str, int]:
    base = dict.fromkeys((*COUNT_FIELDS, "dead_lettered", "buffer_records", "malformed_buffer_records"), 0)
    base.update(expected=100, delivered=100, delivered_records=100, buffer_records=200)
    base.update(anomalies)
    return base


def findings(rows: list[dict], dead_letters: dict | None = None, malformed: dict | None = None,
             too_late_by_cutoff: dict | None = None, **anomalies: int) -> Findings:
    lateness = {"p50": 12, "p90": 40, "p99": 95, "max": 180, "min": 0, "count": 100}
    return Findings(
        dead_letters=dead_letters or {}, malformed_by_code=malformed or {},
        too_late_by_cutoff=too_late_by_cutoff or {"count": 0, "p50": None, "max": None},
        already_due={"count": anomalies.get("already_due_when_written", 0), "delivered": 0, "p50": None,
                     "p99": None, "max": None},
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
                                               "early": False, "cancel_ignored": False, "reordered": False}
    assert document["anomalies"]["missing"] == ["lost-1"]
    duplicates = pq.read_table(chosen.out / "anomalies" / "duplicates.parquet").to_pylist()
    assert [r["id"] for r in duplicates] == [f"dup-{i}" for i in range(5)]
    assert (duplicates[0]["delivered_count"], duplicates[0]["first_epoch"], duplicates[0]["last_epoch"]) == (2, 3, 4)
    assert str(duplicates[0]["due"]) == "2027-01-15 09:00:00+00:00"
    assert pq.read_table(chosen.out / "anomalies" / "missing.parquet").column("id").to_pylist() == ["lost-1"]
    assert "<td>3–4</td>" in (chosen.out / "report.html").read_text()  # two masters delivered the duplicates


@pytest.mark.parametrize("kind", ANOMALY_KINDS)
def test_each_anomaly_kind_alone_makes_the_exit_code_1(tmp_path, kind):
    assert build_report(findings([]), Settings(), options(tmp_path)).exit_code == 0
    report = build_report(findings([], **{kind: 1}), Settings(), options(tmp_path))
    assert (report.ok, report.exit_code) == (False, 1)


def test_informational_counts_do_not_alert(tmp_path):
    quiet = findings([], cancelled=3, cancelled_too_late=2, rescheduled_too_late=4, in_grace=5, unknown=0,
                     twice_written=2)
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


def test_reordered_ids_are_listed_with_their_records_and_fail_the_run(tmp_path):
    rows = [anomaly("r-1", flag="is_reordered", first=SINCE + HOUR + 4, reorder_low_offset=6514,
                    reorder_low_ms=SINCE + 1400, reorder_high_offset=6588, reorder_high_ms=SINCE)]
    chosen = options(tmp_path)
    table = pa.Table.from_pylist(rows, schema=SCHEMA)

    report = write_outputs(build_report(findings(rows, reordered=1), Settings(), chosen), table, chosen.out)

    assert (report.ok, report.exit_code) == (False, 1)
    assert report.anomalies["reordered"] == ["r-1"]
    reordered = pq.read_table(chosen.out / "anomalies" / "reordered.parquet").to_pylist()
    assert [(r["id"], r["reorder_low_offset"], r["reorder_high_offset"]) for r in reordered] == [("r-1", 6514, 6588)]
    page = (chosen.out / "report.html").read_text()
    assert "ALERT: 1 reordered (exit code 1)" in page and "Reordered: 1" in page
    assert ("offset 6514, created 2027-01-15 08:00:01.400, appended before offset 6588, created "
            "2027-01-15 08:00:00.000") in page


def test_writes_appended_twice_are_counted_not_failed_and_a_duplicate_across_copies_names_them(tmp_path):
    rows = [anomaly("t-1", flag="is_duplicate", copies=2, first=SINCE + HOUR + 4, is_twice_written=True,
                    twice_written_offset=5, twice_written_copy_offset=7),
            anomaly("d-1", flag="is_duplicate", copies=2, first=SINCE + HOUR + 6)]
    chosen = options(tmp_path)
    table = pa.Table.from_pylist(rows, schema=SCHEMA)

    counted = build_report(findings([], twice_written=3), Settings(), chosen)
    report = write_outputs(build_report(findings(rows, twice_written=3, duplicates=2), Settings(), chosen), table,
                           chosen.out)

    assert (counted.ok, counted.exit_code) == (True, 0)
    assert "twice_written" not in counted.anomalies and counted.totals["twice_written"] == 3
    assert not (chosen.out / "anomalies" / "twice_written.parquet").exists()
    assert report.anomalies["duplicates"] == ["t-1", "d-1"]
    document = load_report(chosen.out)
    assert (document["totals"]["twice_written"], document["by_topic"]["<orders>"]["twice_written"]) == (3, 3)
    page = (chosen.out / "report.html").read_text()
    assert "ALERT: 2 duplicated (exit code 1)" in page
    assert "<b>3</b>written twice, applied once</div>" in page
    assert "<td class=t>offset 5 written again at offset 7</td>" in page  # t-1's row; d-1's is empty


def test_too_late_cancels_and_reschedules_are_reported_by_evidence_and_do_not_fail_the_run(tmp_path):
    from rich.console import Console

    from delayq.spark.cli import print_summary

    chosen = options(tmp_path, ack_grace_ms=8000, reorder_tolerance_ms=50)
    split = {"cancelled_too_late": 6, "cancelled_too_late_after_due": 3, "cancelled_too_late_after_delivery": 1,
             "cancelled_too_late_by_cutoff": 2, "rescheduled_too_late": 1, "rescheduled_too_late_by_cutoff": 1}
    found = findings([], too_late_by_cutoff={"count": 3, "p50": 2000, "max": 7500}, **split)

    report = write_outputs(build_report(found, Settings(), chosen), pa.Table.from_pylist([], schema=SCHEMA),
                           chosen.out)

    assert (report.ok, report.exit_code) == (True, 0)
    document = load_report(chosen.out)
    assert {name: document["totals"][name] for name in split} == split
    assert document["too_late_by_cutoff"] == {"count": 3, "p50": 2000, "max": 7500}
    assert (document["window"]["ack_grace_ms"], document["window"]["reorder_tolerance_ms"]) == (8000, 50)
    page = (chosen.out / "report.html").read_text()
    assert "Cancels and reschedules too late" in page and "the ack grace (8 s)" in page
    assert ("<tr><td class=l>cancelled too late</td><td>6</td><td>3</td><td>1</td><td>2</td></tr>"
            "<tr><td class=l>rescheduled too late</td><td>1</td><td>0</td><td>0</td><td>1</td></tr>") in page
    assert "By the cutoff only: created 2 s (p50), at most 7.5 s, before the due time." in page
    console = Console(record=True, width=120)
    print_summary(report, console)
    text = console.export_text()
    assert "written after due" in text and "appended after the delivery" in text and "by the cutoff only" in text
    assert "too late by the cutoff only, created this long before the due time, ms: p50 2000, max 7500" in text


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
    assert "<td>3–4</td>" not in page  # the missing one was never delivered: no epochs


def test_terminal_summary_shows_every_kind_and_names_the_alert(tmp_path):
    from rich.console import Console

    from delayq.spark.cli import print_summary

    console = Console(record=True, width=120)
    report = build_report(findings([], cancel_ignored=2, early=1), Settings(), options(tmp_path))
    print_summary(report, console)

    text = console.export_text()
    assert "cancel ignored" in text and "rescheduled too late" in text and "cancelled too late" in text
    assert "reordered" in text and "written twice, applied once" in text
    assert "ALERT: 1 early, 2 cancel or reschedule ignored" in text


def letter(when: int, code: str, text: str, *, delay_id: str | None = None, key: str | None = None,
           source: str = "orders-buffer/0/7", due: int | None = None) -> dict:
    """A dead letter as dead_letter_findings lists it."""
    return {"ts": when, "code": code, "text": text, "id": delay_id, "key_text": key or delay_id, "source": source,
            "version": 7 if delay_id else None, "put_topic": "orders" if due else None, "due": due,
            "undeliverable": code in ("missing-topic", "bad-partition", "rejected")}


def test_dead_letters_have_their_own_section_and_alone_do_not_fail_the_run(tmp_path):
    letters = [letter(SINCE + 60_000, "bad-frame", "the frame's key length 10 runs past the end of the value",
                      key="0190a3e4-5b6c-7d8e-9f00-112233445566"),
               letter(SINCE + 120_000, "bad-id", "record key b'order-42' is not a delay id", key="order-42",
                      source="orders-buffer/2/31"),
               letter(SINCE + HOUR + 900, "missing-topic", "target topic nowhere does not exist",
                      delay_id="0190a3e4-5b6c-7d8e-9f00-aabbccddeeff", source="orders-buffer/1/12", due=SINCE + HOUR)]
    found = {"topic": "delayq-orders-dead-letter", "topic_found": True, "total": 3,
             "by_code": {"bad-frame": 1, "bad-id": 1, "missing-topic": 1}, "repeated_sources": 0,
             "listed": letters, "truncated": False}
    chosen = options(tmp_path)
    rows = [anomaly("0190a3e4-5b6c-7d8e-9f00-aabbccddeeff", flag="is_undeliverable", copies=0, dead_letters=1)]

    report = write_outputs(build_report(findings(rows, found, {"bad-frame": 1, "bad-id": 1, "unknown-option": 2},
                                                 dead_lettered=3, undeliverable=1, malformed_buffer_records=4),
                                        Settings(), chosen),
                           pa.Table.from_pylist([], schema=SCHEMA), chosen.out)

    assert (report.ok, report.exit_code) == (True, 0)
    document = load_report(chosen.out)
    assert document["totals"]["dead_lettered"] == 3 and document["totals"]["undeliverable"] == 1
    assert document["anomalies"] == {kind: [] for kind in ANOMALY_KINDS}  # the soak reads these kinds only
    section = document["dead_letters"]
    assert section["by_code"] == {"bad-frame": 1, "bad-id": 1, "missing-topic": 1} and section["total"] == 3
    assert [(d["when"], d["kind"], d["code"], d["id"], d["source"]) for d in section["listed"]] == [
        ("2027-01-15T08:01:00.000Z", "malformed", "bad-frame", None, "orders-buffer/0/7"),
        ("2027-01-15T08:02:00.000Z", "malformed", "bad-id", None, "orders-buffer/2/31"),
        ("2027-01-15T09:00:00.900Z", "undeliverable", "missing-topic", "0190a3e4-5b6c-7d8e-9f00-aabbccddeeff",
         "orders-buffer/1/12")]
    assert section["listed"][2]["due"] == "2027-01-15T09:00:00.000Z" and section["listed"][1]["key"] == "order-42"
    assert document["malformed_buffer_records_by_code"] == {"bad-frame": 1, "bad-id": 1, "unknown-option": 2}
    page = (chosen.out / "report.html").read_text()
    assert "ALERT" not in page and "OK: every expected message was delivered or dead-lettered" in page
    assert "Dead letters: 3" in page and "3 dead letter(s) in this window" in page
    assert "by time dead-lettered, oldest first" in page
    assert page.index("bad-frame</td>") < page.index("target topic nowhere does not exist")
    assert "key &#x27;order-42&#x27;" in page and "undeliverable: the target topic does not exist" in page
    assert "Malformed buffer records: 4" in page and "malformed: a frame option or partitioner" in page


def test_a_dead_letter_list_cut_by_the_list_limit_says_so(tmp_path):
    letters = [letter(SINCE + i, "bad-id", "not a delay id", key=f"k{i}", source=f"b/0/{i}") for i in range(25)]
    found = {"topic": "dl", "topic_found": True, "total": 40, "by_code": {"bad-id": 40}, "repeated_sources": 2,
             "listed": letters, "truncated": True}
    chosen = options(tmp_path)

    write_outputs(build_report(findings([], found, dead_lettered=40), Settings(), chosen),
                  pa.Table.from_pylist([], schema=SCHEMA), chosen.out)

    page = (chosen.out / "report.html").read_text()
    assert f"First {HTML_ROWS} of 40; report.json lists 25 (capped by --list-limit)" in page
    assert "2 buffer record(s) were dead-lettered more than once" in page
    assert load_report(chosen.out)["dead_letters"]["truncated"] is True


def test_page_titles_say_how_tables_are_ordered_and_charts_use_plain_numbers(tmp_path):
    chosen = options(tmp_path)
    rows = [anomaly("m-1", flag="is_missing", copies=0)]
    big = findings(rows, missing=1, expected=2_000_000, delivered=1_999_999)
    big.per_hour = [{"hour_ms": SINCE + h * HOUR, **counts(expected=2_000_000, delivered=1_999_000, missing=1,
                                                          undeliverable=999, duplicates=2),
                     "lateness_ms": {**big.lateness, "p99": 3_060_000}} for h in range(3)]
    big.histogram = histogram({3: 1_500_000, 7: 400_000, 150: 10})

    write_outputs(build_report(big, Settings(), chosen), pa.Table.from_pylist(rows, schema=SCHEMA), chosen.out)

    page = (chosen.out / "report.html").read_text()
    assert "most late deliveries (by lateness, highest first)" in page
    assert "Missing: 1 (by due time, earliest first)" in page
    assert "Latest 1 deliveries" not in page
    assert "1e6" not in page and "×10" not in page and "10^" not in page  # no scientific axis labels
    assert "2,000,000" in page  # a count axis tick, in plain digits
    assert "p99 lateness (min)" in page  # 3,060,000 ms of p99 on an axis in minutes
    assert "undeliverable (dead-lettered)" in page and "red numbers: anomalies" in page


def test_every_reason_code_a_cluster_dead_letter_can_carry_is_explained_on_the_page():
    from delayq import wire
    from delayq.spark.report import CODE_MEANING

    written_by_nodes = {code.value for code in wire.Reason} - {wire.Reason.RETRIES_EXHAUSTED.value}
    assert written_by_nodes <= set(CODE_MEANING), written_by_nodes - set(CODE_MEANING)
    assert all(CODE_MEANING[code.value].startswith("undeliverable:") for code in wire.UNDELIVERABLE)
