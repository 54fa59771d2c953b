"""The one-page map of delayq's parts, docs/parts-map.svg: ``python docs/parts_map.py`` draws it again.

A box per part: its folder, what it owns, and the one home of each contract it holds (◆). An arrow per pair of
parts where one imports the other: solid when a module imports it at import time, dashed when only code inside
a function does (loaded when that code runs). The package root, delayq/, is the floor: every part imports it and
it imports none of them, so it has no arrows. Tinted frames are the processes the parts run in.

:data:`ARROWS` are written out here, each with its route; tests/unit/test_parts_map.py computes the pairs from
the code with ast and fails when they differ, or when the committed SVG is not what this file draws. After a
change of imports: fix the import or :data:`ARROWS` and :data:`ROUTES`, run this file, look at the picture.
Plain Python: no Graphviz, the same bytes every run.
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from html import escape
from pathlib import Path

SVG = Path(__file__).with_name("parts-map.svg")
Point = tuple[float, float]


@dataclass(frozen=True)
class Box:
    """One part on the map: what it owns, and the contracts whose one home it is."""

    key: str
    title: str
    owns: str
    homes: tuple[tuple[str, str], ...] = ()  # (file in the repository, the contract it is the one home of)
    group: str = ""


# The processes the parts run in, and the scaffolding: key -> (label, fill, border, where the label goes: above
# or below the frame's boxes, "left" or "right"; placed where no arrow crosses the frame).
GROUPS = {
    "command": ("the delayq command: it starts each process below", "#f4effb", "#8a6bbf", "top-left"),
    "scaffolding": ("scaffolding: never at run time", "#f3f3f3", "#8c8c8c", "top-right"),
    "user": ("the user's process", "#eaf2fb", "#5b8fc7", "top-left"),
    "node": ("a node: delayq node, its buffer reader (a child process), its member processes", "#ebf6ea",
             "#4f9a4f", "bottom-left"),
    "spark": ("the Spark job", "#fdf1e3", "#c47f33", "top-right"),
}

BOXES = (
    Box("cli", "delayq/cli.py, delayq/commands/",
        "the delayq command, one module per sub-command; a command loads its part only when it runs",
        group="command"),
    Box("demo", "demo/", "the main job: unpaid orders time out while a master is killed; the Spark proof",
        group="scaffolding"),
    Box("bench", "bench/", "the benchmarks, the Redis sorted-set peer, the chaos soak", group="scaffolding"),
    Box("dev", "dev/", "the local stack: Kafka + ZooKeeper, the secured variant, kcat, Java clients",
        group="scaffolding"),
    Box("testing", "delayq/testing.py", "nodes as child processes; release_env.py: a recorded release's venv",
        group="scaffolding"),
    Box("spark", "spark/", "the reconciliation: was each message delivered once, on time; its report",
        group="spark"),
    Box("proxy", "proxy/", "the producer: delay, Every/Cron, cancel, lookup, retries; AIOProducer, quix sink "
        "(+ delayq/aio.py, quix.py)",
        (("proxy/producer.py", "BufferWriter"),), group="user"),
    Box("delay_service", "delay_service/",
        "the node: ingest, delivery on the master, HTTP + metrics, the buffer reader, member processes, "
        "its topics and Kafka ACLs",
        (("delay_service/stored.py", "the node's stored form"),), group="node"),
    Box("election", "election/", "ZooKeeper: shard election, epoch, cursor, membership, znode ACLs",
        (("election/records.py", "the records in ZooKeeper"),), group="node"),
    Box("store", "store/", "the RocksDB time index, one per shard held",
        (("store/ops.py", "store ops, their frames between processes"),), group="node"),
    Box("helm", "helm/", "the chart: nodes, init Job, reconcile CronJob; runs the image, no Python"),
    Box("core", "delayq/  the package root: in every process; every part imports it, it imports none of them",
        "import delayq's names (Producer, cancel, lookup, Settings: loaded from proxy/ on first use); "
        "errors, paths, releases",
        (("delayq/wire.py", "buffer wire format, partition rule, ids, reason codes"),
         ("delayq/settings.py", "settings: the one Settings model"),
         ("delayq/features.py", "feature levels"),
         ("delayq/extras.py", "which pip extra each part needs"),
         ("delayq/clock.py", "now, and the one duration grammar"),
         ("delayq/schedule.py", "due times, delay levels, a series' next occurrence"),
         ("delayq/__init__.py", "the version")),
        ),
)
BOX = {box.key: box for box in BOXES}

# Which box each module of the wheel is drawn in: the first prefix that matches (the module or its package).
MODULES = (
    ("delayq.aio", "proxy"), ("delayq.quix", "proxy"),
    ("delayq.cli", "cli"), ("delayq.__main__", "cli"), ("delayq.commands", "cli"),
    ("delayq.testing", "testing"), ("delayq.release_env", "testing"),
    ("delayq.proxy", "proxy"), ("delayq.delay_service", "delay_service"), ("delayq.store", "store"),
    ("delayq.election", "election"), ("delayq.spark", "spark"), ("delayq.dev", "dev"), ("delayq.demo", "demo"),
    ("delayq.bench", "bench"), ("delayq", "core"),
)
FLOOR = "core"  # imported by every other box but helm, and importing none: drawn as the floor, not as arrows

# (importer, imported, kind): "imports" at import time, "deferred" only inside functions. Arrows into FLOOR are
# not listed: the floor stands for them.
ARROWS = (
    ("cli", "demo", "imports"), ("cli", "dev", "imports"),
    ("cli", "bench", "deferred"), ("cli", "spark", "deferred"), ("cli", "proxy", "deferred"),
    ("cli", "delay_service", "deferred"), ("cli", "election", "deferred"),
    ("demo", "dev", "imports"), ("demo", "testing", "imports"),
    ("demo", "spark", "deferred"), ("demo", "delay_service", "deferred"),
    ("bench", "dev", "imports"), ("bench", "testing", "imports"), ("bench", "proxy", "imports"),
    ("bench", "spark", "imports"), ("bench", "delay_service", "imports"), ("bench", "store", "imports"),
    ("testing", "dev", "imports"), ("testing", "delay_service", "imports"), ("testing", "election", "imports"),
    ("proxy", "election", "deferred"),
    ("delay_service", "store", "imports"), ("delay_service", "election", "imports"),
)


def box_of(module: str) -> str:
    """The box a module of the wheel (by import name) is drawn in."""
    for prefix, key in MODULES:
        if module == prefix or module.startswith(prefix + "."):
            return key
    raise KeyError(module)


# Layout: four columns (the last for the legend and helm/), five rows of boxes, the floor under them.
FONT = "Helvetica, Arial, sans-serif"
SIZE, TITLE_SIZE, LINE = 14, 16, 18
CHAR = 6.9  # average advance of a SIZE character, to wrap text inside a box
WIDTH = 1240
COLUMNS = ((72, 262), (394, 262), (716, 262), (1040, 186))  # (x, width); lanes for arrows between them
ROW_GAP = 50
TOP = 66  # under the title line and the label of the first frame
PLACES = {  # key -> (first column, last column, row)
    "cli": (0, 2, 0),
    "demo": (0, 0, 1), "bench": (1, 1, 1),
    "dev": (0, 0, 2), "testing": (1, 1, 2), "spark": (2, 2, 2),
    "proxy": (0, 0, 3), "delay_service": (1, 2, 3),
    "election": (1, 1, 4), "store": (2, 2, 4), "helm": (3, 3, 4),
}


@dataclass(frozen=True)
class Rect:
    x: float
    y: float
    w: float
    h: float
    row_bottom: float = 0  # the bottom of the tallest box in its row

    def top(self, f: float = 0.5) -> Point:
        return (self.x + self.w * f, self.y)

    def bottom(self, f: float = 0.5) -> Point:
        return (self.x + self.w * f, self.y + self.h)

    def left(self, f: float = 0.5) -> Point:
        return (self.x, self.y + self.h * f)

    def right(self, f: float = 0.5) -> Point:
        return (self.x + self.w, self.y + self.h * f)

    def gap(self, f: float) -> float:
        """A y in the gap under this box's row: f = 0 at the row's bottom, 1 at the next row's top."""
        return self.row_bottom + ROW_GAP * f


def _wrap(text: str, width: float, size: float = SIZE) -> list[str]:
    return textwrap.wrap(text, int(width / (CHAR * size / SIZE)), break_long_words=False, break_on_hyphens=False)


def _lines(box: Box, width: float) -> list[tuple[str, str]]:
    """(kind, text) lines of a box: its title, what it owns, its contracts."""
    inner = width - 20
    lines = [("title", line) for line in _wrap(box.title, inner, TITLE_SIZE * 1.1)]
    lines += [("owns", line) for line in _wrap(box.owns, inner)]
    for path, contract in box.homes:
        wrapped = _wrap(f"◆ {Path(path).name}: {contract}", inner, SIZE * 1.08)  # bold
        lines += [("home", wrapped[0]), *(("home-more", line) for line in wrapped[1:])]
    return lines


def layout() -> dict[str, Rect]:
    """Where each box is drawn."""
    rects: dict[str, Rect] = {}
    y = TOP
    for row in range(5):
        sizes = {}
        for key, (first, last, _) in ((k, p) for k, p in PLACES.items() if p[2] == row):
            x = COLUMNS[first][0]
            width = COLUMNS[last][0] + COLUMNS[last][1] - x
            sizes[key] = (x, width, 10 + LINE * len(_lines(BOX[key], width)))
        bottom = y + max(h for _, _, h in sizes.values())
        for key, (x, width, height) in sizes.items():
            rects[key] = Rect(x, y, width, height, bottom)
        y = bottom + ROW_GAP
    rects[FLOOR] = Rect(20, y - 12, WIDTH - 40, 0)
    return rects


def _via(start: Point, *moves: tuple[str, float], end: Point) -> list[Point]:
    """An orthogonal path: from start, ("x", x) goes across to x, ("y", y) up or down to y; then on to end."""
    points = [start]
    for axis, value in moves:
        x, y = points[-1]
        points.append((value, y) if axis == "x" else (x, value))
    points.append(end)
    return points


def _down(r: dict[str, Rect], importer: str, imported: str, f: float) -> list[Point]:
    """Straight down from the importer's bottom to the imported's top, at fraction f of the imported's width."""
    x, y = r[imported].top(f)
    return [(x, r[importer].y + r[importer].h), (x, y)]


def _lane(column: int, f: float) -> float:
    """An x in the lane left of ``column`` (0: the margin left of the first column), f = 0 at its left side."""
    left = COLUMNS[column - 1][0] + COLUMNS[column - 1][1] if column else 0
    return left + (COLUMNS[column][0] - left) * f


ROUTES: dict[tuple[str, str], Callable[[dict[str, Rect]], list[Point]]] = {
    ("cli", "demo"): lambda r: _down(r, "cli", "demo", 0.3),
    ("cli", "bench"): lambda r: _down(r, "cli", "bench", 0.12),
    ("cli", "spark"): lambda r: _down(r, "cli", "spark", 0.5),
    ("cli", "dev"): lambda r: _via(r["cli"].left(0.3), ("x", _lane(0, 0.55)), ("y", r["dev"].left(0.5)[1]),
                                   end=r["dev"].left(0.5)),
    ("cli", "proxy"): lambda r: _via(r["cli"].left(0.55), ("x", _lane(0, 0.4)), ("y", r["proxy"].left(0.3)[1]),
                                     end=r["proxy"].left(0.3)),
    ("cli", "election"): lambda r: _via(r["cli"].left(0.8), ("x", _lane(0, 0.25)),
                                        ("y", r["election"].left(0.75)[1]), end=r["election"].left(0.75)),
    ("cli", "delay_service"): lambda r: _via(r["cli"].right(0.5), ("x", _lane(3, 0.55)),
                                             ("y", r["delay_service"].right(0.3)[1]),
                                             end=r["delay_service"].right(0.3)),
    ("demo", "dev"): lambda r: _down(r, "demo", "dev", 0.3),
    ("demo", "testing"): lambda r: [r["demo"].bottom(0.75), r["testing"].top(0.2)],
    # demo's two dashed arrows share their first stretch, then fork
    ("demo", "delay_service"): lambda r: _via(r["demo"].bottom(0.92), ("y", r["demo"].gap(0.62)),
                                              ("x", _lane(2, 0.3)), end=(_lane(2, 0.3), r["delay_service"].y)),
    ("demo", "spark"): lambda r: _via(r["demo"].bottom(0.92), ("y", r["demo"].gap(0.62)),
                                      ("x", r["spark"].top(0.12)[0]), end=r["spark"].top(0.12)),
    ("bench", "dev"): lambda r: [r["bench"].bottom(0.25), r["dev"].top(0.8)],
    ("bench", "testing"): lambda r: _down(r, "bench", "testing", 0.6),
    ("bench", "proxy"): lambda r: _via(r["bench"].left(0.75), ("x", _lane(1, 0.45)), ("y", r["proxy"].right(0.25)[1]),
                                       end=r["proxy"].right(0.25)),
    ("bench", "store"): lambda r: _via(r["bench"].right(0.2), ("x", _lane(3, 0.35)), ("y", r["store"].right(0.5)[1]),
                                       end=r["store"].right(0.5)),
    ("bench", "spark"): lambda r: _via(r["bench"].right(0.5), ("x", r["spark"].top(0.3)[0]),
                                       end=r["spark"].top(0.3)),
    ("bench", "delay_service"): lambda r: _via(r["bench"].right(0.8), ("x", _lane(2, 0.6)),
                                               end=(_lane(2, 0.6), r["delay_service"].y)),
    ("testing", "dev"): lambda r: [r["testing"].left(0.6), r["dev"].right(0.6)],
    ("testing", "delay_service"): lambda r: _down(r, "testing", "delay_service", 0.25),
    ("testing", "election"): lambda r: _via(r["testing"].left(0.85), ("x", _lane(1, 0.65)),
                                            ("y", r["election"].left(0.25)[1]), end=r["election"].left(0.25)),
    ("proxy", "election"): lambda r: _via(r["proxy"].bottom(0.6), ("y", r["election"].left(0.5)[1]),
                                          end=r["election"].left(0.5)),
    ("delay_service", "store"): lambda r: _down(r, "delay_service", "store", 0.5),
    ("delay_service", "election"): lambda r: _down(r, "delay_service", "election", 0.5),
}


def _text(x: float, y: float, text: str, size: float = SIZE, weight: str = "normal", fill: str = "#222222",
          anchor: str = "start") -> str:
    return (f'<text x="{x:g}" y="{y:g}" font-size="{size:g}" font-weight="{weight}" fill="{fill}"'
            f' text-anchor="{anchor}">{escape(text)}</text>')


def _box(box: Box, r: Rect) -> list[str]:
    dashed = ' stroke-dasharray="5 3"' if box.key == "helm" else ""
    out = [f'<g id="box-{box.key}">',
           f'<rect x="{r.x:g}" y="{r.y:g}" width="{r.w:g}" height="{r.h:g}" rx="7" fill="white" stroke="#555555"'
           f' stroke-width="1.2"{dashed}/>']
    y = r.y + 18
    for kind, line in _lines(box, r.w):
        if kind == "title":
            out.append(_text(r.x + 10, y, line, TITLE_SIZE, "bold"))
        elif kind == "owns":
            out.append(_text(r.x + 10, y, line))
        else:
            out.append(_text(r.x + 10, y, line, fill="#a3262a", weight="bold" if kind == "home" else "normal"))
        y += LINE
    out.append("</g>")
    return out


def _floor(box: Box, r: Rect) -> tuple[list[str], float]:
    """The package root across the page: title, what it owns, its contracts in three columns."""
    out = [_text(r.x + 12, r.y + 22, box.title, TITLE_SIZE, "bold"),
           _text(r.x + 12, r.y + 22 + LINE, box.owns)]
    per_column = (len(box.homes) + 2) // 3
    for i, (path, contract) in enumerate(box.homes):
        x = r.x + 12 + (r.w / 3) * (i // per_column)
        y = r.y + 24 + LINE * (2 + i % per_column)
        out.append(f'<text x="{x:g}" y="{y:g}" font-size="{SIZE}" fill="#a3262a"><tspan font-weight="bold">'
                   f"◆ {escape(Path(path).name)}:</tspan> {escape(contract)}</text>")
    height = 24 + LINE * (1 + per_column) + 12
    rect = (f'<rect x="{r.x:g}" y="{r.y:g}" width="{r.w:g}" height="{height:g}" rx="7" fill="#fffbe8"'
            f' stroke="#b59a3a" stroke-width="1.5"/>')
    return [f'<g id="box-{box.key}">', rect, *out, "</g>"], height


def _groups(r: dict[str, Rect]) -> list[str]:
    out = []
    for group, (label, fill, border, where) in GROUPS.items():
        members = [r[box.key] for box in BOXES if box.group == group]
        x0 = min(m.x for m in members) - 12
        x1 = max(m.x + m.w for m in members) + 12
        y0 = min(m.y for m in members) - (24 if where.startswith("top") else 10)
        y1 = max(m.y + m.h for m in members) + (10 if where.startswith("top") else 26)
        x, anchor = (x0 + 10, "start") if where.endswith("left") else (x1 - 10, "end")
        y = y0 + 16 if where.startswith("top") else y1 - 8
        out += [f'<rect x="{x0:g}" y="{y0:g}" width="{x1 - x0:g}" height="{y1 - y0:g}" rx="10" fill="{fill}"'
                f' stroke="{border}" stroke-width="1.2"/>',
                _text(x, y, label, 12.5, "bold", border, anchor)]
    return out


def _arrow(importer: str, imported: str, kind: str, points: list[Point], legend: bool = False) -> str:
    path = " ".join(f"{'M' if i == 0 else 'L'}{x:g},{y:g}" for i, (x, y) in enumerate(points))
    style = ('stroke="#7a55b8" stroke-dasharray="6 4" marker-end="url(#head-deferred)"' if kind == "deferred"
             else 'stroke="#333333" marker-end="url(#head)"')
    names = "" if legend else f'id="{kind}:{importer}->{imported}" class="{kind}" '
    return f'<path {names}d="{path}" fill="none" stroke-width="1.5" {style}/>'



def _legend(x: float, y: float) -> list[str]:
    width = COLUMNS[3][1]
    out = [_text(x, y, "How to read it", TITLE_SIZE, "bold")]
    y += 26
    for kind, words in (("imports", "imports it at import time"),
                        ("deferred", "imports it inside a function: when that code runs")):
        out.append(_arrow("", "", kind, [(x, y - 4), (x + 36, y - 4)], legend=True))
        for line in _wrap(words, width - 46):
            out.append(_text(x + 46, y, line))
            y += LINE
        y += 6
    for line in _wrap("◆ file: the one home of a contract", width):
        out.append(_text(x, y, line, fill="#a3262a", weight="bold"))
        y += LINE
    y += 10
    notes = ("Tinted frames: the processes a part runs in. No arrow, no import. A runtime part (proxy, store, "
             "election, delay_service, spark) imports another only through its package (delayq.store, not "
             "delayq.store.ops), never the scaffolding, and no import cycles: tests/unit/test_structure.py. "
             "The arrows are the code's imports: tests/unit/test_parts_map.py.")
    for line in _wrap(notes, width):
        out.append(_text(x, y, line, fill="#444444"))
        y += LINE
    return out


def render() -> str:
    """The SVG document."""
    r = layout()
    floor, floor_height = _floor(BOX[FLOOR], r[FLOOR])
    height = r[FLOOR].y + floor_height + 16
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height:g}" width="{WIDTH}"'
           f' height="{height:g}" font-family="{FONT}">',
           "<title>delayq: its parts, what each owns, the one home of each contract, which part imports which"
           "</title>",
           '<defs><marker id="head" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7"'
           ' orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#333333"/></marker>'
           '<marker id="head-deferred" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7"'
           ' orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#7a55b8"/></marker></defs>',
           f'<rect width="{WIDTH}" height="{height:g}" fill="white"/>',
           _text(20, 28, "delayq: the parts, what each owns, the one home of each contract (◆), who imports whom",
                 17, "bold")]
    out += _groups(r)
    for importer, imported, kind in ARROWS:
        out.append(_arrow(importer, imported, kind, ROUTES[importer, imported](r)))
    for box in BOXES:
        if box.key != FLOOR:
            out += _box(box, r[box.key])
    out += floor
    out += _legend(COLUMNS[3][0], TOP - 8)
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main() -> int:
    SVG.write_text(render())
    print(f"wrote {SVG}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
