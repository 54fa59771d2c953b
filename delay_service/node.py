"""One delay-service node: ingest always, delivery while master, HTTP, registration.

Threads: ``ingest`` (buffer -> store), ``election`` (contends; runs delivery while
master), ``membership`` (publishes role/lag/pending to ZooKeeper every second),
``http``. :meth:`Node.stop` ends the term at once (the batch in flight commits or
aborts first), so a standby takes over without waiting for the session timeout.
"""

from __future__ import annotations

import logging
import signal
import socket
import threading
import time
from pathlib import Path

from delayq.election import Cursor, Leadership, Membership, Term, connect
from delayq.settings import Settings
from delayq.store import StoreFormatError, StoreOptions, TimeIndex

from .delivery import Delivery, InFlight, Wakeup
from .http import NodeHTTPServer
from .ingest import Ingest, now_ms
from .metrics import NodeMetrics
from .topics import BufferInfo, EndOffsets, admin_client, buffer_info, committed_end_offsets

log = logging.getLogger("delayq.node")

STORE_DIR = "store"
META_TOPIC_ID = "buffer_topic_id"
# A loop failing this long makes the node not ready (a blip of one retry does not).
FAILING_NOT_READY_S = 2.0


class Node:
    """A delay-service node.

    Example:
        >>> node = Node(Settings())
        >>> node.start()
        >>> node.wait()        # until stop() or SIGTERM via run()
    """

    def __init__(self, settings: Settings):
        self.settings = settings
        self.metrics = NodeMetrics()
        self.stopping = threading.Event()
        self.in_flight = InFlight()
        self.wakeup = Wakeup()
        self.delivery: Delivery | None = None
        self.role = "starting"
        self.epoch = 0
        self.store: TimeIndex | None = None
        self.ingest: Ingest | None = None
        self.http: NodeHTTPServer | None = None
        self.threads: list[threading.Thread] = []
        self.failure: BaseException | None = None
        self.stopping_requested = threading.Event()

    # -- lifecycle -------------------------------------------------------

    def start(self) -> None:
        s = self.settings
        self.admin = admin_client(s)
        info = buffer_info(s, self.admin)
        self.store = self._open_store(info)
        self.ingest = Ingest(s, self.store, self.metrics, EndOffsets(s, info.partitions, self.admin),
                             on_earlier_due=self.wakeup.earlier_due, on_settled=self.in_flight.discard)
        self.http = NodeHTTPServer(self, s.http_host, s.http_port)
        self.http.start()
        self.zk = connect(s.zk_connect, session_timeout_ms=s.zk_session_timeout_ms, auth=s.zk_auth)
        self.membership = Membership(self.zk, s.zk_root, s.node_id)
        self.leadership = Leadership(self.zk, s.zk_root, s.node_id)
        self.cursor = Cursor(self.zk, s.zk_root)
        self._spawn("ingest", lambda: self.ingest.run(self.stopping))
        self._spawn("membership", self._publish_membership)
        self._spawn("election", lambda: self.leadership.run(self._lead))
        log.info("node %s started: buffer %s (%d partitions), http on %s:%d", s.node_id, s.buffer_topic,
                 len(info.partitions), s.http_host, self.http.port)

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
        self.ingest.close()
        self.http.stop()
        self.zk.stop()
        self.zk.close()
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
            self.metrics.rebuilds.labels("format").inc()
            TimeIndex.destroy(path)
            store = TimeIndex(path, options)
        reason = self._rebuild_reason(store, info)
        if reason is not None:
            log.warning("store %s will be rebuilt from the buffer: %s", path, reason)
            self.metrics.rebuilds.labels(reason.split(":")[0]).inc()
            store.close()
            TimeIndex.destroy(path)
            store = TimeIndex(path, options)
        store.set_meta(META_TOPIC_ID, info.topic_id.encode())
        self.metrics.pending.set(store.pending_count())
        return store

    def _rebuild_reason(self, store: TimeIndex, info: BufferInfo) -> str | None:
        known_id = store.get_meta(META_TOPIC_ID)
        if known_id is not None and known_id.decode() != info.topic_id:
            return (f"topic recreated: the store was built from buffer topic id {known_id.decode()}, "
                    f"the buffer now has id {info.topic_id}")
        last = store.last_ingest_ms()
        if last is not None and now_ms() - last > info.delete_retention_ms:
            return (f"stale: last ingest {(now_ms() - last) / 1000:.0f}s ago is longer than the buffer's "
                    f"delete.retention.ms {info.delete_retention_ms}: tombstones may have been compacted away")
        ends = committed_end_offsets(self.admin, self.settings.buffer_topic, info.partitions)
        for partition, offset in store.offsets().items():
            if offset > ends.get(partition, 0):
                return (f"offsets ahead: persisted offset {offset} of partition {partition} is above the "
                        f"topic's end offset {ends.get(partition, 0)}: the topic was recreated")
        return None

    # -- state shared by the loops ---------------------------------------

    def _lead(self, term: Term) -> None:
        self.role = "master"
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
            log.log(level, "stepped down as master, epoch %d: %s", term.epoch,
                    term.ended_because or "delivery stopped (see above)")
        finally:
            self.delivery = None
            self.role = "standby"
            self.metrics.is_master.set(0)
            self._publish_once()

    def _publish_membership(self) -> None:
        self.role = "standby"
        while not self.stopping.is_set():
            self._publish_once()
            self.stopping.wait(1.0)

    def _publish_once(self) -> None:
        # Listening everywhere: advertise the FQDN, which other pods resolve (a StatefulSet
        # pod's short name alone does not resolve outside its own /etc/hosts).
        host = socket.getfqdn() if self.settings.http_host in ("0.0.0.0", "::") else self.settings.http_host
        try:
            self.membership.publish({
                "node_id": self.settings.node_id, "host": host, "http": f"http://{host}:{self.http.port}",
                "role": self.role, "lag": self.ingest.lag, "pending": self.store.pending_count(),
                "epoch": self.epoch, "updated_at_ms": now_ms(),
            })
        except Exception as err:
            log.info("membership not published: %s", str(err) or type(err).__name__)

    def alive(self) -> bool:
        return self.failure is None and all(t.is_alive() for t in self.threads)

    def ready(self) -> tuple[bool, str]:
        if not self.alive():
            return False, "a loop stopped"
        if self.ingest is None or self.ingest.lag is None:
            return False, "buffer end offsets not known yet"
        for loop in (self.ingest, self.delivery):
            since = None if loop is None else loop.failing_since
            if since is not None and time.monotonic() - since > FAILING_NOT_READY_S:
                return False, f"{loop.failing} (for {time.monotonic() - since:.0f}s)"
        if not self.ingest.caught_up:
            return False, f"ingest is {self.ingest.lag} records behind the buffer"
        return True, f"caught up ({self.role})"
