"""Feed real delay-service nodes from tests: buffer records written the way the proxy writes them."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from confluent_kafka import Producer

from delayq import Settings, wire
from delayq.clock import now_ms
from delayq.dev import DevStack, StackError
from delayq.testing import LocalCluster as Cluster
from delayq.testing import NodeProcess, free_stack_ports, settings_env
from delayq.wire import Envelope, new_delay_id

__all__ = ["Cluster", "Feeder", "NodeProcess", "assert_reconcile_clean", "freeze", "kafka_pid", "now_ms",
           "settings_env", "start_private_stack", "thaw", "zookeeper_pid"]


def start_private_stack(root: Path, brokers: int = 1) -> DevStack:
    """A Kafka (``brokers`` of them) and ZooKeeper of a test's own, on free ports under ``root`` (its brokers get
    killed or frozen).

    Raises:
        StackError: it could not start (after trying other ports when one was taken meanwhile).
    """
    for attempt in range(5):
        kafka_port, zk_port = free_stack_ports(brokers)
        stack = DevStack(state_dir=root / f"stack-{attempt}", kafka_port=kafka_port, zk_port=zk_port,
                         brokers=brokers, start_timeout_s=180)
        try:
            stack.up(say=lambda _text: None)
            return stack
        except StackError as err:
            stack.down()
            if "is taken" not in str(err) or attempt == 4:  # another process took a port in between: try others
                raise
    raise AssertionError("unreachable")


def kafka_pid(stack: DevStack, name: str = "kafka") -> int:
    """The pid (and process group) of the stack's Kafka broker ``name`` (``kafka-2``: the second of several)."""
    return int((stack.folder / name / f"{name}.pid").read_text())


def zookeeper_pid(stack: DevStack) -> int:
    return int((stack.state_dir / "zookeeper" / "zookeeper.pid").read_text())


def freeze(pid: int) -> None:
    """SIGSTOP a server's process group: a long GC pause, a stalled disk, a hung VM."""
    os.killpg(pid, signal.SIGSTOP)


def thaw(pid: int) -> None:
    os.killpg(pid, signal.SIGCONT)


def assert_reconcile_clean(settings: Settings, since_ms: int, out: Path, expected: int) -> dict:
    """``delayq reconcile`` (the job, in this process) over the window from ``since_ms``: clean, ``expected`` delivered."""
    from delayq.spark import ReconcileOptions, reconcile, spark_session

    report = reconcile(settings, ReconcileOptions(since_ms=since_ms, until_ms=now_ms(), out=out, grace_ms=0),
                       spark=spark_session("local[2]"))
    totals = report.totals
    assert report.exit_code == 0, report.anomalies
    assert (totals["expected"], totals["delivered"], totals["duplicates"], totals["missing"], totals["early"]) == (
        expected, expected, 0, 0, 0), totals
    return totals


class Feeder:
    """Writes buffer records the way the proxy does (envelope from delayq.proxy), and target topics."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.producer = Producer(settings.kafka_conf(**{"linger.ms": 5}))

    def put(self, topic: str, value: bytes | None, deliver_at_ms: int, *, key: bytes | None = None,
            partition: int | None = None, headers: list | None = None, delay_id: str | None = None) -> str:
        message = Envelope(delay_id=delay_id or new_delay_id(), topic=topic, deliver_at_ms=deliver_at_ms,
                           value=value, key=key, partition=partition, headers=list(headers or []),
                           created_at_ms=now_ms(), partitioner="consistent_random")
        self.producer.produce(self.settings.buffer_topic, key=message.delay_id.encode(),
                              value=message.buffer_value(), headers=message.buffer_headers())
        return message.delay_id

    def cancel(self, delay_id: str) -> None:
        self.producer.produce(self.settings.buffer_topic, key=delay_id.encode(), value=None,
                              headers=wire.control_headers(wire.OP_CANCEL, delay_id))

    def raw(self, key: bytes | None, value: bytes | None, headers: list) -> None:
        self.producer.produce(self.settings.buffer_topic, key=key, value=value, headers=headers)

    def write_at(self, key: bytes, value: bytes | None, headers: list, timestamp_ms: int) -> int:
        """Append one buffer record with the given timestamp, at once; its offset.

        Written twice, the same record is what a client library appends when it sends a
        batch again after an epoch bump: one write at two offsets.
        """
        offsets: list[int] = []

        def delivered(err, message) -> None:
            assert err is None, f"writing to the buffer failed: {err}"
            offsets.append(message.offset())

        self.producer.produce(self.settings.buffer_topic, key=key, value=value, headers=headers,
                              timestamp=timestamp_ms, on_delivery=delivered)
        self.flush()
        return offsets[0]

    def flush(self) -> None:
        assert self.producer.flush(30) == 0
