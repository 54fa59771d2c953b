"""A term's progress: each commit's metrics, and the cursor written at most once a second while busy."""

from __future__ import annotations

from unittest import mock

from delayq import wire
from delayq.delay_service import progress as progress_module
from delayq.delay_service import stored
from delayq.delay_service.metrics import NodeMetrics
from delayq.delay_service.progress import Progress
from delayq.delay_service.routing import Outgoing, Undeliverable
from delayq.election import Cursor
from delayq.store import StoredEntry

DUE_MS = 1_795_000_000_000


def item(n: int) -> Outgoing:
    delay_id = wire.new_delay_id()
    message = wire.Envelope(delay_id, "orders", DUE_MS + n, b"v")
    return Outgoing(StoredEntry(delay_id, DUE_MS + n, b""), stored.PendingMessage(0, n, message), 0)


def test_a_commit_counts_deliveries_dead_letters_and_lateness_and_writes_the_cursor(monkeypatch):
    cursor = mock.Mock(spec_set=Cursor)
    node_metrics = NodeMetrics()
    progress = Progress("node-a", cursor, node_metrics.shard(0))
    items = [item(0), item(1)]
    dead = [Undeliverable(item(2), wire.Reason.EXPIRED, "expired")]

    progress.committed(3, items, dead)

    assert progress.delivered_total == 2
    sample = node_metrics.registry.get_sample_value
    assert sample("delayq_delivered_total", {"shard": "0"}) == 2
    assert sample("delayq_dead_lettered_total", {"shard": "0", "reason": wire.Reason.EXPIRED.value}) == 1
    assert sample("delayq_delivery_lateness_seconds_count") == 2
    record = cursor.write.call_args.args[0]
    assert (record.epoch, record.node_id, record.delivered) == (3, "node-a", 2)
    assert record.last_id == items[-1].entry.delay_id and record.watermark_deliver_at_ms == DUE_MS + 1


def test_the_cursor_is_written_at_most_once_a_second_while_busy_and_once_more_when_idle(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(progress_module.time, "monotonic", lambda: clock[0])
    cursor = mock.Mock(spec_set=Cursor)
    progress = Progress("node-a", cursor, NodeMetrics().shard(0))

    progress.committed(3, [item(0)], [])
    clock[0] += 0.5
    progress.committed(3, [item(1)], [])
    assert cursor.write.call_count == 1, "busy: one write a second"

    progress.write_cursor(3)  # idle
    progress.write_cursor(3)
    assert cursor.write.call_count == 2, "the last batch once, not again"
    assert cursor.write.call_args.args[0].delivered == 2


def test_a_cursor_of_another_epoch_is_not_written():
    cursor = mock.Mock(spec_set=Cursor)
    progress = Progress("node-a", cursor, NodeMetrics().shard(0))
    progress.committed(3, [item(0)], [])

    progress.write_cursor(4)

    assert cursor.write.call_count == 1
