"""The soak's fault plan and its reading of node logs: pure functions of the seed and the files."""

from __future__ import annotations

from datetime import datetime

from delayq.bench.soak_faults import FAULT_KINDS, log_excerpt, log_warnings, plan_faults
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
