"""One delay-service node: ingest of the shards it holds, delivery of those it masters, HTTP, registration.

Threads: ``ingest`` (buffer -> the held shards' stores), ``election-<k>`` per held shard
(contends while the placement says so; runs the shard's delivery while master),
``placement`` (which shards this node should hold and master, from ZooKeeper
membership, every half second: see placement.py), ``membership`` (publishes role,
shards, lag and pending to ZooKeeper every second), ``http``. :meth:`Node.stop` ends
every term at once (the batch in flight commits or aborts first), so other nodes take
over without waiting for the session timeout.
"""
from __future__ import annotations

import logging
import signal
import socket
import threading
import time

from confluent_kafka import KafkaException
from kazoo.exceptions import KazooException
from prometheus_client import CollectorRegistry

from delayq import __version__, wire
from delayq.clock import now_ms
from delayq.election import (
    Cursor,
    DuplicateNodeId,
    Features,
    Leadership,
    Membership,
    NodeRecord,
    Role,
    ShardLayout,
    Term,
    check_node_speaks,
    connect_for,
    ensure_cluster_root,
)
from delayq.settings import Settings
from delayq.store import StoredEntry, StoreError, TimeIndex

from .delivery import Delivery, InFlight, Wakeup
from .http import NodeHTTPServer
from .ingest import Ingest
from .insync import InSyncWatch
from .layout import ensure_layout
from .master_producer import SpareProducer
from .metrics import NodeMetrics
from .placement import holders, masters
from .reader import ReaderGone
from .stores import MEMBERS_DIR, ShardStores, forget_stores
from .topics import EndOffsets, admin_client, buffer_info

log = logging.getLogger("delayq.node")

# How often the placement looks at the membership (which shards to hold, to master, to hand over).
PLACE_EVERY_S = 0.5
# A shard without a master this long: every holder caught up on it contends, planned or not.
MASTERLESS_S = 2.0
# How long the placement waits for a dropped shard's election loop to end before it goes on (and closes
# the shard's store later, once the loop has ended).
DROP_WAIT_S = 10.0
# A loop failing this long makes the node not ready (a blip of one retry does not).
FAILING_NOT_READY_S = 2.0


class Seat:
    """One shard this node holds: its store and feed, its election, and its master's loop while it leads."""

    def __init__(self, node: Node, shard: int, store: TimeIndex, ingest: Ingest):
        self.shard = shard
        self.store = store
        self.metrics = node.metrics.shard(shard)
        self.in_flight = InFlight()
        self.wakeup = Wakeup()
        self.feed = ingest.feed(shard, store, self.metrics, on_earlier_due=self.wakeup.earlier_due,
                                on_settled=self.in_flight.discard, on_ready=node.place_soon.set)
        self.leadership = Leadership(node.zk, node.settings.zk_root, node.settings.node_id, shard)
        self.cursor = Cursor(node.zk, node.settings.zk_root, shard)
        self.spare = SpareProducer(node.settings, shard)  # made while this node waits in line for the shard
        self.delivery: Delivery | None = None
        self.epoch = 0
        # The placement wants this node to contend for the shard (it is its planned master, or the shard has
        # had none for a while); it contends only once caught up on the shard (feed.ready).
        self.wanted = False
        self.thread: threading.Thread | None = None
        self.metrics.pending.set(store.pending_count())

    @property
    def mastering(self) -> bool:
        term = self.leadership.term
        return term is not None and term.active

    def may_contend(self) -> bool:
        return self.wanted and self.feed.ready and not self.leadership.stopping

    def close(self) -> None:
        """Close the store and drop the spare producer (after the seat's election thread ended)."""
        self.spare.close()
        self.store.close()


class Node:
    """A delay-service node.

    Example:
        >>> Node(Settings()).run()   # start, serve until SIGTERM or SIGINT, stop; returns the exit code

    Or, embedded: ``node.start()``, later ``node.stop()``.
    """

    def __init__(self, settings: Settings):
        self.settings = settings
        self.metrics = NodeMetrics()
        self.stopping = threading.Event()
        self.seats: dict[int, Seat] = {}
        self.layout: ShardLayout | None = None
        self.ingest: Ingest | None = None
        self.http: NodeHTTPServer | None = None
        self.threads: list[threading.Thread] = []
        self.failure: BaseException | None = None
        self.stopping_requested = threading.Event()
        self.epoch = 0  # of this node's latest term, of any shard
        # Since when (monotonic s) the registration could not be published; None while it can.
        self._unpublished: float | None = None
        # Since when (monotonic s) each shard has had no master, as far as this node saw.
        self._masterless_since: dict[int, float] = {}
        self._seats_lock = threading.Lock()  # the placement thread changes seats; the others read them
        # Seats dropped whose master's loop had not ended yet: their stores close (and go) once it has,
        # and the shard is not taken again before (its store directory is still locked by them).
        self._closing: dict[int, Seat] = {}
        # Set when a shard's feed first catches up: the placement looks again at once, not at its next round.
        self.place_soon = threading.Event()
        # Whether Kafka can take acknowledged writes where this node writes (enough in-sync replicas).
        self.insync = InSyncWatch(settings, self._written_partitions)
        self.stores: ShardStores | None = None  # once the buffer is known (start)

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
        try:
            self._start_serving()
        except BaseException:
            # stop() never runs for a node that did not start: its buffer reader must not outlive it,
            # nor its stores stay open.
            if self.ingest is not None:
                self.ingest.close()
            for seat in self.seats.values():
                seat.close()
            raise

    def _start_serving(self) -> None:
        """HTTP, ZooKeeper, ingest and the shards to hold, membership and the loops, once the buffer is known."""
        s = self.settings
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
        if s.node_group is None:
            # Stores of members this node ran with DELAYQ_PROCESSES > 1 are no one's now.
            for folder in sorted((s.data_dir / MEMBERS_DIR).glob("*")):
                forget_stores(folder, "this node runs as one process now")
        self.membership = Membership(self.zk, s.zk_root, s.node_id)
        # A registration of this id left by this node's previous process goes when its session expires.
        self.membership.claim(self._record(), timeout_s=s.zk_session_timeout_ms / 1000 + 2)
        members = {m.node_id: m for m in Membership.members(self.zk, s.zk_root)}
        members[s.node_id] = self._record()
        targets = holders(s.cluster, layout.shards, members, s.replicas, _groups(members))
        for shard in sorted(k for k, nodes in targets.items() if s.node_id in nodes):
            self.seats[shard] = Seat(self, shard, stores.open(shard), ingest)
        ingest.hold([seat.feed for seat in self.seats.values()])
        self.metrics.shards_held.set(len(self.seats))
        self._spawn("ingest", lambda: ingest.run(self.stopping))
        self._spawn("membership", self._publish_membership)
        self._spawn("insync-watch", lambda: self.insync.run(self.stopping))
        for seat in self.seats.values():
            self._contend(seat)
        self._spawn("placement", self._place_loop)
        log.info("node %s started: buffer %s (%d partitions, %d shards, replicas %s), holding shards %s, http on "
                 "%s:%d", s.node_id, s.buffer_topic, len(self.info.partitions), layout.shards,
                 s.replicas or "all", sorted(self.seats), s.http_host, self.http.port)

    def stop(self) -> None:
        """Finish the batches in flight, give up every leadership at once, stop every loop."""
        if self.stopping.is_set():
            return
        log.info("node %s stopping", self.settings.node_id)
        with self._seats_lock:  # the placement takes no shard from now on
            self.stopping_requested.set()
            seats = [*self.seats.values(), *self._closing.values()]
        for seat in seats:
            seat.leadership.stop()
            seat.wakeup.poke()
        for seat in seats:
            if seat.thread is not None:
                seat.thread.join(60)
        self.stopping.set()
        for thread in self.threads:
            thread.join(30)
        self.membership.withdraw()
        # Opened by start(); None only if it failed before it got to them.
        if self.ingest is not None:
            self.ingest.close()
        if self.http is not None:
            self.http.stop()
        self.zk.stop()
        self.zk.close()
        for seat in seats:
            seat.close()

    def run(self) -> int:
        """Start, serve until SIGTERM/SIGINT, stop; the exit code (0 on a clean stop)."""
        signal.signal(signal.SIGTERM, lambda *_: self.stopping_requested.set())
        signal.signal(signal.SIGINT, lambda *_: self.stopping_requested.set())
        self.start()
        while not self.stopping_requested.wait(0.2):
            if self.failure is not None:
                break
        self.stop()
        return 0 if self.failure is None else 1

    def _spawn(self, name: str, target) -> threading.Thread:
        def guarded():
            try:
                target()
            except BaseException as err:  # a dead loop must take the node down, not idle silently
                log.exception("%s loop failed", name)
                self.failure = err
                self.stopping_requested.set()

        thread = threading.Thread(target=guarded, name=name, daemon=True)
        thread.start()
        self.threads.append(thread)
        return thread

    def _contend(self, seat: Seat) -> None:
        seat.thread = self._spawn(f"election-{seat.shard}",
                                  lambda: seat.leadership.run(lambda term: self._lead(seat, term), seat.may_contend,
                                                             seat.spare.prepare))

    # -- placement: which shards to hold and master ----------------------------

    def _place_loop(self) -> None:
        while not self.stopping_requested.is_set():
            self.place_soon.wait(PLACE_EVERY_S)
            self.place_soon.clear()
            if self.stopping_requested.is_set():
                return
            if not self.zk.connected:
                continue  # nothing to decide on without the membership; terms ended with the session anyway
            try:
                self.place()
                if self._stores.level_due():
                    self._stores.follow_level(self.zk, [(seat.shard, seat.store) for seat in list(self.seats.values())])
            except KazooException as err:
                log.info("placement: ZooKeeper did not answer (%s); trying again", str(err) or type(err).__name__)
            except KafkaException as err:  # a store taken checks the buffer's end offsets
                log.warning("placement: Kafka did not answer (%s); trying again", err.args[0].str())
            except StoreError as err:  # a shard's store could not be opened or deleted now: never a crash
                log.warning("placement: %s; trying again", err)

    def place(self) -> None:
        """Hold, drop, contend for and hand over shards as the membership says (placement.py has the rules).

        Raises:
            KazooException: ZooKeeper did not answer.
        """
        s = self.settings
        layout = self.layout
        if layout is None or self.ingest is None:
            return
        records = {m.node_id: m for m in Membership.members(self.zk, s.zk_root)}
        records[s.node_id] = self._record()  # this node as it is now, not as last published
        targets = holders(s.cluster, layout.shards, records, s.replicas, _groups(records))
        self._hold(targets, records)
        ready = {k: [n for n, r in records.items() if k in r.ready] for k in range(layout.shards)}
        eligible = {k: [n for n in targets[k] if n in ready[k]] or ready[k] for k in range(layout.shards)}
        # Who masters each shard now, from its election lock, not from the registrations: a node frozen past its
        # session and resumed may publish a stale claim before it learns that its term ended.
        lines = {k: Leadership.contenders(self.zk, s.zk_root, k) for k in range(layout.shards)}
        current = {k: line[0] if line else None for k, line in lines.items()}
        plan = masters(s.cluster, layout.shards, eligible, current)
        now = time.monotonic()
        for shard, seat in list(self.seats.items()):
            planned = plan.get(shard)
            if current[shard] is None:
                self._masterless_since.setdefault(shard, now)
            else:
                self._masterless_since.pop(shard, None)
            # Nobody leading for a while (the planned master cannot, or the plan is not agreed yet): any holder
            # caught up contends, and the lock picks one.
            masterless = now - self._masterless_since.get(shard, now) >= MASTERLESS_S
            wanted = planned == s.node_id or masterless
            if wanted != seat.wanted:
                seat.wanted = wanted
                if wanted:
                    seat.leadership.recheck()
                else:
                    seat.leadership.withdraw()
            if seat.mastering and planned not in (None, s.node_id) and lines[shard][1:2] == [planned]:
                # The planned master is next in line (a node whose placement has not caught up yet may wait
                # ahead of it, and would get the lock instead): hand the shard over as a stopping node would
                # (the batch in flight commits; the poke wakes a master sleeping until its next due time).
                log.info("handing shard %d over to %s (balance)", shard, planned)
                seat.leadership.hand_over(f"handed over to {planned} (balance)")
                seat.wakeup.poke()

    def _hold(self, targets: dict[int, list[str]], records: dict[str, NodeRecord]) -> None:
        """Take the shards this node should hold now; drop those it should not once their new holders are ready."""
        s = self.settings
        ingest = self.ingest
        if ingest is None:
            return
        self._finish_closing()
        mine = {k for k, nodes in targets.items() if s.node_id in nodes}
        # A shard still closing is taken again once it has closed (its store's lock is held until then).
        gained = sorted(mine - self.seats.keys() - self._closing.keys())
        dropped = sorted(k for k in self.seats.keys() - mine
                         if not self.seats[k].mastering and not self.seats[k].leadership.waiting
                         and all(n in records and k in records[n].ready for n in targets[k]))
        if not gained and not dropped:
            return
        opened: dict[int, TimeIndex] = {}
        try:
            for shard in gained:
                opened[shard] = self._stores.open(shard)
        except BaseException:
            for store in opened.values():  # all or none: the next round takes them again
                store.close()
            raise
        with self._seats_lock:
            if self.stopping_requested.is_set():  # stop() has its list of seats: these would outlive it
                for store in opened.values():
                    store.close()
                return
            for shard, store in opened.items():
                self.seats[shard] = Seat(self, shard, store, ingest)
            gone = [self.seats.pop(shard) for shard in dropped]
        try:
            ingest.hold([seat.feed for seat in self.seats.values()])
        except ReaderGone as err:
            log.warning("%s; ingest tries again", err)
        for seat in gone:
            seat.leadership.stop()
            seat.wakeup.poke()
            self._closing[seat.shard] = seat
        self._finish_closing(wait_s=DROP_WAIT_S)
        for shard in gained:
            self._contend(self.seats[shard])
        self.metrics.shards_held.set(len(self.seats))
        log.info("holding shards %s (took %s, dropped %s)", sorted(self.seats), gained or "none", dropped or "none")

    def _finish_closing(self, wait_s: float = 0.0) -> None:
        """Close and delete the stores of dropped seats whose loops have ended (waiting up to ``wait_s`` each)."""
        for shard, seat in list(self._closing.items()):
            if seat.thread is not None:
                seat.thread.join(wait_s)
                if seat.thread.is_alive():
                    if wait_s:
                        log.warning("shard %d dropped, but its election's loop has not ended after %.0fs; its store "
                                    "is closed once it has", shard, wait_s)
                    continue
                self.threads.remove(seat.thread)
            seat.close()
            del self._closing[shard]
            self._stores.destroy(shard)

    # -- state shared by the loops ---------------------------------------

    def _lead(self, seat: Seat, term: Term) -> None:
        seat.epoch = self.epoch = term.epoch
        seat.metrics.is_master.set(1)
        seat.metrics.elections.inc()
        self._publish_once()
        seat.delivery = Delivery(self.settings, seat.feed, seat.cursor, seat.wakeup, seat.in_flight, seat.spare)
        try:
            seat.delivery.run(term)
            # A stop or a handover asked for is routine; any other end of a term is worth an operator's look.
            routine = seat.leadership.stopping or term.routine
            log.log(logging.INFO if routine else logging.WARNING, "stepped down as master of %s shard %d, epoch "
                    "%d: %s", self.settings.cluster, seat.shard, term.epoch,
                    term.ended_because or "delivery stopped (see above)")
        finally:
            seat.delivery = None
            seat.metrics.is_master.set(0)
            seat.metrics.held_partitions.set(0)  # a standby holds nothing back
            self._publish_once()

    def _publish_membership(self) -> None:
        while not self.stopping.is_set():
            self._publish_once()
            self.stopping.wait(1.0)

    def _record(self) -> NodeRecord:
        # Listening everywhere: advertise the FQDN, which other pods resolve (a StatefulSet
        # pod's short name alone does not resolve outside its own /etc/hosts).
        host = socket.getfqdn() if self.settings.http_host in ("0.0.0.0", "::") else self.settings.http_host
        seats = list(self.seats.values())
        masters = tuple(seat.shard for seat in seats if seat.mastering)
        role = Role.MASTER if masters else Role.STANDBY if self.threads else Role.STARTING
        return NodeRecord(node_id=self.settings.node_id, role=role, host=host,
                          http=f"http://{host}:{self.http.port}" if self.http is not None else None,
                          lag=self.ingest.lag if self.ingest is not None else None,
                          pending=sum(seat.store.pending_count() for seat in seats),
                          epoch=self.epoch, updated_at_ms=now_ms(),
                          shards=tuple(seat.shard for seat in seats),
                          ready=tuple(seat.shard for seat in seats if seat.feed.ready), masters=masters,
                          store_format=min((seat.store.store_format for seat in seats), default=None),
                          group=self.settings.node_group)

    def _publish_once(self) -> None:
        try:
            if not self.zk.connected:
                # kazoo would queue the write and block until the connection is back: say why instead.
                self._not_published(f"ZooKeeper session {self.zk.state.lower()}: no connection to "
                                    f"{self.settings.zk_connect}")
                return
            self.membership.publish(self._record())
        except DuplicateNodeId as err:
            log.error("%s; stopping", err)
            self.failure = err
            self.stopping_requested.set()
            return
        except KazooException as err:
            self._not_published(f"ZooKeeper refused the write: {str(err) or type(err).__name__}")
            return
        if self._unpublished is not None:
            log.info("membership published again after %.0fs", time.monotonic() - self._unpublished)
            self._unpublished = None

    def _not_published(self, reason: str) -> None:
        """Log the first failure of an outage (not one line a second), with why."""
        if self._unpublished is None:
            self._unpublished = time.monotonic()
            log.warning("membership not published: %s; trying again every second", reason)

    # -- what the HTTP endpoints see (http.NodeView) -------------------------

    @property
    def registry(self) -> CollectorRegistry:
        return self.metrics.registry

    def shard_of(self, delay_id: str) -> tuple[int, bool]:
        shards = self.layout.shards if self.layout is not None else 1
        shard = wire.shard_of(wire.buffer_partition(delay_id, len(self.info.partitions)), shards)
        return shard, shard in self.seats

    def entry(self, delay_id: str) -> StoredEntry | None:
        shard, _ = self.shard_of(delay_id)
        seat = self.seats.get(shard)
        return seat.store.get(delay_id) if seat is not None else None

    def _written_partitions(self) -> tuple[list[int], list[str]]:
        """The buffer partitions and the transactional ids of the shards this node holds: what its masters write."""
        shards = self.layout.shards if self.layout is not None else 1
        held = sorted(self.seats)
        partitions = [p for p in self.info.partitions if wire.shard_of(p, shards) in held]
        return partitions, [self.settings.transactional_id(shard) for shard in held]

    def alive(self) -> bool:
        return self.failure is None and all(t.is_alive() for t in list(self.threads))

    def ready(self) -> tuple[bool, str]:
        if not self.alive():
            return False, "a loop stopped"
        if self.ingest is None or self.ingest.lag is None:
            return False, "buffer end offsets not known yet"
        shortfall = self.insync.problem
        if shortfall is not None:
            # Nothing can be delivered (nor a master's term begin) until enough replicas are back.
            return False, shortfall
        loops: list[Ingest | Delivery | None] = [self.ingest, *(seat.delivery for seat in list(self.seats.values()))]
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
        behind = {seat.shard: seat.feed.lag for seat in list(self.seats.values()) if not seat.feed.caught_up}
        if behind:
            return False, "ingest is behind the buffer on shards " + ", ".join(
                f"{shard} ({lag if lag is not None else '?'} records)" for shard, lag in sorted(behind.items()))
        seats = list(self.seats.values())
        mastered = [seat.shard for seat in seats if seat.mastering]
        return True, (f"caught up on shards {[seat.shard for seat in seats]} "
                      + (f"(master of {mastered})" if mastered else f"({Role.STANDBY.value})"))


def _groups(records: dict[str, NodeRecord]) -> dict[str, str]:
    """Member process -> the node it is a member of, for the registrations that say (placement.holders)."""
    return {node_id: record.group for node_id, record in records.items() if record.group is not None}
