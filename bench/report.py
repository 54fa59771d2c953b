"""Figures of ``delayq bench`` and their table in BENCHMARKS.md.

The table lives between two marker lines in BENCHMARKS.md; everything outside them is
written by hand (what each figure measures, how to reproduce it) and is left alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .service_bench import summary

BEGIN = "<!-- delayq bench: generated from bench/results.json; edit outside these markers -->"
END = "<!-- delayq bench: end of generated part -->"
PEER = "Redis peer"
SCALE_SUITE = "scale"  # its figures get a table of their own too: configurations (nodes, R) by rows
CONSOLE_SUITE = "console"  # and the console's: a row per page, median, p95 and max against the target
VERSION_ORDER = ("delayq", "Kafka", "ZooKeeper", "confluent-kafka", "librdkafka", "rocksdict", "Python", "Redis",
                 "redis-py")


@dataclass
class Figure:
    """One figure: delayq's value over its runs and, where there is one, the Redis peer's beside it.

    Args:
        key: stable name in results.json (``lateness.1000.p99_ms``).
        label: what the table says.
        unit: ``msg/s``, ``ms``, ``s``, ``B``, ``MiB``, ``µs``, ``cores`` or ``x``.
        better: ``higher`` or ``lower``.
        values: delayq's value in each run; the figure is their median, with min and max.
        peer: the peer's value in each run, measured alternately with delayq's.
        stats: median/min/max/runs given directly, for a figure whose runs are kept elsewhere.
        spread: what min and max are: ``min-max``, or ``IQR`` (first and third quartile).
        details: checks and side values kept in results.json only.

    Raises:
        ValueError: neither ``values`` nor ``stats``, or ``better`` is not higher/lower.
    """

    key: str
    label: str
    unit: str
    better: str
    values: list[float] | None = None
    peer: list[float] | None = None
    stats: dict | None = None
    spread: str = "min-max"
    details: dict = field(default_factory=dict)
    suite: str = ""

    def __post_init__(self) -> None:
        if self.better not in ("higher", "lower"):
            raise ValueError(f"better must be 'higher' or 'lower', not {self.better!r}")
        if self.stats is None:
            if not self.values:
                raise ValueError(f"figure {self.key}: give values (one per run) or stats")
            self.stats = summary(self.values)

    @property
    def peer_stats(self) -> dict | None:
        return summary(self.peer) if self.peer else None

    @property
    def ratio(self) -> float | None:
        peer = self.peer_stats
        return self.stats["median"] / peer["median"] if peer and peer["median"] else None

    def to_json(self, *, date: str, quick: bool) -> dict:
        return {"suite": self.suite, "label": self.label, "unit": self.unit, "better": self.better, **self.stats,
                "spread": self.spread, "values": self.values,
                "peer": {**self.peer_stats, "name": PEER, "values": self.peer} if self.peer else None,
                "ratio": self.ratio, "measured_at": date, "quick": quick, "details": self.details}

    def one_line(self) -> str:
        row = table_row(self.to_json(date="", quick=False))
        text = f"{self.label}: {row['ours']} ({row['spread']}, {row['runs']} runs)"
        return text + (f"; {PEER}: {row['peer']}; delayq / Redis {row['ratio']}" if self.peer else "")


def number(value: float) -> str:
    """Enough digits to read, no more: 35,012 / 435 / 12.4 / 3.07, and whole numbers (ms) as they are."""
    size = abs(value)
    if size >= 1000 or value == int(value):
        return f"{value:,.0f}"
    if size >= 100:
        return f"{value:.0f}"
    if size >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def with_unit(value: float, unit: str) -> str:
    return f"{number(value)}×" if unit == "x" else f"{number(value)} {unit}"


def table_row(figure: dict) -> dict[str, str]:
    """The table cells of one figure as results.json holds it."""
    unit = figure["unit"]
    spread = f"{number(figure['min'])}–{number(figure['max'])}"
    peer = figure.get("peer")
    return {
        "label": figure["label"] + (" (quick)" if figure.get("quick") else ""),
        "ours": with_unit(figure["median"], unit),
        "spread": f"IQR {spread}" if figure.get("spread") == "IQR" else spread,
        "runs": str(figure["runs"]),
        "peer": f"{with_unit(peer['median'], unit)} ({number(peer['min'])}–{number(peer['max'])})" if peer else "",
        "ratio": f"{figure['ratio']:.2f}" if figure.get("ratio") is not None else "",
        "better": figure["better"],
    }


def _cpus(results: dict) -> str:
    """The CPU of the last run, or, when the figures were measured on more than one, each with its suites."""
    suites: dict[str, list[str]] = {}
    for figure in results["figures"].values():
        cpu = figure.get("cpu")
        if cpu is not None and figure["suite"] not in suites.setdefault(cpu, []):
            suites[cpu].append(figure["suite"])
    if len(suites) <= 1:
        return str(results["machine"]["cpu"])
    return "; ".join(f"{cpu}: {', '.join(names)}" for cpu, names in suites.items())


def render_markdown(results: dict, rows_only: bool = False):
    """The generated part of BENCHMARKS.md (between the markers), or just its rows as cell dicts."""
    rows = [table_row(figure) for figure in results["figures"].values()]
    if rows_only:
        return rows
    m, v = results["machine"], results["versions"]
    dates = sorted({figure["measured_at"][:10] for figure in results["figures"].values()})
    lines = [
        BEGIN,
        f"Measured {' to '.join(dict.fromkeys([dates[0], dates[-1]])) if dates else '-'} on {m['cores']} cores "
        f"({_cpus(results)}), {m['memory_gib']} GiB RAM, {m['os']} (Linux {m['kernel']}); load average "
        f"{m['load_average_at_start']} when the last run started (the machine is shared).",
        "",
        "Versions: " + ", ".join(f"{name} {v[name]}" for name in sorted(v, key=_version_rank)) + ".",
        "",
        "Each figure is the median of its runs; spread is min–max over the runs (IQR: first–third quartile). "
        "delayq / Redis is the ratio of the medians; `better` says which way is good.",
        "",
        f"| figure | delayq | spread | runs | {PEER} (spread) | delayq / Redis | better |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    lines += [f"| {r['label']} | {r['ours']} | {r['spread']} | {r['runs']} | {r['peer']} | {r['ratio']} | "
              f"{r['better']} |" for r in rows]
    lines += scale_table(results["figures"])
    lines += console_table(results["figures"])
    lines.append(END)
    return "\n".join(lines)


def scale_rows(figures: dict) -> list[dict[str, str]]:
    """The cells of the scale table: one row per configuration (nodes, R) the scale suite measured.

    Reads the ``scale`` suite's figures as results.json holds them (``details`` name each one's
    nodes, replicas and measure, ``delivery`` or ``ingest``); a ratio to 1 node needs the
    1-node figure of the same R.
    """
    found: dict[tuple[int, int], dict[str, dict]] = {}
    for figure in figures.values():
        details = figure.get("details") or {}
        if figure.get("suite") == SCALE_SUITE and {"nodes", "replicas", "measure"} <= details.keys():
            found.setdefault((details["replicas"], details["nodes"]), {})[details["measure"]] = figure
    rows = []
    for (replicas, nodes), measured in sorted(found.items()):
        one_node = found.get((replicas, 1), {})
        row = {"nodes": str(nodes), "replicas": str(replicas), "runs": "", "quick": ""}
        for measure in ("delivery", "ingest"):
            figure = measured.get(measure)
            base = one_node.get(measure)
            row[measure] = number(figure["median"]) if figure else ""
            row[f"{measure}_spread"] = f"{number(figure['min'])}–{number(figure['max'])}" if figure else ""
            row[f"{measure}_x1"] = f"{figure['median'] / base['median']:.2f}" if figure and base and base["median"] \
                else ""
            if figure:
                row["runs"] = row["runs"] or str(figure["runs"])
                row["quick"] = row["quick"] or ("quick" if figure.get("quick") else "")
        delivery = measured.get("delivery") or {}
        peer = delivery.get("peer")
        row["peer"] = f"{number(peer['median'])} ({number(peer['min'])}–{number(peer['max'])})" if peer else ""
        row["peer_ratio"] = f"{delivery['ratio']:.2f}" if delivery.get("ratio") is not None else ""
        rows.append(row)
    return rows


def scale_table(figures: dict) -> list[str]:
    """The lines of the scale table (after a blank line), or none when the scale suite has no figures."""
    rows = scale_rows(figures)
    if not rows:
        return []
    counts: dict[str, set[int]] = {"delivery": set(), "ingest": set()}
    for figure in figures.values():
        details = figure.get("details") or {}
        if figure.get("suite") == SCALE_SUITE and details.get("measure") in counts and "count" in details:
            counts[details["measure"]].add(details["count"])

    def count(measure: str) -> str:
        return " / ".join(f"{c:,}" for c in sorted(counts[measure])) or "?"

    quick = " Quick sizes: a smoke run, not a measurement." if any(r["quick"] for r in rows) else ""
    return [
        "",
        "Scale (`delayq bench --only scale`): 6 shards on a 12-partition buffer, N nodes as processes, R = 0 "
        "(every node holds every shard) or R = 1 (each shard on one node), a fresh cluster a run, measured once "
        "its holders and masters settled (masters balanced). Delivery: the masters together, "
        f"{count('delivery')} messages due at one instant, timed from the target's append times. Ingest: "
        f"{count('ingest')} messages written while the nodes' readers were paused, timed from their resume until "
        "every holder stored its shards' messages (each message is stored on N nodes with R = 0, on one with "
        "R = 1). × 1 node: the ratio of the medians to 1 node with the same R. The Redis peer (one poller) moved "
        f"{count('delivery')} due messages in the same runs.{quick}",
        "",
        "| nodes | R | delivery msg/s | spread | × 1 node | ingest msg/s | spread | × 1 node | runs | "
        f"{PEER} delivery msg/s (spread) | delivery / Redis |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *(f"| {r['nodes']} | {r['replicas']} | {r['delivery']} | {r['delivery_spread']} | {r['delivery_x1']} | "
          f"{r['ingest']} | {r['ingest_spread']} | {r['ingest_x1']} | {r['runs']} | {r['peer']} | "
          f"{r['peer_ratio']} |" for r in rows),
    ]


def console_rows(figures: dict) -> list[dict[str, str]]:
    """The cells of the console table: one row per page the console suite timed, in the order it measured them.

    Reads the ``console`` suite's page figures as results.json holds them: ``details`` name the page and
    hold its p95, max, target and verdict (console_bench.figures).
    """
    rows = []
    for figure in figures.values():
        details = figure.get("details") or {}
        if figure.get("suite") != CONSOLE_SUITE or "p95_ms" not in details:
            continue
        rows.append({"page": details["page"], "median": with_unit(figure["median"], "ms"),
                     "p95": with_unit(details["p95_ms"], "ms"), "max": with_unit(details["max_ms"], "ms"),
                     "target": with_unit(details["target_ms"], "ms"), "requests": str(details["requests"]),
                     "verdict": "yes" if details["passed"] else "**no**"})
    return rows


def console_table(figures: dict) -> list[str]:
    """The lines of the console table (after a blank line), or none when the console suite has no page figures."""
    rows = console_rows(figures)
    build = next((f for f in figures.values() if f.get("suite") == CONSOLE_SUITE and "records" in
                  (f.get("details") or {})), None)
    if not rows or build is None:
        return []
    details = build["details"]
    load, machine = details["load_average"], details["machine"]
    topics = ", ".join(f"{name} {count:,}" for name, count in details["topics"].items())
    quick = " Quick sizes: a smoke run, not a measurement." if build.get("quick") else ""
    return [
        "",
        f"Console (`delayq bench --only console`; issue 34: every page under {number(details['target_ms'])} ms), "
        f"measured {build['measured_at'][:10]} on {machine['cores']} cores ({machine['cpu']}): one node holding "
        f"{details['pending']:,.0f} pending (due over the next 7 days: {topics}; and {details['series']:,} "
        f"repeating), {details['dead_letters']:,} dead letters. `delayq console` in its own "
        f"process with a fresh index, which read {details['records']:,} buffer and dead-letter records in "
        f"{number(details['seconds'])} s ({number(build['median'])} records/s). Each page asked "
        f"{rows[0]['requests']} times after warm-ups, round-robin over the pages, one connection a request, from "
        "the bench's process; it passes when its p95 is under the target. `node:` rows are the node's console "
        f"endpoints alone. Load average {load['before'][0]:.1f} before the timing, {load['after'][0]:.1f} after "
        f"(the machine is shared).{quick}",
        "",
        "| page | median | p95 | max | target | p95 under it |",
        "|---|---:|---:|---:|---:|---|",
        *(f"| {r['page']} | {r['median']} | {r['p95']} | {r['max']} | {r['target']} | {r['verdict']} |"
          for r in rows),
    ]


def _version_rank(name: str) -> int:
    return VERSION_ORDER.index(name) if name in VERSION_ORDER else len(VERSION_ORDER)


def write_markdown(path: Path, results: dict) -> None:
    """Put the table into ``path`` between the markers; create the file, or append the part, if missing."""
    block = render_markdown(results)
    text = path.read_text() if path.exists() else "# delayq benchmarks\n\nWritten by `delayq bench`.\n\n"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        text = head + block + rest.split(END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
