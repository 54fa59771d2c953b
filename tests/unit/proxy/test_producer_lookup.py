"""delayq.lookup and `delayq get` against a stand-in node: a tiny real HTTP server serving the node's JSON.

The stand-in serves exactly what the interface fixes for ``GET /v1/messages/{id}``. The
ZooKeeper discovery test (marked integration) registers stand-ins on the real ZooKeeper.
"""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from support.process_testing import run_delayq

import delayq
from delayq import Settings
from delayq.proxy import Lookup, NodeUnreachable
from delayq.proxy.lookup import node_urls
from delayq.wire import new_delay_id

DUE_MS = 1_800_000_000_123


class StandIn:
    """One fake node: answers ``/v1/messages/{id}`` from ``answers``; records the paths asked."""

    def __init__(self) -> None:
        self.answers: dict[str, tuple[int, bytes]] = {}
        self.default: tuple[int, bytes] | None = None
        self.asked: list[str] = []
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # http.server's naming
                stand_in.asked.append(self.path)
                delay_id = self.path.removeprefix("/v1/messages/")
                status, body = stand_in.answers.get(delay_id) or stand_in.default or (
                    404, json.dumps({"id": delay_id, "status": "not_found"}).encode())
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def pending(self, delay_id: str, topic: str = "orders") -> None:
        self.answers[delay_id] = (200, json.dumps({
            "id": delay_id, "status": "pending", "deliver_at_ms": DUE_MS,
            "deliver_at": "2027-01-15T08:00:00.123Z", "topic": topic}).encode())

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stand_in():
    node = StandIn()
    yield node
    node.close()


def closed_port_url() -> str:
    node = StandIn()
    node.close()
    return node.url


def with_urls(*urls: str) -> Settings:
    return Settings(lookup_urls=list(urls))


def test_pending_answer_gives_the_due_time_as_utc_datetime_and_topic(stand_in):
    delay_id = new_delay_id()
    stand_in.pending(delay_id, "reminders")

    found = delayq.lookup(delay_id, settings=with_urls(stand_in.url))

    assert found == Lookup(delay_id, True, datetime(2027, 1, 15, 8, 0, 0, 123000, tzinfo=UTC), DUE_MS,
                           "reminders", stand_in.url)
    assert stand_in.asked == [f"/v1/messages/{delay_id}"]


def test_a_due_time_past_the_year_9999_is_pending_with_the_exact_ms_and_no_datetime(stand_in):
    delay_id, due = new_delay_id(), 10**18 - 1  # the most a frame's 18 digits hold
    stand_in.answers[delay_id] = (200, json.dumps({"id": delay_id, "status": "pending", "deliver_at_ms": due,
                                                   "deliver_at": None, "topic": "far"}).encode())

    found = delayq.lookup(delay_id, settings=with_urls(stand_in.url))

    assert found == Lookup(delay_id, True, None, due, "far", stand_in.url)


def test_not_found_answer_is_not_pending(stand_in):
    delay_id = new_delay_id()

    found = delayq.lookup(delay_id, settings=with_urls(stand_in.url))

    assert (found.pending, found.deliver_at, found.topic) == (False, None, None)


def test_a_node_that_is_down_or_failing_is_skipped_for_the_next(stand_in):
    failing = StandIn()
    failing.default = (503, b'{"ready": false, "reason": "catching up"}')
    delay_id = new_delay_id()
    stand_in.pending(delay_id)
    try:
        found = delayq.lookup(delay_id, settings=with_urls(closed_port_url(), failing.url, stand_in.url))
    finally:
        failing.close()

    assert found.pending and found.node == stand_in.url
    assert failing.asked == [f"/v1/messages/{delay_id}"]


def test_no_node_answering_says_who_was_asked_and_what_to_do(stand_in):
    down = closed_port_url()
    stand_in.default = (500, b"boom")

    with pytest.raises(NodeUnreachable) as caught:
        delayq.lookup(new_delay_id(), settings=with_urls(down, stand_in.url))

    text = str(caught.value)
    assert down in text and "Connection refused" in text
    assert f"{stand_in.url}: HTTP 500 boom" in text
    assert "`delayq node` runs" in text and "DELAYQ_LOOKUP_URLS" in text


def test_a_server_that_is_not_a_delayq_node_is_named_as_such(stand_in):
    stand_in.default = (404, b"<html>Not Found</html>")

    with pytest.raises(NodeUnreachable, match="is this a delayq node"):
        delayq.lookup(new_delay_id(), settings=with_urls(stand_in.url))


def test_an_id_the_node_refuses_is_a_value_error(stand_in):
    stand_in.default = (400, b'{"error": "id is not a delay id"}')

    with pytest.raises(ValueError, match="refused the id"):
        delayq.lookup(new_delay_id(), settings=with_urls(stand_in.url))


@pytest.mark.parametrize("bad,error", [("not-an-id", ValueError), (42, TypeError),
                                       ("0190A3E4-5B6C-7D8E-9F00-112233445566", ValueError)])
def test_a_malformed_id_is_refused_before_any_node_is_asked(stand_in, bad, error):
    with pytest.raises(error, match="delay_id"):
        delayq.lookup(bad, settings=with_urls(stand_in.url))

    assert stand_in.asked == []


def test_get_command_prints_pending_with_due_time_and_exits_0(stand_in):
    delay_id = new_delay_id()
    stand_in.pending(delay_id)

    result = run_delayq("get", delay_id, env={"DELAYQ_LOOKUP_URLS": json.dumps([stand_in.url])})

    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("pending: due 2027-01-15T08:00:00.123000+00:00 (in ")
    assert result.stdout.rstrip().endswith("to topic orders")


def test_get_command_prints_not_pending_and_exits_1(stand_in):
    delay_id = new_delay_id()

    result = run_delayq("get", delay_id, env={"DELAYQ_LOOKUP_URLS": json.dumps([stand_in.url])})

    assert result.returncode == 1
    assert result.stdout == f"not pending: {delay_id} was delivered, cancelled, or never produced\n"


def test_get_command_json_output(stand_in):
    delay_id = new_delay_id()
    stand_in.pending(delay_id)

    result = run_delayq("get", "--json", delay_id, env={"DELAYQ_LOOKUP_URLS": json.dumps([stand_in.url])})

    assert json.loads(result.stdout) == {"id": delay_id, "pending": True, "deliver_at_ms": DUE_MS,
                                         "deliver_at": "2027-01-15T08:00:00.123000+00:00", "topic": "orders",
                                         "node": stand_in.url}


def test_get_command_with_no_node_fails_with_exit_2_and_the_reason():
    result = run_delayq("get", new_delay_id(), env={"DELAYQ_LOOKUP_URLS": json.dumps([closed_port_url()])})

    assert result.returncode == 2
    assert "no delayq node answered the lookup" in result.stderr


@pytest.mark.integration
def test_nodes_are_found_in_zookeeper_master_first(dev_stack, settings, stand_in):
    from kazoo.client import KazooClient

    standby = StandIn()
    delay_id = new_delay_id()
    stand_in.pending(delay_id)
    standby.pending(delay_id, "standby-says")
    zk = KazooClient(hosts=settings.zk_connect)
    zk.start(timeout=10)
    folder = f"{settings.zk_root}/nodes"
    try:
        for node_id, info in (
            ("a-standby", {"node_id": "a-standby", "http": standby.url, "role": "standby", "lag": 0}),
            ("b-master", {"node_id": "b-master", "http": stand_in.url, "role": "master", "lag": 3}),
            ("c-no-http", {"node_id": "c-no-http", "role": "standby"}),
        ):
            zk.create(f"{folder}/{node_id}", json.dumps(info).encode(), ephemeral=True, makepath=True)

        assert node_urls(settings) == [stand_in.url, standby.url]
        found = delayq.lookup(delay_id, settings=settings)
        assert (found.pending, found.topic, found.node) == (True, "orders", stand_in.url)
        assert standby.asked == []
    finally:
        standby.close()
        zk.delete(settings.zk_root, recursive=True)
        zk.stop()
        zk.close()


@pytest.mark.integration
def test_with_shards_the_master_of_the_ids_shard_is_asked_first_then_its_holders(dev_stack, settings):
    from kazoo.client import KazooClient

    from delayq import wire
    from delayq.election import NodeRecord, Role, ShardLayout

    delay_id = new_delay_id()
    shard = wire.shard_of(wire.buffer_partition(delay_id, 12), 3)
    other = (shard + 1) % 3
    zk = KazooClient(hosts=settings.zk_connect)
    zk.start(timeout=10)
    try:
        zk.create(f"{settings.zk_root}/layout", ShardLayout(3, 12).to_json(), makepath=True)
        records = [  # a master of another shard, a holder of the id's shard, its master, one not holding it
            NodeRecord("a", Role.MASTER, http="http://a", lag=0, shards=(0, 1, 2), masters=(other,)),
            NodeRecord("b", Role.STANDBY, http="http://b", lag=5, shards=(shard,)),
            NodeRecord("c", Role.MASTER, http="http://c", lag=9, shards=(shard,), masters=(shard,)),
            NodeRecord("d", Role.STANDBY, http="http://d", lag=0, shards=(other,)),
        ]
        for record in records:
            zk.create(f"{settings.zk_root}/nodes/{record.node_id}", record.to_json(), ephemeral=True, makepath=True)

        assert node_urls(settings, delay_id=delay_id) == ["http://c", "http://a", "http://b", "http://d"]
    finally:
        zk.delete(settings.zk_root, recursive=True)
        zk.stop()
        zk.close()


@pytest.mark.integration
def test_no_node_registered_in_zookeeper_says_to_start_one(dev_stack, settings):
    with pytest.raises(NodeUnreachable, match=rf"no live delayq node registered under {settings.zk_root}/nodes.*"
                                              r"start one with `delayq node`"):
        delayq.lookup(new_delay_id(), settings=settings)
