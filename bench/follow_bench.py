"""Benchmark of ``delayq reconcile --follow`` (issue 33): does the streaming job keep up with live traffic?

A generator writes healthy delayq traffic straight to Kafka in real time, as the proxy and
a master would (the envelope of :mod:`delayq.wire`, like :class:`delayq.spark.synthetic.TrafficWriter`):
``rate`` messages a second, each put now with a due time ``lead`` ahead, then delivered (to one of
four target topics) and closed by its ``done`` when due, naming its put's offset. The job sees about
3 x rate records a second (puts, deliveries, dones), every one stamped with the time it was written.

``delayq reconcile --follow`` runs meanwhile as users run it, a process of its own (local Spark,
fresh checkpoint, fresh topics); its metrics are scraped every second. The figures, over the steady
part (after the warm-up): the lag the job reports (``delayq_reconcile_lag_seconds``) p50/p95/max, its
slope (s per minute: bounded, it keeps up; growing, it falls behind), the records it judged a second,
its CPU (its Python process and every process under it: the JVM and its Python workers) per record,
and the findings, which must stay 0 for healthy traffic. The generator's own achieved rate is
measured too: on a 2-core machine writing 3 x 20,000 records a second from Python may be the bound.

Usage::

    .venv/bin/python -m delayq.bench.follow_bench --bootstrap 127.0.0.1:9092              # 20,000 msg/s, 3 min
    .venv/bin/python -m delayq.bench.follow_bench --bootstrap 127.0.0.1:9092 --rate 2000 --seconds 60 --trigger 5
    .venv/bin/python -m delayq.bench.follow_bench --bootstrap 127.0.0.1:9092 --generate-only --seconds 20

``delayq bench --only follow`` runs the same (bench/runner.py's suite_follow; ``BENCH_FOLLOW_RATE``,
``BENCH_FOLLOW_SECONDS`` and ``BENCH_FOLLOW_TRIGGERS`` pick the rate, the measured seconds and the triggers).
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from delayq import wire
from delayq.bench.proc import busy_cores_between, machine_ticks

DEFAULT_RATE = 20_000
DEFAULT_SECONDS = 180  # measured, after the warm-up
DEFAULT_WARMUP_S = 60
DEFAULT_TRIGGERS = (10.0, 5.0)
TARGETS = 4
LEAD_MS = 3_000  # each message is due this long after its put
# The job's rules for the run: a grace and a retention short enough that every part of an id's life in the
# job (its put, its delivery and done, its check at due + grace, its forgetting) happens within the run.
GRACE = "30s"
RETAIN = "1m"
BUFFER_PARTITIONS = 4
TARGET_PARTITIONS = 2
PAYLOAD = b"x" * 100
# Keeps up: the lag's least-squares slope over the steady part stays at or under this many seconds a minute
# (a bounded lag swings with each micro-batch but does not climb).
KEEPS_UP_SLOPE_S_PER_MIN = 1.0
TICK_S = 0.005
# The puts written in one step of the generator's loop at most: deliveries due meanwhile are not starved.
MAX_PUTS_PER_STEP = 2_000
PRODUCER_CONF = {"linger.ms": 20, "batch.size": 1_000_000, "compression.type": "lz4",
                 "queue.buffering.max.messages": 2_000_000, "queue.buffering.max.kbytes": 1_048_576}
RATE_ENV, SECONDS_ENV, TRIGGERS_ENV = "BENCH_FOLLOW_RATE", "BENCH_FOLLOW_SECONDS", "BENCH_FOLLOW_TRIGGERS"
_BATCH_LINE = re.compile(r"batch (\d+): read (.*?); judged ([\d,]+) ids; lag (\S+)")


# -- pure logic: pacing, percentiles, the verdict -------------------------------------------------------------


@dataclass
class Pacer:
    """How many messages are owed at a moment: ``rate`` a second since the start, less those already sent.

    Args:
        rate: messages per second.
        seconds: how long; nothing is owed past it.
    """

    rate: float
    seconds: float
    sent: int = 0

    def __post_init__(self) -> None:
        if not self.rate > 0 or not self.seconds > 0:
            raise ValueError(f"rate ({self.rate}) and seconds ({self.seconds}) must be above 0")

    @property
    def total(self) -> int:
        return int(self.rate * self.seconds)

    def owed(self, elapsed_s: float) -> int:
        """Messages to send now, ``elapsed_s`` after the start, to be on pace (0 when ahead or done)."""
        due = min(self.total, int(max(0.0, elapsed_s) * self.rate))
        return max(0, due - self.sent)

    def done(self) -> bool:
        return self.sent >= self.total


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q`` percentile (0-100) of ``values``, linear between the nearest ranks; None when empty."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} must be within 0-100")
    ordered = sorted(values)
    if not ordered:
        return None
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def slope_per_minute(points: Sequence[tuple[float, float]]) -> float | None:
    """The least-squares slope of ``(seconds, value)`` points, per minute; None with fewer than 2 times."""
    if len({t for t, _ in points}) < 2:
        return None
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    num = sum((t - mean_t) * (v - mean_v) for t, v in points)
    den = sum((t - mean_t) ** 2 for t, _ in points)
    return num / den * 60


def lag_verdict(points: Sequence[tuple[float, float]], *, max_slope: float = KEEPS_UP_SLOPE_S_PER_MIN) -> dict:
    """The steady part's lag samples ``(seconds, lag)``: p50/p95/max, the slope, and whether the job keeps up.

    It keeps up when the lag is bounded: its slope at most ``max_slope`` seconds a minute. No samples
    (no micro-batch finished in the steady part): it does not.
    """
    lags = [lag for _, lag in points]
    slope = slope_per_minute(points)
    keeps_up = bool(lags) and slope is not None and slope <= max_slope
    return {"samples": len(lags), "p50_s": _round(percentile(lags, 50)), "p95_s": _round(percentile(lags, 95)),
            "max_s": _round(max(lags, default=None)), "slope_s_per_min": _round(slope), "keeps_up": keeps_up}


def _round(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


def steady(points: Iterable[tuple[float, float]], since: float, until: float) -> list[tuple[float, float]]:
    """The points with a time in ``[since, until]``."""
    return [(t, v) for t, v in points if since <= t <= until]


def rate_between(samples: Sequence[tuple[float, float]], since: float, until: float) -> float | None:
    """Per second growth of a counter sampled as ``(seconds, total)``, from its first to its last sample in the
    window; None with fewer than two samples there."""
    inside = steady(samples, since, until)
    if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
        return None
    return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])


def parse_batch_line(line: str) -> dict | None:
    """One of the follower's ``batch N: read ...; judged N ids; lag X s`` lines; None for any other line."""
    match = _BATCH_LINE.search(line)
    if match is None:
        return None
    read: dict[str, int] = {}
    for part in match.group(2).split(", "):
        count, _, side = part.partition(" ")
        if side and count.replace(",", "").isdigit():
            read[side] = int(count.replace(",", ""))
    lag = match.group(4)
    return {"batch": int(match.group(1)), "read": read, "ids": int(match.group(3).replace(",", "")),
            "lag_s": None if lag == "-" else float(lag), "found": "; found" in line}


def batch_durations(finished: Sequence[float]) -> list[float]:
    """Seconds between consecutive micro-batch ends: a batch's time when batches run back to back."""
    return [round(b - a, 2) for a, b in itertools.pairwise(finished)]


def parse_triggers(text: str) -> tuple[float, ...]:
    """``10,5`` as (10.0, 5.0).

    Raises:
        ValueError: empty, not numbers, or one outside 0.1-3600 s.
    """
    values = tuple(float(part) for part in text.split(",") if part.strip())
    if not values or any(not 0.1 <= v <= 3600 for v in values):
        raise ValueError(f"triggers {text!r}: give seconds between 0.1 and 3600, comma-separated")
    return values


# -- the traffic ----------------------------------------------------------------------------------------------


class _Put:
    """One message between its put and its delivery: its delivery and done need the put's offset."""

    __slots__ = ("delay_id", "due_ms", "offset", "topic")

    def __init__(self, delay_id: bytes, topic: str, due_ms: int):
        self.delay_id, self.topic, self.due_ms, self.offset = delay_id, topic, due_ms, -1

    def acked(self, err, message) -> None:
        self.offset = -2 if err is not None else message.offset()


@dataclass
class TrafficStats:
    """What the generator did: records written and acknowledged, the rates it reached, how late it delivered."""

    rate: float
    seconds: float
    puts: int = 0
    deliveries: int = 0
    dones: int = 0
    refused: int = 0
    unsent: int = 0
    elapsed_s: float = 0.0
    cpu_s: float = 0.0
    # How far behind the due time each delivery was written: the generator's own lateness.
    late_ms: list[int] = field(default_factory=list)
    # (seconds since the start, puts so far, deliveries so far) every second.
    progress: list[tuple[float, int, int]] = field(default_factory=list)

    @property
    def records(self) -> int:
        return self.puts + self.deliveries + self.dones

    def to_json(self) -> dict:
        late = self.late_ms or [0]
        written_s = max(self.elapsed_s, 1e-9)
        return {"rate_asked": self.rate, "seconds": self.seconds, "puts": self.puts, "deliveries": self.deliveries,
                "dones": self.dones, "records": self.records, "refused": self.refused, "unsent": self.unsent,
                "acknowledged": self.records - self.refused - self.unsent, "elapsed_s": round(self.elapsed_s, 2),
                "put_rate": round(self.puts / written_s, 1), "delivery_rate": round(self.deliveries / written_s, 1),
                "records_per_s": round(self.records / written_s, 1), "cpu_s": round(self.cpu_s, 2),
                "cpu_us_per_message": round(self.cpu_s * 1e6 / max(self.puts, 1), 1),
                "delivery_late_ms": {"p50": percentile(late, 50), "p99": percentile(late, 99), "max": max(late)}}


def generate(bootstrap: str, buffer_topic: str, targets: Sequence[str], rate: float, seconds: float, *,
             lead_ms: int = LEAD_MS, stop: threading.Event | None = None,
             on_second: Callable[[TrafficStats], None] | None = None) -> TrafficStats:
    """Write ``rate`` healthy messages a second for ``seconds``, in real time; return what was written.

    Each message: a put now (timestamp now, due ``lead_ms`` later) on ``buffer_topic``; when due,
    its delivery on one of ``targets`` and its done on the buffer, both naming the put's offset
    (which the put producer's acknowledgement gives). Messages put are all delivered before it returns.
    """
    from confluent_kafka import Producer

    stop = stop or threading.Event()
    stats = TrafficStats(rate, seconds)

    def refused(err, _message) -> None:
        if err is not None:
            stats.refused += 1

    put_producer = Producer({"bootstrap.servers": bootstrap, **PRODUCER_CONF, "acks": "all"})
    out_producer = Producer({"bootstrap.servers": bootstrap, **PRODUCER_CONF, "acks": "all",
                             "delivery.report.only.error": True, "on_delivery": refused})
    pacer = Pacer(rate, seconds)
    pending: collections.deque[_Put] = collections.deque()
    topics = [(t, t) for t in targets]
    frames = {t: f" {wire.check_topic(t)} -\n".encode() for t in targets}
    done_op, id_h, version_h, cutoff_h = wire.OP_DONE, wire.ID, wire.VERSION, wire.CUTOFF
    deliver_at_h, epoch_h = wire.DELIVER_AT, wire.EPOCH
    epoch = b"1"
    cpu_before = time.process_time()
    start = time.monotonic()
    wall_start_ms = time.time_ns() // 1_000_000
    next_report = 1.0
    n_topics = len(topics)
    try:
        while True:
            elapsed = time.monotonic() - start
            now_ms = wall_start_ms + int(elapsed * 1000)
            owed = 0 if stop.is_set() else min(pacer.owed(elapsed), MAX_PUTS_PER_STEP)
            if owed:
                due_ms = now_ms + lead_ms
                due = str(due_ms).encode()
                for i in range(owed):
                    topic = topics[(pacer.sent + i) % n_topics][0]
                    delay_id = wire.new_delay_id(now_ms)
                    put = _Put(delay_id.encode(), topic, due_ms)
                    value = b"put " + due + frames[topic] + PAYLOAD
                    while True:
                        try:
                            put_producer.produce(buffer_topic, value, put.delay_id, timestamp=now_ms,
                                                 on_delivery=put.acked)
                            break
                        except BufferError:
                            put_producer.poll(0.01)
                    pending.append(put)
                pacer.sent += owed
                stats.puts += owed
            put_producer.poll(0)
            # Deliveries and dones of every message due, in due order; one whose put is not acknowledged yet
            # waits (and is late).
            while pending and pending[0].due_ms <= now_ms and pending[0].offset != -1:
                put = pending.popleft()
                if put.offset < 0:  # the put was refused: nothing to deliver
                    continue
                version = str(put.offset).encode()
                cutoff = str(put.offset + 1).encode()
                at_ms = max(now_ms, put.due_ms)
                stats.late_ms.append(at_ms - put.due_ms)
                while True:
                    try:
                        out_producer.produce(put.topic, PAYLOAD, None, timestamp=at_ms, headers=[
                            (id_h, put.delay_id), (deliver_at_h, str(put.due_ms).encode()), (epoch_h, epoch),
                            (version_h, version)])
                        out_producer.produce(buffer_topic, None, put.delay_id, timestamp=at_ms, headers=[
                            (wire.OP, done_op), (id_h, put.delay_id), (version_h, version), (cutoff_h, cutoff)])
                        break
                    except BufferError:
                        out_producer.poll(0.01)
                stats.deliveries += 1
                stats.dones += 1
            out_producer.poll(0)
            if elapsed >= next_report:
                stats.progress.append((round(elapsed, 2), stats.puts, stats.deliveries))
                if on_second is not None:
                    on_second(stats)
                next_report += 1.0
            if (pacer.done() or stop.is_set()) and not pending:
                break
            if not owed or owed < MAX_PUTS_PER_STEP:
                time.sleep(TICK_S)
        stats.elapsed_s = time.monotonic() - start
    finally:
        stats.unsent = put_producer.flush(60) + out_producer.flush(60)
        stats.cpu_s = time.process_time() - cpu_before
    return stats


# -- the follower ---------------------------------------------------------------------------------------------


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds (user + system) of ``root`` and every live process under it, with their reaped children's."""
    tick = os.sysconf("SC_CLK_TCK")
    stats: dict[int, tuple[int, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # ppid is field 4; utime, stime, cutime, cstime are fields 14-17 (1-based) of /proc/<pid>/stat.
        stats[int(entry.name)] = (int(fields[1]), sum(int(f) for f in fields[11:15]) / tick)
    return sum(stats[pid][1] for pid in descendants(root, {pid: ppid for pid, (ppid, _) in stats.items()}))


def descendants(root: int, parents: Mapping[int, int]) -> set[int]:
    """``root`` and every pid whose chain of parents leads to it (``parents``: pid to ppid)."""
    found = {root} if root in parents else set()
    grew = True
    while grew:
        grew = False
        for pid, ppid in parents.items():
            if ppid in found and pid not in found:
                found.add(pid)
                grew = True
    return found


def scrape(port: int) -> dict[str, float]:
    """The follower's ``delayq_reconcile_*`` samples, by name and labels (``records_total{source=buffer}``)."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as answer:
        text = answer.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.startswith("delayq_reconcile_"):
                continue
            name = sample.name.removeprefix("delayq_reconcile_")
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            out[f"{name}{{{labels}}}" if labels else name] = sample.value
    return out


def findings_total(sample: Mapping[str, float]) -> float:
    return sum(v for k, v in sample.items() if k.startswith("findings_total{"))


def records_total(sample: Mapping[str, float]) -> float:
    return sum(v for k, v in sample.items() if k.startswith("records_total{"))


@dataclass
class FollowerRun:
    """``delayq reconcile --follow`` in a process of its own, its output lines kept with the time they came."""

    env: dict[str, str]
    args: list[str]
    log: Path
    process: subprocess.Popen | None = None
    lines: list[tuple[float, str]] = field(default_factory=list)

    def start(self) -> FollowerRun:
        self.process = subprocess.Popen([sys.executable, "-m", "delayq", "reconcile", "--follow", *self.args],
                                        env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True, errors="replace")
        threading.Thread(target=self._read, daemon=True, name="follower-output").start()
        return self

    def _read(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        with open(self.log, "a") as out:
            for line in self.process.stdout:
                self.lines.append((time.time(), line.rstrip("\n")))
                out.write(f"{time.strftime('%H:%M:%S')} {line}")
                out.flush()

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def tail(self, n: int = 30) -> str:
        return "\n".join(line for _, line in self.lines[-n:])

    def stop(self) -> int | None:
        if self.process is None:
            return None
        if self.alive():
            self.process.terminate()
            try:
                return self.process.wait(90)
            except subprocess.TimeoutExpired:
                self.process.kill()
        return self.process.wait(30)


def create_topics(bootstrap: str, prefix: str) -> tuple[str, list[str], str]:
    """Fresh buffer, target and dead-letter topics: (buffer, targets, dead letters)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    buffer, dead = f"{prefix}-buffer", f"{prefix}-dead-letter"
    targets = [f"{prefix}-target-{i}" for i in range(TARGETS)]
    wanted = [NewTopic(buffer, BUFFER_PARTITIONS, 1), NewTopic(dead, 1, 1),
              *(NewTopic(t, TARGET_PARTITIONS, 1) for t in targets)]
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept: its futures fail once it is collected
    for future in admin.create_topics(wanted).values():
        future.result(30)
    return buffer, targets, dead


def findings_on(bootstrap: str, topic: str, limit: int = 50) -> list[str]:
    """Keys of the findings topic's committed records (kind:id:version), up to ``limit``."""
    from confluent_kafka import Consumer, KafkaError

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"followbench-{uuid.uuid4().hex[:8]}",
                         "auto.offset.reset": "earliest", "isolation.level": "read_committed",
                         "enable.partition.eof": True})
    keys: list[str] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and len(keys) < limit:
            record = consumer.poll(0.5)
            if record is None:
                continue
            if record.error() is not None:
                if record.error().code() == KafkaError._PARTITION_EOF:
                    break
                continue
            keys.append((record.key() or b"").decode())
    finally:
        consumer.close()
    return keys


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def measured_run(bootstrap: str, rate: float, seconds: float, trigger_s: float, *, warmup_s: float = DEFAULT_WARMUP_S,
                 workdir: Path | None = None, say: Callable[[str], None] = print,
                 master: str = "local[2]", drain_s: float = 60.0) -> dict:
    """One run: fresh topics and checkpoint, the follower started and through its first micro-batch, then
    ``warmup_s + seconds`` of live traffic at ``rate``, scraped every second; then until it judged everything
    written (or ``drain_s``). Returns the figures (see the module docstring) and the raw samples."""
    prefix = f"followbench-{uuid.uuid4().hex[:8]}"
    buffer, targets, dead = create_topics(bootstrap, prefix)
    folder = Path(workdir or tempfile.mkdtemp(prefix="delayq-follow-bench-"))
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = {**os.environ, "DELAYQ_BOOTSTRAP_SERVERS": bootstrap, "DELAYQ_BUFFER_TOPIC": buffer,
           "DELAYQ_DEAD_LETTER_TOPIC": dead, "DELAYQ_HTTP_HOST": "127.0.0.1", "COLUMNS": "400"}
    findings_topic = f"{prefix}-findings"
    args = ["--checkpoint", str(folder / "checkpoint"), "--findings-topic", findings_topic, "--metrics-port",
            str(port), "--trigger", f"{trigger_s:g}", "--grace", GRACE, "--retain", RETAIN, "--topics",
            ",".join(targets), "--master", master]
    follower = FollowerRun(env, args, folder / "follow.log").start()
    samples: list[tuple[float, dict[str, float], float]] = []  # (time, metrics, follower tree CPU s)
    stop_scraping = threading.Event()

    def scraper() -> None:
        assert follower.process is not None
        while not stop_scraping.is_set():
            at = time.time()
            try:
                sample = scrape(port)
            except OSError:
                sample = None
            if sample is not None:
                samples.append((at, sample, tree_cpu_seconds(follower.process.pid)))
            stop_scraping.wait(max(0.0, 1.0 - (time.time() - at)))

    threading.Thread(target=scraper, daemon=True, name="follower-scraper").start()
    try:
        started = time.time()
        while not (samples and samples[-1][1].get("batches_total", 0) >= 1):
            if not follower.alive():
                raise RuntimeError(f"the follower exited ({follower.process and follower.process.poll()}):\n"
                                   f"{follower.tail()}")
            if time.time() - started > 300:
                raise RuntimeError(f"the follower finished no micro-batch in 300 s:\n{follower.tail()}")
            time.sleep(0.5)
        say(f"follower up after {time.time() - started:.0f} s (trigger {trigger_s:g} s); writing {rate:,.0f} msg/s "
            f"for {warmup_s + seconds:.0f} s")
        load_before = os.getloadavg()
        ticks_before = machine_ticks()
        gen_start = time.time()

        def second(stats: TrafficStats) -> None:
            if int(stats.progress[-1][0]) % 30 == 0:
                latest = samples[-1][1] if samples else {}
                say(f"  {stats.progress[-1][0]:.0f} s: {stats.puts:,} put, {stats.deliveries:,} delivered; "
                    f"follower lag {latest.get('lag_seconds', float('nan')):.1f} s, "
                    f"{latest.get('batches_total', 0):.0f} batches, {records_total(latest):,.0f} records judged")

        traffic = generate(bootstrap, buffer, targets, rate, warmup_s + seconds, on_second=second)
        gen_end = time.time()
        ticks_after = machine_ticks()
        load_after = os.getloadavg()
        written = traffic.records - traffic.refused - traffic.unsent
        # Drain: until the follower judged every record written, or drain_s.
        drain_deadline = time.time() + drain_s
        while time.time() < drain_deadline and follower.alive():
            if samples and records_total(samples[-1][1]) >= written:
                break
            time.sleep(1)
        drained_s = time.time() - gen_end
        time.sleep(2)
    finally:
        stop_scraping.set()
        code = follower.stop()
    found = findings_on(bootstrap, findings_topic) if samples and findings_total(samples[-1][1]) else []
    return summarize(samples, follower.lines, traffic, rate=rate, seconds=seconds, trigger_s=trigger_s,
                     warmup_s=warmup_s, gen_start=gen_start, gen_end=gen_end, drained_s=drained_s,
                     load=(load_before, load_after), busy_cores=busy_cores_between(ticks_before, ticks_after),
                     findings=found, exit_code=code, log=str(folder / "follow.log"))


def summarize(samples: Sequence[tuple[float, Mapping[str, float], float]], lines: Sequence[tuple[float, str]],
              traffic: TrafficStats, *, rate: float, seconds: float, trigger_s: float, warmup_s: float,
              gen_start: float, gen_end: float, drained_s: float, load: tuple, busy_cores: float,
              findings: list[str], exit_code: int | None, log: str) -> dict:
    """The run's figures from its scrapes (``(time, metrics, follower CPU s)``), its output lines and traffic."""
    since, until = gen_start + warmup_s, gen_end
    lag = [(t - gen_start, s["lag_seconds"]) for t, s, _ in samples if "lag_seconds" in s and records_total(s)]
    age = [(t - gen_start, v) for t, s, _ in samples if (v := lag_now(s, t, gen_start)) is not None]
    window = (since - gen_start, until - gen_start)
    verdict = lag_verdict(steady(lag, *window))
    now_verdict = lag_verdict(steady(age, *window))
    judged = [(t - gen_start, records_total(s)) for t, s, _ in samples]
    cpu = [(t - gen_start, c) for t, _, c in samples]
    cpu_rate = rate_between(cpu, *window)
    judged_rate = rate_between(judged, *window)
    batches = [(t, parsed) for t, line in lines if (parsed := parse_batch_line(line)) is not None]
    in_window = [(t, b) for t, b in batches if since <= t <= until]
    durations = batch_durations([t for t, _ in in_window])
    last = samples[-1][1] if samples else {}
    written = traffic.records - traffic.refused - traffic.unsent
    steady_traffic = [(t, d) for t, _, d in traffic.progress]
    delivery_rate = rate_between(steady_traffic, warmup_s, warmup_s + seconds)
    put_rate = rate_between([(t, p) for t, p, _ in traffic.progress], warmup_s, warmup_s + seconds)
    return {
        "rate_asked": rate, "trigger_s": trigger_s, "seconds": seconds, "warmup_s": warmup_s,
        "generator": traffic.to_json(),
        "achieved_delivery_rate": _round(delivery_rate, 1), "achieved_put_rate": _round(put_rate, 1),
        "keeps_up": now_verdict["keeps_up"], "lag": verdict, "lag_now": now_verdict,
        "judged_records_per_s": _round(judged_rate, 1),
        "records_judged": records_total(last), "records_written": written,
        "judged_all": records_total(last) >= written, "drained_s": round(drained_s, 1),
        "batches": last.get("batches_total"), "batches_steady": len(in_window),
        "batch_seconds": {"p50": percentile(durations, 50), "max": max(durations, default=None)},
        "batch_lines": [{"t": round(t - gen_start, 1), **b} for t, b in batches],
        "findings": {k.removeprefix("findings_total{kind=").rstrip("}"): v for k, v in last.items()
                     if k.startswith("findings_total{") and v},
        "finding_keys": findings,
        "follower_cpu_cores": _round(cpu_rate),
        "follower_cpu_us_per_record": _round(cpu_rate * 1e6 / judged_rate, 1) if cpu_rate and judged_rate else None,
        "machine_busy_cores": round(busy_cores, 2),
        "load_before": [round(x, 2) for x in load[0]], "load_after": [round(x, 2) for x in load[1]],
        "lag_samples": [(round(t, 1), round(v, 2)) for t, v in lag],
        "lag_now_samples": [(round(t, 1), round(v, 2)) for t, v in age],
        "exit_code": exit_code, "log": log,
    }


def lag_now(sample: Mapping[str, float], at: float, traffic_start: float) -> float | None:
    """How old the newest record the job has judged is at ``at``: the lag its last micro-batch reported plus the
    time since that batch ended (a job stuck in a long batch reports an old lag; this one grows). Before it
    judged anything, the time since the traffic started (the gauge's 0 then is no lag: it was never set)."""
    if "lag_seconds" not in sample or "last_batch_timestamp_seconds" not in sample:
        return None
    if not records_total(sample):
        return max(0.0, at - traffic_start)
    return sample["lag_seconds"] + max(0.0, at - sample["last_batch_timestamp_seconds"])


def one_line(result: dict) -> str:
    lag, now, gen = result["lag"], result["lag_now"], result["generator"]
    verdict = "keeps up" if result["keeps_up"] else "FALLS BEHIND"
    return (f"trigger {result['trigger_s']:g} s, asked {result['rate_asked']:,.0f} msg/s: achieved "
            f"{result['achieved_delivery_rate'] or 0:,.0f} deliveries/s ({gen['records_per_s']:,.0f} records/s "
            f"written, {gen['acknowledged']:,} acknowledged); judged {result['judged_records_per_s'] or 0:,.0f} "
            f"records/s; reported lag p50 {lag['p50_s']} s, p95 {lag['p95_s']} s, max {lag['max_s']} s; lag now p50 "
            f"{now['p50_s']} s, max {now['max_s']} s, slope {now['slope_s_per_min']} s/min: {verdict}; findings "
            f"{result['findings'] or 0}; follower CPU "
            f"{result['follower_cpu_cores']} cores, {result['follower_cpu_us_per_record']} us/record; load after "
            f"{result['load_after'][0]}")


def settings_from(env: Mapping[str, str], quick: bool) -> tuple[float, float, float, tuple[float, ...]]:
    """The suite's rate, measured seconds, warm-up and triggers: ``BENCH_FOLLOW_*`` if set, else the defaults
    (``quick``: 1,000 msg/s for 30 s after 30 s, one trigger of 5 s).

    Raises:
        ValueError: a value that is no number, or a trigger out of range.
    """
    rate = float(env.get(RATE_ENV) or (1_000 if quick else DEFAULT_RATE))
    seconds = float(env.get(SECONDS_ENV) or (30 if quick else DEFAULT_SECONDS))
    triggers = parse_triggers(env[TRIGGERS_ENV]) if env.get(TRIGGERS_ENV) else ((5.0,) if quick
                                                                                 else DEFAULT_TRIGGERS)
    if not rate > 0 or not seconds > 0:
        raise ValueError(f"{RATE_ENV} and {SECONDS_ENV} must be above 0, not {rate} and {seconds}")
    return rate, seconds, (30.0 if quick else float(DEFAULT_WARMUP_S)), triggers


def figures(trigger_s: float, runs: Sequence[dict]) -> list:
    """The suite's figures of one trigger's runs (:func:`measured_run`'s): the delivery rate the generator
    reached, the lag p50/p95/max and its slope, the follower's CPU per record; results.json keeps the verdict,
    the findings, the generator's own figures and the per-batch lines."""
    from .report import Figure

    first = runs[0]
    key = f"follow.t{trigger_s:g}"
    what = (f"`delayq reconcile --follow --trigger {trigger_s:g}` under {first['rate_asked']:,.0f} msg/s asked "
            f"({first['seconds']:.0f} s after {first['warmup_s']:.0f} s)")

    def lag(run: dict, stat: str) -> float:
        # No micro-batch ended in the steady part: the age of the newest judged record instead (lag_now).
        value = run["lag"][stat]
        return value if value is not None else run["lag_now"][stat] if run["lag_now"][stat] is not None else math.inf

    details = {"keeps_up": [r["keeps_up"] for r in runs], "findings": [r["findings"] for r in runs],
               "finding_keys": [r["finding_keys"] for r in runs],
               **{k: [r[k] for r in runs] for k in ("generator", "lag", "lag_now", "judged_records_per_s",
                                                    "records_judged", "records_written", "judged_all", "drained_s",
                                                    "batches", "batches_steady", "batch_seconds", "batch_lines",
                                                    "follower_cpu_cores", "machine_busy_cores", "load_before",
                                                    "load_after")}}
    return [
        Figure(f"{key}.delivery_rate", f"{what}: deliveries a second the generator reached (x3 records)", "msg/s",
               "higher", [r["achieved_delivery_rate"] or 0.0 for r in runs], details=details),
        *(Figure(f"{key}.lag_{stat}", f"{what}: reported lag, {stat}", "s", "lower",
                 [lag(r, f"{stat}_s") for r in runs]) for stat in ("p50", "p95", "max")),
        Figure(f"{key}.lag_now_max", f"{what}: age of the newest judged record (reported lag + time since its "
               "batch), max", "s", "lower", [r["lag_now"]["max_s"] if r["lag_now"]["max_s"] is not None
                                              else math.inf for r in runs]),
        Figure(f"{key}.lag_slope", f"{what}: slope of that age (<= {KEEPS_UP_SLOPE_S_PER_MIN:g} s/min: keeps up)",
               "s/min", "lower", [r["lag_now"]["slope_s_per_min"] if r["lag_now"]["slope_s_per_min"] is not None
                                  else math.inf for r in runs]),
        Figure(f"{key}.cpu_us", f"{what}: follower CPU per judged record (its process, JVM and Python workers)",
               "µs", "lower", [r["follower_cpu_us_per_record"] if r["follower_cpu_us_per_record"] is not None
                              else math.inf for r in runs]),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--rate", type=float, default=DEFAULT_RATE, help="messages per second (default: 20000)")
    parser.add_argument("--seconds", type=float, default=DEFAULT_SECONDS, help="measured seconds (default: 180)")
    parser.add_argument("--warmup", type=float, default=DEFAULT_WARMUP_S, help="seconds before (default: 60)")
    parser.add_argument("--trigger", default="10,5", help="micro-batch triggers to run, comma-separated")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--generate-only", action="store_true",
                        help="only the generator, to fresh topics: what rate it reaches with no follower")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args(argv)
    if args.generate_only:
        buffer, targets, _ = create_topics(args.bootstrap, f"followbench-gen-{uuid.uuid4().hex[:8]}")
        stats = generate(args.bootstrap, buffer, targets, args.rate, args.seconds)
        print(json.dumps({k: v for k, v in stats.to_json().items()}, indent=1))
        return 0
    results = []
    for trigger in parse_triggers(args.trigger):
        result = measured_run(args.bootstrap, args.rate, args.seconds, trigger, warmup_s=args.warmup,
                              master=args.master)
        print(one_line(result), flush=True)
        results.append(result)
        if args.json:
            args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
