"""What one reconciliation run looks at: the window, the grace, the tolerance, where the report goes."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from delayq.clock import parse_duration_ms

from .destination import parse_out

MAVEN_CENTRAL = "https://repo1.maven.org/maven2/"


def parse_instant(text: str, argument: str = "time", *, now_ms: int | None = None) -> int:
    """Epoch milliseconds of an ISO 8601 time, ``now``, or a duration meaning that long before now.

    A time without an offset is read as UTC, so a report does not change with the
    machine's time zone.

    Args:
        text: ``2026-11-21T08:00:00Z``, ``2026-11-21 08:00+01:00``, ``now``, or a duration in delayq's one
            grammar (delayq/clock.py: ``24h``, 24 hours ago; ``90``, 90 seconds ago).
        argument: the name to blame in the error message (``--since``).
        now_ms: what "now" is, in epoch milliseconds; the clock when None.

    Raises:
        TypeError: ``text`` is not a str.
        ValueError: ``text`` is neither an ISO 8601 time nor a duration.
    """
    if not isinstance(text, str):
        raise TypeError(f"{argument} must be a str (ISO 8601 time or a duration like '24h'), "
                        f"not {type(text).__name__}")
    now = _now_ms() if now_ms is None else now_ms
    stripped = text.strip()
    if stripped.lower() == "now":
        return now
    try:
        return now - parse_duration_ms(stripped, argument)
    except ValueError:
        pass  # not a duration: an ISO time, below
    try:
        moment = datetime.fromisoformat(stripped.replace("z", "Z"))
    except ValueError:
        raise ValueError(f"{argument} {text!r} is neither an ISO 8601 time (e.g. '2026-11-21T08:00:00Z') "
                         "nor a duration before now (e.g. '24h')") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def iso(ms: int | None) -> str | None:
    """Epoch milliseconds as ISO 8601 UTC with milliseconds, ``None`` kept."""
    if ms is None:
        return None
    return (datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)).isoformat(timespec="milliseconds") \
        .replace("+00:00", "Z")


def _now_ms() -> int:
    return int(datetime.now(UTC).timestamp() * 1000)


@dataclass(frozen=True)
class ReconcileOptions:
    """One run of the reconciliation job.

    A message is *expected* when its due time falls in ``[since_ms, until_ms - grace_ms)``;
    messages due within the grace before ``until_ms`` are reported as ``in_grace`` and
    are not yet missing. Deliveries are read from ``lookback_ms`` before ``since_ms``
    so that an early delivery of a message due at the window start is still seen.

    Args:
        since_ms: window start, epoch milliseconds (inclusive).
        until_ms: window end, epoch milliseconds (exclusive).
        out: the folder for report.json, report.html and anomalies/: a local Path, or an object store's URL
            (``s3://bucket/prefix``, kept as a str; see destination.py).
        grace_ms: how long after its due time a message may still be in flight.
        early_tolerance_ms: a delivery this much before its due time is not yet "early":
            the due time comes from the producing host's clock and the delivery
            timestamp from the master's, and NTP keeps hosts on one network within a few ms.
        reorder_tolerance_ms: two writes of one id by producers (puts, cancels) whose offset
            order and record timestamp (creation time) order disagree by this much or less
            are not ``reordered``: producers on different hosts have clocks this far apart.
        ack_grace_ms: how long a producer's acknowledgement may lag the creation of its write:
            a cancel or reschedule created less than this before the due time of a version
            delivered anyway lost the race by the master's cutoff (not an anomaly); one
            created earlier, and appended before that delivery's ``done``, was ignored.
        topics: target topics to read; None finds them from the buffer's put frames.
        read_committed: read with ``isolation.level=read_committed`` (aborted
            transactions of a fenced master are not deliveries).
        lookback_ms: how far before ``since_ms`` deliveries are read.
        list_limit: how many ids each anomaly list in report.json holds (Parquet holds all).
        master: the Spark master for a session this job starts; None keeps the one
            spark-submit gave.
        maven_repository: where the Spark Kafka source is resolved from.
        spark_conf: extra Spark settings for a session this job starts.

    Raises:
        TypeError: an argument has the wrong type.
        ValueError: the window is empty, a duration is negative, or the grace covers the whole window.
    """

    since_ms: int
    until_ms: int
    out: Path | str
    grace_ms: int = 5 * 60_000
    early_tolerance_ms: int = 10
    reorder_tolerance_ms: int = 0
    # librdkafka's message.timeout.ms: a write not acknowledged by then has failed, so a cancel created
    # earlier than this before the due time was acknowledged before it, or not at all. Less would call a
    # cancel stuck in its producer through a broker outage (the soak's kafka_kill: 20-30 s) ignored.
    ack_grace_ms: int = 300_000
    topics: tuple[str, ...] | None = None
    read_committed: bool = True
    lookback_ms: int = 3_600_000
    list_limit: int = 1000
    master: str | None = "local[*]"
    maven_repository: str = MAVEN_CENTRAL
    spark_conf: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("since_ms", "until_ms", "grace_ms", "early_tolerance_ms", "reorder_tolerance_ms",
                     "ack_grace_ms", "lookback_ms", "list_limit"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{name} must be an int, not {type(value).__name__}")
        for name in ("grace_ms", "early_tolerance_ms", "reorder_tolerance_ms", "ack_grace_ms", "lookback_ms",
                     "list_limit"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative, got {getattr(self, name)}")
        if self.since_ms >= self.until_ms:
            raise ValueError(f"since ({iso(self.since_ms)}) must be before until ({iso(self.until_ms)})")
        if self.grace_ms >= self.until_ms - self.since_ms:
            raise ValueError(f"grace_ms {self.grace_ms} covers the whole window of "
                             f"{self.until_ms - self.since_ms} ms, so nothing could be expected: "
                             "widen the window (since/until) or shorten the grace")
        if not isinstance(self.out, (str, Path)):
            raise TypeError(f"out must be a path or an object-store URL, not {type(self.out).__name__}")
        object.__setattr__(self, "out", parse_out(self.out))
        if self.topics is not None:
            if isinstance(self.topics, str) or not all(isinstance(t, str) and t for t in self.topics):
                raise TypeError("topics must be a sequence of non-empty topic names (or None to find them)")
            if not self.topics:
                raise ValueError("topics is empty: give at least one target topic, or None to find them")
            if any("," in t for t in self.topics):
                raise ValueError(f"topics {list(self.topics)!r}: a topic name cannot contain ','")
            object.__setattr__(self, "topics", tuple(dict.fromkeys(self.topics)))
        if not isinstance(self.spark_conf, dict):
            raise TypeError(f"spark_conf must be a dict of str to str, not {type(self.spark_conf).__name__}")

    @property
    def expected_before_ms(self) -> int:
        """Messages due before this are expected to have been delivered."""
        return self.until_ms - self.grace_ms

    @property
    def isolation_level(self) -> str:
        return "read_committed" if self.read_committed else "read_uncommitted"
