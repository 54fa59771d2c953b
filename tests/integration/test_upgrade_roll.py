"""A rolling upgrade from the previous release under load (issue 30 item 4): three nodes of 0.1.0, replaced one at a
time by this code on the same data folders, then `delayq upgrade finalize` (every store migrated in place to the
new level's store format), then messages of the new level; last, a node of 0.1.0 on a finalized node's data
refuses to run instead of rebuilding its stores.

The release's nodes run from an environment built from its recorded commit (delayq.release_env). The judges
are evidence delayq did not produce: the producer's delivery reports (when a cancel was acknowledged), the
broker's timestamps of the delivered records (the target topic stamps LogAppendTime), and the due times
this test chose.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import pytest
from support.kafka_testing import create_topics, read_topic
from support.process_testing import run_delayq, wait_until

import delayq
from delayq import Settings, wire
from delayq.clock import now_ms
from delayq.delay_service import cluster_status
from delayq.proxy.feature_gate import LevelNotFinalized
from delayq.release_env import ReleaseEnv
from delayq.testing import LocalCluster, NodeProcess, init_cluster

pytestmark = pytest.mark.integration

SHARDS = 3
PARTITIONS = 6
NODES = ("node-a", "node-b", "node-c")
# A graceful handover (SIGTERM: the master resigns, a caught-up replica takes over) must cost less than a
# crash would: the session timeout is 15 s, and test_failover holds a SIGTERM handover to 5 s under it.
SESSION_TIMEOUT_MS = 15_000
HANDOVER_BOUND_S = 5.0
# Each shard gets a message due every TICK_MS throughout, so the gaps between its delivered records show
# how long it had no master (to within one tick).
TICK_MS = 100


@dataclass
class Expected:
    """What the producers wrote and what must come of it."""

    due: dict[tuple[str, int], int] = field(default_factory=dict)  # (id, occurrence) -> due ms
    cancel_acked: dict[str, int] = field(default_factory=dict)  # id -> when the cancel was acknowledged
    cancelled_due: dict[str, int] = field(default_factory=dict)  # id -> the due time the cancel came before
    acked_ms: dict[str, int] = field(default_factory=dict)  # id -> when its (last) put was acknowledged
    lock: threading.Lock = field(default_factory=threading.Lock)


def shard_of(delay_id: str) -> int:
    return wire.shard_of(wire.buffer_partition(delay_id, PARTITIONS), SHARDS)


class Traffic:
    """Delayed messages, cancels, reschedules and repeating messages from a current delayq.Producer, until stopped."""

    def __init__(self, producer: delayq.Producer, target: str, expected: Expected):
        self.producer, self.target, self.expected = producer, target, expected
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.round = 0

    def _acked(self, delay_id: str, into: dict[str, int]):
        def report(err, _msg) -> None:
            if err is None:
                with self.expected.lock:
                    into[delay_id] = now_ms()
        return report

    def _put(self, due_ms: int, shard: int | None = None, **options) -> str:
        delay_id = wire.new_delay_id()
        while shard is not None and shard_of(delay_id) != shard:
            delay_id = wire.new_delay_id()
        self.producer.produce(self.target, f"m{self.round}".encode(), b"k", deliver_at=due_ms, delay_id=delay_id,
                              on_delivery=self._acked(delay_id, self.expected.acked_ms), **options)
        return delay_id

    def _round(self) -> None:
        start = now_ms()
        # The ticks: one message per shard due every TICK_MS of the next second, two seconds ahead.
        for tick_due in range(start + 2000, start + 3000, TICK_MS):
            for shard in range(SHARDS):
                self.expected.due[self._put(tick_due, shard), 1] = tick_due
        plain = self._put(start + 3000)
        self.expected.due[plain, 1] = start + 3000
        doomed_due = start + 6000
        doomed = self._put(doomed_due)
        self.producer.cancel(doomed, on_delivery=self._acked(doomed, self.expected.cancel_acked))
        self.expected.cancelled_due[doomed] = doomed_due
        moved = self._put(start + 2500)
        self.producer.reschedule(moved, self.target, b"moved", b"k", deliver_at=start + 5000,
                                 on_delivery=self._acked(moved, self.expected.acked_ms))
        self.expected.due[moved, 1] = start + 5000
        series = self._put(start + 2000, repeat=delayq.Every(1, times=3))
        for occurrence in (1, 2, 3):
            self.expected.due[series, occurrence] = start + 2000 + (occurrence - 1) * 1000

    def _run(self) -> None:
        while not self.stop.is_set():
            self.round += 1
            self._round()
            self.producer.poll(0)
            self.stop.wait(1.0)

    def __enter__(self) -> Traffic:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(30)
        assert self.producer.flush(120) == 0, "writes still unconfirmed two minutes after the traffic stopped"


def masters_of_every_shard(cluster: LocalCluster, settings: Settings) -> bool:
    """Every shard has one master and its full set of holders (as `delayq status` says)."""
    owners = cluster.masterships()
    if sorted(owners) != list(range(SHARDS)) or any(len(nodes) != 1 for nodes in owners.values()):
        return False
    return all(len(s["replicas"]) == settings.replicas for s in cluster_status(settings)["shards"])


def replace(cluster: LocalCluster, settings: Settings, node: NodeProcess, python: str) -> NodeProcess:
    """SIGTERM ``node``, wait for its shards' handover, start ``python``'s delayq on its data folder, ready."""
    started = cluster.replace(node.node_id, python)
    assert wait_until(lambda: masters_of_every_shard(cluster, settings), timeout_s=60, interval_s=0.5), (
        f"shards not settled after {node.node_id} came back: {cluster.masterships()}")
    return started


def start_old_cluster(cluster: LocalCluster, settings: Settings, env: ReleaseEnv) -> None:
    """The cluster as 0.1.0 makes it: its `delayq init` (layout, no feature level), then its nodes."""
    init_cluster(settings, cluster.root, python=str(env.python))
    for node_id in NODES:
        cluster.start(node_id, python=str(env.python), wait=False)
    for node in cluster.nodes.values():
        node.wait_ready(120)
    assert wait_until(lambda: masters_of_every_shard(cluster, settings), timeout_s=60, interval_s=0.5), (
        f"the {env.release.version} cluster did not settle: {cluster.masterships()}")
    assert registered_versions(settings) == dict.fromkeys(NODES), (
        f"the nodes are not of {env.release.version}: {registered_versions(settings)}")


def registered_versions(settings: Settings) -> dict[str, str | None]:
    """Each registered node's version as its registration says (0.1.0 writes none: None)."""
    return {node["node_id"]: node.get("version") for node in cluster_status(settings)["nodes"]}


def longest_gaps(records, since_ms: int, until_ms: int) -> dict[int, float]:
    """Per shard, the longest time (s) between consecutive deliveries (broker time) within the roll."""
    times: dict[int, list[int]] = {}
    for record in records:
        at = record.timestamp()[1]
        if since_ms <= at <= until_ms:
            times.setdefault(shard_of(dict(record.headers())[wire.ID].decode()), []).append(at)
    return {shard: max((b - a for a, b in zip(sorted(ts), sorted(ts)[1:], strict=False)), default=0) / 1000
            for shard, ts in sorted(times.items())}


@pytest.mark.settings(shards=SHARDS, replicas=2, buffer_partitions=PARTITIONS, zk_session_timeout_ms=SESSION_TIMEOUT_MS)
def test_a_rolling_upgrade_from_the_previous_release_under_load_loses_replays_and_dead_letters_nothing(
        release_env, settings, names, tmp_path):
    target = names.topic("target")
    # The broker stamps the delivered records: "never early" is judged by its clock, not the master's.
    create_topics(settings.bootstrap_servers, [target], partitions=3,
                  config={"message.timestamp.type": "LogAppendTime"})
    cluster = LocalCluster(settings, tmp_path)
    expected = Expected()
    producer = delayq.Producer({"bootstrap.servers": settings.bootstrap_servers, "delayq.cluster": settings.cluster,
                                "delayq.zk.connect": settings.zk_connect})
    try:
        start_old_cluster(cluster, settings, release_env)
        assert_level_2_refused(producer, target)  # a new producer against a cluster all of 0.1.0
        with Traffic(producer, target, expected):
            time.sleep(5)
            roll_began = now_ms()
            for number, node_id in enumerate(NODES, start=1):
                replace(cluster, settings, cluster.nodes[node_id], python=sys.executable)
                if number == len(NODES) - 1:
                    assert_half_upgraded_cluster_refuses_level_2(settings, producer, target)
            roll_ended = now_ms()
            assert registered_versions(settings) == dict.fromkeys(NODES, delayq.__version__)
            assert store_formats(cluster) == {4}, "before the finalize a node keeps 0.1.0's store format (a way back)"
            assert upgrade_status_store_formats(settings) == dict.fromkeys(NODES, 4)
            finalized = run_delayq("upgrade", "finalize", settings=settings)
            assert finalized.returncode == 0, f"finalize refused once every node is new:\n{finalized.stderr}"
            assert wait_until(lambda: level_2_allowed(producer), timeout_s=10), "the producer did not see the finalize"
            assert wait_until(lambda: store_formats(cluster) == {5}, timeout_s=20), (
                f"stores not migrated to format 5 after the finalize: {store_formats(cluster)}")
            migrated = sum(n.metric("delayq_store_migrations_total") for n in cluster.nodes.values())
            assert wait_until(lambda: upgrade_status_store_formats(settings) == dict.fromkeys(NODES, 5),
                              timeout_s=10), f"`delayq upgrade status` says {upgrade_status_store_formats(settings)}"
            stale = producer.produce(target, b"stale", b"k", deliver_at=now_ms() - 10_000, expire_after=5)
            fresh_due = now_ms() + 1000
            fresh = producer.produce(target, b"fresh", b"k", deliver_at=fresh_due, expire_after=60)
            expected.due[fresh, 1] = fresh_due
            time.sleep(5)
        last_due = max(expected.due.values())
        wait_until(lambda: now_ms() > last_due + 2000, timeout_s=30)

        records = read_topic(settings.bootstrap_servers, target, expect=len(expected.due), timeout_s=120, idle_s=5)
        letters = read_topic(settings.bootstrap_servers, settings.dead_letter_topic, expect=1, timeout_s=20,
                             idle_s=3)
        assert_acked_cancels_are_in_the_buffer(settings, expected)
        judge(cluster, settings, expected, records, letters, stale, roll_began, roll_ended, migrated)
        assert_previous_release_refuses_a_finalized_nodes_data(cluster, settings, release_env)
    finally:
        producer.close()
        cluster.close()


def level_2_allowed(producer: delayq.Producer) -> bool:
    try:
        producer.level_gate.require_level(2, "expires=")
    except LevelNotFinalized:
        return False
    return True


def assert_half_upgraded_cluster_refuses_level_2(settings: Settings, producer: delayq.Producer, target: str) -> None:
    """Two nodes new, one of 0.1.0: finalize refused (exit 2, naming the old node), expire_after refused in one line."""
    refused = run_delayq("upgrade", "finalize", settings=settings)
    assert refused.returncode == 2 and "node-c" in refused.stderr, refused.stderr
    assert refused.stderr.count("\n") == 1, refused.stderr
    assert_level_2_refused(producer, target)


def assert_level_2_refused(producer: delayq.Producer, target: str) -> None:
    """A request of level 2 is refused before anything is sent, in one line that says how to get the level."""
    with pytest.raises(LevelNotFinalized) as raised:
        producer.produce(target, b"too soon", b"k", delay=5, expire_after=60)
    assert "\n" not in str(raised.value) and "delayq upgrade finalize" in str(raised.value), str(raised.value)


def upgrade_status_store_formats(settings: Settings) -> dict[str, int | None]:
    """Each registered node's oldest store format, as `delayq upgrade status --json` shows it to an operator."""
    shown = run_delayq("upgrade", "status", "--json", settings=settings)
    assert shown.returncode == 0, shown.stderr
    return {node["node_id"]: node["store_format"] for node in json.loads(shown.stdout)["nodes"]}


def store_formats(cluster: LocalCluster) -> set[float]:
    """The store formats of every shard store the nodes hold (their delayq_store_format{shard} series)."""
    formats: set[float] = set()
    for node in cluster.nodes.values():
        _, body = node.get("/metrics")
        formats.update(float(line.rsplit(" ", 1)[1]) for line in body.decode().splitlines()
                       if line.startswith("delayq_store_format{"))
    return formats


def assert_previous_release_refuses_a_finalized_nodes_data(cluster: LocalCluster, settings: Settings,
                                                           env: ReleaseEnv) -> None:
    """After the finalize a node of 0.1.0 (which predates the level check) started on a node's data stops in one
    line instead of rebuilding its stores (their format-5 families are unknown to it); this code starts there
    again without a rebuild."""
    node_id = NODES[0]
    stopped = cluster.nodes[node_id].stop()
    assert stopped == 0, f"{node_id} did not stop cleanly ({stopped})"
    old = cluster.start(node_id, python=str(env.python), wait=False)
    try:
        code = old.running.wait(120)
    except subprocess.TimeoutExpired:
        pytest.fail(f"delayq {env.release.version} started on {node_id}'s finalized data:\n{old.log_tail()}")
    said = old.own_log()
    refusals = [line for line in said.splitlines() if "not a delayq store" in line]
    print(f"\ndelayq {env.release.version} on {node_id}'s data after the finalize: exit {code}, {refusals[:1]}")
    assert code != 0 and len(refusals) == 1 and "Traceback" not in said and old.stores_rebuilt() == 0, said[-3000:]
    again = cluster.start(node_id, python=sys.executable, wait=False)
    again.wait_ready(120)
    assert again.stores_rebuilt() == 0 and store_formats(cluster) == {5}, again.log_tail()


def assert_acked_cancels_are_in_the_buffer(settings: Settings, expected: Expected) -> None:
    """The buffer read back holds a cancel tombstone for every cancel the producer's delivery report acknowledged."""
    buffered = {r.key().decode() for r in read_topic(settings.bootstrap_servers, settings.buffer_topic, idle_s=3)
                if r.value() is None and dict(r.headers() or []).get(wire.OP) == wire.OP_CANCEL}
    absent = expected.cancel_acked.keys() - buffered
    assert not absent, f"acknowledged cancels the buffer does not hold: {sorted(absent)[:5]}"


def shards_taken(cluster: LocalCluster) -> int:
    """How many shard stores the nodes took on by placement (a replica built from the buffer while a node was away)."""
    return sum(len(taken[1].split(", ")) for node in cluster.nodes.values()
               for taken in re.finditer(r"holding shards \[.*\] \(took \[([\d, ]+)\]", node.log_tail(10**6)))


def judge(cluster: LocalCluster, settings: Settings, expected: Expected, records, letters, stale: str, roll_began: int,
          roll_ended: int, migrated: float) -> None:
    delivered = Counter((dict(r.headers())[wire.ID].decode(), int(dict(r.headers()).get(wire.OCCURRENCE, b"1")))
                        for r in records)
    duplicates = {key: n for key, n in delivered.items() if n > 1}
    missing = expected.due.keys() - delivered.keys()
    unexpected = delivered.keys() - expected.due.keys()
    early = [r for r in records
             if (key := (dict(r.headers())[wire.ID].decode(), int(dict(r.headers()).get(wire.OCCURRENCE, b"1"))))
             in expected.due and r.timestamp()[1] < expected.due[key]]
    ignored_cancels = [i for i, acked in expected.cancel_acked.items()
                       if acked < expected.cancelled_due[i] and any(k[0] == i for k in delivered)]
    in_flight = sum(1 for (i, _), due in expected.due.items()
                    if due > roll_began and expected.acked_ms.get(i, roll_ended + 1) <= roll_ended)
    gaps = longest_gaps(records, roll_began, roll_ended)
    rebuilds = {n.node_id: n.metric("delayq_store_rebuilds_total") for n in cluster.nodes.values()}
    rebuilt_logs = [n.node_id for n in cluster.nodes.values() if "will be rebuilt from the buffer" in n.log_tail(10**6)]
    reasons = [dict(r.headers()).get(wire.DEAD_LETTER_REASON, b"").decode() for r in letters]
    print(f"\nrolling upgrade: {len(expected.due)} expected deliveries, {in_flight} in flight during the roll "
          f"({(roll_ended - roll_began) / 1000:.1f} s); longest gap per shard (s) {gaps}, bound {HANDOVER_BOUND_S}; "
          f"stores migrated in place at the finalize {migrated:.0f} vs rebuilt {sum(rebuilds.values()):.0f} {rebuilds}, "
          f"replica stores built by placement while a node was away {shards_taken(cluster)}; dead letters "
          f"{len(letters)} {reasons}; duplicates/missing/early {len(duplicates)}/"
          f"{len(missing)}/{len(early)}; cancels acked before due {len(expected.cancel_acked)}, ignored "
          f"{len(ignored_cancels)}; unexpected {len(unexpected)}")
    assert not duplicates and not missing and not unexpected and not early and not ignored_cancels, (
        f"duplicates {list(duplicates)[:5]}, missing {sorted(missing)[:5]}, unexpected {list(unexpected)[:5]}, "
        f"early {len(early)}, cancels ignored {ignored_cancels[:5]}")
    assert [(r.key(), wire.Reason.of(reason)) for r, reason in zip(letters, reasons, strict=True)] == [
        (stale.encode(), wire.Reason.EXPIRED)], f"dead letters other than the expected expired one: {reasons}"
    assert sum(rebuilds.values()) == 0 and not rebuilt_logs, f"stores rebuilt from the buffer: {rebuilds} {rebuilt_logs}"
    assert migrated == SHARDS * settings.replicas, f"{migrated:.0f} stores migrated, not every one held"
    assert sorted(gaps) == list(range(SHARDS)) and max(gaps.values()) < HANDOVER_BOUND_S, (
        f"a shard without a master longer than a graceful handover: {gaps}")
