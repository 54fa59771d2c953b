"""One delay-service node: ingest always, delivery while master, HTTP, registration.

Threads: ``ingest`` (buffer -> store), ``election`` (contends; runs delivery while
master), ``membership`` (publishes role/lag/pending to ZooKeeper every second),
``http``. :meth:`Node.stop` ends the term at once (the batch in flight commits or
aborts first), so a standby takes over without waiting for the session timeout.
"""

from __future__ import annotations

import enum
import errno
import logging
import signal
import socket
import threading
import time
from pathlib import Path

from kazoo.exceptions import KazooException
from prometheus_client import CollectorRegistry

from delayq.clock import now_ms
from delayq.election import Cursor, DuplicateNodeId, Leadership, Membership, NodeRecord, Role, Term, connect
from delayq.errors import ConfigurationError
from delayq.settings import Settings
from delayq.store import StoredEntry, StoreFormatError, StoreOptions, TimeIndex

from .delivery import Delivery, InFlight, Wakeup
from .http import NodeHTTPServer
from .ingest import Ingest
from .metrics import NodeMetrics
from .topics import BufferInfo, EndOffsets, admin_client, buffer_info, committed_end_offsets

log = logging.getLogger("delayq.node")

class RebuildReason(enum.StrEnum):
    """Why a node wiped its store and read the buffer again: the label of delayq_store_rebuilds_total."""

    FORMAT = "format"                    # the store is of another format (an upgrade)
    TOPIC_RECREATED = "topic-recreated"  # the buffer topic has another id than the store was built from
    STALE = "stale"                      # away longer than delete.retention.ms: tombstones may be gone
    OFFSETS_AHEAD = "offsets-ahead"      # a stored offset is past the topic's end: the topic was recreated


STORE_DIR = "store"
META_TOPIC_ID = "buffer_topic_id"
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
        self.stopping = threading.Event()
        self.in_flight = InFlight()
        self.wakeup = Wakeup()
        self.delivery: Delivery | None = None
        self.role = Role.STARTING
        self.epoch = 0
        self.store: TimeIndex | None = None
        self.ingest: Ingest | None = None
        self.http: NodeHTTPServer | None = None
        self.threads: list[threading.Thread] = []
        self.failure: BaseException | None = None
        self.stopping_requested = threading.Event()
        # Since when (monotonic s) the registration could not be published; None while it can.
        self._unpublished: float | None = None

    # -- lifecycle -------------------------------------------------------

    def start(self) -> None:
        s = self.settings
        self.admin = admin_client(s)
        info = buffer_info(s, self.admin)
        self.store = self._open_store(info)
        self.ingest = ingest = Ingest(s, self.store, self.metrics, EndOffsets(s, info.partitions, self.admin),
                                      on_earlier_due=self.wakeup.earlier_due, on_settled=self.in_flight.discard)
        try:
            self._start_serving(ingest)
        except BaseException:
            # stop() never runs for a node that did not start: its buffer reader must not outlive it.
            ingest.close()
            raise

    def _start_serving(self, ingest: Ingest) -> None:
        """HTTP, ZooKeeper, membership and the loops, once the store and ingest are open."""
        s = self.settings
        try:
            self.http = NodeHTTPServer(self, s.http_host, s.http_port)
        except OSError as err:
            if err.errno != errno.EADDRINUSE:
                raise
            raise ConfigurationError(f"HTTP port {s.http_port} on {s.http_host} is taken (DELAYQ_HTTP_PORT="
                                     f"{s.http_port}): give this node another DELAYQ_HTTP_PORT, or stop what "
                                     "listens there") from None
        self.http.start()
        self.zk = connect(s.zk_connect, session_timeout_ms=s.zk_session_timeout_ms, auth=s.zk_auth)
        self.membership = Membership(self.zk, s.zk_root, s.node_id)
        # A registration of this id left by this node's previous process goes when its session expires.
        self.membership.claim(self._record(), timeout_s=s.zk_session_timeout_ms / 1000 + 2)
        self.leadership = Leadership(self.zk, s.zk_root, s.node_id)
        self.cursor = Cursor(self.zk, s.zk_root)
        self._spawn("ingest", lambda: ingest.run(self.stopping))
        self._spawn("membership", self._publish_membership)
        self._spawn("election", lambda: self.leadership.run(self._lead))
        log.info("node %s started: buffer %s (%d partitions), http on %s:%d", s.node_id, s.buffer_topic,
                 len(ingest.partitions), s.http_host, self.http.port)

    def stop(self) -> None:
        """Finish the batch in flight, give up leadership at once, stop every loop."""
        if self.stopping.is_set():
            return
        log.info("node %s stopping", self.settings.node_id)
        self.leadership.stop()
        self.wakeup.poke()
        election = next((t for t in self.threads if t.name == "election"), None)
        if election is not None:
            election.join(60)
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
        if self.store is not None:
            self.store.close()

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

    def _spawn(self, name: str, target) -> None:
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

    # -- the store -------------------------------------------------------

    def _open_store(self, info: BufferInfo) -> TimeIndex:
        path = Path(self.settings.data_dir) / STORE_DIR
        path.parent.mkdir(parents=True, exist_ok=True)
        options = StoreOptions(block_cache_mb=self.settings.store_block_cache_mb,
                               write_buffer_mb=self.settings.store_write_buffer_mb,
                               sync_writes=self.settings.store_sync_writes)
        try:
            store = TimeIndex(path, options)
        except StoreFormatError as err:
            # The store is a view of the buffer: a store of another form is rebuilt, not migrated.
            log.warning("store %s will be rebuilt from the buffer: %s", path, err)
            self.metrics.rebuilds.labels(RebuildReason.FORMAT.value).inc()
            TimeIndex.destroy(path)
            store = TimeIndex(path, options)
        found = self._rebuild_reason(store, info)
        if found is not None:
            code, why = found
            log.warning("store %s will be rebuilt from the buffer: %s: %s", path, code.value, why)
            self.metrics.rebuilds.labels(code.value).inc()
            store.close()
            TimeIndex.destroy(path)
            store = TimeIndex(path, options)
        store.set_meta(META_TOPIC_ID, info.topic_id.encode())
        self.metrics.pending.set(store.pending_count())
        return store

    def _rebuild_reason(self, store: TimeIndex, info: BufferInfo) -> tuple[RebuildReason, str] | None:
        known_id = store.get_meta(META_TOPIC_ID)
        if known_id is not None and known_id.decode() != info.topic_id:
            return RebuildReason.TOPIC_RECREATED, (f"the store was built from buffer topic id {known_id.decode()}, "
                                                   f"the buffer now has id {info.topic_id}")
        last = store.last_ingest_ms()
        if last is not None and now_ms() - last > info.delete_retention_ms:
            return RebuildReason.STALE, (f"last ingest {(now_ms() - last) / 1000:.0f}s ago is longer than the "
                                         f"buffer's delete.retention.ms {info.delete_retention_ms}: tombstones may "
                                         "have been compacted away")
        ends = committed_end_offsets(self.admin, self.settings.buffer_topic, info.partitions)
        for partition, offset in store.offsets().items():
            if offset > ends.get(partition, 0):
                return RebuildReason.OFFSETS_AHEAD, (f"persisted offset {offset} of partition {partition} is above "
                                                     f"the topic's end offset {ends.get(partition, 0)}: the topic "
                                                     "was recreated")
        return None

    # -- state shared by the loops ---------------------------------------

    def _lead(self, term: Term) -> None:
        if self.store is None or self.ingest is None:  # start() opens both before it joins the election
            raise RuntimeError("the node was elected before start() opened its store and ingest")
        self.role = Role.MASTER
        self.epoch = term.epoch
        self.metrics.is_master.set(1)
        self.metrics.elections.inc()
        self._publish_once()
        self.delivery = Delivery(self.settings, self.store, self.ingest, self.metrics, self.cursor, self.wakeup,
                                 self.in_flight)
        try:
            self.delivery.run(term)
            # A stop asked for is routine; any other end of a term is worth an operator's look.
            level = logging.INFO if self.leadership.stopping else logging.WARNING
            log.log(level, "stepped down as master of %s, epoch %d: %s", self.settings.cluster, term.epoch,
                    term.ended_because or "delivery stopped (see above)")
        finally:
            self.delivery = None
            self.role = Role.STANDBY
            self.metrics.is_master.set(0)
            self.metrics.held_partitions.set(0)  # a standby holds nothing back
            self._publish_once()

    def _publish_membership(self) -> None:
        self.role = Role.STANDBY
        while not self.stopping.is_set():
            self._publish_once()
            self.stopping.wait(1.0)

    def _record(self) -> NodeRecord:
        # Listening everywhere: advertise the FQDN, which other pods resolve (a StatefulSet
        # pod's short name alone does not resolve outside its own /etc/hosts).
        host = socket.getfqdn() if self.settings.http_host in ("0.0.0.0", "::") else self.settings.http_host
        return NodeRecord(node_id=self.settings.node_id, role=self.role, host=host,
                          http=f"http://{host}:{self.http.port}" if self.http is not None else None,
                          lag=self.ingest.lag if self.ingest is not None else None,
                          pending=self.store.pending_count() if self.store is not None else None,
                          epoch=self.epoch, updated_at_ms=now_ms())

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

    def entry(self, delay_id: str) -> StoredEntry | None:
        return self.store.get(delay_id) if self.store is not None else None

    def alive(self) -> bool:
        return self.failure is None and all(t.is_alive() for t in self.threads)

    def ready(self) -> tuple[bool, str]:
        if not self.alive():
            return False, "a loop stopped"
        if self.ingest is None or self.ingest.lag is None:
            return False, "buffer end offsets not known yet"
        for loop in (self.ingest, self.delivery):
            if loop is None:
                continue
            since = loop.failing_since
            if since is not None and time.monotonic() - since > FAILING_NOT_READY_S:
                return False, f"{loop.failing} (for {time.monotonic() - since:.0f}s)"
        if not self.ingest.caught_up:
            return False, f"ingest is {self.ingest.lag} records behind the buffer"
        return True, f"caught up ({self.role.value})"
