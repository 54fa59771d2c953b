"""The console index's RocksDB: records applied in batches, answered by id, by page and by code, across restarts."""

from __future__ import annotations

import logging

import pytest

from delayq import wire
from delayq.delay_service.console import index_store
from delayq.delay_service.console.history import REPLAYED_FROM
from delayq.delay_service.console.index import IndexStore
from delayq.schedule import Series

BUFFER, DLQ = "delayq-c-buffer", "delayq-c-dead-letter"
T0 = 1_800_000_000_000


def new_id(n: int) -> str:
    return f"0190a3e4-5b6c-7d8e-9f00-{n:012x}"


ID = new_id(1)


def open_store(path, partitions: int = 1) -> IndexStore:
    store = IndexStore(path, BUFFER, DLQ)
    store.set_buffer_partitions(partitions)
    return store


class Topics:
    """Buffer and dead-letter records with the offsets Kafka would give them."""

    def __init__(self):
        self.next = {}

    def record(self, topic: str, key, value, headers, ts: int, partition: int = 0):
        offset = self.next.get((topic, partition), 0)
        self.next[(topic, partition)] = offset + 1
        return topic, partition, offset, ts, key, value, headers

    def put(self, delay_id: str = ID, due: int = T0, ts: int = T0, *, headers=None, series=None, occurrence=None,
            follows=None):
        message = wire.Envelope(delay_id, "orders", due, b"payload", series=series, occurrence=occurrence)
        return self.record(BUFFER, delay_id.encode(), message.buffer_value(follows=follows), headers, ts)

    def cancel(self, delay_id: str = ID, ts: int = T0):
        return self.record(BUFFER, delay_id.encode(), None, wire.control_headers(wire.OP_CANCEL, delay_id), ts)

    def done(self, version: int, delay_id: str = ID, ts: int = T0):
        return self.record(BUFFER, delay_id.encode(), None, wire.done_headers(delay_id, version, 0), ts)

    def dead_letter(self, code: wire.Reason, ts: int, delay_id: str = ID, version: int = 0):
        message = wire.Envelope(delay_id, "orders", T0, b"payload")
        headers = [(wire.VERSION, str(version).encode()),
                   (wire.DEAD_LETTER_REASON, wire.reason_text(code, "why").encode()),
                   (wire.DEAD_LETTER_SOURCE, f"{BUFFER}/0/{version}".encode())]
        return self.record(DLQ, delay_id.encode(), message.buffer_value(), headers, ts)


def test_an_ids_history_its_latest_put_and_the_offsets_survive_a_restart(tmp_path):
    topics = Topics()
    store = open_store(tmp_path)
    store.apply([topics.put(ts=T0), topics.put(due=T0 + 1, ts=T0 + 1)])
    store.apply([topics.cancel(ts=T0 + 2)])
    assert [e.kind for e in store.history(ID)] == ["put", "reschedule", "cancel"]
    assert store.latest_put(ID) == (0, 1)
    assert store.offsets() == {(BUFFER, 0): 3}
    store.close()

    again = open_store(tmp_path)
    assert again.offsets() == {(BUFFER, 0): 3}
    again.apply([topics.put(due=T0 + 5, ts=T0 + 3)])
    assert [e.kind for e in again.history(ID)] == ["put", "reschedule", "cancel", "reschedule"]
    assert again.history(new_id(2)) == [] and again.history("no id") == [] and again.latest_put(new_id(2)) is None
    again.close()


def test_dead_letters_page_newest_first_by_cursor_and_by_code_with_counts(tmp_path):
    topics = Topics()
    store = open_store(tmp_path)
    codes = [wire.Reason.MISSING_TOPIC, wire.Reason.BAD_PARTITION] * 5
    store.apply([topics.dead_letter(code, T0 + i, new_id(i)) for i, code in enumerate(codes)])
    assert store.dead_letter_codes() == {"bad-partition": 5, "missing-topic": 5}

    first = store.dead_letters(limit=4)
    assert [d.coordinates for d in first.items] == ["0/9", "0/8", "0/7", "0/6"] and first.next
    second = store.dead_letters(first.next, limit=4)
    third = store.dead_letters(second.next, limit=4)
    assert [d.offset for d in second.items + third.items] == [5, 4, 3, 2, 1, 0] and third.next is None

    missing = store.dead_letters(limit=3, code="missing-topic")
    assert [d.offset for d in missing.items] == [8, 6, 4]
    rest = store.dead_letters(missing.next, limit=3, code="missing-topic")
    assert [d.offset for d in rest.items] == [2, 0] and rest.next is None
    assert store.dead_letters(code="expired").items == ()

    letter = store.dead_letter("0/3")
    assert letter is not None and (letter.code, letter.id, letter.replayable) == ("bad-partition", new_id(3), True)
    assert store.dead_letter("0/99") is None
    [event] = store.history(new_id(3))
    assert (event.kind, event.topic, event.reason, event.version) == ("dead-letter", DLQ, "bad-partition", 0)
    with pytest.raises(ValueError, match="not one this console gave"):
        store.dead_letters("nonsense")
    store.close()


def test_a_page_asks_for_at_most_max_page_items(tmp_path):
    topics = Topics()
    store = open_store(tmp_path)
    store.apply([topics.dead_letter(wire.Reason.REJECTED, T0 + i) for i in range(index_store.MAX_PAGE + 5)])
    page = store.dead_letters(limit=10_000)
    assert len(page.items) == index_store.MAX_PAGE and page.next is not None
    store.close()


@pytest.mark.parametrize("letter_first", [True, False])
def test_a_replay_put_marks_its_dead_letter_replayed_whichever_topic_is_read_first(tmp_path, letter_first):
    topics = Topics()
    store = open_store(tmp_path)
    letter = topics.dead_letter(wire.Reason.MISSING_TOPIC, T0 + 5)
    replay_id = new_id(77)
    replay = topics.put(replay_id, ts=T0 + 9, headers=[(REPLAYED_FROM, f"{DLQ}/0/0".encode())])
    store.apply([letter, replay] if letter_first else [replay])
    if not letter_first:
        store.apply([letter])
    found = store.dead_letter("0/0")
    assert found is not None and found.replayed_as == replay_id
    assert [(e.kind, e.text) for e in store.history(ID)] == [("dead-letter", "why"), ("replay", f"{DLQ}/0/0")]
    assert [(e.kind, e.text) for e in store.history(replay_id)] == [("replay", f"{DLQ}/0/0")]
    store.close()


def test_mark_replayed_shows_at_once_and_a_later_replay_put_keeps_its_id(tmp_path):
    topics = Topics()
    store = open_store(tmp_path)
    store.apply([topics.dead_letter(wire.Reason.MISSING_TOPIC, T0)])
    store.mark_replayed("0/0", new_id(5))
    assert store.dead_letters().items[0].replayed_as == new_id(5)
    store.apply([topics.put(new_id(5), headers=[(REPLAYED_FROM, f"{DLQ}/0/0".encode())])])
    assert store.dead_letter("0/0").replayed_as == new_id(5)
    with pytest.raises(ValueError):
        store.mark_replayed("0/0", "not an id")
    store.close()


def test_live_series_page_in_id_order_and_leave_when_they_end(tmp_path):
    topics = Topics()
    store = open_store(tmp_path)
    every = Series(every_ms=1000)
    store.apply([topics.put(new_id(i), series=every) for i in range(5)])
    store.apply([topics.cancel(new_id(2))])
    first = store.series(limit=2)
    assert [s.id for s in first.items] == [new_id(0), new_id(1)]
    second = store.series(first.next, limit=2)
    assert [s.id for s in second.items] == [new_id(3), new_id(4)] and second.next is None
    store.apply([topics.put(new_id(0), due=T0 + 1000, series=every, occurrence=2, follows=0)])
    assert store.series(limit=1).items[0].occurrence == 2 and store.series(limit=1).items[0].delivered == 1
    store.close()


def test_an_id_keeps_its_newest_events_only(tmp_path, monkeypatch):
    monkeypatch.setattr(index_store, "MAX_HISTORY", 10)
    monkeypatch.setattr(index_store, "TRIM_STEP", 3)
    topics = Topics()
    store = open_store(tmp_path)
    for _ in range(5):
        store.apply([topics.put(due=T0 + n) for n in range(7)])
    kept = store.history(ID)
    assert 10 <= len(kept) <= 13
    assert [e.offset for e in kept] == list(range(35 - len(kept), 35))
    store.close()


def test_a_record_that_cannot_be_read_is_skipped_counted_and_logged(tmp_path, caplog):
    topics = Topics()
    store = open_store(tmp_path)
    newer = topics.record(BUFFER, ID.encode(), f"put {T0} orders - level=9\n".encode(), None, T0)
    with caplog.at_level(logging.WARNING, "delayq.console.index"):
        store.apply([newer, topics.put()])
    assert store.skipped == 1 and "delayq-c-buffer/0/0 skipped" in caplog.text
    assert [e.kind for e in store.history(ID)] == ["put"] and store.offsets() == {(BUFFER, 0): 2}
    store.close()


def test_an_index_of_other_topics_is_emptied_when_opened_for_these(tmp_path, caplog):
    topics = Topics()
    store = open_store(tmp_path)
    store.apply([topics.put()])
    store.close()
    with caplog.at_level(logging.INFO, "delayq.console.index"):
        other = IndexStore(tmp_path, "delayq-other-buffer", DLQ)
    assert other.offsets() == {} and "it was of delayq-c-buffer and delayq-c-dead-letter" in caplog.text
    other.set_buffer_partitions(1)
    assert other.history(ID) == []
    other.close()
