"""delayq on a secured Kafka and ZooKeeper: SASL_SSL, ACLs, target-topic rules, ZooKeeper ACLs, secrets.

One secured dev stack serves the module, set up only with delayq's own commands, as a
person would: ``delayq dev up --secure``, ``delayq dev user`` for a node, a producer, the
reconciliation, the console and a stranger, ``delayq init`` and ``delayq acls --apply`` as the admin.
Every command and node of the module writes its output into the module's folder, which
the last test searches for the passwords.
"""

from __future__ import annotations

import json
import random
import shlex
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pytest
from confluent_kafka import Message
from confluent_kafka import Producer as KafkaProducer
from confluent_kafka.admin import AdminClient, NewTopic
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from support.kafka_testing import read_topic
from support.process_testing import run_delayq, wait_until

from delayq import Producer, Settings, wire
from delayq.clock import now_ms
from delayq.dev import DevStack
from delayq.paths import cache_dir
from delayq.testing import NodeProcess, free_stack_ports

pytestmark = pytest.mark.slow

CLUSTER = "secured"
# The cluster delivers to orders* and audit; the node's principal may write orders* only (an operator's
# mistake the master must survive: `delayq acls --targets 'orders*'`).
TARGETS = "orders*,audit"
GRANTED = "orders*"


@dataclass
class Secured:
    """The module's secured stack and each principal's settings, as ``delayq dev`` printed them."""

    stack: DevStack
    root: Path
    env: dict[str, dict[str, str]]  # role -> DELAYQ_* variables
    outputs: list[str] = field(default_factory=list)  # every command's output, searched for passwords
    nodes: list[NodeProcess] = field(default_factory=list)

    def settings(self, role: str, **more) -> Settings:
        env = self.env[role]
        kafka = {key.removeprefix("DELAYQ_KAFKA__").lower().replace("_", "."): value
                 for key, value in env.items() if key.startswith("DELAYQ_KAFKA__")}
        return Settings(bootstrap_servers=env["DELAYQ_BOOTSTRAP_SERVERS"], zk_connect=env["DELAYQ_ZK_CONNECT"],
                        zk_auth=env.get("DELAYQ_ZK_AUTH"), kafka=kafka, cluster=CLUSTER,
                        target_topics=TARGETS.split(","),
                        zk_session_timeout_ms=3000, **more)

    def conf(self, role: str) -> dict[str, str]:
        """librdkafka settings of ``role``'s principal."""
        return self.settings(role).kafka_conf()

    def producer(self) -> Producer:
        """delayq.Producer as the producer principal."""
        return Producer({**self.conf("producer"), "delayq.cluster": CLUSTER})

    def run(self, role: str, *args: str, **more_env: str) -> subprocess.CompletedProcess:
        """``delayq ARGS`` as ``role``, in the cluster, its output kept for the password search."""
        result = run_delayq(*args, env={**self.env[role], "DELAYQ_CLUSTER": CLUSTER,
                                        "DELAYQ_TARGET_TOPICS": TARGETS, **more_env})
        self.outputs += [result.stdout, result.stderr]
        return result

    def start_node(self, node_id: str) -> NodeProcess:
        node = NodeProcess(self.settings("node"), node_id, self.root / node_id / "data").start()
        self.nodes.append(node)
        return node

    def passwords(self) -> list[str]:
        """The stack's: each principal's SCRAM password and ZooKeeper's digest password."""
        principals = [self.env[role] for role in ("admin", "node", "producer", "reconcile", "console", "stranger")]
        found = {env["DELAYQ_KAFKA__SASL_PASSWORD"] for env in principals}
        found |= {env["DELAYQ_ZK_AUTH"].partition(":")[2] for env in principals if "DELAYQ_ZK_AUTH" in env}
        return sorted(found)


def exports(text: str) -> dict[str, str]:
    """The variables of ``export NAME=VALUE`` lines, as a shell would read them."""
    found = {}
    for line in text.splitlines():
        if line.startswith("export "):
            name, _, value = line.removeprefix("export ").partition("=")
            found[name] = shlex.split(value)[0] if value else ""
    return found


@pytest.fixture(scope="module")
def secured(tmp_path_factory) -> Secured:
    root = tmp_path_factory.mktemp("secured")
    kafka_port, zk_port = free_stack_ports()
    state = str(root / "stack")
    up = run_delayq("dev", "up", "--secure", "--state-dir", state, "--kafka-port", str(kafka_port),
                    "--zk-port", str(zk_port))
    assert up.returncode == 0, up.stderr
    stack = DevStack(root / "stack")
    env = {"admin": exports(run_delayq("dev", "env", "--secure", "--state-dir", state).stdout)}
    for role, name, extra in (("node", "dq-node", ["--zk"]), ("producer", "orders-app", []),
                              ("reconcile", "dq-reconcile", []), ("console", "dq-console", []),
                              ("stranger", "stranger", [])):
        made = run_delayq("dev", "user", name, "--state-dir", state, *extra)
        assert made.returncode == 0, made.stderr
        env[role] = exports(made.stdout)
    secured = Secured(stack, root, env, outputs=[up.stdout, up.stderr])
    assert secured.run("admin", "init").returncode == 0
    acls = secured.run("admin", "acls", "--node", "User:dq-node", "--producer", "User:orders-app",
                       "--reconcile", "User:dq-reconcile", "--console", "User:dq-console", "--targets", GRANTED,
                       "--apply")
    assert acls.returncode == 0, acls.stderr
    admin = AdminClient(secured.conf("admin"))
    for future in admin.create_topics([NewTopic(t, 3, 1) for t in ("orders", "payments", "audit")]).values():
        future.result(30)
    nodes = [secured.start_node(f"n{i}") for i in range(3)]
    for node in nodes:
        node.wait_ready()
    yield secured
    for node in secured.nodes:
        node.kill()
    stack.down()


def read_as(secured: Secured, role: str, topic: str, **kwargs) -> list:
    group = {"group.id": f"{secured.settings(role).reconcile_group_prefix}-test-{uuid.uuid4().hex[:6]}"}
    conf = {k: v for k, v in secured.conf(role).items() if k not in ("bootstrap.servers", "logger")}
    return read_topic(secured.stack.bootstrap_servers, topic, conf={**conf, **group}, **kwargs)


def delivered_ids(secured: Secured, topic: str, **kwargs) -> set[str]:
    """The delay ids of what was delivered to ``topic`` (read as the reconciliation's principal)."""
    return {dict(r.headers()).get(wire.ID, b"").decode() for r in read_as(secured, "reconcile", topic, **kwargs)}


def read_as_admin(secured: Secured, topic: str, **kwargs) -> list[Message]:
    """``topic`` read from the beginning as the admin (a super-user: no group ACL needed)."""
    conf = {k: v for k, v in secured.conf("admin").items() if k != "bootstrap.servers"}
    return read_topic(secured.stack.bootstrap_servers, topic, conf=conf, **kwargs)


def dead_letters(secured: Secured, **kwargs) -> dict[str, str]:
    """Delay id -> reason header of every dead letter of the cluster (read as the admin)."""
    records = read_as_admin(secured, secured.settings("admin").dead_letter_topic, **kwargs)
    return {record.key().decode(): dict(record.headers())[wire.DEAD_LETTER_REASON].decode() for record in records}


def dead_letter_reason(secured: Secured, delay_id: str, timeout_s: float) -> str:
    """The reason ``delay_id`` was dead-lettered with, once it is (fails the test if it is not within ``timeout_s``)."""
    found: dict[str, str] = {}

    def arrived() -> bool:
        found.update(dead_letters(secured, idle_s=0.5))
        return delay_id in found

    assert wait_until(arrived, timeout_s=timeout_s), f"{delay_id} not dead-lettered within {timeout_s:.0f}s"
    return found[delay_id]


def test_the_stack_enforces_acls_and_the_principals_got_exactly_their_roles(secured):
    stranger = KafkaProducer({**secured.conf("stranger"), "log_level": 0})
    reports = []
    stranger.produce(secured.settings("admin").buffer_topic, b"x", key=b"k", on_delivery=lambda e, m: reports.append(e))
    stranger.flush(20)
    assert [error.name() for error in reports] == ["TOPIC_AUTHORIZATION_FAILED"]

    refused = secured.run("stranger", "produce", "--topic", "orders", "--delay", "1s", "hello")
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1 and "Kafka user 'stranger' may not see it" in refused.stderr
    assert "delayq acls --producer User:stranger --apply" in refused.stderr

    producer = secured.producer()
    reports.clear()
    producer.produce("payments", b"plain, not delayed", on_delivery=lambda e, m: reports.append(e))
    producer.flush(20)
    assert [error.name() for error in reports] == ["TOPIC_AUTHORIZATION_FAILED"]  # it may not write payments


def test_a_put_to_a_topic_outside_target_topics_is_dead_lettered_forbidden_never_delivered(secured):
    producer = secured.producer()
    to_payments = producer.produce("payments", b"pay me", delay=0.5)
    to_orders = producer.produce("orders", b"an order", delay=0.5)
    producer.flush(20)

    reason = dead_letter_reason(secured, to_payments, timeout_s=30)
    assert reason == "forbidden-topic: payments is not in the cluster's target topics (orders*,audit)"
    assert to_orders in delivered_ids(secured, "orders", idle_s=2)
    assert read_as_admin(secured, "payments", idle_s=2, timeout_s=5) == []


def test_an_allowed_target_the_nodes_principal_may_not_write_is_dead_lettered_and_stalls_nothing(secured):
    producer = secured.producer()
    to_audit = producer.produce("audit", b"no ACL for the node", delay=0.2)
    after = producer.produce("orders", b"behind it", delay=0.4)
    producer.flush(20)

    reason = dead_letter_reason(secured, to_audit, timeout_s=60)
    assert reason.startswith("forbidden-topic: Kafka denies the nodes' principal writing to audit"), reason
    assert "delayq acls --node" in reason
    assert wait_until(lambda: after in delivered_ids(secured, "orders", idle_s=0.5), 30)


@pytest.mark.parametrize("target", ["buffer", "__consumer_offsets"])
def test_a_put_into_the_buffer_or_an_internal_topic_is_refused_and_written_raw_dead_lettered(secured, target):
    settings = secured.settings("producer")
    topic = settings.buffer_topic if target == "buffer" else target
    producer = secured.producer()
    with pytest.raises(ValueError, match=f"delayq never delivers to {topic}"):
        producer.produce(topic, b"forged", delay=0.1)

    # The same put, written raw by another Kafka client with the producer's ACLs.
    delay_id = wire.new_delay_id()
    payload = f"forged-{uuid.uuid4().hex}".encode()
    raw = KafkaProducer({**secured.conf("producer"), "log_level": 0})
    partition = wire.buffer_partition(delay_id, producer.buffer_partitions())
    raw.produce(settings.buffer_topic, wire.put_value(now_ms() + 300, topic, None, payload, None), delay_id.encode(),
                partition=partition)
    assert raw.flush(20) == 0

    assert dead_letter_reason(secured, delay_id, timeout_s=30).startswith("forbidden-topic: ")
    if target == "buffer":  # nothing but delayq's own records reached the buffer
        buffer = read_as(secured, "reconcile", settings.buffer_topic, idle_s=2)
        assert not [record for record in buffer if record.value() == payload]


def test_an_unauthenticated_zookeeper_client_can_change_nothing_while_nodes_keep_working(secured):
    root = secured.settings("node").zk_root
    client = KazooClient(hosts=secured.stack.zk_connect)
    client.start(timeout=15)
    try:
        members = client.get_children(f"{root}/nodes")  # reading stays open (status and lookup need it)
        assert len(members) == 3
        election = f"{root}/shards/0/election"
        contenders = client.get_children(election)
        attempts = {
            "delete a node's registration": lambda: client.delete(f"{root}/nodes/{members[0]}"),
            "delete the election lock": lambda: client.delete(f"{election}/{contenders[0]}"),
            "rewrite the epoch": lambda: client.set(f"{root}/shards/0/epoch", b"999"),
            "rewrite the layout": lambda: client.set(f"{root}/layout", b"{}"),
            "register a fake node": lambda: client.create(f"{root}/nodes/fake", b"{}", ephemeral=True),
            "contend for master": lambda: client.create(f"{election}/fake-lock-", b"", ephemeral=True, sequence=True),
            "delete the cluster": lambda: client.delete(root, recursive=True),
        }
        for what, attempt in attempts.items():
            with pytest.raises(NoAuthError):
                attempt()
                pytest.fail(f"an unauthenticated client could {what}")
    finally:
        client.stop()
        client.close()

    producer = secured.producer()
    delay_id = producer.produce("orders", b"still delivered", delay=0.3)
    producer.flush(20)
    assert wait_until(lambda: delay_id in delivered_ids(secured, "orders", idle_s=0.5), 30)


def test_init_with_credentials_protects_a_cluster_created_without_them(secured):
    """A cluster from before ZooKeeper credentials: open znodes, until `delayq init` runs with DELAYQ_ZK_AUTH."""
    legacy = "legacy-open"
    without = {key: value for key, value in secured.env["admin"].items() if key != "DELAYQ_ZK_AUTH"}
    secured.env["admin-without-zk-auth"] = without
    assert secured.run("admin-without-zk-auth", "init", DELAYQ_CLUSTER=legacy).returncode == 0
    client = KazooClient(hosts=secured.stack.zk_connect)
    client.start(timeout=15)
    try:
        client.set(f"/delayq/{legacy}/layout", client.get(f"/delayq/{legacy}/layout")[0])  # open: anyone may write
        protected = secured.run("admin", "init", DELAYQ_CLUSTER=legacy)
        assert protected.returncode == 0, protected.stderr
        assert "open to anyone" in protected.stderr and "now carry the ACL of delayq" in protected.stderr
        for path in (f"/delayq/{legacy}", f"/delayq/{legacy}/layout"):
            with pytest.raises(NoAuthError):
                client.set(path, b"{}")
        with pytest.raises(NoAuthError):
            client.create(f"/delayq/{legacy}/nodes/fake", b"{}", ephemeral=True, makepath=True)
        assert client.get(f"/delayq/{legacy}/layout")[0]  # reading stays open
    finally:
        client.stop()
        client.close()


@pytest.mark.parametrize("credentials", ["dq-node-wrong:pw", None], ids=["wrong", "none"])
def test_a_node_that_zookeeper_refuses_exits_with_one_line(secured, credentials):
    env = {**secured.env["node"], "DELAYQ_NODE_ID": "intruder", "DELAYQ_HTTP_PORT": "0",
           "DELAYQ_DATA_DIR": str(secured.root / "intruder")}
    if credentials is None:
        env.pop("DELAYQ_ZK_AUTH")
    else:
        env["DELAYQ_ZK_AUTH"] = f"delayq:{credentials}"
    secured.env["intruder"] = env
    result = secured.run("intruder", "node")

    # A node's start failures are one ERROR log line and exit code 1 (test_node_commands).
    assert result.returncode == 1, result.stderr
    errors = [line for line in result.stderr.splitlines() if " ERROR " in line]
    assert "Traceback" not in result.stderr and len(errors) == 1, result.stderr
    line = errors[0]
    assert f"ZooKeeper refused {'an unauthenticated client' if credentials is None else 'DELAYQ_ZK_AUTH'}" in line
    assert f"/delayq/{CLUSTER}" in line and "digest user 'delayq'" in line


def test_a_thousand_delayed_messages_with_cancels_deliver_exactly_once_through_a_master_kill(secured, tmp_path):
    since = now_ms()
    producer = secured.producer()
    rng = random.Random(20261125)
    ids = [producer.produce("orders", f"m{i}".encode(), delay=rng.uniform(1.0, 6.0)) for i in range(1000)]
    producer.flush(30)
    cancelled = set(rng.sample(ids, 200))
    for delay_id in cancelled:
        producer.cancel(delay_id)
    producer.flush(30)

    time.sleep(2.5)  # some are delivered, most are not: the master dies in the middle
    master = next(node for node in secured.nodes if node.process.poll() is None and node.mastered())
    master.signal(signal.SIGKILL)
    master.process.wait(10)
    # A node that joins with no store copies a holder's, asking with the proof of the cluster's ZooKeeper
    # credentials: a copy holds every payload, so only the cluster's nodes are given one (store_copies.py).
    joined = secured.start_node("n3")
    joined.wait_ready()
    assert joined.metric("delayq_store_copies_total") >= 1, joined.log_tail()

    wanted = set(ids) - cancelled
    deliveries: list = []

    def all_arrived() -> bool:
        deliveries[:] = [r for r in read_as(secured, "reconcile", "orders", idle_s=1, timeout_s=60)
                         if dict(r.headers()).get(wire.ID, b"").decode() in set(ids)]
        return len({dict(r.headers())[wire.ID].decode() for r in deliveries} & wanted) == len(wanted)

    assert wait_until(all_arrived, timeout_s=90, interval_s=2)
    counts: dict[str, int] = {}
    for record in deliveries:
        delay_id = dict(record.headers())[wire.ID].decode()
        counts[delay_id] = counts.get(delay_id, 0) + 1
    assert [i for i, n in counts.items() if n > 1] == []
    # A cancel that raced its own delivery may lose (the message was due); no other cancelled one arrives.
    assert len(set(counts) & cancelled) <= 5

    status = secured.run("producer", "status", "--json")  # no ZooKeeper credentials needed to read
    assert status.returncode == 0, status.stderr
    assert {node["node_id"] for node in json.loads(status.stdout)["nodes"]} >= {"n0", "n1", "n2"} - {master.node_id}

    window_start = datetime.fromtimestamp(since / 1000 - 1, UTC).isoformat()
    report = secured.run("reconcile", "reconcile", "--since", window_start, "--grace", "0s",
                         "--out", str(secured.root / "report"))
    assert report.returncode == 0, report.stdout[-2000:] + report.stderr[-2000:]
    totals = json.loads((secured.root / "report" / "report.json").read_text())["totals"]
    assert totals["delivered"] >= len(wanted) and totals["duplicates"] == 0 and totals["missing"] == 0
    assert totals["early"] == 0 and totals["unexpected"] == 0 and totals["cancel_ignored"] == 0


def test_the_consoles_principal_indexes_reads_back_and_cancels_and_writes_nothing_but_the_buffer(secured, tmp_path):
    """`delayq acls --console` is all the console needs (index, dead letter and delivery read back, a cancel), no more."""
    from delayq.delay_service.console.index import ConsoleIndex

    producer = secured.producer()
    dead = producer.produce("payments", b"dead on arrival", delay=0.2)
    delivered = producer.produce("orders", b"delivered", delay=0.2)
    pending = producer.produce("orders", b"cancelled from the console", delay=600)
    producer.flush(20)
    assert dead_letter_reason(secured, dead, timeout_s=30).startswith("forbidden-topic: ")
    assert wait_until(lambda: delivered in delivered_ids(secured, "orders", idle_s=0.5), 30)

    index = ConsoleIndex(secured.settings("console"), tmp_path / "index")
    index.start()
    try:
        assert index.wait_caught_up(30)
        letters = [letter for letter in index.dead_letters(limit=50, code="forbidden-topic").items
                   if letter.id == dead]
        assert len(letters) == 1
        record = index.dead_letter_record(letters[0].coordinates)
        assert record is not None and record.key == dead.encode()
        done = [event for event in index.history(delivered) if event.kind == "done"]
        assert done and done[0].version is not None
        delivery = index.find_delivery("orders", delivered, done[0].version, done[0].ts_ms)
        assert delivery is not None and delivery.topic == "orders"

        console = Producer({**secured.conf("console"), "delayq.cluster": CLUSTER})
        console.cancel(pending)
        assert console.flush(20) == 0
        assert wait_until(lambda: "cancel" in {event.kind for event in index.history(pending)}, 20)
    finally:
        index.stop()

    raw = KafkaProducer({**secured.conf("console"), "log_level": 0})
    reports: list = []
    for topic in (secured.settings("console").dead_letter_topic, "orders"):
        raw.produce(topic, b"x", key=b"k", on_delivery=lambda error, _message: reports.append(error))
    raw.flush(20)
    assert [error.name() for error in reports] == ["TOPIC_AUTHORIZATION_FAILED"] * 2


def test_no_password_appears_in_any_output_log_or_report(secured):
    """Last in the module: everything it ran has written its logs, outputs and reports by now."""
    passwords = secured.passwords()
    assert len(passwords) == 7  # six SCRAM users and ZooKeeper's
    texts = {f"output {i}": text for i, text in enumerate(secured.outputs)}
    files = [path for path in secured.root.rglob("*") if path.is_file()
             and path.suffix in (".log", ".html", ".json", ".txt", ".csv", "")
             and "secure" not in path.parts]  # the stack's own credential store holds them by design
    files += [secured.stack.folder / service / f"{service}{kind}" for service in ("kafka", "zookeeper")
              for kind in (".log", ".out")]
    assert files and secured.stack.folder.joinpath("kafka", "kafka.log").exists()
    for path in files:
        texts[str(path)] = path.read_text(errors="replace")
    spark_logs = sorted((cache_dir() / "spark" / "logs").glob("*.log"))
    for path in spark_logs[-3:]:  # the reconciliation this module ran is among the newest
        texts[str(path)] = path.read_text(errors="replace")
    leaks = [(where, password[:4] + "...") for where, text in texts.items() for password in passwords
             if password in text]
    assert leaks == []
