"""What `delayq acls` grants each role, and the ZooKeeper ACL of a cluster's znodes."""

from __future__ import annotations

import re

import pytest
from kazoo.security import Permissions

from delayq import Settings
from delayq.delay_service.acls import required_acls, target_resources
from delayq.delay_service.console.index import consumer_group
from delayq.election.access import cluster_acl, parent_acl
from delayq.errors import ConfigurationError


def granted(lines) -> set[tuple[str, str, str, str, str]]:
    return {(line.principal, line.operation, line.resource, line.name, line.pattern) for line in lines}


def test_each_role_gets_exactly_its_acls_prefixed_only_for_transactional_ids_and_groups():
    settings = Settings(cluster="orders", target_topics=["orders.*", "audit"])
    lines = required_acls(settings, node="User:n", producer="User:p", reconcile="User:r")

    assert granted(lines) == {
        ("User:n", "READ", "TOPIC", "delayq-orders-buffer", "LITERAL"),
        ("User:n", "WRITE", "TOPIC", "delayq-orders-buffer", "LITERAL"),
        ("User:n", "DESCRIBE_CONFIGS", "TOPIC", "delayq-orders-buffer", "LITERAL"),
        ("User:n", "WRITE", "TOPIC", "delayq-orders-dead-letter", "LITERAL"),
        ("User:n", "READ", "GROUP", "delayq-orders-dead-letters", "LITERAL"),
        ("User:n", "DESCRIBE", "GROUP", "delayq-orders-ingest-", "PREFIXED"),
        ("User:n", "WRITE", "TRANSACTIONAL_ID", "delayq-orders-master", "PREFIXED"),
        ("User:n", "WRITE", "TOPIC", "orders.", "PREFIXED"),
        ("User:n", "WRITE", "TOPIC", "audit", "LITERAL"),
        ("User:p", "WRITE", "TOPIC", "delayq-orders-buffer", "LITERAL"),
        ("User:r", "READ", "TOPIC", "delayq-orders-buffer", "LITERAL"),
        ("User:r", "READ", "TOPIC", "delayq-orders-dead-letter", "LITERAL"),
        ("User:r", "READ", "GROUP", "delayq-orders-reconcile", "PREFIXED"),
        ("User:r", "CREATE", "TOPIC", "delayq-orders-reconcile-findings", "LITERAL"),
        ("User:r", "WRITE", "TOPIC", "delayq-orders-reconcile-findings", "LITERAL"),
        ("User:r", "READ", "TOPIC", "delayq-orders-reconcile-findings", "LITERAL"),
        ("User:r", "WRITE", "TRANSACTIONAL_ID", "delayq-orders-reconcile-follow-", "PREFIXED"),
        ("User:r", "READ", "TOPIC", "orders.", "PREFIXED"),
        ("User:r", "READ", "TOPIC", "audit", "LITERAL"),
    }
    assert all(line.reason for line in lines)
    # The names the ACLs grant are the ones the code uses.
    assert settings.transactional_id(3).startswith("delayq-orders-master")
    assert settings.ingest_group.startswith("delayq-orders-ingest-")
    assert settings.reconcile_findings_topic == "delayq-orders-reconcile-findings"


def test_the_console_reads_the_buffer_the_dead_letters_and_the_deliveries_and_writes_the_buffer_only():
    settings = Settings(cluster="orders", target_topics=["orders.*", "audit"])
    lines = required_acls(settings, console="User:c")

    assert granted(lines) == {
        ("User:c", "READ", "TOPIC", "delayq-orders-buffer", "LITERAL"),
        ("User:c", "WRITE", "TOPIC", "delayq-orders-buffer", "LITERAL"),
        ("User:c", "READ", "TOPIC", "delayq-orders-dead-letter", "LITERAL"),
        ("User:c", "DESCRIBE", "GROUP", consumer_group(settings), "LITERAL"),
        ("User:c", "READ", "TOPIC", "orders.", "PREFIXED"),
        ("User:c", "READ", "TOPIC", "audit", "LITERAL"),
    }
    assert {line.role for line in lines} == {"console"} and all(line.reason for line in lines)
    # The one group its consumers name, nothing prefixed beyond the targets; never a write outside the buffer,
    # never a transactional id, nothing on the cluster (its idempotent producer needs none on Kafka 2.8+).
    assert consumer_group(settings).startswith("delayq-orders-")
    assert {(line.operation, line.name) for line in lines if line.operation == "WRITE"} == \
        {("WRITE", "delayq-orders-buffer")}
    assert not {line.resource for line in lines} & {"TRANSACTIONAL_ID", "CLUSTER"}


def test_the_console_role_adds_to_the_others_for_one_principal():
    settings = Settings(cluster="orders")
    node = granted(required_acls(settings, node="User:n"))
    both = granted(required_acls(settings, node="User:n", console="User:n"))

    # The nodes serving /console (DELAYQ_CONSOLE) run as the nodes' principal: it gets what the console reads.
    assert ("User:n", "READ", "TOPIC", "delayq-orders-dead-letter", "LITERAL") in both - node
    assert node < both


def test_targets_given_on_the_command_line_replace_the_settings_and_star_is_kafkas_wildcard():
    lines = required_acls(Settings(cluster="c"), producer=None, node="User:n", targets=["*"])
    assert ("User:n", "WRITE", "TOPIC", "*", "LITERAL") in granted(lines)
    assert target_resources(["a", "b*", "*"]) == [("a", "LITERAL"), ("b", "PREFIXED"), ("*", "LITERAL")]


@pytest.mark.parametrize("pattern", ["a?b", "or*ders", "audit.[ab]", "*.events"])
def test_a_glob_kafka_cannot_express_is_refused_naming_it(pattern):
    with pytest.raises(ConfigurationError, match=re.escape(f"target topic pattern '{pattern}' has no Kafka ACL form")):
        target_resources([pattern])


def test_a_role_needs_a_principal_written_type_colon_name():
    with pytest.raises(ConfigurationError, match="--node 'node' is not a Kafka principal: write it as User:NAME"):
        required_acls(Settings(), node="node")
    with pytest.raises(ConfigurationError, match="--console 'console' is not a Kafka principal"):
        required_acls(Settings(), console="console")
    with pytest.raises(ConfigurationError, match=r"name at least one role's principal: .* or --console User:C"):
        required_acls(Settings())


def test_a_clusters_znodes_give_all_rights_to_its_credentials_and_read_to_anyone():
    assert cluster_acl(None) is None  # no credentials: ZooKeeper's open default, as before
    owner, everyone = cluster_acl("delayq:s3cret")
    assert owner.id.scheme == "digest" and owner.id.id.startswith("delayq:") and owner.perms == Permissions.ALL
    assert "s3cret" not in owner.id.id  # the digest, never the password
    assert (everyone.id.scheme, everyone.id.id, everyone.perms) == ("world", "anyone", Permissions.READ)
    shared = parent_acl("delayq:s3cret")[1]
    assert shared.perms == Permissions.READ | Permissions.CREATE  # another cluster may make its folder
