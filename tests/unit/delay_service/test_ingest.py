"""Ingest (delay_service/ingest.py) without a server: frames into the stores, where ingest stands, lag and readiness.

The reader process, the buffer's end offsets and the dead-letter ledger are stand-ins (``spec_set``); the
stores are real (RocksDB in tmp_path) and the frames are what a reader sends (reader.Frame). The reader
process itself, killed and replaced, is in tests/integration/test_reader_process.py.
"""

from __future__ import annotations

import time
from unittest import mock

import pytest
from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException

from delayq import Settings
from delayq.delay_service import ingest as ingest_module
from delayq.delay_service.dead_letters import DeadLetterLedger
from delayq.delay_service.ingest import Ingest, ShardFeed
from delayq.delay_service.metrics import NodeMetrics
from delayq.delay_service.reader import Batch, BufferReader, Frame, ReaderConfig, ReaderGone, ShardBatch
from delayq.delay_service.topics import AskedEnds, EndOffsets
from delayq.store import TimeIndex, put_frame

PARTITIONS = 4  # the buffer's
SHARDS = 2  # shard 0 holds partitions 0 and 2, shard 1 partitions 1 and 3
DUE = 1_800_000_000_000  # 2027-01-15T08:00:00Z


class Readers:
    """Stand-in reader processes: each one started sends the frames (or raises the errors) queued, then nothing."""

    def __init__(self) -> None:
        self.queued: list[Frame | Exception] = []
        self.started: list[tuple[ReaderConfig, mock.Mock]] = []

    def __call__(self, config: ReaderConfig) -> mock.Mock:
        reader = mock.create_autospec(BufferReader, spec_set=True, instance=True)
        reader.receive.side_effect = lambda timeout_s: self._next()
        self.started.append((config, reader))
        return reader

    def _next(self) -> Frame | None:
        if not self.queued:
            return None
        item = self.queued.pop(0)
        if isinstance(item, Exception):
            raise item
        return item


@pytest.fixture
def readers(monkeypatch) -> Readers:
    readers = Readers()
    monkeypatch.setattr(ingest_module, "BufferReader", readers)
    monkeypatch.setattr(ingest_module, "DeadLetterLedger", lambda settings: mock.Mock(spec_set=DeadLetterLedger))
    monkeypatch.setattr(ingest_module, "READER_RESTART_S", 0)
    return readers


@pytest.fixture
def ingest(readers) -> Ingest:
    end_offsets = mock.Mock(spec_set=[*dir(EndOffsets), "settings", "partitions"])
    end_offsets.partitions = list(range(PARTITIONS))
    ingest = Ingest(Settings(), SHARDS, NodeMetrics(), end_offsets)
    yield ingest
    ingest.close()


@pytest.fixture
def stores(tmp_path):
    opened: dict[int, TimeIndex] = {}

    def store(shard: int) -> TimeIndex:
        opened[shard] = TimeIndex(tmp_path / str(shard))
        return opened[shard]

    yield store
    for store_ in opened.values():
        store_.close()


def feed_of(ingest: Ingest, shard: int, store: TimeIndex, **callbacks) -> ShardFeed:
    return ingest.feed(shard, store, ingest.metrics.shard(shard), **callbacks)


def answered(ends: dict[int, int] | Exception) -> mock.Mock:
    """End offsets asked for, answered (or failed) by now."""
    asked = mock.Mock(spec_set=AskedEnds)
    asked.done.return_value = True
    if isinstance(ends, Exception):
        asked.result.side_effect = ends
    else:
        asked.result.return_value = ends
    return asked


def moved_to(positions: dict[int, int], held: dict[int, tuple[int, int]] | None = None, generation: int = 0) -> Frame:
    """A positions-only frame: the reader moved on without a record (past transaction markers)."""
    return Frame(positions, None, held or {}, generation)


def test_held_shards_are_read_from_where_their_stores_are(ingest, readers, stores):
    zero, one = stores(0), stores(1)
    zero.apply([], {0: 5})
    ingest.hold([feed_of(ingest, 0, zero), feed_of(ingest, 1, one)])

    (config, _reader), = readers.started
    assert config.partitions == [0, 1, 2, 3] and (config.partition_count, config.shards) == (PARTITIONS, SHARDS)
    assert config.start == {0: 5, 2: OFFSET_BEGINNING, 1: OFFSET_BEGINNING, 3: OFFSET_BEGINNING}
    assert ingest.positions() == {0: 5, 2: 0, 1: 0, 3: 0}
    assert ingest.feeds[0].positions() == {0: 5, 2: 0}


def test_holding_other_shards_tells_the_same_reader_and_drops_what_it_read_before(ingest, readers, stores):
    zero, one = stores(0), stores(1)
    ingest.hold([feed_of(ingest, 0, zero)])
    one.apply([], {3: 6})
    ingest.hold([feed_of(ingest, 1, one)])

    (config, reader), = readers.started
    assert config.generation == 0
    reader.reassign.assert_called_once_with(1, [1, 3], {1: OFFSET_BEGINNING, 3: 6})
    reader.stop.assert_not_called()
    assert ingest.positions() == {1: 0, 3: 6}
    ops = [put_frame("id-1", DUE, b"one", 3, None, None)]
    readers.queued += [Frame({0: 4}, Batch({0: ShardBatch(ops, {0: 4}, [], DUE)}, {b"put": 1}, records=1), {}, 0),
                       moved_to({1: 2, 3: 6}, generation=1)]
    assert ingest.poll_once(timeout_s=0) == 0, "a frame of shard 0, read before it was dropped"
    assert zero.pending_count() == 0 and ingest.positions() == {1: 0, 3: 6}
    ingest.poll_once(timeout_s=0)
    assert ingest.positions() == {1: 2, 3: 6}

    ingest.hold([])
    reader.reassign.assert_called_with(2, [], {})
    assert len(readers.started) == 1 and ingest.poll_once(timeout_s=0) == 0


def test_a_reader_gone_when_told_the_shards_held_is_replaced_by_one_reading_them(ingest, readers, stores):
    ingest.hold([feed_of(ingest, 0, stores(0))])
    (_, dead), = readers.started
    dead.reassign.side_effect = ReaderGone("the buffer reader exited with -9 (BrokenPipeError)")
    ingest.hold([feed_of(ingest, 1, stores(1))])

    (_, _), (config, _) = readers.started
    dead.stop.assert_called_once()
    assert config.partitions == [1, 3] and config.generation == 1


def test_a_frame_goes_into_its_shards_store_in_one_batch_and_moves_ingest_on(ingest, readers, stores):
    zero = stores(0)
    earlier: list[int] = []
    settled: list[list[str]] = []
    ingest.hold([feed_of(ingest, 0, zero, on_earlier_due=earlier.append, on_settled=settled.append)])
    ops = [put_frame("id-1", DUE, b"one", 3, None, None), put_frame("id-2", DUE + 5, b"two", 4, None, None)]
    readers.queued.append(Frame({0: 5, 2: 1}, Batch({0: ShardBatch(ops, {0: 5, 2: 1}, ["id-0"], DUE)},
                                                    {b"put": 2}, records=2), {}))

    assert ingest.poll_once(timeout_s=0) == 2
    assert zero.pending_count() == 2 and zero.offsets() == {0: 5, 2: 1}
    assert earlier == [DUE] and settled == [["id-0"]]
    assert ingest.positions() == {0: 5, 2: 1}
    assert ingest.metrics.registry.get_sample_value("delayq_ingested_total", {"op": "put"}) == 2
    assert ingest.metrics.registry.get_sample_value("delayq_pending", {"shard": "0"}) == 2


def test_a_frame_without_records_moves_positions_and_says_the_partitions_held_for_an_upgrade(ingest, readers,
                                                                                              stores):
    zero = stores(0)
    ingest.hold([feed_of(ingest, 0, zero)])
    readers.queued.append(moved_to({0: 9}, held={2: (7, 3)}))

    assert ingest.poll_once(timeout_s=0) == 0
    assert ingest.positions() == {0: 9, 2: 0} and zero.offsets() == {}, "the store's offsets move with records only"
    assert ingest.held_for_upgrade == {2: (7, 3)}
    assert ingest.metrics.registry.get_sample_value("delayq_partitions_awaiting_upgrade") == 1


def test_a_reader_that_died_is_replaced_by_one_reading_on_from_the_stores(ingest, readers, stores):
    zero = stores(0)
    ingest.hold([feed_of(ingest, 0, zero)])
    zero.apply([], {0: 4, 2: 2})
    readers.queued.append(ReaderGone("the buffer reader exited with -9"))

    assert ingest.poll_once(timeout_s=0) == 0
    (_, dead), (config, _) = readers.started
    dead.stop.assert_called_once()
    assert config.start == {0: 4, 2: 2}


def test_a_shards_lag_is_what_its_partitions_hold_past_ingest_and_it_is_ready_once_caught_up(ingest, readers,
                                                                                              stores):
    ready: list[int] = []
    ingest.hold([feed_of(ingest, 0, stores(0), on_ready=lambda: ready.append(0)),
                 feed_of(ingest, 1, stores(1), on_ready=lambda: ready.append(1))])
    zero, one = ingest.feeds[0], ingest.feeds[1]

    assert ingest.refresh_lag(answered({0: 4, 1: 0, 2: 3, 3: 0})) == 7
    assert (zero.lag, one.lag) == (7, 0) and ready == [1], "shard 1's partitions are empty: it is caught up"
    assert not zero.caught_up and not zero.ready and not ingest.caught_up
    assert ingest.metrics.registry.get_sample_value("delayq_buffer_lag", {"shard": "0"}) == 7

    readers.queued.append(moved_to({0: 4, 2: 3}))
    ingest.poll_once(timeout_s=0)
    assert ingest.refresh_lag(answered({0: 4, 1: 0, 2: 3, 3: 0})) == 0
    assert zero.ready and ingest.caught_up and ready == [1, 0]
    ingest.refresh_lag(answered({0: 4, 1: 0, 2: 3, 3: 0}))
    assert ready == [1, 0], "on_ready once"


def test_under_steady_traffic_a_shard_past_where_its_partitions_ended_a_refresh_ago_is_caught_up(ingest, readers,
                                                                                                  stores):
    ingest.hold([feed_of(ingest, 0, stores(0))])
    feed = ingest.feeds[0]
    ingest.refresh_lag(answered({0: 10, 2: 0}))
    assert not feed.caught_up

    readers.queued.append(moved_to({0: 10}))
    ingest.poll_once(timeout_s=0)
    ingest.refresh_lag(answered({0: 15, 2: 0}))  # more came meanwhile
    assert feed.lag == 5 and feed.caught_up and feed.ready

    ingest.refresh_lag(answered({0: 30, 2: 0}))  # ingest stood still since
    assert feed.lag == 20 and not feed.caught_up
    assert feed.ready, "once ready, a shard may be mastered for as long as the node holds it"


def test_end_offsets_that_cannot_be_read_keep_the_last_lag_and_say_why_until_they_can(ingest, readers, stores):
    ingest.hold([feed_of(ingest, 0, stores(0))])
    assert ingest.refresh_lag(answered({0: 2, 2: 1})) == 3

    down = KafkaException(KafkaError(KafkaError.REQUEST_TIMED_OUT, "no broker answered"))
    assert ingest.refresh_lag(answered(down)) == 3
    assert ingest.failing == "cannot read the buffer's end offsets: no broker answered"
    assert ingest.failing_since is not None
    assert ingest.refresh_lag(answered(down)) == 3
    assert ingest.refresh_lag(answered({0: 2, 2: 2})) == 4
    assert ingest.failing is None and ingest.failing_since is None


def test_held_back_partitions_are_read_to_the_last_stable_offset_but_not_to_the_target(ingest, readers, stores):
    ingest.hold([feed_of(ingest, 0, stores(0)), feed_of(ingest, 1, stores(1))])
    readers.queued.append(moved_to({0: 5, 1: 9, 2: 8, 3: 2}))
    ingest.poll_once(timeout_s=0)

    targets = {0: 9, 1: 9, 2: 9, 3: 9}
    stable = {0: 5, 1: 9, 2: 9, 3: 1}
    # 0: an open transaction at 5 holds the rest back; 1: read; 2: not yet at the stable offset; 3: held back too.
    assert ingest.held_back(targets, stable) == [0, 3]
    assert ingest.feeds[0].held_back(targets, stable) == [0, 3], "a feed asks ingest"


def test_wait_until_read_says_whether_ingest_read_the_targets_in_time(ingest, readers, stores):
    ingest.hold([feed_of(ingest, 0, stores(0))])
    readers.queued.append(moved_to({0: 5, 2: 8}))
    ingest.poll_once(timeout_s=0)

    assert ingest.wait_until_read({0: 5, 2: 8}, timeout_s=0, abandon=lambda: False)
    assert not ingest.wait_until_read({0: 6}, timeout_s=0.05, abandon=lambda: False)
    assert not ingest.wait_until_read({0: 6}, timeout_s=60, abandon=lambda: True), "abandoned at once"


def test_a_closed_ingest_stops_its_reader_and_its_ledger_and_reads_no_more(ingest, readers, stores):
    ingest.hold([feed_of(ingest, 0, stores(0))])
    ingest.close()

    (_, reader), = readers.started
    reader.stop.assert_called_once()
    ingest.ledger.close.assert_called_once()
    readers.queued.append(moved_to({0: 5}))
    assert ingest.poll_once(timeout_s=0) == 0 and ingest.positions() == {0: 0, 2: 0}
    ingest.hold([feed_of(ingest, 1, stores(1))])
    assert len(readers.started) == 1


def test_a_reader_standing_still_below_the_buffers_end_is_taken_for_stuck_and_replaced(ingest, readers, stores,
                                                                                       monkeypatch, caplog):
    monkeypatch.setattr(ingest_module, "READER_STUCK_S", 0.2)
    ingest.hold([feed_of(ingest, 0, stores(0))])  # partitions 0 and 2
    ends = {0: 5, 2: 7}
    readers.queued.append(moved_to({0: 3, 2: 7}, generation=ingest._generation))
    ingest.poll_once(timeout_s=0)
    ingest.refresh_lag(answered(ends))
    time.sleep(0.25)
    readers.queued.append(moved_to({0: 4, 2: 7}, generation=ingest._generation))
    ingest.poll_once(timeout_s=0)
    ingest.refresh_lag(answered(ends))
    assert len(readers.started) == 1, "a reader that moves is reading, however slowly"

    time.sleep(0.1)
    ingest.refresh_lag(answered({0: 5, 2: 9}))
    assert len(readers.started) == 1, "0 stood still 0.1 s, and 2 only now has more to read"
    time.sleep(0.15)
    ingest.refresh_lag(answered({0: 5, 2: 9}))
    (_, stuck), (config, _) = readers.started
    stuck.stop.assert_called_once()
    assert config.start == {0: OFFSET_BEGINNING, 2: OFFSET_BEGINNING}, "the new reader reads from the store's offsets"
    assert ("the buffer reader read nothing of partitions [0] for 0s while Kafka had records there "
            "(last stable offsets [5], read up to [4]); starting another from the store's offsets") in caplog.text


def test_a_partition_at_its_end_or_held_for_an_upgrade_may_stand_still(ingest, readers, stores, monkeypatch):
    monkeypatch.setattr(ingest_module, "READER_STUCK_S", 0.2)
    ingest.hold([feed_of(ingest, 0, stores(0))])
    readers.queued.append(moved_to({0: 5, 2: 3}, held={2: (3, 99)}, generation=ingest._generation))
    ingest.poll_once(timeout_s=0)
    for _ in range(3):
        ingest.refresh_lag(answered({0: 5, 2: 10}))
        time.sleep(0.15)
    assert len(readers.started) == 1
