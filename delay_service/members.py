"""A node of several member processes (``DELAYQ_PROCESSES`` = K > 1): one GIL per member, the node's shards split.

A node's masters and ingest share its one Python GIL: a node holding several shards
delivers no faster on 16 cores than on 2. With K > 1, ``delayq node`` runs K member
processes instead of one, each a whole node of its own (its buffer reader, stores,
elections, transactional producers, HTTP port): ``<node_id>-<i>``, HTTP port
``http_port + i`` (0: any), data in ``<data_dir>/members/<i>``, registered with the
node id as their **group**. Placement (placement.holders) counts a group as one node
and splits its shards between its live members, one each, so the machine still holds
each shard once, and each master runs in a process of its own (with K >= the shards the
node masters). Nothing of delivery changes: every rule a node keeps, a member keeps.

This process is their supervisor, and does nothing else:

- SIGTERM/SIGINT reach every member, which stops as a node does (hands its shards
  over); it exits 0 once they all have.
- A member that exits while the node runs is started again at once, after its traces in
  ZooKeeper are removed (election.evict: its registration and its places in the
  election lines): its process is gone, so its shards move to a sibling (or back to it,
  restarted) within a placement round instead of a ZooKeeper session timeout. Its open
  transaction is aborted by the next master's fencing, as after any failover.
- A member that cannot start (exits 1 or 2 within :data:`START_GRACE_S`, having said why in
  one line) stops the node with its exit code: another start would fail the same way.
- A member exits when this process dies (``PR_SET_PDEATHSIG``: :func:`die_with_parent`).
- It answers the node's HTTP port for the group (:class:`GroupView`), so probes and
  scrapes configured for a node need no change: ``/livez`` (it runs), ``/readyz`` (200
  once every member is ready; else the first one that is not, and why), ``/metrics``
  (every member's series, each with a ``member`` label), ``/v1/messages/{id}`` and the
  console's ``/v1/shards/<shard>/...`` (answered by the member holding the shard), and
  ``/console`` (passed to the first member, the one that runs the console when
  ``DELAYQ_CONSOLE`` is on: one index of the buffer per node, not per member). The members
  listen on the ports after it.
"""

from __future__ import annotations

import ctypes
import http.client
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from delayq.election import Features, Layout, connect_for, evict
from delayq.errors import ConfigurationError, UnavailableError
from delayq.features import MEMBERS_LEVEL, introduced_by
from delayq.settings import Settings
from delayq.signals import StopSignals
from delayq.store import StoredEntry

from .console.wsgi import MAX_BODY
from .http import NodeHandler, NodeHTTPServer
from .shard_answers import ShardAnswers
from .store_copies import CHUNK, READ_TIMEOUT_S, STORE
from .stores import MEMBERS_DIR, forget_stores

log = logging.getLogger("delayq.node")

# A member exiting 1 or 2 this soon after its start could not start: the node stops with it.
START_GRACE_S = 20.0
# How long members have to stop after SIGTERM (their batches in flight commit) before they are killed.
STOP_WAIT_S = 60.0
# How often the supervisor looks at its members besides when one exits (SIGCHLD).
WATCH_EVERY_S = 0.1
# A member restarted this often within RESTART_WINDOW_S is started again only after RESTART_BACKOFF_S.
RESTARTS_BEFORE_BACKOFF = 5
RESTART_WINDOW_S = 60.0
RESTART_BACKOFF_S = 5.0
# How long the front waits for a member's answer (a probe, a scrape, a lookup).
MEMBER_ANSWER_S = 2.0
# How long it waits for a console page the first member renders (pages ask the cluster's nodes in turn).
MEMBER_CONSOLE_S = 30.0
# Headers of one connection, not of the request or answer passed on (RFC 9110, 7.6.1), and the length, set anew.
_HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                         "transfer-encoding", "upgrade", "content-length"})
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def member_id(node_id: str, index: int) -> str:
    """The node id of member ``index`` of node ``node_id``."""
    return f"{node_id}-{index}"


def member_port(settings: Settings, index: int) -> int:
    """The HTTP port of member ``index``: the ones after the node's (0, any, if the node's is)."""
    return settings.http_port + 1 + index if settings.http_port else 0


def member_environment(settings: Settings, index: int, port: int, base: dict[str, str]) -> dict[str, str]:
    """The environment of member ``index``: the node's, with its own id, group, HTTP port and data folder."""
    env = dict(base)
    env.update({
        "DELAYQ_NODE_ID": member_id(settings.node_id, index),
        "DELAYQ_NODE_GROUP": settings.node_id,
        "DELAYQ_PROCESSES": "1",
        "DELAYQ_HTTP_PORT": str(port),
        "DELAYQ_DATA_DIR": str(settings.data_dir / MEMBERS_DIR / str(index)),
        "DELAYQ_LOG_LEVEL": settings.log_level,
    })
    return env


def runs_console(settings: Settings) -> bool:
    """Whether this process serves its node's console (``DELAYQ_CONSOLE``): a node of one process, or the first member
    of a node of members (the node's port passes /console to it; one index of the buffer per node, not per member).

    Every member keeps the setting all the same: its stores count their pending messages by due time from the start,
    for the console's questions the first member passes on.
    """
    return settings.console and (settings.node_group is None or settings.node_id == member_id(settings.node_group, 0))


def die_with_parent() -> None:
    """Have the kernel send this process SIGTERM when the process that started it dies (Linux; elsewhere nothing).

    Called by a member at its start; if its node is gone already, it stops at once.
    """
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)


@dataclass
class Member:
    index: int
    node_id: str
    port: int
    process: subprocess.Popen | None = None
    started_at: float = 0.0
    restarts: list[float] = field(default_factory=list)


class MemberProcesses:
    """Run and watch the member processes of one node (``Settings.processes`` of them)."""

    def __init__(self, settings: Settings, *, command: list[str] | None = None):
        self.settings = settings
        self.command = command or [sys.executable, "-m", "delayq", "node"]
        self.members = [Member(i, member_id(settings.node_id, i), member_port(settings, i) or free_port())
                        for i in range(settings.processes)]
        self.stopping = threading.Event()  # set once the node is told to stop (its /readyz says so)
        # A member that exits (SIGCHLD) is seen at once, not at the next look: its shards wait for its eviction.
        self._signals = StopSignals(wake=(signal.SIGCHLD,))
        self._zk: KazooClient | None = None
        self.http: NodeHTTPServer | None = None

    def run(self) -> int:
        """Start the members, keep them running until SIGTERM/SIGINT, stop them; the exit code."""
        with self._signals:
            return self._run()

    def _run(self) -> int:
        s = self.settings
        self._check_level()
        self._forget_other_shapes()
        self.http = NodeHTTPServer(GroupView(self), s.http_host, s.http_port, GroupHandler)
        self.http.start()
        log.info("node %s: starting %d member processes (%s), HTTP on %s:%d (members on %s), data in %s", s.node_id,
                 len(self.members), ", ".join(m.node_id for m in self.members), s.http_host, self.http.port,
                 ", ".join(str(m.port) for m in self.members), s.data_dir / MEMBERS_DIR)
        _adopt_orphans()
        for member in self.members:
            self._start(member)
        code = 0
        try:
            while not self._signals.sleep(WATCH_EVERY_S):
                failed = self._watch()
                if failed is not None:
                    code = failed
                    break
        finally:
            self.stopping.set()
            self._stop_all()
            if self.http is not None:
                self.http.stop()
            if self._zk is not None:
                self._zk.stop()
                self._zk.close()
        return code

    def _zookeeper(self) -> KazooClient:
        if self._zk is None:
            self._zk = connect_for(self.settings)
        return self._zk

    def _check_level(self) -> None:
        """Run members only on a cluster finalized at :data:`MEMBERS_LEVEL` or above, or on a new one.

        Raises:
            ConfigurationError: the cluster may still have nodes that place shards without groups.
            UnavailableError: ZooKeeper did not answer.
        """
        s = self.settings
        zk = self._zookeeper()
        finalized = Features(zk, s.zk_root).read()
        level = finalized.level
        if level is None or level >= MEMBERS_LEVEL or (not finalized.recorded and Layout(zk, s.zk_root).read() is None):
            return  # a damaged record stops no node (it is reported), and a new cluster is recorded at the newest
        raise ConfigurationError(
            f"DELAYQ_PROCESSES={s.processes}: cluster {s.cluster} is finalized at feature level {level}, and member "
            f"processes need level {MEMBERS_LEVEL} (delayq {introduced_by(MEMBERS_LEVEL)}: older nodes place shards "
            "without the members' group); run `delayq upgrade finalize` once every node runs "
            f"{introduced_by(MEMBERS_LEVEL)} or later, or set DELAYQ_PROCESSES=1")

    def _forget_other_shapes(self) -> None:
        """The stores of this node as one process, and of members beyond the count, are no one's any more."""
        s = self.settings
        forget_stores(s.data_dir, f"this node runs as {len(self.members)} member processes now, each with its own")
        folder = s.data_dir / MEMBERS_DIR
        for path in sorted(folder.iterdir()) if folder.is_dir() else ():
            if not (path.name.isdigit() and int(path.name) < len(self.members)):
                forget_stores(path, f"this node runs {len(self.members)} member processes now")

    def _start(self, member: Member) -> None:
        env = member_environment(self.settings, member.index, member.port, dict(os.environ))
        member.process = subprocess.Popen(self.command, env=env)
        member.started_at = time.monotonic()

    def _reap_orphans(self) -> None:
        """Wait for the children that are no members: a killed member's buffer reader, orphaned, comes to this process.

        It exits by itself (it watches its parent), but only its new parent can wait for it: in a
        container this process is pid 1, and this process is made the members' subreaper
        outside one, so without this each killed member would leave a zombie behind.
        """
        members = {m.process.pid for m in self.members if m.process is not None}
        for child in children(os.getpid()):
            if child not in members:
                try:
                    os.waitpid(child, os.WNOHANG)
                except ChildProcessError:  # not ours to wait for, or waited for already
                    pass

    def _watch(self) -> int | None:
        """Start again each member that exited; an exit code if one could not start (the node stops then)."""
        self._reap_orphans()
        for member in self.members:
            process = member.process
            if process is None or process.poll() is None:
                continue
            code = process.returncode
            lived = time.monotonic() - member.started_at
            if code in (1, 2) and lived < START_GRACE_S:
                log.error("node %s: member %s could not start (exit %d, said why above); stopping the node",
                          self.settings.node_id, member.node_id, code)
                member.process = None
                return code
            how = f"signal {-code}" if code < 0 else f"exit {code}"
            log.warning("node %s: member %s stopped (%s) after %.1fs; removing its ZooKeeper traces and starting it "
                        "again", self.settings.node_id, member.node_id, how, lived)
            self._evict(member)
            now = time.monotonic()
            member.restarts = [t for t in member.restarts if now - t < RESTART_WINDOW_S] + [now]
            if len(member.restarts) > RESTARTS_BEFORE_BACKOFF and self._stopped_within(RESTART_BACKOFF_S):
                member.process = None
                return None
            self._start(member)
        return None

    def _stopped_within(self, seconds: float) -> bool:
        """Wait ``seconds`` unless told to stop first (a member exiting meanwhile does not cut it short)."""
        deadline = time.monotonic() + seconds
        while not self._signals.sleep(max(0.0, deadline - time.monotonic())) and time.monotonic() < deadline:
            pass
        return self._signals.stopped

    def _evict(self, member: Member) -> None:
        """Its shards move now, not a session timeout later (its process is reaped: nothing of it can act)."""
        try:
            removed = evict(self._zookeeper(), self.settings.zk_root, member.node_id)
            log.info("node %s: removed %d ZooKeeper traces of member %s", self.settings.node_id, len(removed),
                     member.node_id)
        except (KazooException, UnavailableError) as err:
            # Its session expires by itself: the shards move then, a session timeout later.
            log.warning("node %s: could not remove the ZooKeeper traces of member %s (%s); they go when its session "
                        "expires", self.settings.node_id, member.node_id, str(err) or type(err).__name__)

    def _stop_all(self) -> None:
        running = [m.process for m in self.members if m.process is not None and m.process.poll() is None]
        for process in running:
            process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_WAIT_S
        for process in running:
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _adopt_orphans() -> None:
    """Be the subreaper of the members' children (Linux): a killed member's reader is orphaned to this process."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1)
    except (OSError, AttributeError):
        pass


def children(pid: int) -> list[int]:
    """The pids of ``pid``'s children (Linux's /proc; none elsewhere)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(child) for child in (task / "children").read_text().split()]
        except OSError:  # a thread ended meanwhile
            continue
    return found


def free_port() -> int:
    """A loopback port free now (a member of a node given HTTP port 0 gets one)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _member_get(member: Member, path: str) -> tuple[int, bytes]:
    """A member's answer to GET ``path``: status and body (status 0: it did not answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{member.port}{path}", timeout=MEMBER_ANSWER_S) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()
    except OSError:
        return 0, b""


class _MembersMetrics:
    """A collector of every member's series, each with a ``member`` label: one scrape of the node covers all."""

    def __init__(self, members: list[Member]):
        self.members = members

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, Metric] = {}
        for member in self.members:
            status, body = _member_get(member, "/metrics")
            if status != 200:
                continue
            for family in text_string_to_metric_families(body.decode()):
                into = merged.setdefault(family.name, Metric(family.name, family.documentation, family.type,
                                                             family.unit))
                into.samples += [sample._replace(labels={**sample.labels, "member": member.node_id})
                                 for sample in family.samples]
        yield from merged.values()


class GroupView:
    """The node's HTTP answers for its member processes (http.NodeView)."""

    def __init__(self, members: MemberProcesses):
        self.processes = members
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(_MembersMetrics(members.members))

    @property
    def registry(self) -> CollectorRegistry:
        return self._registry

    def alive(self) -> bool:
        return not self.processes.stopping.is_set()

    def ready(self) -> tuple[bool, str]:
        for member in self.processes.members:
            status, body = _member_get(member, "/readyz")
            if status != 200:
                try:
                    reason = json.loads(body)["reason"]
                except (ValueError, KeyError, TypeError):
                    reason = "not answering" if status == 0 else f"HTTP {status}"
                return False, f"member {member.node_id}: {reason}"
        return True, f"all {len(self.processes.members)} members ready"

    def shard_of(self, delay_id: str) -> tuple[int, bool]:  # GroupHandler asks the members instead
        raise NotImplementedError

    def entry(self, delay_id: str) -> StoredEntry | None:  # GroupHandler asks the members instead
        raise NotImplementedError

    def shard_count(self) -> int:  # GroupHandler asks the members instead
        raise NotImplementedError

    def console_shard(self, shard: int) -> ShardAnswers | None:  # GroupHandler asks the members instead
        raise NotImplementedError

    def store_copy_allowed(self, shard: int, authorization: str | None) -> bool:  # the member holding it checks
        raise NotImplementedError

    def store_copy(self, shard: int) -> Path | None:  # GroupHandler passes the copy of the member holding it
        raise NotImplementedError

    @property
    def console_app(self) -> None:  # GroupHandler passes /console to the first member
        return None


class GroupHandler(NodeHandler):
    """What the holder of a shard answers (a lookup, the console's questions about a shard) is asked of the members:
    the one holding it answers, the others say 421. /console is the first member's."""

    @property
    def _members(self) -> list[Member]:
        view = self.node
        assert isinstance(view, GroupView)
        return view.processes.members

    def message(self, delay_id: str) -> None:
        self._from_holder()

    def shard_page(self, rest: str, query: str) -> None:
        if rest.partition("/")[2] == STORE:
            self._store_from_holder()
        else:
            self._from_holder()

    def _store_from_holder(self) -> None:
        """The copy of a shard's store the member holding it sends, passed on as it comes (it can be gigabytes)."""
        for member in self._members:
            connection = http.client.HTTPConnection("127.0.0.1", member.port, timeout=READ_TIMEOUT_S)
            try:
                proof = self.headers.get("Authorization")
                connection.request("GET", self.path, headers={"Authorization": proof} if proof else {})
                answer = connection.getresponse()
                if answer.status == 421:
                    continue
                self.close_connection = True
                self._pass_head(answer.status, answer.getheaders())
                self.send_header("Connection", "close")
                self.end_headers()
                shutil.copyfileobj(answer, self.wfile, CHUNK)
                return
            except OSError as err:
                log.warning("member %s: no copy of the store passed on: %s", member.node_id, err)
                if self.close_connection:
                    return  # the answer had begun: the receiver sees it broken off
            finally:
                connection.close()
        self._json(421, {"error": "no member of this node holds the shard: ask a node that does"})

    def _from_holder(self) -> None:
        """The answer to this GET of the first member that does not say 421 (the shard is not its)."""
        last: tuple[int, bytes] = (503, json.dumps({"error": "no member of this node answered"}).encode())
        for member in self._members:
            status, body = _member_get(member, self.path)
            if status in (0, 421):
                last = (status or 503, body or last[1])
                continue
            self.send(status, body, "application/json")
            return
        self.send(last[0], last[1], "application/json")

    def console(self) -> None:
        """This request (GET or POST) passed to the first member as it came, and its answer back as it went."""
        member = self._members[0]
        length = int(self.headers.get("Content-Length") or 0)
        if not 0 <= length <= MAX_BODY:
            self.close_connection = True
            self._json(413, {"error": f"a request body of {length} bytes is over the console's {MAX_BODY}"})
            return
        body = self.rfile.read(length) if length else None
        headers = {name: value for name, value in self.headers.items() if name.lower() not in _HOP_BY_HOP}
        connection = http.client.HTTPConnection("127.0.0.1", member.port, timeout=MEMBER_CONSOLE_S)
        try:
            connection.request(self.command, self.path, body=body, headers=headers)
            answer = connection.getresponse()
            status, answered, data = answer.status, answer.getheaders(), answer.read()
        except OSError as err:
            self._json(503, {"error": f"member {member.node_id}, which runs this node's console, did not answer: "
                                      f"{err}"})
            return
        finally:
            connection.close()
        self._pass_head(status, answered)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _pass_head(self, status: int, headers: list[tuple[str, str]]) -> None:
        """A member's status and headers passed on, but those of its own connection (the caller ends the head)."""
        self.send_response(status)
        for name, value in headers:
            if name.lower() not in _HOP_BY_HOP:
                self.send_header(name, value)
