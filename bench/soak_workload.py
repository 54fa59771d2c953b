"""The soak's traffic: delayed messages, cancels and reschedules in, a user's consumer out.

:class:`Workload` produces with the public ``delayq.Producer`` at a steady rate and
records every write with the time its acknowledgement came back; :class:`Watcher`
reads the target topics with ``read_committed``, as a user would, and records every
delivery. In a run with ``--upgrade-from``, once the roll has finalized the cluster, a share of
the plain puts carry ``expire_after=`` (feature level 2). Both write into one :class:`Recorder`, which the judge
(:mod:`delayq.bench.soak_check`) reads at the end. :func:`read_buffer` reads the
buffer once the nodes have stopped, for the puts it holds twice.
"""

from __future__ import annotations

import functools
import heapq
import random
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message, TopicPartition

from delayq import Every, Producer, wire
from delayq.clock import now_ms
from delayq.errors import UnavailableError
from delayq.proxy.feature_gate import LevelNotFinalized
from delayq.proxy.producer import EXPIRY_LEVEL

from .soak_check import BufferScan, Delivery, History, Version, Write
from .soak_check import Message as Delayed


class Recorder:
    """What was asked and what arrived, shared by the producer and consumer threads.

    Each thread writes its own fields (the GIL makes each append and counter step atomic);
    the live figures are for the progress line only, the judge reads everything at the end.
    """

    def __init__(self) -> None:
        self.messages: dict[str, Delayed] = {}
        self.deliveries: list[Delivery] = []
        self.puts = 0
        self.cancels = 0
        self.reschedules = 0
        self.acked = 0
        self.write_errors = 0
        self.seen_versions: Counter[tuple[str | None, int | None]] = Counter()
        self.duplicates = 0
        self.early = 0
        self.last_due_ms = 0

    def history(self, judged_until_ms: int, ended_ms: int, faults: list, scan: BufferScan | None = None) -> History:
        return History(self.messages, list(self.deliveries), list(faults), judged_until_ms, ended_ms,
                       scan.repeated if scan is not None else [])

    @property
    def pending(self) -> int:
        """Versions put and not seen delivered, cancels not deducted: a rough gauge of what is in flight."""
        return self.puts + self.reschedules - len(self.seen_versions)


@dataclass(frozen=True)
class WorkloadOptions:
    """How much, how far ahead, and what share gets cancelled or rescheduled."""

    rate: float
    produce_s: float
    max_delay_s: float
    latest_due_ms: int
    min_delay_s: float = 0.5
    cancel_share: float = 0.10
    reschedule_share: float = 0.05
    # Puts that are repeating messages (Every, 2 to 5 occurrences 0.5 to 2 s apart); cancelled as often.
    series_share: float = 0.02
    # How a cancel or reschedule is timed: well before the due time, within a second before it, within a
    # second after it (the race the rules spell out).
    well_before_share: float = 0.5
    just_before_share: float = 0.25
    # Once the cluster is finalized at level 2 (--upgrade-from): plain puts with expire_after=, and how much:
    # ten minutes, beyond any lateness the soak lets pass, so each must be delivered as any other.
    expiring_share: float = 0.10
    expire_after_s: float = 600.0


class Workload(threading.Thread):
    """Delayed messages at ``rate`` per second for ``produce_s``; then their cancels and reschedules; then flush."""

    def __init__(self, producer: Producer, topics: list[str], options: WorkloadOptions, seed: int,
                 recorder: Recorder, level_two: threading.Event | None = None):
        """``level_two``: set once the cluster is finalized at feature level 2; from then on, puts with
        ``expire_after=`` (as soon as the producer's gate has seen the level)."""
        super().__init__(name="soak-workload", daemon=True)
        self.producer = producer
        self.topics = topics
        self.options = options
        self.rng = random.Random(f"{seed}/workload")
        self.recorder = recorder
        self.stop = threading.Event()
        self.failure: BaseException | None = None
        # (when ms, sequence, "cancel" or "reschedule", delay id, message number)
        self._later: list[tuple[int, int, str, str, int]] = []
        self._sequence = 0
        self.level_two = level_two
        self._expiry_allowed = False
        self._expiry_asked = 0.0  # monotonic: when the gate was last asked

    def run(self) -> None:
        try:
            self._produce()
        except Exception as err:  # the soak reports it instead of judging a silent half-run
            self.failure = err

    def _produce(self) -> None:
        o = self.options
        started = time.monotonic()
        end = started + o.produce_s
        number = 0
        while not self.stop.is_set():
            now = time.monotonic()
            if now < end:
                while number < int((now - started) * o.rate) + 1:
                    self._put(number)
                    number += 1
            while self._later and self._later[0][0] <= now_ms():
                _, _, action, delay_id, n = heapq.heappop(self._later)
                if action == "cancel":
                    self._cancel(delay_id)
                else:
                    self._reschedule(delay_id, n)
            self.producer.poll(0)
            if now >= end and not self._later:
                break
            self.stop.wait(0.002)
        # Every acknowledgement must be in before the judge reads the ack times.
        while len(self.producer) and not self.stop.is_set():
            self.producer.flush(0.5)

    def _put(self, number: int) -> None:
        o = self.options
        sent = now_ms()
        due = sent + round(self.rng.uniform(o.min_delay_s, o.max_delay_s) * 1000)
        topic = self.rng.choice(self.topics)
        if self.rng.random() < o.series_share:
            interval = self.rng.randint(500, 2000)
            times = min(self.rng.randint(2, 5), (o.latest_due_ms - due) // interval + 1)
            if times >= 2:
                self._put_series(number, topic, sent, due, interval, times)
                return
        write = Write(sent)
        expiring = self._expiry_allowed_now() and self.rng.random() < o.expiring_share
        expire_after = o.expire_after_s if expiring else None
        delay_id = self._send(lambda report: self.producer.produce(
            topic, _value(number), key=_key(number), deliver_at=due, on_delivery=report, expire_after=expire_after),
            write)
        self.recorder.messages[delay_id] = Delayed(delay_id, topic, [Version(due, write)], expiring=expiring)
        self.recorder.puts += 1
        self.recorder.last_due_ms = max(self.recorder.last_due_ms, due)
        draw = self.rng.random()
        if draw < o.cancel_share:
            self._later_at(self._race_time(sent, due), "cancel", delay_id, number)
        elif draw < o.cancel_share + o.reschedule_share:
            self._later_at(self._race_time(sent, due), "reschedule", delay_id, number)

    def _expiry_allowed_now(self) -> bool:
        """Whether puts may carry expire_after=: the cluster is finalized and the producer's gate says so.

        The gate follows the finalize with a ZooKeeper watch; until it lets the level through, it
        is asked at most once a second (each asking may wait for ZooKeeper), and the puts go without.
        Once let through, a level is not asked again.
        """
        if self._expiry_allowed:
            return True
        if self.level_two is None or not self.level_two.is_set() or time.monotonic() - self._expiry_asked < 1.0:
            return False
        self._expiry_asked = time.monotonic()
        try:
            self.producer.level_gate.require_level(EXPIRY_LEVEL, "expire_after")
        except (LevelNotFinalized, UnavailableError):
            return False
        self._expiry_allowed = True
        return True

    def _put_series(self, number: int, topic: str, sent: int, due: int, interval_ms: int, times: int) -> None:
        """A repeating message: ``times`` occurrences, ``interval_ms`` apart from ``due``; maybe cancelled."""
        write = Write(sent)
        repeat = Every(timedelta(milliseconds=interval_ms), times=times)
        delay_id = self._send(lambda report: self.producer.produce(
            topic, _value(number), key=_key(number), deliver_at=due, repeat=repeat, on_delivery=report), write)
        dues = [due + k * interval_ms for k in range(times)]
        self.recorder.messages[delay_id] = Delayed(delay_id, topic, [Version(d, write) for d in dues], series=True)
        self.recorder.puts += times
        self.recorder.last_due_ms = max(self.recorder.last_due_ms, dues[-1])
        if self.rng.random() < self.options.cancel_share * 3:
            self._later_at(self._race_time(sent, self.rng.choice(dues)), "cancel", delay_id, number)

    def _race_time(self, sent: int, due: int) -> int:
        """When to cancel or reschedule: well before the due time, just before it, or just after it."""
        o = self.options
        draw = self.rng.random()
        if draw < o.well_before_share and due - sent > 1500:
            return self.rng.randint(sent + 200, due - 1000)
        if draw < o.well_before_share + o.just_before_share:
            return max(sent + 50, due - self.rng.randint(50, 1000))
        return due + self.rng.randint(0, 1000)

    def _later_at(self, when_ms: int, action: str, delay_id: str, number: int) -> None:
        self._sequence += 1
        heapq.heappush(self._later, (when_ms, self._sequence, action, delay_id, number))

    def _cancel(self, delay_id: str) -> None:
        write = Write(now_ms())
        self._send(lambda report: self.producer.cancel(delay_id, on_delivery=report), write)
        self.recorder.messages[delay_id].cancel = write
        self.recorder.cancels += 1

    def _reschedule(self, delay_id: str, number: int) -> None:
        o = self.options
        message = self.recorder.messages[delay_id]
        sent = now_ms()
        room = max(o.min_delay_s, min(o.max_delay_s, (o.latest_due_ms - sent) / 1000))
        due = sent + round(self.rng.uniform(o.min_delay_s, room) * 1000)
        # A different due time, by at least 1 ms, so the delivered header names the version.
        while any(v.due_ms == due for v in message.versions):
            due += 1
        write = Write(sent)
        self._send(lambda report: self.producer.reschedule(
            delay_id, message.topic, _value(number), key=_key(number), deliver_at=due, on_delivery=report), write)
        message.versions.append(Version(due, write))
        self.recorder.reschedules += 1
        self.recorder.last_due_ms = max(self.recorder.last_due_ms, due)

    def _send(self, send, write: Write) -> str:
        report = functools.partial(_acknowledged, self.recorder, write)
        while True:
            try:
                return send(report)
            except BufferError:
                # The local queue is full (Kafka is down): let it drain, as a user's producer would.
                self.producer.poll(0.1)


def _acknowledged(recorder: Recorder, write: Write, err: KafkaError | None, msg: Message) -> None:
    # Runs inside poll(), a few ms at most after the broker's answer: "acked before the due time" is safe.
    write.acked_ms = now_ms()
    if err is not None:
        write.error = err.str()
        recorder.write_errors += 1
        return
    write.partition = msg.partition()
    write.offset = msg.offset()
    recorder.acked += 1


def _key(number: int) -> bytes:
    return b"k%d" % number


def _value(number: int) -> bytes:
    return b"soak message %d" % number


class Watcher(threading.Thread):
    """A user's read_committed consumer of the target topics; records every delivery."""

    def __init__(self, bootstrap_servers: str, topics: list[str], recorder: Recorder):
        super().__init__(name="soak-watcher", daemon=True)
        self.recorder = recorder
        self.topics = topics
        self.stop = threading.Event()
        self.finish = threading.Event()
        self.failure: BaseException | None = None
        self.consumer = Consumer({
            "bootstrap.servers": bootstrap_servers, "group.id": f"delayq-soak-watcher-{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_committed", "enable.auto.commit": False, "auto.offset.reset": "earliest",
            # Kafka is killed on purpose: librdkafka's complaints about it are expected noise.
            "log_level": 0,
        })

    def run(self) -> None:
        try:
            metadata = self.consumer.list_topics(timeout=30).topics
            partitions = [TopicPartition(t, p, OFFSET_BEGINNING) for t in self.topics for p in metadata[t].partitions]
            self.consumer.assign(partitions)
            while not self.stop.is_set() and not self.finish.is_set():
                self._consume()
            if self.finish.is_set() and not self.stop.is_set():
                self._read_to_end(partitions)
        except Exception as err:  # reported by the soak: a dead watcher would look like missing messages
            self.failure = err
        finally:
            self.consumer.close()

    def read_to_end(self, timeout_s: float = 60.0) -> None:
        """Read what the target topics hold now (the nodes are stopped), then stop."""
        self.finish.set()
        self.join(timeout_s)

    def _read_to_end(self, partitions: list[TopicPartition]) -> None:
        deadline = time.monotonic() + 45
        ends = {(tp.topic, tp.partition): self.consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in partitions}
        quiet_since = time.monotonic()
        while time.monotonic() < deadline and not self.stop.is_set():
            if self._consume():
                quiet_since = time.monotonic()
            positions = self.consumer.position([TopicPartition(t, p) for t, p in ends])
            if all(tp.offset >= ends[(tp.topic, tp.partition)] for tp in positions):
                return
            # A read_committed position may stop short of a trailing transaction marker.
            if time.monotonic() - quiet_since > 5:
                return

    def _consume(self) -> int:
        records = self.consumer.consume(1000, 0.2)
        received = now_ms()
        count = 0
        for record in records:
            if record.error() is None:
                self._record(record, received)
                count += 1
        return count

    def _record(self, record: Message, received: int) -> None:
        headers: dict[str, bytes] = {}
        for header in record.headers() or []:
            if isinstance(header[1], bytes):
                headers[header[0]] = header[1]
        delivery = Delivery(
            delay_id=_text(headers.get(wire.ID)),
            due_ms=_number(headers.get(wire.DELIVER_AT)),
            timestamp_ms=record.timestamp()[1],
            # A consumed record without an error always has these; the stubs allow None.
            topic=record.topic() or "", partition=record.partition() or 0, offset=record.offset() or 0,
            epoch=_number(headers.get(wire.EPOCH)),
            version=_number(headers.get(wire.VERSION)),
            received_ms=received,
        )
        recorder = self.recorder
        recorder.deliveries.append(delivery)
        key = (delivery.delay_id, delivery.due_ms)
        recorder.seen_versions[key] += 1
        if recorder.seen_versions[key] == 2:
            recorder.duplicates += 1
        if delivery.due_ms is not None and delivery.timestamp_ms < delivery.due_ms:
            recorder.early += 1


def _text(value: bytes | None) -> str | None:
    return value.decode(errors="replace") if value is not None else None


def _number(value: bytes | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def read_buffer(bootstrap_servers: str, topic: str, partitions: int, timeout_s: float = 300.0) -> BufferScan:
    """Every record of the buffer topic, from its start to its end now, through a :class:`BufferScan`.

    Read uncommitted: the producer's puts are no transaction's, and a transaction Kafka left
    open (``open_transactions_at_end``) must not hide what lies behind it. What it cannot
    read is the scan's ``error``.
    """
    scan = BufferScan()
    consumer = Consumer({"bootstrap.servers": bootstrap_servers,
                         "group.id": f"delayq-soak-buffer-{uuid.uuid4().hex[:8]}",
                         "isolation.level": "read_uncommitted", "enable.auto.commit": False,
                         # The end of a partition is an event: its last records may be transaction markers,
                         # which a consumer never sees.
                         "enable.partition.eof": True, "log_level": 0})
    try:
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(partitions)}
        left = {p for p, end in ends.items() if end > 0}
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in sorted(left)])
        deadline = time.monotonic() + timeout_s
        while left and time.monotonic() < deadline:
            for record in consumer.consume(5000, 0.5):
                error = record.error()
                partition = record.partition() or 0
                if error is None:
                    scan.add(partition, record.offset() or 0, record.key(), record.value(), record.timestamp()[1])
                elif error.code() == KafkaError._PARTITION_EOF and (record.offset() or 0) >= ends[partition]:
                    left.discard(partition)
        if left:
            positions = consumer.position([TopicPartition(topic, p) for p in sorted(left)])
            scan.error = (f"not at the end of partitions {sorted(left)} after {timeout_s:.0f}s: "
                          + ", ".join(f"{tp.partition} at {tp.offset} of {ends[tp.partition]}" for tp in positions))
    except KafkaException as err:
        scan.error = f"reading {topic}: {err.args[0].str()}"
    finally:
        consumer.close()
    return scan
