"""`delayq status` shows each node's version: the real command and cluster_status over a stand-in ZooKeeper.

The stand-in (``spec_set`` KazooClient) answers reads from a dict of znodes, as a cluster of one shard
with a node of this version mastering it and a node of 0.1.0 beside it would leave them; Kafka's part
of the status is a fixed answer. No server.
"""

from __future__ import annotations

import json
from unittest import mock

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
from rich.console import Console

import delayq
from delayq.cli import main
from delayq.commands import status as status_command
from delayq.delay_service import status as cluster_status_module
from delayq.election import NodeRecord, Role, ShardLayout

ROOT = "/delayq/t-status"
KAFKA_IN_SYNC = {"brokers": 1, "buffer": {"partitions": 12, "replication_factor": 1}, "shortfalls": [],
                 "problem": None}


def stand_in_zookeeper(znodes: dict[str, bytes], master: str) -> mock.Mock:
    """A KazooClient reading ``znodes``; ``master`` first in line for every shard's lock."""
    client = mock.Mock(spec_set=[*dir(KazooClient), "Lock"])  # Lock: set per instance by KazooClient.__init__

    def get(path: str) -> tuple[bytes, None]:
        if path not in znodes:
            raise NoNodeError(path)
        return znodes[path], None

    def get_children(folder: str) -> list[str]:
        return sorted({path[len(folder) + 1:].split("/")[0] for path in znodes if path.startswith(f"{folder}/")})

    client.get.side_effect = get
    client.get_children.side_effect = get_children
    client.Lock.return_value.contenders.return_value = [master]
    return client


def without_version(record: NodeRecord) -> bytes:
    """``record`` as a node of 0.1.0 wrote it: the same fields but ``version``."""
    return json.dumps({k: v for k, v in json.loads(record.to_json()).items() if k != "version"}).encode()


@pytest.fixture
def cluster_of_two_versions(monkeypatch) -> None:
    """`delayq status` of cluster t-status sees node-new (this version, master) and node-old (0.1.0)."""
    znodes = {
        f"{ROOT}/layout": ShardLayout(1, 12).to_json(),
        f"{ROOT}/nodes/node-new": NodeRecord("node-new", Role.MASTER, lag=0, pending=3, shards=(0,), ready=(0,),
                                             masters=(0,)).to_json(),
        f"{ROOT}/nodes/node-old": without_version(NodeRecord("node-old", Role.STANDBY, lag=0, pending=3, shards=(0,),
                                                             ready=(0,))),
    }
    monkeypatch.setenv("DELAYQ_CLUSTER", "t-status")
    monkeypatch.setattr(cluster_status_module, "connect_for", lambda settings, timeout_s: stand_in_zookeeper(
        znodes, master="node-new"))
    monkeypatch.setattr(cluster_status_module, "kafka_status", lambda settings: KAFKA_IN_SYNC)


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
