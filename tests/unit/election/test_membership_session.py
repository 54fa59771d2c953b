"""A node's registration when kazoo has just lost its session: a ZooKeeper error to retry, never a crash.

kazoo drops ``client_id`` when a session is lost, which can happen between the read of the
registration and the check of its owner (the chaos soak saw a node's membership loop die of
a TypeError there after a SIGSTOP past its session). Stand-in client (``spec_set``): no server.
"""

from __future__ import annotations

from types import SimpleNamespace
from unittest import mock

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionLoss, KazooException

from delayq.election import Membership, NodeRecord, Role


def registration(owner: int) -> SimpleNamespace:
    return SimpleNamespace(ephemeralOwner=owner, version=3, mzxid=7)


def test_a_publish_after_the_session_was_lost_is_a_zookeeper_error_to_retry():
    client = mock.Mock(spec_set=KazooClient)
    client.exists.return_value = registration(owner=42)
    client.client_id = None  # lost between the read and the owner check
    membership = Membership(client, "/delayq/c", "node-a")

    with pytest.raises(ConnectionLoss) as lost:
        membership.publish(NodeRecord(node_id="node-a", role=Role.STANDBY))
    assert isinstance(lost.value, KazooException)  # what the node's membership loop waits out
    client.set.assert_not_called()


def test_a_publish_with_its_session_updates_its_own_registration():
    client = mock.Mock(spec_set=KazooClient)
    client.exists.return_value = registration(owner=42)
    client.client_id = (42, b"password")
    Membership(client, "/delayq/c", "node-a").publish(NodeRecord(node_id="node-a", role=Role.STANDBY))
    client.set.assert_called_once()
    assert client.set.call_args.kwargs["version"] == 3


def test_a_withdraw_after_the_session_was_lost_deletes_nothing_and_does_not_raise():
    client = mock.Mock(spec_set=KazooClient)
    client.exists.return_value = registration(owner=42)
    client.client_id = None
    Membership(client, "/delayq/c", "node-a").withdraw()
    client.delete.assert_not_called()
