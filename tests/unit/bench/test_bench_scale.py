"""The scale suite's bookkeeping without a broker: configurations, settling, planning, retries, figures, its table."""

from __future__ import annotations

import os
from contextlib import ExitStack

import pytest
from rich.progress import Progress

from delayq.bench import scale_bench as scale
from delayq.bench.report import BEGIN, END, render_markdown, scale_rows, write_markdown
from delayq.bench.runner import QUICK, BenchOptions, Context, Sizes, merge_results, suite_scale
from delayq.bench.scale_bench import (
    LeadPlanner,
    ScaleConfig,
    StoredLate,
    configurations,
    first_valid,
    shard_windows,
    shards_with_handovers,
    unsettled,
)
from delayq.bench.service_bench import BenchRunInvalid, fresh_settings
from delayq.dev import DevStack

ENV = {"machine": {"cores": 2, "memory_gib": 8.0, "cpu": "Test CPU", "os": "Test OS", "kernel": "6.1",
                   "load_average_at_start": 0.5},
       "versions": {"Python": "3.11.7", "delayq": "0.1.0"}}
BALANCED_3 = {0: ["a"], 1: ["a"], 2: ["b"], 3: ["b"], 4: ["c"], 5: ["c"]}


def test_six_configurations_r0_then_r1_on_one_two_three_nodes():
    configs = configurations()
    assert [(c.nodes, c.replicas) for c in configs] == [(1, 0), (2, 0), (3, 0), (1, 1), (2, 1), (3, 1)]
    assert [c.copies for c in configs] == [1, 2, 3, 1, 1, 1]
    assert [c.held_per_node() for c in configs] == [6, 6, 6, 6, 3, 2]
    assert configs[2].key == "n3.r0" and configs[2].label == "3 nodes, R=0" and configs[3].label == "1 node, R=1"
    assert BenchOptions(only=["scale", "ingest"]).suites() == ["ingest", "scale"]
    assert QUICK.scale_delivery < Sizes().scale_delivery and QUICK.scale_ingest < Sizes().scale_ingest


def test_settled_means_one_master_a_shard_balanced_and_the_final_holders():
    r0, r1 = ScaleConfig(3, 0), ScaleConfig(3, 1)
    assert unsettled(r0, BALANCED_3, {"a": 6, "b": 6, "c": 6}) is None
    assert unsettled(r1, BALANCED_3, {"a": 2, "b": 2, "c": 2}) is None
    assert "shards [5] have no master" in unsettled(r0, {k: v for k, v in BALANCED_3.items() if k != 5},
                                                    {"a": 6, "b": 6, "c": 6})
    assert "more than one master" in unsettled(r0, {**BALANCED_3, 5: ["c", "a"]}, {"a": 6, "b": 6, "c": 6})
    assert "not balanced (at most 2 each)" in unsettled(r0, {**BALANCED_3, 2: ["a"]}, {"a": 6, "b": 6, "c": 6})
    # A node still holding shards it hands over, or one not holding its share yet: not final.
    assert "holders not final" in unsettled(r1, BALANCED_3, {"a": 4, "b": 2, "c": 2})
    assert "holders not final" in unsettled(r0, BALANCED_3, {"a": 6, "b": 6, "c": 0})
    # R = 1 on two nodes: the first node holding all six while the second has none yet adds up to 6, but is not it.
    two = ScaleConfig(2, 1)
    owners = {k: ["a"] if k < 3 else ["b"] for k in range(6)}
    assert "holders not final" in unsettled(two, owners, {"a": 6, "b": 0})
    assert unsettled(two, owners, {"a": 3, "b": 3}) is None


def test_a_shard_under_two_epochs_is_a_handover_and_windows_are_per_shard():
    records = [(1010, 0, 3), (1500, 0, 3), (1020, 1, 1), (1900, 1, 2), (1005, 2, 7)]
    assert shards_with_handovers(records) == {1: [1, 2]}
    assert shards_with_handovers([r for r in records if r[1] != 1]) == {}
    assert shard_windows(records, due_ms=1000) == {0: [10, 500], 1: [20, 900], 2: [5, 5]}


def test_lead_plans_from_the_configurations_earlier_runs_per_message():
    planner = LeadPlanner(assumed_rate=10_000, factor=1.5, margin_s=2.0)
    config = ScaleConfig(3, 0)
    assert planner.lead_s(config, 100_000) == pytest.approx(2.0 + 30.0)  # 300,000 store writes at 10,000/s
    planner.saw_ingest(config, 400_000, 8.0)  # 20 us a message, fill and ingest one after the other
    assert planner.lead_s(config, 100_000) == pytest.approx(2.0 + 1.5 * 2.0)
    planner.saw_stored(config, 100_000, 1.0)  # a delivery run's own fill-to-stored time wins
    assert planner.lead_s(config, 100_000) == pytest.approx(2.0 + 1.5 * 1.0)
    planner.saw_stored(config, 100_000, 0.5)  # the slowest seen stays
    planner.saw_stored(config, 100_000, 4.0)
    assert planner.lead_s(config, 100_000) == pytest.approx(2.0 + 1.5 * 4.0)
    assert planner.lead_s(ScaleConfig(1, 1), 100_000) == pytest.approx(2.0 + 10.0)  # other configurations: apart


def test_an_invalid_run_is_measured_again_and_its_reason_kept():
    outcomes = iter([BenchRunInvalid("not settled"), StoredLate("stored late", 9.0), 42.0])

    def measure() -> float:
        outcome = next(outcomes)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    invalid: list[str] = []
    said: list[str] = []
    assert first_valid(measure, invalid, tries=3, say=said.append) == 42.0
    assert invalid == ["not settled", "stored late"] and said[0] == "run invalid (1/3): not settled"

    with pytest.raises(BenchRunInvalid, match="again"):
        first_valid(lambda: (_ for _ in ()).throw(BenchRunInvalid("again")), [], tries=2, say=said.append)
    with pytest.raises(TimeoutError):  # anything else is not a run to measure again
        first_valid(lambda: (_ for _ in ()).throw(TimeoutError("stuck")), invalid, tries=3, say=said.append)


def test_cpu_figures_come_from_proc():
    assert scale.cpu_seconds([os.getpid()]) > 0
    assert scale.cpu_seconds([2**22 + 1]) == 0  # no such pid
    busy, every = scale.machine_ticks()
    assert 0 < busy <= every


def test_fresh_settings_take_the_scale_buffer_and_shards():
    stack = DevStack(kafka_port=19092, zk_port=12181)
    settings = fresh_settings(stack, shards=6, buffer_partitions=12, replicas=1)
    assert (settings.shards, settings.buffer_partitions, settings.replicas) == (6, 12, 1)
    assert fresh_settings(stack).buffer_partitions == 6


# -- the suite, with the measurements faked -----------------------------------------------------------------------


def fake_suite(monkeypatch, runs: int = 2) -> tuple[list, list[str]]:
    calls: list[str] = []
    late = {ScaleConfig(2, 1)}  # its first delivery run stores too late, once

    def ingest(stack, config, count, progress):
        calls.append(f"ingest {config.key} {count}")
        return {"msg_s": 100_000.0 / config.copies, "store_writes_s": 100_000.0, "elapsed_s": 1.0, "fill_s": 1.0,
                "ready_s": 0.5, "settled_s": 1.0, "cpu_cores": {"node-0": 1.0, "machine": 2.0}}

    def delivery(stack, config, count, lead_s, progress):
        calls.append(f"delivery {config.key} {count} lead {lead_s:.2f}")
        if config in late:
            late.discard(config)
            raise StoredLate("stored late", 30.0)
        return {"msg_s": 50_000.0 * config.nodes if config.replicas else 50_000.0, "ready_s": 0.5,
                "settled_s": 1.0, "lead_s": lead_s, "stored_s": 1.0, "stored_ahead_ms": 1000, "span_ms": 2000,
                "shard_windows_ms": {0: [5, 2000]}, "cpu_cores": {"node-0": 1.0, "machine": 2.0}}

    monkeypatch.setattr(scale, "bench_scale_ingest", ingest)
    monkeypatch.setattr(scale, "bench_scale_delivery", delivery)
    ctx = Context(DevStack(kafka_port=19092, zk_port=12181), BenchOptions(runs=runs, peer=False, quick=True),
                  Progress(), ExitStack())
    return suite_scale(ctx), calls


def test_the_suite_measures_every_configuration_each_run_and_makes_twelve_figures(monkeypatch):
    figures, calls = fake_suite(monkeypatch)
    first_run = [c.split(" lead")[0] for c in calls[:13]]
    assert first_run[:4] == ["ingest n1.r0 20000", "delivery n1.r0 10000", "ingest n2.r0 20000",
                             "delivery n2.r0 10000"]
    # Runs alternate whole rounds of the configurations; 2 runs of 6 of each, plus the one retried.
    assert len(calls) == 2 * 12 + 1 and calls[13].startswith("ingest n1.r0")
    # The first delivery lead comes from the ingest run (2 s for 20,000: 100 us a message, 1.5x for 10,000,
    # plus 2 s), the retry's and the next run's from the late run's 30 s for 10,000.
    leads = [c for c in calls if c.startswith("delivery n2.r1")]
    assert [lead.split("lead ")[1] for lead in leads] == ["3.50", "47.00", "47.00"]
    by_key = {f.key: f for f in figures}
    assert list(by_key) == [f"scale.{m}.n{n}.r{r}" for r in (0, 1) for n in (1, 2, 3) for m in ("delivery", "ingest")]
    late = by_key["scale.delivery.n2.r1"]
    assert late.stats["median"] == 100_000 and late.details["invalid_runs"] == ["stored late"]
    assert late.details["nodes"] == 2 and late.details["replicas"] == 1 and late.details["count"] == 10_000
    assert by_key["scale.ingest.n3.r0"].stats["median"] == pytest.approx(100_000 / 3)
    assert by_key["scale.ingest.n3.r0"].details["count"] == 20_000 and late.peer is None


# -- the table in BENCHMARKS.md ----------------------------------------------------------------------------------


def results_with_scale(monkeypatch, peer: list[float] | None = None) -> dict:
    figures, _ = fake_suite(monkeypatch, runs=1)
    for figure in figures:
        figure.suite = "scale"
        if peer is not None and figure.key.startswith("scale.delivery"):
            figure.peer = peer
    return merge_results({}, figures, ENV, BenchOptions(), "2026-01-01T10:00:00")


def test_scale_rows_give_each_configuration_its_ratio_to_one_node_and_the_peer(monkeypatch):
    rows = scale_rows(results_with_scale(monkeypatch, peer=[100_000.0, 120_000.0, 110_000.0])["figures"])
    assert [(r["nodes"], r["replicas"]) for r in rows] == [("1", "0"), ("2", "0"), ("3", "0"), ("1", "1"),
                                                            ("2", "1"), ("3", "1")]
    three = rows[5]
    assert (three["delivery"], three["delivery_x1"], three["ingest"], three["ingest_x1"]) == (
        "150,000", "3.00", "100,000", "1.00")
    assert rows[2]["ingest"] == "33,333" and rows[2]["ingest_x1"] == "0.33"
    assert three["peer"] == "110,000 (100,000–120,000)" and three["peer_ratio"] == "1.36"


def test_scale_table_goes_after_the_main_one_between_the_markers(monkeypatch, tmp_path):
    results = results_with_scale(monkeypatch)
    path = tmp_path / "BENCHMARKS.md"
    path.write_text(f"# intro\n\n{BEGIN}\nstale\n{END}\n\n## reproduce\n")
    write_markdown(path, results)
    text = path.read_text()
    block = text.split(BEGIN, 1)[1].split(END, 1)[0]
    assert block.index("| figure | delayq |") < block.index("| nodes | R | delivery msg/s |")
    assert "| 3 | 1 | 150,000 | 150,000–150,000 | 3.00 | 100,000 | 100,000–100,000 | 1.00 | 1 |  |  |" in block
    assert "10,000 messages due at one instant" in block and "20,000 messages written while" in block
    assert text.endswith("## reproduce\n")
    # No scale figures, no scale table.
    others = {k: v for k, v in results["figures"].items() if not k.startswith("scale.")}
    assert "| nodes | R |" not in render_markdown({**results, "figures": others})
