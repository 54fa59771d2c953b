"""What the console's sides say to each other: the one home of each record they exchange.

A node answers the console's questions about the shards it holds over its HTTP port
(``/v1/shards/<shard>/pending``, ``/upcoming``, ``/now``: :class:`PendingHistogram`,
:class:`UpcomingPage`, :class:`ShardNow`, as JSON through :func:`to_json`/:func:`from_json`),
from its store and its own counters, never from a scan of Kafka. The console's index
(index.py) answers what only the buffer and the dead-letter topic know: an id's history
(:class:`HistoryEvent`), the dead letters (:class:`DeadLetter`) and the live repeating series
(:class:`SeriesInfo`). Pages carry an opaque ``next`` cursor (None on the last page): every list
is read from where the last page ended, never counted or scanned whole per request.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

T = TypeVar("T")

# Paths on a node's HTTP port (delay_service/http.py serves them; members.py's GroupHandler passes them on).
SHARDS_PATH = "/v1/shards/"
PENDING, UPCOMING, NOW = "pending", "upcoming", "now"
# At most this many items on one page of any list, whatever the caller asks.
MAX_PAGE = 500
# How many stored entries one /upcoming request may look at while filtering by topic before it answers with
# what it found and a cursor to go on from (so a rare topic never turns one request into a scan of the store).
UPCOMING_SCAN_LIMIT = 20_000



@dataclass(frozen=True)
class Bucket:
    """Pending messages due in ``[start_ms, start_ms + width_ms)``."""

    start_ms: int
    width_ms: int
    count: int


@dataclass(frozen=True)
class PendingHistogram:
    """A shard's pending messages by due time, from the node's store: the pending chart's data.

    ``overdue``: due before the minute of ``now_ms`` began (waiting for delivery now; ``minutes[0]`` holds
    the part of this minute already due); ``minutes``: the next hour by minute (60 buckets from the minute of
    ``now_ms``); ``hours``: the hours after those 60 minutes for ``days`` days (not aligned to clock hours);
    ``later``: due after the last hour bucket. ``count`` is every pending message of the shard.
    """

    shard: int
    now_ms: int
    count: int
    overdue: int
    minutes: tuple[Bucket, ...]
    hours: tuple[Bucket, ...]
    later: int


@dataclass(frozen=True)
class UpcomingItem:
    """One pending message of a shard, as the store holds it."""

    id: str
    due_ms: int
    topic: str
    key: str | None  # the message key as text (bytes that are no UTF-8 shown with replacement characters), <= 200
    version: int  # the buffer offset of the put pending (the version a delivery will name)
    partition: int  # the buffer partition of the id
    occurrence: int | None = None  # a repeating message's occurrence number
    repeat: str | None = None  # its schedule, as the frame writes it (wire.series_options)
    attempt: int | None = None  # a retry's attempt number


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a list, and where the next one starts (None: this is the last)."""

    items: tuple[T, ...]
    next: str | None


@dataclass(frozen=True)
class UpcomingPage:
    """``GET /v1/shards/<shard>/upcoming?after=<cursor>&limit=<n>&topic=<topic>``: due-time order."""

    shard: int
    items: tuple[UpcomingItem, ...]
    next: str | None  # "<due_ms>:<id>" of the last item, or where a topic filter's scan limit stopped
    scanned: int  # stored entries looked at to answer


@dataclass(frozen=True)
class ShardNow:
    """``GET /v1/shards/<shard>/now``: what the shard's master delivered in the last ``window_s`` seconds."""

    shard: int
    master: bool  # whether the answering node is the shard's master now (only a master's figures move)
    window_s: float
    delivered: int
    rate_per_s: float
    lateness_p50_ms: float | None  # None: nothing delivered in the window
    lateness_p99_ms: float | None
    pending: int


HistoryKind = Literal["put", "reschedule", "copy", "next-occurrence", "cancel", "done", "delivered", "dead-letter",
                      "malformed", "replay"]


@dataclass(frozen=True)
class HistoryEvent:
    """One record of an id's history, in buffer offset order (dead letters and deliveries by time)."""

    kind: HistoryKind
    ts_ms: int  # the record's Kafka timestamp
    topic: str  # the Kafka topic the record is on (the buffer, the dead-letter topic, a target topic)
    partition: int
    offset: int
    due_ms: int | None = None  # a put's due time
    target: str | None = None  # a put's target topic
    version: int | None = None  # a done's or a delivery's or a dead letter's version (the put's offset)
    cutoff: int | None = None  # a done's cutoff
    epoch: int | None = None  # a delivery's delayq-epoch
    occurrence: int | None = None
    repeat: str | None = None
    reason: str | None = None  # a dead letter's or a malformed record's reason code (wire.Reason)
    text: str | None = None  # the reason's text, or a replay's source


@dataclass(frozen=True)
class DeadLetter:
    """One record of the dead-letter topic, as the console lists it."""

    partition: int
    offset: int
    ts_ms: int
    code: str  # wire.Reason's value, or "unknown"
    text: str
    id: str | None  # the delay id (the record's key), if it is one
    source: str | None  # delayq-dead-letter-source: "<buffer topic>/<partition>/<offset>"
    version: int | None
    target: str | None  # the topic the message was for (undeliverable messages only)
    due_ms: int | None
    headers: tuple[tuple[str, str], ...]  # every header, values as text (<= 200 characters each)
    replayable: bool  # an undeliverable message whose put frame the record carries
    replayed_as: str | None = None  # the delay id of its replay, once replayed

    @property
    def coordinates(self) -> str:
        """``<partition>/<offset>`` on the dead-letter topic: how the console names one."""
        return f"{self.partition}/{self.offset}"


@dataclass(frozen=True)
class SeriesInfo:
    """A live repeating message: its schedule, the occurrence pending and when it falls due."""

    id: str
    target: str
    repeat: str  # wire.series_options
    occurrence: int  # the occurrence pending now
    next_due_ms: int
    delivered: int  # occurrences delivered so far (occurrence - 1 for a series the master continued)
    version: int


def to_json(record: Any) -> dict[str, Any]:
    """A record of this module as JSON-ready data (tuples as lists)."""
    return dataclasses.asdict(record)


def dumps(record: Any) -> bytes:
    return json.dumps(to_json(record), separators=(",", ":")).encode()


def _bucket(data: dict[str, Any]) -> Bucket:
    return Bucket(int(data["start_ms"]), int(data["width_ms"]), int(data["count"]))


def histogram_from_json(data: dict[str, Any]) -> PendingHistogram:
    return PendingHistogram(
        shard=int(data["shard"]), now_ms=int(data["now_ms"]), count=int(data["count"]), overdue=int(data["overdue"]),
        minutes=tuple(_bucket(b) for b in data["minutes"]), hours=tuple(_bucket(b) for b in data["hours"]),
        later=int(data["later"]))


def upcoming_from_json(data: dict[str, Any]) -> UpcomingPage:
    return UpcomingPage(shard=int(data["shard"]), items=tuple(UpcomingItem(**item) for item in data["items"]),
                        next=data.get("next"), scanned=int(data.get("scanned", 0)))


def now_from_json(data: dict[str, Any]) -> ShardNow:
    return ShardNow(**data)
