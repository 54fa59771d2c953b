"""Traffic for fault tests: a producer built as the README shows, writing while a fault happens, and a plain
idempotent producer beside delayq that says when Kafka took writes again (evidence delayq did not produce)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from confluent_kafka import Producer

import delayq
from delayq import Settings, wire
from delayq.clock import now_ms

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
class ProbeWrite:
    topic: str
    partition: int
    sent_ms: int
    acked_ms: int | None = None
    error: str | None = None


@dataclass
class Probe:
    """A plain idempotent producer writing, every ``every_s``, one record to each partition of ``target`` and one
    to each partition of the buffer (a cancel of an id no message has: the nodes take it and change nothing).

    :meth:`back_after` says when, after a fault began, Kafka took a write on every one of those partitions
    again: the moment delivery could be back at the earliest.
    """

    settings: Settings
    target: str
    target_partitions: int
    every_s: float = 0.05
    writes: list[ProbeWrite] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._producer = Producer({"bootstrap.servers": self.settings.bootstrap_servers, "enable.idempotence": True,
                                   "linger.ms": 0})
        partitions = self.settings.buffer_partitions
        self._cancel_ids: dict[int, str] = {}
        while len(self._cancel_ids) < partitions:
            delay_id = wire.new_delay_id()
            self._cancel_ids.setdefault(wire.buffer_partition(delay_id, partitions), delay_id)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Probe:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(30)
        self._producer.flush(120)

    def _write(self, topic: str, partition: int, key: str, value: bytes | None, headers) -> None:
        write = ProbeWrite(topic, partition, now_ms())
        self.writes.append(write)

        def on_delivery(err, _msg) -> None:
            if err is None:
                write.acked_ms = now_ms()
            else:
                write.error = str(err)

        self._producer.produce(topic, value, key, partition=partition, headers=headers, on_delivery=on_delivery)

    def _run(self) -> None:
        while not self._stop.is_set():
            for partition in range(self.target_partitions):
                self._write(self.target, partition, "probe", b"probe", [("probe", b"1")])
            for partition, delay_id in self._cancel_ids.items():
                self._write(self.settings.buffer_topic, partition, delay_id, None,
                            wire.control_headers(wire.OP_CANCEL, delay_id))
            self._producer.poll(0)
            self._stop.wait(self.every_s)

    def back_after(self, began_ms: int) -> int:
        """When every partition had acknowledged its first write sent at or after ``began_ms`` (epoch ms)."""
        first: dict[tuple[str, int], ProbeWrite] = {}
        for write in self.writes:
            if write.sent_ms >= began_ms:
                first.setdefault((write.topic, write.partition), write)
        unacked = [w for w in first.values() if w.acked_ms is None]
        assert not unacked, f"the probe's writes failed or were never acknowledged: {unacked[:3]}"
        assert len(first) == self.target_partitions + self.settings.buffer_partitions, "the probe wrote nothing after"
        return max(w.acked_ms for w in first.values() if w.acked_ms is not None)

    @property
    def failures(self) -> list[ProbeWrite]:
        return [w for w in self.writes if w.error is not None]
