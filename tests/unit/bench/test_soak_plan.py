"""The soak's fault plan, its pauses, its reading of nodes: pure functions of the seed, the files and the probes."""

from __future__ import annotations

import signal
import sys
import threading
import time
from datetime import datetime
from types import SimpleNamespace

import pytest

from delayq.bench.soak_brokers import ClusterState, LeaderMoveError, PartitionState
from delayq.bench.soak_faults import (
    FAULT_KINDS,
    Chaos,
    OutageWatch,
    PlannedFault,
    Probe,
    Replacement,
    UpgradeRoll,
    fault_kinds,
    held_shards,
    kafka_dropped_markers,
    log_excerpt,
    log_warnings,
    plan_faults,
    shard_problems,
    standbys,
    store_figures,
)
from delayq.testing import master_members, mastered_shards


def test_the_first_round_of_every_plan_holds_each_fault_kind_once():
    for seed in range(50):
        plan = plan_faults(seed, duration_s=120, session_timeout_s=5)

        assert sorted(f.kind for f in plan[:len(FAULT_KINDS)]) == sorted(FAULT_KINDS)


def test_the_same_seed_gives_the_same_plan_and_another_seed_another():
    assert plan_faults(7, 1800, 5) == plan_faults(7, 1800, 5)
    assert plan_faults(7, 1800, 5) != plan_faults(8, 1800, 5)


def test_a_pause_outlasts_the_session_timeout_and_outages_are_short_in_a_short_run():
    plan = plan_faults(3, duration_s=120, session_timeout_s=5)

    assert all(f.hold_s >= 7.5 for f in plan if f.kind == "master_pause")
    assert all(2 <= f.hold_s <= 5 for f in plan if f.kind in ("kafka_kill", "zookeeper_kill"))
    assert all(f.hold_s == 0 for f in plan if f.kind in ("master_kill", "standby_term", "standby_wipe"))
    assert all(2.5 <= f.gap_s <= 5 for f in plan)


def test_every_round_of_a_plan_pauses_the_broker_and_zookeeper_once_each():
    for seed in range(20):
        for duration in (120, 1800):
            plan = plan_faults(seed, duration_s=duration, session_timeout_s=5)
            rounds = [plan[i:i + len(FAULT_KINDS)] for i in range(0, len(plan), len(FAULT_KINDS))]

            for faults in rounds:
                kinds = [f.kind for f in faults]
                assert (kinds.count("kafka_pause"), kinds.count("zookeeper_pause")) == (1, 1)


def test_pauses_are_a_long_gc_pause_for_the_broker_and_past_the_session_for_zookeeper():
    short, long = plan_faults(5, 120, 5), plan_faults(5, 1800, 5)

    def holds(plan: list[PlannedFault], kind: str) -> list[float]:
        return [f.hold_s for f in plan if f.kind == kind]

    assert all(3 <= h <= 8 for h in holds(short, "kafka_pause"))
    assert all(6 <= h <= 10 for h in holds(long, "kafka_pause"))
    assert all(5 <= h <= 8 for h in holds(short, "zookeeper_pause"))
    assert all(8 <= h <= 12 for h in holds(long, "zookeeper_pause"))
    assert PlannedFault("kafka_pause", 3, 8, 0).estimate_s(5) > 8


def test_a_long_run_plans_more_rounds_with_longer_gaps():
    short, long = plan_faults(1, 120, 5), plan_faults(1, 1800, 5)

    assert len(long) > len(short)
    assert max(f.gap_s for f in long) > 30


def test_a_log_excerpt_keeps_warnings_and_election_lines_inside_the_window(tmp_path):
    log = tmp_path / "node-a.log"
    log.write_text(
        "2026-11-23 11:10:49,000 WARNING delayq.ingest [ingest] before the window\n"
        "2026-11-23 11:10:50,779 INFO delayq.election [election] node-a is master, epoch 3\n"
        "2026-11-23 11:10:51,000 INFO delayq.delivery [election] routine\n"
        "%3|1795432272.711|FAIL|rdkafka#producer-2| connection refused\n"
        "2026-11-23 11:11:14,726 WARNING delayq.delivery [election] epoch 3: Kafka error, retrying\n"
        "2026-11-23 11:12:00,000 ERROR delayq.node [main] after the window\n")
    start = round(datetime(2026, 11, 23, 11, 10, 50).timestamp() * 1000)
    end = round(datetime(2026, 11, 23, 11, 11, 30).timestamp() * 1000)

    lines = log_excerpt(log, start, end)

    assert [line[24:40] for line in lines] == ["INFO delayq.elec", "WARNING delayq.d"]
    assert log_excerpt(tmp_path / "missing.log", start, end) == []


def test_log_warnings_are_grouped_by_their_text_without_numbers_most_frequent_first(tmp_path):
    log = tmp_path / "node-b.log"
    log.write_text(
        "2026-11-23 11:36:17,756 WARNING kazoo.client [zk_loop] Connection dropped: socket connection broken\n"
        "2026-11-23 11:36:39,511 WARNING delayq.ingest [ingest] cannot read the buffer's end offsets\n"
        "2026-11-23 11:36:58,106 WARNING delayq.ingest [ingest] record buffer/2/13572 is malformed: dead-lettered\n"
        "2026-11-23 11:36:58,107 WARNING delayq.ingest [ingest] record buffer/1/13166 is malformed: dead-lettered\n"
        "2026-11-23 11:36:59,000 INFO delayq.delivery [election] routine\n")

    groups = log_warnings(log)

    assert [g["count"] for g in groups] == [2, 1]
    assert "buffer/2/13572" in groups[0]["first"] and "buffer/1/13166" in groups[0]["last"]


def test_the_markers_a_broker_dropped_are_read_from_every_brokers_own_log(tmp_path):
    dropped = ("[2026-11-28 15:28:35,531] INFO [Transaction Marker Channel Manager 1]: Couldn't find leader endpoint "
               "for partitions HashSet(buffer-5) while trying to send transaction markers for master-2, these "
               "partitions are likely deleted already and hence can be skipped")
    (tmp_path / "kafka").mkdir()
    (tmp_path / "kafka" / "kafka.log").write_text(f"[2026-11-28 15:28:28,592] INFO Sending txn markers\n{dropped}\n")
    (tmp_path / "kafka-2").mkdir()
    (tmp_path / "kafka-2" / "kafka-2.log").write_text(dropped.replace("15:28:35", "15:29:01") + "\n")
    (tmp_path / "zookeeper").mkdir()
    (tmp_path / "zookeeper" / "zookeeper.log").write_text(dropped + "\n")

    lines = kafka_dropped_markers(tmp_path)

    assert [line[12:20] for line in lines] == ["15:28:35", "15:29:01"]


def test_a_nodes_masterships_are_read_from_its_per_shard_metric():
    metrics = ("# TYPE delayq_is_master gauge\n"
               'delayq_is_master{shard="0"} 1.0\n'
               'delayq_is_master{shard="1"} 0.0\n'
               'delayq_is_master{shard="10"} 1.0\n'
               'delayq_is_master_other{shard="2"} 1.0\n')
    assert mastered_shards(metrics) == (0, 10)
    assert mastered_shards("delayq_shards_held 2.0\n") == ()


def test_a_node_of_member_processes_says_which_member_masters_each_shard():
    # The node answers /metrics for its members (members.GroupView): each series carries its member.
    metrics = ('delayq_is_master{member="box-0",shard="0"} 1.0\n'
               'delayq_is_master{member="box-1",shard="2"} 0.0\n'
               'delayq_is_master{shard="4",member="box-1"} 1.0\n'
               'delayq_pending{member="box-1",shard="2"} 4.0\n')

    assert mastered_shards(metrics) == (0, 4)
    assert held_shards(metrics) == (0, 2, 4)
    assert master_members(metrics) == {0: "box-0", 4: "box-1"}
    assert master_members('delayq_is_master{shard="3"} 1.0\n') == {3: ""}, "a node of one process: no member"


def test_a_nodes_held_shards_are_those_with_a_mastership_series_at_0_or_1():
    metrics = ('delayq_is_master{shard="0"} 1.0\n'
               'delayq_is_master{shard="2"} 0.0\n'
               'delayq_pending{shard="1"} 4.0\n')

    assert held_shards(metrics) == (0, 2)


# -- who is a standby, and when the shards are healthy ---------------------------------


def test_with_three_shards_on_three_nodes_every_node_is_the_standby_of_a_shard_it_does_not_master():
    probes = {"a": Probe(True, (0,), held=(0, 1)), "b": Probe(True, (1,), held=(1, 2)),
              "c": Probe(True, (2,), held=(0, 2))}

    assert standbys(probes) == ["a", "b", "c"]
    assert probes["c"].standby_of == (0,)


def test_a_node_mastering_nothing_is_the_standby_and_a_node_holding_nothing_never_is():
    probes = {"a": Probe(True, (0,), held=(0, 1)), "b": Probe(True, (1,), held=(0, 1)),
              "c": Probe(True, (), held=(0, 1)), "d": Probe(True, (), held=())}

    assert standbys(probes) == ["c"]
    assert standbys({"a": Probe(True, (0,), held=(0,)), "d": Probe(True, (), held=())}) == []


def test_the_shards_are_healthy_with_one_master_each_and_their_replicas_held():
    probes = {"a": Probe(True, (0,), held=(0, 1)), "b": Probe(True, (1,), held=(1, 2)),
              "c": Probe(True, (2,), held=(0, 2))}

    assert shard_problems(probes, shards=3, replicas=2) == []
    assert shard_problems(probes, shards=3, replicas=0) == [
        "shard 0 held by 2 node(s) (a, c), not 3", "shard 1 held by 2 node(s) (a, b), not 3",
        "shard 2 held by 2 node(s) (b, c), not 3"]


def test_a_shard_with_two_masters_none_or_too_few_holders_is_a_problem():
    probes = {"a": Probe(True, (0, 1), held=(0, 1)), "b": Probe(True, (1,), held=(1,))}

    assert shard_problems(probes, shards=3, replicas=2) == [
        "shard 0 held by 1 node(s) (a), not 2", "2 masters of shard 1 (a, b)", "0 masters of shard 2 (none)",
        "shard 2 held by 0 node(s) (none), not 2"]


# -- every pause is continued ----------------------------------------------------------


class FakeStack:
    """The soak stack's signals, recorded: the services are running unless named otherwise."""

    def __init__(self, down: tuple[str, ...] = ()):
        self.signals: list[tuple[str, int]] = []
        self.down = down

    def kill(self, name: str, sig: int = signal.SIGKILL, timeout_s: float = 30.0) -> bool:
        if name in self.down:
            return False
        self.signals.append((name, sig))
        return True


def chaos_on(stack: FakeStack) -> Chaos:
    cluster = SimpleNamespace(nodes={}, settings=SimpleNamespace(shards=0, replicas=0))
    return Chaos([], stack, cluster, session_timeout_s=5, heal_limit_s=0, warmup_s=0,  # type: ignore[arg-type]
                 deadline=0, say=lambda _text: None)


@pytest.mark.parametrize("kind, service", [("kafka_pause", "kafka"), ("zookeeper_pause", "zookeeper")])
def test_a_pause_stops_the_service_for_its_hold_then_continues_it_and_counts_as_an_outage(kind, service):
    stack = FakeStack()
    chaos = chaos_on(stack)

    chaos.inject(PlannedFault(kind, 0, 0.3, 0))

    assert stack.signals == [(service, signal.SIGSTOP), (service, signal.SIGCONT)]
    window, = chaos.windows
    assert window.kind == kind and window.outage_ms is not None
    assert 250 <= window.outage_ms[1] - window.outage_ms[0] < 2_000
    assert f"SIGSTOP to {service} for 0.3s, then SIGCONT" in window.detail
    assert chaos.done[kind] == 1


def test_a_pause_interrupted_by_an_exception_still_continues_the_service():
    stack = FakeStack()
    chaos = chaos_on(stack)

    def interrupted(_seconds: float) -> None:
        raise KeyboardInterrupt

    chaos._idle = interrupted  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        chaos.inject(PlannedFault("kafka_pause", 0, 8, 0))

    assert stack.signals == [("kafka", signal.SIGSTOP), ("kafka", signal.SIGCONT)]


def pause_begun(chaos, stack, fault: PlannedFault) -> threading.Thread:
    """``fault`` (a pause) injected on a thread of its own, returned once its first signal was sent (or after 5 s)."""
    pausing = threading.Thread(target=chaos.inject, args=(fault,))
    pausing.start()
    deadline = time.monotonic() + 5
    while not stack.signals and time.monotonic() < deadline:
        time.sleep(0.01)
    return pausing


def test_release_continues_a_service_mid_pause_once_and_no_pause_starts_after_it():
    stack = FakeStack()
    chaos = chaos_on(stack)
    pausing = pause_begun(chaos, stack, PlannedFault("zookeeper_pause", 0, 30, 0))

    chaos.release()  # the soak's teardown: Ctrl-C or an error while ZooKeeper is stopped
    assert stack.signals == [("zookeeper", signal.SIGSTOP), ("zookeeper", signal.SIGCONT)]
    chaos.stop.set()
    pausing.join(5)

    assert not pausing.is_alive()
    assert stack.signals == [("zookeeper", signal.SIGSTOP), ("zookeeper", signal.SIGCONT)]
    assert "cut short" in chaos.windows[0].detail
    chaos.stop.clear()
    chaos.inject(PlannedFault("kafka_pause", 0, 1, 0))
    assert len(stack.signals) == 2
    assert chaos.skipped[0].startswith("kafka_pause: the soak is stopping")


def test_a_service_that_is_not_running_is_not_paused_and_the_fault_is_skipped():
    stack = FakeStack(down=("kafka",))
    chaos = chaos_on(stack)

    chaos.inject(PlannedFault("kafka_pause", 0, 1, 0))

    assert stack.signals == [] and chaos.windows == []
    assert chaos.skipped[0].startswith("kafka_pause: kafka was not running")


# -- a replicated cluster's kinds (--brokers N) ------------------------------------------------

BROKER_KINDS = ("broker_kill", "broker_pause", "rolling_restart", "leader_move", "two_brokers_down")


def test_three_brokers_replace_the_one_brokers_kinds_with_the_replicated_clusters():
    assert fault_kinds(1) == FAULT_KINDS
    assert not set(BROKER_KINDS) & set(FAULT_KINDS)
    assert set(fault_kinds(3)) == set(FAULT_KINDS) - {"kafka_kill", "kafka_pause"} | set(BROKER_KINDS)
    assert "two_brokers_down" not in fault_kinds(2) and "broker_kill" in fault_kinds(2)


def test_the_first_round_of_a_three_broker_plan_holds_each_of_its_kinds_once():
    for seed in range(50):
        for duration in (240, 1800):
            plan = plan_faults(seed, duration_s=duration, session_timeout_s=5, brokers=3)

            assert sorted(f.kind for f in plan[:len(fault_kinds(3))]) == sorted(fault_kinds(3))
            assert {f.kind for f in plan} == set(fault_kinds(3))


def test_one_broker_plans_none_of_the_replicated_clusters_kinds():
    for seed in range(50):
        for duration in (60, 240, 1800):
            assert not {f.kind for f in plan_faults(seed, duration, 5)} & set(BROKER_KINDS)
            assert not {f.kind for f in plan_faults(seed, duration, 5, brokers=1)} & set(BROKER_KINDS)


def test_a_three_broker_plan_is_the_seeds_and_another_seed_gives_another():
    assert plan_faults(7, 240, 5, brokers=3) == plan_faults(7, 240, 5, brokers=3)
    assert plan_faults(7, 240, 5, brokers=3) != plan_faults(8, 240, 5, brokers=3)
    assert plan_faults(7, 240, 5, brokers=3) != plan_faults(7, 240, 5)


def test_broker_holds_are_in_their_ranges():
    for seed in range(20):
        short, long = plan_faults(seed, 240, 5, brokers=3), plan_faults(seed, 1800, 5, brokers=3)

        def holds(plan: list[PlannedFault], kind: str) -> list[float]:
            return [f.hold_s for f in plan if f.kind == kind]

        for plan in (short, long):
            assert all(10 <= h <= 14 for h in holds(plan, "broker_pause"))  # past the 9 s broker session
            assert holds(plan, "rolling_restart") and set(holds(plan, "rolling_restart")) == {0}
            assert set(holds(plan, "leader_move")) == {0}
        for kind in ("broker_kill", "two_brokers_down"):
            assert all(3 <= h <= 8 for h in holds(short, kind))
            assert all(5 <= h <= 15 for h in holds(long, kind))
        # Eleven kinds share the gaps: a 33rd of a 4-minute run at most.
        assert all(240 / 66 - 0.1 <= f.gap_s <= 240 / 33 + 0.1 for f in short)


def test_every_kind_has_an_estimate_beyond_its_hold_and_a_rolling_restart_grows_with_the_brokers():
    for kind in fault_kinds(1) + fault_kinds(3):
        assert PlannedFault(kind, 1, 2, 0).estimate_s(5, 3) > 2
    assert PlannedFault("rolling_restart", 1, 0, 0).estimate_s(5, 5) > PlannedFault(
        "rolling_restart", 1, 0, 0).estimate_s(5, 3)


BUFFER = "delayq-soak-buffer"


class FakeCluster(FakeStack):
    """Three brokers whose metadata follows the signals, as a real cluster's does.

    A killed or stopped broker stays leader and in sync until the controllers fence it,
    ``fence_s`` later (a real broker session is 9 s); then it leads nothing and is in no ISR.
    Every partition is replicated on all three (preferred leader: the first of its replicas).
    """

    broker_names = ("kafka-1", "kafka-2", "kafka-3")

    def __init__(self, fence_s: float = 0.3) -> None:
        super().__init__()
        self.fence_s = fence_s
        self.gone: dict[int, float] = {}  # broker -> when it was killed or stopped (monotonic)

    def kafka_node(self, name: str) -> SimpleNamespace:
        return SimpleNamespace(node_id=int(name[-1]), address=f"127.0.0.1:{9000 + int(name[-1])}")

    def kill(self, name: str, sig: int = signal.SIGKILL, timeout_s: float = 30.0) -> bool:
        if sig == 0:  # is it running
            return int(name[-1]) not in self.gone
        super().kill(name, sig, timeout_s)
        if sig != signal.SIGCONT:
            self.gone.setdefault(int(name[-1]), time.monotonic())
        else:
            self.gone.pop(int(name[-1]), None)
        return True

    def start(self, name: str, *, say=print) -> bool:
        self.signals.append((name, "start"))
        self.gone.pop(int(name[-1]), None)
        return True

    def state(self, down: frozenset[int] = frozenset(), timeout_s: float = 3.0) -> ClusterState:
        fenced = {b for b, since in self.gone.items() if time.monotonic() - since >= self.fence_s}
        alive = [b for b in (1, 2, 3) if b not in fenced]
        partitions = []
        for topic, count in ((BUFFER, 6), ("target", 3), ("__transaction_state", 4)):
            for p in range(count):
                replicas = tuple((p + i) % 3 + 1 for i in range(3))
                leader = next((b for b in replicas if b in alive), -1)
                partitions.append(PartitionState(topic, p, leader, replicas, tuple(b for b in replicas if b in alive)))
        return ClusterState(frozenset(alive), tuple(partitions))


def broker_chaos(stack: FakeCluster, mover=None) -> Chaos:
    settings = SimpleNamespace(shards=0, replicas=0, buffer_topic=BUFFER,
                               transactional_id=lambda k: "delayq-soak-master" + (f"-{k}" if k else ""))
    cluster = SimpleNamespace(nodes={}, settings=settings)
    chaos = Chaos([], stack, cluster, session_timeout_s=5, heal_limit_s=0, warmup_s=0,  # type: ignore[arg-type]
                  deadline=0, say=lambda _text: None, brokers=3, target_topics=["target"], leader_mover=mover)
    chaos._min_insync = {BUFFER: 2, "target": 2, "__transaction_state": 2}
    chaos._read_cluster = stack.state  # type: ignore[method-assign]
    return chaos


def test_a_broker_kill_kills_the_chosen_broker_restarts_it_and_counts_the_outage():
    stack = FakeCluster()
    chaos = broker_chaos(stack)

    chaos.inject(PlannedFault("broker_kill", 0, 0.6, 0.1))  # the busiest buffer leader: broker 1 (a tie, lowest)

    assert stack.signals == [("kafka-1", signal.SIGKILL), ("kafka-1", "start")]
    window, = chaos.windows
    assert window.kind == "broker_kill" and "broker 1, leader of 2 of the buffer's 6 partitions" in window.detail
    assert window.outage_ms is not None and window.outage_s >= 0.3  # out from the kill until it was fenced
    assert chaos.done["broker_kill"] == 1


def test_two_brokers_down_kills_two_then_restarts_one_and_the_other_and_is_out_meanwhile():
    stack = FakeCluster()
    chaos = broker_chaos(stack)

    chaos.inject(PlannedFault("two_brokers_down", 0, 0.5, 0.9))

    kills = [name for name, sig in stack.signals if sig == signal.SIGKILL]
    assert len(set(kills)) == 2
    assert stack.signals[2:] == [(kills[0], "start"), (kills[1], "start")]
    window, = chaos.windows
    assert window.outage_s >= 0.5 and "the cluster served again" in window.detail


def test_a_broker_pause_stops_the_broker_past_its_session_then_continues_it_and_release_continues_it_too():
    stack = FakeCluster()
    chaos = broker_chaos(stack)
    pausing = pause_begun(chaos, stack, PlannedFault("broker_pause", 0, 30, 0.9))

    chaos.release()  # Ctrl-C or an error while the broker is stopped
    assert stack.signals == [("kafka-3", signal.SIGSTOP), ("kafka-3", signal.SIGCONT)]
    chaos.stop.set()
    pausing.join(5)

    assert not pausing.is_alive()
    assert stack.signals == [("kafka-3", signal.SIGSTOP), ("kafka-3", signal.SIGCONT)]


def test_a_rolling_restart_stops_and_starts_every_broker_in_turn_without_an_outage():
    stack = FakeCluster()
    chaos = broker_chaos(stack)

    chaos.inject(PlannedFault("rolling_restart", 0, 0, 0))

    assert stack.signals == [(f"kafka-{i}", sig) for i in (1, 2, 3) for sig in (signal.SIGTERM, "start")]
    window, = chaos.windows
    assert window.outages == [] and "every partition served throughout" in window.detail
    assert window.detail.count("full ISR") == 3


def test_a_leader_move_is_the_movers_and_a_failed_one_is_skipped():
    class Mover:
        def __init__(self, error: bool):
            self.error = error
            self.calls: list[list[str]] = []

        def move(self, bootstrap: list[str], topics: list[str]) -> str:
            self.calls.append(topics)
            if self.error:
                raise LeaderMoveError("the reassignment failed (exit 1)")
            return "9 of 9 leaders moved"

    moved, failed = Mover(False), Mover(True)
    chaos = broker_chaos(FakeCluster(), moved)  # type: ignore[arg-type]
    chaos.inject(PlannedFault("leader_move", 0, 0, 0))
    assert moved.calls == [[BUFFER, "target"]] and chaos.done["leader_move"] == 1

    chaos = broker_chaos(FakeCluster(), failed)  # type: ignore[arg-type]
    chaos.inject(PlannedFault("leader_move", 0, 0, 0))
    assert chaos.done["leader_move"] == 0 and "the reassignment failed" in chaos.skipped[0]


def test_health_on_a_replicated_cluster_wants_every_broker_registered_and_in_sync():
    stack = FakeCluster()
    chaos = broker_chaos(stack)

    assert chaos.health() == (True, "")
    stack.gone[2] = 0.0  # long fenced
    healthy, problems = chaos.health()
    assert not healthy and problems.startswith("kafka-2 not running; broker 2 not registered; under-replicated: ")


def test_an_outage_watch_is_out_from_a_kill_until_a_read_finds_every_partition_serving():
    stack = FakeCluster(fence_s=0.1)
    watch = OutageWatch(stack.state, {BUFFER: 2, "target": 2, "__transaction_state": 2}, every_s=0.05)
    watch.start()
    time.sleep(0.2)
    assert not watch.out

    watch.set_down({1, 2}, out=True)
    stack.gone.update({1: time.monotonic(), 2: time.monotonic()})  # two of three down: min ISR 2 not met
    time.sleep(0.4)
    assert watch.out and "fewer in-sync replicas" in watch.problems
    stack.start("kafka-1")
    watch.set_down({2})
    assert watch.wait_serving(5, threading.Event())

    outages = watch.finish()
    assert len(outages) == 1 and 150 <= outages[0][1] - outages[0][0] < 2_000


def test_a_down_broker_fenced_and_registered_again_is_back_before_its_restart_call_returns():
    stack = FakeCluster(fence_s=0.1)
    watch = OutageWatch(stack.state, {BUFFER: 2, "target": 2, "__transaction_state": 2}, every_s=0.05)
    watch.start()
    watch.set_down({1}, out=True)
    stack.gone[1] = time.monotonic()
    time.sleep(0.4)
    assert 1 in watch.unregistered_ms and not watch.out  # fenced: out of every ISR, the others lead

    stack.gone.pop(1)  # restarted and registered again: in sync everywhere, while the fault still has it down
    time.sleep(0.3)
    assert not watch.out
    assert len(watch.finish()) == 1


def test_the_soaks_ports_lie_outside_the_kernels_ephemeral_range(monkeypatch):
    # A killed broker restarts on its port: one in that range may meanwhile be some client's local port.
    from delayq import testing
    from delayq.bench import soak

    monkeypatch.setattr(testing, "ephemeral_ports", lambda: (32768, 60999))
    for brokers, span in ((1, 2), (3, 6)):
        for _ in range(20):
            kafka, zk = soak.free_ports(brokers)

            assert all(not 32768 <= port <= 60999 for port in (*range(kafka, kafka + span), zk))
            assert not kafka <= zk < kafka + span


def test_a_local_nodes_http_port_lies_outside_the_kernels_ephemeral_range_too(monkeypatch, tmp_path):
    # A node killed and started again on its port (a shard test's "return") found it taken by a client's connection.
    from delayq import testing
    from delayq.settings import Settings

    monkeypatch.setattr(testing, "ephemeral_ports", lambda: (32768, 60999))
    for _ in range(50):
        node = testing.NodeProcess(Settings(), "node-a", tmp_path)

        assert not 32768 <= node.http_port <= 60999
        assert 10_000 <= node.http_port < 65_536


# -- the rolling upgrade (--upgrade-from) ---------------------------------------------------


def test_a_plan_with_an_upgrade_rolls_once_as_its_first_or_second_fault_and_one_without_never():
    for seed in range(50):
        for duration in (180, 1800):
            for brokers in (1, 3):
                rolled = plan_faults(seed, duration, 5, brokers, upgrade=True)
                plain = plan_faults(seed, duration, 5, brokers)

                kinds = [f.kind for f in rolled]
                assert kinds.count("upgrade_roll") == 1 and kinds.index("upgrade_roll") in (0, 1)
                assert "upgrade_roll" not in {f.kind for f in plain}
                # The other faults are those of the same run without the roll.
                assert [f for f in rolled if f.kind != "upgrade_roll"] == plain


def test_the_first_round_of_an_upgrade_plan_holds_every_kind_of_the_run_once():
    kinds = fault_kinds(1, upgrade=True)
    assert kinds == (*FAULT_KINDS, "upgrade_roll") and "upgrade_roll" not in fault_kinds(3)
    for seed in range(50):
        plan = plan_faults(seed, 180, 5, upgrade=True)

        assert sorted(f.kind for f in plan[:len(kinds)]) == sorted(kinds)
    assert plan_faults(7, 180, 5, upgrade=True) == plan_faults(7, 180, 5, upgrade=True)
    assert PlannedFault("upgrade_roll", 1, 0, 0).estimate_s(5) > 30


class RollingCluster:
    """Three nodes of a release that LocalCluster.replace swaps for new ones, as the real one does."""

    def __init__(self, refuse: str | None = None):
        self.settings = SimpleNamespace(shards=3, replicas=2)
        self.root = "/nowhere"
        self.refuse = refuse  # a node whose stop is not clean
        self.nodes = {node_id: self.node(node_id, "old-python", pid) for pid, node_id in
                      enumerate(("node-a", "node-b", "node-c"), start=100)}
        self.replaced: list[str] = []

    @staticmethod
    def node(node_id: str, python: str, pid: int) -> SimpleNamespace:
        return SimpleNamespace(node_id=node_id, python=python, running=SimpleNamespace(pid=pid),
                               stores_rebuilt=lambda: 0, url="http://127.0.0.1:9")  # /metrics: no answer

    def replace(self, node_id: str, python: str, *, stop, ready_within_s: float):
        if node_id == self.refuse:
            from delayq.testing import NodeError
            raise NodeError(f"node {node_id} exited with -9 when stopped, not 0 (a clean stop):\nlog")
        self.replaced.append(node_id)
        self.nodes[node_id] = self.node(node_id, python, 200 + len(self.replaced))
        return self.nodes[node_id]


def rolling_chaos(cluster: RollingCluster, finalize_exit: int = 0) -> tuple[Chaos, UpgradeRoll, list[str]]:
    roll = UpgradeRoll("0.1.0", "new-python")
    chaos = Chaos([], FakeStack(), cluster, session_timeout_s=5, heal_limit_s=1, warmup_s=0,  # type: ignore[arg-type]
                  deadline=0, say=lambda _text: None, roll=roll)
    chaos._wait_healthy = lambda _limit: (True, "")  # type: ignore[method-assign]
    chaos._idle = lambda _seconds: None  # type: ignore[method-assign]
    restarted: list[str] = []
    chaos._restart = lambda node_id: restarted.append(node_id) or 0  # type: ignore[method-assign]

    def finalize(roll: UpgradeRoll) -> None:
        roll.finalize_exit, roll.finalize = finalize_exit, "raised from 1 to 2" if finalize_exit == 0 else "refused"
        if finalize_exit == 0:
            roll.finalized.set()

    chaos._finalize = finalize  # type: ignore[method-assign]
    return chaos, roll, restarted


def test_an_upgrade_roll_replaces_every_node_in_turn_then_finalizes():
    cluster = RollingCluster()
    chaos, roll, restarted = rolling_chaos(cluster)

    chaos.inject(PlannedFault("upgrade_roll", 0, 0, 0))

    assert cluster.replaced == ["node-a", "node-b", "node-c"] and restarted == []
    assert {node.python for node in cluster.nodes.values()} == {"new-python"}
    assert roll.finalized.is_set() and roll.problems() == []
    assert [r.as_dict()["old_pid"] for r in roll.replaced] == [100, 101, 102]
    window, = chaos.windows
    assert window.kind == "upgrade_roll" and "raised from 1 to 2" in window.detail
    assert "stores rebuilt 0, migrated in place 0" in window.detail
    assert chaos.done["upgrade_roll"] == 1
    chaos.inject(PlannedFault("upgrade_roll", 0, 0, 0))  # never twice
    assert chaos.done["upgrade_roll"] == 1 and "finalized already" in chaos.skipped[0]


def test_a_node_that_does_not_stop_cleanly_stops_the_roll_before_the_finalize_and_fails_the_run():
    cluster = RollingCluster(refuse="node-b")
    chaos, roll, restarted = rolling_chaos(cluster)

    chaos.inject(PlannedFault("upgrade_roll", 0, 0, 0))

    assert cluster.replaced == ["node-a"] and restarted == ["node-b"]  # node-b runs again, as the release
    assert cluster.nodes["node-c"].python == "old-python" and not roll.finalized.is_set()
    problem, = roll.problems()
    assert problem.startswith("the upgrade from 0.1.0 did not end finalized: node-b: node node-b exited with -9")


def test_a_refused_finalize_and_a_store_rebuilt_on_a_node_not_wiped_fail_the_run():
    chaos, roll, _ = rolling_chaos(RollingCluster(), finalize_exit=2)
    chaos.inject(PlannedFault("upgrade_roll", 0, 0, 0))
    assert roll.problems() == ["the upgrade from 0.1.0 did not end finalized: finalize exited 2: refused"]

    roll = UpgradeRoll("0.1.0", "new-python")
    roll.finalized.set()
    roll.replaced = [Replacement("node-a", 1, 2, stores_rebuilt=1), Replacement("node-b", 3, 4, rebuilds_metric=2.0),
                     Replacement("node-c", 5, 6, stores_rebuilt=3, wiped_before=True)]
    assert roll.problems() == ["stores rebuilt from the buffer in the upgrade roll: node-a 1, node-b 2"]
    assert (roll.as_dict()["stores_rebuilt"], roll.as_dict()["stores_rebuilt_unwiped"]) == (6, 3)


def test_a_nodes_store_figures_are_read_from_its_metrics(monkeypatch):
    from delayq.bench import soak_faults

    metrics = ('delayq_store_rebuilds_total{reason="stale",shard="0"} 1.0\n'
               'delayq_store_rebuilds_created{reason="stale",shard="0"} 1.7e9\n'
               'delayq_store_migrations_total{shard="0"} 1.0\ndelayq_store_migrations_total{shard="2"} 1.0\n'
               'delayq_store_format{shard="2"} 5.0\ndelayq_store_format{shard="0"} 5.0\n')

    class Answer:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def read(self):
            return metrics.encode()

    monkeypatch.setattr(soak_faults.urllib.request, "urlopen", lambda url, timeout: Answer())
    assert store_figures(SimpleNamespace(url="http://node")) == (1.0, 2.0, (5, 5))  # type: ignore[arg-type]
    monkeypatch.undo()
    assert store_figures(SimpleNamespace(url="http://127.0.0.1:9")) == (None, None, ())  # type: ignore[arg-type]


def test_soak_options_name_the_releases_there_are_and_want_three_minutes_for_a_roll():
    from delayq.bench.soak import SoakOptions

    assert SoakOptions(duration_s=180, upgrade_from="0.1.0").upgrade_from == "0.1.0"
    with pytest.raises(ValueError, match=r"^no release '0\.0\.9' in releases\.toml: give one of 0\.1\.0"):
        SoakOptions(duration_s=180, upgrade_from="0.0.9")
    with pytest.raises(ValueError, match="not cut yet"):
        SoakOptions(duration_s=180, upgrade_from="0.2.0")
    with pytest.raises(ValueError, match="too short to fit every fault kind with the upgrade roll: give 3m"):
        SoakOptions(duration_s=120, upgrade_from="0.1.0")
    assert SoakOptions(duration_s=120).upgrade_from is None


def test_the_soak_command_takes_upgrade_from_and_refuses_an_unknown_release_in_one_line(capsys):
    from delayq.cli import main

    assert main(["soak", "--duration", "3m", "--upgrade-from", "9.9.9"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no release '9.9.9'" in err and "0.1.0" in err


def test_a_restarted_node_keeps_its_interpreter_and_a_replaced_one_takes_the_new_one(monkeypatch, tmp_path):
    # A fault's restart (LocalCluster.start without python) runs the node's version of the time: the release's
    # before its replacement, this code's after it.
    from delayq import testing

    monkeypatch.setattr(testing.NodeProcess, "start", lambda node: node)
    monkeypatch.setattr(testing.NodeProcess, "wait_ready", lambda node, timeout_s=60.0: None)
    cluster = testing.LocalCluster(SimpleNamespace(), tmp_path, create_topics=False)  # type: ignore[arg-type]

    assert cluster.start("node-a", python="/release/bin/python").python == "/release/bin/python"
    assert cluster.start("node-a").python == "/release/bin/python"
    assert cluster.start("node-b").python == sys.executable
    for node in cluster.nodes.values():  # what start() opens, closed by replace()
        node.data_dir.mkdir(parents=True)
        node.log = open(node.data_dir.parent / f"{node.node_id}.log", "ab")  # noqa: SIM115
    old = cluster.nodes["node-a"]

    new = cluster.replace("node-a", "/this/bin/python", stop=lambda _node: 0)

    assert old.log.closed and new.python == "/this/bin/python" and cluster.start("node-a").python == "/this/bin/python"
    with pytest.raises(testing.NodeError, match="node-b exited with 1 when stopped, not 0"):
        cluster.replace("node-b", "/this/bin/python", stop=lambda _node: 1)
    assert cluster.nodes["node-b"].python == sys.executable
