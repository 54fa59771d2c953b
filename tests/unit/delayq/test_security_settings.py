"""Target-topic rules and secret settings: what the master may deliver to, and what is never shown."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from delayq import Producer, Settings
from delayq.settings import settings_problem

SCRAM_PASSWORD = "scram-Secret-4711"
ZK_PASSWORD = "zk-Secret-0815"


@pytest.fixture(autouse=True)
def _no_delayq_environment(monkeypatch):
    import os

    for name in [name for name in os.environ if name.startswith("DELAYQ_")]:
        monkeypatch.delenv(name)


def test_target_topics_default_to_everything_but_the_always_forbidden():
    settings = Settings(cluster="orders")

    assert settings.target_topics == ["*"]
    assert settings.forbidden_target("payments") is None
    assert settings.forbidden_target("delayq-orders-buffer") == "delayq-orders-buffer is this cluster's own buffer topic"
    assert "own dead-letter topic" in settings.forbidden_target("delayq-orders-dead-letter")
    assert "delayq buffer topic" in settings.forbidden_target("delayq-billing-buffer")
    assert "Kafka internal topic" in settings.forbidden_target("__consumer_offsets")
    assert "Kafka internal topic" in settings.forbidden_target("__transaction_state")


def test_a_renamed_buffer_is_forbidden_by_its_name():
    settings = Settings(cluster="orders", buffer_topic="orders.delays", dead_letter_topic="orders.undeliverable")

    assert "own buffer topic" in settings.forbidden_target("orders.delays")
    assert "own dead-letter topic" in settings.forbidden_target("orders.undeliverable")


def test_target_topics_come_comma_separated_from_the_environment(monkeypatch):
    monkeypatch.setenv("DELAYQ_TARGET_TOPICS", " orders* , audit.[ab],payments ")
    settings = Settings()

    assert settings.target_topics == ["orders*", "audit.[ab]", "payments"]
    assert settings.forbidden_target("orders.created") is None
    assert settings.forbidden_target("audit.a") is None and settings.forbidden_target("payments") is None
    assert settings.forbidden_target("audit.c") == "audit.c is not in the cluster's target topics " \
                                                   "(orders*,audit.[ab],payments)"
    # The allowlist never opens what is always forbidden.
    monkeypatch.setenv("DELAYQ_TARGET_TOPICS", "*")
    assert "Kafka internal" in Settings().forbidden_target("__consumer_offsets")


@pytest.mark.parametrize(("text", "wanted"), [
    ("", "no target topic pattern"), (",", "no target topic pattern"),
    ("orders topic", "'orders topic' is no topic name or glob"), ("a,b/c", "'b/c' is no topic name or glob")])
def test_a_bad_target_topic_list_is_one_line_naming_the_variable(monkeypatch, text, wanted):
    monkeypatch.setenv("DELAYQ_TARGET_TOPICS", text)
    with pytest.raises(ValidationError) as refused:
        Settings()

    problem = settings_problem(refused.value)
    assert problem.startswith("invalid setting: DELAYQ_TARGET_TOPICS") and wanted in problem, problem


def test_secrets_are_kept_out_of_repr_and_revealed_only_to_the_clients(monkeypatch):
    monkeypatch.setenv("DELAYQ_KAFKA__SASL_PASSWORD", SCRAM_PASSWORD)
    monkeypatch.setenv("DELAYQ_KAFKA__SASL_USERNAME", "node")
    monkeypatch.setenv("DELAYQ_KAFKA__SSL_KEY_PASSWORD", SCRAM_PASSWORD + "-key")
    monkeypatch.setenv("DELAYQ_KAFKA__SASL_OAUTHBEARER_CLIENT_SECRET", SCRAM_PASSWORD + "-oauth")
    monkeypatch.setenv("DELAYQ_ZK_AUTH", f"delayq:{ZK_PASSWORD}")
    settings = Settings()

    shown = repr(settings) + str(settings) + settings.model_dump_json() + repr(settings.model_dump())
    assert SCRAM_PASSWORD not in shown and ZK_PASSWORD not in shown
    assert "node" in shown  # a user name is no secret
    conf = settings.kafka_conf()
    assert conf["sasl.password"] == SCRAM_PASSWORD and conf["sasl.username"] == "node"
    assert conf["ssl.key.password"] == SCRAM_PASSWORD + "-key"
    assert conf["sasl.oauthbearer.client.secret"] == SCRAM_PASSWORD + "-oauth"
    assert settings.zk_credentials == f"delayq:{ZK_PASSWORD}"


def test_malformed_zookeeper_credentials_are_refused_without_quoting_them(monkeypatch):
    monkeypatch.setenv("DELAYQ_ZK_AUTH", ZK_PASSWORD)  # the user name was forgotten
    with pytest.raises(ValidationError) as refused:
        Settings()

    problem = settings_problem(refused.value)
    assert problem.startswith("invalid setting: DELAYQ_ZK_AUTH = **********: ") and "'user:password'" in problem
    assert ZK_PASSWORD not in problem and ZK_PASSWORD not in str(refused.value)


def test_a_producer_refusing_a_setting_never_quotes_a_secret():
    with pytest.raises(ValueError) as refused:
        Producer({"bootstrap.servers": "127.0.0.1:1", "delayq.zk.auth": ZK_PASSWORD})

    assert "delayq.zk.auth" in str(refused.value) and ZK_PASSWORD not in str(refused.value)


@pytest.mark.parametrize("topic", ["delayq-orders-buffer", "delayq-orders-dead-letter", "__consumer_offsets",
                                   "delayq-billing-buffer"])
def test_the_producer_refuses_an_always_forbidden_target_before_sending(topic, monkeypatch):
    import delayq.proxy.producer as producer_module

    sent = []
    monkeypatch.setattr(producer_module, "_base_produce", lambda *args: sent.append(args))
    producer = Producer({"bootstrap.servers": "127.0.0.1:1", "delayq.cluster": "orders", "log_level": 0})
    for attempt in (dict(delay=5), dict(delay=5, partition=0), dict(delay=5, value=None), dict(delay_level=1)):
        kwargs = {"value": b"v", **attempt}
        with pytest.raises(ValueError, match=f"delayq never delivers to {topic}: .*forbidden-topic"):
            producer.produce(topic, **kwargs)
    assert sent == []
    producer.produce("orders", b"v", delay=5)
    assert [args[1] for args in sent] == ["delayq-orders-buffer"]  # the same path sends an allowed one


def test_a_topic_merely_named_like_a_forbidden_one_takes_delayed_messages(monkeypatch):
    import delayq.proxy.producer as producer_module

    sent = []
    monkeypatch.setattr(producer_module, "_base_produce", lambda *args: sent.append(args))
    producer = Producer({"bootstrap.servers": "127.0.0.1:1", "delayq.cluster": "orders", "log_level": 0})
    producer.produce("consumer_offsets__", b"v", delay=1)
    producer.produce("delayq-orders-buffer-archive", b"v", delay=1)
    assert len(sent) == 2
