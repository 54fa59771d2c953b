"""The console's view of the cluster: ZooKeeper's shards, the nodes asked in order, histograms summed, and the
upcoming list merged across shards under one cursor. Pure: stand-ins for ZooKeeper and the nodes' HTTP."""

from __future__ import annotations

import json
from unittest import mock

import pytest
from support.stand_ins import zookeeper

from delayq.delay_service.console.cluster import (
    ClusterView,
    Overview,
    ShardRow,
    candidates,
    decode_cursor,
    encode_cursor,
    merge_upcoming,
    read_overview,
    sum_histograms,
)
from delayq.delay_service.console.records import Bucket, PendingHistogram, UpcomingItem, UpcomingPage, to_json
from delayq.election import NodeRecord, Role, ShardLayout
from delayq.settings import Settings
from delayq.wire import buffer_partition, shard_of

T0 = 1_800_000_000_000
MINUTE, HOUR = 60_000, 3_600_000


def item(n: int, due_ms: int, topic: str = "orders") -> UpcomingItem:
    return UpcomingItem(f"0190a3e4-5b6c-7d8e-9f00-{n:012x}", due_ms, topic, None, n, 0)


def page(shard: int, items: list[UpcomingItem], more: str | None = None) -> UpcomingPage:
    return UpcomingPage(shard, tuple(items), more, len(items))


def node(node_id: str, shards: tuple[int, ...], ready: tuple[int, ...] = (), lag: int | None = 0) -> NodeRecord:
    return NodeRecord(node_id, Role.STANDBY, http=f"http://{node_id}:80", shards=shards, ready=ready, lag=lag)


def overview(shards: int, nodes: list[NodeRecord], masters: dict[int, str]) -> Overview:
    rows = tuple(ShardRow(k, masters.get(k), 1, tuple(n.node_id for n in nodes if k in n.shards), (), 0)
                 for k in range(shards))
    return Overview("c", rows, tuple(nodes), shards * 2, T0)


# -- merging the shards' pages ----------------------------------------------------


def test_two_shards_merge_in_due_order_and_each_goes_on_after_its_last_shown_message():
    a = [item(1, T0 + 1), item(3, T0 + 3), item(5, T0 + 5)]
    b = [item(2, T0 + 2), item(4, T0 + 4)]
    rows, after = merge_upcoming({0: "", 1: ""}, {0: page(0, a, "x"), 1: page(1, b, "y")}, limit=3)
    assert [(row.shard, row.item.due_ms) for row in rows] == [(0, T0 + 1), (1, T0 + 2), (0, T0 + 3)]
    assert after == {0: f"{T0 + 3}:{a[1].id}", 1: f"{T0 + 2}:{b[0].id}"}


def test_a_shard_whose_every_message_was_shown_leaves_the_cursor_and_the_last_page_has_none():
    rows, after = merge_upcoming({0: "", 1: ""}, {0: page(0, [item(1, T0)]), 1: page(1, [item(2, T0 + 1)])}, 10)
    assert len(rows) == 2 and after == {}
    rows, after = merge_upcoming({0: "", 1: ""}, {0: page(0, [item(1, T0)]), 1: page(1, [item(2, T0 + 1)], "n")}, 10)
    assert after == {1: "n"}  # shard 1 has more: go on from its own cursor


def test_a_shard_read_only_so_far_stops_the_page_there_so_no_earlier_message_is_skipped():
    # Shard 0's topic filter stopped its scan at T0 + 10 (UPCOMING_SCAN_LIMIT): it may hold messages due after that,
    # which must come before shard 1's at T0 + 20.
    rows, after = merge_upcoming({0: "", 1: ""}, {0: page(0, [item(1, T0 + 5)], f"{T0 + 10}:x"),
                                                  1: page(1, [item(2, T0 + 20)])}, 10)
    assert [row.item.due_ms for row in rows] == [T0 + 5]
    assert after == {0: f"{T0 + 10}:x", 1: ""}


def test_a_shard_that_did_not_answer_keeps_its_place_for_the_next_page_and_blocks_no_other():
    rows, after = merge_upcoming({0: "7:z", 1: ""}, {0: None, 1: page(1, [item(2, T0)], "more")}, 10)
    assert [row.shard for row in rows] == [1]
    assert after == {0: "7:z", 1: "more"}


def test_the_cursor_is_one_opaque_string_that_gives_back_each_shards_place():
    positions = {0: f"{T0}:abc", 3: ""}
    cursor = encode_cursor(positions)
    assert "/" not in cursor and "+" not in cursor and "=" not in cursor  # safe in a query string as it is
    assert decode_cursor(cursor) == positions


@pytest.mark.parametrize("cursor", ["not-a-cursor", encode_cursor({0: "x"})[:-3] + "!!", "W10"])
def test_a_cursor_this_console_did_not_write_is_one_line_saying_what_to_do(cursor):
    with pytest.raises(ValueError, match="is not a cursor of this console's upcoming list: follow the page's next"):
        decode_cursor(cursor)


def test_the_view_pages_through_every_shard_with_the_cursor_it_gives():
    shards = {0: [item(i, T0 + i) for i in range(0, 10, 2)], 1: [item(i, T0 + i) for i in range(1, 10, 2)]}

    def fetch(url: str, timeout_s: float):
        shard = int(url.split("/v1/shards/")[1].split("/")[0])
        query = dict(p.split("=") for p in url.split("?")[1].split("&"))
        after = query.get("after", "").replace("%3A", ":")
        rest = [i for i in shards[shard] if not after or (i.due_ms, i.id) > (int(after.split(":")[0]),
                                                                            after.split(":")[1])]
        taken = rest[:int(query["limit"])]
        more = f"{taken[-1].due_ms}:{taken[-1].id}" if len(rest) > len(taken) else None
        return 200, to_json(page(shard, taken, more))

    view = ClusterView(Settings(cluster="c"), fetch=fetch)
    seen, cursor = [], None
    with mock.patch.object(view, "overview", return_value=overview(2, [node("a", (0, 1))], {0: "a", 1: "a"})):
        for _ in range(10):
            merged = view.upcoming(after=cursor, limit=3)
            seen += [row.item.due_ms - T0 for row in merged.rows]
            cursor = merged.next
            if cursor is None:
                break
    view.close()
    assert seen == list(range(10))


# -- asking the nodes ---------------------------------------------------------------


def test_the_master_is_asked_first_then_holders_caught_up_by_least_lag_then_the_others():
    nodes = [node("late", (0,), lag=1), node("far", (0,), ready=(0,), lag=50), node("near", (0,), ready=(0,), lag=2),
             node("boss", (0,), lag=9), node("other", (1,))]
    assert [n.node_id for n in candidates(overview(2, nodes, {0: "boss"}), 0)] == ["boss", "near", "far", "late"]


def test_a_shard_whose_nodes_do_not_answer_is_unavailable_and_a_421_passes_to_the_next_holder():
    asked = []

    def fetch(url: str, timeout_s: float):
        asked.append(url)
        if url.startswith("http://a:80"):
            return 421, {"error": "not held"}
        if url.startswith("http://b:80"):
            return 200, to_json(PendingHistogram(0, T0, 3, 1, (Bucket(T0, MINUTE, 2),), (), 0))
        raise OSError("connection refused")

    view = ClusterView(Settings(cluster="c"), fetch=fetch)
    with mock.patch.object(view, "overview", return_value=overview(2, [node("a", (0,)), node("b", (0,)),
                                                                      node("c", (1,))], {0: "a", 1: "c"})):
        chart = view.pending()
    view.close()
    assert chart.unavailable == (1,) and chart.count == 3 and chart.buckets == (Bucket(T0, MINUTE, 2),)
    assert asked[:2] == ["http://a:80/v1/shards/0/pending", "http://b:80/v1/shards/0/pending"]


def test_the_histograms_add_up_by_bucket_start_and_keep_minutes_before_hours():
    one = PendingHistogram(0, T0, 10, 2, (Bucket(T0, MINUTE, 3), Bucket(T0 + MINUTE, MINUTE, 1)),
                           (Bucket(T0 + HOUR, HOUR, 4),), 0)
    two = PendingHistogram(1, T0 + MINUTE, 7, 1, (Bucket(T0 + MINUTE, MINUTE, 5), Bucket(T0 + 2 * MINUTE, MINUTE, 1)),
                           (Bucket(T0 + HOUR, HOUR, 0),), 1)
    chart = sum_histograms({0: one, 1: two, 2: None}, T0)
    assert [(b.start_ms - T0, b.count) for b in chart.buckets] == [(0, 3), (MINUTE, 6), (2 * MINUTE, 1), (HOUR, 4)]
    assert (chart.count, chart.overdue, chart.later, chart.unavailable, chart.now_ms) == (17, 3, 1, (2,), T0)


def test_a_lookup_asks_the_nodes_of_the_ids_shard_and_says_pending_or_not():
    delay_id = "0190a3e4-5b6c-7d8e-9f00-112233445566"
    shard = shard_of(buffer_partition(delay_id, 4), 2)
    answers = {f"http://n{shard}:80/v1/messages/{delay_id}": (200, {"id": delay_id, "status": "pending",
                                                                  "deliver_at_ms": T0, "topic": "orders"})}
    view = ClusterView(Settings(cluster="c"), fetch=lambda url, timeout_s: answers.get(url, (404, {})))
    with mock.patch.object(view, "overview", return_value=overview(2, [node("n0", (0,)), node("n1", (1,))],
                                                                   {0: "n0", 1: "n1"})):
        found = view.lookup(delay_id)
        answers.clear()
        gone = view.lookup(delay_id)
    view.close()
    assert (found.answered, found.pending, found.due_ms, found.topic) == (True, True, T0, "orders")
    assert (gone.answered, gone.pending) == (True, False)


# -- ZooKeeper ---------------------------------------------------------------------


def test_the_overview_reads_the_layout_the_shards_masters_epochs_and_the_nodes_registrations():
    root = "/delayq/c"
    records = [NodeRecord("a", Role.MASTER, http="http://a:1", lag=4, shards=(0, 1), ready=(0, 1), masters=(0, 1)),
               NodeRecord("b", Role.STANDBY, http="http://b:1", lag=9, shards=(1,), ready=())]
    znodes = {f"{root}/layout": ShardLayout(2, 4).to_json(), f"{root}/shards/0/epoch": b"7",
              **{f"{root}/nodes/{r.node_id}": r.to_json() for r in records}}
    settings = Settings(cluster="c")
    assert settings.zk_root == root
    found = read_overview(zookeeper(znodes, master="a"), settings)
    assert found.partitions == 4 and [n.node_id for n in found.nodes] == ["a", "b"]
    assert found.shards == (ShardRow(0, "a", 7, ("a",), ("a",), 4), ShardRow(1, "a", 0, ("a", "b"), ("a",), 4))


def test_zookeeper_is_read_once_a_second_however_many_pages_ask():
    client = zookeeper({}, master=None)
    view = ClusterView(Settings(cluster="c"), zk=lambda: client, cache_s=60)
    first = view.overview()
    assert view.overview() is first
    reads = client.get.call_count
    view.overview()
    assert client.get.call_count == reads
    view.close()


def test_json_of_a_node_of_another_shape_leaves_its_shard_unavailable_not_the_page_broken():
    view = ClusterView(Settings(cluster="c"), fetch=lambda url, timeout_s: (200, json.loads('{"nothing": 1}')))
    with mock.patch.object(view, "overview", return_value=overview(1, [node("a", (0,))], {0: "a"})):
        assert view.now() == {0: None}
    view.close()



def test_a_shard_whose_node_is_still_counting_its_store_is_left_out_of_the_chart_as_counting_not_unavailable():
    def fetch(url: str, timeout_s: float):
        if url.startswith("http://a:80"):
            return 503, {"shard": 0, "status": "counting", "counted": 10, "pending": 99, "error": "counting"}
        return 200, to_json(PendingHistogram(1, T0, 3, 1, (Bucket(T0, MINUTE, 2),), (), 0))

    view = ClusterView(Settings(cluster="c"), fetch=fetch)
    with mock.patch.object(view, "overview", return_value=overview(2, [node("a", (0,)), node("b", (1,))],
                                                                   {0: "a", 1: "b"})):
        chart = view.pending()
    view.close()
    assert (chart.counting, chart.unavailable, chart.count) == ((0,), (), 3)
