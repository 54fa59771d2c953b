"""A node's member processes (delay_service/members.py): what each member is told. Pure: no servers."""

from __future__ import annotations

from pathlib import Path

from delayq import Settings
from delayq.delay_service.members import member_environment, member_id, member_port


def test_each_member_gets_its_own_id_group_port_and_data_folder_and_keeps_the_rest():
    settings = Settings(node_id="box", processes=3, http_port=8080, data_dir=Path("/data"), log_level="DEBUG")
    envs = [member_environment(settings, i, member_port(settings, i), {"DELAYQ_CLUSTER": "orders"}) for i in range(3)]
    assert [env["DELAYQ_NODE_ID"] for env in envs] == [member_id("box", i) for i in range(3)] == ["box-0", "box-1",
                                                                                                 "box-2"]
    assert {env["DELAYQ_NODE_GROUP"] for env in envs} == {"box"}
    assert [env["DELAYQ_HTTP_PORT"] for env in envs] == ["8081", "8082", "8083"], "the node's port is its own"
    assert [env["DELAYQ_DATA_DIR"] for env in envs] == [f"/data/members/{i}" for i in range(3)]
    assert all(env["DELAYQ_PROCESSES"] == "1" and env["DELAYQ_CLUSTER"] == "orders" and env["DELAYQ_LOG_LEVEL"] ==
               "DEBUG" for env in envs), "a member is one process, of the node's cluster, at its log level"


def test_with_any_port_for_the_node_its_members_take_any_port_too():
    assert member_port(Settings(node_id="box", processes=2, http_port=0), 1) == 0
