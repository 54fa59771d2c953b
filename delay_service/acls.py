"""The Kafka ACLs each role of a delayq cluster needs, and nothing wider (``delayq acls``).

Four roles, each a Kafka principal:

- a **node** reads the buffer, writes its own records back to it (done markers, restored
  copies, next occurrences), writes the dead-letter topic and the target topics in
  transactions, and commits the dead-letter ledger's mark in those transactions;
- a **producer** writes puts, cancels and reschedules to the buffer;
- the **reconciliation** reads the buffer, the dead-letter topic and the target topics;
- the **console** (``delayq console``) indexes the buffer and the dead-letter topic, reads a
  delivery back from its target topic, and writes cancels, reschedules and replays to the
  buffer; it never writes the dead-letter topic or a target topic itself.

Prefixed resources are used only where a role owns a family of names: the shard masters'
transactional ids (``delayq-<cluster>-master``, ``-1``, ``-2``, ...) and the reconciliation's
consumer groups (Spark's ``groupIdPrefix``). Target topics come from glob patterns
(``target_topics``): a name is a literal resource, ``orders*`` a prefixed one, ``*`` Kafka's
wildcard; any other glob has no ACL form and is refused.

Idempotent producers need no cluster ``IdempotentWrite`` ACL on brokers from 2.8 on (WRITE
on a topic allows it, KIP-679), so none is granted. Nor is ``DESCRIBE`` on a topic: Kafka
implies it from ``READ`` and ``WRITE`` (metadata, end offsets, offsets by time).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from delayq.errors import ConfigurationError, UnavailableError
from delayq.settings import Settings

# What Kafka's principal builder produces for SASL users, and what an operator writes in kafka-acls.
PRINCIPAL = re.compile(r"[A-Za-z]+:[^\s:][^\s]*")
ROLES = ("node", "producer", "reconcile", "console")


@dataclass(frozen=True)
class AclLine:
    """One ALLOW ACL: ``principal`` may do ``operation`` on the ``resource`` named ``name`` (``pattern``)."""

    role: str
    principal: str
    operation: str  # confluent_kafka.admin.AclOperation's name: READ, WRITE, DESCRIBE_CONFIGS
    resource: str   # ResourceType's name: TOPIC, GROUP, TRANSACTIONAL_ID
    name: str
    pattern: str    # ResourcePatternType's name: LITERAL, PREFIXED
    reason: str

    def text(self) -> str:
        return (f"{self.principal:<16} ALLOW {self.operation:<16} {self.resource.lower():<16} "
                f"{self.pattern.lower():<8} {self.name:<32} # {self.reason}")


def target_resources(patterns: list[str]) -> list[tuple[str, str]]:
    """(name, pattern type) of the topic resources covering each of ``patterns``.

    Raises:
        ConfigurationError: a glob with no ACL form (a wildcard other than one trailing ``*``).
    """
    resources = []
    for pattern in patterns:
        if pattern == "*":
            resources.append(("*", "LITERAL"))  # Kafka's wildcard resource
        elif not re.search(r"[*?\[\]!]", pattern):
            resources.append((pattern, "LITERAL"))
        elif pattern.endswith("*") and not re.search(r"[*?\[\]!]", pattern[:-1]):
            resources.append((pattern[:-1], "PREFIXED"))
        else:
            raise ConfigurationError(
                f"target topic pattern {pattern!r} has no Kafka ACL form (Kafka knows names, prefixes and '*'): "
                f"list the topics, or use a prefix ending in '*', in --targets or DELAYQ_TARGET_TOPICS")
    return resources


def check_principal(principal: str, role: str) -> str:
    """Raises: ConfigurationError: ``principal`` is not ``Type:name`` (``User:orders-node``)."""
    if not PRINCIPAL.fullmatch(principal):
        raise ConfigurationError(f"--{role} {principal!r} is not a Kafka principal: write it as User:NAME "
                                 f"(the SASL user name), e.g. --{role} User:delayq-node")
    return principal


def required_acls(settings: Settings, *, node: str | None = None, producer: str | None = None,
                  reconcile: str | None = None, console: str | None = None,
                  targets: list[str] | None = None) -> list[AclLine]:
    """The ACLs of each given role's principal for the cluster ``settings`` name.

    ``targets`` (default: the cluster's ``target_topics``) are the topic patterns the node
    delivers to and the reconciliation and the console read.

    Raises:
        ConfigurationError: no role given, a principal that is not ``Type:name``, or a
            target pattern with no ACL form.
    """
    if node is None and producer is None and reconcile is None and console is None:
        raise ConfigurationError("name at least one role's principal: --node User:N, --producer User:P, "
                                 "--reconcile User:R or --console User:C")
    buffer, dead = settings.buffer_topic, settings.dead_letter_topic
    topics = target_resources(targets if targets is not None else settings.target_topics)
    lines: list[AclLine] = []
    if node is not None:
        p = check_principal(node, "node")
        lines += [
            AclLine("node", p, "READ", "TOPIC", buffer, "LITERAL", "ingest: every node reads the whole buffer"),
            AclLine("node", p, "WRITE", "TOPIC", buffer, "LITERAL",
                    "the master's done markers, restored copies and next occurrences"),
            AclLine("node", p, "DESCRIBE_CONFIGS", "TOPIC", buffer, "LITERAL",
                    "a node reads the buffer's compaction settings at start"),
            AclLine("node", p, "WRITE", "TOPIC", dead, "LITERAL", "undeliverable and malformed records"),
            AclLine("node", p, "READ", "GROUP", settings.dead_letter_group, "LITERAL",
                    "the dead-letter ledger's mark, committed in the master's transactions"),
            AclLine("node", p, "DESCRIBE", "GROUP", settings.ingest_group_prefix, "PREFIXED",
                    "each node's buffer reader names a group (it never commits; librdkafka looks it up)"),
            AclLine("node", p, "WRITE", "TRANSACTIONAL_ID", settings.transactional_id(0), "PREFIXED",
                    "each shard master's transactional producer (-1, -2, ... for shards 1, 2, ...)"),
        ]
        lines += [AclLine("node", p, "WRITE", "TOPIC", name, pattern,
                          "delivery to the target topics (target_topics; delayq refuses its own and __ topics)")
                  for name, pattern in topics]
    if producer is not None:
        p = check_principal(producer, "producer")
        lines.append(AclLine("producer", p, "WRITE", "TOPIC", buffer, "LITERAL",
                             "puts, cancels and reschedules (delayq.Producer, any Kafka client)"))
    if reconcile is not None:
        p = check_principal(reconcile, "reconcile")
        lines += [
            AclLine("reconcile", p, "READ", "TOPIC", buffer, "LITERAL", "every put, cancel and done"),
            AclLine("reconcile", p, "READ", "TOPIC", dead, "LITERAL", "the dead letters"),
            AclLine("reconcile", p, "READ", "GROUP", settings.reconcile_group_prefix, "PREFIXED",
                    "Spark's Kafka source consumers (groupIdPrefix)"),
            *(AclLine("reconcile", p, operation, "TOPIC", settings.reconcile_findings_topic, "LITERAL", why)
              for operation, why in (("CREATE", "--follow creates its findings topic on its first run"),
                                     ("WRITE", "--follow reports each finding there"),
                                     ("READ", "--follow reads its findings back when it starts"))),
            AclLine("reconcile", p, "WRITE", "TRANSACTIONAL_ID", settings.reconcile_transactional_id_prefix,
                    "PREFIXED", "--follow writes each micro-batch's findings in one transaction"),
        ]
        lines += [AclLine("reconcile", p, "READ", "TOPIC", name, pattern, "the deliveries, to prove them")
                  for name, pattern in topics]
    if console is not None:
        lines += console_acls(settings, check_principal(console, "console"), topics)
    return lines


def console_acls(settings: Settings, principal: str, topics: list[tuple[str, str]]) -> list[AclLine]:
    """The console's: read the buffer and the dead letters, write the buffer, read the deliveries back.

    Its readers are assigned partitions and never join or commit, so the one group they name
    needs DESCRIBE only (librdkafka looks it up), the node's ingest readers' case.
    """
    # The index module loads RocksDB: only `delayq acls --console` pays for that import.
    from .console.index import consumer_group

    return [
        AclLine("console", principal, "READ", "TOPIC", settings.buffer_topic, "LITERAL",
                "its index of every id's history and the live series; a reschedule reads its put back"),
        AclLine("console", principal, "WRITE", "TOPIC", settings.buffer_topic, "LITERAL",
                "cancel, reschedule and replay (console actions), through its own idempotent producer"),
        AclLine("console", principal, "READ", "TOPIC", settings.dead_letter_topic, "LITERAL",
                "its index of the dead letters; a replay reads its dead letter back"),
        AclLine("console", principal, "DESCRIBE", "GROUP", consumer_group(settings), "LITERAL",
                "its readers name a group (librdkafka insists); they are assigned partitions, never commit"),
        *(AclLine("console", principal, "READ", "TOPIC", name, pattern,
                  "a message's history shows its delivery's place, read back around its done")
          for name, pattern in topics),
    ]


def apply_acls(settings: Settings, lines: list[AclLine], timeout_s: float = 30.0) -> int:
    """Create ``lines`` through the Admin API (an existing ACL is left as it is); returns how many.

    Raises:
        UnavailableError: Kafka refused (the principal running this is no ACL admin) or did not answer.
    """
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
    )

    bindings = [AclBinding(ResourceType[line.resource], line.name, ResourcePatternType[line.pattern],
                           line.principal, "*", AclOperation[line.operation], AclPermissionType.ALLOW)
                for line in lines]
    admin = AdminClient(settings.kafka_conf())
    try:
        for future in admin.create_acls(bindings, request_timeout=timeout_s).values():
            future.result(timeout=timeout_s)
    except Exception as err:
        first = err.args[0] if err.args else err
        # A KafkaError's code says it; its text may be a broker's whole request dump.
        said = first.name() if hasattr(first, "name") else str(first)[:200]
        raise UnavailableError(f"Kafka at {settings.bootstrap_servers} did not create the ACLs ({said}): run "
                               "this as a principal allowed to alter ACLs (the cluster admin)") from None
    return len(bindings)
