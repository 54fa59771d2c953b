"""A node's registration (delay_service/registration.py): what it says, publishing it, and an outage.

Pure: ZooKeeper is a stand-in over a dict of znodes (support.stand_ins.zookeeper), the seats small objects.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from unittest import mock

from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionLoss
from support.stand_ins import zookeeper

from delayq.delay_service import registration as registration_module
from delayq.delay_service.loops import Loops
from delayq.delay_service.registration import Registration, node_record
from delayq.election import DuplicateNodeId, NodeRecord, Role
from delayq.settings import Settings
from delayq.store import TimeIndex

SETTINGS = Settings(cluster="orders", node_id="node-a", zk_connect="zk:2181")
OWN = f"{SETTINGS.zk_root}/nodes/node-a"


@dataclass
class HeldShard:
    """What a registration reads of a seat."""

    shard: int
    mastering: bool = False
    ready: bool = True
    pending: int = 0
    store_format: int = 5
    store: mock.Mock = field(init=False)
    feed: mock.Mock = field(init=False)

    def __post_init__(self) -> None:
        self.store = mock.create_autospec(TimeIndex, spec_set=True, instance=True)
        self.store.pending_count.return_value = self.pending
        self.store.store_format = self.store_format
        self.feed = mock.Mock(spec_set=["ready"])
        self.feed.ready = self.ready


def registered(znodes: dict[str, bytes], record: NodeRecord | None = None) -> tuple[Registration, mock.Mock, Loops]:
    """A registration of node-a on a stand-in ZooKeeper whose session owns node-a's znode, saying ``record``."""
    zk = zookeeper(znodes)
    zk.client_id = (0, b"")  # the stand-in's znodes are owned by session 0: this session's
    zk.connected = True
    loops = Loops()
    said = record or NodeRecord(node_id="node-a", role=Role.STANDBY, shards=(1,))
    return Registration(SETTINGS, zk, lambda: said, loops), zk, loops


def test_the_record_says_where_the_node_answers_and_what_it_holds_masters_and_has_caught_up_on():
    seats = [HeldShard(0, mastering=True, pending=3, store_format=5), HeldShard(2, ready=False, pending=4,
                                                                            store_format=4)]

    record = node_record(SETTINGS, http_port=8080, lag=7, seats=seats, epoch=9, started=True)

    assert (record.node_id, record.role, record.http, record.lag, record.epoch) == (
        "node-a", Role.MASTER, "http://127.0.0.1:8080", 7, 9)
    assert (record.shards, record.ready, record.masters) == ((0, 2), (0,), (0,))
    assert record.pending == 7 and record.store_format == 4, "the oldest store format among those held"
    assert record.group is None and record.updated_at_ms is not None


def test_a_node_is_starting_until_its_loops_run_then_a_standby_while_it_masters_nothing():
    starting = node_record(SETTINGS, http_port=None, lag=None, seats=[], epoch=0, started=False)
    standby = node_record(SETTINGS, http_port=8080, lag=0, seats=[HeldShard(1)], epoch=0, started=True)

    assert (starting.role, starting.http, starting.store_format, starting.pending) == (Role.STARTING, None, None, 0)
    assert standby.role == Role.STANDBY


def test_a_node_listening_everywhere_advertises_its_fully_qualified_name(monkeypatch):
    monkeypatch.setattr(registration_module.socket, "getfqdn", lambda: "node-a.nodes.delayq.svc.cluster.local")
    everywhere = SETTINGS.model_copy(update={"http_host": "0.0.0.0", "node_group": "node"})

    record = node_record(everywhere, http_port=8080, lag=0, seats=[], epoch=0, started=True)

    assert record.host == "node-a.nodes.delayq.svc.cluster.local"
    assert record.http == "http://node-a.nodes.delayq.svc.cluster.local:8080" and record.group == "node"


def test_publishing_writes_the_record_as_it_is_now_and_the_members_count_this_node_as_it_is_now():
    other = NodeRecord(node_id="node-b", role=Role.MASTER, masters=(0,))
    znodes = {f"{SETTINGS.zk_root}/nodes/node-b": other.to_json()}
    registration, _, _ = registered(znodes)

    assert registration.members() == {"node-b": other, "node-a": registration.record()}, "before any publication"
    registration.publish()
    assert NodeRecord.from_json(znodes[OWN]) == registration.record()


def test_an_outage_is_logged_when_it_begins_and_when_it_ends_not_once_a_second(caplog):
    znodes: dict[str, bytes] = {}
    registration, zk, loops = registered(znodes)
    create = zk.create.side_effect
    zk.create.side_effect = ConnectionLoss()

    with caplog.at_level(logging.INFO, logger="delayq.node"):
        registration.publish()
        registration.publish()
        zk.create.side_effect = create
        registration.publish()

    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "membership not published: ZooKeeper refused the write: ConnectionLoss; trying again every second"
    assert len(lines) == 2 and lines[1].startswith("membership published again after")
    assert OWN in znodes and loops.failure is None and not loops.stop_requested.is_set()


def test_without_a_connection_it_says_why_and_writes_nothing_kazoo_would_queue(caplog):
    zk = mock.Mock(spec_set=[*dir(KazooClient), "state"])  # state: set per instance by KazooClient.__init__
    zk.connected, zk.state = False, "SUSPENDED"
    registration = Registration(SETTINGS, zk, lambda: NodeRecord("node-a", Role.STANDBY), Loops())

    with caplog.at_level(logging.WARNING, logger="delayq.node"):
        registration.publish()

    assert caplog.records[0].getMessage() == (
        "membership not published: ZooKeeper session suspended: no connection to zk:2181; trying again every second")
    zk.exists.assert_not_called()
    zk.create.assert_not_called()


def test_another_live_node_under_this_id_fails_the_node(caplog):
    registration, zk, loops = registered({OWN: b"{}"})
    zk.client_id = (7, b"")  # the registration's znode is of session 0: another node's

    with caplog.at_level(logging.ERROR, logger="delayq.node"):
        registration.publish()

    assert isinstance(loops.failure, DuplicateNodeId) and loops.stop_requested.is_set()
    assert "stopping" in caplog.text


def test_the_membership_loop_publishes_until_the_node_stops_and_withdraw_removes_the_registration():
    znodes: dict[str, bytes] = {}
    registration, zk, loops = registered(znodes)
    published = threading.Event()
    zk.create.side_effect = lambda path, value=b"", **_: (znodes.__setitem__(path, value), published.set())

    thread = threading.Thread(target=registration.run)
    thread.start()
    assert published.wait(5)
    loops.stopping.set()
    thread.join(5)

    assert not thread.is_alive() and OWN in znodes
    registration.withdraw()
    zk.delete.assert_called_once_with(OWN, version=0)


def test_a_claim_registers_the_node_as_it_is_at_start():
    znodes: dict[str, bytes] = {}
    registration, zk, _ = registered(znodes, NodeRecord("node-a", Role.STARTING))

    registration.claim()

    assert NodeRecord.from_json(znodes[OWN]) == NodeRecord("node-a", Role.STARTING)
    assert zk.create.call_args.kwargs["ephemeral"], "it goes with the session"
