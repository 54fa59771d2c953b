"""Ten thousand hostile records on the buffer topic of a three-node cluster.

Random keys (none, empty, non-ASCII, UUIDs), values (a few close to the broker's 1 MB), random
headers, nearly right frames and tombstones, and 500 valid puts among them, written the way the
proxy writes them. Then: no node crashes or stalls, every malformed record is on the dead-letter
topic with its source and reason, every valid put is delivered exactly once, bit for bit.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import dataclass

import pytest
from confluent_kafka import Consumer, Message, Producer, TopicPartition
from support.kafka_testing import create_topics, read_topic
from support.process_testing import wait_until
from support.service_testing import now_ms

from delayq import wire
from delayq.delay_service.partitioners import partition_for
from delayq.wire import BufferRecord, Envelope, MalformedRecord, buffer_partition, new_delay_id, parse_buffer_record

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SEED = 20261123
RECORDS = 10_000
VALID = 500
LARGE = 12  # malformed values of 0.90 to 0.98 MB (the producer's message.max.bytes is 1,000,000)
LARGE_VALID = 3
NULL_KEYS = 20  # a compacted topic refuses a record without a key; written one by one
NODES = ("a", "b", "c")
BUFFER_PARTITIONS = 3  # the settings fixture's buffer_partitions
READY_WITHIN_S = 120


@dataclass
class Sent:
    """One record written to the buffer, with what parse_buffer_record says of it."""

    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]
    partition: int
    timestamp: int = 0  # 0: the producer's clock
    parsed: BufferRecord | None = None
    reason: str | None = None  # set when malformed
    offset: int | None = None
    error: str | None = None

    def judge(self) -> Sent:
        """Parse as a node of a buffer of BUFFER_PARTITIONS partitions reads the record where it is written."""
        try:
            self.parsed = parse_buffer_record(self.key, self.value, self.headers, self.timestamp,
                                              partition=self.partition, partitions=BUFFER_PARTITIONS)
        except MalformedRecord as bad:
            self.reason = bad.reason
        return self


# -- random records ----------------------------------------------------------------

NUMBERS = [b"", b"0", b"007", b"1e3", b"0x10", b"+5", b"-1", b"1.5", b" 1", b"9" * 19, b"9" * 40, b"\xff",
           "١٢".encode(), "１".encode()]
BAD_TOPICS = [b"", b".", b"..", b"a/b", b"a b", b"a" * 250, "é".encode(), b"\xff\xfe", b"t\r", b"t\x00"]
OPTIONS = [b"partition=", b"partition", b"partitioner=", b"value=NULL", b"value=", b"colour=red", b"",
           b"partition=-1", b"partition=1=2", b"partition=" + b"1" * 19, b"Partition=1", b"restores=x",
           b"value=null value=null", b"partition=1 partition=2"]
HEADER_NAMES = ["trace", "", "é", "ключ", "a" * 300, " ", "delayq", wire.OP, wire.ID, wire.VERSION, wire.CUTOFF,
                wire.EPOCH, "delayq-", "delayq-x", "Delayq-op"]
HEADER_VALUES = [None, b"", b"cancel", b"done", b"put", b"7", b"-1", b"1" * 19, b"\xff\x00", "é".encode()]


def some_key(rnd: random.Random) -> bytes:
    return rnd.choice([
        b"", "é".encode(), "ключ".encode(), b"\xff\xfe", b"\x00", b"id with spaces", b"\n",
        new_delay_id().encode(), new_delay_id().upper().encode(), rnd.randbytes(rnd.randint(1, 40)),
        bytes(rnd.choices(b"abcdefghijklmnopqrstuvwxyz0123456789-", k=rnd.randint(1, 36))),
    ])


def some_headers(rnd: random.Random, names: list[str]) -> list[tuple[str, bytes | None]]:
    return [(rnd.choice(names), rnd.choice([*HEADER_VALUES, rnd.randbytes(rnd.randint(0, 20))]))
            for _ in range(rnd.choice([0, 0, 1, 2, 5]))]


def user_headers(rnd: random.Random) -> list[tuple[str, bytes | None]]:
    return some_headers(rnd, [name for name in HEADER_NAMES if not name.startswith(wire.RESERVED_PREFIX)])


def nearly_a_frame(rnd: random.Random, topic: str) -> bytes:
    """A put's value with one or two fields, separators or line ends wrong."""
    key = rnd.choice([None, b"", b"k", rnd.randbytes(rnd.randint(0, 30))])
    fields = [b"put", str(now_ms() + 3_600_000).encode(), topic.encode(),
              b"-" if key is None else str(len(key)).encode()]
    for _ in range(rnd.randint(1, 2)):
        spot = rnd.randrange(5)
        if spot == 0:
            fields[0] = rnd.choice([b"PUT", b"put\r", b"", b"cancel", b"pu"])
        elif spot == 1:
            fields[1] = rnd.choice(NUMBERS)
        elif spot == 2:
            fields[2] = rnd.choice(BAD_TOPICS)
        elif spot == 3:
            fields[3] = rnd.choice([*NUMBERS, b"--", str(len(key or b"") + 10 ** 6).encode()])
        else:
            fields.append(rnd.choice(OPTIONS))
    separator = rnd.choice([b" "] * 6 + [b"  ", b"\t"])
    line_end = rnd.choice([b"\n"] * 6 + [b"\r\n", b"", b" \n"])
    line = separator.join(fields)
    if rnd.random() < 0.05:
        line += b" partitioner=" + b"x" * wire.MAX_FRAME_LINE
    return line + line_end + (key or b"") + rnd.randbytes(rnd.randint(0, 200))


def hostile(rnd: random.Random, partitions: int, topic: str) -> Sent:
    """A record the nodes must dead-letter (or a harmless tombstone): never a put that parses."""
    while True:
        kind = rnd.randrange(6)
        key = some_key(rnd)
        if kind == 0:  # bytes
            value = rnd.randbytes(rnd.randint(0, 2000))
            headers = some_headers(rnd, HEADER_NAMES)
        elif kind == 1:  # nearly a frame
            value = nearly_a_frame(rnd, topic)
            headers = user_headers(rnd)
        elif kind == 2:  # a tombstone with odd headers
            value = None
            headers = some_headers(rnd, [wire.OP, wire.ID, wire.VERSION, wire.CUTOFF] * 3 + HEADER_NAMES)
            if rnd.random() < 0.5:
                headers.insert(rnd.randint(0, len(headers)), (wire.OP, rnd.choice([b"cancel", b"done"])))
        elif kind == 3:  # a good frame with a reserved header
            value = wire.put_value(now_ms(), topic, b"k", b"v")
            headers = [*user_headers(rnd), (rnd.choice([wire.OP, wire.ID, wire.VERSION, "delayq-x"]), b"1")]
        elif kind == 4:  # a good frame but for a topic Kafka refuses: it once killed every master in turn
            topic_field = rnd.choice([b"a/b", b"", "é".encode(), b"a" * 250, b"..", b"a:b"])
            value = b"put %d %s -\nx" % (now_ms(), topic_field)
            headers = user_headers(rnd)
        else:  # a good put, with a key that is not one
            value = wire.put_value(now_ms() + 3_600_000, topic, None, b"v")
            key = rnd.choice([b"", "é".encode(), b"\xff"])
            headers = []
        sent = Sent(key, value, headers, rnd.randrange(partitions)).judge()
        if kind == 4:
            assert sent.reason is not None, f"a put for topic {topic_field!r} must be malformed"
        if sent.parsed is None or sent.parsed.op != wire.OP_PUT:
            return sent


def valid_put(rnd: random.Random, partitions: int, targets: dict[str, int], due_from_ms: int,
              value_size: int | None = None) -> tuple[Sent, Envelope]:
    """A put as the proxy writes it, on the buffer partition of its id, to an existing target."""
    topic = rnd.choice(sorted(targets))
    if value_size is not None:
        value = rnd.randbytes(value_size)
    else:
        value = rnd.choice([None, b"", b"\n", b"put 1 t -\n", "значение".encode(), rnd.randbytes(rnd.randint(0, 4000))])
    message = Envelope(
        delay_id=new_delay_id(), topic=topic, deliver_at_ms=due_from_ms + rnd.randint(0, 10_000), value=value,
        key=rnd.choice([None, b"", "ключ".encode(), b"\xff\n", rnd.randbytes(rnd.randint(1, 20))]),
        partition=rnd.randrange(targets[topic]) if rnd.random() < 0.25 else None,
        headers=user_headers(rnd) if value_size is None else [],
        partitioner=rnd.choice([None, "murmur2_random", "consistent", "fnv1a_random", "random"]),
    )
    # Kafka keeps a CreateTime of -1 as the put's creation time.
    sent = Sent(message.delay_id.encode(), message.buffer_value(), message.buffer_headers(),
                buffer_partition(message.delay_id, partitions), -1 if rnd.random() < 0.05 else 0).judge()
    assert sent.parsed is not None and sent.parsed.op == wire.OP_PUT, sent.reason
    return sent, message


# -- writing and reading -------------------------------------------------------------


def write(settings, records: list[Sent]) -> None:
    """Write every record, keeping its offset or the broker's refusal."""
    producer = Producer(settings.kafka_conf(**{"linger.ms": 20, "compression.type": "lz4"}))

    def written(sent: Sent):
        def on_delivery(error, message: Message) -> None:
            if error is None:
                sent.offset = message.offset()
            else:
                sent.error = error.str()
        return on_delivery

    for i, sent in enumerate(records):
        while True:
            try:
                producer.produce(settings.buffer_topic, key=sent.key, value=sent.value, headers=sent.headers,
                                 partition=sent.partition, timestamp=sent.timestamp, on_delivery=written(sent))
                break
            except BufferError:
                producer.poll(0.1)
        if sent.key is None:
            # A null key makes the broker refuse the whole batch: keep it alone in one.
            assert producer.flush(30) == 0
        elif i % 1000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0


def read_to_end(settings, topic: str) -> list[Message]:
    """Every record of ``topic`` up to its current end offsets."""
    consumer = Consumer(settings.kafka_conf(**{"group.id": f"fuzz-reader-{time.monotonic_ns()}",
                                               "enable.auto.commit": False, "auto.offset.reset": "earliest"}))
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in partitions}
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        records: list[Message] = []
        deadline = time.monotonic() + 120
        while any(consumer.position([TopicPartition(topic, p)])[0].offset < end for p, end in ends.items()
                  if end > 0):
            assert time.monotonic() < deadline, f"could not read {topic} to its end"
            records += [m for m in consumer.consume(1000, 0.5) if m.error() is None]
        return records
    finally:
        consumer.close()


def header(record: Message, name: str) -> bytes | None:
    return dict(record.headers() or []).get(name)


def wait_all_ready(cluster, within_s: float) -> float:
    """Seconds until every node answers /readyz 200; each must stay alive meanwhile."""
    started = time.monotonic()
    for node in cluster.nodes.values():
        node.wait_ready(max(1.0, within_s - (time.monotonic() - started)))
    return time.monotonic() - started


def assert_alive(cluster) -> None:
    for node_id, node in cluster.nodes.items():
        assert node.process.poll() is None, f"node {node_id} exited:\n{node.log_tail()}"
        assert node.get("/livez")[0] == 200, f"node {node_id} not live:\n{node.log_tail()}"


# -- the test ------------------------------------------------------------------------


@pytest.mark.timeout(600)
def test_ten_thousand_hostile_records_crash_nothing_and_every_valid_put_is_delivered_once(cluster, settings,
                                                                                          names):
    rnd = random.Random(SEED)
    targets = {names.topic("target-a"): 3, names.topic("target-b"): 1}
    for topic, partitions in targets.items():
        create_topics(settings.bootstrap_servers, [topic], partitions=partitions)
    for node_id in NODES:
        cluster.start(node_id)
    parts = settings.buffer_partitions
    assert parts == BUFFER_PARTITIONS
    some_topic = min(targets)

    due_from = now_ms() + 4_000
    puts = [valid_put(rnd, parts, targets, due_from) for _ in range(VALID - LARGE_VALID)]
    puts += [valid_put(rnd, parts, targets, due_from, rnd.randint(900_000, 950_000)) for _ in range(LARGE_VALID)]
    records = [hostile(rnd, parts, some_topic) for _ in range(RECORDS - VALID - LARGE - NULL_KEYS)]
    for _ in range(LARGE):
        frame = rnd.choice([b"", b"put 1 t 5000000\n", b"put 1 t -\r\n"])  # none, past the end, \r\n
        big = Sent(some_key(rnd), frame + rnd.randbytes(rnd.randint(900_000, 980_000)), [], rnd.randrange(parts)).judge()
        assert big.reason is not None
        records.append(big)
    records += [sent for sent, _ in puts]
    rnd.shuffle(records)
    nulls = [hostile(rnd, parts, some_topic) for _ in range(NULL_KEYS)]
    for sent in nulls:
        sent.key = None
        sent.judge()
    records = nulls + records
    by_id = {message.delay_id: message for _, message in puts}
    total_bytes = sum(len(s.value or b"") for s in records)
    assert len(records) == RECORDS and total_bytes < 100_000_000

    written_at = time.monotonic()
    write(settings, records)
    on_buffer = [s for s in records if s.error is None]
    refused = [s for s in records if s.error is not None]
    assert all(s.key is None for s in refused), [s.error for s in refused if s.key is not None][:3]
    malformed = {f"{settings.buffer_topic}/{s.partition}/{s.offset}": s for s in on_buffer if s.reason is not None}
    tombstones = [s for s in on_buffer if s.parsed is not None and s.parsed.op != wire.OP_PUT]

    # No node dies; all are caught up again (every record read, every dead letter flushed) in time.
    time.sleep(1.5)  # past the nodes' next read of the end offsets
    ready_after = wait_all_ready(cluster, READY_WITHIN_S)
    assert_alive(cluster)
    # Ready means at most one lag refresh behind under traffic; the counts below want the very end.
    assert wait_until(lambda: all(n.metric("delayq_buffer_lag") == 0 for n in cluster.nodes.values()),
                      timeout_s=READY_WITHIN_S)
    # The master dead-letters what every node found malformed; each node then forgets its own list.
    assert wait_until(lambda: all(n.metric("delayq_malformed_waiting") == 0 for n in cluster.nodes.values()),
                      timeout_s=READY_WITHIN_S)

    # Every malformed record is on the dead-letter topic as it was, with its reason and source,
    # once per cluster: three nodes read it, only the master writes the copy.
    letters = read_to_end(settings, settings.dead_letter_topic)
    copies: Counter[str] = Counter()
    for letter in letters:
        source = header(letter, wire.DEAD_LETTER_SOURCE)
        assert source is not None, f"a dead letter without a source: {letter.headers()[-3:]}"
        source = source.decode()
        assert source in malformed, f"{source} was dead-lettered but parses: {header(letter, wire.DEAD_LETTER_REASON)}"
        sent = malformed[source]
        copies[source] += 1
        assert header(letter, wire.DEAD_LETTER_REASON) == sent.reason.encode()
        assert (letter.key(), letter.value()) == (sent.key, sent.value)
        assert list(letter.headers())[:len(sent.headers)] == sent.headers
    missing = set(malformed) - set(copies)
    assert not missing, f"{len(missing)} malformed records not dead-lettered, e.g. {sorted(missing)[:3]}"
    too_many = {source: n for source, n in copies.items() if n > 1}
    assert not too_many, f"dead-lettered more than once: {list(too_many.items())[:3]}"
    assert sum(node.metric("delayq_dead_lettered_total") for node in cluster.nodes.values()) == len(letters)

    # Every valid put is delivered exactly once, as it was given.
    delivered: Counter[str] = Counter()
    for topic, partitions in targets.items():
        expect = sum(1 for m in by_id.values() if m.topic == topic)
        for record in read_topic(settings.bootstrap_servers, topic, expect=expect, timeout_s=240, idle_s=3):
            delay_id = header(record, wire.ID).decode()
            delivered[delay_id] += 1
            message = by_id[delay_id]
            assert (record.topic(), record.key(), record.value()) == (message.topic, message.key, message.value)
            assert list(record.headers())[:len(message.headers)] == message.headers
            # The partition the user named, or the one the producing client's partitioner picks.
            chosen = partition_for(message.key, partitions, message.partitioner)
            if message.partition is not None or chosen != -1:
                assert record.partition() == (chosen if message.partition is None else message.partition)
    duplicated = {i: n for i, n in delivered.items() if n > 1}
    lost = set(by_id) - set(delivered)
    assert not duplicated and not lost, f"{len(duplicated)} delivered twice, {len(lost)} never"

    # Nothing is left pending (no malformed record slipped into a store), and nobody stalled.
    deadline = time.monotonic() + 60
    while any(node.metric("delayq_pending") for node in cluster.nodes.values()):
        assert time.monotonic() < deadline, {i: n.metric("delayq_pending") for i, n in cluster.nodes.items()}
        time.sleep(0.5)
    assert_alive(cluster)
    assert wait_all_ready(cluster, 30) < 30

    print(f"\n{len(records)} records ({total_bytes / 1e6:.1f} MB) in {time.monotonic() - written_at:.0f}s: "
          f"{len(refused)} refused by the broker (null key), {len(malformed)} malformed, "
          f"{len(tombstones)} harmless tombstones, {len(by_id)} valid puts delivered once each; "
          f"{len(letters)} dead letters ({dict(sorted(Counter(copies.values()).items()))} copies per record); "
          f"all nodes ready {ready_after:.1f}s after the last write")


# -- records at the size limit ---------------------------------------------------------

# The broker takes up to message.max.bytes 1,048,588; librdkafka producers send up to 1,000,000 by
# default. A record a client writes just under its limit does not fit once a node adds headers.
NEAR_LIMIT = 999_850


@pytest.mark.timeout(120)
def test_a_malformed_record_at_the_size_limit_is_dead_lettered_and_the_node_lives(cluster, settings):
    cluster.start("a")
    producer = Producer(settings.kafka_conf())
    producer.produce(settings.buffer_topic, key=new_delay_id().encode(), value=b"x" * NEAR_LIMIT, partition=0)
    assert producer.flush(30) == 0
    time.sleep(1.5)

    wait_all_ready(cluster, 30)
    assert_alive(cluster)
    assert len(read_to_end(settings, settings.dead_letter_topic)) == 1


@pytest.mark.timeout(120)
def test_a_put_too_large_to_deliver_does_not_hold_up_the_others(cluster, settings, names):
    target = names.topic("target")
    create_topics(settings.bootstrap_servers, [target])
    cluster.start("a")
    producer = Producer(settings.kafka_conf(**{"message.max.bytes": 1_040_000}))
    big = Envelope(new_delay_id(), target, now_ms(), b"x" * 1_000_000)
    small = Envelope(new_delay_id(), target, now_ms() + 1_000, b"small")
    for message in (big, small):
        producer.produce(settings.buffer_topic, key=message.delay_id.encode(), value=message.buffer_value(),
                         partition=buffer_partition(message.delay_id, settings.buffer_partitions))
    assert producer.flush(30) == 0

    delivered = read_topic(settings.bootstrap_servers, target, expect=1, timeout_s=12)
    assert [header(r, wire.ID).decode() for r in delivered] == [small.delay_id]
    # The big one is dead-lettered once, with the reason, its value left out of the copy.
    dead = read_to_end(settings, settings.dead_letter_topic)
    assert [(r.key().decode(), r.value()) for r in dead] == [(big.delay_id, None)]
    assert header(dead[0], wire.DEAD_LETTER_REASON).startswith(b"rejected: Kafka refused the record: ")
