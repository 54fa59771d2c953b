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

if TYPE_CHECKING:
    import pyarrow as pa

    from delayq import Settings

    from .job import Findings

# Each of these, when not zero, makes the run fail (exit code 1).
ANOMALY_KINDS = ("duplicates", "missing", "unexpected", "early", "cancel_ignored")
# Which flag column of the judged table marks each kind.
_FLAG = {"duplicates": "is_duplicate", "missing": "is_missing", "unexpected": "is_unexpected", "early": "is_early",
         "cancel_ignored": "is_cancel_ignored"}
# How the alert line names each kind.
_ALERT_NAMES = {"duplicates": "duplicated", "missing": "missing", "unexpected": "unexpected", "early": "early",
                "cancel_ignored": "cancel or reschedule ignored"}
HTML_ROWS = 20


@dataclass
class Report:
    """The outcome of one run; ``to_dict()`` is the report.json document.

    ``exit_code`` is 0 when no id is missing, duplicated, early, unexpected or had a
    cancel or reschedule ignored (``ANOMALY_KINDS``), else 1, so a CronJob or a CI
    step can alert on it.
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
        ids = table.filter(table[_FLAG[kind]]).column("id").to_pylist() if table.num_rows else []
        lists[kind] = ids[:options.list_limit]
        truncated[kind] = len(ids) > options.list_limit
    return Report(
        window={
            "since": iso(options.since_ms), "until": iso(options.until_ms),
            "since_ms": options.since_ms, "until_ms": options.until_ms,
            "grace_ms": options.grace_ms, "expected_before": iso(options.expected_before_ms),
            "early_tolerance_ms": options.early_tolerance_ms, "lookback_ms": options.lookback_ms,
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
        generated_at=iso(int(datetime.now(UTC).timestamp() * 1000)),
        spark_version=findings.spark_version,
        timings_s=dict(findings.timings_s),
    )


def write_outputs(report: Report, anomalies: pa.Table, out: Path) -> Report:
    """Write anomalies/<kind>.parquet, report.json and report.html into ``out``; record their paths."""
    out.mkdir(parents=True, exist_ok=True)
    folder = out / "anomalies"
    folder.mkdir(exist_ok=True)
    detailed = _with_readable_times(anomalies)
    for kind in ANOMALY_KINDS:
        import pyarrow.parquet as pq

        path = folder / f"{kind}.parquet"
        pq.write_table(detailed.filter(detailed[_FLAG[kind]]) if detailed.num_rows else detailed, path)
        report.files[f"anomalies_{kind}"] = str(path)
    report.files["json"] = str(out / "report.json")
    report.files["html"] = str(out / "report.html")
    (out / "report.html").write_text(render_html(report, detailed), encoding="utf-8")
    (out / "report.json").write_text(json.dumps(report.to_dict(), indent=2) + "\n", encoding="utf-8")
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
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
h1{margin-bottom:.2em} .muted{color:#666} table{border-collapse:collapse;margin:.5em 0 1.5em}
table{display:block;overflow-x:auto;max-width:100%}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:right} th{background:#f4f4f4}
td.l{text-align:left;white-space:nowrap;font-family:ui-monospace,monospace;font-size:12px}
th{text-align:center}
.status{padding:.6em 1em;border-radius:6px;font-weight:600;margin:1em 0}
.ok{background:#e3f6e5;color:#17612a} .alert{background:#fde8e8;color:#9b1c1c}
.cards{display:flex;flex-wrap:wrap;gap:10px}
.card{border:1px solid #ddd;border-radius:6px;padding:8px 14px;min-width:110px}
.card b{display:block;font-size:22px} .card.bad b{color:#b91c1c} figure{margin:1em 0}
"""


def render_html(report: Report, anomalies: pa.Table) -> str:
    """A self-contained page: status, totals, lateness, charts (inline SVG), worst and anomalous ids."""
    totals = report.totals
    esc = html.escape
    bad = set(ANOMALY_KINDS)
    shown = ("expected", "delivered", "missing", "duplicates", "unexpected", "early", "cancel_ignored", "in_grace",
             "cancelled", "cancelled_too_late", "rescheduled_too_late", "delivered_records")
    cards = "".join(f'<div class="card{" bad" if k in bad and totals[k] else ""}"><b>{totals[k]:,}</b>'
                    f'{esc(k.replace("_", " "))}</div>' for k in shown)
    status = ('<div class="status ok">OK: every expected message was delivered, none twice, none early, no cancel '
              'or reschedule ignored, nothing unexpected (exit code 0)</div>'
              if report.ok else
              f'<div class="status alert">ALERT: {esc(alert_text(totals))} (exit code 1)</div>')
    topic_rows = [[t, v["expected"], v["delivered"], v["missing"], v["duplicates"], v["unexpected"], v["early"],
                   v["cancel_ignored"], *_pcts(v["lateness_ms"])] for t, v in report.by_topic.items()]
    topic_rows.append(["all topics", totals["expected"], totals["delivered"], totals["missing"], totals["duplicates"],
                       totals["unexpected"], totals["early"], totals["cancel_ignored"], *_pcts(report.lateness_ms)])
    worst = [[w["id"], w["topic"], _when(w["due_ms"]), _when(w["first_ms"]), w["lateness_ms"], w["delivered_count"],
              _epochs(w)] for w in report.worst_late]
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
        f"<div class='cards'>{cards}</div>",
        "<h2>Lateness (first delivery minus due time, ms)</h2>",
        _table(["topic", "expected", "delivered", "missing", "duplicates", "unexpected", "early", "cancel ignored",
                "p50", "p90", "p99", "max"], topic_rows),
    ]
    if report.source["topics_not_found"]:
        parts.append(f"<p class='status alert'>Target topics not found on the broker: "
                     f"{esc(', '.join(report.source['topics_not_found']))}</p>")
    parts += [
        "<figure>", _histogram_svg(report.lateness_histogram), "</figure>",
        "<h2>Per hour of due time</h2><figure>", _per_hour_svg(report.per_hour), "</figure>",
        f"<h2>Latest {len(worst)} deliveries</h2>",
        _table(["id", "topic", "due", "first delivery", "lateness ms", "copies", "epochs"], worst),
    ]
    for kind in ANOMALY_KINDS:
        count = totals[kind]
        parts.append(f"<h2>{esc(kind.replace('_', ' ').capitalize())}: {count:,}</h2>")
        if not count:
            continue
        rows = anomalies.filter(anomalies[_FLAG[kind]]).slice(0, HTML_ROWS).to_pylist()
        parts.append(_table(
            ["id", "topic", "state", "due", "copies", "versions", "first delivery", "lateness ms", "epochs"],
            [[r["id"], r["topic"], _state(r), _when(r["due_ms"]), r["delivered_count"], r.get("versions_delivered"),
              _when(r["first_ms"]), r["lateness_ms"], _epochs(r)] for r in rows]))
        if count > HTML_ROWS:
            parts.append(f"<p class='muted'>First {HTML_ROWS} of {count:,}; all of them in "
                         f"anomalies/{kind}.parquet.</p>")
    parts.append("</body></html>")
    return "\n".join(parts)


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
    return str(first) if first == last else f"{first}–{last}"


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
        return f"<td class=l>{html.escape(str(value))}</td>"

    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(cell(v) for v in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _label_ms(ms: int | None) -> str:
    if ms is None:
        return ""
    return f"{ms / 1000:g}s" if abs(ms) >= 1000 else f"{ms}ms"


def _histogram_svg(histogram: list[dict[str, Any]]) -> str:
    from matplotlib.figure import Figure

    labels = [f"< {_label_ms(b['to_ms'])}" if b["from_ms"] is None else
              f"≥ {_label_ms(b['from_ms'])}" if b["to_ms"] is None else
              f"{_label_ms(b['from_ms'])}–{_label_ms(b['to_ms'])}" for b in histogram]
    counts = [b["count"] for b in histogram]
    figure = Figure(figsize=(10, 3.4))
    axes = figure.subplots()
    axes.bar(range(len(counts)), counts, color=["#c0392b" if (b["to_ms"] or 1) <= 0 else "#2f6db3" for b in histogram])
    axes.set_xticks(range(len(labels)), labels, rotation=40, ha="right", fontsize=8)
    axes.set_ylabel("messages")
    axes.set_title("Lateness of first delivery (red: before the due time)")
    if max(counts, default=0) > 50 * max(1, min((c for c in counts if c), default=1)):
        axes.set_yscale("log")
    return _svg(figure)


def _per_hour_svg(per_hour: list[dict[str, Any]]) -> str:
    from matplotlib.figure import Figure

    figure = Figure(figsize=(10, 4))
    axes = figure.subplots()
    if not per_hour:
        axes.text(0.5, 0.5, "no message was due in this window", ha="center", va="center")
        axes.set_axis_off()
        return _svg(figure)
    xs = range(len(per_hour))
    width = 0.4
    axes.bar([x - width / 2 for x in xs], [h["expected"] for h in per_hour], width, label="expected", color="#9bbbe0")
    axes.bar([x + width / 2 for x in xs], [h["delivered"] for h in per_hour], width, label="delivered",
             color="#2f6db3")
    problems = [sum(h[kind] for kind in ANOMALY_KINDS) for h in per_hour]
    axes.bar(xs, problems, width / 2, label="anomalies", color="#c0392b")
    step = max(1, len(per_hour) // 24)
    axes.set_xticks(list(xs)[::step], [h["hour"][5:13].replace("T", " ") + "h" for h in per_hour][::step],
                    rotation=40, ha="right", fontsize=8)
    axes.set_ylabel("messages")
    p99 = axes.twinx()
    p99.plot(list(xs), [h["lateness_ms"]["p99"] for h in per_hour], color="#e67e22", marker=".", label="p99 lateness")
    p99.set_ylabel("p99 lateness (ms)")
    values = [h["lateness_ms"]["p99"] or 0 for h in per_hour]
    p99.set_ylim(min(0, *values), max(1, *values) * 1.2)  # from 0, so a flat line does not look like a jump
    top = max(max(h["expected"], h["delivered"]) for h in per_hour)
    for x, count in zip(xs, problems, strict=True):
        if count:  # a handful of anomalies among thousands would be an invisible bar
            axes.annotate(str(count), (x, max(per_hour[x]["expected"], per_hour[x]["delivered"])),
                          xytext=(0, 3), textcoords="offset points", ha="center", color="#c0392b", fontsize=8)
    axes.set_ylim(0, max(1, top) * 1.15)
    handles, labels = axes.get_legend_handles_labels()
    more_handles, more_labels = p99.get_legend_handles_labels()
    axes.legend(handles + more_handles, labels + more_labels, fontsize=8, loc="upper center",
                bbox_to_anchor=(0.5, -0.3), ncol=4, frameon=False)
    axes.set_title("Messages per hour of due time")
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

