"""The buffer reader: a child process of every node that consumes and parses the buffer for ingest.

Ingest's work per buffer record is in two halves that need different things: consuming
and parsing it (the librdkafka message, :func:`delayq.wire.parse_buffer_record`, the
stored form) needs only the record, and applying it (RocksDB reads and the WriteBatch,
the delivery loop's in-flight set) needs the store. In the node's process both would
share its one GIL with the master's delivery loop, which reads every delivered message
back as a `done`. The reader does the first half in a process of its own, on another
core, and hands the node each consumed batch as store ops, ready to apply:

- one frame per ``consume()`` that returned records: for each shard the batch touched,
  the ops (tuples, below), the next offset per partition the batch reached, the ids whose
  record settles a master's write and the earliest due time of a put; op counts, and
  the consumer positions after it;
- a positions-only frame when the positions moved without a record (past transaction
  markers, which a cover waits for), and an empty one once the consumer is assigned;
- with each, the partitions it holds: a record of a feature level above this code's
  (:class:`delayq.wire.NewerLevelRecord`) is neither applied nor dead-lettered; the reader
  stops reading its partition there (paused, its position reported as that record's offset,
  so the master's cover holds the partition) until the node is upgraded.

When the node takes or drops a shard, the same reader is told the partitions to read from
then on, and from which offsets (the stores'), over a second pipe (:meth:`BufferReader.reassign`),
and reads them with a new consumer (:class:`Assignment`): starting another process would
cost an interpreter start and imports, during which none of the node's shards is ingested
and a master that just took one waits (its cover needs ingest). Each assignment has a
number, the generation, that every frame carries: the node drops the frames of an older
one, whose records the new assignment reads again from the stores' offsets.

Frames are ``marshal`` data over a pipe (:class:`multiprocessing.connection.Connection`
on a file descriptor the node passed): both ends are the same delayq, started together.
The node applies a frame's ops and offsets in one WriteBatch, so the store's offsets
say exactly which records it reflects; a reader that dies loses nothing
(the node starts another from the store's offsets). The reader exits when the node does:
it checks its parent every poll, and a write to a closed pipe ends it.

Run as ``python -m delayq.delay_service.reader FD``, its settings as JSON on stdin; only
:class:`delayq.delay_service.ingest.Ingest` starts it.
"""

from __future__ import annotations

import fcntl
import json
import logging
import marshal
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, cast

from confluent_kafka import Consumer, KafkaError, TopicPartition

from delayq import wire
from delayq.clock import now_ms
from delayq.errors import DelayqError
from delayq.settings import KAFKA_LOGGER
from delayq.store import malformed_frame, pack_producer_write, put_frame, remove_frame
from delayq.wire import OP_CANCEL, MalformedRecord, NewerLevelRecord, parse_buffer_record, write_digest

from . import collector, stored

log = logging.getLogger("delayq.ingest.reader")

# The pipe's size: a frame of 2,000 puts with 200-byte payloads (Ingest's batch) is about 700 KiB.
PIPE_BYTES = 1 << 20
# How long the node waits for the reader to stop on SIGTERM before it kills it.
STOP_WAIT_S = 5.0
# How long the node waits for a new reader's first frame (interpreter start-up, consumer assigned).
START_WAIT_S = 60.0
# The first field of the frame a reader sends, in place of positions, when it cannot go on.
_FAILED = "failed"


class ReaderGone(DelayqError):
    """The reader process exited, broke its pipe or could not start; the message says why.

    Once one was running, ingest starts another from the store's offsets (and tries again
    while one cannot start); the node's first one that cannot start stops the node, in one
    line (a librdkafka setting the consumer refuses, say).
    """


@dataclass(frozen=True)
class ReaderConfig:
    """What the reader needs to know, sent as JSON on its stdin."""

    consumer: dict[str, Any]  # librdkafka settings, without the logger (the reader sets its own)
    topic: str
    partitions: list[int]  # the ones to read: those of the shards the node holds
    partition_count: int  # the buffer's: the partition rule of an id needs it
    shards: int  # the cluster's shard count: partition p is shard p % shards
    start: dict[int, int]  # partition -> first offset to read (OFFSET_BEGINNING for none stored)
    compaction_lag_ms: int  # the buffer's min.compaction.lag.ms (parse_batch: when a follows= is aged)
    batch_size: int
    poll_s: float  # how long consume() waits for a first record while records or moves come
    idle_poll_s: float  # ... at most, doubled from poll_s at each look that found nothing new
    log_level: int
    log_format: str  # %-style
    gc_tuned: bool  # Settings.gc_tuned: the collector set as in the node (collector.py)
    generation: int = 0  # of this first assignment (see BufferReader.reassign)


@dataclass(slots=True)
class ShardBatch:
    """What one consumed batch holds for one shard: the ops for its store (store frames), in order.

    Filled by :func:`parse_batch` as it reads the batch, then only read.
    """

    ops: list[tuple]
    offsets: dict[int, int]
    settled: list[str]
    earliest_put: int | None


@dataclass(frozen=True)
class Batch:
    """One consumed batch, parsed: what :meth:`Ingest.poll_once` applies, shard by shard.

    ``held``: the partitions found holding a record of a newer feature level in this batch,
    partition -> (its offset, its level); nothing of them from there on is in the ops.
    """

    shards: dict[int, ShardBatch]
    counts: dict[bytes, int]
    records: int
    held: dict[int, tuple[int, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class Frame:
    """What the node receives: the consumer's positions, a parsed batch (or None), the partitions held."""

    positions: dict[int, int]
    batch: Batch | None
    held: dict[int, tuple[int, int]]  # partition -> (offset, level) of the newer-level record it stops at
    generation: int = 0  # of the assignment the reader read it under


class BufferReader:
    """The node's end of one reader process."""

    def __init__(self, config: ReaderConfig):
        read_fd, write_fd = os.pipe()
        _widen(write_fd)
        control_read_fd, control_write_fd = os.pipe()
        try:
            # A session of its own: a signal to the node's process group (a terminal's Ctrl-C, a
            # supervisor stopping the group) reaches the node, which stops its reader itself; -P:
            # the working directory never shadows the installed delayq.
            self.process = subprocess.Popen(
                [sys.executable, "-P", "-m", "delayq.delay_service.reader", str(write_fd), str(control_read_fd)],
                stdin=subprocess.PIPE, pass_fds=(write_fd, control_read_fd), close_fds=True, start_new_session=True)
        except BaseException:
            os.close(read_fd)
            os.close(control_write_fd)
            raise
        finally:
            os.close(write_fd)
            os.close(control_read_fd)
        self.connection = Connection(read_fd, writable=False)
        self.control = Connection(control_write_fd, readable=False)
        stdin = cast("Any", self.process.stdin)
        try:
            stdin.write(json.dumps(config.__dict__).encode())
            stdin.close()
            if self.receive(START_WAIT_S) is None:
                raise ReaderGone(f"the buffer reader did not start within {START_WAIT_S:.0f} s")
        except (OSError, ReaderGone) as err:  # it died at once (BrokenPipe), or said why
            self.stop()
            raise ReaderGone(f"the buffer reader could not start: {err}") from None

    def receive(self, timeout_s: float) -> Frame | None:
        """The next frame, or None if none came within ``timeout_s``.

        Raises:
            ReaderGone: the reader exited or its pipe broke.
        """
        try:
            if not self.connection.poll(timeout_s):
                return None
            data = self.connection.recv_bytes()
        except (EOFError, OSError) as err:
            raise self._gone(err) from err
        return unpack_frame(data)

    def reassign(self, generation: int, partitions: list[int], start: dict[int, int]) -> None:
        """Read ``partitions`` from now on, each from its offset in ``start``, under assignment ``generation``.

        Returns at once: the reader takes it at its next poll, and from then on its frames carry
        ``generation`` (those before it, the previous one's).

        Raises:
            ReaderGone: the reader exited or its pipe broke.
        """
        try:
            self.control.send_bytes(marshal.dumps((generation, partitions, start)))
        except OSError as err:
            raise self._gone(err) from err

    def _gone(self, err: Exception) -> ReaderGone:
        code = self.process.poll()
        return ReaderGone(f"the buffer reader {'exited with ' + str(code) if code is not None else 'broke its pipe'}"
                          f" ({type(err).__name__})")

    def stop(self) -> None:
        """End the reader (SIGTERM, then SIGKILL) and close the pipe; safe to call twice."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.connection.close()
        self.control.close()


def _widen(fd: int) -> None:
    """Give the pipe room for a whole frame (Linux: up to pipe-max-size, 1 MiB by default).

    With the default 64 KiB the reader waits at every frame until the node has read it
    all; with room for one, it parses the next batch while the node applies this one.
    Best effort: without it frames still pass, a little slower.
    """
    try:
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    except (AttributeError, OSError):  # not Linux, or a lower pipe-max-size
        pass


# -- the reader process ----------------------------------------------------


def parse_batch(messages: list, partitions: int, shards: int = 1, compaction_lag_ms: int | None = None,
                held: Mapping[int, tuple[int, int]] | None = None) -> Batch:
    """Parse consumed buffer records into store ops, in order, shard by shard (the reader's hot path).

    A master's put of a series' next occurrence (``follows=V``) replaces only version V
    while it is younger than the buffer's ``min.compaction.lag.ms`` (``compaction_lag_ms``):
    then compaction cannot have dropped V for it, so V not pending means a cancel or a
    reschedule came between (docs/DESIGN.md, "Repeating messages"). An older one may be
    all that compaction left of its series, and is applied as a plain put.

    A producer's write (a put that is no master's, or a cancel) carries its identity, so the
    store applies a copy that a client library appended again as no write (wire.COPY_WINDOW_MS).

    A record of a newer feature level holds its partition: it and what follows it there are
    left out (``held``: the partitions held already; the batch's ``held``, those it found).
    """
    found: dict[int, ShardBatch] = {}
    aged_before = None if compaction_lag_ms is None else now_ms() - compaction_lag_ms
    counts = {b"put": 0, b"cancel": 0, b"done": 0, b"malformed": 0}
    pack, shard_of = stored.pack, wire.shard_of
    records = 0
    newly_held: dict[int, tuple[int, int]] = {}
    for message in messages:
        error = message.error()
        if error is not None:
            if error.code() != KafkaError._PARTITION_EOF:
                log.warning("buffer consumer: %s", error.str())
            continue
        partition, offset = message.partition(), message.offset()
        if partition in newly_held or (held and partition in held):
            continue
        records += 1
        headers = message.headers()
        shard = found.get(shard_of(partition, shards))
        if shard is None:
            shard = found[shard_of(partition, shards)] = ShardBatch([], {}, [], None)
        ops = shard.ops
        shard.offsets[partition] = offset + 1
        key, value, timestamp_ms = message.key(), message.value(), message.timestamp()[1]
        try:
            record = parse_buffer_record(key, value, headers, timestamp_ms, partition=partition, partitions=partitions)
        except MalformedRecord as bad:
            ops.append(_malformed(message, partition, offset, headers, bad))
            counts[b"malformed"] += 1
            continue
        except NewerLevelRecord as newer:
            log.warning("buffer record %s/%d/%d: %s; reading of partition %d stops there, nothing is dead-lettered",
                        message.topic(), partition, offset, newer, partition)
            newly_held[partition] = (offset, newer.level)
            shard.offsets[partition] = offset
            records -= 1
            continue
        counts[record.op] += 1
        env = record.envelope
        if env is not None:  # a put: only a put has an envelope
            only_over = record.restores
            if record.follows is not None:
                shard.settled.append(record.delay_id)
                if aged_before is None or env.created_at_ms >= aged_before:
                    only_over = record.follows
            written = (_written(partition, offset, timestamp_ms, key, value, headers)
                       if record.restores is None and record.follows is None else None)
            ops.append(put_frame(record.delay_id, env.deliver_at_ms, pack(partition, offset, env), offset, only_over,
                                 written))
            if record.restores is not None:
                shard.settled.append(record.delay_id)
            if shard.earliest_put is None or env.deliver_at_ms < shard.earliest_put:
                shard.earliest_put = env.deliver_at_ms
        else:
            written = _written(partition, offset, timestamp_ms, key, value, headers) if record.op == OP_CANCEL else None
            ops.append(remove_frame(record.delay_id, record.closes_version, written))
            shard.settled.append(record.delay_id)
    return Batch(found, counts, records, newly_held)


def _written(partition: int, offset: int, timestamp_ms: int, key: bytes, value: bytes | None,
             headers: wire.Headers | None) -> bytes:
    """A producer write's identity, by which the store knows a copy of it."""
    return pack_producer_write(partition, offset, timestamp_ms if timestamp_ms > 0 else 0,
                               write_digest(key, value, headers))


def _malformed(message: Any, partition: int, offset: int, headers: wire.Headers | None,
               bad: MalformedRecord) -> tuple:
    """The op that keeps a malformed record until the master has dead-lettered it."""
    key = message.key()
    # A valid id on its own partition: the record is the id's newest, which matters to compaction.
    # (A record without a key is BAD_ID.)
    own_id = (key.decode() if key is not None and bad.code not in (wire.Reason.BAD_ID, wire.Reason.WRONG_PARTITION)
              else None)
    log.debug("buffer record %s/%d/%d is malformed (%s)", message.topic(), partition, offset, bad.reason)
    record = stored.MalformedBufferRecord(key, message.value(), list(headers or []), message.timestamp()[1],
                                          bad.code.value, bad.reason)
    return malformed_frame(partition, offset, stored.pack_malformed(record), own_id)


def pack_frame(positions: list[tuple[int, int]], batch: Batch | None,
               held: Mapping[int, tuple[int, int]] | None = None, generation: int = 0) -> bytes:
    """The bytes of one frame the reader sends the node: positions, the batch if any, held partitions, generation."""
    # A batch's own ``held`` stays in the reader (it pauses those partitions): the frame says them all.
    fields = None if batch is None else (
        {k: (b.ops, b.offsets, b.settled, b.earliest_put) for k, b in batch.shards.items()}, batch.counts,
        batch.records)
    return marshal.dumps((positions, fields, dict(held or {}), generation))


def unpack_frame(data: bytes) -> Frame:
    """A frame back as positions, batch, held partitions and generation.

    Raises:
        ReaderGone: it is the frame of a reader that cannot go on.
    """
    loaded = marshal.loads(data)
    if loaded[0] == _FAILED:
        raise ReaderGone(loaded[1])
    positions, batch, held, generation = loaded
    if batch is None:
        return Frame(dict(positions), None, held, generation)
    shards, counts, records = batch
    return Frame(dict(positions), Batch({shard: ShardBatch(*fields) for shard, fields in shards.items()}, counts,
                                        records), held, generation)


class Assignment:
    """What the reader reads now, with a consumer of its own: the partitions, from where, under which generation.

    Each assignment gets a new consumer (the previous one closed) rather than ``assign()`` again on
    the same one, and costs milliseconds, not a process start. A consumer assigned a second time
    and then cut off by a broker frozen a few seconds kept its positions still while records came,
    until the next assignment, in 4 runs of 9 of that scenario (a new consumer: in none of 5; in a
    30-minute soak a node's ingest stood ten minutes): after the broker had briefly reported no
    leader, librdkafka left the partitions with its internal broker (librdkafka issue 5430). That
    can strike any librdkafka client, so ingest also replaces a reader that stands still
    (``ingest.READER_STUCK_S``); a consumer's first assignment is the path every reader took before.
    """

    def __init__(self, conf: dict[str, Any], topic: str, generation: int, partitions: list[int],
                 start: Mapping[int, int]):
        self.topic = topic
        self.generation = generation
        self.place = [TopicPartition(topic, p) for p in partitions]
        # Partitions stopped at a record of a newer feature level: (offset, level). Until the node is
        # upgraded (a reader then starts from the store's offsets, which stop there too).
        self.held: dict[int, tuple[int, int]] = {}
        self.sent: list[tuple[int, int]] | None = None  # the positions last sent
        self.consumer = Consumer(conf)
        try:
            self.consumer.assign([TopicPartition(topic, p, start[p]) for p in partitions])
        except BaseException:
            self.consumer.close()
            raise

    def replaced(self, conf: dict[str, Any], command: bytes) -> Assignment:
        """The assignment the node sent (``command``: BufferReader.reassign's), in place of this one (closed)."""
        generation, partitions, start = marshal.loads(command)
        self.consumer.close()
        log.debug("reading partitions %s (assignment %d)", sorted(partitions), generation)
        return Assignment(conf, self.topic, generation, partitions, start)


def read(config: ReaderConfig, connection: Connection, control: Connection) -> None:
    """Consume the buffer and send frames until the node is gone; take each assignment ``control`` brings."""
    parent = os.getppid()
    conf = {**config.consumer, "logger": KAFKA_LOGGER}
    try:
        now = Assignment(conf, config.topic, config.generation, config.partitions, config.start)
    except Exception as err:  # a setting librdkafka refuses: the node says so in one line and stops
        connection.send_bytes(marshal.dumps((_FAILED, f"its consumer refused to start: {err}")))
        return
    try:
        connection.send_bytes(pack_frame([], None, generation=now.generation))  # started: receive() returns
        if config.gc_tuned:
            collector.freeze_started()
        wait_s = config.poll_s
        while os.getppid() == parent:
            command = None
            while control.poll(0):  # the node took or dropped a shard: only the latest assignment matters
                command = control.recv_bytes()
            if command is not None:
                now = now.replaced(conf, command)
            consumer = now.consumer
            # What has come in, at once; if nothing, wait for the first record only: consume()
            # returns when its batch is full or its timeout passes, so a batch-sized wait would hold
            # a lone record (a cancel, a master's done that a cover waits for) for the whole timeout.
            messages = consumer.consume(config.batch_size, 0)
            if not messages:
                messages = consumer.consume(1, wait_s)
                if messages:
                    messages += consumer.consume(config.batch_size - 1, 0)
            batch = None
            held = now.held
            if messages:
                batch = parse_batch(messages, config.partition_count, config.shards,
                                    config.compaction_lag_ms, held)
                if batch.held:
                    held.update(batch.held)
                    consumer.pause([TopicPartition(config.topic, p) for p in batch.held])
            # position() moves past transaction markers; the last message's offset + 1 would not.
            # A held partition is read up to its newer-level record, whatever was fetched after it.
            positions = [(tp.partition, held[tp.partition][0] if tp.partition in held else tp.offset)
                         for tp in consumer.position(now.place) if tp.offset >= 0 or tp.partition in held]
            if batch is not None:
                connection.send_bytes(pack_frame(positions, batch, held, now.generation))
            elif positions != now.sent:
                connection.send_bytes(pack_frame(positions, None, held, now.generation))
            else:
                wait_s = min(wait_s * 2, config.idle_poll_s)
                continue
            now.sent = positions
            wait_s = config.poll_s
    except (BrokenPipeError, ConnectionResetError, EOFError):
        pass  # the node is gone
    finally:
        now.consumer.close()


def main(argv: list[str]) -> int:
    config_fields = json.loads(sys.stdin.buffer.read())
    config_fields["start"] = {int(p): o for p, o in config_fields["start"].items()}
    config = ReaderConfig(**config_fields)
    if config.gc_tuned:
        collector.tune()
    try:
        logging.basicConfig(level=config.log_level, format=config.log_format)
    except ValueError:  # a format or level this logging does not take: its defaults, rather than no reader
        logging.basicConfig(level=logging.INFO, force=True)
    # SIGTERM from the node: leave the loop through the finally (the consumer closes).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with Connection(int(argv[0]), readable=False) as connection, Connection(int(argv[1]), writable=False) as control:
        read(config, connection, control)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
