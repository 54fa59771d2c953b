"""The members suite's bookkeeping without a broker: configurations, settling per member, CPU by role, figures."""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path

import pytest
from rich.progress import Progress

from delayq.bench import redis_peer
from delayq.bench import scale_bench as scale
from delayq.bench.proc import thread_cpu_seconds, threads_named
from delayq.bench.runner import BenchOptions, Context, per_message_us, suite_members
from delayq.bench.scale_bench import CpuWindow, ScaleConfig, member_configurations, process_roles, unsettled
from delayq.bench.service_bench import fresh_settings
from delayq.dev import DevStack
from delayq.testing import NodeProcess


def test_one_node_as_one_then_two_processes_on_two_shards():
    one, two = member_configurations()
    assert (one.nodes, one.replicas, one.processes, one.shards, one.partitions) == (1, 0, 1, 2, 4)
    assert two.processes == 2 and two.masters == 2 and one.masters == 1
    assert (one.key, two.key) == ("n1.r0", "n1.r0.p2")
    assert two.label == "1 node of 2 processes, R=0" and one.label == "1 node, R=0"
    assert two.held_per_node() == 2 and two.copies == 1
    # The scale suite's configurations are what they were.
    assert ScaleConfig(3, 1).key == "n3.r1" and ScaleConfig(3, 1).held_per_node() == 2


def test_settled_with_members_means_each_member_masters_one_shard():
    _, two = member_configurations()
    held = {"node-0": 2}  # the members' together
    assert unsettled(two, {0: ["node-0-1"], 1: ["node-0-0"]}, held) is None
    assert "not balanced (at most 1 each)" in unsettled(two, {0: ["node-0-0"], 1: ["node-0-0"]}, held)
    assert "more than one master" in unsettled(two, {0: ["node-0-0", "node-0-1"], 1: ["node-0-1"]}, held)
    assert "shards [1] have no master" in unsettled(two, {0: ["node-0-0"]}, held)
    assert "holders not final" in unsettled(two, {0: ["node-0-1"], 1: ["node-0-0"]}, {"node-0": 3})
    # One process masters both shards: settled as a plain node.
    one, _ = member_configurations()
    assert unsettled(one, {0: ["node-0"], 1: ["node-0"]}, held) is None


def test_member_views_listen_on_the_ports_after_the_node():
    node = NodeProcess(fresh_settings(DevStack(kafka_port=19092, zk_port=12181)), "node-0",
                       Path("/tmp/x/node-0/data"), http_port=20_000)
    views = scale.speakers(node, 2)
    assert [(v.node_id, v.http_port, v.process) for v in views] == [("node-0-0", 20_001, None),
                                                                     ("node-0-1", 20_002, None)]
    assert scale.speakers(node, 1) == [node]


def test_a_node_tree_is_split_by_role_and_its_cpu_counted_per_process():
    # A stand-in for a supervisor: this process, with one child that is no reader (a "member").
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        roles = process_roles(os.getpid())
        assert roles[os.getpid()] == "supervisor" and roles[child.pid] == "member"
        node = NodeProcess(fresh_settings(DevStack(kafka_port=19092, zk_port=12181)), "node-0",
                           Path("/tmp/x"), process=child)
        window = CpuWindow([node])
        sum(i * i for i in range(200_000))  # not the node's: nothing of it is counted
        child.kill()
        child.wait()
        seconds = window.seconds()
        assert set(seconds) == {"node"} and window.gone == [child.pid] and window.cores()["node-0"] >= 0
    finally:
        child.kill()
        child.wait()
    assert process_roles(child.pid) == {child.pid: "node"}  # gone: itself, nothing under it


def test_the_peer_counts_its_own_threads():
    assert thread_cpu_seconds([2**22 + 1]) == 0
    assert thread_cpu_seconds([os.getpid()]) > 0  # the main thread's native id is the pid
    assert os.getpid() not in threads_named("rdk:")
    assert per_message_us({"client": 0.5, "redis-server": 0.25}, 100_000) == 7.5


def test_the_suite_alternates_one_two_and_the_peer_and_makes_its_figures(monkeypatch):
    calls: list[str] = []

    def delivery(stack, config, count, lead_s, progress):
        calls.append(f"delivery {config.key} {count}")
        rate = 50_000.0 * config.processes
        return {"msg_s": rate, "ready_s": 0.5, "settled_s": 1.0, "lead_s": lead_s, "stored_s": 1.0,
                "stored_ahead_ms": 1000, "span_ms": 200, "shard_windows_ms": {0: [5, 200]},
                "cpu_cores": {"node-0": 1.0, "machine": 2.0},
                "cpu_s": {"node": 0.2} if config.processes == 1 else {"supervisor": 0.01, "member": 0.2, "reader": 0.05}}

    def peer(server, stack, count, progress):
        calls.append(f"peer {count}")
        return {"msg_s": 150_000.0, "cpu_s": {"client": 0.06, "redis-server": 0.02}}

    monkeypatch.setattr(scale, "bench_scale_delivery", delivery)
    monkeypatch.setattr(redis_peer, "peer_delivery", peer)
    ctx = Context(DevStack(kafka_port=19092, zk_port=12181), BenchOptions(runs=2, quick=True), Progress(),
                  ExitStack())
    monkeypatch.setattr(Context, "redis", lambda self: None)
    figures = {f.key: f for f in suite_members(ctx)}
    assert calls == ["delivery n1.r0 10000", "delivery n1.r0.p2 10000", "peer 10000"] * 2
    assert list(figures) == ["members.delivery.p1", "members.cpu_us.p1", "members.delivery.p2", "members.cpu_us.p2",
                             "members.delivery.ratio", "members.cpu_us.peer"]
    assert figures["members.delivery.ratio"].values == [2.0, 2.0]
    assert figures["members.cpu_us.p1"].values == [20.0, 20.0]  # 0.2 s over 10,000
    assert figures["members.cpu_us.p2"].values == [26.0, 26.0]
    assert figures["members.cpu_us.p2"].details["by_role_us"][0] == {"supervisor": 1.0, "member": 20.0, "reader": 5.0}
    assert figures["members.cpu_us.peer"].values == [8.0, 8.0] and figures["members.cpu_us.p1"].peer == [8.0, 8.0]
    assert figures["members.delivery.p2"].peer == [150_000.0, 150_000.0]
    assert figures["members.delivery.p2"].details["processes"] == 2

    calls.clear()
    ctx.options.peer = False
    figures = {f.key: f for f in suite_members(ctx)}
    assert "peer 10000" not in calls and "members.cpu_us.peer" not in figures
    assert figures["members.delivery.p1"].peer is None


@pytest.mark.parametrize("processes", [1, 2])
def test_fresh_settings_take_the_processes(processes):
    settings = fresh_settings(DevStack(kafka_port=19092, zk_port=12181), processes=processes, shards=2,
                                    buffer_partitions=4)
    assert (settings.processes, settings.shards, settings.buffer_partitions) == (processes, 2, 4)
