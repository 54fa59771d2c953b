"""The settings model: DELAYQ_* environment, config files, librdkafka pass-through."""

from __future__ import annotations

import logging
import socket
import time

import pytest
from pydantic import ValidationError

from delayq import Settings


def test_environment_variables_with_prefix_are_read(monkeypatch):
    monkeypatch.setenv("DELAYQ_BOOTSTRAP_SERVERS", "kafka-1:9092,kafka-2:9092")
    monkeypatch.setenv("DELAYQ_ZK_CONNECT", "zk:2181")
    monkeypatch.setenv("DELAYQ_HTTP_PORT", "9000")

    settings = Settings()

    assert settings.bootstrap_servers == "kafka-1:9092,kafka-2:9092"
    assert settings.zk_connect == "zk:2181"
    assert settings.http_port == 9000


def test_topic_names_and_zk_root_derive_from_the_cluster():
    settings = Settings(cluster="orders")

    assert settings.buffer_topic == "delayq-orders-buffer"
    assert settings.dead_letter_topic == "delayq-orders-dead-letter"
    assert settings.zk_root == "/delayq/orders"
    assert settings.transactional_id() == "delayq-orders-master"
    assert settings.transactional_id(0) == "delayq-orders-master", "shard 0 keeps the id from before shards"
    assert settings.transactional_id(5) == "delayq-orders-master-5"


def test_librdkafka_settings_pass_through_with_dotted_keys(monkeypatch):
    monkeypatch.setenv("DELAYQ_KAFKA__SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("DELAYQ_KAFKA__SASL_MECHANISM", "PLAIN")

    conf = Settings(bootstrap_servers="b:9092").kafka_conf(**{"client.id": "x"})

    assert conf == {"bootstrap.servers": "b:9092", "security.protocol": "SASL_SSL",
                    "sasl.mechanism": "PLAIN", "client.id": "x", "logger": logging.getLogger("delayq.kafka")}


def test_librdkafka_log_lines_go_through_python_logging_not_raw_to_stderr(capfd, caplog):
    from confluent_kafka import Producer

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{closed.getsockname()[1]}"
    with caplog.at_level(logging.INFO, logger="delayq.kafka"):
        producer = Producer(Settings(bootstrap_servers=address).kafka_conf(**{"reconnect.backoff.ms": 10}))
        deadline = time.monotonic() + 10
        while not any("Connection refused" in r.getMessage() for r in caplog.records) and time.monotonic() < deadline:
            producer.poll(0.1)
    refused = [r for r in caplog.records if "Connection refused" in r.getMessage()]
    assert refused and all("\n" not in r.getMessage() for r in refused)
    assert "%3|" not in capfd.readouterr().err


@pytest.mark.parametrize("suffix,text", [
    (".yaml", "cluster: from-yaml\nhttp_port: 8181\n"),
    (".toml", 'cluster = "from-toml"\nhttp_port = 8181\n'),
])
def test_config_file_is_read_and_environment_wins(monkeypatch, tmp_path, suffix, text):
    path = tmp_path / f"delayq{suffix}"
    path.write_text(text)
    monkeypatch.setenv("DELAYQ_CONFIG", str(path))
    monkeypatch.setenv("DELAYQ_HTTP_PORT", "8282")

    settings = Settings()

    assert settings.cluster == f"from-{suffix[1:]}"
    assert settings.http_port == 8282


def test_bad_values_are_refused_with_the_field_named():
    with pytest.raises(ValidationError, match="cluster"):
        Settings(cluster="a/b")
    with pytest.raises(ValidationError, match="http_port"):
        Settings(http_port=70000)


@pytest.mark.parametrize("name,hint", [
    ("DELAYQ_BOOTSTRAP_SERVER", "did you mean DELAYQ_BOOTSTRAP_SERVERS?"),
    ("DELAYQ_ZK_CONECT", "did you mean DELAYQ_ZK_CONNECT?"),
    ("DELAYQ_HTTPPORT", "did you mean DELAYQ_HTTP_PORT?"),
    ("DELAYQ_KAFKA_SASL_PASSWORD", "did you mean DELAYQ_KAFKA__SASL_PASSWORD?"),
    ("DELAYQ_CONFIG_FILE", "did you mean DELAYQ_CONFIG?"),
    ("DELAYQ_FROBNICATE", "the settings are listed in docs/DESIGN.md, Configuration"),
])
def test_an_unknown_delayq_variable_is_an_error_naming_the_closest_setting(monkeypatch, name, hint):
    from delayq.errors import ConfigurationError

    monkeypatch.setenv(name, "10.9.9.9:9092")
    with pytest.raises(ConfigurationError) as refused:
        Settings()
    assert str(refused.value) == f"{name}: no such setting; {hint}"


@pytest.mark.parametrize("name", ["DELAYQ_KAFKA__SASL_PASSWORD", "DELAYQ_CACHE_DIR", "DELAYQ_DEV_DIR",
                                  "DELAYQ_TEST_KEEP_STACK", "DELAYQ_SERVICE_HOST", "DELAYQ_SERVICE_PORT_HTTP",
                                  "DELAYQ_PORT_8080_TCP_ADDR", "DELAYQ_PORT", "OTHER_BOOTSTRAP_SERVER"])
def test_pass_through_tool_and_kubernetes_service_variables_are_not_settings_typos(monkeypatch, name):
    monkeypatch.setenv(name, "x")
    assert Settings().bootstrap_servers == "127.0.0.1:9092"


def test_an_unknown_key_in_the_settings_file_is_an_error_naming_the_closest_setting(monkeypatch, tmp_path):
    from delayq.errors import ConfigurationError

    path = tmp_path / "delayq.yaml"
    path.write_text("bootstrap_servers: kafka:9092\nzk_conect: zk:2181\n")
    monkeypatch.setenv("DELAYQ_CONFIG", str(path))
    with pytest.raises(ConfigurationError, match=r"delayq.yaml: zk_conect: no such setting; did you mean zk_connect\?"):
        Settings()


def test_librdkafkas_repeated_lines_pass_once_a_window_and_the_next_says_how_many_were_held():
    from delayq.settings import QuietRepeats

    now = [100.0]
    quiet = QuietRepeats(window_s=10.0, clock=lambda: now[0])
    logger = logging.getLogger("delayq.test.quiet")
    passed: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            passed.append(record.getMessage())

    logger.addHandler(Keep())
    logger.addFilter(quiet)
    logger.propagate = False
    for i in range(200):  # 20 a second for 10 s: the same failure, its numbers changing
        now[0] = 100.0 + i * 0.05
        logger.error("FAIL [rdkafka#consumer-1]: Connect to ipv4#127.0.0.1:43057 failed (after %dms)", i % 3)
    logger.error("FAIL [rdkafka#consumer-1]: SSL handshake failed")  # another line passes at once
    now[0] = 110.5
    logger.error("FAIL [rdkafka#consumer-1]: Connect to ipv4#127.0.0.1:43057 failed (after 0ms)")

    assert passed == ["FAIL [rdkafka#consumer-1]: Connect to ipv4#127.0.0.1:43057 failed (after 0ms)",
                      "FAIL [rdkafka#consumer-1]: SSL handshake failed",
                      "FAIL [rdkafka#consumer-1]: Connect to ipv4#127.0.0.1:43057 failed (after 0ms) "
                      "(and 199 more like it in the last 10s)"]
    from delayq.settings import KAFKA_LOGGER

    assert any(isinstance(f, QuietRepeats) for f in KAFKA_LOGGER.filters)
