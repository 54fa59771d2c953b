"""The producer's gate on the cluster's feature level (proxy/feature_gate.py), over a stand-in ZooKeeper.

A request that needs level 1 never reaches ZooKeeper; one that needs more reads the level the first
time and then follows it through a DataWatch; a request above the finalized level, or one that cannot
learn the level, is refused in one line before anything is sent.
"""

from __future__ import annotations

import pytest
from support.stand_ins import zookeeper

import delayq
import delayq.election
from delayq.election import FeatureRecord
from delayq.errors import UnavailableError
from delayq.proxy.feature_gate import READ_TIMEOUT_S, FeatureGate, LevelNotFinalized
from delayq.settings import Settings

SETTINGS = Settings(cluster="orders", zk_connect="zk-0:2181")
PATH = "/delayq/orders/features"
LEVEL_2 = FeatureRecord(level=2, introduced_by="0.2.0", finalized_at_ms=1_767_225_600_000, finalized_by="0.2.0")
UNANSWERED = ("ZooKeeper at zk-0:2181 did not answer within 10s: is it running and is DELAYQ_ZK_CONNECT right? "
              "(timed out)")


@pytest.fixture
def znodes() -> dict[str, bytes]:
    return {}


@pytest.fixture
def connections(monkeypatch, znodes) -> list:
    """The stand-in clients the gate connected, in order (each call of delayq.election.connect_for makes one)."""
    made: list = []

    def connect_for(settings: Settings, *, timeout_s: float):
        assert (settings.zk_connect, timeout_s) == ("zk-0:2181", READ_TIMEOUT_S)
        made.append(zookeeper(znodes))
        return made[-1]

    monkeypatch.setattr(delayq.election, "connect_for", connect_for)
    return made


def test_a_request_of_level_1_never_reaches_zookeeper(monkeypatch):
    def unreachable(settings, *, timeout_s):
        raise AssertionError("level 1 asked ZooKeeper")

    monkeypatch.setattr(delayq.election, "connect_for", unreachable)
    FeatureGate(SETTINGS).require_level(1, "a delayed message")


def test_a_request_above_the_finalized_level_is_refused_in_one_line_with_the_fix(connections):
    with pytest.raises(LevelNotFinalized) as refused:
        FeatureGate(SETTINGS).require_level(2, "expires=")
    assert isinstance(refused.value, ValueError)
    assert str(refused.value) == ("expires= needs feature level 2 (delayq 0.2.0), but cluster orders is finalized at "
                                  "level 1: upgrade every node to delayq 0.2.0 or later, then run `delayq upgrade "
                                  "finalize`")
    [client] = connections
    assert client.exists.call_args.args[0] == PATH and client.exists.call_args.kwargs["watch"] is not None, \
        "a watch on the znode's creation"


def test_a_level_seen_is_not_asked_again_levels_only_rise(connections, znodes):
    znodes[PATH] = LEVEL_2.to_json()
    gate = FeatureGate(SETTINGS)
    gate.require_level(2, "expires=")
    gate.require_level(2, "expires=")
    [client] = connections
    assert client.get.call_count == 1


def test_a_finalize_is_seen_through_the_watch_without_a_new_producer(connections, znodes):
    gate = FeatureGate(SETTINGS)
    with pytest.raises(LevelNotFinalized):
        gate.require_level(2, "expires=")
    with pytest.raises(LevelNotFinalized):
        gate.require_level(2, "expires=")
    [client] = connections
    assert client.exists.call_count == 1, "unchanged: the reading stands until the watch says otherwise"
    changed = client.exists.call_args.kwargs["watch"]
    znodes[PATH] = LEVEL_2.to_json()
    changed(object())  # ZooKeeper's notice of the finalize (its WatchedEvent)
    gate.require_level(2, "expires=")
    assert len(connections) == 1


def test_a_lost_session_makes_the_next_request_read_again(connections, znodes):
    from kazoo.client import KazooState

    gate = FeatureGate(SETTINGS)
    with pytest.raises(LevelNotFinalized):
        gate.require_level(2, "expires=")
    [client] = connections
    [listener] = [call.args[0] for call in client.add_listener.call_args_list]
    znodes[PATH] = LEVEL_2.to_json()
    listener(KazooState.SUSPENDED)
    with pytest.raises(LevelNotFinalized):
        gate.require_level(2, "expires=")
    listener(KazooState.LOST)  # its watches went with the session
    gate.require_level(2, "expires=")


def test_a_damaged_record_refuses_what_needs_a_higher_level_saying_why(connections, znodes):
    znodes[PATH] = b"garbage"
    with pytest.raises(LevelNotFinalized) as refused:
        FeatureGate(SETTINGS).require_level(2, "expires=")
    assert str(refused.value).startswith("expires= needs feature level 2, and cluster orders's level cannot be read: "
                                         f"ZooKeeper node {PATH} does not hold a delayq feature record")
    assert "\n" not in str(refused.value)


def test_zookeeper_not_answering_is_one_line_and_the_next_request_asks_again(monkeypatch, connections):
    def unanswered(settings, *, timeout_s):
        raise UnavailableError(UNANSWERED)

    monkeypatch.setattr(delayq.election, "connect_for", unanswered)
    gate = FeatureGate(SETTINGS)
    with pytest.raises(UnavailableError) as refused:
        gate.require_level(2, "expires=")
    assert str(refused.value) == ("expires= needs feature level 2, and whether cluster orders is finalized at it is "
                                  f"recorded in ZooKeeper, which did not answer: {UNANSWERED}")
    monkeypatch.undo()
    monkeypatch.setattr(delayq.election, "connect_for", lambda settings, *, timeout_s: zookeeper({PATH: LEVEL_2.to_json()}))
    gate.require_level(2, "expires=")


def test_closing_the_gate_closes_its_zookeeper_client_and_a_gate_that_never_connected_has_none(connections):
    FeatureGate(SETTINGS).close()
    gate = FeatureGate(SETTINGS)
    with pytest.raises(LevelNotFinalized):
        gate.require_level(2, "expires=")
    gate.close()
    [client] = connections
    client.stop.assert_called_once_with()
    client.close.assert_called_once_with()


def test_the_producer_has_a_gate_of_its_settings_and_closes_it_with_itself(connections):
    producer = delayq.Producer({"bootstrap.servers": "127.0.0.1:9", "log_level": 0, "delayq.cluster": "orders",
                                "delayq.zk.connect": "zk-0:2181"})
    with pytest.raises(LevelNotFinalized, match="cluster orders is finalized at level 1"):
        producer.level_gate.require_level(2, "expires=")
    producer.close()
    [client] = connections
    client.close.assert_called_once_with()
