"""The node's HTTP server through its narrow view of the node: an error inside answers JSON 500, and it goes on."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from delayq.delay_service.http import NodeHTTPServer
from delayq.delay_service.metrics import NodeMetrics
from delayq.wire import new_delay_id


class BrokenStoreNode:
    """A node view whose store read fails the way a closed or damaged RocksDB would."""

    def __init__(self) -> None:
        self.registry = NodeMetrics().registry
        self.calls = 0

    def alive(self) -> bool:
        return True

    def ready(self) -> tuple[bool, str]:
        return True, "caught up (standby)"

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
    status, body = get(f"{base}/v1/messages/{new_delay_id()}")
    assert status == 500 and body == {"error": "internal error: RuntimeError: the store is closed"}
    assert get(f"{base}/livez") == (200, "ok\n")
    assert get(f"{base}/readyz") == (200, {"ready": True, "reason": "caught up (standby)"})
    assert get(f"{base}/v1/messages/{new_delay_id()}")[0] == 500 and node.calls == 2
