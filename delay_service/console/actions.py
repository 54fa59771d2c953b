"""What the console may do to messages: cancel, reschedule, replay a dead letter; and a message's state, which says
which of them applies.

Every action writes to the buffer what a client's producer would (the records of :mod:`delayq.wire`: a
``cancel`` tombstone, a ``put``), on the id's buffer partition, through one idempotent producer of the
console's, made on its first action (idempotence keeps each id's writes in order, as delayq's producer
does). A reschedule and a replay re-put the message as the buffer has it (its put frame read back,
:class:`delayq.wire.Envelope`), so its key, payload, headers, target partition or partitioner, and a
series' schedule stay as they were.

A replay is idempotent: its delay id is :func:`replay_id` of the dead letter (the same every time), its put
carries :data:`REPLAYED_FROM` naming the dead letter, and the index (mark_replayed, and its own reading of that
header) refuses a dead letter replayed before. A filtered replay (every replayable dead letter of a reason code)
replays at most :data:`FILTERED_REPLAY_CAP` per action.

Who may act is the app's business (auth.py); what happened is logged by it on ``delayq.console.audit``.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Literal, cast

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from delayq import wire
from delayq.clock import now_ms, parse_duration_ms
from delayq.errors import DelayqError, UnavailableError
from delayq.schedule import due_ms
from delayq.settings import Settings

from ..http import iso_ms
from ..topics import admin_client, buffer_partition_count
from .cluster import NodeLookup
from .history import REPLAYED_FROM, parse_coordinates
from .index import ConsoleIndex, consumer_group
from .records import MAX_PAGE, DeadLetter, HistoryEvent

__all__ = ["FILTERED_REPLAY_CAP", "REPLAYED_FROM", "ActionFailed", "ActionRefused", "Actions", "MessageState",
           "message_state", "parse_deliver_at", "replay_id"]

# The most dead letters one filtered replay re-produces; the flash says when it stopped there (replay again for
# the rest: those replayed are skipped).
FILTERED_REPLAY_CAP = 10_000
# How long an action waits for Kafka to confirm its writes, and a reschedule for the put it reads back.
ACTION_TIMEOUT_S = 10.0
# The namespace of replay ids (uuid5): fixed for ever, so a dead letter's replay id never changes.
REPLAY_NAMESPACE = uuid.UUID("5b0f3a1e-7c2d-4e61-9a8b-3d6f0c1e2a47")
# Reading records back: a consumer reads on to the next record wanted up to this many records ahead, and seeks
# beyond; a replay of many dead letters waits for Kafka at least this many records a second.
SEEK_GAP = 1000
READ_PER_S = 200

MessageState = Literal["pending", "delivered", "cancelled", "dead-lettered", "unknown"]
_OPENING = frozenset({"put", "reschedule", "copy", "next-occurrence", "replay"})


class ActionRefused(DelayqError):
    """An action the console will not do: bad input, or a state that forbids it. One line; ``status``: the HTTP
    status to answer with (400 bad input, 404 nothing there, 409 the state forbids it)."""

    def __init__(self, text: str, status: int = 400):
        super().__init__(text)
        self.status = status


class ActionFailed(DelayqError):
    """Kafka did not take an action's writes (or did not answer): nothing or not everything was done; one line."""


def replay_id(coordinates: str, *, dead_letter_topic: str) -> str:
    """The delay id of the replay of the dead letter at ``coordinates`` (``<partition>/<offset>``) of the topic."""
    return str(uuid.uuid5(REPLAY_NAMESPACE, replayed_from(dead_letter_topic, coordinates)))


def replayed_from(dead_letter_topic: str, coordinates: str) -> str:
    """The :data:`REPLAYED_FROM` header's value: ``<dead-letter topic>/<partition>/<offset>``."""
    return f"{dead_letter_topic}/{coordinates}"


def message_state(history: Sequence[HistoryEvent], latest_put: tuple[int, int] | None, node: NodeLookup,
                  buffer_topic: str) -> MessageState:
    """Where a message stands: the nodes' word for pending (their stores deliver it), the index's for how it ended.

    The index's latest put of the id (``latest_put``: buffer partition and offset) is open until a
    cancel of the id, or a done of that version, follows it in the buffer. A done of a version that a
    dead letter names means it was dead-lettered, not delivered. When the nodes answered that they do
    not hold it but the index has not read how it ended, the state is unknown.
    """
    if node.answered and node.pending:
        return "pending"
    if latest_put is None:
        return "dead-lettered" if any(e.kind == "dead-letter" for e in history) else "unknown"
    partition, offset = latest_put
    ending = next((e for e in history if e.topic == buffer_topic and e.partition == partition and e.offset > offset
                   and (e.kind == "cancel" or (e.kind == "done" and e.version == offset))), None)
    if ending is None:
        return "unknown" if node.answered else "pending"
    if ending.kind == "cancel":
        return "cancelled"
    dead = any(e.kind == "dead-letter" and e.version == offset for e in history)
    return "dead-lettered" if dead else "delivered"


def parse_deliver_at(text: str, now: int, max_delay_ms: int) -> int:
    """Epoch ms of a due time as the forms take it: empty or ``now``, a delay (``90s``, ``10m``, ``1h30m``: from
    ``now``), or an ISO 8601 time with a time zone (``2026-12-01T09:00:00Z``).

    Raises:
        ActionRefused: none of these, no time zone, before 2000, or beyond the cluster's maximum delay.
    """
    stripped = text.strip()
    if not stripped or stripped.lower() == "now":
        return now
    deliver_at: datetime | int
    try:
        deliver_at = now + parse_duration_ms(stripped, "deliver_at")
    except ValueError:
        try:
            deliver_at = datetime.fromisoformat(stripped)
        except ValueError:
            raise ActionRefused(f"deliver_at {stripped[:60]!r} is neither a time (ISO 8601, e.g. "
                                "2026-12-01T09:00:00Z) nor a delay from now (e.g. 90s, 10m, 2h)") from None
        if deliver_at.tzinfo is None:
            raise ActionRefused(f"deliver_at {stripped[:60]!r} has no time zone: add one, e.g. {stripped[:40]}Z "
                                "for UTC") from None
    try:
        return due_ms(now, None, deliver_at, max_delay_ms)
    except ValueError as err:
        raise ActionRefused(f"deliver_at {stripped[:60]!r}: {err}") from None


def check_id(text: str) -> str:
    """Raises: ActionRefused: ``text`` is no delay id."""
    try:
        return wire.check_delay_id(text.strip(), "id")
    except (TypeError, ValueError) as err:
        raise ActionRefused(str(err)) from None


class Actions:
    """The console's actions over one cluster; safe from many request threads (one action at a time).

    Args:
        settings: the cluster's (topics, Kafka client settings, the maximum delay).
        index: where histories, latest puts and dead letters are read.
        producer: makes the console's producer, on the first action (default: an idempotent one of ``settings``).
        partitions: tells the buffer's partition count, on the first action (default: asked of Kafka).
        consumer: makes the consumer a reschedule reads a put back with, on the first reschedule.
    """

    def __init__(self, settings: Settings, index: ConsoleIndex, *, producer: Callable[[], Producer] | None = None,
                 consumer: Callable[[], Consumer] | None = None, partitions: Callable[[], int | None] | None = None):
        self.settings = settings
        self.index = index
        self._new_producer = producer or (lambda: Producer(settings.kafka_conf(**{
            "client.id": f"delayq-console-{settings.node_id}", "enable.idempotence": True, "linger.ms": 5})))
        self._new_consumer = consumer or (lambda: Consumer(settings.kafka_conf(**{
            "group.id": consumer_group(settings), "client.id": f"delayq-console-reschedule-{settings.node_id}",
            "enable.auto.commit": False, "enable.auto.offset.store": False, "isolation.level": "read_committed",
            "enable.partition.eof": True})))
        self._ask_partitions = partitions or (lambda: buffer_partition_count(settings, admin_client(settings)))
        self._producer: Producer | None = None
        self._consumer: Consumer | None = None
        self._partitions: int | None = None
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            if self._producer is not None:
                self._producer.flush(ACTION_TIMEOUT_S)
                self._producer = None
            if self._consumer is not None:
                self._consumer.close()
                self._consumer = None

    # -- the actions -----------------------------------------------------------

    def cancel(self, delay_id: str) -> str:
        """Cancel ``delay_id`` (harmless when it is not pending); the result line.

        Raises:
            ActionRefused: not a delay id.
            ActionFailed: Kafka did not confirm the cancel.
        """
        delay_id = check_id(delay_id)
        with self._lock:
            self._write([(delay_id, None, wire.control_headers(wire.OP_CANCEL, delay_id))], f"the cancel of {delay_id}")
        return f"cancelled {delay_id}"

    def reschedule(self, delay_id: str, deliver_at: str, node: NodeLookup) -> str:
        """Move pending ``delay_id`` to ``deliver_at`` (:func:`parse_deliver_at`), the message otherwise as it is.

        ``node``: what the nodes say of the id now (it must be pending).

        Raises:
            ActionRefused: a bad id or time; the id is not pending, or its put is no longer in the buffer.
            ActionFailed: Kafka did not answer, or did not confirm the put.
        """
        delay_id = check_id(delay_id)
        due = parse_deliver_at(deliver_at, now_ms(), self.settings.max_delay_ms)
        latest = self.index.latest_put(delay_id)
        state = message_state(self.index.history(delay_id), latest, node, self.settings.buffer_topic)
        if state != "pending" or latest is None:
            raise ActionRefused(f"{delay_id} is not pending ({state}): only a pending message can be rescheduled",
                                status=409)
        with self._lock:
            record = self._read_records(self.settings.buffer_topic, [latest], ACTION_TIMEOUT_S).get(latest)
            if record is None or record.key() != delay_id.encode():
                raise ActionRefused(f"the put of {delay_id} at {self.settings.buffer_topic}/{latest[0]}/{latest[1]} "
                                    "is no longer in the buffer (delivered or replaced meanwhile): reload the page",
                                    status=409)
            message = _envelope(record.key(), record.value(), _user_headers(_headers(record)), record.timestamp()[1])
            # An expiring message keeps the same time between its due time and its expiry.
            expires = None if message.expires_at_ms is None else due + message.expires_at_ms - message.deliver_at_ms
            self._put_all([dataclasses.replace(message, deliver_at_ms=due, expires_at_ms=expires)],
                          f"the reschedule of {delay_id}")
        return f"rescheduled {delay_id} to {_iso(due)}"

    def replay(self, coordinates: Sequence[str], deliver_at: str) -> str:
        """Replay the dead letters at ``coordinates`` (``<partition>/<offset>`` each), due at ``deliver_at``.

        Those replayed before are skipped and named; the result line says what was done.

        Raises:
            ActionRefused: bad coordinates or time, no dead letter there, none of them can be replayed.
            ActionFailed: Kafka did not answer, or did not confirm the puts.
        """
        if not coordinates:
            raise ActionRefused("no dead letter named: give coordinates=<partition>/<offset> (or code=<reason>)")
        due = parse_deliver_at(deliver_at, now_ms(), self.settings.max_delay_ms)
        letters = []
        for text in dict.fromkeys(c.strip() for c in coordinates):
            try:
                parse_coordinates(text)
            except ValueError as err:
                raise ActionRefused(str(err)) from None
            letter = self.index.dead_letter(text)
            if letter is None:
                raise ActionRefused(f"the console's index has no dead letter at {self.settings.dead_letter_topic}/"
                                    f"{text}: use the coordinates the dead-letter list shows", status=404)
            letters.append(letter)
        reasons = {letter.coordinates: _skip_reason(letter) for letter in letters}
        skipped = [reason for reason in reasons.values() if reason is not None]
        wanted = [letter for letter in letters if reasons[letter.coordinates] is None]
        if not wanted:
            raise ActionRefused("; ".join(skipped), status=409)
        done = self._replay(wanted, due)
        return "; ".join([_replayed_line(done, due), *skipped])

    def replay_code(self, code: str, deliver_at: str) -> str:
        """Replay every replayable dead letter of reason ``code`` not replayed yet, at most
        :data:`FILTERED_REPLAY_CAP`; the result line (with the count).

        Raises:
            ActionRefused: a bad time; no such code; nothing of it to replay.
            ActionFailed: Kafka did not answer, or did not confirm the puts.
        """
        code = code.strip()
        due = parse_deliver_at(deliver_at, now_ms(), self.settings.max_delay_ms)
        wanted: list[DeadLetter] = []
        skipped = 0
        after: str | None = None
        while len(wanted) < FILTERED_REPLAY_CAP:
            page = self.index.dead_letters(after, MAX_PAGE, code)
            for letter in page.items:
                if _skip_reason(letter) is None:
                    wanted.append(letter)
                else:
                    skipped += 1
            after = page.next
            if after is None:
                break
        capped = len(wanted) > FILTERED_REPLAY_CAP or (len(wanted) == FILTERED_REPLAY_CAP and after is not None)
        wanted = wanted[:FILTERED_REPLAY_CAP]
        if not wanted:
            raise ActionRefused(f"no dead letter of code {code!r} to replay ({skipped} replayed before or carrying no "
                                "message)", status=409 if skipped else 404)
        done = self._replay(wanted, due)
        line = f"{_replayed_line(done, due)} of code {code}"
        if skipped:
            line += f"; {skipped} skipped (replayed before or carrying no message)"
        if capped:
            line += f"; stopped at {FILTERED_REPLAY_CAP:,} (the most one action replays): replay again for the rest"
        return line

    # -- how ---------------------------------------------------------------------

    def _replay(self, letters: Sequence[DeadLetter], due: int) -> list[tuple[str, str]]:
        """Re-put each dead letter's message as its replay, confirmed; (coordinates, replay id) of each.

        Raises:
            ActionRefused: a dead letter is gone from Kafka (retention), or carries no readable put.
            ActionFailed: Kafka did not answer, or did not confirm every put.
        """
        topic = self.settings.dead_letter_topic
        with self._lock:
            records = self._read_records(topic, [(letter.partition, letter.offset) for letter in letters],
                                         max(ACTION_TIMEOUT_S, len(letters) / READ_PER_S))
            puts = []
            for letter in letters:
                record = records.get((letter.partition, letter.offset))
                if record is None:
                    raise ActionRefused(f"dead letter {topic}/{letter.coordinates} is no longer in Kafka (retention "
                                        "deleted it): it cannot be replayed; nothing was replayed", status=409)
                message = _envelope(record.key(), record.value(),
                                    [(n, v) for n, v in _user_headers(_headers(record)) if n != REPLAYED_FROM])
                source = replayed_from(topic, letter.coordinates)
                puts.append((letter.coordinates, dataclasses.replace(
                    message, delay_id=replay_id(letter.coordinates, dead_letter_topic=topic), deliver_at_ms=due,
                    headers=[*message.headers, (REPLAYED_FROM, source.encode())], series=None, occurrence=None,
                    attempt=None, expires_at_ms=None)))
            self._put_all([put for _, put in puts], f"the replay of {len(puts):,} dead letter(s)")
        for coordinates, put in puts:
            self.index.mark_replayed(coordinates, put.delay_id)
        return [(coordinates, put.delay_id) for coordinates, put in puts]

    def _put_all(self, messages: Sequence[wire.Envelope], what: str) -> None:
        """Write each message's put to the buffer (its frame as :class:`wire.Envelope` writes it), confirmed."""
        self._write([(m.delay_id, m.buffer_value(), m.buffer_headers()) for m in messages], what)

    def _write(self, records: Sequence[tuple[str, bytes | None, wire.ProduceHeaders]], what: str) -> None:
        """Write each (delay id, value, headers) to the buffer, on the id's partition, and check Kafka confirmed each.

        Raises:
            ActionFailed: Kafka did not answer, the buffer does not exist, or a write failed or was not confirmed
                within :data:`ACTION_TIMEOUT_S`.
        """
        if self._partitions is None:
            try:
                self._partitions = self._ask_partitions()
            except UnavailableError as err:
                raise ActionFailed(f"{what}: {err}; nothing was written") from None
            if self._partitions is None:
                raise ActionFailed(f"{what}: the buffer topic {self.settings.buffer_topic} does not exist: create it "
                                   "with `delayq init`; nothing was written")
        if self._producer is None:
            self._producer = self._new_producer()
        producer, partitions = self._producer, self._partitions
        failed: list[str] = []
        confirmed = 0

        def report(err: KafkaError | None, _message: Message) -> None:
            nonlocal confirmed
            if err is None:
                confirmed += 1
            else:
                failed.append(err.str())

        try:
            for delay_id, value, headers in records:
                producer.produce(self.settings.buffer_topic, value=value, key=delay_id,
                                 partition=wire.buffer_partition(delay_id, partitions), on_delivery=report,
                                 headers=headers)
        except (BufferError, KafkaException) as err:
            raise ActionFailed(f"{what}: the producer refused it ({err}); nothing more was written") from None
        producer.flush(ACTION_TIMEOUT_S)
        if failed or confirmed < len(records):
            said = failed[0] if failed else f"no confirmation within {ACTION_TIMEOUT_S:g} s: is Kafka reachable?"
            raise ActionFailed(f"{what}: Kafka confirmed {confirmed} of {len(records)} write(s) ({said}); the page "
                               "shows what the buffer has")

    def _read_records(self, topic: str, places: Sequence[tuple[int, int]],
                      timeout_s: float) -> dict[tuple[int, int], Message]:
        """The records of ``topic`` at ``places`` (partition, offset), read in one pass per partition; a place
        missing from the answer is no longer there (compacted or deleted away, or an aborted write).

        Reads on from each record to the next wanted one, or seeks when that is more than
        :data:`SEEK_GAP` records further.

        Raises:
            ActionFailed: Kafka did not answer, or not in ``timeout_s``.
        """
        wanted: dict[int, list[int]] = {}
        for place_partition, place_offset in sorted(set(places)):
            wanted.setdefault(place_partition, []).append(place_offset)
        following = {partition: 0 for partition in wanted}  # the index in wanted[partition] of the next one
        sought: dict[int, int] = {}
        found: dict[tuple[int, int], Message] = {}
        if self._consumer is None:
            self._consumer = self._new_consumer()
        consumer = self._consumer
        assigned = [TopicPartition(topic, k, first[0]) for k, first in wanted.items()]
        consumer.assign(assigned)
        # librdkafka keeps a partition paused across unassign and assign: the last read paused those it finished.
        consumer.resume(assigned)
        deadline = time.monotonic() + timeout_s
        try:
            while following and time.monotonic() < deadline:
                for message in consumer.consume(500, 0.2):
                    partition = cast(int, message.partition())  # a consumed record's, never None
                    if partition not in following:
                        continue
                    offsets = wanted[partition]
                    error = message.error()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:
                            del following[partition]  # the rest of its places are gone
                        continue
                    offset, at = cast(int, message.offset()), following[partition]
                    while at < len(offsets) and offsets[at] < offset:
                        at += 1  # not there: the partition goes on past it
                    if at < len(offsets) and offsets[at] == offset:
                        found[(partition, offset)] = message
                        at += 1
                    if at == len(offsets):
                        del following[partition]
                        consumer.pause([TopicPartition(topic, partition)])
                        continue
                    following[partition] = at
                    if offsets[at] - offset > SEEK_GAP and sought.get(partition) != offsets[at]:
                        sought[partition] = offsets[at]
                        consumer.seek(TopicPartition(topic, partition, offsets[at]))
        except KafkaException as err:
            raise ActionFailed(f"reading {len(places):,} record(s) of {topic}: Kafka did not answer ({err}); nothing "
                               "was written") from None
        finally:
            consumer.unassign()
        if following:
            raise ActionFailed(f"reading {len(places):,} record(s) of {topic}: Kafka at "
                               f"{self.settings.bootstrap_servers} did not give them within {timeout_s:g} s; nothing "
                               "was written")
        return found


def _skip_reason(letter: DeadLetter) -> str | None:
    """Why ``letter`` is not replayed (one clause), or None when it is to be."""
    if letter.replayed_as is not None:
        return f"dead letter {letter.coordinates} was replayed already, as {letter.replayed_as}"
    if not letter.replayable:
        return (f"dead letter {letter.coordinates} ({letter.code}) carries no message to replay: only an undeliverable "
                "message's copy or a put on the wrong partition does")
    return None


def _headers(record: Message) -> wire.Headers | None:
    """A consumed record's headers, as a list of (name, bytes or None)."""
    return cast("wire.Headers | None", record.headers())


def _user_headers(headers: wire.Headers | None) -> wire.Headers:
    """A record's headers without delayq's (a dead letter's reason, source and version; a put has none)."""
    return [(name, data) for name, data in headers or () if not name.startswith(wire.RESERVED_PREFIX)]


def _envelope(key: bytes | None, value: bytes | None, headers: wire.Headers, ts_ms: int = 0) -> wire.Envelope:
    """The message a put (or a replayable dead letter: an undeliverable message's copy, a misplaced put) carries.

    Raises:
        ActionRefused: the record is no put this delayq reads.
    """
    try:
        record = wire.parse_buffer_record(key, value, headers, ts_ms)
    except (wire.MalformedRecord, wire.NewerLevelRecord) as err:
        raise ActionRefused(f"the record carries no put this console can read ({err})", status=409) from None
    if record.envelope is None:
        raise ActionRefused("the record is a tombstone, not a put: there is no message to write again", status=409)
    return record.envelope


def _replayed_line(done: Sequence[tuple[str, str]], due: int) -> str:
    when = "now" if due <= now_ms() else f"due {_iso(due)}"
    if len(done) == 1:
        coordinates, delay_id = done[0]
        return f"replayed dead letter {coordinates} as {delay_id}, {when}"
    named = ", ".join(delay_id for _, delay_id in done[:3]) + (", ..." if len(done) > 3 else "")
    return f"replayed {len(done):,} dead letters as {named}, {when}"


def _iso(epoch_ms: int) -> str:
    return iso_ms(epoch_ms) or f"{epoch_ms} ms"
