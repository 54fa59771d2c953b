"""`delayq dev` as a person runs it: status, env, a second up that downloads nothing, a second stack."""

from __future__ import annotations

import socket

import pytest
from support.process_testing import run_delayq

from delayq.dev import DevStack

pytestmark = pytest.mark.integration


def test_status_shows_both_services_healthy(dev_stack):
    result = run_delayq("dev", "status", "--state-dir", str(dev_stack.state_dir))

    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("healthy") == 2
    assert "127.0.0.1:9092" in result.stdout and "127.0.0.1:2181" in result.stdout


def test_env_prints_export_lines(dev_stack):
    result = run_delayq("dev", "env", "--state-dir", str(dev_stack.state_dir))

    assert result.stdout.splitlines() == [
        f"export DELAYQ_BOOTSTRAP_SERVERS={dev_stack.bootstrap_servers}",
        f"export DELAYQ_ZK_CONNECT={dev_stack.zk_connect}",
    ]


def test_second_up_downloads_nothing_and_starts_nothing(dev_stack):
    result = run_delayq("dev", "up", "--state-dir", str(dev_stack.state_dir))

    assert result.returncode == 0, result.stderr
    assert "downloading" not in result.stdout
    assert "started nothing" in result.stdout


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def free_kafka_port() -> int:
    """A free port whose next one (Kafka's controller) is free too."""
    while True:
        with socket.socket() as sock, socket.socket() as controller:
            sock.bind(("127.0.0.1", 0))
            try:
                controller.bind(("127.0.0.1", sock.getsockname()[1] + 1))
            except OSError:
                continue
            return sock.getsockname()[1]


@pytest.mark.slow
def test_a_second_stack_on_other_ports_comes_up_and_goes_down_twice(tmp_path, dev_stack):
    stack = DevStack(tmp_path / "stack", kafka_port=free_kafka_port(), zk_port=free_port())
    try:
        assert stack.up(say=lambda _: None) == ["zookeeper", "kafka"]
        assert all(s.healthy for s in stack.status())
        assert (tmp_path / "stack" / "kafka" / "data" / "meta.properties").exists()
        assert_logs_are_bounded_and_written_by_the_logging_library(tmp_path / "stack")
    finally:
        first = stack.down()
        second = stack.down()
    assert first == ["kafka", "zookeeper"]
    assert second == []
    assert not any(s.running for s in stack.status())


def test_up_fails_clearly_when_a_port_is_taken_by_a_stranger(tmp_path):
    with socket.socket() as stranger:
        stranger.bind(("127.0.0.1", 0))
        stranger.listen()
        port = stranger.getsockname()[1]
        result = run_delayq("dev", "up", "--state-dir", str(tmp_path / "s"), "--zk-port", str(port),
                            "--kafka-port", str(free_kafka_port()))
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert f"port {port}" in line and "taken" in line and "--zk-port" in line
    assert not list((tmp_path / "s").glob("*/*.pid"))


def assert_logs_are_bounded_and_written_by_the_logging_library(folder) -> None:
    """Each service logs through its logging library into <name>.log, rolled at LOG_FILE_MB with LOG_FILES_KEPT
    kept (the dev stack's Kafka log once grew to 3.4 GB); what the JVM itself prints goes to <name>.out."""
    from delayq.dev.stack import LOG_FILE_MB, LOG_FILES_KEPT

    configs = {"kafka": (folder / "kafka" / "log4j2.properties").read_text(),
               "zookeeper": (folder / "zookeeper" / "logback.xml").read_text()}
    assert f"policies.size.size = {LOG_FILE_MB}MB" in configs["kafka"]
    assert f"strategy.max = {LOG_FILES_KEPT}" in configs["kafka"]
    assert f"<maxFileSize>{LOG_FILE_MB}MB</maxFileSize>" in configs["zookeeper"]
    assert f"<maxIndex>{LOG_FILES_KEPT}</maxIndex>" in configs["zookeeper"]
    started = {"kafka": "Kafka Server started", "zookeeper": "binding to port"}
    for service, line in started.items():
        log = (folder / service / f"{service}.log").read_text(errors="replace")
        out = (folder / service / f"{service}.out").read_text(errors="replace")
        assert line in log, f"{service}.log lacks {line!r}: {log[-2000:]}"
        assert "StatusLogger" not in out and "ERROR in ch.qos.logback" not in out, f"{service}.out: {out[-2000:]}"
