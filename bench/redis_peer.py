"""The peer: the Redis sorted-set delay queue most Python teams write by hand, measured like delayq.

Producers ``ZADD`` each message with its due time (epoch ms) as the score; the member is the
message itself (a 16-byte id, then topic, key and value, length-prefixed), so one structure
holds everything and a due message is moved with a single command. A poller, written the usual
way, runs a Lua script that takes the due members (``ZRANGEBYSCORE key -inf now WITHSCORES
LIMIT 0 N``) and removes them (``ZREM``) atomically, produces the batch to Kafka with an
idempotent producer, flushes, and sleeps briefly when nothing is due.

The measurements mirror delayq's in :mod:`delayq.bench.service_bench`: same random 200-byte values,
same keys, same target topics (LogAppendTime, 6 partitions), same broker, the same due-time
schedules, the same batch size as delayq's delivery, and lateness read back the same way
(broker append time minus due time). Redis runs on loopback with persistence off, which is
its fastest setting; this poller removes a message before Kafka has it, so a crash between
the two loses it (at-most-once), where delayq delivers exactly once.

    with RedisServer.start() as server:
        peer_lateness(server, stack, rate=1000, seconds=10, progress=progress)
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Producer
from rich.progress import Progress

from delayq.dev import DevStack
from delayq.errors import DelayqError
from delayq.testing import free_server_port

from .proc import cpu_seconds, thread_cpu_seconds, threads_named
from .service_bench import (
    bench_cluster,
    create_target,
    delivery_rate,
    fresh_settings,
    lateness_figures,
    lead_ms,
    now_ms,
    payload,
    read_append_times,
    same_instant,
    steady,
    wait_for,
)

try:
    import redis
except ImportError:  # pragma: no cover - the test extra installs it
    redis = None

QUEUE_KEY = "delayed"
DUE_HEADER = "due-ms"
IDLE_SLEEP_S = 0.01
BATCH = 2000  # delayq's default delivery batch (Settings.delivery_batch_size)

# Take up to N due members and remove them in one atomic step; returns member, score, member, score...
TAKE_DUE = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'WITHSCORES', 'LIMIT', 0, ARGV[2])
if #due > 0 then
  local members = {}
  for i = 1, #due, 2 do members[#members + 1] = due[i] end
  redis.call('ZREM', KEYS[1], unpack(members))
end
return due
"""

_HEAD = struct.Struct(">16sHH")


class RedisUnavailable(DelayqError):
    """redis-server is not installed and could not be installed, or did not start."""


def encode_member(message_id: bytes, topic: str, key: bytes, value: bytes) -> bytes:
    """The sorted-set member: id (unique, so equal payloads stay apart), then topic, key, value."""
    topic_bytes = topic.encode()
    return _HEAD.pack(message_id, len(topic_bytes), len(key)) + topic_bytes + key + value


def decode_member(member: bytes) -> tuple[bytes, str, bytes, bytes]:
    """(id, topic, key, value) of a member made by :func:`encode_member`."""
    message_id, topic_len, key_len = _HEAD.unpack_from(member)
    start = _HEAD.size
    topic = member[start:start + topic_len].decode()
    key = member[start + topic_len:start + topic_len + key_len]
    return message_id, topic, key, member[start + topic_len + key_len:]


def redis_server_binary(install: bool = True) -> str:
    """Path of ``redis-server``, installing Debian's package first if it is missing (we run as root).

    Raises:
        RedisUnavailable: not on PATH and ``apt-get install -y redis-server`` failed (also after
            ``apt-get update``); the message carries apt's last lines.
    """
    found = shutil.which("redis-server")
    if found or not install:
        if found:
            return found
        raise RedisUnavailable("redis-server is not on PATH")
    if shutil.which("apt-get") is None:
        raise RedisUnavailable("redis-server is not on PATH and there is no apt-get to install it: "
                               "install Redis 7 and put redis-server on PATH")
    # RUNLEVEL=1 keeps the package's init script from starting a system-wide Redis on port 6379.
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive", "RUNLEVEL": "1"}
    install_cmd = ["apt-get", "install", "-y", "-q", "redis-server"]
    result = subprocess.run(install_cmd, env=env, capture_output=True, text=True)
    if result.returncode != 0:  # a fresh machine has no package lists yet
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, text=True)
        result = subprocess.run(install_cmd, env=env, capture_output=True, text=True)
    found = shutil.which("redis-server")
    if result.returncode != 0 or found is None:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-5:])
        raise RedisUnavailable(f"redis-server is not on PATH and `apt-get install -y redis-server` failed "
                               f"(exit {result.returncode}); run it as root and retry:\n{tail}")
    return found


@dataclass
class RedisServer:
    """A private redis-server on 127.0.0.1, a free port, its own folder, no persistence."""

    binary: str
    folder: Path
    port: int = field(default_factory=free_server_port)
    process: subprocess.Popen | None = None

    @classmethod
    def start(cls, folder: Path | None = None, timeout_s: float = 15.0) -> RedisServer:
        """Start one (installing redis-server if needed) and wait until it answers PING.

        Raises:
            RedisUnavailable: it could not be installed, or did not answer within ``timeout_s``.
        """
        if redis is None:
            raise RedisUnavailable("the Redis peer needs redis-py: pip install -e '.[test]'")
        binary = redis_server_binary()
        server = cls(binary, Path(folder or tempfile.mkdtemp(prefix="delayq-bench-redis-")))
        server.folder.mkdir(parents=True, exist_ok=True)
        server.process = subprocess.Popen(
            [binary, "--bind", "127.0.0.1", "--port", str(server.port), "--dir", str(server.folder),
             "--save", "", "--appendonly", "no", "--daemonize", "no", "--logfile", str(server.folder / "redis.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                server.client().ping()
                return server
            except redis.ConnectionError:
                if server.process.poll() is not None or time.monotonic() > deadline:
                    server.stop()
                    raise RedisUnavailable(f"redis-server on port {server.port} did not start:\n"
                                           f"{server.log_tail()}") from None
                time.sleep(0.05)

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port)

    @property
    def version(self) -> str:
        return self.client().info("server")["redis_version"]

    def used_memory(self) -> int:
        """Bytes Redis has allocated for data and its own structures (INFO memory used_memory)."""
        return self.client().info("memory")["used_memory"]

    def log_tail(self, lines: int = 20) -> str:
        path = self.folder / "redis.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def schedule(client: redis.Redis, topic: str, count: int, due_ms: Callable[[int], int], progress: Progress,
             key: str = QUEUE_KEY, chunk: int = 1000) -> None:
    """What the producers do: ``ZADD key due member`` for ``count`` messages (pipelined, as a fast producer would)."""
    task = progress.add_task(f"ZADD {count:,} messages", total=count)
    pipe = client.pipeline(transaction=False)
    for first in range(0, count, chunk):
        last = min(count, first + chunk)
        pipe.zadd(key, {encode_member(uuid.uuid4().bytes, topic, f"k{i}".encode(), payload()): due_ms(i)
                        for i in range(first, last)})
        if (last // chunk) % 10 == 0 or last == count:
            pipe.execute()
            progress.update(task, completed=last)


class Poller:
    """The poller as teams write it: take due members atomically, produce them, flush, repeat."""

    def __init__(self, client: redis.Redis, bootstrap_servers: str, *, key: str = QUEUE_KEY, batch: int = BATCH,
                 idle_sleep_s: float = IDLE_SLEEP_S):
        self.client = client
        self.take_due = client.register_script(TAKE_DUE)
        self.key = key
        self.batch = batch
        self.idle_sleep_s = idle_sleep_s
        # Idempotent, and the same linger as delayq's master: a fair producer, not a tuned one.
        self.producer = Producer({"bootstrap.servers": bootstrap_servers, "enable.idempotence": True,
                                  "linger.ms": 1})
        self.moved = 0
        self.stopping = threading.Event()
        self.failure: BaseException | None = None
        self.thread: threading.Thread | None = None

    def poll_once(self) -> int:
        """Move one batch of due messages to Kafka; how many."""
        due = self.take_due(keys=[self.key], args=[now_ms(), self.batch])
        for member, score in zip(due[::2], due[1::2]):
            _, topic, key, value = decode_member(member)
            self.producer.produce(topic, value, key, headers=[(DUE_HEADER, str(int(float(score))).encode())])
        if due:
            self.producer.flush()
            self.moved += len(due) // 2
        return len(due) // 2

    def run(self) -> None:
        try:
            while not self.stopping.is_set():
                if self.poll_once() == 0:
                    time.sleep(self.idle_sleep_s)
        except BaseException as err:  # surfaced by moved_count(), so a broken poller does not look idle
            self.failure = err

    def start(self) -> Poller:
        self.thread = threading.Thread(target=self.run, name="redis-poller", daemon=True)
        self.thread.start()
        return self

    def moved_count(self) -> int:
        if self.failure is not None:
            raise RuntimeError(f"the Redis poller failed: {self.failure}") from self.failure
        return self.moved

    def stop(self) -> None:
        self.stopping.set()
        if self.thread is not None:
            self.thread.join(30)
        self.producer.flush(30)


def peer_run_schedule(server: RedisServer, stack: DevStack, count: int, due_at: Callable[[int, int], int],
                      label: str, progress: Progress) -> dict:
    """The peer's counterpart of ``service_bench.run_schedule``: same schedule, same lateness figures."""
    timeout_s = 120 + count / 1000
    client = server.client()
    with bench_cluster(stack) as settings:
        target = f"{settings.cluster}-target"
        create_target(settings, target)
        client.delete(QUEUE_KEY)
        poller = Poller(client, settings.bootstrap_servers).start()
        try:
            start = now_ms() + lead_ms(count)
            schedule(client, target, count, lambda i: due_at(start, i), progress)
            stored_ahead_ms = start - now_ms()
            wait_for(progress, label, count, poller.moved_count, timeout_s)
        finally:
            poller.stop()
        records = read_append_times(settings, target, count, timeout_s=60, due_header=DUE_HEADER)
    return lateness_figures(records, count, stored_ahead_ms)


def peer_lateness(server: RedisServer, stack: DevStack, rate: int, seconds: int, progress: Progress) -> dict:
    return peer_run_schedule(server, stack, rate * seconds, steady(rate),
                             f"Redis: {rate} msg/s falling due for {seconds}s", progress)


def peer_mass_expiry(server: RedisServer, stack: DevStack, count: int, progress: Progress) -> dict:
    return peer_run_schedule(server, stack, count, same_instant, f"Redis: {count:,} due at once", progress)


def peer_throughput(server: RedisServer, stack: DevStack, count: int, progress: Progress) -> float:
    """Messages per second the poller moves to Kafka when ``count`` are already due (delayq's delivery figure).

    Timed as delayq's is: from the first to the last record's broker timestamp on the target.
    """
    return peer_delivery(server, stack, count, progress)["msg_s"]


def peer_delivery(server: RedisServer, stack: DevStack, count: int, progress: Progress) -> dict:
    """:func:`peer_throughput`'s run: ``msg_s``, and the CPU seconds the move took (``cpu_s``) by part.

    The CPU window runs from the poller's start until it has moved ``count``: ``client`` is the
    poller's thread and its producer's librdkafka threads (the bench's other threads, its progress
    display and the loop watching the count, are not in it), ``redis-server`` the server process.
    """
    client = server.client()
    with bench_cluster(stack) as settings:
        target = f"{settings.cluster}-target"
        create_target(settings, target)
        client.delete(QUEUE_KEY)
        due = now_ms() - 1000
        schedule(client, target, count, lambda i: due, progress)
        others = threads_named("rdk:")
        poller = Poller(client, settings.bootstrap_servers)
        librdkafka = threads_named("rdk:") - others  # the poller's producer's threads
        redis_pid = [server.process.pid] if server.process is not None else []
        before = thread_cpu_seconds(sorted(librdkafka)), cpu_seconds(redis_pid)
        started_ms = now_ms()
        poller.start()
        polling = [poller.thread.native_id] if poller.thread and poller.thread.native_id else []
        try:
            wait_for(progress, "Redis: moving to Kafka", count, poller.moved_count, 120 + count / 1000,
                     interval_s=0.02)
            # The poller's thread began with the window: all its CPU is the move's.
            cpu = {"client": thread_cpu_seconds(sorted(librdkafka)) - before[0] + thread_cpu_seconds(polling),
                   "redis-server": cpu_seconds(redis_pid) - before[1]}
        finally:
            poller.stop()
        records = read_append_times(settings, target, count, timeout_s=60, due_header=DUE_HEADER)
    return {"msg_s": delivery_rate([appended for appended, _, _ in records], count, started_ms),
            "cpu_s": {part: round(seconds, 3) for part, seconds in cpu.items()}}


def peer_capacity(server: RedisServer, stack: DevStack, count: int, progress: Progress) -> dict:
    """Redis memory for ``count`` pending messages (due in a day), as delayq's capacity figure holds."""
    client = server.client()
    client.flushall()
    before = server.used_memory()
    target = f"{fresh_settings(stack).cluster}-target"  # never produced to: only its name's length counts
    due = now_ms() + 86_400_000
    try:
        schedule(client, target, count, lambda i: due, progress)
        used = server.used_memory() - before
        rss = client.info("memory")["used_memory_rss"]
    finally:
        client.flushall()
    return {"pending": count, "used_memory_bytes": used, "used_memory_bytes_per_message": used / count,
            "rss_bytes": rss}
