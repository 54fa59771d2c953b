"""The console's index: what only Kafka knows (an id's history, the dead letters, the live series), kept in a RocksDB.

One consumer thread (:class:`IndexFeed`) reads the buffer topic and the dead-letter topic from
their start, read_committed, every partition assigned (no consumer group joins or commits), and
hands each consumed batch to the store, which applies it in one RocksDB WriteBatch together with
the next offset of each partition it reached, so a restart resumes exactly where the index is. The
meaning of each record is history.py's (the buffer's grammar is :func:`delayq.wire.parse_buffer_record`'s).
The RocksDB, its key layout and the order each key encodes are index_store.py's
(:class:`IndexStore`, which :class:`ConsoleIndex` is).

A stored offset above a topic's end offset means the topic was recreated: the index is
emptied and read again from the start, and says why.

Example:
    >>> index = ConsoleIndex(settings)          # doctest: +SKIP
    >>> index.start(); index.wait_caught_up(60)
    >>> index.history("0190a3e4-5b6c-7d8e-9f00-112233445566")
    >>> index.stop()
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import NamedTuple, cast

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec

from delayq import wire
from delayq.errors import UnavailableError
from delayq.settings import Settings

from .history import parse_coordinates
from .index_store import ConsoleIndexError, Consumed, IndexStore
from .records import HistoryEvent

# IndexStore and ConsoleIndexError are the store's (index_store.py), named here too: what the console imports.
__all__ = ["ConsoleIndex", "ConsoleIndexError", "Consumed", "IndexFeed", "IndexStore", "KafkaRecord",
           "consumer_group", "index_path"]

log = logging.getLogger("delayq.console.index")

# Records per consume() and how long one waits for the first: stop() is answered within POLL_S.
BATCH = 5000
POLL_S = 0.2
# How often the topics' end offsets are asked for (lag, caught up), and how long a request may take.
ENDS_EVERY_S = 0.5
ENDS_TIMEOUT_S = 10.0
# After a Kafka error, and while a topic is missing, the thread waits this long before trying again.
RETRY_S = 2.0
# find_delivery: the window around the done's time, and the most records it reads.
FIND_WINDOW_MS = 5000
FIND_MAX_RECORDS = 20_000
# How long one bounded read of Kafka (find_delivery, dead_letter_record) may take.
FETCH_TIMEOUT_S = 10.0


class KafkaRecord(NamedTuple):
    """A record as Kafka holds it (a dead letter read back for a replay)."""

    key: bytes | None
    value: bytes | None
    headers: wire.Headers


def index_path(settings: Settings) -> Path:
    """Where the console keeps its index: ``console_data_dir``, else ``data_dir/console``."""
    return settings.console_data_dir or settings.data_dir / "console"


def consumer_group(settings: Settings) -> str:
    """The group id the index's consumers name: librdkafka wants one; they never join it or commit."""
    return settings.console_group


def _consumer_conf(settings: Settings, purpose: str, **more: object) -> dict:
    """A read_committed consumer that is assigned partitions and never commits (settings' SASL/TLS included)."""
    return settings.kafka_conf(**{
        "group.id": consumer_group(settings),
        "client.id": f"delayq-console-{purpose}-{settings.node_id}",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "isolation.level": "read_committed",
        # An offset the index kept that retention has deleted since: read from the oldest left.
        "auto.offset.reset": "earliest",
        **more,
    })


class _Ends(NamedTuple):
    """End offsets asked for: the futures, and the index's next offsets when they were asked."""

    futures: dict[TopicPartition, Future]
    read: dict[tuple[str, int], int]


class IndexFeed:
    """The consumer thread's work: assign every partition of both topics, apply what comes, follow the ends.

    Kafka errors are logged in one line and tried again after RETRY_S; a topic that does
    not exist yet (a cluster before ``delayq init``) is waited for.
    """

    def __init__(self, settings: Settings, store: IndexStore):
        self.settings = settings
        self.store = store
        self.topics = (settings.buffer_topic, settings.dead_letter_topic)
        self.consumer: Consumer | None = None
        self.assigned: list[TopicPartition] = []
        self.missing: tuple[str, ...] = ()
        self._missing_checked = 0.0
        self._admin: AdminClient | None = None
        self._asked: _Ends | None = None
        self._ask_at = 0.0
        # (topic, partition) -> the consumer's position / the end offset (last stable offset) Kafka gave.
        self.positions: dict[tuple[str, int], int] = {}
        self.ends: dict[tuple[str, int], int] | None = None
        self.ends_answered = 0  # end offset answers so far: wait_caught_up waits for one asked after it began
        self.progress = threading.Condition()
        self._said: str | None = None

    def run(self, stopping: threading.Event) -> None:
        while not stopping.is_set():
            try:
                if self.consumer is None and not self._assign():
                    stopping.wait(RETRY_S)
                    continue
                self._poll()
                self._follow_ends()
            except KafkaException as err:
                self._say(f"console index: Kafka: {err.args[0].str() if err.args else err}; trying again in "
                          f"{RETRY_S:g} s")
                self._drop_consumer()
                stopping.wait(RETRY_S)
            except Exception as err:  # never a crash: the console goes on serving what it has
                log.exception("console index: %s; trying again in %g s", err, RETRY_S)
                self._drop_consumer()
                stopping.wait(RETRY_S)
        self._drop_consumer()

    def _say(self, line: str) -> None:
        """Log ``line`` once while it stays the same (a Kafka that is away says so once, not every RETRY_S)."""
        if line != self._said:
            log.warning("%s", line)
            self._said = line

    def _assign(self) -> bool:
        """A consumer on every partition of both topics, each from the index's next offset; False: no buffer yet."""
        consumer = Consumer(_consumer_conf(self.settings, "index"))
        try:
            counts = {}
            for topic in self.topics:
                found = consumer.list_topics(topic, timeout=ENDS_TIMEOUT_S).topics.get(topic)
                if found is not None and found.error is None and found.partitions:
                    counts[topic] = len(found.partitions)
            if self.settings.buffer_topic not in counts:
                self._say(f"console index: buffer topic {self.settings.buffer_topic} does not exist (yet): waiting "
                          "for it (delayq init makes it)")
                consumer.close()
                return False
            self.store.set_buffer_partitions(counts[self.settings.buffer_topic])
            start = self.store.offsets()
            self.assigned = [TopicPartition(topic, p, start.get((topic, p), OFFSET_BEGINNING))
                             for topic, count in counts.items() for p in range(count)]
            consumer.assign(self.assigned)
        except BaseException:
            consumer.close()
            raise
        self.consumer = consumer
        self.missing = tuple(topic for topic in self.topics if topic not in counts)
        self._missing_checked = time.monotonic()
        self._said = None
        log.info("console index reads %s from offsets %s", ", ".join(counts),
                 {f"{tp.topic}/{tp.partition}": tp.offset for tp in self.assigned})
        return True

    def _drop_consumer(self) -> None:
        consumer, self.consumer = self.consumer, None
        self._asked = None
        self.positions = {}
        if consumer is not None:
            try:
                consumer.close()
            except Exception as err:
                log.debug("closing the console index's consumer: %s", err)

    def _poll(self) -> None:
        consumer = self.consumer
        assert consumer is not None
        messages = consumer.consume(BATCH, POLL_S)
        # One comprehension, no per-record call of ours: this loop runs for every record of the buffer.
        records = [(m.topic(), m.partition(), m.offset(), m.timestamp()[1], m.key(), m.value(), m.headers())
                   for m in messages if m.error() is None]
        if len(records) < len(messages):
            for message in messages:
                error = message.error()
                if error is not None and error.code() != KafkaError._PARTITION_EOF:
                    self._say(f"console index: Kafka says {error.str()}")
        if records:
            self.store.apply(cast(list[Consumed], records))
        positions = {(tp.topic, tp.partition): tp.offset for tp in consumer.position(self.assigned)
                     if tp.offset >= 0}
        with self.progress:
            self.positions = positions
            self.progress.notify_all()
        if self.missing and time.monotonic() - self._missing_checked > 10 * RETRY_S:
            self._missing_checked = time.monotonic()
            if all(consumer.list_topics(t, timeout=ENDS_TIMEOUT_S).topics[t].error is None for t in self.missing):
                self._drop_consumer()  # reassigned with the topic that appeared, at the next turn

    def _follow_ends(self) -> None:
        """Ask for the topics' end offsets every ENDS_EVERY_S; take each answer once it comes, without waiting."""
        if self.consumer is None:
            return
        asked = self._asked
        if asked is None:
            if time.monotonic() < self._ask_at:
                return
            if self._admin is None:
                self._admin = AdminClient(self.settings.kafka_conf())
            wanted = {TopicPartition(tp.topic, tp.partition): OffsetSpec.latest() for tp in self.assigned}
            self._asked = _Ends(self._admin.list_offsets(wanted, isolation_level=IsolationLevel.READ_COMMITTED,
                                                         request_timeout=ENDS_TIMEOUT_S), self.store.offsets())
            return
        if not all(future.done() for future in asked.futures.values()):
            return
        self._asked, self._ask_at = None, time.monotonic() + ENDS_EVERY_S
        try:
            ends = {(tp.topic, tp.partition): future.result().offset for tp, future in asked.futures.items()}
        except KafkaException as err:
            # librdkafka's admin client can keep a fenced leader epoch after a broker restart: a new one asks afresh.
            self._admin = None
            self._say(f"console index: the topics' end offsets: {err.args[0].str() if err.args else err}")
            return
        ahead = {place: offset for place, offset in asked.read.items() if place in ends and offset > ends[place]}
        if ahead:
            (topic, partition), offset = next(iter(ahead.items()))
            self.store.wipe(f"its next offset {offset} of {topic}/{partition} is above the topic's end offset "
                            f"{ends[(topic, partition)]}: the topic was recreated")
            self._drop_consumer()
            return
        with self.progress:
            self.ends = ends
            self.ends_answered += 1
            self.progress.notify_all()

    def lag(self) -> int | None:
        ends = self.ends
        if ends is None:
            return None
        positions, read = self.positions, self.store.offsets()
        return sum(max(0, end - positions.get(place, read.get(place, 0))) for place, end in ends.items())


class ConsoleIndex(IndexStore):
    """The console's index of a cluster, kept up to date by one consumer thread (:meth:`start`, :meth:`stop`).

    Its queries (history, dead letters, series: :class:`IndexStore`'s, index_store.py) answer from
    RocksDB at once, whatever the thread is doing; :meth:`find_delivery` and :meth:`dead_letter_record`
    read Kafka, bounded.

    Args:
        settings: the cluster's (its topics, and the Kafka client settings, SASL/TLS included).
        path: the index's folder; default :func:`index_path`.

    Raises:
        ConsoleIndexError: RocksDB cannot open the folder.
    """

    def __init__(self, settings: Settings, path: Path | str | None = None):
        super().__init__(index_path(settings) if path is None else path, settings.buffer_topic,
                         settings.dead_letter_topic)
        self.settings = settings
        self.feed = IndexFeed(settings, self)
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the consumer thread (once)."""
        if self._thread is not None:
            raise RuntimeError("the console index was started already (an index starts once; stop() closes it)")
        self._thread = threading.Thread(target=self.feed.run, args=(self._stopping,), name="console-index",
                                        daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop the thread (it closes its consumer) and close the RocksDB; the index answers no more after."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                log.warning("console index: its thread did not stop within %g s; closing the index anyway", timeout_s)
        self.close()

    def __enter__(self) -> ConsoleIndex:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def lag(self) -> int | None:
        """Records of both topics the index has still to read; None before the first end offsets are known."""
        return self.feed.lag()

    def caught_up(self) -> bool:
        """Whether the index has read both topics to the end offsets Kafka last gave."""
        return self.feed.lag() == 0

    def wait_caught_up(self, timeout_s: float = 30.0) -> bool:
        """Wait until the index has read every record committed before this call; whether it did in time."""
        feed = self.feed
        deadline = time.monotonic() + timeout_s
        with feed.progress:
            # The answer in flight may have been asked before this call: wait for the one after it.
            wanted = feed.ends_answered + 2
            while feed.ends_answered < wanted or feed.lag() != 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                feed.progress.wait(min(left, POLL_S))
        return True

    # -- bounded reads of Kafka -------------------------------------------------

    def find_delivery(self, target_topic: str, delay_id: str, version: int, around_ms: int) -> HistoryEvent | None:
        """The delivered record of ``delay_id``'s version ``version`` on ``target_topic``, near ``around_ms``.

        Reads each partition of the target from the first record at ``around_ms`` - 5 s until
        one past ``around_ms`` + 5 s or its end, at most 20,000 records and 10 s in all, for a
        record whose ``delayq-id`` and ``delayq-version`` headers match (``around_ms``: the
        ``done``'s time, which the master writes with the delivery). None if none is found.

        Raises:
            UnavailableError: Kafka did not answer.
        """
        wanted = {wire.ID: delay_id.encode(), wire.VERSION: str(version).encode()}
        consumer = Consumer(_consumer_conf(self.settings, "find", **{"enable.partition.eof": True}))
        try:
            found = consumer.list_topics(target_topic, timeout=FETCH_TIMEOUT_S).topics.get(target_topic)
            if found is None or found.error is not None:
                return None
            starts = consumer.offsets_for_times([TopicPartition(target_topic, p, around_ms - FIND_WINDOW_MS)
                                                 for p in found.partitions], timeout=FETCH_TIMEOUT_S)
            reading = {tp.partition for tp in starts if tp.offset >= 0}
            if not reading:
                return None
            consumer.assign([tp for tp in starts if tp.partition in reading])
            until, seen, deadline = around_ms + FIND_WINDOW_MS, 0, time.monotonic() + FETCH_TIMEOUT_S
            while reading and seen < FIND_MAX_RECORDS and time.monotonic() < deadline:
                for message in consumer.consume(500, POLL_S):
                    partition = cast(int, message.partition())
                    error = message.error()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:
                            reading.discard(partition)
                        continue
                    seen += 1
                    ts_ms = message.timestamp()[1]
                    if ts_ms > until:
                        reading.discard(partition)
                        consumer.pause([TopicPartition(target_topic, partition)])
                        continue
                    delivery = _delivery(message, wanted, ts_ms)
                    if delivery is not None:
                        return delivery
        except KafkaException as err:
            raise UnavailableError(f"looking for the delivery of {delay_id} on {target_topic}: Kafka at "
                                   f"{self.settings.bootstrap_servers} did not answer ({err})") from err
        finally:
            consumer.close()
        return None

    def dead_letter_record(self, coordinates: str) -> KafkaRecord | None:
        """The dead letter at ``"<partition>/<offset>"`` as Kafka holds it (for a replay); None once it is gone.

        Raises:
            ValueError: bad coordinates.
            UnavailableError: Kafka did not answer within 10 s.
        """
        partition, offset = parse_coordinates(coordinates)
        topic = self.settings.dead_letter_topic
        consumer = Consumer(_consumer_conf(self.settings, "replay", **{"enable.partition.eof": True}))
        try:
            consumer.assign([TopicPartition(topic, partition, offset)])
            deadline = time.monotonic() + FETCH_TIMEOUT_S
            while time.monotonic() < deadline:
                message = consumer.poll(POLL_S)
                if message is None:
                    continue
                error = message.error()
                if error is not None:
                    if error.code() in (KafkaError._PARTITION_EOF, KafkaError.UNKNOWN_TOPIC_OR_PART,
                                        KafkaError._UNKNOWN_PARTITION):
                        return None
                    continue
                if message.offset() != offset:
                    return None  # retention deleted it (the consumer starts from the oldest left)
                return KafkaRecord(message.key(), message.value(), _headers(message) or [])
        except KafkaException as err:
            raise UnavailableError(f"reading dead letter {topic}/{coordinates}: Kafka at "
                                   f"{self.settings.bootstrap_servers} did not answer ({err})") from err
        finally:
            consumer.close()
        raise UnavailableError(f"reading dead letter {topic}/{coordinates}: no answer from Kafka at "
                               f"{self.settings.bootstrap_servers} within {FETCH_TIMEOUT_S:g} s")


def _headers(message: Message) -> wire.Headers | None:
    """A consumed record's headers: a list of (name, bytes or None), as a consumer gives them (never a dict)."""
    return cast("wire.Headers | None", message.headers())


def _delivery(record: Message, wanted: dict[str, bytes], ts_ms: int) -> HistoryEvent | None:
    """The delivered event of ``record`` if its delayq-id and delayq-version headers are ``wanted``'s."""
    headers = dict(_headers(record) or ())
    if any(headers.get(name) != value for name, value in wanted.items()):
        return None

    def number(name: str) -> int | None:
        raw = headers.get(name)
        return int(raw) if raw is not None and raw.isdigit() and len(raw) <= 18 else None

    return HistoryEvent("delivered", ts_ms, cast(str, record.topic()), cast(int, record.partition()),
                        cast(int, record.offset()), due_ms=number(wire.DELIVER_AT), target=record.topic(),
                        version=number(wire.VERSION), epoch=number(wire.EPOCH), occurrence=number(wire.OCCURRENCE))
