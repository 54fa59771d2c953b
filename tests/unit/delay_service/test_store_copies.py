"""A store's copy from one node to another over the node HTTP endpoint: whole and usable, or not at all."""

from __future__ import annotations

import io
import socket
import tarfile
import threading
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar
from unittest import mock

import pytest
import rocksdict
from confluent_kafka.admin import AdminClient

from delayq.clock import now_ms
from delayq.delay_service import store_copies
from delayq.delay_service.http import NodeHTTPServer
from delayq.delay_service.members import GroupHandler, GroupView, Member
from delayq.delay_service.metrics import NodeMetrics
from delayq.delay_service.store_copies import copy_from_peers, make_copy
from delayq.delay_service.stores import META_TOPIC_ID, ShardStores
from delayq.delay_service.topics import BufferInfo, EndOffsets
from delayq.settings import Settings
from delayq.store import Put, StoredEntry, TimeIndex

T0 = 1_800_000_000_000


class HoldingNode:
    """A node view holding shard 1 of 2 in a real store."""

    def __init__(self, store: TimeIndex, data_dir: Path, settings: Settings | None = None):
        self.registry = NodeMetrics().registry
        self.store, self.data_dir, self.settings = store, data_dir, settings or Settings()

    def alive(self) -> bool:
        return True

    def ready(self) -> tuple[bool, str]:
        return True, "caught up (standby)"

    def shard_count(self) -> int:
        return 2

    def store_copy_allowed(self, shard: int, authorization: str | None) -> bool:
        return store_copies.authorized(self.settings, shard, authorization)

    def store_copy(self, shard: int) -> Path | None:
        return make_copy(self.store, self.data_dir) if shard == 1 else None


@pytest.fixture
def holder(tmp_path):
    with TimeIndex(tmp_path / "holder" / "store") as store:
        store.apply([Put(f"id{i}", T0 + i, b"p%d" % i) for i in range(2000)], {0: 2000, 3: 7}, ingested_at_ms=now_ms())
        store.set_meta(META_TOPIC_ID, b"topic-1")
        http = NodeHTTPServer(HoldingNode(store, tmp_path / "holder"), "127.0.0.1", 0)
        http.start()
        yield f"http://127.0.0.1:{http.port}", store, tmp_path / "holder"
        http.stop()


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_copy_is_the_holders_store_with_its_offsets_and_the_holder_keeps_nothing_of_it(holder, tmp_path):
    url, _, holder_dir = holder
    path = tmp_path / "node-b" / "shards" / "1"
    path.parent.mkdir(parents=True)

    copied = copy_from_peers([("node-a", url)], 1, path)

    assert copied is not None and copied.source == "node-a" and copied.files > 0 and copied.size > 0
    with TimeIndex(path) as copy:
        assert copy.due(T0 + 10**6, 3000) == [StoredEntry(f"id{i}", T0 + i, b"p%d" % i)
                                                 for i in sorted(range(2000), key=lambda i: (T0 + i, f"id{i}"))]
        assert (copy.pending_count(), copy.offsets()) == (2000, {0: 2000, 3: 7})
    assert list(path.parent.iterdir()) == [path]  # nothing of the receiving half left beside it
    assert not any((holder_dir / store_copies.COPIES_DIR).iterdir())  # the checkpoint sent is gone


def test_holders_that_refuse_or_are_gone_are_passed_over_and_none_leaves_a_file(holder, tmp_path):
    url, _, _ = holder
    path = tmp_path / "node-b" / "shards" / "0"
    path.parent.mkdir(parents=True)

    # Gone (connection refused); holding another shard only (421); then a node that answers: the copy is its.
    assert copy_from_peers([("gone", f"http://127.0.0.1:{closed_port()}"), ("other", url)], 0, path) is None
    assert list(path.parent.iterdir()) == []
    path1 = path.parent / "1"
    copied = copy_from_peers([("gone", f"http://127.0.0.1:{closed_port()}"), ("node-a", url)], 1, path1)
    assert copied is not None and copied.source == "node-a"


class Serving(BaseHTTPRequestHandler):
    """A node answering a copy the way a broken or hostile one could."""

    body = b""
    headers_sent: ClassVar[dict[str, str]] = {}

    def do_GET(self) -> None:
        self.send_response(200)
        for name, value in self.headers_sent.items():
            self.send_header(name, value)
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, format, *args):
        pass


def tar_of(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


@pytest.mark.parametrize(("files", "announced", "cut", "said"), [
    ({"../CURRENT": b"x"}, (1, 1), 0, "unexpected entry"),
    ({"sub/CURRENT": b"x"}, (1, 1), 0, "unexpected entry"),
    ({"CURRENT": b"x" * 5000}, (1, 5000), 7000, "broke off"),  # cut inside the file
    ({"CURRENT": b"x"}, (2, 1), 0, "announced 2"),
    ({"000001.sst": b"x"}, (1, 1), 0, "not a delayq store"),
])
def test_a_copy_not_whole_or_not_a_store_is_refused_and_deleted(tmp_path, files, announced, cut, said, caplog):
    body = tar_of(files)
    handler = type("Handler", (Serving,), {"body": body[:-cut] if cut else body, "headers_sent": {
        store_copies.FILES_HEADER: str(announced[0]), store_copies.BYTES_HEADER: str(announced[1])}})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        path = tmp_path / "shards" / "0"
        path.parent.mkdir(parents=True)
        assert copy_from_peers([("odd", f"http://127.0.0.1:{server.server_address[1]}")], 0, path) is None
    finally:
        server.shutdown()
        server.server_close()
    assert list(path.parent.iterdir()) == []
    assert not (tmp_path / "CURRENT").exists()
    assert said in caplog.text


def shard_stores(tmp_path: Path, peers: list[tuple[str, str]], topic_id: str = "topic-1") -> ShardStores:
    """A node's stores (4 buffer partitions, 2 shards: shard 1 reads partitions 1 and 3) whose holders are ``peers``."""
    stores = ShardStores(Settings(data_dir=tmp_path / "node-b", shards=2, buffer_partitions=4),
                         BufferInfo(topic_id, [0, 1, 2, 3], 86_400_000, 0), NodeMetrics(),
                         mock.Mock(spec_set=AdminClient))
    stores.end_offsets = mock.Mock(spec_set=EndOffsets)
    stores.end_offsets.read.return_value = {0: 2000, 1: 0, 2: 0, 3: 7}
    stores.peers = lambda shard: peers
    return stores


def metric(stores: ShardStores, name: str, **labels: str) -> float:
    return stores.metrics.registry.get_sample_value(name, {"shard": "1", **labels}) or 0.0


def test_a_node_without_the_store_opens_a_holders_copy_and_counts_it(holder, tmp_path):
    url, _, _ = holder
    stores = shard_stores(tmp_path, [("node-a", url)])

    with stores.open(1) as store:
        assert (store.pending_count(), store.offsets()) == (2000, {0: 2000, 3: 7})
    assert metric(stores, "delayq_store_copies_total") == 1
    assert metric(stores, "delayq_store_copy_seconds") > 0


def test_a_stale_store_is_replaced_by_a_holders_copy(holder, tmp_path):
    url, _, _ = holder
    stale = shard_stores(tmp_path, [])
    with stale.open(1) as store:
        store.apply([Put("old", T0, b"x")], {1: 3}, ingested_at_ms=now_ms() - 2 * 86_400_000)
    stores = shard_stores(tmp_path, [("node-a", url)])

    with stores.open(1) as store:
        assert (store.pending_count(), store.get("old")) == (2000, None)
    assert metric(stores, "delayq_store_rebuilds_total", reason="stale") == 1
    assert metric(stores, "delayq_store_copies_total") == 1


def test_a_copy_of_another_buffer_topic_is_not_used_and_the_buffer_is_read_from_its_start(holder, tmp_path):
    url, _, _ = holder
    stores = shard_stores(tmp_path, [("node-a", url)], topic_id="topic-2")  # the buffer was recreated since

    with stores.open(1) as store:
        assert (store.pending_count(), store.offsets()) == (0, {})
    assert metric(stores, "delayq_store_rebuilds_total", reason="topic-recreated") == 1


def test_a_node_of_member_processes_passes_on_the_copy_of_the_member_holding_the_shard(holder, tmp_path):
    url, _, _ = holder
    holding_none = HoldingNode(mock.Mock(spec_set=TimeIndex), tmp_path / "other")
    holding_none.store_copy = lambda shard: None  # type: ignore[method-assign]  # member 0 holds no shard
    other = NodeHTTPServer(holding_none, "127.0.0.1", 0)
    other.start()
    members = [Member(0, "box-0", other.port), Member(1, "box-1", int(url.rsplit(":", 1)[1]))]
    front = NodeHTTPServer(GroupView(types.SimpleNamespace(members=members, stopping=threading.Event())),
                           "127.0.0.1", 0, GroupHandler)
    front.start()
    try:
        path = tmp_path / "node-b" / "shards" / "1"
        path.parent.mkdir(parents=True)
        copied = copy_from_peers([("box", f"http://127.0.0.1:{front.port}")], 1, path)
        assert copied is not None
        with TimeIndex(path) as copy:
            assert copy.pending_count() == 2000
        assert copy_from_peers([("box", f"http://127.0.0.1:{front.port}")], 0, tmp_path / "node-b" / "shards" / "0") \
            is None  # no member holds shard 0: 421
    finally:
        front.stop()
        other.stop()


def test_on_a_cluster_with_zookeeper_credentials_only_its_nodes_get_a_copy(tmp_path, caplog):
    secured = Settings(cluster="orders", zk_auth="delayq:s3cret")
    with TimeIndex(tmp_path / "holder" / "store") as store:
        store.apply([Put("id", T0, b"payload")], {1: 1})
        http = NodeHTTPServer(HoldingNode(store, tmp_path / "holder", secured), "127.0.0.1", 0)
        http.start()
        try:
            peers = [("node-a", f"http://127.0.0.1:{http.port}")]
            shards = tmp_path / "node-b" / "shards"
            shards.mkdir(parents=True)
            assert copy_from_peers(peers, 1, shards / "1") is None  # asked without the proof
            assert "answered 401" in caplog.text
            other = Settings(cluster="orders", zk_auth="delayq:guess")
            assert copy_from_peers(peers, 1, shards / "1", store_copies.authorization(other, 1)) is None
            elsewhere = Settings(cluster="payments", zk_auth="delayq:s3cret")  # another cluster's proof
            assert copy_from_peers(peers, 1, shards / "1", store_copies.authorization(elsewhere, 1)) is None
            assert list(shards.iterdir()) == []
            copied = copy_from_peers(peers, 1, shards / "1", store_copies.authorization(secured, 1))
            assert copied is not None
        finally:
            http.stop()
    assert store_copies.authorization(Settings(), 1) is None  # no credentials: nothing to prove


def test_what_a_dead_process_was_sending_or_receiving_is_removed_at_the_next_start_and_stores_stay(holder, tmp_path):
    _, store, holder_dir = holder
    sending = make_copy(store, holder_dir)
    shards = tmp_path / "shards"
    (shards / "3.copy-1a2b3c4d").mkdir(parents=True)
    (shards / "3.copy-1a2b3c4d" / "000012.sst").write_bytes(b"half")
    with TimeIndex(shards / "3") as kept:
        kept.apply([Put("id", T0, b"x")], {3: 1})

    store_copies.remove_leftovers(holder_dir, shards)

    assert not sending.exists() and sorted(p.name for p in shards.iterdir()) == ["3"]
    with TimeIndex(shards / "3") as kept:
        assert kept.pending_count() == 1


def asked_peers(stores: ShardStores, peers: list[tuple[str, str]]) -> list[int]:
    """Give ``stores`` these holders; the list of the shards they were asked for."""
    asked: list[int] = []

    def holders(shard: int) -> list[tuple[str, str]]:
        asked.append(shard)
        return peers

    stores.peers = holders
    return asked


def test_a_copy_is_made_beside_the_placement_loop_and_the_shard_opened_after_it_is_not_copied_again(holder, tmp_path):
    url, _, _ = holder
    stores = shard_stores(tmp_path, [])
    asked = asked_peers(stores, [("node-a", url)])
    ended = threading.Event()

    assert stores.copying(1, ended.set), "no store here: a copy starts"
    assert ended.wait(30), "the copy ended and said so"
    assert not stores.copying(1, ended.set), "ended: the shard is taken now"
    with stores.open(1) as store:
        assert (store.pending_count(), store.offsets()) == (2000, {0: 2000, 3: 7})
    assert asked == [1] and metric(stores, "delayq_store_copies_total") == 1
    assert not stores.copying(1, ended.set), "a store is here"


def test_a_copy_that_did_not_come_leaves_the_shard_to_the_buffer_and_is_asked_for_once(tmp_path):
    stores = shard_stores(tmp_path, [])
    asked = asked_peers(stores, [("node-a", f"http://127.0.0.1:{closed_port()}")])
    ended = threading.Event()

    assert stores.copying(1, ended.set) and ended.wait(30)
    assert not stores.copying(1, ended.set)
    with stores.open(1) as store:
        assert (store.pending_count(), store.offsets()) == (0, {}), "an empty store: ingest reads the buffer"
    assert asked == [1], "open() did not ask the same holders again"
    assert metric(stores, "delayq_store_copies_total") == 0


def test_no_copy_is_started_without_holders_to_ask(tmp_path):
    stores = shard_stores(tmp_path, [])
    stores.peers = None  # DELAYQ_STORE_COPIES=false

    assert not stores.copying(1, lambda: None)


def format_marker(path: Path, marker: bytes) -> None:
    """Write a store format marker into the closed store at ``path`` (as a delayq of another format would)."""
    names = rocksdict.Rdict.list_cf(str(path), rocksdict.Options(raw_mode=True))
    db = rocksdict.Rdict(str(path), rocksdict.Options(raw_mode=True),
                         column_families={name: rocksdict.Options(raw_mode=True) for name in names})
    db.get_column_family("meta")[b"sys/format"] = marker
    db.close()


def test_a_store_of_a_format_this_code_cannot_read_is_replaced_by_a_holders_copy(holder, tmp_path):
    url, _, _ = holder
    with shard_stores(tmp_path, []).open(1) as store:
        store.apply([Put("old", T0, b"x")], {1: 3}, ingested_at_ms=now_ms())
    format_marker(tmp_path / "node-b" / "shards" / "1", b"delayq-time-index-3")
    stores = shard_stores(tmp_path, [("node-a", url)])

    with stores.open(1) as store:
        assert (store.pending_count(), store.get("old"), store.offsets()) == (2000, None, {0: 2000, 3: 7})
    assert metric(stores, "delayq_store_rebuilds_total", reason="format") == 1
    assert metric(stores, "delayq_store_copies_total") == 1


class NewerHolder(HoldingNode):
    """A holder whose copies say a store format newer than this code's (as a newer delayq's would)."""

    def store_copy(self, shard: int) -> Path | None:
        copy = super().store_copy(shard)
        if copy is not None:
            format_marker(copy, b"delayq-time-index-9")
        return copy


def test_a_holders_copy_of_a_format_this_code_cannot_read_is_not_used(tmp_path):
    with TimeIndex(tmp_path / "holder" / "store") as holding:
        holding.apply([Put("n", T0, b"x")], {1: 1}, ingested_at_ms=now_ms())
        http = NodeHTTPServer(NewerHolder(holding, tmp_path / "holder"), "127.0.0.1", 0)
        http.start()
        try:
            stores = shard_stores(tmp_path, [("node-a", f"http://127.0.0.1:{http.port}")])
            with shard_stores(tmp_path, []).open(1):
                pass
            format_marker(tmp_path / "node-b" / "shards" / "1", b"delayq-time-index-3")
            with stores.open(1) as store:
                assert (store.pending_count(), store.offsets()) == (0, {}), "an empty store: the buffer is read"
        finally:
            http.stop()
    assert metric(stores, "delayq_store_copies_total") == 1
    assert not list((tmp_path / "node-b" / "shards").glob("1.copy-*")), "nothing of the copy is left"
