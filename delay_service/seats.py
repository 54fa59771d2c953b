"""The shards a node holds (a :class:`Seat` each) and the placement loop that changes them.

Every half second, and at once when a shard's feed first catches up or the membership or a shard's
election line changes (a master gone: ZooKeeper watches), the placement reads
the membership and applies placement.py's rules: it takes the shards this node should
hold, drops those it should not once their new holders are ready, contends for the shards
it should master (or that have had no master for a while), and hands over those another
node should master. Each held shard has a thread ``election-<k>`` that contends while the
placement says so and runs the shard's delivery while this node is its master.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from confluent_kafka import KafkaException
from kazoo.client import KazooClient
from kazoo.exceptions import KazooException

from delayq.election import Cursor, Leadership, NodeRecord, ShardLayout, Term, watch_membership
from delayq.settings import Settings
from delayq.store import StoreError, TimeIndex

from .delivery import Delivery
from .handoff import InFlight, Wakeup
from .ingest import Ingest
from .loops import Loops
from .master_producer import SpareProducer
from .metrics import NodeMetrics, ShardMetrics
from .placement import holders, masters
from .reader import ReaderGone
from .registration import Registration
from .stores import ShardStores

log = logging.getLogger("delayq.node")

# How often the placement looks at the membership (which shards to hold, to master, to hand over).
PLACE_EVERY_S = 0.5
# A shard without a master this long: every holder caught up on it contends, planned or not.
MASTERLESS_S = 2.0
# How long the placement waits for a dropped shard's election loop to end before it goes on (and closes
# the shard's store later, once the loop has ended).
DROP_WAIT_S = 10.0


class Seat:
    """One shard this node holds: its store and feed, its election, and its master's loop while it leads."""

    def __init__(self, settings: Settings, zk: KazooClient, shard: int, store: TimeIndex, ingest: Ingest,
                 metrics: ShardMetrics, on_ready: Callable[[], None]):
        self.shard = shard
        self.store = store
        self.metrics = metrics
        self.in_flight = InFlight()
        self.wakeup = Wakeup()
        self.feed = ingest.feed(shard, store, metrics, on_earlier_due=self.wakeup.earlier_due,
                                on_settled=self.in_flight.discard, on_ready=on_ready)
        self.leadership = Leadership(zk, settings.zk_root, settings.node_id, shard)
        self.cursor = Cursor(zk, settings.zk_root, shard)
        self.spare = SpareProducer(settings, shard)  # made while this node waits in line for the shard
        self.delivery: Delivery | None = None
        self.epoch = 0
        # The placement wants this node to contend for the shard (it is its planned master, or the shard has
        # had none for a while); it contends only once caught up on the shard (feed.ready).
        self.wanted = False
        self.thread: threading.Thread | None = None
        self.metrics.pending.set(store.pending_count())
        if settings.console:
            store.count_pending_by_due()  # in a thread: the console's pending chart is ready when first looked at

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


class Seats:
    """The shards this node holds, and the placement that takes, drops, contends for and hands them over.

    It owns the seats, the seats dropped whose election loop has not ended yet, and when each
    shard was last seen without a master. The placement thread changes the seats; the HTTP
    and registration threads read them through :meth:`held` and :meth:`get`.

    Example:
        >>> seats = Seats(settings, metrics, zk, stores, ingest, layout, registration, loops)
        >>> seats.take_planned()   # at start: the shards the placement gives this node now
        >>> seats.start()          # their election loops, then the placement loop
        >>> seats.end_terms(); ...; seats.close()
    """

    def __init__(self, settings: Settings, metrics: NodeMetrics, zk: KazooClient, stores: ShardStores,
                 ingest: Ingest, layout: ShardLayout, registration: Registration, loops: Loops):
        self._settings = settings
        self._metrics = metrics
        self._zk = zk
        self._stores = stores
        self._ingest = ingest
        self._layout = layout
        self._registration = registration
        self._loops = loops
        self._seats: dict[int, Seat] = {}
        self._lock = threading.Lock()  # the placement thread changes the seats; the others read them
        # Seats dropped whose master's loop had not ended yet: their stores close (and go) once it has,
        # and the shard is not taken again before (its store directory is still locked by them).
        self._closing: dict[int, Seat] = {}
        # Since when (monotonic s) each shard has had no master, as far as this node saw.
        self._masterless_since: dict[int, float] = {}
        # Set when a shard's feed first catches up: the placement looks again at once, not at its next round.
        self.place_soon = threading.Event()
        self.epoch = 0  # of this node's latest term, of any shard

    # -- what the other parts of the node read ----------------------------

    def held(self) -> list[Seat]:
        """The seats held now (a copy: the placement may change them meanwhile)."""
        return list(self._seats.values())

    def get(self, shard: int) -> Seat | None:
        return self._seats.get(shard)

    def shards(self) -> list[int]:
        """The shards held now, in order."""
        return sorted(self._seats)

    # -- lifecycle ---------------------------------------------------------

    def take_planned(self) -> None:
        """At start: open the stores of the shards the placement gives this node now, and read them.

        Raises:
            KazooException: ZooKeeper did not answer.
            StoreError, KafkaException: a store could not be opened.
            ReaderGone: the buffer reader could not start.
        """
        node_id = self._settings.node_id
        targets = self._targets(self._registration.members())
        for shard in sorted(k for k, nodes in targets.items() if node_id in nodes):
            self._seats[shard] = self._seat(shard, self._stores.open(shard))
        self._ingest.hold([seat.feed for seat in self._seats.values()])
        self._metrics.shards_held.set(len(self._seats))

    def start(self) -> None:
        """The election loop of each shard held, then the placement loop."""
        for seat in self._seats.values():
            self._contend(seat)
        self._loops.spawn("placement", self.run)
        try:
            watch_membership(self._zk, self._settings.zk_root, self._layout.shards, self.place_soon.set,
                             self._loops.stop_requested.is_set)
        except KazooException as err:  # the placement still looks every PLACE_EVERY_S
            log.warning("placement: no ZooKeeper watch on the membership (%s); looking every %.1fs",
                        str(err) or type(err).__name__, PLACE_EVERY_S)

    def end_terms(self) -> None:
        """Take no shard from now on, end every term at once, and wait for the election loops to end.

        The batch in flight commits or aborts first, so other nodes take over without waiting for the
        session timeout.
        """
        with self._lock:  # the placement takes no shard from now on
            self._loops.stop_requested.set()
            seats = [*self._seats.values(), *self._closing.values()]
        for seat in seats:
            seat.leadership.stop()
            seat.wakeup.poke()
        for seat in seats:
            if seat.thread is not None:
                seat.thread.join(60)

    def close(self) -> None:
        """Close every seat's store and spare producer, dropped ones still closing too (after :meth:`end_terms`)."""
        for seat in [*self._seats.values(), *self._closing.values()]:
            seat.close()

    # -- placement: which shards to hold and master ----------------------------

    def run(self) -> None:
        """The placement loop, until the node stops. Blocks: the ``placement`` thread's."""
        while not self._loops.stop_requested.is_set():
            self.place_soon.wait(PLACE_EVERY_S)
            self.place_soon.clear()
            if self._loops.stop_requested.is_set():
                return
            if not self._zk.connected:
                continue  # nothing to decide on without the membership; terms ended with the session anyway
            try:
                self.place()
                if self._stores.level_due():
                    self._stores.follow_level(self._zk, [(seat.shard, seat.store) for seat in self.held()])
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
        s = self._settings
        shards = self._layout.shards
        records = self._registration.members()
        targets = self._targets(records)
        self._hold(targets, records)
        ready = {k: [n for n, r in records.items() if k in r.ready] for k in range(shards)}
        eligible = {k: [n for n in targets[k] if n in ready[k]] or ready[k] for k in range(shards)}
        # Who masters each shard now, from its election lock, not from the registrations: a node frozen past its
        # session and resumed may publish a stale claim before it learns that its term ended.
        lines = {k: Leadership.contenders(self._zk, s.zk_root, k) for k in range(shards)}
        current = {k: line[0] if line else None for k, line in lines.items()}
        plan = masters(s.cluster, shards, eligible, current)
        now = time.monotonic()
        for shard, seat in list(self._seats.items()):
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

    def _targets(self, records: dict[str, NodeRecord]) -> dict[int, list[str]]:
        """Shard -> the nodes that should hold it, by the placement's rules over these registrations."""
        s = self._settings
        return holders(s.cluster, self._layout.shards, records, s.replicas, _groups(records))

    def _hold(self, targets: dict[int, list[str]], records: dict[str, NodeRecord]) -> None:
        """Take the shards this node should hold now; drop those it should not once their new holders are ready."""
        self._finish_closing()
        mine = {k for k, nodes in targets.items() if self._settings.node_id in nodes}
        # A shard still closing is taken again once it has closed (its store's lock is held until then).
        gained = sorted(mine - self._seats.keys() - self._closing.keys())
        # A shard with no store here is taken once the copy of a holder's store, made beside this loop, has ended.
        gained = [k for k in gained if not self._stores.copying(k, self.place_soon.set)]
        dropped = sorted(k for k in self._seats.keys() - mine
                         if not self._seats[k].mastering and not self._seats[k].leadership.waiting
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
        with self._lock:
            if self._loops.stop_requested.is_set():  # end_terms() has its list of seats: these would outlive it
                for store in opened.values():
                    store.close()
                return
            for shard, store in opened.items():
                self._seats[shard] = self._seat(shard, store)
            gone = [self._seats.pop(shard) for shard in dropped]
        try:
            self._ingest.hold([seat.feed for seat in self._seats.values()])
        except ReaderGone as err:
            log.warning("%s; ingest tries again", err)
        for seat in gone:
            seat.leadership.stop()
            seat.wakeup.poke()
            self._closing[seat.shard] = seat
        self._finish_closing(wait_s=DROP_WAIT_S)
        for shard in gained:
            self._contend(self._seats[shard])
        self._metrics.shards_held.set(len(self._seats))
        log.info("holding shards %s (took %s, dropped %s)", sorted(self._seats), gained or "none", dropped or "none")

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
                self._loops.forget(seat.thread)
            seat.close()
            del self._closing[shard]
            self._stores.destroy(shard)

    # -- a shard's election and term ----------------------------------------

    def _seat(self, shard: int, store: TimeIndex) -> Seat:
        return Seat(self._settings, self._zk, shard, store, self._ingest, self._metrics.shard(shard),
                    self.place_soon.set)

    def _contend(self, seat: Seat) -> None:
        seat.thread = self._loops.spawn(
            f"election-{seat.shard}",
            lambda: seat.leadership.run(lambda term: self._lead(seat, term), seat.may_contend, seat.spare.prepare))

    def _lead(self, seat: Seat, term: Term) -> None:
        seat.epoch = self.epoch = term.epoch
        seat.metrics.is_master.set(1)
        seat.metrics.elections.inc()
        self._registration.publish()
        seat.delivery = Delivery(self._settings, seat.feed, seat.cursor, seat.wakeup, seat.in_flight, seat.spare)
        try:
            seat.delivery.run(term)
            # A stop or a handover asked for is routine; any other end of a term is worth an operator's look.
            routine = seat.leadership.stopping or term.routine
            log.log(logging.INFO if routine else logging.WARNING, "stepped down as master of %s shard %d, epoch "
                    "%d: %s", self._settings.cluster, seat.shard, term.epoch,
                    term.ended_because or "delivery stopped (see above)")
        finally:
            seat.delivery = None
            seat.metrics.is_master.set(0)
            seat.metrics.held_partitions.set(0)  # a standby holds nothing back
            self._registration.publish()


def _groups(records: dict[str, NodeRecord]) -> dict[str, str]:
    """Member process -> the node it is a member of, for the registrations that say (placement.holders)."""
    return {node_id: record.group for node_id, record in records.items() if record.group is not None}
