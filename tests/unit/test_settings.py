"""The settings model: DELAYQ_* environment, config files, librdkafka pass-through."""

from __future__ import annotations

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
    assert settings.transactional_id == "delayq-orders-master"


def test_librdkafka_settings_pass_through_with_dotted_keys(monkeypatch):
    monkeypatch.setenv("DELAYQ_KAFKA__SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("DELAYQ_KAFKA__SASL_MECHANISM", "PLAIN")

    conf = Settings(bootstrap_servers="b:9092").kafka_conf(**{"client.id": "x"})

    assert conf == {"bootstrap.servers": "b:9092", "security.protocol": "SASL_SSL",
                    "sasl.mechanism": "PLAIN", "client.id": "x"}


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
