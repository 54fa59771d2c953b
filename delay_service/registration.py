"""A node's registration in ZooKeeper (``nodes/<id>``): what it says, and keeping it published.

The other nodes place shards from these registrations (placement.py), and ``delayq
status`` shows them. A node claims its id once at start, publishes its registration
every second and whenever one of its terms begins or ends, and withdraws it at stop.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException

from delayq.clock import now_ms
from delayq.election import DuplicateNodeId, Membership, NodeRecord, Role
from delayq.settings import Settings

from .loops import Loops

if TYPE_CHECKING:
    from .seats import Seat

log = logging.getLogger("delayq.node")

# How often the registration is published while nothing else asks for it.
PUBLISH_EVERY_S = 1.0


def node_record(settings: Settings, *, http_port: int | None, lag: int | None, seats: Iterable[Seat], epoch: int,
                started: bool) -> NodeRecord:
    """What a node's registration says of it now: where it answers, how far ingest is, the shards it holds.

    Args:
        http_port: the port its HTTP server listens on; None before it does.
        lag: buffer records its ingest has not read yet; None until first known.
        seats: the shards it holds.
        epoch: of its latest term, of any shard.
        started: whether its loops run (before, it registers as starting).
    """
    # Listening everywhere: advertise the FQDN, which other pods resolve (a StatefulSet
    # pod's short name alone does not resolve outside its own /etc/hosts).
    host = socket.getfqdn() if settings.http_host in ("0.0.0.0", "::") else settings.http_host
    held = list(seats)
    masters = tuple(seat.shard for seat in held if seat.mastering)
    role = Role.MASTER if masters else Role.STANDBY if started else Role.STARTING
    return NodeRecord(node_id=settings.node_id, role=role, host=host,
                      http=f"http://{host}:{http_port}" if http_port is not None else None,
                      lag=lag, pending=sum(seat.store.pending_count() for seat in held),
                      epoch=epoch, updated_at_ms=now_ms(),
                      shards=tuple(seat.shard for seat in held),
                      ready=tuple(seat.shard for seat in held if seat.feed.ready), masters=masters,
                      store_format=min((seat.store.store_format for seat in held), default=None),
                      group=settings.node_group)


class Registration:
    """This node's registration: claimed at start, published while it runs, withdrawn at stop.

    ``describe()`` says what the node is at that moment (:func:`node_record`). A publication
    that fails (ZooKeeper away, or refusing the write) is tried again a second later; an outage
    is logged when it begins and when it ends, not once a second. Another live node
    registered under this node's id fails the node (:class:`~delayq.election.DuplicateNodeId`).

    Example:
        >>> registration = Registration(settings, zk, describe, loops)
        >>> registration.claim(); loops.spawn("membership", registration.run)
    """

    def __init__(self, settings: Settings, zk: KazooClient, describe: Callable[[], NodeRecord], loops: Loops):
        self._settings = settings
        self._zk = zk
        self._describe = describe
        self._loops = loops
        self._membership = Membership(zk, settings.zk_root, settings.node_id)
        # Since when (monotonic s) the registration could not be published; None while it can.
        self._unpublished: float | None = None

    def record(self) -> NodeRecord:
        """This node's registration as it is now (not as last published)."""
        return self._describe()

    def members(self) -> dict[str, NodeRecord]:
        """Node id -> registration of every live node, this node's as it is now.

        Raises:
            KazooException: ZooKeeper did not answer.
        """
        records = {record.node_id: record for record in Membership.members(self._zk, self._settings.zk_root)}
        records[self._settings.node_id] = self.record()
        return records

    def claim(self) -> None:
        """Register this node; a registration of its id left by its previous process goes when that session expires.

        Raises:
            DuplicateNodeId: another live node holds the id.
        """
        self._membership.claim(self.record(), timeout_s=self._settings.zk_session_timeout_ms / 1000 + 2)

    def run(self) -> None:
        """Publish every second until the node stops. Blocks: the ``membership`` thread's."""
        while not self._loops.stopping.is_set():
            self.publish()
            self._loops.stopping.wait(PUBLISH_EVERY_S)

    def publish(self) -> None:
        """Publish the registration now; a failure is logged (once an outage) and left to the next call."""
        try:
            if not self._zk.connected:
                # kazoo would queue the write and block until the connection is back: say why instead.
                self._not_published(f"ZooKeeper session {self._zk.state.lower()}: no connection to "
                                    f"{self._settings.zk_connect}")
                return
            self._membership.publish(self.record())
        except DuplicateNodeId as err:
            log.error("%s; stopping", err)
            self._loops.fail(err)
            return
        except KazooException as err:
            self._not_published(f"ZooKeeper refused the write: {str(err) or type(err).__name__}")
            return
        if self._unpublished is not None:
            log.info("membership published again after %.0fs", time.monotonic() - self._unpublished)
            self._unpublished = None

    def withdraw(self) -> None:
        """Remove the registration (if ZooKeeper is there: else it goes with the session)."""
        self._membership.withdraw()

    def _not_published(self, reason: str) -> None:
        """Log the first failure of an outage (not one line a second), with why."""
        if self._unpublished is None:
            self._unpublished = time.monotonic()
            log.warning("membership not published: %s; trying again every second", reason)
