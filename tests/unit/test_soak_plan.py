"""The soak's fault plan, its pauses, its reading of nodes: pure functions of the seed, the files and the probes."""

from __future__ import annotations

import signal
import threading
import time
from datetime import datetime
from types import SimpleNamespace

import pytest

from delayq.bench.soak_faults import (
    FAULT_KINDS,
    Chaos,
    PlannedFault,
    Probe,
    held_shards,
    log_excerpt,
    log_warnings,
    plan_faults,
    shard_problems,
    standbys,
)
from delayq.testing import mastered_shards


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


def test_a_nodes_masterships_are_read_from_its_per_shard_metric():
    metrics = ("# TYPE delayq_is_master gauge\n"
               'delayq_is_master{shard="0"} 1.0\n'
               'delayq_is_master{shard="1"} 0.0\n'
               'delayq_is_master{shard="10"} 1.0\n'
               'delayq_is_master_other{shard="2"} 1.0\n')
    assert mastered_shards(metrics) == (0, 10)
    assert mastered_shards("delayq_shards_held 2.0\n") == ()


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

    chaos._inject(PlannedFault(kind, 0, 0.3, 0))

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
        chaos._inject(PlannedFault("kafka_pause", 0, 8, 0))

    assert stack.signals == [("kafka", signal.SIGSTOP), ("kafka", signal.SIGCONT)]


def test_release_continues_a_service_mid_pause_once_and_no_pause_starts_after_it():
    stack = FakeStack()
    chaos = chaos_on(stack)
    pausing = threading.Thread(target=chaos._inject, args=(PlannedFault("zookeeper_pause", 0, 30, 0),))
    pausing.start()
    deadline = time.monotonic() + 5
    while not stack.signals and time.monotonic() < deadline:
        time.sleep(0.01)

    chaos.release()  # the soak's teardown: Ctrl-C or an error while ZooKeeper is stopped
    assert stack.signals == [("zookeeper", signal.SIGSTOP), ("zookeeper", signal.SIGCONT)]
    chaos.stop.set()
    pausing.join(5)

    assert not pausing.is_alive()
    assert stack.signals == [("zookeeper", signal.SIGSTOP), ("zookeeper", signal.SIGCONT)]
    assert "cut short" in chaos.windows[0].detail
    chaos.stop.clear()
    chaos._inject(PlannedFault("kafka_pause", 0, 1, 0))
    assert len(stack.signals) == 2
    assert chaos.skipped[0].startswith("kafka_pause: the soak is stopping")


def test_a_service_that_is_not_running_is_not_paused_and_the_fault_is_skipped():
    stack = FakeStack(down=("kafka",))
    chaos = chaos_on(stack)

    chaos._inject(PlannedFault("kafka_pause", 0, 1, 0))

    assert stack.signals == [] and chaos.windows == []
    assert chaos.skipped[0].startswith("kafka_pause: kafka was not running")
