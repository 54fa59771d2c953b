"""The cluster's feature level on the dev stack's real ZooKeeper: init, `delayq upgrade`, the producer's gate, a node's start.

A node of 0.1.0 is played by its registration as 0.1.0 writes it (no ``version``, no ``feature_level``),
ephemeral in a ZooKeeper session of the test's own, which the test closes to make the node go.
"""

from __future__ import annotations

import json
import subprocess

import pytest
from support.process_testing import assert_one_command_error, assert_one_error_line, run_delayq, wait_until
from support.service_testing import Cluster

from delayq import Producer, Settings, __version__
from delayq.clock import now_ms
from delayq.election import FeatureRecord, Features, ShardLayout, connect_for
from delayq.features import SUPPORTED_LEVEL
from delayq.proxy.feature_gate import LevelNotFinalized

pytestmark = pytest.mark.integration

# A registration exactly as a node of 0.1.0 writes it (commit 8f62a6c).
RECORD_OF_0_1_0 = {"node_id": "node-old", "role": "standby", "http": "http://old:8081", "host": "old", "lag": 0,
                   "pending": 0, "epoch": 0, "updated_at_ms": 1_764_048_000_000, "shards": [0], "ready": [0],
                   "masters": []}


def delayq(settings: Settings, *args: str, **extra_env: str) -> subprocess.CompletedProcess:
    return run_delayq(*args, settings=settings, env=extra_env)


@pytest.fixture
def zk(settings):
    client = connect_for(settings, timeout_s=10)
    yield client
    client.stop()
    client.close()


def test_init_records_the_newest_level_on_a_new_cluster_and_nothing_on_one_that_ran_0_1_0(settings, zk):
    new = delayq(settings, "init")
    assert new.returncode == 0, new.stderr
    finalized = Features(zk, settings.zk_root).read()
    assert finalized.level == SUPPORTED_LEVEL and finalized.record is not None
    assert finalized.record.finalized_by == __version__
    assert f"feature level {SUPPORTED_LEVEL} (finalized by delayq {__version__}" in " ".join(new.stdout.split())

    # A cluster of 0.1.0: its layout is recorded (0.1.0's init or first node wrote it), no feature level.
    old = settings.model_copy(update={"cluster": f"{settings.cluster}-old"})
    zk.create(f"{old.zk_root}/layout", ShardLayout(1, old.buffer_partitions).to_json(), makepath=True)
    upgraded = delayq(old, "init")
    assert upgraded.returncode == 0, upgraded.stderr
    assert not Features(zk, old.zk_root).read().recorded, "init finalized a cluster in the middle of its upgrade"
    said = " ".join(upgraded.stdout.split())
    assert "feature level 1 (none recorded: a cluster that ran delayq 0.1.0)" in said
    assert "delayq upgrade status" in said


def test_finalize_is_refused_while_a_node_of_0_1_0_is_registered_and_accepted_once_it_is_gone(settings, tmp_path, zk):
    # A cluster that ran 0.1.0: its layout recorded, no feature level.
    zk.create(f"{settings.zk_root}/layout", ShardLayout(1, settings.buffer_partitions).to_json(), makepath=True)
    cluster = Cluster(settings, tmp_path)
    old_node = connect_for(settings, timeout_s=10)
    try:
        cluster.start("node-new")
        old_node.create(f"{settings.zk_root}/nodes/node-old", json.dumps(RECORD_OF_0_1_0).encode(), ephemeral=True)

        status = json.loads(delayq(settings, "upgrade", "status", "--json").stdout)
        assert status["features"] == {"level": 1, "record": None, "problem": None,
                                  "text": "feature level 1 (none recorded: a cluster that ran delayq 0.1.0)"}
        assert status["supported_level"] == SUPPORTED_LEVEL
        assert status["nodes"] == [
            {"node_id": "node-new", "version": __version__, "highest_level": SUPPORTED_LEVEL, "store_format": 4},
            {"node_id": "node-old", "version": None, "highest_level": 1, "store_format": None}]
        assert (status["finalize"]["action"], status["finalize"]["level"]) == ("refused", SUPPORTED_LEVEL)

        refused = delayq(settings, "upgrade", "finalize")
        assert refused.returncode == 2
        assert_one_command_error(refused, "upgrade")
        assert f"cannot finalize cluster {settings.cluster} at feature level 2: not every registered node speaks " \
               "it: node-old (delayq 0.1.0 or older, up to level 1); upgrade each to delayq 0.2.0 or later" in refused.stderr
        assert not Features(zk, settings.zk_root).read().recorded

        old_node.stop()  # the node of 0.1.0 goes: its session's registration with it
        accepted = delayq(settings, "upgrade", "finalize")
        assert accepted.returncode == 0, accepted.stderr
        assert f"cluster {settings.cluster}: feature level raised from 1 to 2" in accepted.stdout
        finalized = Features(zk, settings.zk_root).read()
        assert finalized.level == 2 and finalized.record is not None and finalized.record.finalized_by == __version__
        # The node follows the finalize: its store migrated in place to level 2's format, as its registration says.
        assert wait_until(lambda: [node["store_format"] for node in json.loads(
            delayq(settings, "upgrade", "status", "--json").stdout)["nodes"]] == [5], timeout_s=15)

        lowered = delayq(settings, "upgrade", "finalize", "--level", "1")
        assert lowered.returncode == 2
        assert_one_command_error(lowered, "upgrade")
        assert "a finalized level is never lowered" in lowered.stderr
        shown = json.loads(delayq(settings, "status", "--json").stdout)
        assert shown["features"]["level"] == 2
        assert [node["feature_level"] for node in shown["nodes"]] == [SUPPORTED_LEVEL]
    finally:
        old_node.stop()
        old_node.close()
        cluster.close()


def test_the_first_node_of_a_cluster_no_init_set_up_records_the_newest_level(settings, tmp_path, zk):
    cluster = Cluster(settings, tmp_path)
    try:
        cluster.start("node-first")
    finally:
        cluster.close()

    finalized = Features(zk, settings.zk_root).read()
    assert finalized.level == SUPPORTED_LEVEL and finalized.record is not None
    assert finalized.record.finalized_by == __version__


def test_a_producers_gate_sees_a_finalize_without_restarting(settings, zk):
    producer = Producer({"bootstrap.servers": settings.bootstrap_servers, "delayq.cluster": settings.cluster,
                         "delayq.zk.connect": settings.zk_connect})
    try:
        with pytest.raises(LevelNotFinalized, match=f"cluster {settings.cluster} is finalized at level 1"):
            producer.level_gate.require_level(2, "expires=")
        features = Features(zk, settings.zk_root)
        features.finalize(FeatureRecord.of(2), features.read())  # what `delayq upgrade finalize` writes

        def allowed() -> bool:
            try:
                producer.level_gate.require_level(2, "expires=")
            except LevelNotFinalized:
                return False
            return True

        assert wait_until(allowed, timeout_s=10), "the producer did not see the finalize"
    finally:
        producer.close()


def test_a_node_refuses_to_start_on_a_cluster_finalized_above_its_level_in_one_line_and_exit_2(settings, tmp_path, zk):
    Cluster(settings, tmp_path)  # the topics
    newer = FeatureRecord(level=SUPPORTED_LEVEL + 1, introduced_by="0.9.0", finalized_at_ms=now_ms(),
                          finalized_by="0.9.1")
    zk.create(f"{settings.zk_root}/features", newer.to_json(), makepath=True)
    data = tmp_path / "node"
    result = delayq(settings, "node", DELAYQ_DATA_DIR=str(data), DELAYQ_HTTP_PORT="0")
    assert result.returncode == 2, result.stderr
    line = assert_one_error_line(result)
    assert (f"cluster {settings.cluster} is finalized at feature level {SUPPORTED_LEVEL + 1}, introduced by delayq "
            f"0.9.0; this node runs delayq {__version__}, which speaks up to level {SUPPORTED_LEVEL}: run delayq 0.9.0 "
            "or later") in line
    assert not (data / "shards").exists(), "the refused node opened a store"
    assert not zk.exists(f"{settings.zk_root}/nodes") or zk.get_children(f"{settings.zk_root}/nodes") == []
    assert not zk.exists(f"{settings.zk_root}/layout"), "the refused node wrote the layout"
