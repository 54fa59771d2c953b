"""One delay-service node: ingest of the shards it holds, delivery of those it masters, HTTP, registration.

Threads: ``ingest`` (buffer -> the held shards' stores), ``election-<k>`` per held shard
(contends while the placement says so; runs the shard's delivery while master),
``placement`` (which shards this node should hold and master, from ZooKeeper
membership, every half second: see seats.py and placement.py), ``membership``
(publishes role, shards, lag and pending to ZooKeeper every second: registration.py),
``insync-watch``, ``http``. :meth:`Node.stop` ends every term at once (the batch in
flight commits or aborts first), so other nodes take over without waiting for the
session timeout.

The node wires its parts together and answers the HTTP endpoints; the parts own their
state: :class:`~.seats.Seats` the shards held, :class:`~.registration.Registration` the
registration, :class:`~.loops.Loops` the threads and the node's failure.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from delayq import __version__, wire
from delayq.election import (
    Features,
    Membership,
    NodeRecord,
    Role,
    ShardLayout,
    check_node_speaks,
    connect_for,
    ensure_cluster_root,
)
from delayq.settings import Settings
from delayq.signals import StopSignals
from delayq.store import StoredEntry

from . import collector
from .delivery import Delivery
from .http import NodeHTTPServer
from .ingest import Ingest
from .insync import InSyncWatch
from .layout import ensure_layout
from .loops import Loops
from .members import runs_console
from .metrics import NodeMetrics
from .registration import Registration, node_record
from .seats import Seat, Seats
from .shard_answers import ShardAnswers
from .store_copies import authorized, make_copy, remove_leftovers
from .stores import MEMBERS_DIR, SHARDS_DIR, ShardStores, forget_stores
from .topics import EndOffsets, admin_client, buffer_info

if TYPE_CHECKING:
    from .console import ConsoleApp

log = logging.getLogger("delayq.node")

# A loop failing this long makes the node not ready (a blip of one retry does not).
FAILING_NOT_READY_S = 2.0


class Node:
    """A delay-service node.

    Example:
        >>> Node(Settings()).run()   # start, serve until SIGTERM or SIGINT, stop; returns the exit code

    Or, embedded: ``node.start()``, later ``node.stop()``.
    """

    def __init__(self, settings: Settings):
        self.settings = settings
        self.metrics = NodeMetrics()
        self.loops = Loops()
        self.layout: ShardLayout | None = None
        self.ingest: Ingest | None = None
        self.http: NodeHTTPServer | None = None
        # Made once ZooKeeper and the buffer are known (start).
        self.stores: ShardStores | None = None
        self.registration: Registration | None = None
        self.seats: Seats | None = None
        # The console under /console on the HTTP port (DELAYQ_CONSOLE=true), made at start.
        self._console: ConsoleApp | None = None
        # Whether Kafka can take acknowledged writes where this node writes (enough in-sync replicas).
        self.insync = InSyncWatch(settings, self._written_partitions)

    @property
    def _stores(self) -> ShardStores:
        if self.stores is None:
            raise RuntimeError("the node has not started: its stores are made once the buffer is known")
        return self.stores

    # -- lifecycle -------------------------------------------------------

    def start(self) -> None:
        s = self.settings
        self.admin = admin_client(s)
        self.info = buffer_info(s, self.admin)
        self.stores = ShardStores(s, self.info, self.metrics, self.admin)
        remove_leftovers(s.data_dir, s.data_dir / SHARDS_DIR)
        try:
            self._start_serving()
        except BaseException:
            # stop() never runs for a node that did not start: its buffer reader must not outlive it,
            # nor its stores stay open.
            if self.ingest is not None:
                self.ingest.close()
            if self.seats is not None:
                self.seats.close()
            self._close_console()
            raise

    def _start_serving(self) -> None:
        """The console, HTTP, ZooKeeper, ingest and the shards to hold, membership and the loops."""
        s = self.settings
        if runs_console(s):
            # Imported only when asked: a node without the console does not load Flask. Made before anything of
            # the cluster is touched, so that a console that cannot start (no Flask, half a login) stops the node.
            from .console import node_app

            self._console = node_app(s)
        self.http = NodeHTTPServer(self, s.http_host, s.http_port)
        self.http.start()
        self.zk = connect_for(s)
        # A node that does not speak the cluster's finalized feature level exits here, with one line, before it
        # writes to ZooKeeper or opens a store: what it would write or keep could be of an older level.
        finalized = Features(self.zk, s.zk_root).read()
        if finalized.problem is not None:
            log.warning("%s; the node starts all the same", finalized.problem)
        check_node_speaks(finalized, s.cluster)
        # A node with wrong or missing credentials exits here, with one line, before it touches the cluster.
        ensure_cluster_root(self.zk, s.zk_root, s.zk_credentials, protect_existing=False)
        stores = self._stores
        self.layout = stores.layout = layout = ensure_layout(s, self.zk, len(self.info.partitions))
        stores.follow_level(self.zk, [])  # after ensure_layout, which records a new cluster's level
        self.ingest = ingest = Ingest(s, layout.shards, self.metrics, EndOffsets(s, self.info.partitions, self.admin),
                                            compaction_lag_ms=self.info.min_compaction_lag_ms)
        stores.end_offsets = ingest.end_offsets
        if s.store_copies:
            stores.peers = self._store_peers
        if s.node_group is None:
            # Stores of members this node ran with DELAYQ_PROCESSES > 1 are no one's now.
            for folder in sorted((s.data_dir / MEMBERS_DIR).glob("*")):
                forget_stores(folder, "this node runs as one process now")
        self.registration = registration = Registration(s, self.zk, self._record, self.loops)
        self.seats = seats = Seats(s, self.metrics, self.zk, stores, ingest, layout, registration, self.loops)
        registration.claim()
        seats.take_planned()
        self.loops.spawn("ingest", lambda: ingest.run(self.loops.stopping))
        self.loops.spawn("membership", registration.run)
        self.loops.spawn("insync-watch", lambda: self.insync.run(self.loops.stopping))
        seats.start()
        log.info("node %s started: buffer %s (%d partitions, %d shards, replicas %s), holding shards %s, http on "
                 "%s:%d", s.node_id, s.buffer_topic, len(self.info.partitions), layout.shards,
                 s.replicas or "all", seats.shards(), s.http_host, self.http.port)

    def stop(self) -> None:
        """Finish the batches in flight, give up every leadership at once, stop every loop."""
        if self.loops.stopping.is_set():
            return
        log.info("node %s stopping", self.settings.node_id)
        if self.seats is not None:
            self.seats.end_terms()
        self.loops.stop_requested.set()
        self.loops.stopping.set()
        self.loops.join(30)
        if self.registration is not None:
            self.registration.withdraw()
        # Opened by start(); None only if it failed before it got to them.
        if self.ingest is not None:
            self.ingest.close()
        if self.http is not None:
            self.http.stop()
        self._close_console()
        self.zk.stop()
        self.zk.close()
        if self.seats is not None:
            self.seats.close()

    def run(self) -> int:
        """Start, serve until SIGTERM/SIGINT, stop; the exit code (0 on a clean stop)."""
        with StopSignals() as signals:
            if self.settings.gc_tuned:
                collector.tune()
            self.metrics.gc_pauses.watch()
            self.start()
            if self.settings.gc_tuned:
                collector.freeze_started()
            while not signals.sleep(0.2, until=self.loops.stop_requested.is_set):
                if self.loops.stop_requested.is_set() or self.loops.failure is not None:
                    break
            self.stop()
        self.metrics.gc_pauses.unwatch()
        return 0 if self.loops.failure is None else 1

    def _close_console(self) -> None:
        if self._console is not None:
            self._console.close()
            self._console = None

    def _record(self) -> NodeRecord:
        """This node's registration as it is now (Registration's ``describe``)."""
        seats = self.seats
        return node_record(self.settings, http_port=self.http.port if self.http is not None else None,
                           lag=self.ingest.lag if self.ingest is not None else None,
                           seats=seats.held() if seats is not None else (),
                           epoch=seats.epoch if seats is not None else 0, started=self.loops.started)

    # -- what the HTTP endpoints see (http.NodeView) -------------------------

    @property
    def registry(self) -> CollectorRegistry:
        return self.metrics.registry

    def shard_of(self, delay_id: str) -> tuple[int, bool]:
        shard = wire.shard_of(wire.buffer_partition(delay_id, len(self.info.partitions)), self.shard_count())
        return shard, self.seats is not None and self.seats.get(shard) is not None

    def _seat(self, shard: int) -> Seat | None:
        """The seat of ``shard`` if this node holds it."""
        return self.seats.get(shard) if self.seats is not None else None

    def entry(self, delay_id: str) -> StoredEntry | None:
        shard, _ = self.shard_of(delay_id)
        seat = self._seat(shard)
        return seat.store.get(delay_id) if seat is not None else None

    def shard_count(self) -> int:
        return self.layout.shards if self.layout is not None else 1

    def console_shard(self, shard: int) -> ShardAnswers | None:
        seat = self._seat(shard)
        if seat is None:
            return None
        return ShardAnswers(shard, seat.store, seat.metrics.recent, lambda: seat.mastering)

    def store_copy_allowed(self, shard: int, authorization: str | None) -> bool:
        return authorized(self.settings, shard, authorization)

    def store_copy(self, shard: int) -> Path | None:
        seat = self._seat(shard)
        if seat is None:
            return None
        return make_copy(seat.store, Path(self.settings.data_dir))

    def _store_peers(self, shard: int) -> list[tuple[str, str]]:
        """The other nodes holding ``shard`` (node id, HTTP address), those whose copy of it is ready first."""
        records = [r for r in Membership.members(self.zk, self.settings.zk_root)
                   if r.node_id != self.settings.node_id and shard in r.shards]
        records.sort(key=lambda r: shard not in r.ready)
        return [(r.node_id, r.http) for r in records if r.http]

    @property
    def console_app(self) -> ConsoleApp | None:
        return self._console

    def _written_partitions(self) -> tuple[list[int], list[str]]:
        """The buffer partitions and the transactional ids of the shards this node holds: what its masters write."""
        held = self.seats.shards() if self.seats is not None else []
        partitions = [p for p in self.info.partitions if wire.shard_of(p, self.shard_count()) in held]
        return partitions, [self.settings.transactional_id(shard) for shard in held]

    def alive(self) -> bool:
        return self.loops.alive()

    def ready(self) -> tuple[bool, str]:
        if not self.alive():
            return False, "a loop stopped"
        if self.ingest is None or self.ingest.lag is None:
            return False, "buffer end offsets not known yet"
        shortfall = self.insync.problem
        if shortfall is not None:
            # Nothing can be delivered (nor a master's term begin) until enough replicas are back.
            return False, shortfall
        seats = self.seats.held() if self.seats is not None else []
        loops: list[Ingest | Delivery | None] = [self.ingest, *(seat.delivery for seat in seats)]
        for loop in loops:
            if loop is None:
                continue
            since = loop.failing_since
            if since is not None and time.monotonic() - since > FAILING_NOT_READY_S:
                return False, f"{loop.failing} (for {time.monotonic() - since:.0f}s)"
        newer = self.ingest.held_for_upgrade
        if newer:
            # Not a loop that fails: the buffer holds what this version cannot read; waiting is right.
            return False, ("buffer partitions hold records of a feature level this node cannot read (delayq "
                           f"{__version__} reads up to level {wire.WIRE_LEVEL}): " + ", ".join(
                               f"partition {p} at offset {offset} (level {level})"
                               for p, (offset, level) in sorted(newer.items()))
                           + "; what follows there waits, nothing is dead-lettered: upgrade this node")
        behind = {seat.shard: seat.feed.lag for seat in seats if not seat.feed.caught_up}
        if behind:
            return False, "ingest is behind the buffer on shards " + ", ".join(
                f"{shard} ({lag if lag is not None else '?'} records)" for shard, lag in sorted(behind.items()))
        mastered = [seat.shard for seat in seats if seat.mastering]
        return True, (f"caught up on shards {[seat.shard for seat in seats]} "
                      + (f"(master of {mastered})" if mastered else f"({Role.STANDBY.value})"))

