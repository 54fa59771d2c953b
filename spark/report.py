"""The report of one reconciliation: report.json for machines, report.html for people, anomalies/ as Parquet."""

from __future__ import annotations

import html
import io
import json
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .options import ReconcileOptions, iso
from .summary import TOO_LATE_EVIDENCE

if TYPE_CHECKING:
    import pyarrow as pa

    from delayq import Settings

    from .job import Findings

# Each of these, when not zero, makes the run fail (exit code 1).
ANOMALY_KINDS = ("duplicates", "missing", "unexpected", "early", "cancel_ignored", "reordered")
# Which flag column of the judged table marks each kind.
ANOMALY_FLAGS = {"duplicates": "is_duplicate", "missing": "is_missing", "unexpected": "is_unexpected",
                 "early": "is_early", "cancel_ignored": "is_cancel_ignored", "reordered": "is_reordered"}
# How the alert line names each kind.
_ALERT_NAMES = {"duplicates": "duplicated", "missing": "missing", "unexpected": "unexpected", "early": "early",
                "cancel_ignored": "cancel or reschedule ignored", "reordered": "reordered"}
# Counts whose total's name says too little for a person: ids with a producer write that the client
# library appended twice, which nodes apply once (no anomaly: what it led to is judged as any delivery).
_COUNT_LABELS = {"twice_written": "written twice, applied once"}
# The evidence a too-late cancel or reschedule is counted by (TOO_LATE_EVIDENCE), in words.
EVIDENCE_NAMES = dict(zip(TOO_LATE_EVIDENCE, ("written after due", "appended after the delivery",
                                              "by the cutoff only"), strict=True))
HTML_ROWS = 20


@dataclass
class Report:
    """The outcome of one run; ``to_dict()`` is the report.json document.

    ``exit_code`` is 0 when no id is missing, duplicated, early, unexpected, had a
    cancel or reschedule ignored, or had producer writes reordered (``ANOMALY_KINDS``),
    else 1, so a CronJob or a CI step can alert on it.
    """

    window: dict[str, Any]
    source: dict[str, Any]
    totals: dict[str, int]
    lateness_ms: dict[str, int | None]
    by_topic: dict[str, dict[str, Any]]
    per_hour: list[dict[str, Any]]
    lateness_histogram: list[dict[str, Any]]
    anomalies: dict[str, list[str]]
    anomalies_truncated: dict[str, bool]
    worst_late: list[dict[str, Any]]
    generated_at: str
    spark_version: str
    timings_s: dict[str, float] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    # Dead letters that concern the window (dead_letter_findings): total, by_code, listed, ...
    dead_letters: dict[str, Any] = field(default_factory=dict)
    malformed_buffer_records_by_code: dict[str, int] = field(default_factory=dict)
    # Puts written when already due: count (expected ids), delivered, p50/p99/max of put to first delivery.
    already_due_when_written: dict[str, int | None] = field(default_factory=dict)
    # Cancels and reschedules too late by the master's cutoff only: count, p50 and max of how long
    # before the due time they were created.
    too_late_by_cutoff: dict[str, int | None] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not any(self.totals[kind] for kind in ANOMALY_KINDS)

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok, "exit_code": self.exit_code}


def build_report(findings: Findings, settings: Settings, options: ReconcileOptions) -> Report:
    """Turn the findings into the report document (nothing is written yet)."""
    from delayq import __version__

    table = findings.anomalies
    lists, truncated = {}, {}
    for kind in ANOMALY_KINDS:
        ids = table.filter(table[ANOMALY_FLAGS[kind]]).column("id").to_pylist() if table.num_rows else []
        lists[kind] = ids[:options.list_limit]
        truncated[kind] = len(ids) > options.list_limit
    return Report(
        window={
            "since": iso(options.since_ms), "until": iso(options.until_ms),
            "since_ms": options.since_ms, "until_ms": options.until_ms,
            "grace_ms": options.grace_ms, "expected_before": iso(options.expected_before_ms),
            "early_tolerance_ms": options.early_tolerance_ms, "lookback_ms": options.lookback_ms,
            "reorder_tolerance_ms": options.reorder_tolerance_ms, "ack_grace_ms": options.ack_grace_ms,
        },
        source={
            "bootstrap_servers": settings.bootstrap_servers, "buffer_topic": settings.buffer_topic,
            "target_topics": findings.target_topics, "topics_not_found": findings.missing_topics,
            "isolation_level": options.isolation_level, "delayq_version": __version__,
        },
        totals=findings.totals,
        lateness_ms=findings.lateness,
        by_topic=findings.by_topic,
        per_hour=[{"hour": iso(h["hour_ms"]), **h} for h in findings.per_hour],
        lateness_histogram=findings.histogram,
        anomalies=lists,
        anomalies_truncated=truncated,
        worst_late=[{**w, "due": iso(w["due_ms"]), "first_delivery": iso(w["first_ms"])} for w in findings.worst_late],
        generated_at=iso(int(datetime.now(UTC).timestamp() * 1000)) or "",
        spark_version=findings.spark_version,
        timings_s=dict(findings.timings_s),
        dead_letters=_dead_letters(findings.dead_letters),
        malformed_buffer_records_by_code=dict(sorted(findings.malformed_by_code.items())),
        already_due_when_written=dict(findings.already_due),
        too_late_by_cutoff=dict(findings.too_late_by_cutoff),
    )


def _dead_letters(found: dict[str, Any]) -> dict[str, Any]:
    """The report's dead-letter section: counts by reason code and the listed ones, with readable times."""
    listed = [{"when": iso(d["ts"]), "when_ms": d["ts"],
               "kind": "undeliverable" if d["undeliverable"] else "malformed",
               "code": d["code"], "text": d["text"], "id": d["id"], "key": d["key_text"], "source": d["source"],
               "version": d["version"], "topic": d["put_topic"], "due": iso(d["due"]), "due_ms": d["due"]}
              for d in found.get("listed", [])]
    return {"topic": found.get("topic"), "topic_found": found.get("topic_found", False),
            "total": found.get("total", 0), "by_code": dict(found.get("by_code", {})),
            "repeated_sources": found.get("repeated_sources", 0), "listed": listed,
            "truncated": found.get("truncated", False)}


def write_outputs(report: Report, anomalies: pa.Table, out: Path | str) -> Report:
    """Write anomalies/<kind>.parquet, report.html and report.json into ``out``; record where each is.

    Args:
        report: the report document; its ``files`` get the path (or URL) of every file written.
        anomalies: the judged ids with their anomaly flags: the rows of each kind go to its own Parquet file.
        out: a local folder, or an object-store URL such as ``s3://bucket/prefix`` (``destination.parse_out``
            says which; credentials and endpoint come from the store's own environment variables).

    Raises:
        ValueError: ``out`` is a URL no object store answers to.
        OSError: the folder cannot be made or written (the message names it and, for a URL, what to check).
    """
    import pyarrow.parquet as pq

    from .destination import report_folder

    folder = report_folder(out)
    folder.create()
    detailed = _with_readable_times(anomalies)
    for kind in ANOMALY_KINDS:
        path, shown = folder.file("anomalies", f"{kind}.parquet")
        pq.write_table(detailed.filter(detailed[ANOMALY_FLAGS[kind]]) if detailed.num_rows else detailed, path,
                       filesystem=folder.filesystem)
        report.files[f"anomalies_{kind}"] = shown
    report.files["json"] = folder.file("report.json")[1]
    report.files["html"] = folder.file("report.html")[1]
    folder.write_text("report.html", render_html(report, detailed), "text/html; charset=utf-8")
    # Last: a folder with report.json in it holds the whole report.
    folder.write_text("report.json", json.dumps(report.to_dict(), indent=2) + "\n", "application/json")
    return report


def _with_readable_times(table: pa.Table) -> pa.Table:
    """Add UTC timestamp columns next to the epoch-millisecond ones, for whoever opens the Parquet."""
    import pyarrow as pa

    for source, name in (("due_ms", "due"), ("first_ms", "first_delivery"), ("last_ms", "last_delivery")):
        column = table[source].cast(pa.int64()).cast(pa.timestamp("ms", tz="UTC"))
        table = table.append_column(name, column)
    return table


# -- HTML ----------------------------------------------------------------------

_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1280px;padding:0 1em;color:#222}
h1{margin-bottom:.2em} h2{margin:1.6em 0 .3em} .muted{color:#666} .note{color:#555;margin:.2em 0 .4em}
table{border-collapse:collapse;margin:.5em 0 1.5em;display:block;overflow-x:auto;max-width:100%}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:right} th{background:#f4f4f4;text-align:center}
td.l{text-align:left;white-space:nowrap;font-family:ui-monospace,monospace;font-size:12px}
td.t{text-align:left;font-size:12px;min-width:18em}
td.w{text-align:left;font-family:ui-monospace,monospace;font-size:12px;overflow-wrap:anywhere;min-width:16em}
.status{padding:.6em 1em;border-radius:6px;font-weight:600;margin:1em 0}
.ok{background:#e3f6e5;color:#17612a} .alert{background:#fde8e8;color:#9b1c1c} .warn{background:#fff4dc;color:#7a4b00}
.cards{display:flex;flex-wrap:wrap;gap:10px;margin-bottom:.6em}
.card{border:1px solid #ddd;border-radius:6px;padding:8px 14px;min-width:110px}
.card b{display:block;font-size:22px} .card.bad b{color:#b91c1c} .card.warn b{color:#b45309}
.group{font-size:12px;color:#666;text-transform:uppercase;letter-spacing:.05em;margin:.8em 0 .3em}
figure{margin:1em 0}
"""

# What each dead-letter reason code means, for the page.
CODE_MEANING = {
    "missing-topic": "undeliverable: the target topic does not exist",
    "bad-partition": "undeliverable: the target partition does not exist",
    "rejected": "undeliverable: Kafka refused the record (too large, ...)",
    "forbidden-topic": "undeliverable: the target is not in target_topics, or is delayq's or Kafka's own topic",
    "expired": "undeliverable: picked for delivery after its expires= time (the producer's expire_after)",
    "wrong-partition": "malformed: not on its id's buffer partition",
    "bad-id": "malformed: no key, or a key that is not a delay id",
    "bad-frame": "malformed: the put's frame line does not parse",
    "unknown-option": "malformed: a frame option or partitioner this version does not know",
    "bad-due-time": "malformed: a due time before 2000 (seconds meant?)",
    "reserved-header": "malformed: a put with a delayq- header",
    "bad-control": "malformed: a cancel or done with wrong delayq- headers",
    "unknown": "the reason header starts with no known code",
}


def render_html(report: Report, anomalies: pa.Table) -> str:
    """A self-contained page: status, totals, lateness, charts (inline SVG), dead letters, worst and anomalous ids."""
    totals = report.totals
    esc = html.escape
    letters = report.dead_letters or {}
    already = report.already_due_when_written or {}

    def cards(names: tuple[str, ...], style: str = "") -> str:
        return "".join(f'<div class="card{(" " + style) if style and totals.get(k) else ""}">'
                       f'<b>{totals.get(k, 0):,}</b>{esc(count_label(k))}</div>' for k in names)

    status = ('<div class="status ok">OK: every expected message was delivered or dead-lettered, none twice, none '
              'early, no cancel or reschedule ignored, nothing unexpected, no producer write out of order '
              '(exit code 0)</div>'
              if report.ok else
              f'<div class="status alert">ALERT: {esc(alert_text(totals))} (exit code 1)</div>')
    if totals.get("dead_lettered") or totals.get("malformed_buffer_records"):
        status += (f'<div class="status warn">{totals.get("dead_lettered", 0):,} dead letter(s) in this window and '
                   f'{totals.get("malformed_buffer_records", 0):,} malformed buffer record(s): see "Dead letters" '
                   'below. They do not fail the run.</div>')
    topic_rows = [[_Name(t), v["expected"], v["delivered"], v["missing"], v.get("undeliverable", 0), v["duplicates"],
                   v["unexpected"], v["early"], v["cancel_ignored"], v.get("reordered", 0), v.get("twice_written", 0),
                   *_pcts(v["lateness_ms"])]
                  for t, v in report.by_topic.items()]
    topic_rows.append(["all topics", totals["expected"], totals["delivered"], totals["missing"],
                       totals.get("undeliverable", 0), totals["duplicates"], totals["unexpected"], totals["early"],
                       totals["cancel_ignored"], totals["reordered"], totals["twice_written"],
                       *_pcts(report.lateness_ms)])
    worst = [[w["id"], _name(w["topic"]), _when(w["due_ms"]), _when(w["first_ms"]), w["lateness_ms"],
              w["delivered_count"], _epochs(w)] for w in report.worst_late]
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>delayq reconciliation</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>delayq reconciliation</h1>",
        (f"<p class='muted'>Buffer <b>{esc(report.source['buffer_topic'])}</b> on "
         f"{esc(report.source['bootstrap_servers'])}; messages due from {esc(report.window['since'])} to "
         f"{esc(report.window['until'])}; expected if due before {esc(report.window['expected_before'])} "
         f"(grace {report.window['grace_ms'] / 1000:g} s); "
         f"{esc(report.source['isolation_level'])}; generated {esc(report.generated_at)}. Times are UTC.</p>"),
        status,
        "<div class='group'>Anomalies: any of these fails the run</div>",
        f"<div class='cards'>{cards(ANOMALY_KINDS, 'bad')}</div>",
        "<div class='group'>Messages due in the window</div>",
        f"<div class='cards'>{cards(('expected', 'delivered', 'undeliverable', 'in_grace', 'delivered_records'))}"
        f"{cards(('cancelled', 'cancelled_too_late', 'rescheduled_too_late', 'already_due_when_written'))}"
        f"{cards(('twice_written',))}</div>",
        "<div class='group'>Dead letters and bad input</div>",
        f"<div class='cards'>{cards(('dead_lettered', 'malformed_buffer_records'), 'warn')}"
        f"{cards(('buffer_records',))}</div>",
        "<h2>Lateness per topic (ms)</h2>",
        "<p class='note'>First delivery minus due time, of the delivered messages. Messages whose put was written "
        "when it was already due are left out (see <i>Already due when written</i>). <i>Undeliverable</i>: "
        "dead-lettered by the master instead of delivered.</p>",
        _table(["topic", "expected", "delivered", "missing", "undeliverable", "duplicates", "unexpected", "early",
                "cancel ignored", "reordered", count_label("twice_written"), "p50", "p90", "p99", "max"],
               topic_rows),
    ]
    if report.source["topics_not_found"]:
        parts.append(f"<p class='status alert'>Target topics not found on the broker: "
                     f"{esc(', '.join(report.source['topics_not_found']))}</p>")
    parts += [
        "<figure>", _histogram_svg(report.lateness_histogram), "</figure>",
        "<h2>Per hour of due time</h2><figure>", _per_hour_svg(report.per_hour), "</figure>",
        "<h2>Already due when written</h2>",
        "<p class='note'>Puts whose record timestamp (their creation time) is at or after their due time: they "
        "could not be on time, so their delay is measured from the put to its first delivery, and kept out of "
        "the lateness above.</p>",
        (_table(["messages", "delivered", "p50 put to first delivery", "p99", "max"],
                [[already.get("count", 0), already.get("delivered", 0), _Figure(_duration(already.get("p50"))),
                  _Figure(_duration(already.get("p99"))), _Figure(_duration(already.get("max")))]])
         if already.get("count") else "<p>None: every put due in the window was written before its due time.</p>"),
        *_too_late_html(report),
        f"<h2>The {len(worst)} most late deliveries (by lateness, highest first)</h2>",
        _table(["id", "topic", "due", "first delivery", "lateness ms", "copies", "epochs"], worst),
    ]
    clean = [kind for kind in ANOMALY_KINDS if not totals[kind]]
    if clean:
        parts.append(f"<h2>Anomalous ids</h2><p>None {'at all' if len(clean) == len(ANOMALY_KINDS) else 'of these'}: "
                     f"{esc(', '.join(_ALERT_NAMES[kind] for kind in clean))}.</p>")
    for kind in ANOMALY_KINDS:
        count = totals[kind]
        if not count:
            continue
        parts.append(f"<h2>{esc(kind.replace('_', ' ').capitalize())}: {count:,} (by due time, earliest first)</h2>")
        rows = anomalies.filter(anomalies[ANOMALY_FLAGS[kind]]).slice(0, HTML_ROWS).to_pylist()
        records = kind in _RECORDS
        parts.append(_table(
            ["id", "topic", "state", "due", "copies", "versions", "first delivery", "lateness ms", "epochs",
             *(["buffer records"] if records else [])],
            [[r["id"], _name(r["topic"]), _state(r), _when(r["due_ms"]), r["delivered_count"],
              r.get("versions_delivered"), _when(r["first_ms"]), r["lateness_ms"], _epochs(r),
              *([_records_cell(_RECORDS[kind](r))] if records else [])] for r in rows]))
        if count > HTML_ROWS:
            parts.append(f"<p class='muted'>First {HTML_ROWS} of {count:,}; all of them in "
                         f"anomalies/{kind}.parquet.</p>")
    parts += _dead_letter_html(letters, report.malformed_buffer_records_by_code, totals)
    parts.append("</body></html>")
    return "\n".join(parts)


def _too_late_html(report: Report) -> list[str]:
    """The page's section on cancels and reschedules that lost to a delivery, split by the evidence."""
    esc = html.escape
    totals = report.totals
    gap = report.too_late_by_cutoff or {}
    grace = _duration(report.window.get("ack_grace_ms"))
    parts = ["<h2>Cancels and reschedules too late</h2>",
             "<p class='note'>A cancel or reschedule that lost the race to a delivery of the version it superseded, "
             "by the evidence the buffer holds beyond the master's own cutoff: <i>written after due</i>, its record "
             "timestamp (the producer's creation time; the acknowledgement came later still) at or after the due "
             "time; <i>appended after the delivery</i>, at an offset above the done that closed the delivered "
             "version; <i>by the cutoff only</i>, neither, but at or above the done's cutoff and created less than "
             f"the ack grace ({esc(grace)}) before the due time. Created earlier and appended before the done, "
             "or below the cutoff, it was ignored: an anomaly (<i>cancel ignored</i>). None of these fails the "
             "run.</p>"]
    rows = [[label, totals.get(total, 0), *(totals.get(f"{total}_{evidence}", 0) for evidence in EVIDENCE_NAMES)]
            for label, total in (("cancelled too late", "cancelled_too_late"),
                                 ("rescheduled too late", "rescheduled_too_late"))]
    parts.append(_table(["", "ids", *EVIDENCE_NAMES.values()], rows))
    if gap.get("count"):
        parts.append(f"<p>By the cutoff only: created {esc(_duration(gap.get('p50')))} (p50), at most "
                     f"{esc(_duration(gap.get('max')))}, before the due time.</p>")
    return parts


def _reordered_records(row: dict[str, Any]) -> str:
    """The two writes out of order: "offset 6514, created ..., appended before offset 6588, created ..."."""
    return (f"offset {row['reorder_low_offset']}, created {_when(row['reorder_low_ms'])}, appended before offset "
            f"{row['reorder_high_offset']}, created {_when(row['reorder_high_ms'])}")


def _copied_records(row: dict[str, Any]) -> str | None:
    """The write appended twice, when a duplicate's id has one: each copy may have been delivered."""
    if row["twice_written_copy_offset"] is None:
        return None
    return f"offset {row['twice_written_offset']} written again at offset {row['twice_written_copy_offset']}"


# The buffer records an anomaly of these kinds is about, as the page names them.
_RECORDS = {"reordered": _reordered_records, "duplicates": _copied_records}


def _records_cell(text: str | None) -> _Text | None:
    return None if text is None else _Text(text)


def _dead_letter_html(letters: dict[str, Any], malformed: dict[str, int], totals: dict[str, int]) -> list[str]:
    """The page's dead-letter section: counts by reason code, the listed dead letters, malformed records by code."""
    esc = html.escape
    total = letters.get("total", 0)
    topic = letters.get("topic") or "the dead-letter topic"
    parts = [f"<h2>Dead letters: {total:,}</h2>",
             f"<p class='note'>Read from <b>{esc(topic)}</b> (read_committed)"
             f"{'' if letters.get('topic_found', True) else ', which does not exist'}: the dead letters of "
             "undeliverable messages due in the window, and those of malformed buffer records dead-lettered in "
             "the window. They do not fail the run: an undeliverable message is not missing.</p>"]
    if total:
        by_code = sorted(letters.get("by_code", {}).items(), key=lambda item: (-item[1], item[0]))
        parts.append(_table(["reason code", "dead letters", "meaning"],
                            [[code, count, _Text(CODE_MEANING.get(code, ""))] for code, count in by_code]))
        listed = letters.get("listed", [])
        shown = listed[:HTML_ROWS]
        which = f"All {total:,}" if len(shown) == total else f"The first {len(shown):,}"
        parts.append(f"<h3>{which} dead letters (by time dead-lettered, oldest first)</h3>")
        parts.append(_table(
            ["dead-lettered", "code", "id", "source (buffer topic/partition/offset)", "reason"],
            [[_when(d["when_ms"]), d["code"], d["id"] or (d.get("key") and f"key {d['key']!r}") or "", d["source"],
              _Text(d["text"])] for d in shown]))
        if total > len(shown):
            parts.append(f"<p class='muted'>First {len(shown)} of {total:,}; report.json lists "
                         f"{len(listed):,}{' (capped by --list-limit)' if letters.get('truncated') else ''}; "
                         "the topic has them all.</p>")
        if letters.get("repeated_sources"):
            parts.append(f"<p class='status warn'>{letters['repeated_sources']:,} buffer record(s) were "
                         "dead-lettered more than once (each should be once per cluster).</p>")
    malformed_total = totals.get("malformed_buffer_records", 0)
    parts.append(f"<h2>Malformed buffer records: {malformed_total:,}</h2>")
    parts.append("<p class='note'>Every record of the buffer topic, as the nodes' own parser "
                 "(<code>delayq.wire.parse_buffer_record</code>) classifies it; malformed ones take no part in the "
                 "verdicts above, as on the nodes, which dead-letter them.</p>")
    if malformed:
        parts.append(_table(["reason code", "records", "meaning"],
                            [[code, count, _Text(CODE_MEANING.get(code, ""))]
                             for code, count in sorted(malformed.items(), key=lambda i: (-i[1], i[0]))]))
    return parts


class _Text(str):
    """A table cell of free text: wraps, left-aligned."""


class _Figure(str):
    """A table cell of a figure with its unit ("20 ms"): right-aligned like a number."""


class _Name(str):
    """A table cell of a long name (a topic): monospace, broken anywhere when the table would not fit."""


def _name(topic: str | None) -> _Name | None:
    return None if topic is None else _Name(topic)


def count_label(name: str) -> str:
    """A total's name as the page and the terminal show it: "cancel ignored", "written twice, applied once"."""
    return _COUNT_LABELS.get(name, name.replace("_", " "))


def alert_text(totals: dict[str, int]) -> str:
    """The non-zero anomaly counts in words: "1 missing, 2 cancel or reschedule ignored"."""
    return ", ".join(f"{totals[kind]:,} {_ALERT_NAMES[kind]}" for kind in ANOMALY_KINDS if totals[kind])


def _state(row: dict[str, Any]) -> str:
    """The id's state, and which write was ignored if one was: "cancelled, cancel ignored"."""
    ignored = row.get("ignored")
    return row["state"] if not ignored else f"{row['state']}, {ignored} ignored"


def _epochs(row: dict[str, Any]) -> str:
    """Which masters delivered: "3", or "2–3" when copies came from more than one epoch."""
    first, last = row["first_epoch"], row["last_epoch"]
    if first is None:
        return ""
    return _Figure(first if first == last else f"{first}–{last}")


def _when(ms: int | None) -> str | None:
    """A time for a table cell: ISO 8601 without the T and the Z (the page says times are UTC)."""
    text = iso(ms)
    return None if text is None else text.replace("T", " ").rstrip("Z")


def _pcts(lateness: dict[str, int | None]) -> list[int | None]:
    return [lateness["p50"], lateness["p90"], lateness["p99"], lateness["max"]]


def _table(header: list[str], rows: list[list[Any]]) -> str:
    """An HTML table: text left-aligned, numbers right-aligned with thousands separators."""
    def cell(value: Any) -> str:
        if value is None:
            return "<td></td>"
        if isinstance(value, int):
            return f"<td>{value:,}</td>"
        if isinstance(value, _Text):
            return f"<td class=t>{html.escape(str(value))}</td>"
        if isinstance(value, _Name):
            return f"<td class=w>{html.escape(str(value))}</td>"
        if isinstance(value, _Figure):
            return f"<td>{html.escape(str(value))}</td>"
        return f"<td class=l>{html.escape(str(value))}</td>"

    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(cell(v) for v in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _duration(ms: float | None) -> str:
    """A duration for people: "850 ms", "12.5 s", "51 min", "2.5 h" (an axis tick or a table cell)."""
    if ms is None:
        return ""
    size = abs(ms)
    if size < 1000:
        return f"{ms:,.0f} ms"
    if size < 60_000:
        return f"{ms / 1000:.3g} s"
    if size < 3_600_000:
        return f"{ms / 60_000:.3g} min"
    return f"{ms / 3_600_000:,.3g} h"


def _unit(ms: float) -> tuple[str, int]:
    """The unit a chart axis of durations up to ``ms`` reads best in, and its size in ms."""
    if ms < 1000:
        return "ms", 1
    if ms < 60_000:
        return "s", 1000
    if ms < 3_600_000:
        return "min", 60_000
    return "h", 3_600_000


def _label_ms(ms: int | None) -> str:
    """A histogram edge: "10ms", "−1s", "1min" (a real minus sign: "-1s–-100ms" reads badly)."""
    if ms is None:
        return ""
    if abs(ms) >= 60_000:
        text = f"{ms / 60_000:g}min"
    else:
        text = f"{ms / 1000:g}s" if abs(ms) >= 1000 else f"{ms}ms"
    return text.replace("-", "−")


def _count_axis(axis) -> None:
    """Whole numbers with thousands separators on ``axis``: never 1e6 or an offset."""
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))
    axis.set_major_formatter(FuncFormatter(lambda value, _pos: f"{value:,.0f}"))


def _histogram_svg(histogram: list[dict[str, Any]]) -> str:
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    labels = [f"< {_label_ms(b['to_ms'])}" if b["from_ms"] is None else
              f"≥ {_label_ms(b['from_ms'])}" if b["to_ms"] is None else
              f"{_label_ms(b['from_ms'])} to {_label_ms(b['to_ms'])}" for b in histogram]
    counts = [b["count"] for b in histogram]
    figure = Figure(figsize=(10, 3.6))
    axes = figure.subplots()
    bars = axes.bar(range(len(counts)), counts,
                    color=["#c0392b" if (b["to_ms"] or 1) <= 0 else "#2f6db3" for b in histogram])
    axes.set_xticks(range(len(labels)), labels, rotation=40, ha="right", fontsize=8)
    axes.set_xlabel("lateness (first delivery minus due time)", fontsize=9)
    axes.set_ylabel("messages")
    axes.set_title("Lateness of first delivery (red: before the due time)")
    if max(counts, default=0) > 50 * max(1, min((c for c in counts if c), default=1)):
        axes.set_yscale("log")
        axes.yaxis.set_major_locator(LogLocator(base=10))
        axes.yaxis.set_major_formatter(FuncFormatter(lambda value, _pos: f"{value:,.0f}" if value >= 1 else ""))
        axes.yaxis.set_minor_formatter(NullFormatter())
        axes.set_ylim(0.8, max(counts) * 3)
    else:
        _count_axis(axes.yaxis)
        axes.set_ylim(0, max(1, max(counts, default=0)) * 1.15)
    for bar, count in zip(bars, counts, strict=True):
        if count:
            axes.annotate(f"{count:,}", (bar.get_x() + bar.get_width() / 2, bar.get_height()), xytext=(0, 2),
                          textcoords="offset points", ha="center", fontsize=7, color="#444")
    return _svg(figure)


def _per_hour_svg(per_hour: list[dict[str, Any]]) -> str:
    """Stacked bars per hour of due time (delivered, undeliverable, missing, in grace), and the p99 lateness.

    The stack's height is what was due that hour; the other anomalies (duplicated, early,
    unexpected, cancel ignored) are ids already counted in it, so they are written above
    the bar rather than drawn as bars over it.
    """
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    figure = Figure(figsize=(10, 4.2))
    axes = figure.subplots()
    if not per_hour:
        axes.text(0.5, 0.5, "no message was due in this window", ha="center", va="center")
        axes.set_axis_off()
        return _svg(figure)
    xs = list(range(len(per_hour)))
    bottom = [0] * len(per_hour)
    for name, label, color in (("delivered", "delivered", "#2f6db3"),
                               ("undeliverable", "undeliverable (dead-lettered)", "#e0a030"),
                               ("missing", "missing", "#c0392b"), ("in_grace", "in grace", "#c8ccd2")):
        values = [h.get(name, 0) for h in per_hour]
        if any(values) or name == "delivered":
            axes.bar(xs, values, 0.8, bottom=bottom, label=label, color=color)
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    # Ids already in the stack (a few among thousands would be an invisible bar): a number above it.
    flagged = [sum(h[kind] for kind in ANOMALY_KINDS) for h in per_hour]
    for x, count in zip(xs, flagged, strict=True):
        if count:
            axes.annotate(f"{count:,}", (x, bottom[x]), xytext=(0, 3), textcoords="offset points", ha="center",
                          va="bottom", color="#9b1c1c", fontsize=7, fontweight="bold")
    step = max(1, len(per_hour) // 24)
    axes.set_xticks(xs[::step], [h["hour"][5:13].replace("T", " ") + "h" for h in per_hour][::step],
                    rotation=40, ha="right", fontsize=8)
    axes.set_xlim(-0.6, len(per_hour) - 0.4)
    axes.set_ylabel("messages due")
    _count_axis(axes.yaxis)
    axes.set_ylim(0, max(1, max(bottom)) * 1.2)
    p99 = axes.twinx()
    values = [h["lateness_ms"]["p99"] for h in per_hour]
    known = [v for v in values if v is not None] or [0]
    unit, size = _unit(max(abs(v) for v in known))
    p99.plot(xs, [float("nan") if v is None else v / size for v in values], color="#e67e22", marker=".",
             label="p99 lateness (right axis)")
    p99.set_ylabel(f"p99 lateness ({unit})")
    # From 0, so a flat line does not look like a jump.
    p99.set_ylim(min(0, *known) / size, max(1 / size, max(known) / size) * 1.25)
    p99.yaxis.set_major_locator(MaxNLocator(nbins=6, steps=[1, 2, 2.5, 5, 10]))
    p99.yaxis.set_major_formatter(FuncFormatter(lambda value, _pos: f"{value:,.10g}"))
    handles, labels = axes.get_legend_handles_labels()
    more_handles, more_labels = p99.get_legend_handles_labels()
    axes.legend(handles + more_handles, labels + more_labels, fontsize=8, loc="upper center",
                bbox_to_anchor=(0.5, -0.28), ncol=5, frameon=False)
    axes.set_title("Messages per hour of due time: what was due, stacked by outcome"
                   + ("; red numbers: anomalies" if any(flagged) else ""))
    return _svg(figure)


def _svg(figure) -> str:
    import matplotlib

    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none"}):  # keep text as text: smaller, searchable
        figure.tight_layout()
        figure.savefig(buffer, format="svg")
    text = buffer.getvalue()
    return text[text.index("<svg"):] if "<svg" in text else text


def load_report(path: Path | str) -> dict[str, Any]:
    """The report.json of ``path`` (a report folder or the file itself)."""
    path = Path(path)
    return json.loads((path / "report.json" if path.is_dir() else path).read_text(encoding="utf-8"))

