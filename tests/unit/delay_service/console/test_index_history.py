"""The console index's rules: what each buffer and dead-letter record means to an id's history, state and series."""

from __future__ import annotations

import pytest

from delayq import wire
from delayq.delay_service.console.history import (
    REPLAYED_FROM,
    UNKNOWN_CODE,
    BufferReading,
    Change,
    IdState,
    event_from_tuple,
    in_order,
    parse_coordinates,
    read_dead_letter,
)
from delayq.delay_service.console.records import HistoryEvent, SeriesInfo
from delayq.schedule import Series

DLQ = "delayq-c-dead-letter"
BUFFER = "delayq-c-buffer"
T0 = 1_800_000_000_000
ID = "0190a3e4-5b6c-7d8e-9f00-112233445566"


def put(due: int = T0, *, series: Series | None = None, occurrence: int | None = None, restores: int | None = None,
        follows: int | None = None, cutoff: int | None = None, headers: wire.Headers | None = None):
    message = wire.Envelope(ID, "orders", due, b"payload", b"key", series=series, occurrence=occurrence)
    return ID.encode(), message.buffer_value(restores=restores, follows=follows, cutoff=cutoff), headers


def cancel():
    return ID.encode(), None, wire.control_headers(wire.OP_CANCEL, ID)


def done(version: int, cutoff: int = 0):
    return ID.encode(), None, wire.done_headers(ID, version, cutoff)


class Reader:
    """One id's records read in order, with the state and series a store would keep between them."""

    def __init__(self, partitions: int = 1):
        self.reading = BufferReading(partitions, DLQ)
        self.states: dict[str, IdState] = {}
        self.series: dict[str, SeriesInfo] = {}
        self.offset = 0

    def read(self, record, partition: int = 0, ts: int = T0) -> Change | None:
        key, value, headers = record
        change = self.reading.read(key, value, headers, ts, partition, self.offset, self.states.get,
                                   self.series.get)
        self.offset += 1
        if change is not None:
            self.states[change.delay_id] = change.state
            if change.series_changed:
                if change.series is None:
                    self.series.pop(change.delay_id, None)
                else:
                    self.series[change.delay_id] = change.series
        return change

    def kinds(self, *records) -> list[str]:
        return [event(self.read(r)).kind for r in records]


def event(change: Change | None) -> HistoryEvent:
    assert change is not None
    return event_from_tuple(BUFFER, 0, 0, change.event)


def test_a_put_a_later_producer_put_and_a_cancel_are_put_reschedule_and_cancel():
    reader = Reader()
    assert reader.kinds(put(), put(T0 + 5000), cancel()) == ["put", "reschedule", "cancel"]
    state = reader.states[ID]
    assert (state.pending, state.put_partition, state.put_offset, state.events) == (-1, 0, 1, 3)


def test_a_put_event_carries_its_due_time_and_target():
    shown = event(Reader().read(put(T0 + 1)))
    assert (shown.kind, shown.due_ms, shown.target, shown.topic) == ("put", T0 + 1, "orders", BUFFER)


def test_a_done_closes_only_the_version_pending():
    reader = Reader()
    reader.read(put())  # offset 0
    reader.read(put(T0 + 1))  # offset 1: pending
    older = event(reader.read(done(0, 1)))
    assert (older.kind, older.version, older.cutoff) == ("done", 0, 1)
    assert reader.states[ID].pending == 1
    reader.read(done(1, 2))
    assert reader.states[ID].pending == -1


def test_a_masters_copy_replaces_the_version_it_restores_and_a_stray_one_nothing():
    reader = Reader()
    reader.read(put())  # 0
    copy = reader.read(put(restores=0))  # 1
    assert event(copy).kind == "copy" and event(copy).version == 0
    assert reader.states[ID].pending == 1 and reader.states[ID].put_offset == 1
    reader.read(cancel())  # 2
    stray = reader.read(put(restores=1))  # 3: a copy after a cancel revives nothing
    assert event(stray).kind == "copy" and reader.states[ID].pending == -1


def test_a_masters_put_with_no_earlier_record_of_its_id_is_applied_as_compaction_left_it():
    reader = Reader()
    reader.offset = 40
    reader.read(put(series=Series(every_ms=1000), occurrence=7, follows=12, cutoff=3))
    assert reader.states[ID].pending == 40
    assert reader.series[ID] == SeriesInfo(ID, "orders", "every=1000", 7, T0, 6, 40)


def test_a_series_starts_with_its_put_goes_on_with_each_next_occurrence_and_ends_with_a_cancel():
    reader = Reader()
    every = Series(every_ms=60_000, times=5)
    first = reader.read(put(series=every))
    assert event(first).repeat == "every=60000 times=5"
    assert reader.series[ID] == SeriesInfo(ID, "orders", "every=60000 times=5", 1, T0, 0, 0)
    second = reader.read(put(T0 + 60_000, series=every, occurrence=2, follows=0, cutoff=9))
    shown = event(second)
    assert (shown.kind, shown.occurrence, shown.version, shown.cutoff) == ("next-occurrence", 2, 0, 9)
    assert reader.series[ID] == SeriesInfo(ID, "orders", "every=60000 times=5", 2, T0 + 60_000, 1, 1)
    reader.read(cancel())
    assert ID not in reader.series and not reader.states[ID].repeating


def test_a_series_ends_with_the_done_of_its_last_occurrence_not_of_an_older_one():
    reader = Reader()
    every = Series(every_ms=1000, times=2)
    reader.read(put(series=every))  # 0
    reader.read(put(T0 + 1000, series=every, occurrence=2, follows=0))  # 1
    reader.read(done(0))
    assert ID in reader.series
    reader.read(done(1))
    assert ID not in reader.series


def test_a_next_occurrence_after_a_racing_cancel_does_not_revive_the_series():
    reader = Reader()
    every = Series(every_ms=1000)
    reader.read(put(series=every))  # 0
    reader.read(cancel())  # 1
    reader.read(put(T0 + 1000, series=every, occurrence=2, follows=0))  # 2
    assert ID not in reader.series and reader.states[ID].pending == -1


def test_a_reschedule_without_a_schedule_stops_the_series_and_one_with_keeps_its_deliveries():
    reader = Reader()
    every = Series(every_ms=1000)
    reader.read(put(series=every))  # 0
    reader.read(put(T0 + 1000, series=every, occurrence=2, follows=0))  # 1: one delivered
    reader.read(put(T0 + 5000, series=Series(every_ms=2000)))  # 2: starts again from occurrence 1
    assert reader.series[ID] == SeriesInfo(ID, "orders", "every=2000", 1, T0 + 5000, 1, 2)
    reader.read(put(T0 + 9000))
    assert ID not in reader.series


def test_a_cron_series_shows_its_rule_as_the_frame_writes_it():
    reader = Reader()
    reader.read(put(series=Series(cron="*/5 * * * *", tz="Europe/Paris")))
    assert reader.series[ID].repeat == "cron=*/5_*_*_*_* tz=Europe/Paris"


def test_a_record_off_its_ids_partition_is_a_malformed_event_with_its_reason_code():
    reader = Reader(partitions=4)
    home = wire.buffer_partition(ID, 4)
    change = reader.read(cancel(), partition=(home + 1) % 4)
    shown = event(change)
    assert (shown.kind, shown.reason) == ("malformed", wire.Reason.WRONG_PARTITION.value)
    assert "crc32" in (shown.text or "")
    assert reader.states[ID].pending == -1


def test_records_of_no_message_make_no_event():
    reader = Reader()
    assert reader.read((b"not-an-id", b"put 1 t -\n", None)) is None
    mark = wire.mark_id(0, 1)
    assert reader.read((mark.encode(), None, wire.done_headers(mark, 0, 0))) is None


def test_a_put_with_the_replay_header_is_a_replay_of_that_dead_letter():
    reader = Reader()
    change = reader.read(put(headers=[(REPLAYED_FROM, f"{DLQ}/0/42".encode())]))
    assert change is not None and change.replay_of == (0, 42)
    shown = event(change)
    assert (shown.kind, shown.text) == ("replay", f"{DLQ}/0/42")
    other = Reader().read(put(headers=[(REPLAYED_FROM, b"another-dlq/0/42")]))
    assert other is not None and other.replay_of is None and event(other).kind == "replay"


def test_a_record_of_a_newer_feature_level_is_refused_not_called_malformed():
    with pytest.raises(wire.NewerLevelRecord):
        Reader().read((ID.encode(), f"put {T0} orders - level=9\n".encode(), None))


def test_id_state_packs_and_unpacks():
    state = IdState(events=7, pending=12, put_partition=3, put_offset=12, produced=True, repeating=True)
    assert IdState.unpack(state.pack()) == state


# -- dead letters ------------------------------------------------------------


def test_an_undeliverable_messages_dead_letter_is_replayable_and_names_its_version_target_and_due_time():
    message = wire.Envelope(ID, "orders", T0, b"payload", b"key", headers=[("app", b"1")])
    headers = [*message.buffer_headers(), (wire.EPOCH, b"3"), (wire.VERSION, b"17"),
               (wire.DEAD_LETTER_REASON, b"missing-topic: topic orders does not exist"),
               (wire.DEAD_LETTER_SOURCE, b"delayq-c-buffer/2/17")]
    letter = read_dead_letter(0, 5, T0 + 9, ID.encode(), message.buffer_value(), headers)
    assert (letter.code, letter.text, letter.id, letter.version, letter.target, letter.due_ms) == (
        "missing-topic", "topic orders does not exist", ID, 17, "orders", T0)
    assert letter.replayable and letter.coordinates == "0/5" and letter.source == "delayq-c-buffer/2/17"
    assert ("app", "1") in letter.headers and (wire.VERSION, "17") in letter.headers


def test_a_malformed_records_dead_letter_takes_its_version_from_the_source_and_cannot_be_replayed():
    headers = [(wire.OP, b"cancel"), (wire.DEAD_LETTER_REASON, b"wrong-partition: off its partition"),
               (wire.DEAD_LETTER_SOURCE, b"delayq-c-buffer/1/99")]
    letter = read_dead_letter(0, 6, T0, ID.encode(), None, headers)
    assert (letter.code, letter.version, letter.replayable, letter.target) == ("wrong-partition", 99, False, None)


def test_a_put_on_the_wrong_partition_is_replayable_with_its_target_and_due_time_but_a_bad_frame_is_not():
    message = wire.Envelope(ID, "orders", T0, b"payload", b"key", headers=[("app", b"1")])
    reason = (wire.DEAD_LETTER_REASON, b"wrong-partition: record of x is on partition 3")
    source = (wire.DEAD_LETTER_SOURCE, b"delayq-c-buffer/3/40")
    letter = read_dead_letter(0, 8, T0, ID.encode(), message.buffer_value(), [*message.buffer_headers(), reason, source])
    assert (letter.code, letter.replayable, letter.target, letter.due_ms, letter.version) == (
        "wrong-partition", True, "orders", T0, 40)
    garbled = read_dead_letter(0, 9, T0, ID.encode(), b"put soon orders", [reason, source])
    assert (garbled.replayable, garbled.target) == (False, None)
    bad_frame = (wire.DEAD_LETTER_REASON, b"bad-frame: no newline")
    not_misplaced = read_dead_letter(0, 10, T0, ID.encode(), message.buffer_value(), [bad_frame, source])
    assert (not_misplaced.replayable, not_misplaced.target) == (False, None)


def test_a_dead_letter_without_a_known_reason_code_is_unknown_and_long_header_values_are_cut():
    letter = read_dead_letter(0, 7, T0, b"not an id", b"x", [("big", b"y" * 5000), ("none", None)])
    assert (letter.code, letter.id, letter.version) == (UNKNOWN_CODE, None, None)
    assert letter.headers == (("big", "y" * 200), ("none", ""))


# -- order and coordinates ---------------------------------------------------


def at(kind: str, ts: int, offset: int, topic: str = BUFFER) -> HistoryEvent:
    return HistoryEvent(kind, ts, topic, 0, offset)  # type: ignore[arg-type]


def test_other_events_go_between_the_buffer_records_by_time_even_when_a_copy_keeps_an_old_timestamp():
    own = [at("put", 100, 0), at("done", 200, 1), at("copy", 100, 2), at("done", 300, 3)]
    letter, late = at("dead-letter", 150, 0, DLQ), at("replay", 400, 9)
    assert in_order(own, [late, letter]) == [own[0], letter, own[1], own[2], own[3], late]
    assert in_order(own, []) == own


def test_coordinates_are_partition_slash_offset():
    assert parse_coordinates("3/1200") == (3, 1200)
    for bad in ("3", "a/1", "1/-2", "", "1/2/3"):
        with pytest.raises(ValueError, match="are not <partition>/<offset>"):
            parse_coordinates(bad)
