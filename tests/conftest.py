"""Session fixtures: a real Kafka and ZooKeeper from `delayq dev`, and unique names per test."""

from __future__ import annotations

import os
import re
import uuid
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings

from delayq import Settings
from delayq.dev import DevStack, StackError

# Property-based tests (tests/unit/delayq/test_fuzz_parsers.py). "ci", the default, is reproducible (the same
# examples every run, no example database left behind) and has no per-example deadline, which a slow
# shared machine would trip; `pytest --hypothesis-profile=explore` searches longer, from fresh seeds.
hypothesis_settings.register_profile("ci", derandomize=True, database=None, deadline=None, max_examples=200,
                                     suppress_health_check=[HealthCheck.too_slow])
hypothesis_settings.register_profile("explore", database=None, deadline=None, max_examples=5000,
                                     suppress_health_check=[HealthCheck.too_slow])
hypothesis_settings.load_profile("ci")


# Every topic a test makes is named from its Names prefix ("t-test-...", and "delayq-t-test-..." for its
# cluster's buffer and dead-letter topics).
TEST_TOPIC = re.compile(r"^(delayq-)?t-test-")
# The prefixes of this session's tests, whose topics go when the session ends.
_SESSION_PREFIXES: set[str] = set()


def delete_test_topics(bootstrap: str, wanted) -> int:
    """Delete the topics tests made for which ``wanted(name)`` holds; how many were asked to go.

    The dev stack's state outlives a session: without this, every run of the suite leaves
    thousands of partitions behind, until the broker runs out of file handles.
    """
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        topics = admin.list_topics(timeout=30).topics
    except KafkaException as err:  # the broker away: the next session that starts it tries again
        print(f"test topics not deleted: {err.args[0].str()}")
        return 0
    doomed = [name for name in topics if TEST_TOPIC.match(name) and wanted(name)]
    for start in range(0, len(doomed), 500):
        for future in admin.delete_topics(doomed[start:start + 500], operation_timeout=60).values():
            try:
                future.result()
            except Exception as err:  # gone already, or the broker busy: the next session tries again
                print(f"leaving a test topic: {err}")
    return len(doomed)


@pytest.fixture(scope="session")
def dev_stack() -> DevStack:
    """The embedded stack, started if it is not running; stopped at the end only if this session started it.

    A session that started the stack is its only user: it first deletes the topics earlier
    sessions' tests left. Every session deletes its own tests' topics when it ends.
    """
    stack = DevStack()
    try:
        started = stack.up(say=lambda text: print(text))
    except StackError as err:
        pytest.fail(f"the embedded Kafka + ZooKeeper stack could not start: {err}", pytrace=False)
    if "kafka" in started:
        left = delete_test_topics(stack.bootstrap_servers, lambda name: True)
        if left:
            print(f"deleted {left} topics earlier test sessions left on the dev stack")
    yield stack
    delete_test_topics(stack.bootstrap_servers,
                       lambda name: any(name.removeprefix("delayq-").startswith(p) for p in _SESSION_PREFIXES))
    if started and not os.environ.get("DELAYQ_TEST_KEEP_STACK"):
        stack.down(tuple(started))


@dataclass
class Names:
    """Unique names for one test, so tests never collide on topics or ZooKeeper paths."""

    prefix: str

    @property
    def cluster(self) -> str:
        return self.prefix

    def topic(self, role: str = "topic") -> str:
        return f"{self.prefix}-{role}"

    @property
    def zk_root(self) -> str:
        return f"/delayq-test/{self.prefix}"


@pytest.fixture
def names(request) -> Names:
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40]
    names = Names(f"t-{slug}-{uuid.uuid4().hex[:8]}")
    _SESSION_PREFIXES.add(names.prefix)
    return names


@pytest.fixture
def settings(dev_stack: DevStack, names: Names, tmp_path, request) -> Settings:
    """Settings for one test: the dev stack's addresses, a cluster (and so topics and ZK root) of its own.

    ``@pytest.mark.settings(field=value, ...)`` on a test changes fields for that test.
    """
    marker = request.node.get_closest_marker("settings")
    return Settings(**{
        "bootstrap_servers": dev_stack.bootstrap_servers,
        "zk_connect": dev_stack.zk_connect,
        "cluster": names.cluster,
        "data_dir": tmp_path / "data",
        "buffer_partitions": 3,
        "zk_session_timeout_ms": 3000,
        **(marker.kwargs if marker else {}),
    })


@pytest.fixture
def cluster(settings: Settings, tmp_path):
    """Nodes of this test's cluster as `delayq node` processes; its topics exist; all are killed at the end."""
    from delayq.testing import LocalCluster

    cluster = LocalCluster(settings, tmp_path)
    yield cluster
    cluster.close()


@pytest.fixture(scope="session")
def release_env():
    """The previous release (delayq/releases.toml) installed in an environment of its own, built once and cached."""
    from delayq.errors import DelayqError
    from delayq.release_env import ensure_release_env
    from delayq.releases import previous_release

    try:
        return ensure_release_env(previous_release())
    except DelayqError as err:
        pytest.fail(f"the previous release's environment could not be built: {err}", pytrace=False)
