"""The console's endpoints on a node's HTTP port (/v1/shards/..., /console), through its narrow view of the node.

A real store in tmp_path behind a node view that holds shard 0 of 2; the group front of member
processes passes the same requests on to the member that holds the shard.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import types
import urllib.error
import urllib.request

import pytest

from delayq import wire
from delayq.clock import now_ms
from delayq.delay_service import stored
from delayq.delay_service.console.records import (
    MAX_PAGE,
    UPCOMING_SCAN_LIMIT,
    histogram_from_json,
    now_from_json,
    upcoming_from_json,
)
from delayq.delay_service.http import NodeHTTPServer
from delayq.delay_service.members import GroupHandler, GroupView, Member, runs_console
from delayq.delay_service.metrics import NodeMetrics
from delayq.delay_service.shard_answers import ShardAnswers
from delayq.schedule import Series
from delayq.settings import Settings
from delayq.store import Put, TimeIndex

MINUTE = 60_000


def put(delay_id: str, due_ms: int, topic: str = "orders", version: int = 1, **fields) -> Put:
    message = wire.Envelope(delay_id, topic, due_ms, b"v", **fields)
    return Put(delay_id, due_ms, stored.pack(3, version, message), version)


class ConsoleNode:
    """A node view holding shard 0 of 2, with a real store; shard 1 is another node's."""

    def __init__(self, store: TimeIndex, console_app=None) -> None:
        self.metrics = NodeMetrics()
        self.registry = self.metrics.registry
        self.store = store
        self.console_app = console_app
        self.recent = self.metrics.shard(0).recent

    def alive(self) -> bool:
        return True

    def ready(self) -> tuple[bool, str]:
        return True, "caught up"

    def shard_of(self, delay_id: str) -> tuple[int, bool]:
        raise NotImplementedError

    def entry(self, delay_id: str):
        raise NotImplementedError

    def shard_count(self) -> int:
        return 2

    def console_shard(self, shard: int) -> ShardAnswers | None:
        return ShardAnswers(0, self.store, self.recent, lambda: True) if shard == 0 else None


@pytest.fixture
def store(tmp_path):
    with TimeIndex(tmp_path / "store") as index:
        yield index


def serve(view, handler=None):
    server = NodeHTTPServer(view, "127.0.0.1", 0, handler)
    server.start()
    return server


@pytest.fixture
def node(store):
    view = ConsoleNode(store)
    server = serve(view)
    view.url = f"http://127.0.0.1:{server.port}"
    yield view
    server.stop()


def get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_pending_answers_the_shards_histogram_by_due_time(node):
    now = now_ms()
    node.store.apply([put(wire.new_delay_id(), now - 5 * MINUTE), put(wire.new_delay_id(), now + 2 * MINUTE),
                      put(wire.new_delay_id(), now + 2 * MINUTE), put(wire.new_delay_id(), now + 3 * 3_600_000),
                      put(wire.new_delay_id(), now + 40 * 86_400_000)], {0: 5})
    status, body = get(f"{node.url}/v1/shards/0/pending?days=2")
    assert status == 200
    histogram = histogram_from_json(body)
    assert histogram.shard == 0 and histogram.count == 5 and histogram.overdue == 1 and histogram.later == 1
    assert len(histogram.minutes) == 60 and len(histogram.hours) == 48
    assert histogram.minutes[0].start_ms == now // MINUTE * MINUTE and histogram.minutes[0].width_ms == MINUTE
    assert sum(b.count for b in histogram.minutes) == 2 and sum(b.count for b in histogram.hours) == 1
    assert histogram.hours[0].start_ms == histogram.minutes[-1].start_ms + MINUTE
    assert len(histogram_from_json(get(f"{node.url}/v1/shards/0/pending")[1]).hours) == 7 * 24, "7 days unless asked"


def test_pending_says_it_is_counting_while_the_stores_first_count_runs(tmp_path):
    with TimeIndex(tmp_path / "s") as store:
        store.apply([put(wire.new_delay_id(), now_ms() + i) for i in range(50)], {0: 50})
    with TimeIndex(tmp_path / "s") as store:
        server = serve(ConsoleNode(store))
        try:
            url = f"http://127.0.0.1:{server.port}/v1/shards/0/pending"
            # The first ask starts the count (a reopened store's entries are not counted yet) and answers at once.
            with pytest.raises(urllib.error.HTTPError) as answer:
                urllib.request.urlopen(url, timeout=10)
            assert answer.value.code == 503 and answer.value.headers["Retry-After"] == "1"
            body = json.loads(answer.value.read())
            assert body["status"] == "counting" and body["pending"] == 50 and "being counted" in body["error"]
            while (found := get(url))[0] == 503:
                time.sleep(0.01)
            assert found[0] == 200 and found[1]["count"] == 50
        finally:
            server.stop()


def test_upcoming_pages_go_in_due_order_and_show_what_the_store_holds(node):
    now = now_ms()
    ids = [wire.new_delay_id() for _ in range(7)]
    series = Series(60_000, 1.0, None, "UTC", 5, None)
    node.store.apply([put(ids[i], now + (i // 2) * 1000, version=10 + i) for i in range(6)]
                     + [put(ids[6], now + 10_000, "billing", 99, key=b"k\xff" + b"x" * 300, series=series, occurrence=2,
                            attempt=3)], {0: 7})
    expected = [*sorted((now + (i // 2) * 1000, ids[i]) for i in range(6)), (now + 10_000, ids[6])]
    seen, after, pages = [], "", 0
    while True:
        status, body = get(f"{node.url}/v1/shards/0/upcoming?limit=3{after}")
        assert status == 200
        page = upcoming_from_json(body)
        seen += page.items
        pages += 1
        if page.next is None:
            break
        after = f"&after={page.next}"
    assert pages == 3 and [(item.due_ms, item.id) for item in seen] == expected
    first = next(item for item in seen if item.id == ids[0])
    assert (first.topic, first.key, first.version, first.partition, first.repeat) == ("orders", None, 10, 3, None)
    last = seen[-1]
    assert (last.topic, last.version, last.occurrence, last.repeat, last.attempt) == (
        "billing", 99, 2, "every=60000 times=5", 3)
    assert len(last.key) == 200 and last.key.startswith("k\ufffdxx"), "text, at most 200 characters"


def test_upcoming_by_topic_looks_at_a_bounded_number_of_entries_and_says_where_to_go_on(node):
    now = now_ms()
    rare = wire.new_delay_id()
    node.store.apply([put(wire.new_delay_id(), now + i, "orders", i + 1) for i in range(UPCOMING_SCAN_LIMIT + 5)]
                     + [put(rare, now + UPCOMING_SCAN_LIMIT + 100, "orders-eu")], {0: 1})
    page = upcoming_from_json(get(f"{node.url}/v1/shards/0/upcoming?topic=orders-eu")[1])
    assert page.items == () and page.scanned == UPCOMING_SCAN_LIMIT and page.next is not None
    page = upcoming_from_json(get(f"{node.url}/v1/shards/0/upcoming?topic=orders-eu&after={page.next}")[1])
    assert [item.id for item in page.items] == [rare] and page.next is None and page.scanned == 6


def test_now_answers_the_last_minute_of_the_shards_deliveries(node):
    node.store.apply([put(wire.new_delay_id(), now_ms() + 60_000)], {0: 1})
    node.recent.add(now_ms(), [0.010] * 99 + [2.0])
    status, body = get(f"{node.url}/v1/shards/0/now")
    shard_now = now_from_json(body)
    assert status == 200 and shard_now.master and shard_now.pending == 1
    assert shard_now.delivered == 100 and shard_now.rate_per_s == pytest.approx(100 / 60)
    assert shard_now.lateness_p50_ms == pytest.approx(10) and shard_now.lateness_p99_ms == pytest.approx(10)


def test_a_shard_this_node_does_not_hold_answers_421(node):
    for page in ("pending", "upcoming", "now"):
        status, body = get(f"{node.url}/v1/shards/1/{page}")
        assert status == 421 and body["status"] == "not_held" and body["shard"] == 1
        assert "does not hold shard 1" in body["error"]


@pytest.mark.parametrize(("path", "error"), [
    ("/v1/shards/2/pending", "shard '2' is not a shard of this cluster: it has shards 0 to 1"),
    ("/v1/shards/x/now", "shard 'x' is not a shard"),
    ("/v1/shards/-1/now", "shard '-1' is not a shard"),
    ("/v1/shards/0/pending?days=0", "days='0' is not a whole number from 1 to 31"),
    ("/v1/shards/0/pending?days=32", "days='32' is not a whole number from 1 to 31"),
    ("/v1/shards/0/pending?days=1&days=2", "days is given twice"),
    ("/v1/shards/0/pending?limit=3", "unknown argument 'limit': this endpoint takes days"),
    ("/v1/shards/0/now?days=3", "unknown argument 'days': this endpoint takes no arguments"),
    ("/v1/shards/0/upcoming?limit=0", "limit='0' is not a whole number from 1 to 500"),
    (f"/v1/shards/0/upcoming?limit={MAX_PAGE + 1}", "limit='501' is not a whole number from 1 to 500"),
    ("/v1/shards/0/upcoming?limit=ten", "limit='ten' is not a whole number"),
    ("/v1/shards/0/upcoming?after=17", "after='17' is not an upcoming cursor: give <due_ms>:<id>"),
    ("/v1/shards/0/upcoming?after=x:0b8f3b4a-1c1e-4c6e-9b1a-1f2e3d4c5b6a", "is not an upcoming cursor"),
    ("/v1/shards/0/upcoming?after=17:not-an-id", "is not an upcoming cursor"),
    ("/v1/shards/0/upcoming?topic=a%20b", "topic 'a b' is not a valid Kafka topic name"),
    ("/v1/shards/0/upcoming?topic=", "topic '' is not a valid Kafka topic name"),
])
def test_a_bad_argument_answers_400_with_one_line_saying_what(node, path, error):
    status, body = get(node.url + path)
    assert status == 400 and error in body["error"] and "\n" not in body["error"]


@pytest.mark.parametrize("path", ["/v1/shards/0/histogram", "/v1/shards/0", "/v1/shards/", "/v1/shards/0/now/x"])
def test_an_unknown_shard_path_answers_404(node, path):
    status, body = get(node.url + path)
    assert status == 404 and "no such endpoint" in body["error"]


def request(url: str, method: str, body: bytes | None = None, headers: dict | None = None) -> tuple[int, dict, bytes]:
    target = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(target.hostname, target.port, timeout=10)
    try:
        connection.request(method, target.path + (f"?{target.query}" if target.query else ""), body=body,
                           headers=headers or {})
        answer = connection.getresponse()
        return answer.status, dict(answer.getheaders()), answer.read()
    finally:
        connection.close()


def test_the_console_is_off_unless_the_node_has_one(node):
    status, _, body = request(f"{node.url}/console/", "GET")
    assert status == 404 and json.loads(body) == {"error": "the console is off on this node: set DELAYQ_CONSOLE=true"}


def echo_app(environ, start_response):
    """A WSGI app saying what it was asked."""
    length = int(environ.get("CONTENT_LENGTH") or 0)
    said = {"method": environ["REQUEST_METHOD"], "path": environ["PATH_INFO"], "query": environ["QUERY_STRING"],
            "body": environ["wsgi.input"].read(length).decode(), "cookie": environ.get("HTTP_COOKIE")}
    start_response("200 OK", [("Content-Type", "application/json"), ("Set-Cookie", "s=1; Path=/console")])
    return [json.dumps(said).encode()]


@pytest.fixture
def console_node(store):
    view = ConsoleNode(store, echo_app)
    server = serve(view)
    view.url = f"http://127.0.0.1:{server.port}"
    yield view
    server.stop()


def test_console_requests_go_to_the_nodes_console_app_get_and_post(console_node):
    status, headers, body = request(f"{console_node.url}/console/upcoming?topic=a", "GET", headers={"Cookie": "s=1"})
    assert status == 200 and headers["Set-Cookie"] == "s=1; Path=/console"
    assert json.loads(body) == {"method": "GET", "path": "/console/upcoming", "query": "topic=a", "body": "",
                                "cookie": "s=1"}
    status, _, body = request(f"{console_node.url}/console/actions/cancel", "POST", b"id=x",
                              {"Content-Type": "application/x-www-form-urlencoded"})
    assert status == 200 and json.loads(body)["body"] == "id=x"
    assert json.loads(request(f"{console_node.url}/console", "GET")[2])["path"] == "/console"
    assert request(f"{console_node.url}/consoles", "GET")[0] == 404, "only /console and what is under it"


def test_a_post_anywhere_else_answers_405_in_one_line_and_closes(console_node):
    status, headers, body = request(f"{console_node.url}/v1/shards/0/now", "POST", b"x")
    assert status == 405 and headers["Connection"] == "close"
    assert "only the console's pages (/console/...) take a POST" in json.loads(body)["error"]


@pytest.fixture
def group(tmp_path):
    """A node of two member processes, each a node view on a port of its own: member 1 holds shard 0, member 0
    none; member 0 runs the console."""
    with TimeIndex(tmp_path / "member-1") as store:
        holder, other = ConsoleNode(store), ConsoleNode(store, echo_app)
        other.console_shard = lambda shard: None  # type: ignore[method-assign]
        servers = [serve(other), serve(holder)]
        members = [Member(i, f"box-{i}", server.port) for i, server in enumerate(servers)]
        front = serve(GroupView(types.SimpleNamespace(members=members, stopping=threading.Event())), GroupHandler)
        holder.url = f"http://127.0.0.1:{front.port}"
        yield holder
        for server in [front, *servers]:
            server.stop()


def test_a_node_of_member_processes_passes_shard_questions_to_the_member_holding_the_shard(group):
    group.store.apply([put(wire.new_delay_id(), now_ms() + 5000)], {0: 1})
    status, body = get(f"{group.url}/v1/shards/0/upcoming?limit=5")
    assert status == 200 and len(upcoming_from_json(body).items) == 1
    assert get(f"{group.url}/v1/shards/0/pending")[1]["count"] == 1
    status, body = get(f"{group.url}/v1/shards/1/now")
    assert status == 421 and body["status"] == "not_held"
    assert get(f"{group.url}/v1/shards/0/upcoming?limit=0")[0] == 400


def test_a_node_of_member_processes_passes_the_console_to_its_first_member(group):
    status, headers, body = request(f"{group.url}/console/actions/replay?x=1", "POST", b"code=expired",
                                    {"Cookie": "s=1", "Content-Type": "application/x-www-form-urlencoded"})
    assert status == 200 and headers["Set-Cookie"] == "s=1; Path=/console"
    assert json.loads(body) == {"method": "POST", "path": "/console/actions/replay", "query": "x=1",
                                "body": "code=expired", "cookie": "s=1"}


def test_of_a_node_of_members_only_the_first_runs_the_console():
    assert runs_console(Settings(node_id="box", console=True))
    assert not runs_console(Settings(node_id="box"))
    assert runs_console(Settings(node_id="box-0", node_group="box", console=True))
    assert not runs_console(Settings(node_id="box-1", node_group="box", console=True))
