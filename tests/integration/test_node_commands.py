"""`delayq init`, `delayq status` and `delayq node` as an operator runs them."""

from __future__ import annotations

import json
import socket
import subprocess
import time

import pytest
from confluent_kafka.admin import AdminClient
from support.process_testing import assert_one_command_error, assert_one_error_line, run_delayq, wait_until
from support.service_testing import Cluster

from delayq import Settings
from delayq.delay_service.topics import describe_config

pytestmark = pytest.mark.integration


def delayq(settings: Settings, *args: str, **extra_env: str) -> subprocess.CompletedProcess:
    return run_delayq(*args, settings=settings, env=extra_env)


def test_init_creates_compacted_buffer_and_dead_letter_topics_then_finds_them_right(settings):
    first = delayq(settings, "init", DELAYQ_MIN_COMPACTION_LAG_MS="3600000")
    assert first.returncode == 0, first.stderr
    assert f"created {settings.buffer_topic} (3 partitions, replication factor 1, min.insync.replicas 1, " \
           "cleanup.policy compact, min.compaction.lag.ms 3600000)" in " ".join(first.stdout.split())
    assert f"created {settings.dead_letter_topic}" in first.stdout
    assert "warning" not in first.stdout  # one broker: nothing to replicate to

    admin = AdminClient({"bootstrap.servers": settings.bootstrap_servers})
    config = describe_config(admin, settings.buffer_topic)
    assert config["cleanup.policy"] == "compact"
    assert config["min.compaction.lag.ms"] == "3600000"
    assert len(admin.list_topics(settings.buffer_topic, timeout=10).topics[settings.buffer_topic].partitions) == 3

    again = delayq(settings, "init", DELAYQ_MIN_COMPACTION_LAG_MS="3600000")
    assert "exists with the right configuration" in again.stdout

    differs = delayq(settings, "init", "--strict", DELAYQ_MIN_COMPACTION_LAG_MS="60000")
    assert differs.returncode == 1
    assert "min.compaction.lag.ms: 3600000, configured 60000" in differs.stdout

    # An existing topic is not re-replicated by init: another factor is reported as a difference.
    other = delayq(settings, "init", "--strict", "--replication-factor", "3", DELAYQ_MIN_COMPACTION_LAG_MS="3600000")
    assert other.returncode == 1
    assert "replication factor: 1, configured 3" in other.stdout

    # A new buffer with more replicas than the cluster has brokers: one line, and nothing created.
    fresh = settings.cluster + "-more"
    refused = delayq(settings, "init", "--replication-factor", "3", DELAYQ_CLUSTER=fresh)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    [line] = refused.stderr.strip().splitlines()
    assert "buffer replication factor 3 is more than the 1 broker of the Kafka cluster" in line
    assert "--replication-factor" in line
    assert f"delayq-{fresh}-buffer" not in admin.list_topics(timeout=10).topics


def test_status_json_names_the_master_and_every_node(settings, tmp_path):
    cluster = Cluster(settings, tmp_path)
    try:
        cluster.start("node-a")
        cluster.master()
        cluster.start("node-b")
        time.sleep(1.5)  # membership is republished every second

        result = delayq(settings, "status", "--json")

        assert result.returncode == 0, result.stderr
        status = json.loads(result.stdout)
        assert status["cluster"] == settings.cluster
        assert status["master"] == "node-a"
        assert status["epoch"] == 1
        roles = {n["node_id"]: n["role"] for n in status["nodes"]}
        assert roles == {"node-a": "master", "node-b": "standby"}
        assert all(n["lag"] == 0 and n["pending"] == 0 and n["http"].startswith("http://") for n in status["nodes"])
        assert status["kafka"] == {"brokers": 1, "buffer": {"partitions": settings.buffer_partitions,
                                                             "replication_factor": 1},
                                   "shortfalls": [], "problem": None}
        table = delayq(settings, "status")
        assert "master node-a" in table.stdout and "node-b" in table.stdout
        assert "Kafka: 1 broker; the buffer has" in table.stdout and "enough in-sync replicas" in table.stdout
    finally:
        cluster.close()


def test_init_records_the_shards_once_and_refuses_another_count_in_one_line(settings):
    uneven = delayq(settings, "init", "--shards", "2")  # the fixture's buffer has 3 partitions
    assert uneven.returncode == 2 and "not a multiple of the cluster's 2 shards" in uneven.stderr
    assert "DELAYQ_SHARDS one of 1, 3" in uneven.stderr
    assert_one_command_error(uneven, "init")
    admin = AdminClient({"bootstrap.servers": settings.bootstrap_servers})
    assert settings.buffer_topic not in admin.list_topics(timeout=10).topics, "init created a topic it then refused"

    first = delayq(settings, "init", "--shards", "3")
    assert first.returncode == 0, first.stderr
    assert f"cluster {settings.cluster}: 3 shards of 1 buffer partitions each" in " ".join(first.stdout.split())
    assert delayq(settings, "init", "--shards", "3").returncode == 0, "the same count again is fine"

    changed = delayq(settings, "init", "--shards", "1")
    assert changed.returncode == 2
    assert "has 3 shards, recorded at its first init; DELAYQ_SHARDS=1 cannot change that" in changed.stderr
    assert_one_command_error(changed, "init")


def test_status_json_lists_each_shard_with_its_master_epoch_and_holders(settings, tmp_path):
    settings = settings.model_copy(update={"shards": 3})
    assert delayq(settings, "init").returncode == 0
    cluster = Cluster(settings, tmp_path)
    try:
        for node_id in ("node-a", "node-b"):
            cluster.start(node_id, wait=False)
        for node in cluster.nodes.values():
            node.wait_ready()
        assert wait_until(lambda: sorted(cluster.masterships()) == [0, 1, 2], timeout_s=30)
        time.sleep(1.5)  # membership is republished every second

        result = delayq(settings, "status", "--json")

        assert result.returncode == 0, result.stderr
        status = json.loads(result.stdout)
        owners = cluster.masterships()
        assert status["shards_count"] == 3 and [s["shard"] for s in status["shards"]] == [0, 1, 2]
        assert [s["master"] for s in status["shards"]] == [owners[k][0] for k in range(3)]
        assert all(s["epoch"] >= 1 and s["replicas"] == ["node-a", "node-b"] for s in status["shards"])
        assert (status["master"], status["epoch"]) == (status["shards"][0]["master"], status["shards"][0]["epoch"])
        for node in status["nodes"]:
            assert node["shards"] == [0, 1, 2] and node["ready"] == [0, 1, 2]
            assert node["masters"] == [k for k in range(3) if owners[k] == [node["node_id"]]]
        table = " ".join(delayq(settings, "status").stdout.split())
        assert "3 shards, 3 with a master" in table
    finally:
        cluster.close()


def test_node_without_a_buffer_topic_says_to_run_init(settings, tmp_path):
    result = delayq(settings, "node", DELAYQ_DATA_DIR=str(tmp_path), DELAYQ_HTTP_PORT="0")
    assert result.returncode == 1
    assert "does not exist" in result.stderr and "delayq init" in result.stderr
    assert_one_error_line(result)


def test_node_that_cannot_reach_kafka_says_so_in_one_line(settings, tmp_path):
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{closed.getsockname()[1]}"
    result = delayq(settings, "node", DELAYQ_DATA_DIR=str(tmp_path), DELAYQ_HTTP_PORT="0",
                    DELAYQ_BOOTSTRAP_SERVERS=address)
    assert result.returncode == 1
    assert f"Kafka at {address}" in result.stderr
    assert_one_error_line(result)


def test_a_second_node_with_a_live_nodes_id_exits_1_at_start_and_leaves_the_first_registered(settings, tmp_path):
    cluster = Cluster(settings, tmp_path)
    try:
        first = cluster.start("node-a")
        result = delayq(settings, "node", DELAYQ_NODE_ID="node-a", DELAYQ_DATA_DIR=str(tmp_path / "other"),
                        DELAYQ_HTTP_PORT="0")
        assert result.returncode == 1
        line = assert_one_error_line(result)
        assert "node id 'node-a' is already registered by a live node" in line and "DELAYQ_NODE_ID" in line
        status = json.loads(delayq(settings, "status", "--json").stdout)
        assert [(n["node_id"], n["http"]) for n in status["nodes"]] == [("node-a", first.url)]
    finally:
        cluster.close()


def test_a_node_whose_http_port_is_taken_names_delayq_http_port(settings, tmp_path):
    Cluster(settings, tmp_path)  # creates the topics
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = delayq(settings, "node", DELAYQ_DATA_DIR=str(tmp_path / "data"), DELAYQ_HTTP_PORT=str(port))
    assert result.returncode == 1
    line = assert_one_error_line(result)
    assert f"HTTP port {port} on 127.0.0.1 is taken (DELAYQ_HTTP_PORT={port})" in line


def test_two_nodes_sharing_one_data_directory_fail_in_one_line(settings, tmp_path):
    cluster = Cluster(settings, tmp_path)
    try:
        first = cluster.start("node-a")
        result = delayq(settings, "node", DELAYQ_NODE_ID="node-b", DELAYQ_DATA_DIR=str(first.data_dir),
                        DELAYQ_HTTP_PORT="0")
        assert result.returncode == 1
        line = assert_one_error_line(result)
        assert str(first.data_dir) in line
    finally:
        cluster.close()
