"""Clients other than delayq's own write the buffer by docs/DESIGN.md "Wire format", against real nodes.

kcat runs docs/examples/delayq-kcat.sh (the DESIGN's kcat example, runnable); the plain Java
KafkaProducer runs docs/examples/DelayqProducer.java, compiled here against the cached
kafka-clients jar; franz-go, a pure-Go client, runs docs/examples/go, built with `go build`. None may be
skipped: if kcat, javac or go cannot be had, the tests fail and say why.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import time
from pathlib import Path

import pytest
from support.kafka_testing import create_topics, read_topic
from support.process_testing import wait_until
from support.service_testing import now_ms

import delayq
from delayq import wire
from delayq.delay_service.partitioners import partition_for
from delayq.dev import StackError
from delayq.dev.go_client import build_go
from delayq.dev.java_client import compile_java, run_java
from delayq.dev.kcat import KcatError, ensure_kcat

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "docs" / "examples"
KCAT_EXAMPLE = EXAMPLES / "delayq-kcat.sh"
DESIGN = ROOT / "docs" / "DESIGN.md"
# Lines the DESIGN's kcat example and the runnable script share word for word.
SHARED_KCAT_LINES = (
    """python3 -c 'import sys, zlib; print(zlib.crc32(sys.argv[1].encode()) % int(sys.argv[2]))'""",
    """printf 'put %s %s %s%s\\n%s%s' "$DUE" "$TOPIC" "$KEYLEN" "${OPTIONS:+ $OPTIONS}" "$KEY" "$PAYLOAD" \\""",
    """-P -b "$BROKERS" -X enable.idempotence=true -t "$BUFFER" -p "$P" -k "$ID" -D '\\x1e'""",
    """echo "$ID:" |""",
    """-P -b "$BROKERS" -X enable.idempotence=true -t "$BUFFER" -p "$P" -K: -Z -H delayq-op=cancel -H "delayq-id=$ID\"""",
)


def live(request):
    capture = request.config.pluginmanager.getplugin("capturemanager")

    def say(text: str) -> None:
        with capture.global_and_fixture_disabled():
            print(text, flush=True)
    return say


@pytest.fixture(scope="session")
def kcat(request) -> Path:
    try:
        return ensure_kcat(say=live(request))
    except KcatError as err:
        problem = str(err)
    pytest.fail(f"kcat could not be obtained: {problem}", pytrace=False)


@pytest.fixture(scope="session")
def java_example(request, tmp_path_factory) -> list[Path]:
    """The class path to run DelayqProducer with, compiled from docs/examples."""
    try:
        return compile_java(EXAMPLES / "DelayqProducer.java", tmp_path_factory.mktemp("java-example"),
                            say=live(request))
    except StackError as err:
        problem = str(err)
    pytest.fail(f"the Java example could not be compiled: {problem}", pytrace=False)


def printed_id(result: subprocess.CompletedProcess, command: str, args: tuple[str, ...]) -> str:
    """The delay id an example client printed last, once it succeeded."""
    assert result.returncode == 0, f"{command} {' '.join(args)} failed ({result.returncode}):\n{result.stderr}"
    return result.stdout.strip().splitlines()[-1]


def kcat_example(kcat: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """Run docs/examples/delayq-kcat.sh ARGS with this kcat; the delay id it prints."""
    result = subprocess.run(["bash", str(KCAT_EXAMPLE), *args], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "KCAT": str(kcat), **(env or {})})
    return printed_id(result, "delayq-kcat.sh", args)


@pytest.fixture(scope="session")
def go_example(request, tmp_path_factory) -> Path:
    """The Go example (docs/examples/go, franz-go) built."""
    try:
        return build_go(EXAMPLES / "go", tmp_path_factory.mktemp("go-example") / "delayq-producer", say=live(request))
    except StackError as err:
        problem = str(err)
    pytest.fail(f"the Go example could not be built: {problem}", pytrace=False)


def go(executable: Path, *args: str) -> str:
    return printed_id(subprocess.run([str(executable), *args], capture_output=True, text=True, timeout=60),
                      "delayq-producer", args)


def java(classpath: list[Path], *args: str) -> str:
    return printed_id(run_java(classpath, "DelayqProducer", *args), "DelayqProducer", args)


def pending_due(node, delay_id: str) -> int:
    """The due time of ``delay_id``, once ``node`` has it pending."""
    assert wait_until(lambda: node.get(f"/v1/messages/{delay_id}")[0] == 200, timeout_s=10), \
        f"{delay_id} never became pending on {node.node_id}"
    return node.get_json(f"/v1/messages/{delay_id}")[1]["deliver_at_ms"]


def headers(record) -> dict[str, bytes]:
    return dict(record.headers() or [])


def by_id(records) -> dict[str, list]:
    found: dict[str, list] = {}
    for record in records:
        found.setdefault(headers(record)[wire.ID].decode(), []).append(record)
    return found


def buffer_records(settings, delay_id: str) -> list:
    return [r for r in read_topic(settings.bootstrap_servers, settings.buffer_topic, idle_s=0.5, timeout_s=10)
            if r.key() == delay_id.encode()]


def test_the_design_shows_the_kcat_example_that_runs():
    design, script = DESIGN.read_text(), KCAT_EXAMPLE.read_text()
    for line in SHARED_KCAT_LINES:
        assert line in script, f"docs/examples/delayq-kcat.sh lacks: {line}"
        assert line in design, f"docs/DESIGN.md's kcat example differs from docs/examples/delayq-kcat.sh: {line}"


def test_a_kcat_put_is_delivered_like_the_python_producers(cluster, settings, names, kcat):
    target = names.topic("target")
    create_topics(settings.bootstrap_servers, [target], partitions=3)
    cluster.start("node-a")
    user_headers = [("trace", b"abc"), ("lang", b"kcat")]

    producer = delayq.Producer({"bootstrap.servers": settings.bootstrap_servers, "delayq.cluster": settings.cluster})
    by_python = producer.produce(target, b'{"order":17}', b"order-17", headers=user_headers, delay=2.0)
    producer.flush(10)
    before = now_ms()
    by_kcat = kcat_example(kcat, "put", settings.bootstrap_servers, settings.buffer_topic, target, "2000",
                           '{"order":17}', "order-17", "trace=abc", "lang=kcat")
    after = now_ms()
    # kcat's default partitioner for a keyed record (consistent_random) is the buffer's rule: no -p needed.
    unpinned = wire.new_delay_id()
    frame = f"put {now_ms() + 1500} {target} -\nunpinned".encode()
    subprocess.run([str(kcat), "-P", "-b", settings.bootstrap_servers, "-t", settings.buffer_topic, "-k", unpinned,
                    "-D", r"\x1e"], input=frame, check=True, timeout=30)

    delivered = by_id(read_topic(settings.bootstrap_servers, target, expect=3, timeout_s=30, idle_s=1))

    assert set(delivered) == {by_python, by_kcat, unpinned}
    assert all(len(records) == 1 for records in delivered.values()), "a message was delivered twice"
    python_record, kcat_record = delivered[by_python][0], delivered[by_kcat][0]
    for record in (python_record, kcat_record):
        assert (record.topic(), record.key(), record.value()) == (target, b"order-17", b'{"order":17}')
        assert record.headers()[:2] == user_headers
        assert [name for name, _ in record.headers()[2:]] == [wire.ID, wire.DELIVER_AT, wire.EPOCH, wire.VERSION]
        due = int(headers(record)[wire.DELIVER_AT])
        assert record.timestamp()[1] >= due, f"delivered {due - record.timestamp()[1]} ms early"
    assert kcat_record.partition() == python_record.partition() == partition_for(b"order-17", 3, None)
    kcat_due = int(headers(kcat_record)[wire.DELIVER_AT])
    assert before + 2000 <= kcat_due <= after + 2000
    [put] = [r for r in buffer_records(settings, by_kcat) if r.value() is not None]  # and the master's done
    assert put.partition() == wire.buffer_partition(by_kcat, settings.buffer_partitions)
    assert headers(kcat_record)[wire.VERSION] == str(put.offset()).encode()
    assert {r.partition() for r in buffer_records(settings, unpinned)} == {
        wire.buffer_partition(unpinned, settings.buffer_partitions)}
    assert delivered[unpinned][0].value() == b"unpinned" and delivered[unpinned][0].key() is None


def test_a_kcat_repeating_message_is_delivered_once_per_occurrence(cluster, settings, names, kcat):
    target = names.topic("target")
    create_topics(settings.bootstrap_servers, [target])
    cluster.start("node-a")
    series = kcat_example(kcat, "put", settings.bootstrap_servers, settings.buffer_topic, target, "300", "tick",
                          env={"OPTIONS": "every=700 times=3"})
    retry = kcat_example(kcat, "put", settings.bootstrap_servers, settings.buffer_topic, target, "300", "again",
                         env={"OPTIONS": "attempt=2"})

    delivered = by_id(read_topic(settings.bootstrap_servers, target, expect=4, timeout_s=30, idle_s=1.5))

    assert [headers(r).get(wire.OCCURRENCE) for r in delivered[series]] == [b"1", b"2", b"3"]
    dues = [int(headers(r)[wire.DELIVER_AT]) for r in delivered[series]]
    assert [b - a for a, b in itertools.pairwise(dues)] == [700, 700]
    assert [(r.value(), headers(r).get(wire.ATTEMPT)) for r in delivered[retry]] == [(b"again", b"2")]


def test_a_kcat_cancel_of_a_pending_put_wins(cluster, settings, names, kcat):
    target = names.topic("target")
    create_topics(settings.bootstrap_servers, [target])
    node = cluster.start("node-a")
    bootstrap, buffer = settings.bootstrap_servers, settings.buffer_topic
    cancelled = kcat_example(kcat, "put", bootstrap, buffer, target, "3000", "cancelled")
    kept = kcat_example(kcat, "put", bootstrap, buffer, target, "2500", "kept")
    due = pending_due(node, cancelled)

    assert kcat_example(kcat, "cancel", bootstrap, buffer, cancelled) == cancelled
    assert now_ms() < due, "the cancel was not acknowledged before the due time: the test proves nothing"

    assert wait_until(lambda: node.get(f"/v1/messages/{cancelled}")[0] == 404, timeout_s=5)
    records = read_topic(bootstrap, target, expect=1, timeout_s=15, idle_s=0.5)
    time.sleep(max(0.0, (due + 1500 - now_ms()) / 1000))  # well past the cancelled one's due time
    records = read_topic(bootstrap, target, idle_s=1, timeout_s=15)
    assert [(headers(r)[wire.ID].decode(), r.value()) for r in records] == [(kept, b"kept")]
    [put, cancel] = buffer_records(settings, cancelled)
    assert cancel.value() is None and cancel.partition() == put.partition()
    assert node.metric("delayq_dead_lettered_total") == 0


def test_a_kcat_cancel_on_the_wrong_partition_is_dead_lettered_once_and_cancels_nothing(cluster, settings, names,
                                                                                       kcat):
    target = names.topic("target")
    create_topics(settings.bootstrap_servers, [target])
    for node_id in ("node-a", "node-b"):
        cluster.start(node_id, wait=False)
    for node in cluster.nodes.values():
        node.wait_ready()
    bootstrap, buffer = settings.bootstrap_servers, settings.buffer_topic
    delay_id = kcat_example(kcat, "put", bootstrap, buffer, target, "2500", "still delivered")
    right = wire.buffer_partition(delay_id, settings.buffer_partitions)
    wrong = (right + 1) % settings.buffer_partitions
    subprocess.run([str(kcat), "-P", "-b", bootstrap, "-t", buffer, "-p", str(wrong), "-K:", "-Z",
                    "-H", "delayq-op=cancel", "-H", f"delayq-id={delay_id}"],
                   input=f"{delay_id}:\n".encode(), check=True, timeout=30)

    delivered = read_topic(bootstrap, target, expect=1, timeout_s=20, idle_s=2)
    dead = [r for r in read_topic(bootstrap, settings.dead_letter_topic, expect=1, timeout_s=20, idle_s=2)
            if r.key() == delay_id.encode()]

    assert [(headers(r)[wire.ID].decode(), r.value()) for r in delivered] == [(delay_id, b"still delivered")]
    assert len(dead) == 1, f"the wrong-partition cancel was dead-lettered {len(dead)} times, not once"
    [cancel] = [r for r in buffer_records(settings, delay_id) if r.partition() == wrong]
    reason = headers(dead[0])[wire.DEAD_LETTER_REASON].decode()
    assert reason.startswith("wrong-partition: "), reason
    assert wire.Reason.of(reason) is wire.Reason.WRONG_PARTITION
    assert headers(dead[0])[wire.DEAD_LETTER_SOURCE] == f"{buffer}/{wrong}/{cancel.offset()}".encode()
    assert dead[0].value() is None and headers(dead[0])[wire.OP] == b"cancel"


def test_the_java_and_go_examples_put_and_cancel(cluster, settings, names, java_example, go_example):
    target = names.topic("target")
    create_topics(settings.bootstrap_servers, [target], partitions=3)
    node = cluster.start("node-a")
    bootstrap, buffer = settings.bootstrap_servers, settings.buffer_topic
    clients = {"java": lambda *args: java(java_example, *args), "go": lambda *args: go(go_example, *args)}
    keys = {"java": b"order-9", "go": b"order-7"}
    cancelled, cancelled_due, kept, kept_at = {}, {}, {}, {}
    for name, client in clients.items():
        # 15 s: each java() starts a JVM, which on a busy 2-core CI machine has taken over 5 s.
        cancelled[name] = client(bootstrap, buffer, target, "15000", "cancelled", keys[name].decode())
        cancelled_due[name] = pending_due(node, cancelled[name])
        assert client("--cancel", bootstrap, buffer, cancelled[name]) == cancelled[name]
        assert now_ms() < cancelled_due[name], (f"{name}: the cancel was not acknowledged before the due time: the "
                                                "test proves nothing")
        kept_at[name] = now_ms()
        kept[name] = client(bootstrap, buffer, target, "1000", f"from {name}", keys[name].decode())

    read_topic(bootstrap, target, expect=len(clients), timeout_s=20, idle_s=0.5)
    time.sleep(max(0.0, (max(cancelled_due.values()) + 1500 - now_ms()) / 1000))  # well past the cancelled ones' due
    records = read_topic(bootstrap, target, idle_s=1, timeout_s=15)

    assert sorted((headers(r)[wire.ID].decode(), r.key(), r.value()) for r in records) == sorted(
        (kept[name], keys[name], f"from {name}".encode()) for name in clients)
    for record in records:
        name = record.value().decode().removeprefix("from ")
        due = int(headers(record)[wire.DELIVER_AT])
        assert kept_at[name] + 1000 <= due and record.timestamp()[1] >= due
        # Beside the client's immediate messages of the same key: Java's and franz-go's partitioner, murmur2.
        assert record.partition() == partition_for(keys[name], 3, "murmur2_random"), name
    for delay_id in [*kept.values(), *cancelled.values()]:
        assert {r.partition() for r in buffer_records(settings, delay_id)} == {
            wire.buffer_partition(delay_id, settings.buffer_partitions)}
