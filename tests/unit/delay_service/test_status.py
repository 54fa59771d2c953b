"""`delayq status` shows each node's version: the real command and cluster_status over a stand-in ZooKeeper.

The stand-in (``spec_set`` KazooClient) answers reads from a dict of znodes, as a cluster of one shard
with a node of this version mastering it and a node of 0.1.0 beside it would leave them; Kafka's part
of the status is a fixed answer. No server.
"""

from __future__ import annotations

import json

import pytest
from rich.console import Console
from support.stand_ins import zookeeper

import delayq
from delayq.cli import main
from delayq.commands import status as status_command
from delayq.delay_service import status as cluster_status_module
from delayq.election import FeatureRecord, NodeRecord, Role, ShardLayout
from delayq.features import SUPPORTED_LEVEL

ROOT = "/delayq/t-status"
KAFKA_IN_SYNC = {"brokers": 1, "buffer": {"partitions": 12, "replication_factor": 1}, "shortfalls": [],
                 "problem": None}


def without_version(record: NodeRecord) -> bytes:
    """``record`` as a node of 0.1.0 wrote it: the same fields but those it did not have, ``version`` and ``feature_level``."""
    return json.dumps({k: v for k, v in json.loads(record.to_json()).items()
                       if k not in ("version", "feature_level")}).encode()


@pytest.fixture
def cluster_of_two_versions(monkeypatch) -> dict[str, bytes]:
    """`delayq status` of cluster t-status sees node-new (this version, master) and node-old (0.1.0); its znodes."""
    znodes = {
        f"{ROOT}/layout": ShardLayout(1, 12).to_json(),
        f"{ROOT}/nodes/node-new": NodeRecord("node-new", Role.MASTER, lag=0, pending=3, shards=(0,), ready=(0,),
                                             masters=(0,)).to_json(),
        f"{ROOT}/nodes/node-old": without_version(NodeRecord("node-old", Role.STANDBY, lag=0, pending=3, shards=(0,),
                                                             ready=(0,))),
    }
    monkeypatch.setenv("DELAYQ_CLUSTER", "t-status")
    monkeypatch.setattr(cluster_status_module, "connect_for", lambda settings, timeout_s: zookeeper(
        znodes, master="node-new"))
    monkeypatch.setattr(cluster_status_module, "kafka_status", lambda settings: KAFKA_IN_SYNC)
    return znodes


@pytest.mark.usefixtures("cluster_of_two_versions")
def test_status_json_shows_each_nodes_version_and_none_for_a_node_of_0_1_0(capsys):
    assert main(["status", "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert {node["node_id"]: node["version"] for node in status["nodes"]} == {
        "node-new": delayq.__version__, "node-old": None}
    assert status["master"] == "node-new"


@pytest.mark.usefixtures("cluster_of_two_versions")
def test_status_shows_each_nodes_version_and_an_older_nodes_as_0_1_0_or_older(monkeypatch, capsys):
    monkeypatch.setattr(status_command, "console", Console(width=200))  # a row per node, unwrapped
    assert main(["status"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {node: next(line for line in lines if f" {node} " in line) for node in ("node-new", "node-old")}
    assert delayq.__version__ in rows["node-new"]
    assert "0.1.0 or older" in rows["node-old"]


@pytest.mark.usefixtures("cluster_of_two_versions")
def test_status_json_shows_the_clusters_level_1_when_none_is_recorded_and_each_nodes_highest_level(capsys):
    assert main(["status", "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["features"] == {"level": 1, "record": None, "problem": None,
                                  "text": "feature level 1 (none recorded: a cluster that ran delayq 0.1.0)"}
    assert {node["node_id"]: node["feature_level"] for node in status["nodes"]} == {
        "node-new": SUPPORTED_LEVEL, "node-old": None}


def test_status_shows_the_finalized_level_and_the_level_each_node_speaks_up_to(cluster_of_two_versions, monkeypatch,
                                                                             capsys):
    record = FeatureRecord(level=2, introduced_by="0.2.0", finalized_at_ms=1_767_225_600_000, finalized_by="0.2.0")
    cluster_of_two_versions[f"{ROOT}/features"] = record.to_json()
    monkeypatch.setattr(status_command, "console", Console(width=200))
    assert main(["status"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "feature level 2 (finalized by delayq 0.2.0 at 2026-01-01T00:00:00Z)" in lines
    header = cells(next(line for line in lines if " version " in line))
    assert header[header.index("version") + 1] == "level"
    rows = {node: cells(next(line for line in lines if f" {node} " in line)) for node in ("node-new", "node-old")}
    assert rows["node-new"][header.index("level")] == str(SUPPORTED_LEVEL)
    assert rows["node-old"][header.index("level")] == "1"


def cells(line: str) -> list[str]:
    """The cells of one row of a rich table."""
    return [cell.strip() for cell in line.replace("┃", "│").split("│") if cell.strip()]
