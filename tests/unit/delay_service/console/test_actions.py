"""The console's actions: what they write to the buffer (through stand-ins of the producer and the consumer), what
they refuse, a message's state, due times as the forms take them, and the replay's id. No Kafka."""

from __future__ import annotations

import re
import uuid
from unittest import mock

import pytest
from confluent_kafka import Consumer, KafkaError, Message, Producer

from delayq import wire
from delayq.clock import now_ms
from delayq.delay_service.console import actions as actions_module
from delayq.delay_service.console.actions import (
    REPLAYED_FROM,
    ActionFailed,
    ActionRefused,
    Actions,
    message_state,
    parse_deliver_at,
    replay_id,
)
from delayq.delay_service.console.cluster import NodeLookup
from delayq.delay_service.console.index import ConsoleIndex
from delayq.delay_service.console.records import DeadLetter, HistoryEvent, Page
from delayq.schedule import Series
from delayq.settings import Settings

SETTINGS = Settings(cluster="c")
BUFFER, DLQ = SETTINGS.buffer_topic, SETTINGS.dead_letter_topic
ID = "0190a3e4-5b6c-7d8e-9f00-112233445566"
T0 = 1_800_000_000_000
PARTITIONS = 4
HOME = wire.buffer_partition(ID, PARTITIONS)
PENDING = NodeLookup(answered=True, pending=True, due_ms=T0, topic="orders")


def record(partition: int, offset: int, key: bytes | None, value: bytes | None,
           headers: list | None = None) -> mock.Mock:
    message = mock.Mock(spec_set=Message)
    message.error.return_value = None
    message.partition.return_value, message.offset.return_value = partition, offset
    message.key.return_value, message.value.return_value, message.headers.return_value = key, value, headers
    message.timestamp.return_value = (1, T0 - 1000)
    return message


def end_of(partition: int) -> mock.Mock:
    message = mock.Mock(spec_set=Message)
    message.error.return_value = KafkaError(KafkaError._PARTITION_EOF)
    message.partition.return_value = partition
    return message


class Stand:
    """The actions over stand-ins: the index, the producer (each write reported at flush, or failed), the consumer."""

    def __init__(self, records: list | None = None, fail: KafkaError | None = None):
        self.index = mock.create_autospec(ConsoleIndex, instance=True, spec_set=True)
        self.producer = mock.Mock(spec_set=Producer)
        self.reports: list = []
        self.producer.produce.side_effect = lambda *args, **kwargs: self.reports.append(kwargs["on_delivery"])

        def flush(timeout: float) -> int:
            for report in self.reports:
                report(fail, mock.Mock(spec_set=Message))
            self.reports.clear()
            return 0

        self.producer.flush.side_effect = flush
        self.consumer = mock.Mock(spec_set=Consumer)
        self.consumer.consume.side_effect = [records or [], *([[]] * 1000)]
        self.actions = Actions(SETTINGS, self.index, producer=lambda: self.producer, consumer=lambda: self.consumer,
                               partitions=lambda: PARTITIONS)

    def written(self) -> list[dict]:
        """Each record written: its topic, key, value, partition and headers."""
        return [{"topic": call.args[0], **call.kwargs} for call in self.producer.produce.call_args_list]

    def produced(self) -> list[wire.BufferRecord]:
        """Each record written, read back as every node reads it; each on the buffer, on its id's partition."""
        found = []
        for record in self.written():
            key = record["key"]
            assert record["topic"] == BUFFER and record["partition"] == wire.buffer_partition(key, PARTITIONS)
            found.append(wire.parse_buffer_record(key.encode(), record["value"], record["headers"]))
        return found


# -- the replay's id, due times, a message's state -------------------------------


def test_a_replay_id_is_a_delay_id_fixed_by_the_dead_letters_topic_and_place():
    first = replay_id("0/17", dead_letter_topic=DLQ)
    assert first == replay_id("0/17", dead_letter_topic=DLQ) == str(uuid.uuid5(actions_module.REPLAY_NAMESPACE,
                                                                                 f"{DLQ}/0/17"))
    assert wire.check_delay_id(first) == first
    assert len({first, replay_id("0/18", dead_letter_topic=DLQ), replay_id("1/17", dead_letter_topic=DLQ),
                replay_id("0/17", dead_letter_topic="other")}) == 4


@pytest.mark.parametrize(("text", "due"), [
    ("", T0), ("now", T0), (" NOW ", T0), ("90s", T0 + 90_000), ("10m", T0 + 600_000), ("1h30m", T0 + 5_400_000),
    ("2027-01-15T08:20:00Z", T0 + 1_200_000), ("2027-01-15T09:20:00+01:00", T0 + 1_200_000),
    ("2027-01-15T08:20:00.0005Z", T0 + 1_200_001)])
def test_a_due_time_is_now_a_delay_from_now_or_an_iso_time_with_a_zone(text, due):
    assert parse_deliver_at(text, T0, SETTINGS.max_delay_ms) == due  # T0 is 2027-01-15T08:00:00Z


@pytest.mark.parametrize(("text", "says"), [
    ("tomorrow", "is neither a time (ISO 8601, e.g. 2026-12-01T09:00:00Z) nor a delay from now"),
    ("2027-01-15T08:00:00", "has no time zone: add one, e.g. 2027-01-15T08:00:00Z for UTC"),
    ("1999-12-31T23:00:00Z", "before 2000-01-01"),
    ("3000d", "beyond the maximum delay")])
def test_a_due_time_the_forms_cannot_take_is_one_line_saying_why(text, says):
    with pytest.raises(ActionRefused, match=re.escape(says)) as refused:
        parse_deliver_at(text, T0, SETTINGS.max_delay_ms)
    assert refused.value.status == 400 and "\n" not in str(refused.value)


def event(kind, offset, **more) -> HistoryEvent:
    return HistoryEvent(kind, T0 + offset, more.pop("topic", BUFFER), more.pop("partition", HOME), offset, **more)


PUT = event("put", 10, due_ms=T0, target="orders")
NOBODY = NodeLookup(answered=False)
GONE = NodeLookup(answered=True, pending=False)


@pytest.mark.parametrize(("history", "latest", "node", "state"), [
    ([PUT], (HOME, 10), PENDING, "pending"),
    ([PUT], (HOME, 10), NOBODY, "pending"),  # the nodes did not answer: the index's word
    ([PUT], (HOME, 10), GONE, "unknown"),  # the nodes no longer hold it, the index has not read how it ended
    ([PUT, event("cancel", 11)], (HOME, 10), GONE, "cancelled"),
    ([PUT, event("done", 12, version=10)], (HOME, 10), GONE, "delivered"),
    ([PUT, event("dead-letter", 1, topic=DLQ, partition=0, version=10), event("done", 12, version=10)], (HOME, 10),
     GONE, "dead-lettered"),
    ([PUT, event("done", 12, version=9)], (HOME, 10), NOBODY, "pending"),  # a done of an older version
    ([PUT, event("reschedule", 13), event("done", 14, version=10)], (HOME, 13), NOBODY, "pending"),
    ([PUT, event("cancel", 11)], (HOME, 10), PENDING, "pending"),  # a later put the index has not read yet
    ([], None, GONE, "unknown"),
    ([event("malformed", 3, reason="bad-frame"), event("dead-letter", 1, topic=DLQ, partition=0)], None, GONE,
     "dead-lettered")])
def test_a_messages_state_is_the_nodes_pending_or_how_the_index_saw_it_end(history, latest, node, state):
    assert message_state(history, latest, node, BUFFER) == state


# -- cancel and reschedule -------------------------------------------------------


def test_a_cancel_is_a_cancel_tombstone_on_the_ids_partition_confirmed():
    stand = Stand()
    assert stand.actions.cancel(f" {ID} ") == f"cancelled {ID}"
    (cancel,) = stand.produced()
    assert (cancel.op, cancel.delay_id, cancel.envelope) == (wire.OP_CANCEL, ID, None)


def test_a_cancel_of_no_id_sends_nothing():
    stand = Stand()
    with pytest.raises(ActionRefused, match="is not a delay id") as refused:
        stand.actions.cancel("0190-nope")
    assert refused.value.status == 400
    stand.producer.produce.assert_not_called()


def test_a_write_kafka_does_not_confirm_fails_in_one_line():
    stand = Stand(fail=KafkaError(KafkaError._MSG_TIMED_OUT))
    with pytest.raises(ActionFailed, match=r"the cancel of .*: Kafka confirmed 0 of 1 write\(s\)"):
        stand.actions.cancel(ID)


def pending_put(due: int, **envelope) -> tuple[bytes, list]:
    message = wire.Envelope(ID, "orders", due, b"payload", key=b"k-1", headers=[("trace", b"t-9")],
                            partitioner="murmur2", **envelope)
    return message.buffer_value(), message.buffer_headers()


@pytest.mark.parametrize("schedule", [{"series": Series(every_ms=60_000, times=5), "occurrence": 3},
                                      {"expires_at_ms": T0 + 30_000, "attempt": 2}])
def test_a_reschedule_re_puts_the_message_as_the_buffer_has_it_due_at_the_new_time(schedule):
    value, headers = pending_put(T0, **schedule)
    stand = Stand([record(HOME, 17, ID.encode(), value, headers)])
    stand.index.latest_put.return_value = (HOME, 17)
    stand.index.history.return_value = [event("put", 17, target="orders")]
    line = stand.actions.reschedule(ID, "2027-01-15T09:00:00Z", PENDING)
    assert line == f"rescheduled {ID} to 2027-01-15T09:00:00.000Z"
    stand.consumer.assign.assert_called_once()
    assert [(tp.topic, tp.partition, tp.offset) for tp in stand.consumer.assign.call_args.args[0]] == [
        (BUFFER, HOME, 17)]
    (put,) = stand.produced()
    moved = put.envelope
    assert put.op == wire.OP_PUT and put.delay_id == ID
    assert (moved.deliver_at_ms, moved.topic, moved.key, moved.value, moved.headers, moved.partitioner) == (
        T0 + 3_600_000, "orders", b"k-1", b"payload", [("trace", b"t-9")], "murmur2")
    assert (moved.series, moved.occurrence, moved.attempt) == (schedule.get("series"), schedule.get("occurrence"),
                                                              schedule.get("attempt"))
    if "expires_at_ms" in schedule:
        assert moved.expires_at_ms == moved.deliver_at_ms + 30_000  # the same time between due and expiry


def test_a_message_that_is_not_pending_is_not_rescheduled():
    stand = Stand()
    stand.index.latest_put.return_value = (HOME, 10)
    stand.index.history.return_value = [PUT, event("done", 12, version=10)]
    with pytest.raises(ActionRefused, match=r"is not pending \(delivered\)") as refused:
        stand.actions.reschedule(ID, "10m", GONE)
    assert refused.value.status == 409
    stand.producer.produce.assert_not_called()


def test_a_put_gone_from_the_buffer_is_refused_and_nothing_written():
    stand = Stand([record(HOME, 20, ID.encode(), b"x")])  # the partition goes on past offset 17: compacted away
    stand.index.latest_put.return_value = (HOME, 17)
    stand.index.history.return_value = [event("put", 17, target="orders")]
    with pytest.raises(ActionRefused, match="is no longer in the buffer"):
        stand.actions.reschedule(ID, "10m", PENDING)
    stand.producer.produce.assert_not_called()
    stand.consumer.unassign.assert_called_once()


# -- replay -------------------------------------------------------------------------


def letter(offset: int, **more) -> DeadLetter:
    fields = {"partition": 0, "offset": offset, "ts_ms": T0, "code": "missing-topic", "text": "no such topic",
              "id": ID, "source": f"{BUFFER}/{HOME}/9", "version": 9, "target": "orders", "due_ms": T0, "headers": (),
              "replayable": True, **more}
    return DeadLetter(**fields)


def dead_record(offset: int) -> mock.Mock:
    value, headers = pending_put(T0, series=Series(every_ms=1000))
    return record(0, offset, ID.encode(), value, [*headers, (wire.VERSION, b"9"), (REPLAYED_FROM, b"old/0/1"),
                                                  (wire.DEAD_LETTER_REASON, b"missing-topic: no such topic")])


def test_a_replay_puts_the_dead_letters_message_under_its_replay_id_naming_where_it_came_from():
    stand = Stand([dead_record(5)])
    stand.index.dead_letter.return_value = letter(5)
    before = now_ms()
    line = stand.actions.replay(["0/5"], "")
    rid = replay_id("0/5", dead_letter_topic=DLQ)
    assert line.startswith(f"replayed dead letter 0/5 as {rid}, ")
    (put,) = stand.produced()
    message = put.envelope
    assert put.delay_id == rid and message.deliver_at_ms >= before and message.series is None
    assert (message.topic, message.key, message.value) == ("orders", b"k-1", b"payload")
    assert message.headers == [("trace", b"t-9"), (REPLAYED_FROM, f"{DLQ}/0/5".encode())]
    stand.index.mark_replayed.assert_called_once_with("0/5", rid)


def test_a_dead_letter_replayed_before_is_refused_naming_its_replay():
    stand = Stand()
    stand.index.dead_letter.return_value = letter(5, replayed_as="0190a3e4-0000-7000-8000-000000000001")
    with pytest.raises(ActionRefused, match="0/5 was replayed already, as 0190a3e4-0000-7000-8000-000000000001"):
        stand.actions.replay(["0/5"], "")
    stand.producer.produce.assert_not_called()


def test_a_replay_of_several_skips_those_that_cannot_be_and_says_which():
    stand = Stand([dead_record(5)])
    stand.index.dead_letter.side_effect = lambda c: {"0/5": letter(5), "0/6": letter(6, replayable=False,
                                                                                       code="bad-frame")}[c]
    line = stand.actions.replay(["0/5", "0/6", "0/5"], "")
    assert "replayed dead letter 0/5 as" in line and "0/6 (bad-frame) carries no message to replay" in line
    assert len(stand.produced()) == 1


@pytest.mark.parametrize(("coordinates", "says", "status"), [
    ("zero/5", "are not <partition>/<offset>", 400), ("0/99", "has no dead letter at", 404)])
def test_a_replay_of_no_dead_letter_is_one_line(coordinates, says, status):
    stand = Stand()
    stand.index.dead_letter.return_value = None
    with pytest.raises(ActionRefused, match=says) as refused:
        stand.actions.replay([coordinates], "")
    assert refused.value.status == status


def test_a_filtered_replay_pages_through_the_code_and_stops_at_the_cap(monkeypatch):
    monkeypatch.setattr(actions_module, "FILTERED_REPLAY_CAP", 3)
    pages = {None: Page((letter(9), letter(8, replayed_as=ID), letter(7)), "p2"),
             "p2": Page((letter(6), letter(5), letter(4)), None)}
    stand = Stand([dead_record(offset) for offset in (6, 7, 9)])
    stand.index.dead_letters.side_effect = lambda after, limit, code: pages[after]
    line = stand.actions.replay_code("missing-topic", "10m")
    assert line.startswith("replayed 3 dead letters as ")
    assert "of code missing-topic; 1 skipped (replayed before or carrying no message); stopped at 3" in line
    assert {put.delay_id for put in stand.produced()} == {replay_id(f"0/{o}", dead_letter_topic=DLQ)
                                                          for o in (9, 7, 6)}
    assert stand.index.mark_replayed.call_count == 3


def test_a_filtered_replay_with_nothing_to_replay_is_refused():
    stand = Stand()
    stand.index.dead_letters.return_value = Page((), None)
    with pytest.raises(ActionRefused, match="no dead letter of code 'rejected' to replay") as refused:
        stand.actions.replay_code("rejected", "")
    assert refused.value.status == 404


def test_a_buffer_that_does_not_exist_is_one_line_saying_to_create_it():
    stand = Stand()
    stand.actions = Actions(SETTINGS, stand.index, producer=lambda: stand.producer, partitions=lambda: None)
    with pytest.raises(ActionFailed, match=f"the buffer topic {BUFFER} does not exist: create it with `delayq init`"):
        stand.actions.cancel(ID)


def test_records_far_apart_are_sought_not_read_through():
    stand = Stand([record(0, 1, ID.encode(), b"x"), record(0, 5000, ID.encode(), b"y"), end_of(0)])
    found = stand.actions._read_records(DLQ, [(0, 1), (0, 5000), (0, 7000)], 5.0)
    assert sorted(found) == [(0, 1), (0, 5000)]  # the end came before 7000: gone
    assert [c.args[0].offset for c in stand.consumer.seek.call_args_list] == [5000, 7000]
