"""Totals, per-topic and per-hour figures, lateness percentiles and histogram, summed on the driver.

Spark hands over one small row per (topic, hour of due time, lateness value) with the
counts of that group; everything the report shows is summed from those rows here.
Lateness values are exact to the millisecond below one second and kept to three
significant digits above (so a group has at most a few thousand distinct values),
which makes the percentiles exact below one second and within 0.5% above.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

# Why a cancel or reschedule that lost to a delivery was too late (the job's TOO_LATE_EVIDENCE).
TOO_LATE_EVIDENCE = ("after_due", "after_delivery", "by_cutoff")
COUNT_FIELDS = ("expected", "delivered", "delivered_records", "duplicates", "duplicate_records", "missing",
                "undeliverable", "unexpected", "unknown", "early", "cancel_ignored", "reordered",
                "cancelled", "cancelled_too_late", "rescheduled_too_late",
                *(f"{total}_{evidence}" for total in ("cancelled_too_late", "rescheduled_too_late")
                  for evidence in TOO_LATE_EVIDENCE),
                "in_grace", "already_due_when_written", "twice_written")
# Lateness histogram bucket edges in ms; the first bucket is everything below -1 s, the last from 1 min up.
LATENESS_EDGES_MS = (-1000, -100, -10, 0, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10_000, 60_000)
HOUR_MS = 3_600_000


def percentile(lateness: Mapping[int, int], fraction: float) -> int | None:
    """The nearest-rank percentile of a value -> count table: the smallest value with at least
    ``fraction`` of all counts at or below it. None for an empty table.

    Raises:
        ValueError: ``fraction`` is not in (0, 1].
    """
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    total = sum(lateness.values())
    if not total:
        return None
    rank = math.ceil(fraction * total)
    seen = 0
    for value in sorted(lateness):
        seen += lateness[value]
        if seen >= rank:
            return value
    return max(lateness)


def histogram(lateness: Mapping[int, int]) -> list[dict[str, Any]]:
    """Counts per lateness bucket (``LATENESS_EDGES_MS``), open-ended at both ends."""
    edges = (None, *LATENESS_EDGES_MS, None)
    counts = [0] * (len(edges) - 1)
    for value, count in lateness.items():
        index = sum(1 for edge in LATENESS_EDGES_MS if value >= edge)
        counts[index] += count
    return [{"from_ms": edges[i], "to_ms": edges[i + 1], "count": counts[i]} for i in range(len(counts))]


@dataclass
class Tally:
    """The counts and the lateness values of one group of judged ids.

    ``lateness`` holds first delivery minus due time of the delivered ids, except those
    whose put was written when it was already due (its timestamp at or after its due
    time): ``put_to_delivery`` holds first delivery minus the put's timestamp of those.
    ``too_late_gap`` holds, per cancel or reschedule too late by the master's cutoff only,
    how long before the due time it was created.
    """

    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNT_FIELDS, 0))
    lateness: Counter = field(default_factory=Counter)
    put_to_delivery: Counter = field(default_factory=Counter)
    too_late_gap: Counter = field(default_factory=Counter)

    def add(self, row: Mapping[str, Any]) -> None:
        for name in COUNT_FIELDS:
            self.counts[name] += int(row.get(name) or 0)
        if row["lateness_key"] is not None:
            self.lateness[int(row["lateness_key"])] += int(row["lateness_n"])
        if row.get("written_key") is not None:
            self.put_to_delivery[int(row["written_key"])] += int(row["written_n"])
        if row.get("gap_key") is not None:
            self.too_late_gap[int(row["gap_key"])] += int(row["gap_n"])

    def lateness_ms(self) -> dict[str, int | None]:
        """p50, p90, p99, max and min of the first-delivery lateness, and how many ids it covers."""
        return {"p50": percentile(self.lateness, 0.5), "p90": percentile(self.lateness, 0.9),
                "p99": percentile(self.lateness, 0.99), "max": max(self.lateness, default=None),
                "min": min(self.lateness, default=None), "count": sum(self.lateness.values())}

    def put_to_delivery_ms(self) -> dict[str, int | None]:
        """Puts written when already due: how many were expected, and p50, p99, max of put to first delivery."""
        table = self.put_to_delivery
        return {"count": self.counts["already_due_when_written"], "delivered": sum(table.values()),
                "p50": percentile(table, 0.5), "p99": percentile(table, 0.99), "max": max(table, default=None)}

    def too_late_gap_ms(self) -> dict[str, int | None]:
        """Ids with a cancel or reschedule too late by the cutoff only: how many, and p50, max of
        how long before the due time that write was created."""
        table = self.too_late_gap
        return {"count": sum(table.values()), "p50": percentile(table, 0.5), "max": max(table, default=None)}

    def as_dict(self) -> dict[str, Any]:
        return {**self.counts, "lateness_ms": self.lateness_ms()}


@dataclass
class Summary:
    """Everything the report shows that is not a list of ids."""

    overall: Tally
    by_topic: dict[str, Tally]
    per_hour: dict[int, Tally]

    @classmethod
    def of(cls, rows: Iterable[Mapping[str, Any]]) -> Summary:
        """Sum the (topic, hour_ms, lateness_key) group rows Spark returned."""
        overall = Tally()
        by_topic: dict[str, Tally] = {}
        per_hour: dict[int, Tally] = {}
        for row in rows:
            overall.add(row)
            by_topic.setdefault(row["topic"], Tally()).add(row)
            per_hour.setdefault(int(row["hour_ms"]), Tally()).add(row)
        return cls(overall, dict(sorted(by_topic.items(), key=lambda item: item[0] or "")),
                   dict(sorted(per_hour.items())))
