"""ZooKeeper recipes of a delayq cluster, each owning one concern (kazoo's recipe style).

Paths under ``/delayq/<cluster>/`` (docs/DESIGN.md):

- ``layout``: :class:`Layout`, the shard count, written once;
- ``features``: :class:`Features`, the cluster's finalized feature level, only ever raised;
- ``shards/<k>/election``: :class:`Leadership`, the kazoo lock the holders of shard k contend for;
- ``shards/<k>/epoch``: :class:`Epoch`, bumped by each new master of shard k;
- ``shards/<k>/cursor``: :class:`Cursor`, shard k's master's progress, written with the znode version;
- ``nodes/<node-id>``: :class:`Membership`, one ephemeral JSON per live node.

Each shard's election, epoch and cursor are its own: a new master of shard k fences
only shard k's old master.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    BadVersionError,
    CancelledError,
    ConnectionLoss,
    KazooException,
    NodeExistsError,
    NoNodeError,
)
from kazoo.protocol.states import WatchedEvent
from kazoo.recipe.watchers import ChildrenWatch

from delayq.errors import ConfigurationError, DelayqError, UnavailableError
from delayq.settings import Settings

from .access import cluster_acl
from .records import CursorRecord, FeatureRecord, FinalizedLevel, NodeRecord, ShardLayout

log = logging.getLogger("delayq.election")


def shard_path(root: str, shard: int) -> str:
    """The ZooKeeper folder of one shard: its election, epoch and cursor."""
    return f"{root}/shards/{shard}"


def election_path(root: str, shard: int) -> str:
    """The ZooKeeper folder of one shard's election: its lock's line, the master first."""
    return f"{shard_path(root, shard)}/election"


def nodes_path(root: str) -> str:
    """The ZooKeeper folder of the cluster's node registrations."""
    return f"{root}/nodes"


class FencedError(DelayqError):
    """A newer master exists: this node's epoch or cursor version is stale. Stop delivering."""


def connect(hosts: str, *, session_timeout_ms: int, auth: str | None = None, timeout_s: float = 15.0) -> KazooClient:
    """A started kazoo client with the session timeout delayq wants.

    With ``auth`` (digest ``user:password``), every znode it creates carries the cluster's
    ACL (election/access.py): all rights for that identity, read for anyone.

    Raises:
        UnavailableError: ZooKeeper did not answer within ``timeout_s``; the message names the hosts.
    """
    client = KazooClient(
        hosts=hosts,
        timeout=session_timeout_ms / 1000,
        auth_data=[("digest", auth)] if auth else None,
        default_acl=cluster_acl(auth),
        # Retry forever in the background: a node outlives ZooKeeper outages as a standby.
        connection_retry={"max_tries": -1, "delay": 0.2, "max_delay": 2},
    )
    try:
        client.start(timeout=timeout_s)
    except Exception as err:
        client.close()
        raise UnavailableError(f"ZooKeeper at {hosts} did not answer within {timeout_s:.0f}s: is it running "
                           f"and is DELAYQ_ZK_CONNECT right? ({err})") from err
    return client


def connect_for(settings: Settings, *, timeout_s: float = 15.0) -> KazooClient:
    """:func:`connect` to the ensemble ``settings`` name, with their session timeout and credentials."""
    return connect(settings.zk_connect, session_timeout_ms=settings.zk_session_timeout_ms,
                   auth=settings.zk_credentials, timeout_s=timeout_s)


class Epoch:
    """The cluster's leadership epoch: a counter znode each new master increments.

    Example:
        >>> epoch = Epoch(client, "/delayq/orders")
        >>> mine = epoch.bump()          # as the new master
        >>> epoch.watch(lambda newest: newest > mine and step_down())
    """

    def __init__(self, client: KazooClient, root: str, shard: int = 0):
        self.client = client
        self.path = f"{shard_path(root, shard)}/epoch"

    def current(self) -> int:
        try:
            data, _ = self.client.get(self.path)
        except NoNodeError:
            return 0
        return int(data or b"0")

    def bump(self) -> int:
        """Increment atomically (compare-and-set on the znode version) and return the new epoch."""
        self.client.ensure_path(self.path)
        while True:
            data, stat = self.client.get(self.path)
            new = int(data or b"0") + 1
            try:
                self.client.set(self.path, str(new).encode(), version=stat.version)
                return new
            except BadVersionError:
                continue

    def watch(self, on_change: Callable[[int], None]) -> None:
        """Call ``on_change(epoch)`` now and whenever the epoch changes (from kazoo's event thread: do not block)."""
        self.client.ensure_path(self.path)

        def _changed(data, _stat):
            on_change(int(data or b"0"))

        self.client.DataWatch(self.path, _changed)


class Cursor:
    """The master's progress, JSON in one znode, written only with the version it last saw.

    A master that was paused and resumed holds an old version, so its write fails
    with :class:`FencedError` instead of overwriting a newer master's cursor.
    """

    def __init__(self, client: KazooClient, root: str, shard: int = 0):
        self.client = client
        self.path = f"{shard_path(root, shard)}/cursor"
        self._version: int | None = None

    def peek(self) -> CursorRecord | None:
        """The cursor as last written, without taking its version (for status); None if none was written."""
        try:
            data, _ = self.client.get(self.path)
        except NoNodeError:
            return None
        return CursorRecord.from_json(data) if data else None

    def read(self) -> CursorRecord | None:
        """Read the cursor and remember its version for the next :meth:`write`; None if none was written."""
        self.client.ensure_path(self.path)
        data, stat = self.client.get(self.path)
        self._version = stat.version
        return CursorRecord.from_json(data) if data else None

    def write(self, cursor: CursorRecord) -> None:
        """Raises: FencedError: another master wrote since this one read."""
        if self._version is None:
            self.read()
        try:
            stat = self.client.set(self.path, cursor.to_json(), version=self._version)
        except BadVersionError:
            raise FencedError(f"the cursor at {self.path} was written by a newer master") from None
        self._version = stat.version


class Layout:
    """The cluster's :class:`ShardLayout`, written once by the first ``delayq init`` (or node) and never changed."""

    def __init__(self, client: KazooClient, root: str):
        self.client = client
        self.path = f"{root}/layout"

    def read(self) -> ShardLayout | None:
        """The recorded layout; None if none is (a cluster no ``delayq init`` of this version has seen)."""
        try:
            data, _ = self.client.get(self.path)
        except NoNodeError:
            return None
        return ShardLayout.from_json(data)

    def ensure(self, wanted: ShardLayout) -> ShardLayout:
        """Record ``wanted`` if nothing is recorded yet; the recorded layout, which must have its shard count.

        Raises:
            ConfigurationError: another shard count is recorded, or the recorded one is unreadable.
        """
        try:
            self.client.create(self.path, wanted.to_json(), makepath=True)
            return wanted
        except NodeExistsError:
            pass
        data, _ = self.client.get(self.path)
        found = ShardLayout.from_json(data)
        if found is None:
            raise ConfigurationError(f"ZooKeeper node {self.path} does not hold a delayq shard layout ({data[:80]!r}):"
                                     " is another program using this folder?")
        self.refuse_change(found, wanted.shards)
        return found

    def refuse_change(self, recorded: ShardLayout, shards: int) -> None:
        """Raises: ConfigurationError: ``shards`` is not the recorded count (it never changes)."""
        if recorded.shards != shards:
            raise ConfigurationError(
                f"cluster at {self.path.rsplit('/', 1)[0]} has {recorded.shards} shards, recorded at its first init; "
                f"DELAYQ_SHARDS={shards} cannot change that: set DELAYQ_SHARDS={recorded.shards}, or move to a "
                "new cluster with more shards (docs/DESIGN.md, \"Shards\")")


class ConcurrentFinalize(DelayqError):
    """The feature level changed between this finalize's read and its write: another finalize won."""


class Features:
    """The cluster's finalized feature level (:class:`FeatureRecord`); absent on a cluster that ran 0.1.0.

    Every write is a compare-and-set on what was read, so two finalizes never both win, and
    nothing here lowers a level: the rules of what may be written are election/levels.py's.

    Example:
        >>> features = Features(client, "/delayq/orders")
        >>> finalized = features.read()
        >>> features.finalize(FeatureRecord.of(2), finalized)
    """

    def __init__(self, client: KazooClient, root: str):
        self.client = client
        self.path = f"{root}/features"

    def read(self, changed: Callable[[WatchedEvent], None] | None = None) -> FinalizedLevel:
        """The znode as it is now: its record, none, or why it is not a record.

        ``changed``: a one-shot watch, called (from kazoo's event thread) at the next change of
        the znode (created, set, deleted).
        """
        try:
            data, stat = self.client.get(self.path, watch=changed)
        except NoNodeError:
            # get() sets no watch on a znode that is not there; exists() does, for its creation. Created
            # in between, it is read again.
            if self.client.exists(self.path, watch=changed) is not None:
                return self.read(changed)
            return FinalizedLevel.of(self.path, None, None)
        return FinalizedLevel.of(self.path, data, stat.version)

    def record_new_cluster(self, record: FeatureRecord) -> bool:
        """Record ``record`` unless a level is recorded already; whether this call recorded it.

        For a cluster's first ``delayq init``: a new cluster starts at the newest level.
        """
        try:
            self.client.create(self.path, record.to_json(), makepath=True)
        except NodeExistsError:
            return False
        return True

    def finalize(self, record: FeatureRecord, read: FinalizedLevel) -> None:
        """Write ``record`` over what :meth:`read` returned as ``read``, if nothing was written since.

        Raises:
            ConcurrentFinalize: the znode changed since ``read`` (created, set or deleted).
        """
        try:
            if read.znode_version is None:
                self.client.create(self.path, record.to_json(), makepath=True)
            else:
                self.client.set(self.path, record.to_json(), version=read.znode_version)
        except (NodeExistsError, BadVersionError, NoNodeError):
            raise ConcurrentFinalize(f"the feature level at {self.path} changed while this finalize ran (another "
                                     "`delayq upgrade finalize`?): run `delayq upgrade status`, then finalize again "
                                     "if it is still needed") from None


class DuplicateNodeId(DelayqError):
    """Another live node is registered under this node's id."""


class Membership:
    """This node's ephemeral registration under ``nodes/``: claimed once, then kept current.

    The znode belongs to this node's ZooKeeper session. :meth:`claim` refuses an id a
    live node of another session holds (its registration changes every second);
    a registration left by this node's previous process goes when that session expires.
    """

    def __init__(self, client: KazooClient, root: str, node_id: str):
        self.client = client
        self.root = nodes_path(root)
        self.path = f"{self.root}/{node_id}"
        self.node_id = node_id
        self._lock = threading.Lock()

    def _session(self) -> int:
        """This client's session id, to tell its own ephemeral nodes from another session's.

        Raises:
            ConnectionLoss: the client has none right now (kazoo drops it when the session is
                lost, which can happen between a read and this call); the caller tries again.
        """
        session = self.client.client_id
        if session is None:
            raise ConnectionLoss("the ZooKeeper session was lost")
        return session[0]

    def claim(self, record: NodeRecord, timeout_s: float) -> None:
        """Register this node, waiting up to ``timeout_s`` for a stale registration of its id to expire.

        Raises:
            DuplicateNodeId: a live node of another session keeps the id's registration current
                (it changes while this one waits), or it outlived ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        first_mzxid: int | None = None  # the last change of another session's registration, when first seen
        while True:
            try:
                self.client.create(self.path, record.to_json(), ephemeral=True, makepath=True)
                return
            except NodeExistsError:
                pass
            try:
                data, stat = self.client.get(self.path)
            except NoNodeError:
                continue
            if stat.ephemeralOwner == self._session():
                self.publish(record)
                return
            if first_mzxid is None:
                first_mzxid = stat.mzxid
            elif stat.mzxid != first_mzxid or time.monotonic() > deadline:
                other = NodeRecord.from_json(data)
                where = f" (http {other.http})" if other is not None and other.http else ""
                raise DuplicateNodeId(
                    f"node id {self.node_id!r} is already registered by a live node{where}: give this node "
                    f"another DELAYQ_NODE_ID, or stop that one")
            time.sleep(0.2)

    def publish(self, record: NodeRecord) -> None:
        """Update this node's registration (re-created after a session loss).

        Raises:
            KazooException: ZooKeeper did not take it (the caller says why and tries again).
            DuplicateNodeId: another session registered the id meanwhile.
        """
        data = record.to_json()
        with self._lock:
            try:
                stat = self.client.exists(self.path)
                if stat is None:
                    self.client.create(self.path, data, ephemeral=True, makepath=True)
                elif stat.ephemeralOwner == self._session():
                    self.client.set(self.path, data, version=stat.version)
                else:
                    raise DuplicateNodeId(f"node id {self.node_id!r} was registered by another ZooKeeper session "
                                          "(another node with this DELAYQ_NODE_ID?)")
            except (NodeExistsError, BadVersionError):
                pass  # raced with a re-creation of this session's own node: the next publish updates it

    def withdraw(self) -> None:
        """Remove this node's registration, only if it is this session's (never another live node's).

        With ZooKeeper away it does nothing: the registration is ephemeral and goes with the
        session, and a request now would wait for ZooKeeper to come back.
        """
        if not self.client.connected:
            return
        with self._lock:
            try:
                stat = self.client.exists(self.path)
                if stat is not None and stat.ephemeralOwner == self._session():
                    self.client.delete(self.path, version=stat.version)
            except KazooException:
                pass

    @staticmethod
    def members(client: KazooClient, root: str) -> list[NodeRecord]:
        """The registrations of every live node of the cluster at ``root`` (unreadable ones left out)."""
        folder = nodes_path(root)
        try:
            children = client.get_children(folder)
        except NoNodeError:
            return []
        found = []
        for child in sorted(children):
            try:
                data, _ = client.get(f"{folder}/{child}")
            except NoNodeError:
                continue
            record = NodeRecord.from_json(data)
            if record is not None:
                found.append(record)
        return found


def watch_membership(client: KazooClient, root: str, shards: int, changed: Callable[[], None],
                     stopped: Callable[[], bool]) -> None:
    """Call ``changed()`` whenever a node registers or leaves, or a shard's election line changes, until ``stopped()``.

    A master whose session ended or who was evicted leaves its shard's line: the nodes that
    may take the shard see it now, not at their next look at the membership. ``changed()`` runs
    on kazoo's event thread (once when each watch is set, too), so it must only signal. The
    watches are set again after a lost session.

    Raises:
        KazooException: ZooKeeper did not answer (the watches set so far stay).
    """
    def on_children(_children: list[str]) -> bool:
        if stopped():
            return False  # kazoo drops the watch
        changed()
        return True

    for path in [nodes_path(root), *(election_path(root, k) for k in range(shards))]:
        client.ensure_path(path)
        ChildrenWatch(client, path, on_children)


def evict(client: KazooClient, root: str, node_id: str) -> list[str]:
    """Remove the traces of ``node_id``, a process known to be gone, before its session expires: the paths removed.

    Its registration and its places in the shards' election lines. Only for a process whose
    exit was seen (a node's member process, reaped by the node that ran it): nothing of it can
    act any more, so its shards move at once instead of a session timeout later. The next
    master of each shard it led bumps the epoch and fences its transactional producer as
    after any failover. Removing the traces of a live process would let a second master in.

    Raises:
        KazooException: ZooKeeper did not answer (some traces may be gone already).
    """
    removed = []
    registration = f"{nodes_path(root)}/{node_id}"
    try:
        client.delete(registration)
        removed.append(registration)
    except NoNodeError:
        pass
    try:
        shards = client.get_children(f"{root}/shards")
    except NoNodeError:
        shards = []
    for shard in shards:
        line = f"{root}/shards/{shard}/election"
        try:
            children = client.get_children(line)
        except NoNodeError:
            continue
        for child in children:
            path = f"{line}/{child}"
            try:
                data, _ = client.get(path)
                if data.decode("utf-8", "replace") == node_id:
                    client.delete(path)
                    removed.append(path)
            except NoNodeError:
                continue
    return removed


class Leadership:
    """Contend for the mastership of one shard; while master, ``lead(term)`` runs until the term ends.

    A term ends at once, and ``term.active`` turns false, when the ZooKeeper session is
    SUSPENDED or LOST, when a newer epoch of the shard appears, when it is handed over
    (:meth:`hand_over`), or when :meth:`stop` is called. The leader function must check
    ``term.active`` between steps and return promptly; it gives up the lock when it
    returns, and the node contends again while ``may_contend()`` says so.

    Example:
        >>> leadership = Leadership(client, "/delayq/orders", "node-a", shard=3)
        >>> threading.Thread(target=leadership.run, args=(deliver_while, lambda: True)).start()
    """

    def __init__(self, client: KazooClient, root: str, identifier: str, shard: int = 0):
        self.client = client
        self.root = root
        self.identifier = identifier
        self.shard = shard
        self.lock = client.Lock(election_path(root, shard), identifier)
        self.epoch = Epoch(client, root, shard)
        self._stopping = threading.Event()
        self._recheck = threading.Event()
        self._waiting = False  # in line for the lock (acquire() blocks)
        self._term: Term | None = None
        client.add_listener(self._session_changed)

    @staticmethod
    def contenders(client: KazooClient, root: str, shard: int = 0) -> list[str]:
        """The identifiers in line for shard ``shard``'s lock, the master first; [] if ZooKeeper did not say."""
        try:
            return list(client.Lock(election_path(root, shard)).contenders())
        except KazooException:
            return []

    @staticmethod
    def master(client: KazooClient, root: str, shard: int = 0) -> str | None:
        """The identifier of shard ``shard``'s current master, or None."""
        contenders = Leadership.contenders(client, root, shard)
        return contenders[0] if contenders else None

    @property
    def term(self) -> Term | None:
        return self._term

    @property
    def waiting(self) -> bool:
        """True while this node is in line for the lock, not master."""
        return self._waiting

    @property
    def stopping(self) -> bool:
        """True once :meth:`stop` was called: the node is shutting down."""
        return self._stopping.is_set()

    def run(self, lead: Callable[[Term], None], may_contend: Callable[[], bool] = lambda: True,
            contending: Callable[[], None] = lambda: None) -> None:
        """Contend (while ``may_contend()``), lead, give up, contend again, until :meth:`stop`. Blocks: a thread's.

        ``contending()`` is called each time this node gets in line for the lock: what a term
        needs first can be made ready while it waits.
        """
        self.epoch.watch(self._saw_epoch)
        while not self._stopping.is_set():
            if not may_contend():
                self._recheck.wait(0.2)
                self._recheck.clear()
                continue
            contending()
            try:
                # Blocks until this node's lock node is first in line; withdraw() or stop() cancel it.
                self._waiting = True
                won = self.lock.acquire()
            except CancelledError:
                continue
            except KazooException as err:
                if not self._stopping.is_set():
                    log.warning("election of shard %d: %s; contending again", self.shard, err)
                    time.sleep(0.5)
                continue
            finally:
                self._waiting = False
            if not won:
                continue
            try:
                # Told to stand back while it waited (another node is meant to lead): give the lock up.
                if self._stopping.is_set() or self.client.state != KazooState.CONNECTED or not may_contend():
                    continue
                term = Term(self.epoch.bump())
                self._term = term
                # stop() may have come since the check above, while the epoch was bumped: it saw no term to end,
                # and this one would lead until the process is killed (a node stopped right after it started
                # ignored SIGTERM). It sets _stopping before it reads _term: one of the two sees the other.
                if self._stopping.is_set():
                    continue
                log.info("%s is master of shard %d, epoch %d", self.identifier, self.shard, term.epoch)
                lead(term)
            except KazooException as err:
                log.warning("leadership of shard %d ended by ZooKeeper: %s", self.shard,
                            str(err) or type(err).__name__)
            finally:
                if self._term is not None:
                    self._term.end("leadership given up")
                self._term = None
                self._release()

    def recheck(self) -> None:
        """Look at ``may_contend()`` again now (it changed)."""
        self._recheck.set()

    def withdraw(self) -> None:
        """Leave the line for the lock if this node waits in it (never ends a term: see :meth:`hand_over`)."""
        if self._waiting:
            self.lock.cancel()

    def hand_over(self, reason: str) -> None:
        """End the current term, if any, the way a stopping node does: the batch in flight ends first."""
        term = self._term
        if term is not None:
            term.end(reason, routine=True)

    def stop(self) -> None:
        """End the current term at once and stop contending (the lock is released by :meth:`run`)."""
        self._stopping.set()
        self._recheck.set()
        if self._term is not None:
            self._term.end("node stopping", routine=True)
        self.lock.cancel()
        self.client.remove_listener(self._session_changed)

    def _release(self) -> None:
        # The lock must go, or no other node can lead: wait for ZooKeeper to be back, unless the node stops
        # meanwhile. Then the lock znode, ephemeral, goes with the session the stopping node closes, and
        # waiting would hold the node's exit until ZooKeeper is back.
        while self.client.state != KazooState.CONNECTED:
            if self._stopping.wait(0.2):
                log.info("shard %d: election lock left to the session, ZooKeeper is away", self.shard)
                return
        try:
            self.lock.release()
        except KazooException as err:
            # The session is gone, and with it the ephemeral lock node.
            log.info("releasing the election lock of shard %d: %s", self.shard, err)

    def _saw_epoch(self, epoch: int) -> None:
        term = self._term
        if term is not None:
            term.saw_epoch(epoch)

    def _session_changed(self, state: str) -> None:
        # Runs on kazoo's event thread: flag only, never block. A suspended session may
        # already be expired at the server, so the master stops acting right now.
        if state in (KazooState.SUSPENDED, KazooState.LOST) and self._term is not None:
            self._term.end(f"ZooKeeper session {state.lower()}")


class Term:
    """One master's time in office, under one epoch."""

    def __init__(self, epoch: int):
        self.epoch = epoch
        self.won_at = time.monotonic()
        self.ended_because: str | None = None
        # Ended on purpose (a handover, a stop), not by a fault: nothing for an operator to look at.
        self.routine = False
        self._ended = threading.Event()

    @property
    def active(self) -> bool:
        return not self._ended.is_set()

    def end(self, reason: str, *, routine: bool = False) -> None:
        if not self._ended.is_set():
            self.ended_because = reason
            self.routine = routine
            self._ended.set()

    def saw_epoch(self, epoch: int) -> None:
        if epoch > self.epoch:
            self.end(f"a newer master holds epoch {epoch}")
