"""The reconciliation job's inputs: durations, times, window rules, flags, Kafka options, Maven coordinates."""

from __future__ import annotations

import argparse
from pathlib import Path

import pyspark
import pytest

from delayq import Settings
from delayq.errors import UsageError
from delayq.spark import ReconcileOptions, kafka_package, parse_instant
from delayq.spark.cli import add_arguments, options_from_args
from delayq.spark.session import ivy_settings_xml, kafka_source_options

NOW = 1_800_000_000_000  # 2027-01-15T08:00:00Z


def test_reconcile_reads_durations_in_the_one_grammar_every_command_speaks():
    # `delayq reconcile --grace 90` as `delayq produce --delay 90`: plain seconds (delayq/clock.py).
    parsed = options_from_args(parse("--grace", "90", "--early-tolerance", "1.5s", "--lookback", "1h30m"), now_ms=NOW)
    assert (parsed.grace_ms, parsed.early_tolerance_ms, parsed.lookback_ms) == (90_000, 1500, 5_400_000)


@pytest.mark.parametrize("text,ms", [
    ("2027-01-15T08:00:00Z", NOW),
    ("2027-01-15T08:00:00.250Z", NOW + 250),
    ("2027-01-15T09:00:00+01:00", NOW),
    ("2027-01-15 08:00", NOW),          # no offset: UTC, whatever the machine's zone
    ("now", NOW),
    ("24h", NOW - 86_400_000),
    ("90m", NOW - 5_400_000),
    ("90", NOW - 90_000),  # plain seconds, as every duration
])
def test_parse_instant_reads_iso_times_and_durations_before_now(text, ms):
    assert parse_instant(text, now_ms=NOW) == ms


@pytest.mark.parametrize("text", ["yesterday", "2027-13-01", "-24", "1h30"])
def test_parse_instant_refuses_other_text_naming_the_argument(text):
    with pytest.raises(ValueError, match=r"--since .* neither an ISO 8601 time"):
        parse_instant(text, "--since", now_ms=NOW)


def options(**changes) -> ReconcileOptions:
    base = {"since_ms": NOW - 86_400_000, "until_ms": NOW, "out": Path("out")}
    base.update(changes)
    return ReconcileOptions(**base)


def test_options_defaults_grace_five_minutes_read_committed_local_master():
    chosen = options()
    assert (chosen.grace_ms, chosen.read_committed, chosen.isolation_level, chosen.master, chosen.topics) == \
        (300_000, True, "read_committed", "local[*]", None)
    assert chosen.expected_before_ms == NOW - 300_000
    assert (chosen.reorder_tolerance_ms, chosen.ack_grace_ms) == (0, 300_000)


@pytest.mark.parametrize("changes,error,message", [
    ({"since_ms": NOW}, ValueError, "since .* must be before until"),
    ({"grace_ms": 86_400_000}, ValueError, "grace_ms 86400000 covers the whole window"),
    ({"grace_ms": -1}, ValueError, "grace_ms must not be negative"),
    ({"early_tolerance_ms": -5}, ValueError, "early_tolerance_ms must not be negative"),
    ({"reorder_tolerance_ms": -1}, ValueError, "reorder_tolerance_ms must not be negative"),
    ({"ack_grace_ms": -1}, ValueError, "ack_grace_ms must not be negative"),
    ({"ack_grace_ms": 1.5}, TypeError, "ack_grace_ms must be an int"),
    ({"since_ms": "yesterday"}, TypeError, "since_ms must be an int"),
    ({"read_committed": True, "list_limit": True}, TypeError, "list_limit must be an int"),
    ({"topics": "orders"}, TypeError, "topics must be a sequence"),
    ({"topics": ()}, ValueError, "topics is empty"),
    ({"topics": ("a,b",)}, ValueError, "cannot contain ','"),
    ({"out": 5}, TypeError, "out must be a path"),
])
def test_options_refuse_bad_values_naming_them(changes, error, message):
    with pytest.raises(error, match=message):
        options(**changes)


def test_options_drop_repeated_topics_keeping_order():
    assert options(topics=["b", "a", "b"]).topics == ("b", "a")


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser, default_master="local[*]")
    return parser.parse_args(list(argv))


def test_flags_default_to_the_last_24_hours_and_five_minutes_grace():
    chosen = options_from_args(parse(), now_ms=NOW)
    assert (chosen.since_ms, chosen.until_ms, chosen.grace_ms, chosen.early_tolerance_ms) == \
        (NOW - 86_400_000, NOW, 300_000, 10)
    assert chosen.out == Path("delayq-report") and chosen.master == "local[*]" and chosen.read_committed
    assert (chosen.reorder_tolerance_ms, chosen.ack_grace_ms) == (0, 300_000)


def test_flags_map_onto_options():
    chosen = options_from_args(parse(
        "--since", "2027-01-15T06:00:00Z", "--until", "1h", "--grace", "30s", "--topics", "a, b,,a",
        "--read-uncommitted", "--master", "spark://m:7077", "--out", "/tmp/r", "--early-tolerance", "2ms",
        "--conf", "spark.sql.shuffle.partitions=4", "--list-limit", "5", "--reorder-tolerance", "250ms",
        "--ack-grace", "1m"), now_ms=NOW)
    assert (chosen.since_ms, chosen.until_ms, chosen.grace_ms) == (NOW - 7_200_000, NOW - 3_600_000, 30_000)
    assert chosen.topics == ("a", "b") and not chosen.read_committed and chosen.isolation_level == "read_uncommitted"
    assert (chosen.master, chosen.out, chosen.early_tolerance_ms, chosen.list_limit) == \
        ("spark://m:7077", Path("/tmp/r"), 2, 5)
    assert chosen.spark_conf == {"spark.sql.shuffle.partitions": "4"}
    assert (chosen.reorder_tolerance_ms, chosen.ack_grace_ms) == (250, 60_000)


@pytest.mark.parametrize("argv,message", [
    (("--conf", "no-equals-sign"), "--conf 'no-equals-sign' must be KEY=VALUE"),
    (("--topics", " , "), "--topics is empty"),
    (("--grace", "5 minutes"), "--grace '5 minutes' is not a duration"),
    (("--reorder-tolerance", "-2"), "--reorder-tolerance '-2' is not a duration"),
    (("--ack-grace", "10 s"), "--ack-grace '10 s' is not a duration"),
    (("--until", "later"), "--until 'later' is neither"),
])
def test_flags_with_bad_values_fail_naming_the_flag(argv, message):
    with pytest.raises(ValueError, match=message):
        options_from_args(parse(*argv), now_ms=NOW)


@pytest.mark.parametrize("argv,message", [
    (("--since", "1h", "--until", "2h"), r"since \(.*\) must be before until"),
    (("--since", "1h", "--until", "0s", "--grace", "2h"), "covers the whole window"),
])
def test_flags_that_do_not_fit_together_are_a_usage_error_the_command_prints_in_one_line(argv, message):
    # A UsageError is a DelayqError: `delayq reconcile` prints it in one line and exits 2, no traceback.
    with pytest.raises(UsageError, match=message):
        options_from_args(parse(*argv), now_ms=NOW)


def test_kafka_options_pass_settings_through_with_java_names():
    settings = Settings(bootstrap_servers="k1:9093,k2:9093", kafka={
        "security.protocol": "SASL_SSL", "sasl.mechanisms": "SCRAM-SHA-512", "sasl.username": "ann",
        "sasl.password": 'p"w', "group.id": "mine", "auto.offset.reset": "latest", "client.id": "recon"})

    got = kafka_source_options(settings, isolation_level="read_committed")

    assert got == {
        "kafka.bootstrap.servers": "k1:9093,k2:9093",
        "kafka.isolation.level": "read_committed",
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "SCRAM-SHA-512",
        "kafka.client.id": "recon",
        "kafka.sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required '
                                  'username="ann" password="p\\"w";',
    }


def test_kafka_options_refuse_credentials_for_a_mechanism_without_a_jaas_module():
    settings = Settings(kafka={"sasl.mechanisms": "OAUTHBEARER", "sasl.username": "ann"})
    with pytest.raises(ValueError, match=r"sasl\.jaas\.config yourself"):
        kafka_source_options(settings, isolation_level="read_committed")


def test_kafka_options_refuse_an_unknown_isolation_level():
    with pytest.raises(ValueError, match="isolation_level 'serializable'"):
        kafka_source_options(Settings(), isolation_level="serializable")


def test_kafka_package_matches_the_installed_pyspark_exactly():
    assert kafka_package() == f"org.apache.spark:spark-sql-kafka-0-10_2.13:{pyspark.__version__}"


def test_ivy_settings_name_one_maven_repository():
    text = ivy_settings_xml("https://mirror.example/maven2")
    assert 'root="https://mirror.example/maven2/"' in text and text.count("<ibiblio") == 1
    with pytest.raises(ValueError, match=r"maven_repository 'mirror\.example'"):
        ivy_settings_xml("mirror.example")
