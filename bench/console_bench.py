"""The web console's figure (issue 34): with 10M pending and 100k dead letters, every console page answers in
under 300 ms.

One node (a child process, ``delayq node``) holds N pending messages (default 10,000,000; written by
:func:`~delayq.bench.service_bench.fill_buffer`, the capacity suite's fill) due over the next 7 days to
four target topics, one of them rare (1 message in 100,000), plus 500 repeating messages (the series
page's rows) and 20 messages due at once (a delivered message's page). Then 100,000 malformed buffer
records are planted (99 % cancels on the wrong partition, 1 % puts whose value is no frame: the rare
reason code), which the node, as master, copies to the dead-letter topic; the cheapest dead letters to
make (an undeliverable put would cost the master a delivery each).

The console then runs as it does in production, ``delayq console`` in a process of its own with a
fresh index, timed from its start until its index has read both topics (records a second of the
build); and, with ``BENCH_CONSOLE_NODE=1``, the same pages on the node's own port (DELAYQ_CONSOLE=true:
the node's index is built while the buffer fills). Each page is asked over HTTP from this process
(urllib, a connection per request), round-robin over the pages so the machine's load swings hit
them alike: 3 warm-up rounds, then 30 timed; median, p95 and max per page against the 300 ms target
(a page passes when its p95 is under it). The node's console endpoints are timed alone too.

    delayq bench --only console                                   # 10M pending: ~21 min on 2 shared cores
    BENCH_CONSOLE_PENDING=200k delayq bench --only console        # a smaller run
    BENCH_CONSOLE_DEAD_LETTERS=10k BENCH_CONSOLE_NODE=1 ...
    BENCH_CONSOLE_HOLD_S=300 ...      # keep it all up after the timing, to profile a page (py-spy)

Opt-in (a plain ``delayq bench`` leaves it out): at 10M its fill takes ~13 minutes and the index ~6, and the
capacity suite's 10M node cannot serve (its messages are all due in the same millisecond to one topic,
and its RSS must be read before a console touches the node).
"""

from __future__ import annotations

import html
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka import Producer as KafkaProducer
from rich.progress import Progress

from delayq import Every, Producer, Settings, wire
from delayq.clock import now_ms
from delayq.delay_service.console.cluster import encode_cursor
from delayq.dev import DevStack
from delayq.testing import LocalCluster, NodeProcess, free_server_port, settings_env

from .proc import cpu_seconds
from .reconcile_bench import parse_messages
from .service_bench import DAY_MS, bench_cluster, create_target, fill_buffer, node_metric, percentile, wait_for

PENDING_ENV = "BENCH_CONSOLE_PENDING"
DEAD_LETTERS_ENV = "BENCH_CONSOLE_DEAD_LETTERS"
NODE_CONSOLE_ENV = "BENCH_CONSOLE_NODE"
HOLD_ENV = "BENCH_CONSOLE_HOLD_S"  # keep the node and the console up this long after the timing: for a profiler
TARGET_MS = 300.0
WARMUP_ROUNDS = 3
TIMED_ROUNDS = 30
SPAN_MS = 7 * DAY_MS  # the pending messages' due times spread over the next week
RARE_EVERY = 100_000  # one message in this many goes to the rare topic
SERIES = 500  # repeating messages (the series page shows 50 a page)
SERIES_EVERY_S = 86_400
DELIVERED = 20  # messages due at once: delivered before the pages are timed
RARE_CODE_EVERY = 100  # one planted dead letter in this many has the rare reason code
REQUEST_TIMEOUT_S = 30.0
# What GET /console/healthz says of the console's index: "ok (the index is starting)" or "... N records behind".
_STARTING = "the index is starting"
_BEHIND = re.compile(r"the index is ([\d,]+) records behind")
_NEXT_PAGE = re.compile(r"<a\b[^>]*\bid=\"next-page\"[^>]*>")
_HREF = re.compile(r"\bhref=\"([^\"]*)\"")
_ROW_ID = re.compile(r"<tr\b[^>]*\bdata-id=\"([0-9a-f-]{36})\"")
# What a row of a page starts with: a table's row, a history's event, an upcoming item of a node's JSON.
_ROWS = ("<tr data-", "<li data-kind=", '{"id":')
# The lowest delay id: a cursor (due, NIL_ID) starts a page at the first message due at that time.
NIL_ID = "00000000-0000-0000-0000-000000000000"


# -- what is written -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TopicFill:
    """``count`` pending messages to target topic ``<cluster>-<name>``."""

    name: str
    count: int


RARE_TOPIC = "audit"


def fill_plan(pending: int) -> tuple[TopicFill, ...]:
    """How ``pending`` messages split over the target topics: 60 % orders, 30 % emails, the rest reports, and one
    in :data:`RARE_EVERY` (at least one) to the rare topic a filtered upcoming page looks for.

    Raises:
        ValueError: ``pending`` is below 4 (one message a topic).
    """
    if pending < 4:
        raise ValueError(f"the console bench needs at least 4 pending messages (one a topic), not {pending}")
    rare = max(1, pending // RARE_EVERY)
    orders, emails = pending * 6 // 10, pending * 3 // 10
    return (TopicFill("orders", orders), TopicFill("emails", emails),
            TopicFill("reports", pending - orders - emails - rare), TopicFill(RARE_TOPIC, rare))


def spread_due(start_ms: int, count: int, span_ms: int = SPAN_MS) -> Callable[[int], int]:
    """Due time of message ``i`` of ``count``: evenly over ``span_ms`` from ``start_ms``."""
    return lambda i: start_ms + i * span_ms // count


@dataclass(frozen=True)
class Planted:
    """A malformed buffer record the master will dead-letter with reason ``code``."""

    key: bytes
    value: bytes | None
    headers: list[tuple[str, bytes]]
    partition: int
    code: wire.Reason


def malformed_record(i: int, partitions: int) -> Planted:
    """The ``i``-th planted record: a cancel on the wrong partition, or (one in :data:`RARE_CODE_EVERY`) a put on
    its own partition whose value is no frame."""
    delay_id = wire.new_delay_id()
    home = wire.buffer_partition(delay_id, partitions)
    if i % RARE_CODE_EVERY == RARE_CODE_EVERY - 1:
        return Planted(delay_id.encode(), b"no frame: planted by the console bench", [], home, wire.Reason.BAD_FRAME)
    return Planted(delay_id.encode(), None, wire.control_headers(wire.OP_CANCEL, delay_id), (home + 1) % partitions,
                   wire.Reason.WRONG_PARTITION)


def plant_dead_letters(settings: Settings, count: int, progress: Progress) -> None:
    producer = KafkaProducer(settings.kafka_conf(**{"linger.ms": 20, "queue.buffering.max.messages": 500_000}))
    task = progress.add_task(f"planting {count:,} malformed buffer records", total=count)
    for i in range(count):
        record = malformed_record(i, settings.buffer_partitions)
        producer.produce(settings.buffer_topic, key=record.key, value=record.value, headers=record.headers,
                         partition=record.partition)
        if i % 10_000 == 0:
            producer.poll(0)
            progress.update(task, completed=i)
    if producer.flush(120):
        raise RuntimeError("planting dead letters: records still unsent after 120 s")
    progress.update(task, completed=count)


def put_series_and_soon(settings: Settings, target: str, start_ms: int) -> list[str]:
    """:data:`SERIES` repeating messages (daily, first due spread over the week) and :data:`DELIVERED` due at once,
    through delayq's producer; the ids of the latter."""
    producer = Producer({"bootstrap.servers": settings.bootstrap_servers, "delayq.cluster": settings.cluster,
                         "delayq.lookup.urls": "", "delayq.zk.connect": settings.zk_connect,
                         **settings.kafka_passthrough()})
    first_due = spread_due(start_ms + SERIES_EVERY_S * 1000 // SERIES, SERIES)
    for i in range(SERIES):
        producer.produce(target, b"repeating", key=f"series-{i}".encode(), deliver_at=first_due(i),
                         repeat=Every(SERIES_EVERY_S, times=100))
    soon = [producer.produce(target, b"soon", key=f"soon-{i}".encode(), delay=0.5) for i in range(DELIVERED)]
    if producer.flush(60):
        raise RuntimeError("delayq's producer still had puts unsent after 60 s")
    return [delay_id for delay_id in soon if delay_id is not None]


def sizes_from(environ: Mapping[str, str], pending: int, dead_letters: int) -> tuple[int, int]:
    """(pending, dead letters): ``BENCH_CONSOLE_PENDING`` and ``BENCH_CONSOLE_DEAD_LETTERS`` (``200k``, ``10M``) if
    set, else the given sizes.

    Raises:
        ValueError: a variable set to something else than a count, naming it.
    """
    sizes = []
    for name, default in ((PENDING_ENV, pending), (DEAD_LETTERS_ENV, dead_letters)):
        text = environ.get(name, "").strip()
        try:
            sizes.append(parse_messages(text) if text else default)
        except ValueError as err:
            raise ValueError(f"{name}: {err}") from None
    return sizes[0], sizes[1]


def node_console_from(environ: Mapping[str, str]) -> bool:
    """Whether ``BENCH_CONSOLE_NODE`` asks for the node's own /console too (1, true, yes)."""
    return environ.get(NODE_CONSOLE_ENV, "").strip().lower() in ("1", "true", "yes")


# -- reading pages -----------------------------------------------------------------------------------------------


def index_lag_in(health: str) -> int | None:
    """How many records the console's index is behind, as its ``/console/healthz`` says; None while it starts.

    Raises:
        ValueError: the text says neither (a console this bench does not know how to read).
    """
    if _STARTING in health:
        return None
    behind = _BEHIND.search(health)
    if behind is None:
        raise ValueError(f"GET /console/healthz said {health[:200]!r}: neither 'the index is starting' nor 'the index "
                         "is N records behind'")
    return int(behind.group(1).replace(",", ""))


def next_page_href(page: str) -> str | None:
    """The href of a page's ``a#next-page`` (HTML entities undone), or None when it has none."""
    anchor = _NEXT_PAGE.search(page)
    href = _HREF.search(anchor.group(0)) if anchor else None
    return html.unescape(href.group(1)) if href else None


def row_ids(page: str) -> list[str]:
    """The delay ids of a page's rows (``tr[data-id]``), in order."""
    return _ROW_ID.findall(page)


def deep_cursor(shards: int, due_ms: int) -> str:
    """The console's upcoming cursor (cluster.encode_cursor) of a page starting at the first message due at
    ``due_ms`` on every shard: a page as deep in the list as that time is."""
    return encode_cursor({shard: f"{due_ms}:{NIL_ID}" for shard in range(shards)})


@dataclass(frozen=True)
class Answer:
    status: int
    ms: float
    body: bytes


def timed_get(url: str) -> Answer:
    """GET ``url`` on a connection of its own, timed from before connecting until the body's last byte is read;
    status 0 (the error as the body) when nothing answered in :data:`REQUEST_TIMEOUT_S`."""
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(url, timeout=REQUEST_TIMEOUT_S) as response:
            status, body = response.status, response.read()
    except urllib.error.HTTPError as err:
        status, body = err.code, err.read()
    except OSError as err:  # refused, reset, timed out: urllib's errors are OSErrors
        status, body = 0, str(err).encode()
    return Answer(status, (time.perf_counter() - started) * 1000, body)


@dataclass(frozen=True)
class PageAsk:
    """One page to time: ``key`` in results.json, what it is, the URL, a text its body must hold (its table's id)."""

    key: str
    label: str
    url: str
    mark: str


@dataclass
class PageTiming:
    """What the timed rounds of one page measured."""

    ask: PageAsk
    first_ms: float = 0.0  # the first warm-up: a cold page (the delivered message's search of Kafka, ...)
    times_ms: list[float] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    bytes: int = 0
    rows: int = 0
    marked: bool = True  # every answer held the page's mark

    @property
    def p95_ms(self) -> float:
        return percentile(self.times_ms, 0.95)

    @property
    def passed(self) -> bool:
        return self.statuses == {200: len(self.times_ms)} and self.marked and self.p95_ms < TARGET_MS


def time_pages(asks: Sequence[PageAsk], warmups: int = WARMUP_ROUNDS, rounds: int = TIMED_ROUNDS,
               get: Callable[[str], Answer] = timed_get) -> list[PageTiming]:
    """Each page asked ``warmups`` then ``rounds`` times, round-robin over the pages; the timed rounds kept."""
    timings = [PageTiming(ask) for ask in asks]
    for round_number in range(warmups + rounds):
        for timing in timings:
            answer = get(timing.ask.url)
            text = answer.body.decode("utf-8", "replace")
            timing.marked = timing.marked and timing.ask.mark in text
            if round_number == 0:
                timing.first_ms = answer.ms
            if round_number < warmups:
                continue
            timing.times_ms.append(answer.ms)
            timing.statuses[answer.status] = timing.statuses.get(answer.status, 0) + 1
            timing.bytes = len(answer.body)
            timing.rows = sum(text.count(row) for row in _ROWS)
    return timings


# -- the console's process ---------------------------------------------------------------------------------------


class ConsoleProcess:
    """``delayq console`` as users run it, in a process of its own on a free port, with its index in ``folder``."""

    def __init__(self, settings: Settings, folder: Path):
        self.settings = settings
        self.folder = folder
        self.port = free_server_port()
        self.process: subprocess.Popen | None = None
        self.started = 0.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/console"

    @property
    def pid(self) -> int:
        if self.process is None:
            raise RuntimeError("the console was never started: call start() first")
        return self.process.pid

    def start(self) -> ConsoleProcess:
        self.folder.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **settings_env(self.settings), "DELAYQ_CONSOLE_ACTIONS": "false",
               "DELAYQ_NODE_ID": "bench-console"}
        self.log = open(self.folder / "console.log", "ab")  # noqa: SIM115 - the child's, closed by stop()
        self.started = time.monotonic()
        self.process = subprocess.Popen([sys.executable, "-m", "delayq", "console", "--port", str(self.port),
                                         "--data-dir", str(self.folder / "index")], env=env, cwd=self.folder,
                                        stdout=self.log, stderr=subprocess.STDOUT)
        return self

    def wait_index(self, timeout_s: float, interval_s: float = 1.0) -> float:
        """Seconds from the process's start until its ``/console/healthz`` says its index caught up with both topics.

        Raises:
            RuntimeError: the process ended, or the index did not catch up within ``timeout_s``.
            ValueError: healthz answered what this bench cannot read.
        """
        assert self.process is not None
        deadline = time.monotonic() + timeout_s
        lag: int | None = None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"delayq console exited with {self.process.returncode}: "
                                   f"{(self.folder / 'console.log').read_text()[-2000:]}")
            answer = timed_get(f"{self.url}/healthz")  # status 0 while it does not listen yet
            lag = index_lag_in(answer.body.decode("utf-8", "replace")) if answer.status == 200 else None
            if lag == 0:
                return time.monotonic() - self.started
            time.sleep(interval_s)
        raise RuntimeError(f"the console's index did not catch up within {timeout_s:.0f} s (last said: "
                           f"{'starting' if lag is None else f'{lag:,} records behind'})")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        if self.process is not None:
            self.log.close()


def topics_records(settings: Settings, topics: Sequence[str]) -> int:
    """The end offsets of every partition of ``topics``, summed: records (and transaction markers) written."""
    consumer = Consumer(settings.kafka_conf(**{"group.id": f"bench-{uuid.uuid4()}", "enable.auto.commit": False}))
    try:
        total = 0
        for topic in topics:
            for partition in consumer.list_topics(topic, timeout=10).topics[topic].partitions:
                total += consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)[1]
        return total
    finally:
        consumer.close()


def wait_histogram(node: NodeProcess, shard: int, timeout_s: float) -> float:
    """Seconds until the node answers ``/v1/shards/<shard>/pending`` with 200 (its store's first count done).

    Raises:
        TimeoutError: it still answered otherwise after ``timeout_s``.
    """
    started = time.monotonic()
    while (answer := timed_get(f"{node.url}/v1/shards/{shard}/pending")).status != 200:
        if time.monotonic() - started > timeout_s:
            raise TimeoutError(f"the node's pending histogram answered {answer.status} for {timeout_s:.0f} s: "
                               f"{answer.body[:200]!r}")
        time.sleep(0.5)
    return time.monotonic() - started


# -- the pages ---------------------------------------------------------------------------------------------------


def console_asks(base: str, key: str, who: str, *, deep_cursor_text: str, rare_topic: str, pending_id: str,
                 delivered_id: str, deep_letters_url: str, rare_code: str) -> list[PageAsk]:
    """The console's pages at ``base`` (…/console), keys ``console.<key>.<page>``."""
    quote = urllib.parse.quote
    return [PageAsk(f"console.{key}.{page}", f"{who}: {label}", url, mark) for page, label, url, mark in (
        ("overview", "overview (shards, pending chart, delivery figures)", f"{base}/", 'id="pending-table"'),
        ("upcoming", "upcoming, first page", f"{base}/upcoming", 'id="upcoming"'),
        ("upcoming_deep", "upcoming, a page at the middle of the week (its cursor)",
         f"{base}/upcoming?after={quote(deep_cursor_text)}", 'id="upcoming"'),
        ("upcoming_rare_topic", f"upcoming, topic filter for a rare topic (1 in {RARE_EVERY:,})",
         f"{base}/upcoming?topic={quote(rare_topic)}", 'id="upcoming"'),
        ("message_pending", "a pending message", f"{base}/messages/{pending_id}", 'id="history"'),
        ("message_delivered", "a delivered message (its delivery read back from the target)",
         f"{base}/messages/{delivered_id}", 'id="history"'),
        ("dead_letters", "dead letters, first page", f"{base}/dead-letters", 'id="dead-letters"'),
        ("dead_letters_deep", "dead letters, a page at the middle (followed from the first)", deep_letters_url,
         'id="dead-letters"'),
        ("dead_letters_code", f"dead letters of a rare code ({rare_code}, 1 in {RARE_CODE_EVERY})",
         f"{base}/dead-letters?code={quote(rare_code)}", 'id="dead-letters"'),
        ("series", "series, first page", f"{base}/series", 'id="series"'),
    )]


def node_asks(node_url: str, shard: int, *, deep_due_ms: int, rare_topic: str) -> list[PageAsk]:
    """The node's console endpoints of ``shard`` alone (what the console's pages ask it), keys ``console.node.*``."""
    base = f"{node_url}/v1/shards/{shard}"
    upcoming = f"{base}/upcoming?limit=50"
    return [PageAsk(f"console.node.{page}", f"node: {label}", url, mark) for page, label, url, mark in (
        ("pending", f"GET /v1/shards/{shard}/pending (the histogram)", f"{base}/pending", '"minutes"'),
        ("upcoming", f"GET /v1/shards/{shard}/upcoming, first 50", upcoming, '"items"'),
        ("upcoming_deep", f"GET /v1/shards/{shard}/upcoming, 50 from the middle of the week",
         f"{upcoming}&after={deep_due_ms}:{NIL_ID}", '"items"'),
        ("upcoming_rare_topic", f"GET /v1/shards/{shard}/upcoming, topic filter for a rare topic",
         f"{upcoming}&topic={urllib.parse.quote(rare_topic)}", '"items"'),
    )]


@dataclass(frozen=True)
class Walk:
    """The dead-letter pages followed from the first to the middle: where it ended and how long each took."""

    url: str
    pages: int
    times_ms: list[float]

    def summary(self) -> dict:
        """What results.json keeps of it: the page reached, how many were followed, their median, p95 and max."""
        return {"url": self.url, "pages": self.pages, "median_ms": round(statistics.median(self.times_ms), 2),
                "p95_ms": round(percentile(self.times_ms, 0.95), 2), "max_ms": round(max(self.times_ms), 2)}


def walk_pages(first_url: str, pages: int) -> Walk:
    """Follow ``a#next-page`` from ``first_url`` ``pages`` times (fewer if the list ends): the page reached.

    Raises:
        RuntimeError: a page answered other than 200.
    """
    url, times, followed = first_url, [], 0
    origin = "{0.scheme}://{0.netloc}".format(urllib.parse.urlsplit(first_url))
    while followed < pages:
        answer = timed_get(url)
        if answer.status != 200:
            raise RuntimeError(f"{url} answered {answer.status}: {answer.body[:300]!r}")
        times.append(answer.ms)
        href = next_page_href(answer.body.decode("utf-8", "replace"))
        if href is None:
            break
        url = urllib.parse.urljoin(origin, href)
        followed += 1
    return Walk(url, followed, times)


# -- one run -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Filled:
    """The node once filled: where the due times start, the ids delivered, and how long each part took."""

    start_ms: int
    delivered_ids: list[str]
    fill_s: float
    dead_letter_s: float
    histogram_s: float  # until the node's first count of its store by due time answered


def fill_node(settings: Settings, node: NodeProcess, targets: Mapping[str, str], plan: Sequence[TopicFill],
              dead_letters: int, progress: Progress, say: Callable[[str], None]) -> Filled:
    """The pending messages of ``plan``, the series and the messages due at once stored by ``node``, then the
    planted dead letters copied by it to the dead-letter topic."""
    started, start_ms = time.monotonic(), now_ms()
    for fill in plan:
        fill_buffer(settings, targets[fill.name], fill.count, spread_due(start_ms, fill.count), progress)
    delivered_ids = put_series_and_soon(settings, targets["orders"], start_ms)
    puts = sum(fill.count for fill in plan) + SERIES + DELIVERED
    wait_for(progress, "storing", puts, lambda: node_metric(node, "delayq_ingested_total", op="put"),
             600 + puts / 1000, interval_s=1.0)
    fill_s = time.monotonic() - started
    say(f"console bench: {puts:,} puts stored in {fill_s:.0f} s")
    planted = time.monotonic()
    plant_dead_letters(settings, dead_letters, progress)
    wait_for(progress, "dead-lettering", dead_letters, lambda: node_metric(node, "delayq_dead_lettered_total"),
             600 + dead_letters / 200, interval_s=1.0)
    dead_letter_s = time.monotonic() - planted
    say(f"console bench: {dead_letters:,} malformed records planted and dead-lettered in {dead_letter_s:.0f} s")
    wait_for(progress, "delivering the messages due at once", DELIVERED,
             lambda: node_metric(node, "delayq_delivered_total"), 120, interval_s=0.5)
    return Filled(start_ms, delivered_ids, fill_s, dead_letter_s, wait_histogram(node, 0, 600))


def server_asks(settings: Settings, key: str, who: str, base: str, filled: Filled, rare_topic: str,
                dead_letters: int) -> tuple[list[PageAsk], Walk]:
    """The pages of one console (at ``base``) to time, found by reading it: a pending id from the deep upcoming
    page, the middle dead-letter page by following next links from the first.

    Raises:
        RuntimeError: the deep upcoming page answered other than 200, or without rows.
    """
    cursor = deep_cursor(settings.shards, filled.start_ms + SPAN_MS // 2)
    deep = timed_get(f"{base}/upcoming?after={urllib.parse.quote(cursor)}")
    ids = row_ids(deep.body.decode("utf-8", "replace"))
    if deep.status != 200 or not ids:
        raise RuntimeError(f"{who}: the deep upcoming page answered {deep.status} with {len(ids)} rows")
    walk = walk_pages(f"{base}/dead-letters", dead_letters // 2 // 50)
    return console_asks(base, key, who, deep_cursor_text=cursor, rare_topic=rare_topic, pending_id=ids[0],
                        delivered_id=filled.delivered_ids[0], deep_letters_url=walk.url,
                        rare_code=wire.Reason.BAD_FRAME.value), walk


@dataclass(frozen=True)
class Timed:
    """The timed rounds of every page, how long they took, the load and the CPU of the processes meanwhile."""

    timings: list[PageTiming]
    seconds: float
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float]
    cpu_s: dict[str, float]


def time_with_load(asks: Sequence[PageAsk], pids: Mapping[str, list[int]], progress: Progress) -> Timed:
    """:func:`time_pages`, with the load average before and after and the CPU seconds of ``pids`` meanwhile."""
    load_before, cpu_before = os.getloadavg(), {who: cpu_seconds(p) for who, p in pids.items()}
    task = progress.add_task(f"timing {len(asks)} pages", total=None)
    started = time.monotonic()
    timings = time_pages(asks)
    seconds = time.monotonic() - started
    progress.remove_task(task)
    return Timed(timings, seconds, load_before, os.getloadavg(),
                 {who: round(cpu_seconds(p) - cpu_before[who], 2) for who, p in pids.items()})


def measured_run(stack: DevStack, pending: int, dead_letters: int, progress: Progress, *,
                 node_console: bool = False, say: Callable[[str], None] = print) -> dict:
    """Fill one node, plant the dead letters, start the console, time its pages (see the module docstring).

    Returns results.json's part of the run: sizes, the index build, the load, each page's timings.
    """
    plan = fill_plan(pending)
    with bench_cluster(stack, zk_session_timeout_ms=15000) as settings, \
            tempfile.TemporaryDirectory(prefix="delayq-bench-console-") as tmp:
        cluster = LocalCluster(settings, Path(tmp), console=node_console)
        console = ConsoleProcess(settings, Path(tmp) / "console")
        targets = {fill.name: f"{settings.cluster}-{fill.name}" for fill in plan}
        for topic in targets.values():
            create_target(settings, topic)
        try:
            node = cluster.start("console-bench")
            cluster.master()
            filled = fill_node(settings, node, targets, plan, dead_letters, progress, say)
            console.start()
            say(f"console bench: delayq console pid {console.pid} at {console.url}/, node pid {node.running.pid} at "
                f"{node.url}")
            task = progress.add_task("the console's index reading the buffer and the dead letters", total=None)
            index_s = console.wait_index(1200 + (pending + dead_letters) / 2000)
            progress.remove_task(task)
            records = topics_records(settings, [settings.buffer_topic, settings.dead_letter_topic])
            say(f"console bench: the index read {records:,} records in {index_s:.0f} s "
                f"({records / index_s:,.0f} records/s)")
            servers = [("standalone", "`delayq console`", console.url)]
            if node_console:
                servers.append(("node_console", "node's /console", node.console_url.rstrip("/")))
            asks: list[PageAsk] = []
            walks: dict[str, dict] = {}
            for key, who, base in servers:
                found, walk = server_asks(settings, key, who, base, filled, targets[RARE_TOPIC], dead_letters)
                asks += found
                walks[key] = walk.summary()
            asks += node_asks(node.url, 0, deep_due_ms=filled.start_ms + SPAN_MS // 2, rare_topic=targets[RARE_TOPIC])
            say(f"console bench: timing {len(asks)} pages (console pid {console.pid}, node pid {node.running.pid})")
            timed = time_with_load(asks, {"console": [console.pid], "node": [node.running.pid, *node.readers()]},
                                   progress)
            node_pending = node_metric(node, "delayq_pending")
            hold_s = float(os.environ.get(HOLD_ENV) or 0)
            if hold_s > 0:
                say(f"console bench: holding for {hold_s:.0f} s ({HOLD_ENV}): console pid {console.pid} at "
                    f"{console.url}/, node pid {node.running.pid} at {node.url}; "
                    + " ".join(f"{ask.key}={ask.url}" for ask in asks))
                time.sleep(hold_s)
        finally:
            console.stop()
            cluster.close()
    return {
        "pending_planned": pending, "pending": node_pending, "dead_letters": dead_letters, "series": SERIES,
        "topics": {fill.name: fill.count for fill in plan}, "fill_s": round(filled.fill_s, 1),
        "dead_letter_s": round(filled.dead_letter_s, 1), "histogram_first_count_s": round(filled.histogram_s, 1),
        "timing_s": round(timed.seconds, 1), "cpu_s_while_timed": timed.cpu_s,
        "index": {"records": records, "seconds": round(index_s, 1), "records_per_s": round(records / index_s)},
        "load_average": {"before": [round(x, 2) for x in timed.load_before],
                         "after": [round(x, 2) for x in timed.load_after]},
        "node_console": node_console, "dead_letter_walks": walks,
        "pages": [{**asdict(t.ask), "times_ms": [round(x, 2) for x in t.times_ms], "first_ms": round(t.first_ms, 2),
                   "statuses": t.statuses, "bytes": t.bytes, "rows": t.rows, "marked": t.marked,
                   "p95_ms": round(t.p95_ms, 2), "passed": t.passed} for t in timed.timings],
    }


def figures(result: dict) -> list:
    """The suite's figures: one per page (its timed requests as the values: median, min-max; p95, max and the
    verdict in details, which the console table reads), and the index build's records a second."""
    from .report import Figure

    sizes = f"{result['pending_planned']:,} pending, {result['dead_letters']:,} dead letters"
    common = {"pending": result["pending"], "pending_planned": result["pending_planned"],
              "dead_letters": result["dead_letters"], "load_average": result["load_average"],
              "target_ms": TARGET_MS}
    made = [Figure(page["key"], f"console, {page['label']} ({sizes})", "ms", "lower", page["times_ms"],
                   details={**common, "page": page["label"],
                            **{k: page[k] for k in ("url", "p95_ms", "first_ms", "statuses", "bytes", "rows", "marked",
                                                    "passed")},
                            "max_ms": max(page["times_ms"]), "requests": len(page["times_ms"]),
                            "warmups": WARMUP_ROUNDS})
            for page in result["pages"]]
    index = result["index"]
    made.append(Figure("console.index_build", f"console, its index built from empty ({index['records']:,} buffer "
                       f"and dead-letter records; {sizes}), `delayq console` start to caught up", "records/s",
                       "higher", [index["records_per_s"]],
                       details={**common, "records": index["records"], "seconds": index["seconds"],
                                **{k: result[k] for k in ("machine", "topics", "series", "fill_s", "dead_letter_s",
                                                          "histogram_first_count_s", "timing_s", "cpu_s_while_timed",
                                                          "node_console", "dead_letter_walks")}}))
    return made
