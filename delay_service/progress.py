"""What a shard master's term has delivered: each commit's metrics, and its cursor in ZooKeeper.

The cursor (``delayq status`` shows it) records the last committed batch. A write per
transaction would cost a ZooKeeper round trip per batch, so it is written at most once
a second while the master is busy, and once more when it goes idle.
"""

from __future__ import annotations

import time

from delayq.clock import now_ms
from delayq.election import Cursor, CursorRecord

from .metrics import ShardMetrics
from .routing import Outgoing, Undeliverable

CURSOR_WRITE_S = 1.0


class Progress:
    """The term's delivered count, the metrics of each commit, and when the cursor is written."""

    def __init__(self, node_id: str, cursor: Cursor, metrics: ShardMetrics):
        self.node_id = node_id
        self.cursor = cursor
        self.metrics = metrics
        self.delivered_total = 0
        self._cursor_due = 0.0  # when (monotonic s) to write the cursor again
        self._last_commit: CursorRecord | None = None
        self._cursor_written: CursorRecord | None = None

    def committed(self, epoch: int, outgoing: list[Outgoing], dead: list[Undeliverable]) -> None:
        """Count a committed transaction: delivered, dead-lettered, lateness (commit time vs due), the last minute's."""
        committed_at = now_ms()
        lateness_s = [max(0, committed_at - item.entry.deliver_at_ms) / 1000 for item in outgoing]
        self.metrics.lateness.observe_many(lateness_s)
        self.metrics.recent.add(committed_at, lateness_s)
        self.metrics.delivered.inc(len(outgoing))
        for undeliverable in dead:
            self.metrics.dead_lettered.labels(undeliverable.code.value).inc()
        self.delivered_total += len(outgoing)
        last = (outgoing or [d.item for d in dead])[-1].entry
        self._last_commit = CursorRecord(epoch=epoch, node_id=self.node_id,
                                         watermark_deliver_at_ms=last.deliver_at_ms, last_id=last.delay_id,
                                         delivered=self.delivered_total, committed_at_ms=committed_at)
        if time.monotonic() >= self._cursor_due:
            self.write_cursor(epoch)

    def write_cursor(self, epoch: int) -> None:
        """Record the last committed batch in ZooKeeper, if not yet.

        Raises:
            FencedError: a newer master wrote the cursor.
        """
        record = self._last_commit
        if record is None or record is self._cursor_written or record.epoch != epoch:
            return
        self.cursor.write(record)
        self._cursor_written = record
        self._cursor_due = time.monotonic() + CURSOR_WRITE_S
