"""A frozen broker (SIGSTOP: a long GC pause, a stalled disk, a hung VM), then the same broker killed and
restarted, and a frozen ZooKeeper, under a producer built as the README shows and a sharded cluster with replicas (issue 28).

What it broke before: librdkafka's defaults (no idempotence, a million requests in flight)
may land a retried put behind its own cancel or write it twice; masters waited a minute in
30-second commit and abort calls before they handed over; and a node taking a shard while
Kafka did not answer left the shard's store open and locked, then crashed on it.
Judged by what delayq did not produce: the producer's acks and the broker's offsets and
LogAppendTime timestamps.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections import Counter, defaultdict

import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType
from support.kafka_testing import create_topics, read_topic
from support.process_testing import wait_until
from support.service_testing import Cluster, Feeder, freeze, kafka_pid, now_ms, start_private_stack, thaw, zookeeper_pid
from support.traffic_testing import readme_producer, while_writing

from delayq import Settings, wire
from delayq.bench.soak_faults import DROPPED_MARKERS
from delayq.delay_service import ensure_shards, ensure_topics, transactions
from delayq.delay_service.handoff import InFlight
from delayq.delay_service.transactions import ShardTransactions, TransactionStuck
from delayq.dev import StackError
from delayq.election import Term

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FREEZE_S = 8.0
# Past Kafka's 9 s broker session, below the stack's one-broker session less a heartbeat's 2 s.
LONE_FREEZE_S = 11.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """A Kafka and ZooKeeper of this module's own: its broker is frozen and killed."""
    try:
        stack = start_private_stack(tmp_path_factory.mktemp("stall-stack"))
    except StackError as err:
        pytest.fail(f"a private Kafka + ZooKeeper could not start: {err}", pytrace=False)
    yield stack
    for pid in (kafka_pid(stack), zookeeper_pid(stack)):
        thaw(pid)  # never leave a frozen server behind
    stack.down()


def frozen_for(pid: int, seconds: float) -> tuple[int, int]:
    """SIGSTOP a server's process group for ``seconds``, then SIGCONT: the (start, end) of the freeze, epoch ms."""
    started = now_ms()
    freeze(pid)
    try:
        time.sleep(seconds)
    finally:
        thaw(pid)
    return started, now_ms()


def freeze_then_kill(stack, *, after_s: float = 3.0, while_down=lambda: None) -> tuple[int, int]:
    """Freeze the broker for FREEZE_S, let it run ``after_s``, kill it (and call ``while_down``) and start it
    again: the (start, end) of the outage, in epoch ms."""
    pid = kafka_pid(stack)
    started, _ = frozen_for(pid, FREEZE_S)
    time.sleep(after_s)
    os.killpg(pid, signal.SIGKILL)
    wait_until(lambda: not stack.status()[0].running, timeout_s=15)
    while_down()
    time.sleep(2)
    stack.up(say=lambda _text: None)
    return started, now_ms()


def settings_on(stack, names, **fields) -> Settings:
    return Settings(bootstrap_servers=stack.bootstrap_servers, zk_connect=stack.zk_connect, cluster=names.cluster,
                    zk_session_timeout_ms=4000, **{"buffer_partitions": 3, **fields})


def test_each_ids_writes_land_in_the_order_sent_and_once_across_a_frozen_then_killed_broker(stack, names, tmp_path):
    settings = settings_on(stack, names)
    Cluster(settings, tmp_path)  # makes the buffer topic (no nodes: only the buffer's order is judged)
    producer = readme_producer(settings)
    target = names.topic("target")
    # Per id: put, reschedule, cancel, each acknowledged with its offset (or a failure).
    acked: dict[str, list[tuple[int, int]]] = defaultdict(list)  # id -> [(write number, offset)]
    failed: list[str] = []
    sent = Counter()

    def report(number: int):
        def on_delivery(err, msg):
            if err is not None:
                failed.append(f"{msg.key().decode()} write {number}: {err}")
            else:
                acked[msg.key().decode()].append((number, msg.offset()))
        return on_delivery

    def write_some() -> None:
        for _ in range(50):
            delay_id = producer.produce(target, b"w0", delay=3600, on_delivery=report(0))
            producer.reschedule(delay_id, target, b"w1", delay=7200, on_delivery=report(1))
            producer.cancel(delay_id, on_delivery=report(2))
            sent["ids"] += 1

    while_writing(producer, write_some, lambda: freeze_then_kill(stack), before_s=2, after_s=3, every_s=0.05)
    assert not failed, failed[:5]

    records = read_topic(settings.bootstrap_servers, settings.buffer_topic, expect=3 * sent["ids"], timeout_s=120,
                         idle_s=3)
    in_buffer: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for record in sorted(records, key=lambda r: (r.partition(), r.offset())):
        parsed = wire.parse_buffer_record(record.key(), record.value(), record.headers() or [],
                                         partition=record.partition(), partitions=settings.buffer_partitions)
        # Raises for a record the nodes would not take (off its partition, a bad frame).
        what = "cancel" if parsed.envelope is None else (parsed.envelope.value or b"").decode()
        in_buffer[record.key().decode()].append((record.offset(), what))
    assert len(in_buffer) == sent["ids"] > 1000
    disorder = {i: w for i, w in in_buffer.items() if [what for _, what in w] != ["w0", "w1", "cancel"]}
    assert not disorder, f"{len(disorder)} ids not written put, reschedule, cancel, each once: " \
                         f"{list(disorder.items())[:3]}"
    # The acks agree with the broker: each write's offset ascends in the order it was sent.
    for delay_id, writes in acked.items():
        assert [n for n, _ in sorted(writes, key=lambda w: w[1])] == [0, 1, 2], (delay_id, writes)
        assert [offset for offset, _ in in_buffer[delay_id]] == sorted(offset for _, offset in writes)


def sharded_cluster(stack, names, tmp_path) -> tuple[Settings, str, Cluster]:
    """Three nodes, ``delayq init --shards 3``, DELAYQ_REPLICAS=2, each shard mastered; a target topic whose
    records the broker stamps as it appends them (evidence the masters did not produce)."""
    settings = settings_on(stack, names, shards=3, replicas=2, buffer_partitions=6)
    target = names.topic("target")
    create_topics(settings.bootstrap_servers, [target], partitions=3,
                  config={"message.timestamp.type": "LogAppendTime"})
    cluster = Cluster(settings, tmp_path / "nodes")
    ensure_shards(settings)
    for node_id in ("node-a", "node-b", "node-c"):
        cluster.start(node_id)
    assert wait_until(lambda: sorted(cluster.masterships()) == [0, 1, 2], timeout_s=60), cluster.masterships()
    return settings, target, cluster


def under_traffic(settings: Settings, target: str, fault) -> tuple[dict[str, int], tuple[int, int]]:
    """Messages due 1.5 s after they are sent, 100 a second, from 8 s before ``fault()`` (which returns its
    outage, in epoch ms) until 20 s after it: their ids and due times, and the outage."""
    producer = readme_producer(settings)
    due: dict[str, int] = {}

    def write_some() -> None:
        for _ in range(10):
            at = now_ms() + 1500
            due[producer.produce(target, b"m", deliver_at=at)] = at

    outage = while_writing(producer, write_some, fault, before_s=8, after_s=20, every_s=0.1)
    return due, outage


def assert_delivered_once_in_time(settings: Settings, target: str, cluster: Cluster, due: dict[str, int],
                                  outage: tuple[int, int], bound_ms: int | None = None) -> None:
    """Every message once; none later than ``bound_ms`` (default the ZooKeeper session + 10 s) beyond the outage
    (what fell due during it may wait for its end), by the broker's append time; no node crashed; one master per
    shard again."""
    records = read_topic(settings.bootstrap_servers, target, expect=len(due), timeout_s=120, idle_s=3)
    counts = Counter(dict(r.headers())[wire.ID].decode() for r in records)
    assert set(counts) == set(due), f"{len(set(due) - set(counts))} of {len(due)} never delivered"
    assert max(counts.values()) == 1, [i for i, n in counts.items() if n > 1][:5]
    if bound_ms is None:
        bound_ms = settings.zk_session_timeout_ms + 10_000
    beyond = []
    for record in records:
        delay_id = dict(record.headers())[wire.ID].decode()
        appended = record.timestamp()[1]
        waited_from = outage[1] if due[delay_id] <= outage[1] and appended >= outage[0] else due[delay_id]
        if appended - waited_from > bound_ms:
            beyond.append((delay_id, due[delay_id], appended - waited_from))
    assert not beyond, f"{len(beyond)} delivered more than {bound_ms} ms beyond the outage: {beyond[:3]}; " \
                       f"outage {outage}"
    nodes = list(cluster.nodes.values())
    crashed = [n for n in nodes if n.running.poll() is not None]
    assert not crashed, "\n".join(f"{n.node_id}:\n{n.log_tail(60)}" for n in crashed)
    assert wait_until(lambda: sorted(cluster.masterships()) == [0, 1, 2]
                      and all(len(m) == 1 for m in cluster.masterships().values()), timeout_s=30), \
        cluster.masterships()
    for node in nodes:
        log = node.log_tail(3000)
        assert "Traceback" not in log, f"{node.node_id}:\n{log[-4000:]}"


def test_a_frozen_broker_costs_the_freeze_and_seconds(stack, names, tmp_path):
    # The soak's kafka_pause: after SIGCONT librdkafka held the records of a commit for partitions whose
    # leader it had "not found in cache" (for 17 s here, asking for metadata or not), and the master waited
    # for them, then 5 s more to abort and flush; now it hands over to a new producer after 6 s.
    settings, target, cluster = sharded_cluster(stack, names, tmp_path)
    try:
        due, outage = under_traffic(settings, target, lambda: frozen_for(kafka_pid(stack), FREEZE_S))
        assert_delivered_once_in_time(settings, target, cluster, due, outage, bound_ms=10_000)
    finally:
        cluster.close()


def test_a_sharded_cluster_with_replicas_loses_no_time_beyond_a_broker_outage_and_no_node(stack, names, tmp_path):
    settings, target, cluster = sharded_cluster(stack, names, tmp_path)
    try:
        lost = cluster.nodes["node-c"]

        def fault() -> tuple[int, int]:
            # A node lost while Kafka is down: the others take its shards (open their stores, read the
            # buffer's end offsets) while Kafka does not answer; it comes back once Kafka has.
            outage = freeze_then_kill(stack, while_down=lost.kill)
            cluster.start(lost.node_id, wait=False)
            return outage

        due, outage = under_traffic(settings, target, fault)
        assert_delivered_once_in_time(settings, target, cluster, due, outage)
    finally:
        cluster.close()


def fenced_within(shard: ShardTransactions, term: Term, timeout_s: float) -> None:
    """init_transactions, asked again while the broker's answer is one that passes (a new transaction coordinator
    loading), as the delivery loop asks."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            shard.fence(timeout_s, term)
            return
        except KafkaException as err:
            if not err.args[0].retriable() or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_a_term_that_ends_on_a_commit_the_frozen_broker_left_unconfirmed_writes_nothing_once_it_thaws(
        stack, names, monkeypatch):
    # CI's soak, a broker SIGKILLed while a master committed: the master ended its term on the stuck commit and
    # let its producer go, but a reference cycle (the exception's frames) kept it alive, and 12 s later, the
    # broker back, it went on with that commit (AddPartitionsToTxn); the next master's init_transactions aborted
    # it, and the abort markers ended as aborted the records of the transaction before it on those partitions,
    # which the coordinator had committed but whose markers the restarted broker had dropped: 1 duplicated,
    # 1 missing. A term's producer must be gone when its term ends.
    monkeypatch.setattr(transactions, "COMMIT_GIVE_UP_S", 1.0)
    monkeypatch.setattr(transactions, "COMMIT_CALL_S", 0.5)
    settings = settings_on(stack, names, buffer_partitions=2)
    create_topics(settings.bootstrap_servers, [settings.buffer_topic], partitions=2)
    log = logging.LoggerAdapter(logging.getLogger("test"), {})
    shard = ShardTransactions(settings, 0, InFlight(), log)
    term = Term(1)
    shard.begin_term()
    shard.take_producer()
    fenced_within(shard, term, timeout_s=30.0)
    shard.begin()
    shard.to_buffer("committed-before", 0, b"v", None)
    shard.commit(term, ["committed-before"])
    pid = kafka_pid(stack)
    freeze(pid)
    try:
        shard.begin()
        shard.to_buffer("left-unconfirmed", 1, b"v", None)
        # As the delivery loop commits: on the committer thread, the loop waiting on the future meanwhile.
        with pytest.raises(TransactionStuck):
            shard.commit(term, ["left-unconfirmed"], during=lambda commit: commit.exception())
        shard.end_term(stuck=True)
    finally:
        thaw(pid)
    records = read_topic(settings.bootstrap_servers, settings.buffer_topic, isolation="read_uncommitted",
                         timeout_s=10, idle_s=8)
    written = sorted((r.partition(), r.key().decode()) for r in records if not r.error())
    assert written == [(0, "committed-before")], \
        f"the broker holds what the ended term's producer wrote after it thawed: {written}"


def test_a_frozen_zookeeper_costs_the_freeze_and_seconds_and_no_node(stack, names, tmp_path):
    settings, target, cluster = sharded_cluster(stack, names, tmp_path)
    try:
        # Longer than the session: every node's session expires when ZooKeeper wakes.
        due, outage = under_traffic(settings, target, lambda: frozen_for(zookeeper_pid(stack), 10.0))
        assert_delivered_once_in_time(settings, target, cluster, due, outage)
    finally:
        cluster.close()


def test_a_reader_given_other_shards_reads_on_after_the_broker_froze(stack, names, tmp_path):
    """A node that took or dropped a shard keeps its reader process; each freeze of the broker after that must
    cost ingest the freeze, not the minutes until the next shard moves.

    The soak's kafka_pause after a shard moved: a consumer assigned a second time kept its positions still once
    the broker thawed, while records came (librdkafka issue 5430; in a 30-minute soak a node's ingest stood ten
    minutes; a script doing what this test does caught it in 4 runs of 9, this test in none of 4: it depends on
    when the freeze lands). Judged by the producers' acks: every put acked is in its shard's store.
    """
    from confluent_kafka import Producer

    from delayq.delay_service.ingest import Ingest
    from delayq.delay_service.metrics import NodeMetrics
    from delayq.delay_service.topics import EndOffsets, admin_client, buffer_info
    from delayq.store import TimeIndex

    settings = settings_on(stack, names, buffer_partitions=6)
    ensure_topics(settings)
    admin = admin_client(settings)
    info = buffer_info(settings, admin)
    shards = 3
    acked: dict[int, set[str]] = defaultdict(set)
    stop_writing = threading.Event()

    def write() -> None:
        # Plain puts and puts in transactions (a master's writes are): a freeze leaves some open.
        plain, in_transactions = Feeder(settings), Feeder(settings)
        in_transactions.producer = Producer(settings.kafka_conf(**{"linger.ms": 5,
                                                                   "transactional.id": f"{names.cluster}-writer"}))
        in_transactions.producer.init_transactions(60)
        while not stop_writing.is_set():
            ids = [plain.put("somewhere", b"v", now_ms() + 3_600_000) for _ in range(20)]
            try:
                in_transactions.producer.begin_transaction()
                in_ids = [in_transactions.put("somewhere", b"v", now_ms() + 3_600_000) for _ in range(20)]
                in_transactions.producer.commit_transaction(60)
                ids += in_ids
            except KafkaException:
                in_transactions.producer.abort_transaction(60)
            plain.flush()
            for delay_id in ids:
                acked[wire.shard_of(wire.buffer_partition(delay_id, settings.buffer_partitions), shards)].add(delay_id)
            time.sleep(0.05)

    stores = {k: TimeIndex(tmp_path / f"shard-{k}") for k in range(shards)}
    metrics = NodeMetrics()
    ingest = Ingest(settings, shards, metrics, EndOffsets(settings, info.partitions, admin))
    stop_ingest = threading.Event()
    writer = threading.Thread(target=write, daemon=True)
    loop = threading.Thread(target=ingest.run, args=(stop_ingest,), daemon=True)

    def hold(held: list[int]) -> None:
        ingest.hold([ingest.feed(k, stores[k], metrics.shard(k)) for k in held])

    def all_acked_stored(held: list[int], within_s: float, what: str) -> None:
        acked_now = {k: set(acked[k]) for k in held}
        if wait_until(lambda: all(stores[k].pending_count() >= len(acked_now[k]) for k in held), within_s, 0.2):
            return
        behind = {k: len(acked_now[k]) - stores[k].pending_count() for k in held}
        raise AssertionError(f"{what}: puts acked {within_s:.0f} s before and not stored yet, by shard: {behind}")

    try:
        hold([0, 1, 2])
        reader = ingest.reader_pid
        writer.start()
        loop.start()
        all_acked_stored([0, 1, 2], 20, "three shards read")
        for held, what in (([0, 1], "shard 2 dropped"), ([0, 1, 2], "shard 2 taken again")):
            hold(held)
            time.sleep(6)
            frozen_for(kafka_pid(stack), FREEZE_S)
            time.sleep(5)  # the writers' transactions, open across the freeze, end
            all_acked_stored(held, 20, f"{what}, then the broker frozen {FREEZE_S:.0f} s")
        assert ingest.reader_pid == reader, "a shard taken or dropped replaced the reader process"
    finally:
        stop_writing.set()
        writer.join(90)
        stop_ingest.set()
        loop.join(30)
        ingest.close()
        for store in stores.values():
            store.close()


def test_a_lone_broker_frozen_past_kafkas_default_session_is_not_fenced_and_its_commits_stay_whole(stack, names):
    """The soak's kafka_pause on one broker: its controller woke up and fenced its own broker (Kafka's 9 s
    session), each partition was leaderless for a moment, and the transaction coordinator dropped the commit
    markers of those partitions: committed records stayed invisible to read_committed readers for good (seed
    4242: 19 duplicated, 9 missing). The stack's one broker now outwaits any such pause. Judged by the broker's
    own log and by what a read_committed reader sees. Who wins after SIGCONT, the controller's fencing check or
    the broker's heartbeat, is a race (with Kafka's 9 s the soak's broker was fenced, this test's was not in a
    run here), so the broker's own account of the session it grants comes first."""
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
    [described] = admin.describe_configs([ConfigResource(ResourceType.BROKER, "1")]).values()
    session_ms = int(described.result(30)["broker.session.timeout.ms"].value)
    assert session_ms > (LONE_FREEZE_S + 2.0) * 1000, \
        f"the broker fences itself after {session_ms} ms without a heartbeat: a long GC pause outlasts that"
    topic = names.topic("txn")
    create_topics(stack.bootstrap_servers, [topic], partitions=3)
    [log] = [service.log for service in stack.status() if service.name == "kafka"]
    assert log.is_file(), f"the broker's log is not at {log}"
    producer = Producer({"bootstrap.servers": stack.bootstrap_servers, "transactional.id": names.topic("tx"),
                         "transaction.timeout.ms": 60_000})
    producer.init_transactions(30)
    producer.begin_transaction()
    for n in range(30):
        producer.produce(topic, key=str(n).encode(), value=b"v", partition=n % 3)
    producer.flush(10)
    logged_before = log.stat().st_size
    pid = kafka_pid(stack)
    freezer = threading.Thread(target=frozen_for, args=(pid, LONE_FREEZE_S))
    freezer.start()
    try:
        time.sleep(0.5)
        producer.commit_transaction(60)  # its markers are written as the broker thaws
    finally:
        freezer.join()
    time.sleep(4)  # the controller looks for brokers to fence every 1.1 s

    with log.open(errors="replace") as lines:
        lines.seek(logged_before)
        since = lines.read().splitlines()
    assert [line for line in since if "Fencing broker" in line] == [], \
        "the lone broker's own controller fenced it after the freeze"
    assert [line for line in since if DROPPED_MARKERS in line] == []
    seen = read_topic(stack.bootstrap_servers, topic, expect=30, timeout_s=15, idle_s=2)
    assert sorted(int(r.key()) for r in seen) == list(range(30)), \
        f"a read_committed reader sees {len(seen)} of the 30 committed records"
