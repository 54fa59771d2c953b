"""The RocksDB time index (delayq.store): real RocksDB in tmp_path, no Kafka needed."""

from __future__ import annotations

import inspect
import marshal
import random
import subprocess
import sys
import textwrap
import threading

import pytest
import rocksdict

from delayq.store import (
    ApplyResult,
    Malformed,
    MalformedEntry,
    Put,
    Remove,
    StoredEntry,
    StoreError,
    StoreFormatError,
    StoreOptions,
    TimeIndex,
    decode,
    malformed_frame,
    producer_write,
    put_frame,
    remove_frame,
)
from delayq.wire import COPY_WINDOW_MS

T0 = 1_800_000_000_000


@pytest.fixture
def store(tmp_path):
    with TimeIndex(tmp_path / "store") as index:
        yield index


def ids(entries: list[StoredEntry]) -> list[str]:
    return [entry.delay_id for entry in entries]


def everything(index: TimeIndex) -> list[StoredEntry]:
    return index.due(2**63 - 1, 10**9)


# -- order, due, limit, skip ---------------------------------------------------


def test_due_orders_by_time_then_id_including_same_millisecond_ties(store):
    store.apply([Put("c", T0 + 5, b"3"), Put("b", T0 + 5, b"2"), Put("z", T0 + 1, b"1"),
                 Put("a", T0 + 9, b"4"), Put("bb", T0 + 5, b"x")], {})

    assert [(e.deliver_at_ms, e.delay_id) for e in everything(store)] == [
        (T0 + 1, "z"), (T0 + 5, "b"), (T0 + 5, "bb"), (T0 + 5, "c"), (T0 + 9, "a")]


def test_due_stops_at_up_to_ms_inclusive_and_at_limit(store):
    store.apply([Put(f"id{i}", T0 + i, b"p") for i in range(10)], {})

    assert ids(store.due(T0 + 3, 100)) == ["id0", "id1", "id2", "id3"]
    assert ids(store.due(T0 + 8, 2)) == ["id0", "id1"]
    assert store.due(T0 - 1, 100) == []
    assert store.due(T0 + 8, 0) == []
    assert store.due(T0, 5) == [StoredEntry("id0", T0, b"p")]


def test_due_leaves_out_skipped_ids(store):
    store.apply([Put(f"id{i}", T0 + i, b"p") for i in range(10)], {})

    assert ids(store.due(T0 + 100, 3, skip={"id0", "id1", "id3"})) == ["id2", "id4", "id5"]
    assert store.next_due_ms(skip={"id0", "id1"}) == T0 + 2
    assert store.next_due_ms() == T0


def test_skipped_ids_reappear_when_no_longer_skipped(store):
    store.apply([Put(f"id{i}", T0 + i, b"p") for i in range(10)], {})
    skip = {f"id{i}" for i in range(6)}
    assert ids(store.due(T0 + 100, 2, skip=skip)) == ["id6", "id7"]
    assert ids(store.due(T0 + 100, 2, skip=skip)) == ["id6", "id7"]

    skip.discard("id2")

    assert ids(store.due(T0 + 100, 2, skip=skip)) == ["id2", "id6"]
    assert ids(store.due(T0 + 100, 2)) == ["id0", "id1"]


def test_new_entry_inside_a_skipped_run_is_found(store):
    store.apply([Put(f"id{i}", T0 + 10 * i, b"p") for i in range(10)], {})
    skip = {f"id{i}" for i in range(5)}
    assert ids(store.due(T0 + 1000, 1, skip=skip)) == ["id5"]

    store.apply([Put("early", T0 + 15, b"p")], {})

    assert ids(store.due(T0 + 1000, 2, skip=skip)) == ["early", "id5"]


def test_identical_reput_of_a_skipped_id_keeps_it_findable(store):
    store.apply([Put(f"id{i}", T0 + i, b"p") for i in range(6)], {})
    skip = {"id0", "id1", "id2"}
    assert ids(store.due(T0 + 100, 1, skip=skip)) == ["id3"]

    assert store.apply([Put("id1", T0 + 1, b"p")], {}) == ApplyResult(0, 0, 0, 1)

    assert ids(store.due(T0 + 100, 2, skip={"id0", "id2"})) == ["id1", "id3"]


def test_rescheduled_skipped_id_shows_once_at_its_new_time(store):
    store.apply([Put(f"id{i}", T0 + i, b"p") for i in range(6)], {})
    skip = {"id0", "id1"}
    assert ids(store.due(T0 + 100, 1, skip=skip)) == ["id2"]

    store.apply([Put("id0", T0 + 50, b"q")], {})

    assert ids(store.due(T0 + 100, 10, skip={"id1"})) == ["id2", "id3", "id4", "id5", "id0"]


def test_due_skips_the_front_after_removes_and_still_sees_earlier_puts(store):
    store.apply([Put(f"id{i:03}", T0 + i, b"p") for i in range(100)], {})
    store.apply([Remove(f"id{i:03}") for i in range(60)], {})
    assert ids(store.due(T0 + 1000, 1)) == ["id060"]

    store.apply([Put("earliest", T0 - 5, b"p")], {})

    assert ids(store.due(T0 + 1000, 2)) == ["earliest", "id060"]
    assert store.next_due_ms() == T0 - 5


def test_due_and_apply_agree_with_a_model_under_random_ops(store):
    rng = random.Random(2024)
    model: dict[str, tuple[int, bytes]] = {}
    pool = [f"id{i:02}" for i in range(40)]
    for step in range(300):
        ops = []
        for _ in range(rng.randint(1, 6)):
            delay_id = rng.choice(pool)
            if rng.random() < 0.6:
                op = Put(delay_id, T0 + rng.randint(0, 50), rng.choice([b"a", b"b"]))
                model[delay_id] = (op.deliver_at_ms, op.payload)
            else:
                op = Remove(delay_id)
                model.pop(delay_id, None)
            ops.append(op)
        store.apply(ops, {0: step + 1})
        # The master's skip set: a prefix of what is due, sometimes reset.
        ordered = sorted(model.items(), key=lambda item: (item[1][0], item[0]))
        skip = {delay_id for delay_id, _ in ordered[:rng.randint(0, 8)]} if rng.random() < 0.8 else set()
        up_to = T0 + rng.randint(0, 50)
        limit = rng.randint(1, 10)
        expected = [StoredEntry(i, at, p) for i, (at, p) in ordered if at <= up_to and i not in skip][:limit]

        assert store.due(up_to, limit, skip=skip) == expected, f"step {step}"
        assert store.pending_count() == len(model)
    assert everything(store) == [StoredEntry(i, at, p) for i, (at, p) in
                                 sorted(model.items(), key=lambda item: (item[1][0], item[0]))]


def test_concurrent_puts_below_the_front_are_never_hidden_from_later_scans(store):
    store.apply([Put(f"late{i}", T0 + 10_000 + i, b"p") for i in range(50)], {})
    stop = threading.Event()

    def scan():
        while not stop.is_set():
            store.due(T0 + 20_000, 5)
            store.next_due_ms()

    reader = threading.Thread(target=scan)
    reader.start()
    try:
        for i in range(1000):
            store.apply([Put(f"early{i:03}", T0 + 10_000 - i, b"p")], {})
    finally:
        stop.set()
        reader.join()

    assert len(everything(store)) == 1050
    assert store.due(T0 + 20_000, 1)[0].delay_id == "early999"


# -- apply: add, move, remove, idempotence -------------------------------------------------


def test_put_of_a_stored_id_at_another_time_moves_it_and_the_id_index_follows(store):
    store.apply([Put("a", T0 + 100, b"old"), Put("b", T0 + 50, b"p")], {})

    result = store.apply([Put("a", T0 + 10, b"new")], {})

    assert result == ApplyResult(added=0, moved=1, removed=0, unchanged=0)
    assert store.get("a") == StoredEntry("a", T0 + 10, b"new")
    assert ids(everything(store)) == ["a", "b"]
    assert store.pending_count() == 2


def test_put_at_the_same_time_with_another_payload_replaces_it(store):
    store.apply([Put("a", T0, b"old")], {})

    assert store.apply([Put("a", T0, b"new")], {}) == ApplyResult(0, 1, 0, 0)
    assert everything(store) == [StoredEntry("a", T0, b"new")]


def test_remove_drops_the_entry_and_remove_of_an_absent_id_is_unchanged(store):
    store.apply([Put("a", T0, b"p"), Put("b", T0 + 1, b"p")], {})

    assert store.apply([Remove("a"), Remove("never")], {}) == ApplyResult(0, 0, 1, 1)
    assert store.get("a") is None
    assert ids(everything(store)) == ["b"]
    assert store.pending_count() == 1


def test_a_done_of_an_older_version_keeps_the_newer_put_and_marks_the_id_shadowed(store):
    # put v711, reschedule v777, then the done of v711 (the master picked the old version).
    store.apply([Put("a", T0, b"old", version=711), Put("a", T0 + 50, b"new", version=777)], {0: 778})
    result = store.apply([Remove("a", version=711)], {0: 781})

    assert result == ApplyResult(added=0, moved=0, removed=0, unchanged=0, kept=1)
    assert store.get("a") == StoredEntry("a", T0 + 50, b"new", 777)
    assert store.pending_count() == 1
    assert store.shadowed() == {"a": None}


def test_a_done_of_the_stored_version_or_a_cancel_removes_and_clears_the_shadow_mark(store):
    store.apply([Put("a", T0, b"new", version=9), Remove("a", version=3)], {})
    assert store.shadowed() == {"a": None}

    store.apply([Remove("a", version=9)], {})
    assert store.get("a") is None and store.shadowed() == {}

    store.apply([Put("b", T0, b"p", version=9), Remove("b", version=3), Remove("b")], {})
    assert store.get("b") is None and store.shadowed() == {}


def test_a_later_put_of_a_shadowed_id_clears_its_mark_and_the_mark_survives_reopen(tmp_path):
    with TimeIndex(tmp_path / "s") as index:
        index.apply([Put("a", T0, b"new", version=9), Remove("a", version=3)], {})
    with TimeIndex(tmp_path / "s") as index:
        assert index.shadowed() == {"a": None}
        index.apply([Put("a", T0, b"new again", version=12)], {})
        assert index.shadowed() == {}
        assert index.get("a") == StoredEntry("a", T0, b"new again", 12)


def test_malformed_records_wait_in_the_store_until_the_ledger_says_they_are_dead_lettered(tmp_path):
    with TimeIndex(tmp_path / "s") as index:
        index.apply([Put("a", T0, b"p", version=0), Malformed(0, 1, b"bad one"), Malformed(1, 4, b"bad two")],
                    {0: 2, 1: 5})
        assert index.malformed_count == 2
    with TimeIndex(tmp_path / "s") as index:  # they survive a restart, in (partition, offset) order
        assert index.malformed() == [MalformedEntry(0, 1, b"bad one"), MalformedEntry(1, 4, b"bad two")]
        assert index.malformed(limit=1) == [MalformedEntry(0, 1, b"bad one")]
        assert index.forget_malformed({0: 1, 1: 9}) == 1  # offset 1 of partition 0 is not below 1
        assert index.malformed() == [MalformedEntry(0, 1, b"bad one")] and index.malformed_count == 1
        assert index.forget_malformed({0: 2}) == 1
        assert index.malformed() == [] and index.malformed_count == 0
        assert index.get("a") == StoredEntry("a", T0, b"p", 0)


def test_a_malformed_record_of_a_pending_id_shadows_it_and_one_of_another_id_does_not(store):
    # Compaction keeps only the id's newest record: a malformed one after the put would leave
    # nothing pending on a node that rebuilds, so the master writes the put again.
    store.apply([Put("a", T0, b"p", version=0), Malformed(0, 1, b"bad", delay_id="a"),
                 Malformed(0, 2, b"bad", delay_id="b"), Malformed(0, 3, b"bad")], {0: 4})
    assert store.shadowed() == {"a": None}
    assert store.get("a") == StoredEntry("a", T0, b"p", 0)


def test_a_masters_copy_of_the_stored_version_replaces_it_and_clears_the_mark(store):
    store.apply([Put("a", T0, b"new", version=9), Remove("a", version=3)], {})
    store.apply([Put("a", T0, b"new", version=15, restores=9)], {})

    assert store.get("a") == StoredEntry("a", T0, b"new", 15)
    assert store.shadowed() == {}


def test_a_stale_copy_of_a_replaced_version_keeps_the_newer_one_and_asks_for_another_copy(store):
    # done of v3 after v9 (shadowed), then the user's v12, then the master's copy of v9.
    store.apply([Put("a", T0, b"v9", version=9), Remove("a", version=3), Put("a", T0 + 5, b"v12", version=12),
                 Put("a", T0, b"v9", version=15, restores=9)], {})

    assert store.get("a") == StoredEntry("a", T0 + 5, b"v12", 12)
    assert store.shadowed() == {"a": None}


def test_a_copy_of_a_message_no_longer_pending_asks_for_a_done_of_the_copy_and_keeps_its_payload(tmp_path):
    with TimeIndex(tmp_path / "s") as index:
        index.apply([Put("a", T0, b"v9", version=9), Remove("a", version=3), Remove("a")], {})
        result = index.apply([Put("a", T0, b"copy of v9", version=15, restores=9)], {})
        assert result.kept == 1 and index.get("a") is None
        assert index.shadowed() == {"a": b"copy of v9"}
    with TimeIndex(tmp_path / "s") as index:
        assert index.shadowed() == {"a": b"copy of v9"}
        index.apply([Remove("a", version=15)], {})
        assert index.shadowed() == {} and index.pending_count() == 0


# -- a producer write appended twice (wire.COPY_WINDOW_MS) ------------------------


@pytest.fixture(params=[4, 5], ids=["format-4", "format-5"])
def any_format(request, tmp_path):
    """A store of each format a node writes: 4 until the cluster is finalized at feature level 2, then 5."""
    with TimeIndex(tmp_path / "store", store_format=request.param) as index:
        assert index.store_format == request.param
        yield index


def raw_families(path) -> rocksdict.Rdict:
    """The closed store at ``path`` opened by rocksdict alone, every family it has, keys and values as bytes."""
    names = rocksdict.Rdict.list_cf(str(path), rocksdict.Options(raw_mode=True))
    return rocksdict.Rdict(str(path), rocksdict.Options(raw_mode=True),
                           column_families={name: rocksdict.Options(raw_mode=True) for name in names})


def producer_writes_kept(path) -> list[bytes]:
    """The producer writes the closed store at ``path`` keeps, wherever its format keeps them (meta or written)."""
    db = raw_families(path)
    try:
        in_meta = [k for k, _ in db.get_column_family("meta").items() if k.startswith(b"sys/written/")]
        if "written" in db.list_cf(str(path), rocksdict.Options(raw_mode=True)):
            assert not in_meta, "a format-5 store keeps producer writes in meta"
            return [k for k, _ in db.get_column_family("written").items()]
        return in_meta
    finally:
        db.close()


def put_written(delay_id: str, offset: int, payload: bytes = b"p", *, at: int = T0, created: int = T0 - 60_000,
                digest: bytes = b"digest-1", partition: int = 0) -> Put:
    """A producer's put read at ``offset``: the same ``created``/``digest`` at two offsets is one write twice."""
    return Put(delay_id, at, payload, version=offset, written=producer_write(partition, offset, created, digest))


def cancel_written(delay_id: str, offset: int, *, created: int = T0 - 50_000, digest: bytes = b"cancel-1",
                   partition: int = 0) -> Remove:
    return Remove(delay_id, written=producer_write(partition, offset, created, digest))


def test_a_copy_of_the_pending_put_keeps_its_version_and_asks_for_the_put_again(any_format):
    any_format.apply([put_written("a", 10)], {})
    result = any_format.apply([put_written("a", 12)], {})

    assert (result.copies, result.unchanged, result.moved) == (1, 1, 0)
    assert any_format.get("a").version == 10, "a copy is no new version: the master's done of 10 must close it"
    assert any_format.shadowed() == {"a": None}, "the copy is the id's newest record: compaction would keep only it"
    any_format.apply([Remove("a", version=10)], {})
    assert any_format.get("a") is None and any_format.shadowed() == {}


def test_a_copy_after_the_put_was_delivered_schedules_nothing_and_asks_for_a_done_of_the_copy(any_format):
    any_format.apply([put_written("a", 10), Remove("a", version=10)], {})
    result = any_format.apply([put_written("a", 14, b"payload of 14")], {})

    assert (result.copies, result.added, result.kept) == (1, 0, 1)
    assert any_format.get("a") is None and any_format.pending_count() == 0
    assert any_format.shadowed() == {"a": b"payload of 14"}


def test_a_copy_after_a_cancel_schedules_nothing(any_format):
    any_format.apply([put_written("a", 10), cancel_written("a", 11)], {})
    any_format.apply([put_written("a", 12)], {})

    assert any_format.get("a") is None and any_format.due(2**63 - 1, 10) == []


def test_a_copy_of_an_older_put_keeps_the_reschedule_after_it(any_format):
    any_format.apply([put_written("a", 10), put_written("a", 11, b"later", created=T0 - 40_000, digest=b"digest-2")], {})
    result = any_format.apply([put_written("a", 12), put_written("a", 13, b"later", created=T0 - 40_000,
                                                             digest=b"digest-2")], {})

    assert result.copies == 2
    assert any_format.get("a").version == 11 and any_format.get("a").payload == b"later"
    assert any_format.shadowed() == {"a": None}


def test_a_copy_of_a_cancel_leaves_the_put_written_after_the_cancel(any_format):
    any_format.apply([put_written("a", 10), cancel_written("a", 11), put_written("a", 12, b"again", digest=b"digest-2")],
                {})
    result = any_format.apply([cancel_written("a", 13)], {})

    assert (result.copies, result.removed, result.kept) == (1, 0, 1)
    assert any_format.get("a").version == 12 and any_format.shadowed() == {"a": None}


def test_a_copy_in_the_same_batch_as_its_original_is_a_copy(any_format):
    result = any_format.apply([put_written("a", 10), cancel_written("a", 11), put_written("a", 12)], {})

    assert (result.copies, result.added, result.removed) == (1, 1, 1)
    assert any_format.get("a") is None


def test_writes_of_another_time_digest_or_id_are_writes_and_a_record_read_again_is_no_copy(any_format):
    any_format.apply([put_written("a", 10)], {})
    assert any_format.apply([put_written("a", 10)], {}).copies == 0, "the same record read again"
    assert any_format.apply([put_written("a", 11, created=T0 - 59_999)], {}).moved == 1
    assert any_format.apply([put_written("a", 12, created=T0 - 59_999, digest=b"digest-2")], {}).moved == 1
    assert any_format.apply([put_written("b", 13, created=T0 - 59_999, digest=b"digest-3")], {}).added == 1
    assert any_format.apply([Put("a", T0, b"master's", version=14, restores=12)], {}).copies == 0


@pytest.mark.parametrize("store_format", [4, 5])
def test_a_copy_is_known_after_reopen_and_by_the_record_time_of_its_own_partition(tmp_path, store_format):
    with TimeIndex(tmp_path / "s", store_format=store_format) as index:
        index.apply([put_written("a", 10), put_written("b", 3, partition=1, digest=b"digest-b")], {})
    with TimeIndex(tmp_path / "s", store_format=store_format) as index:
        assert index.apply([put_written("a", 11)], {}).copies == 1
        # Partition 0 reads a record created a whole window later: a copy of "a" is now too old.
        later = T0 - 60_000 + COPY_WINDOW_MS + 1
        index.apply([put_written("c", 12, created=later, digest=b"digest-c")], {})
        assert index.apply([put_written("a", 13)], {}).copies == 0
        # Partition 1's record time has not moved: its copy is still one.
        assert index.apply([put_written("b", 4, partition=1, digest=b"digest-b")], {}).copies == 1


def test_writes_older_than_two_windows_below_the_newest_record_time_are_dropped(any_format):
    any_format.apply([put_written("a", 10, created=T0)], {})
    any_format.apply([put_written("b", 11, created=T0 + 2 * COPY_WINDOW_MS + COPY_WINDOW_MS // 10 + 1,
                                  digest=b"digest-b")], {})
    any_format.close()
    assert len(producer_writes_kept(any_format.path)) == 1, "the write of a was dropped, the write of b kept"


def test_producer_write_refuses_a_digest_of_the_wrong_size_and_ops_a_written_of_the_wrong_form():
    with pytest.raises(ValueError, match="digest must be 8 bytes"):
        producer_write(0, 1, T0, b"short")
    with pytest.raises(ValueError, match="written must be None"):
        Put("a", T0, b"p", written=b"x")
    with pytest.raises(ValueError, match="written must be None"):
        Remove("a", written=b"x" * 27)


def test_a_put_of_the_same_time_and_payload_with_a_new_version_records_the_version(store):
    store.apply([Put("a", T0, b"p", version=1)], {})
    assert store.apply([Put("a", T0, b"p", version=5)], {}).moved == 1
    assert store.get("a").version == 5


# -- store formats: 4 (delayq 0.1.0's) migrates to 5 in place; older or newer ones are refused -------------------


def set_format_marker(path, marker: bytes) -> None:
    db = raw_families(path)
    db.get_column_family("meta")[b"sys/format"] = marker
    db.close()


@pytest.mark.parametrize(("marker", "says"), [
    (b"delayq-time-index-3", "store format 3, two or more formats older than this delayq's 5"),
    (b"delayq-time-index-1", "store format 1, two or more formats older"),
    (b"delayq-time-index-6", "store format 6, written by a newer delayq"),
    (b"something else", "format marker b'something else', which no delayq writes"),
])
def test_a_store_of_a_format_this_code_cannot_migrate_is_refused_saying_why(tmp_path, marker, says):
    with TimeIndex(tmp_path / "s", store_format=4):
        pass
    set_format_marker(tmp_path / "s", marker)
    with pytest.raises(StoreFormatError) as refused:
        TimeIndex(tmp_path / "s")
    assert says in str(refused.value) and "\n" not in str(refused.value)
    TimeIndex.destroy(tmp_path / "s")  # refused, it holds no lock: it can be deleted (and rebuilt) at once
    assert not (tmp_path / "s").exists()


def test_a_new_store_is_of_the_format_asked_for_and_a_newer_store_keeps_its_own(tmp_path):
    with TimeIndex(tmp_path / "four", store_format=4) as four:
        assert four.store_format == 4
    with TimeIndex(tmp_path / "four", store_format=4) as four:
        assert four.store_format == 4, "a format-4 store asked to stay 4 is not migrated"
    with TimeIndex(tmp_path / "five") as five:
        assert five.store_format == 5
    with TimeIndex(tmp_path / "five", store_format=4) as five:
        assert five.store_format == 5, "a store is never taken back to an older format"
    assert "written" in rocksdict.Rdict.list_cf(str(tmp_path / "five"), rocksdict.Options(raw_mode=True))
    assert "written" not in rocksdict.Rdict.list_cf(str(tmp_path / "four"), rocksdict.Options(raw_mode=True))
    with pytest.raises(ValueError, match="store_format 3 is not one this delayq writes"):
        TimeIndex(tmp_path / "three", store_format=3)


def a_format_4_store_with_history(path) -> dict:
    """A format-4 store with pending entries, a shadow mark, a malformed record, offsets and producer writes."""
    with TimeIndex(path, store_format=4) as index:
        index.apply([put_written("a", 10), put_written("b", 11, digest=b"digest-b"), Put("c", T0 + 5, b"c", version=12),
                     Malformed(0, 13, b"junk", "d"), Remove("c", version=2)], {0: 14, 1: 3}, ingested_at_ms=T0)
        index.set_meta("buffer_topic_id", b"topic-1")
        return state_of(index)


def state_of(index: TimeIndex) -> dict:
    return {"due": everything(index), "offsets": index.offsets(), "pending": index.pending_count(),
            "shadowed": index.shadowed(), "malformed": index.malformed(), "meta": index.get_meta("buffer_topic_id")}


def test_a_format_4_store_opened_for_format_5_is_migrated_in_place_keeping_every_entry_and_write(tmp_path):
    before = a_format_4_store_with_history(tmp_path / "s")
    assert len(producer_writes_kept(tmp_path / "s")) == 2

    with TimeIndex(tmp_path / "s", store_format=5) as index:
        assert index.store_format == 5
        assert state_of(index) == before
        assert index.apply([put_written("a", 20)], {}).copies == 1, "a write recorded before the migration"
    assert len(producer_writes_kept(tmp_path / "s")) == 2, "moved to the written family, none left in meta"
    with TimeIndex(tmp_path / "s", store_format=4) as index:
        assert index.store_format == 5 and state_of(index)["due"] == before["due"]


def test_upgrade_format_moves_in_batches_between_which_writes_go_on_and_every_copy_is_still_known(tmp_path):
    a_format_4_store_with_history(tmp_path / "s")
    with TimeIndex(tmp_path / "s", store_format=4) as index:
        index.apply([put_written(f"x{i}", 100 + i, digest=b"%08d" % i) for i in range(30_000)], {0: 30_100})
        stop, failures = threading.Event(), []
        during: list[int] = []  # offsets of the writes applied while the move was under way

        def ingest():
            offset = 40_000
            while not stop.is_set():
                try:
                    moving = index.migrating
                    index.apply([put_written(f"y{offset}", offset, digest=b"%08d" % offset),
                                 put_written(f"x{offset % 30_000}", offset + 1, digest=b"%08d" % (offset % 30_000))],
                                {0: offset + 2})
                    index.due(T0 + 10**9, 10)
                    if moving and index.migrating:
                        during.append(offset)
                except Exception as err:  # the test reports whatever a writer met
                    failures.append(err)
                offset += 2

        writer = threading.Thread(target=ingest)
        writer.start()
        try:
            assert index.upgrade_format(5, batch=500) == 4
        finally:
            stop.set()
            writer.join()
        assert not failures, failures[:3]
        assert during, "no write went on while the move was under way: it held the store for its whole length"
        assert index.store_format == 5 and index.upgrade_format(5) is None
        first_during = during[0]
        result = index.apply([put_written(f"y{first_during}", 99_999, digest=b"%08d" % first_during),
                              put_written("x7", 99_998, digest=b"%08d" % 7), put_written("a", 99_997)], {})
        assert result.copies == 3, "writes recorded before, during and after the move are all known"
        pending = index.pending_count()
    # Every x was copied by the writer at least once (copies record nothing); a, b and each y have one write.
    assert len(producer_writes_kept(tmp_path / "s")) == pending - 1, "every write kept once (c, a master's put: none)"
    with TimeIndex(tmp_path / "other", store_format=4) as other, \
            pytest.raises(ValueError, match="batch must be an int of at least 1"):
        other.upgrade_format(5, batch=0)


def test_a_migration_stopped_half_way_is_finished_by_the_next_open_whatever_format_it_asks(tmp_path):
    a_format_4_store_with_history(tmp_path / "s")
    # As a migration leaves it when the process dies after a batch of the copy: the family is there with part
    # of the writes, the marker and meta's writes are still format 4's.
    db = raw_families(tmp_path / "s")
    meta = db.get_column_family("meta")
    first = next(k for k in meta.keys(from_key=b"sys/written/") if k.startswith(b"sys/written/"))
    written = db.create_column_family("written", rocksdict.Options(raw_mode=True))
    written[first[len(b"sys/written/"):]] = meta[first]
    del written, meta  # RocksDB keeps the directory locked while a family is referenced
    db.close()

    with TimeIndex(tmp_path / "s", store_format=4) as index:
        assert index.store_format == 5
        assert index.apply([put_written("b", 30, digest=b"digest-b")], {}).copies == 1
    assert len(producer_writes_kept(tmp_path / "s")) == 2


def test_reapplying_the_same_batch_changes_nothing(store):
    batch = [Put("a", T0, b"1"), Put("b", T0 + 1, b"2"), Remove("c"), Put("d", T0 + 2, b"3"), Remove("d")]
    first = store.apply(batch, {0: 5})
    before = (everything(store), store.pending_count(), store.offsets())

    second = store.apply(batch, {0: 5})

    assert first == ApplyResult(added=3, moved=0, removed=1, unchanged=1)
    assert second == ApplyResult(added=1, moved=0, removed=1, unchanged=3)
    assert (everything(store), store.pending_count(), store.offsets()) == before


def test_ops_in_one_apply_see_the_earlier_ones(store):
    result = store.apply([Put("a", T0, b"1"), Remove("a"),
                          Put("b", T0, b"1"), Put("b", T0 + 7, b"2"),
                          Remove("c"), Put("c", T0 + 3, b"3"),
                          Put("d", T0, b"1"), Put("d", T0, b"1")], {})

    assert result == ApplyResult(added=4, moved=1, removed=1, unchanged=2)
    assert everything(store) == [StoredEntry("d", T0, b"1"), StoredEntry("c", T0 + 3, b"3"),
                                 StoredEntry("b", T0 + 7, b"2")]
    assert store.pending_count() == 3
    assert store.get("a") is None


def test_move_away_and_back_in_one_apply_leaves_the_entry_as_it_was(store):
    store.apply([Put("a", T0, b"1")], {})

    result = store.apply([Put("a", T0 + 9, b"2"), Put("a", T0, b"1")], {})

    assert result == ApplyResult(0, 2, 0, 0)
    assert everything(store) == [StoredEntry("a", T0, b"1")]
    assert store.pending_count() == 1


# -- offsets, meta, reopen ---------------------------------------------------------------


def test_offsets_only_rise_merge_with_stored_ones_and_persist_across_reopen(tmp_path):
    path = tmp_path / "store"
    with TimeIndex(path) as index:
        index.apply([], {0: 10, 1: 4})
        index.apply([Put("a", T0, b"p")], {1: 2, 2: 7})
        assert index.offsets() == {0: 10, 1: 4, 2: 7}

    with TimeIndex(path) as index:
        assert index.offsets() == {0: 10, 1: 4, 2: 7}
        index.apply([], {1: 9})
        assert index.offsets() == {0: 10, 1: 9, 2: 7}


def test_pending_count_next_due_and_last_ingest_survive_reopen(tmp_path):
    path = tmp_path / "store"
    with TimeIndex(path) as index:
        assert (index.pending_count(), index.next_due_ms(), index.last_ingest_ms()) == (0, None, None)
        index.apply([Put(f"id{i}", T0 + 100 - i, b"p") for i in range(20)], {0: 20}, ingested_at_ms=T0 - 1)
        index.apply([Remove("id19"), Remove("id18")], {0: 22}, ingested_at_ms=T0)

    with TimeIndex(path) as index:
        assert index.pending_count() == 18
        assert index.next_due_ms() == T0 + 100 - 17
        assert index.last_ingest_ms() == T0
        assert index.get("id3") == StoredEntry("id3", T0 + 97, b"p")


def test_meta_round_trips_persists_and_is_apart_from_the_stores_own_bookkeeping(tmp_path):
    path = tmp_path / "store"
    with TimeIndex(path) as index:
        assert index.get_meta("buffer_topic_id") is None
        index.set_meta("buffer_topic_id", b"\x01topic")
        index.set_meta("pending", b"not a count")
        index.apply([Put("a", T0, b"p")], {})

    with TimeIndex(path) as index:
        assert index.get_meta("buffer_topic_id") == b"\x01topic"
        assert index.get_meta("pending") == b"not a count"
        assert index.pending_count() == 1


# -- atomicity -------------------------------------------------------------------------


def _state(index: TimeIndex):
    return everything(index), index.pending_count(), index.offsets(), index.last_ingest_ms()


def test_an_op_that_raises_mid_batch_leaves_nothing_written(store):
    store.apply([Put("a", T0, b"p")], {0: 1}, ingested_at_ms=T0)
    before = _state(store)

    def ops_failing_halfway():
        yield Put("b", T0 + 1, b"p")
        yield Remove("a")
        raise RuntimeError("decoding the next buffer record failed")

    with pytest.raises(RuntimeError, match="decoding"):
        store.apply(ops_failing_halfway(), {0: 3}, ingested_at_ms=T0 + 5)
    with pytest.raises(TypeError, match=r"ops\[2\] must be a Put, Remove or Malformed"):
        store.apply([Put("b", T0 + 1, b"p"), Remove("a"), ("put", "c")], {0: 3})
    with pytest.raises(ValueError, match="partition -1"):
        store.apply([Put("b", T0 + 1, b"p")], {0: 3, -1: 4})
    with pytest.raises(ValueError, match="ingested_at_ms"):
        store.apply([Put("b", T0 + 1, b"p")], {0: 3}, ingested_at_ms=-1)

    assert _state(store) == before


def _crash_after(path, batches: int, options: str) -> None:
    """In another process: apply ``batches`` batches of 100 puts (1 KiB each) and die without close().

    It dies once the flushes its full memtables started have ended (RocksDB flushes in
    the background: on a busy machine, dying at once could precede the first flush).
    """
    script = textwrap.dedent(f"""
        import os, time
        from delayq.store import Put, StoreOptions, TimeIndex
        index = TimeIndex({str(path)!r}, StoreOptions({options}))
        for b in range({batches}):
            index.apply([Put("id%06d" % i, {T0} + i, b"p" * 1024) for i in range(b * 100, b * 100 + 100)],
                        {{0: b * 100 + 100, 3: 9}})
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and index.flushing():
            time.sleep(0.01)
        os._exit(0)  # no close()
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)


def test_with_the_wal_a_crash_after_apply_keeps_the_whole_batch(tmp_path):
    _crash_after(tmp_path / "store", 5, "wal=True")

    with TimeIndex(tmp_path / "store") as index:
        assert index.pending_count() == 500
        assert len(everything(index)) == 500
        assert index.offsets() == {0: 500, 3: 9}


def test_without_the_wal_a_crash_keeps_a_consistent_prefix_of_batches(tmp_path):
    """The default: what a crash keeps is what was flushed, whole batches with their offsets.

    A 1 MiB memtable and 3 MiB of batches: some were flushed, the last ones were not.
    """
    _crash_after(tmp_path / "store", 30, "write_buffer_mb=1")

    with TimeIndex(tmp_path / "store") as index:
        kept = index.offsets().get(0, 0)
        assert kept % 100 == 0 and 0 < kept < 3000, f"expected some whole batches flushed, got offset {kept}"
        assert index.pending_count() == kept
        assert [e.delay_id for e in everything(index)] == [f"id{i:06d}" for i in range(kept)]
        assert index.offsets() == {0: kept, 3: 9}


def test_flush_persists_every_batch_so_far_and_a_crash_keeps_them(tmp_path):
    path = tmp_path / "store"
    script = textwrap.dedent(f"""
        import os
        from delayq.store import Put, TimeIndex
        index = TimeIndex({str(path)!r})
        index.apply([Put("a%d" % i, {T0} + i, b"p") for i in range(100)], {{0: 100}})
        index.flush()
        index.apply([Put("b%d" % i, {T0} + i, b"p") for i in range(50)], {{0: 150}})
        os._exit(0)  # no close(): the second batch is in memory only
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)

    with TimeIndex(path) as index:
        assert index.pending_count() == 100 and index.offsets() == {0: 100}
        assert sorted(e.delay_id for e in everything(index)) == sorted(f"a{i}" for i in range(100))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store"], "the flush's scratch copy is gone"


def test_without_the_wal_close_keeps_every_batch(tmp_path):
    with TimeIndex(tmp_path / "store") as index:
        index.apply([Put(f"id{i}", T0 + i, b"p") for i in range(50)], {0: 50})
    with TimeIndex(tmp_path / "store") as index:
        assert index.pending_count() == 50 and index.offsets() == {0: 50}


# -- checkpoint, destroy, exists, open errors --------------------------------------------


def test_checkpoint_opens_as_a_store_with_the_same_contents(store, tmp_path):
    store.apply([Put(f"id{i}", T0 + i, b"p%d" % i) for i in range(50)], {0: 50}, ingested_at_ms=T0)
    store.set_meta("topic", b"t")

    copy_path = store.checkpoint(tmp_path / "backups" / "cp1")
    store.apply([Remove("id0")], {0: 51})

    with TimeIndex(copy_path) as copy:
        assert everything(copy) == [StoredEntry(f"id{i}", T0 + i, b"p%d" % i) for i in range(50)]
        assert (copy.pending_count(), copy.offsets(), copy.last_ingest_ms()) == (50, {0: 50}, T0)
        assert copy.get_meta("topic") == b"t"
    with pytest.raises(FileExistsError, match="cp1"):
        store.checkpoint(copy_path)


def test_destroy_deletes_the_store_and_exists_tells_a_store_from_nothing(tmp_path):
    path = tmp_path / "store"
    assert not TimeIndex.exists(path)
    with TimeIndex(path) as index:
        index.apply([Put("a", T0, b"p")], {0: 1})
    assert TimeIndex.exists(path)

    TimeIndex.destroy(path)

    assert not path.exists() and not TimeIndex.exists(path)
    TimeIndex.destroy(path)  # nothing there: nothing to do
    with TimeIndex(path) as index:
        assert (index.pending_count(), index.offsets()) == (0, {})


def test_destroy_refuses_an_open_store_and_a_directory_that_is_no_store(store, tmp_path):
    with pytest.raises(StoreError, match="close it first"):
        TimeIndex.destroy(store.path)
    other = tmp_path / "photos"
    other.mkdir()
    (other / "cat.jpg").write_bytes(b"\xff")

    with pytest.raises(StoreError, match="not a delayq store"):
        TimeIndex.destroy(other)
    assert (other / "cat.jpg").exists()


def test_opening_a_store_twice_says_it_is_locked(store):
    with pytest.raises(StoreError, match="locked by another process"):
        TimeIndex(store.path)


def test_opening_a_store_another_process_holds_says_it_is_locked(tmp_path):
    path = tmp_path / "store"
    holder = subprocess.Popen(
        [sys.executable, "-c", f"from delayq.store import TimeIndex; index = TimeIndex({str(path)!r}); print('open', flush=True);"
                               "import sys; sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "open"
        with pytest.raises(StoreError, match="locked by another process"):
            TimeIndex(path)
    finally:
        holder.communicate("", timeout=30)


def test_opening_a_directory_that_is_not_a_store_says_so(tmp_path):
    full = tmp_path / "full"
    full.mkdir()
    (full / "notes.txt").write_text("hello")
    foreign = tmp_path / "foreign"
    db = rocksdict.Rdict(str(foreign))
    db["k"] = "v"
    db.close()
    a_file = tmp_path / "file"
    a_file.write_text("x")

    with pytest.raises(StoreError, match="not empty and holds no delayq store"):
        TimeIndex(full)
    with pytest.raises(StoreError, match="not a delayq store"):
        TimeIndex(foreign)
    with pytest.raises(StoreError, match="is a file"):
        TimeIndex(a_file)


def test_a_closed_store_says_it_is_closed(tmp_path):
    index = TimeIndex(tmp_path / "store")
    assert not index.flushing(), "an idle store has nothing to flush"
    index.close()
    index.close()

    for call in (lambda: index.due(T0, 1), lambda: index.apply([], {0: 1}), lambda: index.get("a"),
                 lambda: index.pending_count(), lambda: index.set_meta("x", b""), lambda: index.flushing()):
        with pytest.raises(StoreError, match="closed"):
            call()


# -- bad arguments ---------------------------------------------------------------------


@pytest.mark.parametrize("deliver_at_ms", [-1, 2**63])
def test_put_outside_the_time_range_names_deliver_at_ms(deliver_at_ms):
    with pytest.raises(ValueError, match="deliver_at_ms"):
        Put("a", deliver_at_ms, b"p")


@pytest.mark.parametrize("args, error, field", [
    (("a", "17", b"p"), TypeError, "deliver_at_ms"),
    (("a", True, b"p"), TypeError, "deliver_at_ms"),
    (("a", 1.5, b"p"), TypeError, "deliver_at_ms"),
    (("a", T0, "p"), TypeError, "payload"),
    ((b"a", T0, b"p"), TypeError, "delay_id"),
    (("", T0, b"p"), ValueError, "delay_id"),
    (("caf\u00e9", T0, b"p"), ValueError, "delay_id"),
])
def test_put_with_bad_fields_raises_naming_the_field(args, error, field):
    with pytest.raises(error, match=field):
        Put(*args)


def test_bad_arguments_to_store_methods_raise_naming_them(store):
    cases = [
        (lambda: Remove(7), TypeError, "delay_id"),
        (lambda: store.apply(Put("a", T0, b"p"), {}), TypeError, "ops must be an iterable"),
        (lambda: store.apply([], [(0, 1)]), TypeError, "offsets must be a mapping"),
        (lambda: store.apply([], {"0": 1}), TypeError, "partition '0'"),
        (lambda: store.apply([], {0: -1}), ValueError, r"offsets\[0\]"),
        (lambda: store.apply([], {0: "5"}), TypeError, r"offsets\[0\]"),
        (lambda: store.due(T0, -1), ValueError, "limit"),
        (lambda: store.due(T0, 1.0), TypeError, "limit"),
        (lambda: store.due(-5, 1), ValueError, "up_to_ms"),
        (lambda: store.get(""), ValueError, "delay_id"),
        (lambda: store.set_meta("x", "text"), TypeError, "value"),
        (lambda: store.get_meta(""), ValueError, "name"),
        (lambda: store.checkpoint(17), TypeError, "dest"),
        (lambda: TimeIndex(17), TypeError, "path"),
        (lambda: TimeIndex(store.path.parent / "x", options={}), TypeError, "options"),
    ]
    for call, error, text in cases:
        with pytest.raises(error, match=text):
            call()


@pytest.mark.parametrize("changes, error, field", [
    ({"block_cache_mb": 0}, ValueError, "block_cache_mb"),
    ({"write_buffer_mb": "32"}, TypeError, "write_buffer_mb"),
    ({"bloom_bits_per_key": 0}, ValueError, "bloom_bits_per_key"),
    ({"compression": "lzma"}, ValueError, "compression"),
    ({"sync_writes": 1}, TypeError, "sync_writes"),
])
def test_store_options_check_their_fields(changes, error, field):
    with pytest.raises(error, match=field):
        StoreOptions(**changes)


def test_store_opens_with_non_default_options(tmp_path):
    options = StoreOptions(block_cache_mb=8, write_buffer_mb=4, compression="zstd", bottommost_compression="none",
                           bloom_bits_per_key=12.5, sync_writes=True)
    with TimeIndex(tmp_path / "store", options) as index:
        index.apply([Put("a", T0, b"p" * 1000)], {0: 1})
        assert index.get("a") == StoredEntry("a", T0, b"p" * 1000)


def test_each_op_crosses_between_processes_as_its_frame_and_comes_back_as_itself():
    """The reader's frames (put_frame, ...) and ingest's decode() agree with the ops built by name, field by field."""
    written = producer_write(3, 7, 1_700_000_000_000, b"8 bytes!")
    ops = [Put("id-1", 1_800_000_000_000, b"stored", 7, 5, written), Remove("id-2", 9, written), Remove("id-3"),
           Malformed(3, 11, b"kept", "id-4"), Malformed(2, 12, b"kept")]
    frames = [put_frame(*ops[0]), remove_frame(*ops[1]), remove_frame(*ops[2]), malformed_frame(*ops[3]),
              malformed_frame(*ops[4])]
    assert marshal.loads(marshal.dumps(frames)) == frames, "frames are plain marshal data"
    decoded = decode(frames)
    assert decoded == ops and [type(op) for op in decoded] == [type(op) for op in ops]
    for frame_of, kind in ((put_frame, Put), (remove_frame, Remove), (malformed_frame, Malformed)):
        assert list(inspect.signature(frame_of).parameters) == list(kind._fields), f"{frame_of.__name__}'s fields"
