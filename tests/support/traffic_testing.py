"""Traffic for fault tests: a producer built as the README shows, writing while a fault happens, and a probe
beside delayq that says when Kafka served again what delivery needs (evidence delayq did not produce)."""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from confluent_kafka import IsolationLevel, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

import delayq
from delayq import Settings, wire
from delayq.clock import now_ms
from delayq.delay_service import TRANSACTION_STATE_TOPIC, coordinator_partition

__all__ = ["Probe", "readme_producer", "while_writing"]


def readme_producer(settings: Settings) -> delayq.Producer:
    """A producer as the README shows one: nothing but where Kafka is and which cluster."""
    return delayq.Producer({"bootstrap.servers": settings.bootstrap_servers, "delayq.cluster": settings.cluster})


def while_writing(producer: delayq.Producer, write_some: Callable[[], None], fault, *, before_s: float,
                  after_s: float, every_s: float):
    """Call ``write_some()`` every ``every_s`` from a thread, from ``before_s`` before ``fault()`` until ``after_s``
    after it; ``fault()``'s result, once the producer has confirmed every write."""
    stop = threading.Event()

    def write() -> None:
        while not stop.is_set():
            write_some()
            producer.poll(0)
            time.sleep(every_s)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        time.sleep(before_s)
        result = fault()
        time.sleep(after_s)
    finally:
        stop.set()
        writer.join(30)
    assert producer.flush(120) == 0, "writes still unconfirmed two minutes after the fault"
    return result


@dataclass
class ProbeCall:
    """One call of the probe's to Kafka: a write, a transaction, a read of end offsets; ``done_ms`` once served."""
    started_ms: int
    done_ms: int | None = None
    error: str | None = None


@dataclass
class Probe:
    """What delivery needs from Kafka, asked beside delayq all along, from clients of its own:

    - a plain idempotent producer writes one record to each partition of ``target`` and one to each partition of
      the buffer (a cancel of an id no message has: the nodes take it and change nothing), every ``every_s``;
    - for each shard, a transactional producer whose id has the shard master's transaction coordinator commits
      transactions of one record to each partition of ``target``, one after the other (a master's delivery waits
      for its commit: after a broker's loss or restart, for the new coordinator to load the transaction log, and on
      a loaded box for every replica in sync to take the records);
    - an admin client reads the buffer's last stable offsets (a master reads them before it delivers what fell
      due: a new partition leader answers only once its high watermark caught up, KIP-207).

    :meth:`served_after` says when, after a given moment, Kafka had served each of these again: the moment a
    message falling due then could be delivered at the earliest, judged by Kafka's answers, not delayq's.
    """

    settings: Settings
    target: str
    target_partitions: int
    every_s: float = 0.05
    calls: dict[str, list[ProbeCall]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._producer = Producer({"bootstrap.servers": self.settings.bootstrap_servers, "enable.idempotence": True,
                                   "linger.ms": 0})
        self._admin = AdminClient({"bootstrap.servers": self.settings.bootstrap_servers})
        partitions = self.settings.buffer_partitions
        self._cancel_ids: dict[int, str] = {}
        while len(self._cancel_ids) < partitions:
            delay_id = wire.new_delay_id()
            self._cancel_ids.setdefault(wire.buffer_partition(delay_id, partitions), delay_id)
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._write_plain, daemon=True),
                         threading.Thread(target=self._read_ends, daemon=True)]
        self._threads += [threading.Thread(target=self._commit, args=(shard,), daemon=True)
                          for shard in range(self.settings.shards)]

    def __enter__(self) -> Probe:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)
        self._producer.flush(120)

    def _call(self, channel: str) -> ProbeCall:
        call = ProbeCall(now_ms())
        self.calls.setdefault(channel, []).append(call)
        return call

    def _write_plain(self) -> None:
        while not self._stop.is_set():
            for partition in range(self.target_partitions):
                self._write(self.target, partition, "probe", b"probe", [("probe", b"1")])
            for partition, delay_id in self._cancel_ids.items():
                self._write(self.settings.buffer_topic, partition, delay_id, None,
                            wire.control_headers(wire.OP_CANCEL, delay_id))
            self._producer.poll(0)
            self._stop.wait(self.every_s)

    def _write(self, topic: str, partition: int, key: str, value: bytes | None, headers) -> None:
        call = self._call(f"write {topic}/{partition}")

        def on_delivery(err, _msg) -> None:
            if err is None:
                call.done_ms = now_ms()
            else:
                call.error = str(err)

        self._producer.produce(topic, value, key, partition=partition, headers=headers, on_delivery=on_delivery)

    def _coordinated_like(self, shard: int) -> str:
        """A transactional id of the probe's whose coordinator is shard ``shard``'s master's."""
        metadata = self._admin.list_topics(TRANSACTION_STATE_TOPIC, timeout=30)
        count = len(metadata.topics[TRANSACTION_STATE_TOPIC].partitions)
        wanted = coordinator_partition(self.settings.transactional_id(shard), count)
        candidate = 0
        while coordinator_partition(f"probe-{self.settings.cluster}-{shard}-{candidate}", count) != wanted:
            candidate += 1
        return f"probe-{self.settings.cluster}-{shard}-{candidate}"

    def _transactional(self, shard: int) -> Producer | None:
        """A transactional producer with shard ``shard``'s coordinator, initialized; None once the probe stops."""
        while not self._stop.is_set():
            try:  # Kafka may be slow to answer (the probe starting, a fault): it waits, as a master would
                producer = Producer({"bootstrap.servers": self.settings.bootstrap_servers, "linger.ms": 0,
                                     "transactional.id": self._coordinated_like(shard)})
                producer.init_transactions(60)
                return producer
            except KafkaException:
                self._stop.wait(1)
        return None

    def _commit(self, shard: int) -> None:
        producer = self._transactional(shard)
        while producer is not None and not self._stop.is_set():
            call = self._call(f"commit shard {shard}")
            try:
                producer.begin_transaction()
                for partition in range(self.target_partitions):
                    producer.produce(self.target, b"probe", b"probe", partition=partition, headers=[("probe", b"1")])
                while True:
                    try:
                        producer.commit_transaction(10)
                        break
                    except KafkaException as err:  # a commit timed out is resumed by calling it again
                        if not err.args[0].retriable() or self._stop.is_set():
                            raise
                call.done_ms = now_ms()
            except KafkaException as err:
                if err.args[0].fatal():
                    producer = self._transactional(shard)
                    continue
                if err.args[0].txn_requires_abort():
                    try:
                        producer.abort_transaction(60)
                    except KafkaException:
                        producer = self._transactional(shard)  # its init aborts what this one left open
                        continue
            self._stop.wait(self.every_s)

    def _read_ends(self) -> None:
        requests = {TopicPartition(self.settings.buffer_topic, p): OffsetSpec.latest()
                    for p in range(self.settings.buffer_partitions)}
        while not self._stop.is_set():
            call = self._call("end offsets")
            futures = self._admin.list_offsets(requests, isolation_level=IsolationLevel.READ_COMMITTED,
                                               request_timeout=1.0)
            try:
                for future in futures.values():
                    future.result()
                call.done_ms = now_ms()
            except KafkaException:  # a new client finds the new leaders at once
                self._admin = AdminClient({"bootstrap.servers": self.settings.bootstrap_servers})
            self._stop.wait(self.every_s)

    def served_after(self, moment_ms: int) -> int | None:
        """When each of the probe's channels had served the call it began next after ``moment_ms`` (epoch ms), or,
        if a call of it was under way then, after that one was served: the latest of those moments; None if the
        probe stopped before one of them was served.

        That is a master's position: a message falling due while its transaction is under way goes out in the
        next one, and Kafka is only sometimes slow (a restarted broker catching up on its way back into the
        in-sync replicas holds every write for seconds), so the call under way is what tells.
        """
        served = []
        for calls in list(self.calls.values()):
            after = moment_ms
            under_way = bisect.bisect_right(calls, moment_ms, key=lambda call: call.started_ms) - 1
            if under_way >= 0 and (calls[under_way].done_ms or 0) > moment_ms:
                after = calls[under_way].done_ms or moment_ms
            first = bisect.bisect_left(calls, after, key=lambda call: call.started_ms)
            done = next((c.done_ms for c in calls[first:] if c.done_ms is not None), None)
            if done is None:
                return None
            served.append(done)
        return max(served, default=None)

    def back_after(self, began_ms: int) -> int:
        """:meth:`served_after` the moment a fault began: when delivery could be back at the earliest."""
        back = self.served_after(began_ms)
        assert back is not None, f"the probe was not served again after the fault: {self.pending_after(began_ms)}"
        return back

    def slowest_between(self, start_ms: int, end_ms: int) -> dict[str, int | None]:
        """Per kind of call (each shard's commits, the writes, the end-offset reads), the longest of those started
        between ``start_ms`` and ``end_ms`` (ms; None: one never served): what Kafka made delivery wait then."""
        slowest: dict[str, int | None] = {}
        for channel, calls in list(self.calls.items()):
            kind = "writes" if channel.startswith("write ") else channel
            for call in calls:
                if start_ms <= call.started_ms <= end_ms:
                    took = None if call.done_ms is None else call.done_ms - call.started_ms
                    known = slowest.get(kind, 0)
                    slowest[kind] = None if took is None or known is None else max(known, took)
        return slowest

    def pending_after(self, moment_ms: int) -> list[str]:
        """The probe's channels with no call started at or after ``moment_ms`` served."""
        return [channel for channel, calls in self.calls.items()
                if not any(c.done_ms is not None and c.started_ms >= moment_ms for c in calls)]

    @property
    def failures(self) -> list[str]:
        """The plain writes Kafka refused (the producer retries until it is told to stop: none should be)."""
        return [f"{channel}: {call.error}" for channel, calls in self.calls.items() if channel.startswith("write ")
                for call in calls if call.error is not None]
