"""The soak's judge: what was asked of delayq against what it delivered, by the product's rules.

Pure logic on a recorded :class:`History`, no server: the soak fills one while it
runs, the unit tests build them by hand.

A message is a list of versions (its put, then each reschedule: a put under the same
id with another due time) and maybe a cancel. Deliveries are matched to a version by
id and the ``delayq-deliver-at`` header (reschedules always move the due time by at
least 1 ms, so the header names the version). What each version may do depends on
the write that ended it (the next version's put, or the cancel) and on when the
producer saw that write acknowledged:

==========================================  ===========================================
the version ...                              must be delivered
==========================================  ===========================================
is the last one, nothing cancels it          exactly once, never before its due time
was ended by a write acked before its due    never (else ``cancel_ignored``)
was ended by a write acked at/after its due  at most once (the documented race)
has a write of its own or of its ender that  at most once: the producer cannot know
failed or was never acknowledged             whether the write landed
==========================================  ===========================================

A repeating message (``repeat=Every(...)``) is one id whose versions are its occurrences,
all put by the one producer write: each occurrence is ended by the series' cancel only,
so an occurrence due after a cancel's acknowledgement must never be delivered, one due
before it at most once, and without a cancel each exactly once.

A version that must not be delivered and was is ``cancel_ignored`` when a cancel ended
it, ``stale_version`` when a reschedule did; a version that must be delivered and never
was is ``lost_reschedule`` when a reschedule put it, else ``missing``.

Every delivery is checked too: ``early`` (record timestamp before the due time),
``duplicated`` (one version delivered more than once), ``unexpected`` (an id or due
time the soak never produced). The ``delayq-version`` header (a buffer offset) is kept
as evidence, not matched: a master may deliver a version from a copy it re-put
(``restores=`` in the frame), whose offset is not the one the producer was given.

And the buffer itself, where the producer's writes of an id must stand in the order
their acknowledgements came back (and in which they were sent): ``reordered`` (of two
writes of an id, the one acknowledged or sent first has the later buffer offset). A put
of the producer's at two offsets (same id, value and timestamp; the buffer is read once
the nodes have stopped, :class:`BufferScan`) is no anomaly: the client library appended
it twice (librdkafka resends a batch after an epoch bump), and the nodes apply it once.
It is reported with its offsets (:attr:`Findings.written_twice`, counted per id in
``twice_written``); what a copy applied as a write would cause (a duplicate, a cancel
ignored, a lost reschedule) the rules above catch.

Ack times are taken when the producer's delivery callback ran, a little after the
broker acknowledged: a write judged "acked before the due time" surely was.
"""

from __future__ import annotations

import bisect
import hashlib
import heapq
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from delayq.wire import MalformedRecord, parse_buffer_record

# A version counts as owed (for the stall figure) from this long after it fell due.
STALL_GRACE_MS = 1000
ANOMALY_KINDS = ("duplicated", "missing", "early", "cancel_ignored", "stale_version", "lost_reschedule",
                 "reordered", "unexpected")


class Fate(Enum):
    """What the rules allow for one version."""

    MUST = "must be delivered exactly once"
    MAY = "may be delivered at most once"
    MUST_NOT = "must never be delivered"


@dataclass(slots=True)
class Write:
    """One write to the buffer topic, as the producer saw it."""

    sent_ms: int
    acked_ms: int | None = None
    error: str | None = None
    partition: int | None = None
    offset: int | None = None

    @property
    def acknowledged(self) -> bool:
        """The broker confirmed it (a report without an error)."""
        return self.acked_ms is not None and self.error is None

    def evidence(self) -> dict[str, Any]:
        return {"sent_ms": self.sent_ms, "acked_ms": self.acked_ms, "error": self.error,
                "buffer_partition": self.partition, "buffer_offset": self.offset}


@dataclass(slots=True)
class Version:
    due_ms: int
    put: Write


@dataclass(slots=True)
class Message:
    """One delay id: its versions in the order they were put, and its cancel if any."""

    delay_id: str
    topic: str
    versions: list[Version]
    cancel: Write | None = None
    series: bool = False  # the versions are a repeating message's occurrences, not reschedules
    # Put with expire_after= (feature level 2, --upgrade-from), long enough never to expire: judged as any other.
    expiring: bool = False

    def ender(self, index: int) -> Write | None:
        """The write that replaced or cancelled version ``index``, if any."""
        if index + 1 < len(self.versions) and not self.series:
            return self.versions[index + 1].put
        return self.cancel

    def fate(self, index: int) -> Fate:
        version = self.versions[index]
        ender = self.ender(index)
        if ender is not None and ender.acknowledged and ender.acked_ms < version.due_ms:  # type: ignore[operator]
            return Fate.MUST_NOT
        if ender is not None or not version.put.acknowledged:
            return Fate.MAY
        return Fate.MUST


@dataclass(frozen=True, slots=True)
class Delivery:
    """One record on a target topic, as a read_committed consumer saw it."""

    delay_id: str | None
    due_ms: int | None
    timestamp_ms: int
    topic: str
    partition: int
    offset: int
    epoch: int | None = None
    version: int | None = None
    received_ms: int | None = None

    def evidence(self) -> dict[str, Any]:
        return {"topic": self.topic, "partition": self.partition, "offset": self.offset,
                "timestamp_ms": self.timestamp_ms, "deliver_at_ms": self.due_ms, "epoch": self.epoch,
                "version": self.version, "received_ms": self.received_ms}


@dataclass(frozen=True, slots=True)
class FaultWindow:
    """One injected fault, from the moment it was done until the cluster was healthy again.

    ``outage_ms`` is the part during which Kafka or ZooKeeper itself was down (killed until it
    answered again; on a replicated cluster, until every partition the soak uses could take an
    acknowledged write again): no delivery is possible then, whatever the nodes do.
    ``later_outages_ms``: more such times in the same fault (a rolling restart's brokers, one
    at a time), after the first.
    """

    kind: str
    start_ms: int
    end_ms: int
    detail: str = ""
    outage_ms: tuple[int, int] | None = None
    later_outages_ms: tuple[tuple[int, int], ...] = ()

    def overlaps(self, start_ms: int, end_ms: int) -> bool:
        return start_ms <= self.end_ms and end_ms >= self.start_ms

    @property
    def outages(self) -> list[tuple[int, int]]:
        """Every outage of the fault, first to last."""
        return ([self.outage_ms] if self.outage_ms is not None else []) + list(self.later_outages_ms)

    @property
    def outage_s(self) -> float:
        return sum(end - start for start, end in self.outages) / 1000


@dataclass(frozen=True, slots=True)
class RepeatedPut:
    """One put of the producer's that the buffer holds at more than one offset: same id, value and timestamp."""

    delay_id: str
    partition: int
    offsets: tuple[int, ...]
    timestamp_ms: int
    due_ms: int

    def evidence(self) -> dict[str, Any]:
        return {"buffer_partition": self.partition, "buffer_offsets": list(self.offsets),
                "timestamp_ms": self.timestamp_ms, "due_ms": self.due_ms}


class BufferScan:
    """The buffer's records in offset order, one pass: finds the producer's puts it holds twice.

    Only the producer's puts count: a master's copies (``restores=``) and next occurrences
    (``follows=``) are the master's own writes, and a malformed record is no put. A put is
    remembered by a 64-bit digest of its id, timestamp and value (a 30-minute soak's
    million puts in tens of MB, where their bytes would take hundreds); two records with
    one digest are one put written twice.
    """

    def __init__(self) -> None:
        self.records = 0
        self.puts = 0
        self.error: str | None = None  # why the buffer could not be read to its end, if it could not
        self._first: dict[int, tuple[int, int]] = {}  # digest -> (partition, offset) of its first record
        self._repeated: dict[int, RepeatedPut] = {}

    def add(self, partition: int, offset: int, key: bytes | None, value: bytes | None, timestamp_ms: int) -> None:
        """One buffer record, as a consumer read it; records of a partition come in offset order."""
        self.records += 1
        if key is None or value is None:
            return  # a cancel or a done
        try:
            record = parse_buffer_record(key, value, None, timestamp_ms)
        except MalformedRecord:
            return
        if record.envelope is None or record.restores is not None or record.follows is not None:
            return
        self.puts += 1
        stamp = timestamp_ms.to_bytes(8, "big", signed=True)
        digest = int.from_bytes(hashlib.blake2b(key + stamp + value, digest_size=8).digest(), "big")
        first = self._first.setdefault(digest, (partition, offset))
        if first == (partition, offset):
            return  # its first record (or that record read again)
        seen = self._repeated.get(digest)
        offsets = seen.offsets if seen is not None else (first[1],)
        if offset not in offsets:
            self._repeated[digest] = RepeatedPut(record.delay_id, partition, (*offsets, offset), timestamp_ms,
                                                 record.envelope.deliver_at_ms)

    @property
    def repeated(self) -> list[RepeatedPut]:
        """The puts found at more than one offset, by partition and first offset."""
        return sorted(self._repeated.values(), key=lambda r: (r.partition, r.offsets))

    def as_dict(self) -> dict[str, Any]:
        return {"records": self.records, "producer_puts": self.puts, "twice_written": len(self._repeated),
                "error": self.error}


@dataclass
class History:
    """Everything one soak did and saw.

    Args:
        messages: every delayed message produced, by delay id.
        deliveries: every record read from the target topics.
        faults: the fault windows.
        judged_until_ms: a version due before this must have been delivered by the end.
        ended_ms: when observation ended (a stall still running then ends here).
        repeated_puts: the producer's puts the buffer holds at more than one offset
            (:attr:`BufferScan.repeated`).
    """

    messages: dict[str, Message]
    deliveries: list[Delivery]
    faults: list[FaultWindow] = field(default_factory=list)
    judged_until_ms: int = 0
    ended_ms: int = 0
    repeated_puts: list[RepeatedPut] = field(default_factory=list)


@dataclass
class Anomaly:
    """One broken rule: which id, which rule, and the evidence (writes, deliveries, faults)."""

    kind: str
    delay_id: str | None
    rule: str
    evidence: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "id": self.delay_id, "rule": self.rule, **self.evidence}


@dataclass
class Lateness:
    """Record timestamp minus due time of the first delivery of each delivered version, in ms."""

    count: int
    p50: int | None
    p99: int | None
    max: int | None

    @classmethod
    def of(cls, values: list[int]) -> Lateness:
        ordered = sorted(values)
        return cls(len(ordered), _nearest_rank(ordered, 0.5), _nearest_rank(ordered, 0.99),
                   ordered[-1] if ordered else None)

    def as_dict(self) -> dict[str, int | None]:
        return {"count": self.count, "p50": self.p50, "p99": self.p99, "max": self.max}


@dataclass
class Stall:
    """A time during which something owed was due (by more than 1 s) and nothing was delivered."""

    start_ms: int
    end_ms: int
    first_owed_id: str | None
    during_faults: list[str]
    outage_ms: int = 0

    @property
    def seconds(self) -> float:
        return (self.end_ms - self.start_ms) / 1000

    @property
    def beyond_outages_s(self) -> float:
        """The stall less the time Kafka or ZooKeeper was down: what the nodes are answerable for."""
        return (self.end_ms - self.start_ms - self.outage_ms) / 1000

    def as_dict(self) -> dict[str, Any]:
        return {"seconds": round(self.seconds, 3), "beyond_outages_s": round(self.beyond_outages_s, 3),
                "start_ms": self.start_ms, "end_ms": self.end_ms, "first_owed_id": self.first_owed_id,
                "during_faults": self.during_faults}


@dataclass
class KindFigures:
    """The soak's figures for the faults of one kind: how many, how long, and delivery meanwhile.

    ``lateness`` counts every delivered version whose due time to first delivery overlaps a
    fault of this kind; the stalls are the longest overlapping one (by its whole length, and
    by its length beyond every outage), as :func:`longest_stall` measures them.
    """

    kind: str
    faults: int
    seconds: float
    longest_s: float
    outage_s: float
    lateness: Lateness
    stall: Stall | None
    stall_beyond_outages: Stall | None

    def as_dict(self) -> dict[str, Any]:
        return {"faults": self.faults, "seconds": round(self.seconds, 1), "longest_s": round(self.longest_s, 1),
                "outage_s": round(self.outage_s, 1), "lateness_ms": self.lateness.as_dict(),
                "max_stall_s": round(self.stall.seconds, 3) if self.stall else 0.0,
                "max_stall_beyond_outages_s": round(self.stall_beyond_outages.beyond_outages_s, 3)
                if self.stall_beyond_outages else 0.0}


@dataclass
class Findings:
    """The judgement of one history.

    ``written_twice``: the soak's puts the buffer holds at more than one offset, each with
    what happened and its evidence (offsets, the message's writes, the faults then): no
    anomaly, and ``counts["twice_written"]`` says how many ids have one.
    """

    counts: dict[str, int]
    anomalies: list[Anomaly]
    lateness_in_faults: Lateness
    lateness_outside_faults: Lateness
    stall: Stall | None
    stall_beyond_outages: Stall | None
    by_fault_kind: dict[str, KindFigures] = field(default_factory=dict)
    written_twice: list[dict[str, Any]] = field(default_factory=list)

    def by_kind(self, kind: str) -> list[Anomaly]:
        return [a for a in self.anomalies if a.kind == kind]

    def flagged_ids(self) -> dict[str, set[str]]:
        """Every delay id with an anomaly, and the kinds it has."""
        flagged: dict[str, set[str]] = defaultdict(set)
        for anomaly in self.anomalies:
            if anomaly.delay_id is not None:
                flagged[anomaly.delay_id].add(anomaly.kind)
        return dict(flagged)

    @property
    def max_stall_s(self) -> float:
        return self.stall.seconds if self.stall else 0.0

    @property
    def max_stall_beyond_outages_s(self) -> float:
        return self.stall_beyond_outages.beyond_outages_s if self.stall_beyond_outages else 0.0


def judge(history: History) -> Findings:
    """Apply the rules (module docstring) to every version and every delivery of ``history``."""
    by_version: dict[tuple[str, int], list[Delivery]] = defaultdict(list)
    anomalies: list[Anomaly] = []
    for delivery in history.deliveries:
        message = history.messages.get(delivery.delay_id) if delivery.delay_id is not None else None
        due = delivery.due_ms
        if message is None or due is None or not any(v.due_ms == due for v in message.versions):
            anomalies.append(_unexpected(delivery, message))
            continue
        by_version[(message.delay_id, due)].append(delivery)

    counts = dict.fromkeys(("messages", "versions", "cancelled", "rescheduled", "series", "expiring", "must", "may",
                            "must_not", "delivered", "delivered_records", "twice_written", *ANOMALY_KINDS), 0)
    counts["messages"] = len(history.messages)
    counts["delivered_records"] = len(history.deliveries)
    inside: list[int] = []
    outside: list[int] = []
    by_kind: dict[str, list[int]] = defaultdict(list)
    for message in history.messages.values():
        counts["cancelled"] += message.cancel is not None
        counts["rescheduled"] += len(message.versions) > 1 and not message.series
        counts["series"] += message.series
        counts["expiring"] += message.expiring
        for index, version in enumerate(message.versions):
            counts["versions"] += 1
            fate = message.fate(index)
            counts[fate.name.lower()] += 1
            delivered = sorted(by_version.get((message.delay_id, version.due_ms), ()), key=_delivery_order)
            if delivered:
                counts["delivered"] += 1
                first = delivered[0]
                lateness = first.timestamp_ms - version.due_ms
                window = (version.due_ms, max(version.due_ms, first.timestamp_ms))
                during = _faults_overlapping(history.faults, *window)
                (inside if during else outside).append(lateness)
                for kind in {f.kind for f in during}:
                    by_kind[kind].append(lateness)
            anomalies.extend(_version_anomalies(history, message, index, fate, delivered))
        reordered = _reordered(history, message)
        if reordered is not None:
            anomalies.append(reordered)
    written_twice = [_twice_written(history, repeated) for repeated in history.repeated_puts
                     if repeated.delay_id in history.messages]
    counts["twice_written"] = len({copied["id"] for copied in written_twice})
    for anomaly in anomalies:
        counts[anomaly.kind] += 1
    stalls = _stalls(history)
    figures = {kind: _kind_figures(history, kind, by_kind.get(kind, []), stalls)
               for kind in dict.fromkeys(f.kind for f in history.faults)}
    return Findings(counts, anomalies, Lateness.of(inside), Lateness.of(outside), stalls.longest(),
                    stalls.longest(beyond_outages=True), figures, written_twice)


def _kind_figures(history: History, kind: str, lateness: list[int], stalls: _Stalls) -> KindFigures:
    windows = [f for f in history.faults if f.kind == kind]
    lengths = [(f.end_ms - f.start_ms) / 1000 for f in windows]
    return KindFigures(kind, len(windows), sum(lengths), max(lengths, default=0.0),
                       sum(f.outage_s for f in windows), Lateness.of(lateness),
                       stalls.longest(during=windows), stalls.longest(beyond_outages=True, during=windows))


def owed_versions(messages: Iterable[Message]) -> list[tuple[str, int]]:
    """(id, due) of every version that must be delivered exactly once."""
    return [(m.delay_id, v.due_ms) for m in messages for i, v in enumerate(m.versions) if m.fate(i) is Fate.MUST]


def longest_stall(history: History, *, beyond_outages: bool = False) -> Stall | None:
    """The longest interval with an owed version due for more than a second and no delivery at all.

    A version is owed from ``max(due, put acked) + 1 s``: a put the broker only took after
    its due time (Kafka was down) was not delayq's to deliver before then. Any delivery,
    of any message, ends a stall (it shows delivery works); a new stall starts right
    after it if something owed is still undelivered.

    Args:
        history: what was asked and delivered.
        beyond_outages: rank stalls by their length less the time Kafka or ZooKeeper was
            down during them (the fault windows' outages), not by their whole length.
    """
    return _stalls(history).longest(beyond_outages=beyond_outages)


# Stalls shorter than this are not kept for the per-fault-kind figures (the longest overall always is).
KEPT_STALL_MS = 100


class _Stalls:
    """Every stall of a history (those of :data:`KEPT_STALL_MS` or more), in time order, and the outages."""

    def __init__(self, intervals: list[tuple[int, int, str]], outages: list[tuple[int, int]],
                 faults: list[FaultWindow]):
        self.intervals = intervals
        self.outages = outages
        self.faults = faults
        self._ends = [end for _, end, _ in intervals]

    def length(self, start: int, end: int, beyond_outages: bool) -> int:
        return end - start - (_overlap(self.outages, start, end) if beyond_outages else 0)

    def longest(self, *, beyond_outages: bool = False, during: list[FaultWindow] | None = None) -> Stall | None:
        """The longest stall (overlapping one of ``during``, if given), as a :class:`Stall`."""
        if during is None:
            candidates = self.intervals
        else:
            chosen = set()
            for window in during:
                index = bisect.bisect_left(self._ends, window.start_ms)
                while index < len(self.intervals) and self.intervals[index][0] <= window.end_ms:
                    chosen.add(index)
                    index += 1
            candidates = [self.intervals[i] for i in sorted(chosen)]
        if not candidates:
            return None
        start, end, first_owed = max(candidates, key=lambda c: self.length(c[0], c[1], beyond_outages))
        return Stall(start, end, first_owed, [f.kind for f in self.faults if f.overlaps(start, end)],
                     _overlap(self.outages, start, end))


def _stalls(history: History) -> _Stalls:
    """The stalls of ``history`` (:func:`longest_stall` says what one is)."""
    first_delivery: dict[tuple[str, int], int] = {}
    for d in history.deliveries:
        if d.delay_id is not None and d.due_ms is not None:
            key = (d.delay_id, d.due_ms)
            first_delivery[key] = min(first_delivery.get(key, d.timestamp_ms), d.timestamp_ms)
    owed: list[tuple[int, str, float]] = []  # (owed from, id, first delivery or inf)
    for message in history.messages.values():
        for index, version in enumerate(message.versions):
            if message.fate(index) is not Fate.MUST:
                continue
            owed_from = max(version.due_ms, version.put.acked_ms or version.put.sent_ms) + STALL_GRACE_MS
            delivered = first_delivery.get((message.delay_id, version.due_ms), math.inf)
            if delivered > owed_from:
                owed.append((owed_from, message.delay_id, delivered))
    outages = _merged([outage for f in history.faults for outage in f.outages])
    intervals: list[tuple[int, int, str]] = []
    if not owed:
        return _Stalls(intervals, outages, history.faults)
    settles: dict[float, int] = defaultdict(int)
    for _, _, delivered in owed:
        settles[delivered] += 1
    # At one instant a version falls due (kind 0) before deliveries happen (kind 1).
    events = sorted([(o[0], 0, i) for i, o in enumerate(owed)]
                    + [(t, 1, -1) for t in {d.timestamp_ms for d in history.deliveries}])

    waiting: list[tuple[int, str, float]] = []  # owed, not yet delivered, earliest first
    owing = 0
    stall_start = 0
    # The longest overall by either measure, kept whatever its length.
    best: dict[bool, tuple[int, int, str] | None] = {False: None, True: None}

    def length(start: int, end: int, beyond: bool) -> int:
        return end - start - (_overlap(outages, start, end) if beyond else 0)

    def consider(start: int, end: int, first_owed: str) -> None:
        if end - start >= KEPT_STALL_MS:
            intervals.append((start, end, first_owed))
            return
        for beyond, kept in best.items():
            if kept is None or length(start, end, beyond) > length(kept[0], kept[1], beyond):
                best[beyond] = (start, end, first_owed)

    for instant, kind, index in events:
        if kind == 0:
            if owing == 0:
                stall_start = instant
            owing += 1
            heapq.heappush(waiting, owed[index])
            continue
        if owing > 0:
            consider(stall_start, instant, waiting[0][1])
        owing -= settles.get(instant, 0)
        while waiting and waiting[0][2] <= instant:
            heapq.heappop(waiting)
        stall_start = instant
    if owing > 0:
        consider(stall_start, max(history.ended_ms, stall_start), waiting[0][1])
    # The short stalls' longest (by either measure) beside the long ones: disjoint, so in order of start and end.
    intervals = sorted(set(intervals) | {kept for kept in best.values() if kept is not None})
    return _Stalls(intervals, outages, history.faults)


def _merged(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The union of ``intervals`` as disjoint intervals in order."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _overlap(intervals: list[tuple[int, int]], start: int, end: int) -> int:
    """How much of [start, end] the (disjoint) intervals cover, in ms."""
    return sum(max(0, min(end, b) - max(start, a)) for a, b in intervals)


def _delivery_order(delivery: Delivery) -> tuple[int, str, int, int]:
    return (delivery.timestamp_ms, delivery.topic, delivery.partition, delivery.offset)


def _faults_overlapping(faults: list[FaultWindow], start_ms: int, end_ms: int) -> list[FaultWindow]:
    return [f for f in faults if f.overlaps(start_ms, end_ms)]


def _version_anomalies(history: History, message: Message, index: int, fate: Fate,
                       delivered: list[Delivery]) -> list[Anomaly]:
    version = message.versions[index]
    found: list[Anomaly] = []

    def anomaly(kind: str, rule: str) -> Anomaly:
        # The faults that could explain it: those between the due time and the last delivery
        # (for a version never delivered, the end of the run).
        end = max(d.timestamp_ms for d in delivered) if delivered else history.judged_until_ms
        return Anomaly(kind, message.delay_id, rule, {
            "topic": message.topic,
            "version_index": index,
            "versions": [{"due_ms": v.due_ms, "put": v.put.evidence()} for v in message.versions],
            "cancel": message.cancel.evidence() if message.cancel else None,
            "fate": fate.value,
            "deliveries": [d.evidence() for d in delivered],
            "faults": [f.kind for f in _faults_overlapping(history.faults, version.due_ms,
                                                           max(end, version.due_ms))],
        })

    ender = message.ender(index)
    if fate is Fate.MUST_NOT and delivered and ender is not None:
        if ender is message.cancel:
            found.append(anomaly("cancel_ignored", f"a cancel acknowledged at {ender.acked_ms} ms, before the due "
                                                   f"time {version.due_ms} ms, lost: the version was delivered "
                                                   "anyway"))
        else:
            found.append(anomaly("stale_version", f"a reschedule acknowledged at {ender.acked_ms} ms, before the "
                                                  f"due time {version.due_ms} ms, lost: the stale version was "
                                                  "delivered anyway"))
    if len(delivered) > 1:
        found.append(anomaly("duplicated", f"version due {version.due_ms} ms delivered {len(delivered)} times"))
    if fate is Fate.MUST and not delivered and version.due_ms < history.judged_until_ms:
        if index and not message.series:
            found.append(anomaly("lost_reschedule", f"the reschedule to {version.due_ms} ms, acknowledged at "
                                                    f"{version.put.acked_ms} ms, {fate.value}: never delivered"))
        else:
            found.append(anomaly("missing", f"version due {version.due_ms} ms {fate.value}, never delivered"))
    early = [d for d in delivered if d.timestamp_ms < version.due_ms]
    if early:
        found.append(anomaly("early", f"delivered at {early[0].timestamp_ms} ms, "
                                      f"{version.due_ms - early[0].timestamp_ms} ms before its due time"))
    return found


def _writes(message: Message) -> list[tuple[str, Write]]:
    """The producer's writes of ``message``, named, in the order they were sent (a series' put once)."""
    if message.series:
        named = [("put", message.versions[0].put)]
    else:
        named = [("put" if i == 0 else f"reschedule {i}", v.put) for i, v in enumerate(message.versions)]
    if message.cancel is not None:
        named.append(("cancel", message.cancel))
    return named


def _write_evidence(name: str, write: Write) -> dict[str, Any]:
    return {"write": name, **write.evidence()}


def _reordered(history: History, message: Message) -> Anomaly | None:
    """The id's writes the buffer holds in another order than the producer sent them or saw them acknowledged.

    Of two acknowledged writes on one partition, the one acknowledged first must have the
    lower offset, and so must the one sent first: an idempotent producer keeps a partition
    in the order of its ``produce()`` calls, and the reconciliation reads that order from
    the records' timestamps. Each by a whole millisecond: two in one ms have no order here.
    """
    acked = [(name, w) for name, w in _writes(message) if w.acknowledged and w.offset is not None]
    pairs = []
    for index, one in enumerate(acked):
        for other in acked[index + 1:]:
            (_, lower), (_, higher) = ordered = sorted((one, other), key=lambda named: named[1].offset or 0)
            if lower.partition != higher.partition:
                continue
            broken = [what for what, first, then in (("sent", higher.sent_ms, lower.sent_ms),
                                                     ("acknowledged", higher.acked_ms or 0, lower.acked_ms or 0))
                      if first < then]
            if broken or lower.offset == higher.offset:
                pairs.append((ordered, broken))
    if not pairs:
        return None
    ((name_a, a), (name_b, b)), broken = pairs[0]
    why = f"the {name_b} was {' and '.join(broken)} first" if broken else "both at one offset"
    rule = (f"the {name_b} (sent at {b.sent_ms} ms, acknowledged at {b.acked_ms} ms) is at buffer offset {b.offset} "
            f"of partition {b.partition}, after the {name_a} (sent at {a.sent_ms} ms, acknowledged at {a.acked_ms} ms) "
            f"at offset {a.offset}: {why}")
    return Anomaly("reordered", message.delay_id, rule, {
        "topic": message.topic,
        "pairs": [[_write_evidence(*lower), _write_evidence(*higher)] for (lower, higher), _ in pairs],
        "writes": [_write_evidence(name, w) for name, w in _writes(message)],
        "faults": _fault_kinds(history, [a, b]),
    })


def _twice_written(history: History, repeated: RepeatedPut) -> dict[str, Any]:
    """A put of the soak's that the buffer holds more than once, in words and with its evidence."""
    message = history.messages[repeated.delay_id]
    written = [(name, w) for name, w in _writes(message)
               if name != "cancel" and any(v.put is w and v.due_ms == repeated.due_ms for v in message.versions)]
    name = written[0][0] if written else "put"
    offsets = ", ".join(str(o) for o in repeated.offsets)
    what = (f"the {name} due {repeated.due_ms} ms (timestamp {repeated.timestamp_ms} ms), produced once, is in the "
            f"buffer {len(repeated.offsets)} times: partition {repeated.partition}, offsets {offsets}")
    return {
        "id": repeated.delay_id,
        "what": what,
        "topic": message.topic,
        **repeated.evidence(),
        "writes": [_write_evidence(name, w) for name, w in _writes(message)],
        "faults": _fault_kinds(history, [w for _, w in written]),
    }


def _fault_kinds(history: History, writes: list[Write]) -> list[str]:
    """The faults overlapping the time ``writes`` took, from the first sent to the last acknowledged."""
    if not writes:
        return []
    start = min(w.sent_ms for w in writes)
    end = max(w.acked_ms or w.sent_ms for w in writes)
    return [f.kind for f in _faults_overlapping(history.faults, start, end)]


def _unexpected(delivery: Delivery, message: Message | None) -> Anomaly:
    if delivery.delay_id is None:
        rule = "a record without a delayq-id header on a target topic"
    elif message is None:
        rule = "a delivery of an id the soak never produced"
    else:
        rule = (f"a delivery with deliver-at {delivery.due_ms} ms, which is no version of this id "
                f"(versions due {[v.due_ms for v in message.versions]})")
    return Anomaly("unexpected", delivery.delay_id, rule, {"deliveries": [delivery.evidence()]})


def _nearest_rank(ordered: list[int], fraction: float) -> int | None:
    if not ordered:
        return None
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def missing_by_buffer_partition(findings: Findings, started_ms: int) -> dict[str, dict[str, Any]]:
    """The missing versions (and lost reschedules) grouped by the buffer partition of their put: where to look first.

    Each group: how many, the range of their puts' offsets, and when (seconds after
    ``started_ms``) those puts were acknowledged and fell due. Missing versions packed on
    one partition behind one offset point at that partition (an open transaction, a stuck
    reader); spread evenly, at the master.
    """
    groups: dict[str, list[tuple[int | None, int | None, int]]] = defaultdict(list)
    for anomaly in findings.by_kind("missing") + findings.by_kind("lost_reschedule"):
        version = anomaly.evidence["versions"][anomaly.evidence["version_index"]]
        put = version["put"]
        groups[str(put["buffer_partition"])].append((put["buffer_offset"], put["acked_ms"], version["due_ms"]))

    def span(values: Iterable[int | None], scale: float = 1, origin: int = 0) -> list[float] | None:
        known = [v for v in values if v is not None]
        if not known:
            return None
        return [round((min(known) - origin) / scale, 1), round((max(known) - origin) / scale, 1)]

    return {partition: {"count": len(rows), "offsets": span(r[0] for r in rows),
                        "acked_s": span((r[1] for r in rows), 1000, started_ms),
                        "due_s": span((r[2] for r in rows), 1000, started_ms)}
            for partition, rows in sorted(groups.items())}


# -- the verdict and the reconciliation ----------------------------------------

# The soak's anomaly kinds and the reconciliation report's names for them. The report has no kind of
# its own for a stale version (its cancel_ignored counts them) or a lost reschedule (its missing does).
RECONCILE_NAMES = {"duplicated": "duplicates", "missing": "missing", "early": "early",
                   "cancel_ignored": "cancel_ignored", "reordered": "reordered", "unexpected": "unexpected"}


@dataclass
class Comparison:
    """The soak's findings beside the reconciliation's report, id by id."""

    ran: bool
    exit_code: int | None
    totals: dict[str, int | None]
    soak_only: dict[str, list[str]]
    reconcile_only: dict[str, list[str]]
    error: str | None = None

    @property
    def agrees(self) -> bool:
        return self.ran and not self.soak_only and not self.reconcile_only

    def as_dict(self) -> dict[str, Any]:
        return {"ran": self.ran, "exit_code": self.exit_code, "totals": self.totals, "agrees": self.agrees,
                "soak_only": self.soak_only, "reconcile_only": self.reconcile_only, "error": self.error}


def compare_with_reconcile(findings: Findings, report: Mapping[str, Any] | None, exit_code: int | None,
                           error: str | None = None) -> Comparison:
    """Which ids the soak flags and the reconciliation does not, and the other way round.

    Both judge the same frozen topics, so an id flagged by one side only is a
    disagreement: the soak's rule the reconciliation misses, or a reconciliation
    alarm the soak finds unfounded. The kinds may differ (a stale version delivered is
    ``stale_version`` here, ``cancel_ignored`` to the job, and ``early`` or ``duplicates``
    to a job that only keeps the latest put; a lost reschedule is the job's ``missing``);
    each side's kinds are listed for the id. Every kind of the report counts, ``reordered``
    as the others. Beside the kinds, the totals carry the report's counts of what is no
    anomaly (``twice_written``: ids with a write appended twice, puts and cancels alike,
    where the soak counts its puts only).
    """
    if report is None:
        return Comparison(False, exit_code, {}, {}, {}, error or "no report.json")
    lists: Mapping[str, list[str]] = report.get("anomalies", {})
    reconcile_flagged: dict[str, set[str]] = defaultdict(set)
    for kind, ids in lists.items():
        for delay_id in ids:
            reconcile_flagged[delay_id].add(kind)
    soak_flagged = findings.flagged_ids()
    soak_only = {i: sorted(k) for i, k in soak_flagged.items() if i not in reconcile_flagged}
    reconcile_only = {i: sorted(k) for i, k in reconcile_flagged.items() if i not in soak_flagged}
    report_totals = report.get("totals", {})
    totals = {soak_kind: report_totals.get(name) for soak_kind, name in RECONCILE_NAMES.items()}
    totals.update({name: report_totals.get(name) for name in ("expected", "delivered", "cancelled",
                                                              "cancelled_too_late", "twice_written")})
    return Comparison(True, exit_code, totals, soak_only, reconcile_only, error)


def failures(findings: Findings, *, crashes: int, stall_limit_s: float, comparison: Comparison | None,
             missing_fault_kinds: Iterable[str] = (), buffer_error: str | None = None,
             upgrade_problems: Iterable[str] = ()) -> list[str]:
    """Why the soak fails, one line each; empty when it passes.

    ``upgrade_problems``: what went wrong with the upgrade roll (``UpgradeRoll.problems``), one line each.

    ``buffer_error``: why the buffer could not be read after the run (:attr:`BufferScan.error`):
    the puts it holds twice were then not counted.
    """
    reasons = [f"{findings.counts[kind]} {kind.replace('_', ' ')}" for kind in ANOMALY_KINDS if findings.counts[kind]]
    if buffer_error is not None:
        reasons.append(f"the buffer was not read to its end, puts written twice not counted: {buffer_error}")
    if crashes:
        reasons.append(f"{crashes} node crash(es) no fault caused")
    worst = findings.stall_beyond_outages
    if worst is not None and worst.beyond_outages_s > stall_limit_s:
        outage = (f" ({worst.outage_ms / 1000:.1f}s of it with Kafka or ZooKeeper down, "
                  f"{worst.beyond_outages_s:.1f}s beyond)" if worst.outage_ms else "")
        reasons.append(f"delivery stalled {worst.seconds:.1f}s{outage}, longer than {stall_limit_s:.0f}s")
    if comparison is not None and not comparison.agrees:
        if not comparison.ran:
            reasons.append(f"the reconciliation did not run: {comparison.error}")
        else:
            disputed = len(comparison.soak_only) + len(comparison.reconcile_only)
            reasons.append(f"the reconciliation disagrees on {disputed} id(s)")
    missing = list(missing_fault_kinds)
    if missing:
        reasons.append(f"faults never injected: {', '.join(missing)}")
    return reasons + list(upgrade_problems)
