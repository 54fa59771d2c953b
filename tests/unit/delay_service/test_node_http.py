"""The node's HTTP server through its narrow view of the node: an error inside answers JSON 500, and it goes on."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from delayq import wire
from delayq.delay_service.http import NodeHTTPServer
from delayq.delay_service.metrics import NodeMetrics
from delayq.wire import new_delay_id


def id_in_shard(shard: int) -> str:
    while True:
        delay_id = new_delay_id()
        if wire.shard_of(wire.buffer_partition(delay_id, 12), 2) == shard:
            return delay_id


class BrokenStoreNode:
    """A node view whose store read fails the way a closed or damaged RocksDB would."""

    def __init__(self) -> None:
        self.registry = NodeMetrics().registry
        self.calls = 0

    def alive(self) -> bool:
        return True

    def ready(self) -> tuple[bool, str]:
        return True, "caught up (standby)"

    def shard_of(self, delay_id: str) -> tuple[int, bool]:
        # Two shards, by the wire rule on 12 partitions; this node holds shard 0 only.
        shard = wire.shard_of(wire.buffer_partition(delay_id, 12), 2)
        return shard, shard == 0

    def entry(self, delay_id: str):
        self.calls += 1
        raise RuntimeError("the store is closed")


@pytest.fixture
def server():
    node = BrokenStoreNode()
    http = NodeHTTPServer(node, "127.0.0.1", 0)
    http.start()
    yield http, node
    http.stop()


def get(url: str) -> tuple[int, dict | str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            body = answer.read().decode()
            return answer.status, json.loads(body) if answer.headers["Content-Type"] == "application/json" else body
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_an_error_behind_an_endpoint_answers_a_json_500_and_the_server_goes_on(server):
    http, node = server
    base = f"http://127.0.0.1:{http.port}"
    status, body = get(f"{base}/v1/messages/{id_in_shard(0)}")
    assert status == 500 and body == {"error": "internal error: RuntimeError: the store is closed"}
    assert get(f"{base}/livez") == (200, "ok\n")
    assert get(f"{base}/readyz") == (200, {"ready": True, "reason": "caught up (standby)"})
    assert get(f"{base}/v1/messages/{id_in_shard(0)}")[0] == 500 and node.calls == 2


def test_an_id_of_a_shard_the_node_does_not_hold_answers_421_naming_the_shard(server):
    http, node = server
    delay_id = id_in_shard(1)
    status, body = get(f"http://127.0.0.1:{http.port}/v1/messages/{delay_id}")
    assert status == 421
    assert body["status"] == "not_held" and body["shard"] == 1 and body["id"] == delay_id
    assert "does not hold shard 1" in body["error"]
    assert node.calls == 0, "the store is not asked about an id of a shard it does not hold"
