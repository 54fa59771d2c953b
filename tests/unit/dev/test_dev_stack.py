"""The embedded stack's pieces that need no Kafka: the cluster id, recorded ports, pid files, the demo's choice."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from delayq.demo import choose_stack
from delayq.dev import DevStack, Ports, StackError, recorded_ports
from delayq.dev import stack as stack_module
from delayq.errors import ConfigurationError


def test_the_kafka_cluster_id_never_begins_with_a_dash(monkeypatch):
    # 0xF8 encodes to "-" in base64url: StorageTool would read such an id as an option.
    draws = iter([uuid.UUID(bytes=b"\xf8" + bytes(15)), uuid.UUID(bytes=b"\x01" * 16)])
    monkeypatch.setattr(stack_module.uuid, "uuid4", lambda: next(draws))

    cluster_id = stack_module.kafka_cluster_id()

    assert cluster_id == base64.urlsafe_b64encode(b"\x01" * 16).decode().rstrip("=")


def test_every_kafka_cluster_id_is_16_bytes_of_base64url_without_a_leading_dash():
    for _ in range(2000):
        cluster_id = stack_module.kafka_cluster_id()
        assert not cluster_id.startswith("-")
        assert len(base64.urlsafe_b64decode(cluster_id + "==")) == 16


@pytest.mark.parametrize("action", ["kill", "start"])
def test_kill_and_start_name_the_services_they_know(tmp_path, action):
    stack = DevStack(tmp_path)

    with pytest.raises(ValueError, match="choose one of zookeeper, kafka"):
        getattr(stack, action)("redis")


def test_killing_a_service_that_is_not_running_says_so(tmp_path):
    assert DevStack(tmp_path).kill("kafka") is False


# -- ports: recorded by up, used by every later call on the folder ---------------------------------


def record(state_dir, kafka_port: int, zk_port: int) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / "stack.json").write_text(json.dumps({"kafka_port": kafka_port, "zk_port": zk_port}))


def test_a_stack_without_ports_uses_the_ports_recorded_in_its_folder(tmp_path):
    record(tmp_path, 19092, 12181)

    stack = DevStack(tmp_path)

    assert (stack.bootstrap_servers, stack.zk_connect) == ("127.0.0.1:19092", "127.0.0.1:12181")
    assert stack.env() == {"DELAYQ_BOOTSTRAP_SERVERS": "127.0.0.1:19092", "DELAYQ_ZK_CONNECT": "127.0.0.1:12181"}
    assert [s.address for s in stack.status()] == ["127.0.0.1:19092", "127.0.0.1:12181"]


def test_ports_given_win_over_the_recorded_ones_and_nothing_recorded_means_the_defaults(tmp_path):
    record(tmp_path / "a", 19092, 12181)

    assert DevStack(tmp_path / "a", kafka_port=29092).ports == Ports(29092, 12181)
    assert DevStack(tmp_path / "b").ports == Ports(9092, 2181)
    assert DevStack(tmp_path / "b").recorded_ports() is None


def test_a_stack_started_before_ports_were_recorded_is_read_from_its_config_files(tmp_path):
    (tmp_path / "kafka").mkdir()
    (tmp_path / "zookeeper").mkdir()
    (tmp_path / "kafka" / "server.properties").write_text(
        "node.id=1\nlisteners=PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093\n")
    (tmp_path / "zookeeper" / "zoo.cfg").write_text("tickTime=500\nclientPort=12181\n")

    assert recorded_ports(tmp_path) == Ports(19092, 12181)


@pytest.mark.parametrize("kafka_port, zk_port, problem", [
    (70000, 2181, "Kafka port 70000 is out of range"),
    (65535, 2181, "Kafka port 65535 is out of range"),
    (9092, 0, "ZooKeeper port 0 is out of range"),
    (9092, 9093, "ZooKeeper port 9093 collides with Kafka's ports 9092 and 9093"),
])
def test_impossible_ports_are_refused_in_one_line(tmp_path, kafka_port, zk_port, problem):
    with pytest.raises(StackError, match=problem) as caught:
        DevStack(tmp_path, kafka_port=kafka_port, zk_port=zk_port)
    assert "\n" not in str(caught.value) and "--" in str(caught.value)


# -- pid files: only the process up started is ever signalled ------------------------------------


def test_a_pid_file_naming_a_stranger_is_dropped_and_the_stranger_left_alone(tmp_path):
    stack = DevStack(tmp_path)
    (tmp_path / "kafka").mkdir()
    (tmp_path / "kafka" / "kafka.pid").write_text(f"{os.getpid()}\n")  # a reused pid: this test's

    assert stack.status()[0].running is False
    assert stack.down() == []
    assert not (tmp_path / "kafka" / "kafka.pid").exists()


def test_a_process_of_a_folder_whose_path_contains_this_one_is_not_this_stacks(tmp_path):
    mine = tmp_path / "a"
    other = Path(f"{tmp_path}/b{mine}")  # its kafka folder's path contains mine
    (mine / "kafka").mkdir(parents=True)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                                str(other / "kafka" / "server.properties")])
    try:
        (mine / "kafka" / "kafka.pid").write_text(f"{sleeper.pid}\n")
        assert DevStack(mine).down() == []
        assert sleeper.poll() is None
        (other / "kafka").mkdir(parents=True)
        (other / "kafka" / "kafka.pid").write_text(f"{sleeper.pid}\n")
        assert DevStack(other).status()[0].running is True  # the config file as a whole argument: its own
    finally:
        sleeper.kill()
        sleeper.wait()


# -- what an error quotes from a log -------------------------------------------------------------


def test_the_telling_line_of_a_log_is_its_last_error_in_one_line():
    log = ["[t] INFO starting", "[t] ERROR Exiting Kafka due to fatal exception (kafka.Kafka$)",
           "java.lang.RuntimeException: bad", "\tat kafka.Kafka.main(Kafka.scala:1)", "[t] INFO shutting down"]

    assert stack_module.telling_line(log) == "java.lang.RuntimeException: bad"
    assert stack_module.telling_line(["[t] INFO a", "[t] INFO b", ""]) == "[t] INFO b"
    assert len(stack_module.telling_line(["x" * 1000])) == 300


# -- delayq demo: which Kafka and ZooKeeper ---------------------------------------------------------

BOTH = {"DELAYQ_BOOTSTRAP_SERVERS": "kafka-a:9092", "DELAYQ_ZK_CONNECT": "zk-a:2181"}


def test_demo_uses_the_environments_kafka_and_zookeeper_and_starts_nothing():
    choice = choose_stack(None, BOTH)

    assert (choice.bootstrap_servers, choice.zk_connect) == ("kafka-a:9092", "zk-a:2181")
    assert choice.start is False and choice.stack is None
    assert "DELAYQ_BOOTSTRAP_SERVERS" in choice.source


def test_demo_with_a_state_dir_uses_that_stacks_recorded_ports_even_with_the_variables_set(tmp_path):
    record(tmp_path, 19092, 12181)

    choice = choose_stack(tmp_path, BOTH)

    assert (choice.bootstrap_servers, choice.zk_connect) == ("127.0.0.1:19092", "127.0.0.1:12181")
    assert choice.start is False and choice.stack.state_dir == tmp_path.resolve()


def test_demo_starts_the_default_dev_stack_only_when_given_neither(tmp_path, monkeypatch):
    monkeypatch.setenv("DELAYQ_DEV_DIR", str(tmp_path))
    record(tmp_path, 19092, 12181)

    choice = choose_stack(None, {"DELAYQ_BOOTSTRAP_SERVERS": "  "})

    assert choice.start is True and choice.stack.state_dir == tmp_path.resolve()
    assert (choice.bootstrap_servers, choice.zk_connect) == ("127.0.0.1:19092", "127.0.0.1:12181")


@pytest.mark.parametrize("given, missing", [("DELAYQ_BOOTSTRAP_SERVERS", "DELAYQ_ZK_CONNECT"),
                                            ("DELAYQ_ZK_CONNECT", "DELAYQ_BOOTSTRAP_SERVERS")])
def test_demo_refuses_half_an_address_in_one_line(given, missing):
    with pytest.raises(ConfigurationError, match=f"{given} is set but {missing} is not") as caught:
        choose_stack(None, {given: BOTH[given]})
    assert "\n" not in str(caught.value)


def test_demo_with_a_state_dir_where_no_stack_ran_says_how_to_start_one(tmp_path):
    with pytest.raises(StackError, match=f"no dev stack has run in {tmp_path}.*delayq dev up --state-dir"):
        choose_stack(tmp_path, {})


def test_demo_secure_starts_the_secured_stack_of_its_own_folder_and_ports(tmp_path, monkeypatch):
    monkeypatch.setenv("DELAYQ_DEV_DIR", str(tmp_path / "dev"))

    choice = choose_stack(None, {}, secure=True)

    assert choice.start is True and choice.stack.secure is True
    assert choice.stack.state_dir == (tmp_path / "dev-secure").resolve()
    assert (choice.bootstrap_servers, choice.zk_connect) == ("127.0.0.1:9192", "127.0.0.1:2281")


def test_demo_secure_refuses_another_clusters_addresses_and_a_plain_stacks_folder(tmp_path):
    with pytest.raises(ConfigurationError, match="--secure runs on the secured dev stack") as caught:
        choose_stack(None, BOTH, secure=True)
    assert "\n" not in str(caught.value)
    record(tmp_path, 19092, 12181)  # a plain stack ran there
    with pytest.raises(StackError, match="is a plain one: leave out --secure to use it"):
        choose_stack(tmp_path, {}, secure=True)


def test_a_secured_stacks_settings_carry_sasl_ssl_the_ca_and_zookeeper_credentials(tmp_path):
    from delayq.dev.secure import Secrets

    record(tmp_path, 19192, 12281)
    stored = Secrets(users={"app": "app-password"})
    stored.save(tmp_path)
    (tmp_path / "stack.json").write_text('{"kafka_port": 19192, "zk_port": 12281, "secure": true}')
    stack = DevStack(tmp_path)

    assert stack.secure is True
    env = stack.env("app", zk_auth=False)
    assert env["DELAYQ_KAFKA__SECURITY_PROTOCOL"] == "SASL_SSL" and env["DELAYQ_KAFKA__SASL_USERNAME"] == "app"
    assert env["DELAYQ_KAFKA__SASL_MECHANISMS"] == "SCRAM-SHA-512"
    assert env["DELAYQ_KAFKA__SASL_PASSWORD"] == "app-password" and "DELAYQ_ZK_AUTH" not in env
    assert env["DELAYQ_KAFKA__SSL_CA_LOCATION"] == str(tmp_path.resolve() / "secure" / "ca.pem")
    assert stack.env()["DELAYQ_ZK_AUTH"] == stored.zk_auth  # the admin's, with ZooKeeper's credentials
    assert oct(Secrets.path(tmp_path).stat().st_mode & 0o777) == "0o600"
    with pytest.raises(StackError, match=r"no user 'nobody' on the secured stack.*delayq dev user nobody"):
        stack.env("nobody")
    with pytest.raises(StackError, match="user 'admin' is the secured stack's own"):
        stack.add_user("admin")
    with pytest.raises(StackError, match="user name 'a b' is not allowed"):
        stack.add_user("a b")


def test_a_plain_stack_has_no_users(tmp_path):
    record(tmp_path, 19092, 12181)
    with pytest.raises(StackError, match="is not secured, and has no users: start a secured one with delayq dev up "
                                         "--secure"):
        DevStack(tmp_path).add_user("app")
