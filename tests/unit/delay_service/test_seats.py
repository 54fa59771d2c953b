"""The shards a node holds and its placement (delay_service/seats.py, Seats): take, drop, contend, hand over.

Pure: the membership comes from a stand-in registration, each shard's election line from a stand-in ZooKeeper,
stores and ingest are stand-ins (spec_set); no servers. The rules themselves are placement.py's (test_placement.py).
"""

from __future__ import annotations

import logging
from unittest import mock

import pytest
from kazoo.exceptions import ConnectionLoss
from support.stand_ins import shard_feed, zookeeper

from delayq.delay_service import seats as seats_module
from delayq.delay_service.handoff import Wakeup
from delayq.delay_service.ingest import Ingest
from delayq.delay_service.loops import Loops
from delayq.delay_service.metrics import NodeMetrics
from delayq.delay_service.placement import holders
from delayq.delay_service.registration import Registration
from delayq.delay_service.seats import MASTERLESS_S, Seat, Seats
from delayq.delay_service.stores import ShardStores
from delayq.election import Leadership, NodeRecord, Role, ShardLayout, Term
from delayq.settings import Settings
from delayq.store import TimeIndex


class Cluster:
    """Node ``node-a``'s seats over stand-ins: the test says who is registered and who is in each election's line."""

    def __init__(self, shards: int, replicas: int = 0):
        self.settings = Settings(cluster="orders", node_id="node-a", replicas=replicas)
        self.records: dict[str, NodeRecord] = {"node-a": NodeRecord("node-a", Role.STANDBY)}
        self.lines: dict[int, list[str]] = {k: [] for k in range(shards)}
        self.zk = zookeeper({})
        self.zk.Lock.side_effect = self._lock
        self.stores = mock.create_autospec(ShardStores, spec_set=True, instance=True)
        self.stores.open.side_effect = self._open
        self.stores.level_due.return_value = False
        self.stores.copying.return_value = False  # every shard has its store here unless a test says otherwise
        self.opened: dict[int, mock.Mock] = {}
        self.ingest = mock.create_autospec(Ingest, spec_set=True, instance=True)
        self.ingest.feed.side_effect = self._feed
        self.registration = mock.create_autospec(Registration, spec_set=True, instance=True)
        self.registration.members.side_effect = lambda: dict(self.records)
        self.loops = Loops()
        self.metrics = NodeMetrics()
        self.seats = Seats(self.settings, self.metrics, self.zk, self.stores, self.ingest,
                           ShardLayout(shards=shards, partitions=shards), self.registration, self.loops)

    def register(self, node_id: str, *, ready: tuple[int, ...] = ()) -> None:
        self.records[node_id] = NodeRecord(node_id, Role.STANDBY, ready=ready)

    def leadership(self, shard: int, *, term: Term | None = None) -> mock.Mock:
        """Put a stand-in election in shard ``shard``'s seat (this node masters it under ``term``, if given)."""
        leadership = mock.create_autospec(Leadership, spec_set=True, instance=True)
        leadership.term, leadership.waiting, leadership.stopping = term, False, False
        seat = self.seats.get(shard)
        assert seat is not None
        seat.leadership = leadership
        seat.wakeup = mock.create_autospec(Wakeup, spec_set=True, instance=True)
        return leadership

    def _lock(self, path: str, identifier: str | None = None) -> mock.Mock:
        lock = mock.Mock(spec_set=["contenders", "acquire", "cancel", "release"])
        shard = int(path.split("/shards/")[1].split("/")[0])  # <root>/shards/<k>/election
        lock.contenders.side_effect = lambda: list(self.lines[shard])
        return lock

    def _open(self, shard: int) -> mock.Mock:
        store = mock.create_autospec(TimeIndex, spec_set=True, instance=True)
        store.pending_count.return_value = 0
        self.opened[shard] = store
        return store

    @staticmethod
    def _feed(shard: int, store: TimeIndex, metrics, **_callbacks) -> mock.Mock:
        feed = shard_feed([shard], shard=shard)
        feed.store, feed.ready = store, False
        return feed


@pytest.fixture
def clock(monkeypatch) -> list[float]:
    now = [1000.0]
    monkeypatch.setattr(seats_module.time, "monotonic", lambda: now[0])
    return now


def test_at_start_a_node_opens_and_reads_only_the_shards_the_placement_gives_it():
    cluster = Cluster(shards=4, replicas=1)
    cluster.register("node-b")
    mine = [k for k, nodes in holders("orders", 4, ["node-a", "node-b"], 1).items() if "node-a" in nodes]

    cluster.seats.take_planned()

    assert cluster.seats.shards() == mine and sorted(cluster.opened) == mine and 0 < len(mine) < 4
    (feeds,), _ = cluster.ingest.hold.call_args
    assert [feed.shard for feed in feeds] == mine and [feed.store for feed in feeds] == [
        cluster.opened[k] for k in mine]
    assert cluster.metrics.shards_held._value.get() == len(mine)
    assert cluster.loops.threads == [], "no loop before start()"


def test_the_planned_master_contends_at_once():
    cluster = Cluster(shards=1)
    cluster.register("node-a", ready=(0,))
    cluster.register("node-b")  # not caught up on shard 0: it may not master it
    cluster.seats.take_planned()
    leadership = cluster.leadership(0)

    cluster.seats.place()

    seat = cluster.seats.get(0)
    assert seat is not None and seat.wanted
    leadership.recheck.assert_called_once_with()


def test_a_shard_planned_elsewhere_is_contended_for_once_it_has_had_no_master_for_a_while(clock):
    cluster = Cluster(shards=1)
    cluster.register("node-b", ready=(0,))  # the planned master; node-a has not caught up on the shard
    cluster.seats.take_planned()
    leadership = cluster.leadership(0)
    seat = cluster.seats.get(0)
    assert seat is not None

    cluster.seats.place()
    clock[0] += MASTERLESS_S - 0.5
    cluster.seats.place()
    assert not seat.wanted and not leadership.recheck.called, "node-b may still take it"

    clock[0] += 0.5
    cluster.seats.place()
    assert seat.wanted, "no master for 2 s: every holder caught up contends, and the lock picks one"
    leadership.recheck.assert_called_once_with()

    cluster.lines[0] = ["node-b"]
    cluster.seats.place()
    assert not seat.wanted, "a master again: node-a leaves the line"
    leadership.withdraw.assert_called_once_with()


def test_a_master_hands_a_shard_over_only_once_the_planned_master_is_next_in_line(caplog):
    cluster = Cluster(shards=1)
    cluster.register("node-b", ready=(0,))  # planned: node-a says it is not caught up
    cluster.seats.take_planned()
    leadership = cluster.leadership(0, term=Term(7))
    cluster.lines[0] = ["node-a", "node-c", "node-b"]

    cluster.seats.place()
    leadership.hand_over.assert_not_called()

    cluster.lines[0] = ["node-a", "node-b"]
    with caplog.at_level(logging.INFO, logger="delayq.node"):
        cluster.seats.place()
    leadership.hand_over.assert_called_once_with("handed over to node-b (balance)")
    seat = cluster.seats.get(0)
    assert seat is not None
    seat.wakeup.poke.assert_called_once_with()
    assert "handing shard 0 over to node-b (balance)" in caplog.text


def test_a_shard_is_dropped_once_its_new_holder_is_ready_and_its_store_goes_then(caplog):
    cluster = Cluster(shards=2, replicas=1)
    cluster.seats.take_planned()
    assert cluster.seats.shards() == [0, 1], "alone, node-a holds every shard"
    for shard in (0, 1):
        cluster.leadership(shard)
    cluster.register("node-b")
    moving = next(k for k, nodes in holders("orders", 2, ["node-a", "node-b"], 1).items() if nodes == ["node-b"])

    cluster.seats.place()
    assert cluster.seats.shards() == [0, 1], "node-b has not caught up on it: node-a keeps it"

    cluster.register("node-b", ready=(moving,))
    with caplog.at_level(logging.INFO, logger="delayq.node"):
        cluster.seats.place()

    assert cluster.seats.shards() == [1 - moving]
    cluster.opened[moving].close.assert_called_once_with()
    cluster.stores.destroy.assert_called_once_with(moving)
    (feeds,), _ = cluster.ingest.hold.call_args
    assert [feed.shard for feed in feeds] == [1 - moving]
    assert f"holding shards [{1 - moving}] (took none, dropped [{moving}])" in caplog.text


def test_a_master_keeps_a_shard_the_placement_moved_away_until_its_term_ends():
    cluster = Cluster(shards=2, replicas=1)
    cluster.seats.take_planned()
    for shard in (0, 1):
        cluster.leadership(shard, term=Term(3))
    moving = next(k for k, nodes in holders("orders", 2, ["node-a", "node-b"], 1).items() if nodes == ["node-b"])
    cluster.register("node-b", ready=(moving,))

    cluster.seats.place()

    assert cluster.seats.shards() == [0, 1]
    cluster.stores.destroy.assert_not_called()


def test_a_shard_gained_gets_its_election_loop_and_the_node_stopping_ends_it_and_closes_the_stores():
    cluster = Cluster(shards=2, replicas=1)
    cluster.register("node-b")
    cluster.seats.take_planned()
    kept = cluster.seats.shards()
    del cluster.records["node-b"]  # node-b is gone: node-a holds every shard

    cluster.seats.place()

    gained = [k for k in (0, 1) if k not in kept]
    assert cluster.seats.shards() == [0, 1] and sorted(cluster.opened) == [0, 1]
    assert [thread.name for thread in cluster.loops.threads] == [f"election-{k}" for k in gained]
    cluster.seats.end_terms()
    assert cluster.loops.stop_requested.is_set()
    assert not any(thread.is_alive() for thread in cluster.loops.threads), "every election loop ended"
    cluster.seats.close()
    for store in cluster.opened.values():
        store.close.assert_called_once_with()


def test_once_the_node_stops_a_shard_gained_is_not_taken():
    cluster = Cluster(shards=2, replicas=1)
    cluster.register("node-b")
    cluster.seats.take_planned()
    kept = cluster.seats.shards()
    cluster.seats.end_terms()
    del cluster.records["node-b"]

    cluster.seats.place()

    assert cluster.seats.shards() == kept and cluster.loops.threads == []
    (gained,) = [k for k in (0, 1) if k not in kept]
    cluster.opened[gained].close.assert_called_once_with()  # opened, then closed again


def test_the_placement_loop_outlives_zookeeper_not_answering(caplog):
    cluster = Cluster(shards=1)

    def away() -> dict[str, NodeRecord]:
        cluster.loops.stop_requested.set()  # one round is enough
        raise ConnectionLoss()

    cluster.registration.members.side_effect = away
    cluster.seats.place_soon.set()
    with caplog.at_level(logging.INFO, logger="delayq.node"):
        cluster.seats.run()

    assert "placement: ZooKeeper did not answer (ConnectionLoss); trying again" in caplog.text
    assert cluster.loops.failure is None


def test_a_seat_contends_only_while_wanted_caught_up_and_not_stopping():
    cluster = Cluster(shards=1)
    seat = Seat(cluster.settings, cluster.zk, 0, cluster._open(0), cluster.ingest, cluster.metrics.shard(0),
                lambda: None)
    assert not seat.may_contend() and not seat.mastering
    seat.wanted = True
    assert not seat.may_contend(), "not caught up on the shard yet"
    seat.feed.ready = True
    assert seat.may_contend()
    seat.leadership.stop()
    assert not seat.may_contend()


def test_a_shard_gained_without_a_store_is_taken_once_its_copy_ended_and_placement_goes_on_meanwhile():
    cluster = Cluster(shards=2, replicas=1)
    cluster.register("node-b")
    cluster.seats.take_planned()
    (kept,) = cluster.seats.shards()
    leadership = cluster.leadership(kept)
    cluster.register("node-a", ready=(kept,))
    del cluster.records["node-b"]  # node-b is gone: node-a should hold both shards and master both
    gained = 1 - kept
    under_way = {gained: True}
    cluster.stores.copying.side_effect = lambda shard, _done: under_way.get(shard, False)

    cluster.seats.place()

    assert cluster.seats.shards() == [kept] and gained not in cluster.opened, "not taken while its copy is under way"
    cluster.stores.copying.assert_called_with(gained, cluster.seats.place_soon.set)
    leadership.recheck.assert_called_once_with()  # the placement decided for the shard it holds all the same

    under_way[gained] = False
    cluster.seats.place()

    assert cluster.seats.shards() == [0, 1] and gained in cluster.opened
