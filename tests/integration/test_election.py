"""election/ against the real ZooKeeper: epoch, cursor fencing, membership, leadership and session loss."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
from kazoo.client import KazooClient
from support.process_testing import wait_until

from delayq.election import (
    Cursor,
    CursorRecord,
    DuplicateNodeId,
    Epoch,
    FencedError,
    Leadership,
    Membership,
    NodeRecord,
    Role,
    connect,
    watch_membership,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def zk(dev_stack, names):
    clients: list[KazooClient] = []

    def new_client(session_timeout_ms: int = 3000) -> KazooClient:
        client = connect(dev_stack.zk_connect, session_timeout_ms=session_timeout_ms)
        clients.append(client)
        return client

    yield new_client
    cleaner = new_client()
    cleaner.delete(names.zk_root, recursive=True)
    for client in clients:
        client.stop()
        client.close()


def expire_session(dev_stack, client: KazooClient) -> None:
    """Make ZooKeeper expire ``client``'s session: a second client joins it, then closes it."""
    session_id, password = client.client_id
    twin = KazooClient(hosts=dev_stack.zk_connect, client_id=(session_id, password))
    twin.start(timeout=10)
    twin.stop()
    twin.close()


def test_epoch_bumps_are_atomic_across_clients(zk, names):
    epochs = [Epoch(zk(), names.zk_root) for _ in range(4)]
    results: list[int] = []
    threads = [threading.Thread(target=lambda e=e: results.extend(e.bump() for _ in range(5))) for e in epochs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sorted(results) == list(range(1, 21))
    assert epochs[0].current() == 20


def test_cursor_write_from_a_stale_reader_is_fenced(zk, names):
    old, new = Cursor(zk(), names.zk_root), Cursor(zk(), names.zk_root)
    old.read()
    new.read()
    newer = CursorRecord(epoch=2, node_id="b", watermark_deliver_at_ms=7, last_id="x", delivered=10, committed_at_ms=9)
    new.write(newer)

    with pytest.raises(FencedError):
        old.write(CursorRecord(epoch=1, node_id="a", watermark_deliver_at_ms=5, last_id="y", delivered=5,
                               committed_at_ms=8))
    assert Cursor(zk(), names.zk_root).read() == newer


def test_membership_is_ephemeral_and_updates_in_place(zk, names):
    member_client, observer = zk(), zk()
    membership = Membership(member_client, names.zk_root, "node-a")
    membership.claim(NodeRecord("node-a", Role.STANDBY), timeout_s=5)
    membership.publish(NodeRecord("node-a", Role.MASTER, http="http://h:1", lag=0, pending=3, epoch=2))

    assert Membership.members(observer, names.zk_root) == [
        NodeRecord("node-a", Role.MASTER, http="http://h:1", lag=0, pending=3, epoch=2)]
    member_client.stop()
    assert Membership.members(observer, names.zk_root) == []


def test_a_second_live_node_with_the_same_id_is_refused_and_cannot_remove_the_first(zk, names):
    first_client, second_client, observer = zk(), zk(), zk()
    first = Membership(first_client, names.zk_root, "node-a")
    first.claim(NodeRecord("node-a", Role.STANDBY, http="http://first:1"), timeout_s=5)
    stop = threading.Event()

    def keep_publishing():  # as a live node does, every second (faster here)
        while not stop.wait(0.2):
            first.publish(NodeRecord("node-a", Role.STANDBY, http="http://first:1", updated_at_ms=time.time_ns()))

    publisher = threading.Thread(target=keep_publishing)
    publisher.start()
    try:
        second = Membership(second_client, names.zk_root, "node-a")
        with pytest.raises(DuplicateNodeId, match=r"node id 'node-a' is already registered by a live node "
                                                  r"\(http http://first:1\): give this node another DELAYQ_NODE_ID"):
            second.claim(NodeRecord("node-a", Role.STANDBY, http="http://second:2"), timeout_s=10)
        with pytest.raises(DuplicateNodeId):
            second.publish(NodeRecord("node-a", Role.STANDBY, http="http://second:2"))
        second.withdraw()  # not its registration: it must not delete the live node's
        assert [m.http for m in Membership.members(observer, names.zk_root)] == ["http://first:1"]
    finally:
        stop.set()
        publisher.join()


def test_a_registration_left_by_a_dead_session_is_taken_over_once_it_expires(zk, names, dev_stack):
    # A node process killed with SIGKILL: its session (and registration) lingers until ZooKeeper expires it.
    script = (
        "import sys, time\n"
        "from delayq.election import Membership, NodeRecord, Role, connect\n"
        f"client = connect({dev_stack.zk_connect!r}, session_timeout_ms=2000)\n"
        f"Membership(client, {names.zk_root!r}, 'node-a').claim(NodeRecord('node-a', Role.MASTER), timeout_s=5)\n"
        "print('registered', flush=True)\n"
        "time.sleep(60)\n")
    doomed = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert doomed.stdout.readline().strip() == "registered"
    finally:
        doomed.kill()
        doomed.wait()
    assert [m.role for m in Membership.members(zk(), names.zk_root)] == [Role.MASTER]

    successor = Membership(zk(), names.zk_root, "node-a")
    successor.claim(NodeRecord("node-a", Role.STARTING, http="http://new:3"), timeout_s=10)
    assert [m.http for m in Membership.members(zk(), names.zk_root)] == ["http://new:3"]


def run_contender(client, root, name, log, in_line: list[str] | None = None):
    leadership = Leadership(client, root, name)

    def lead(term):
        log.append((name, term.epoch))
        while term.active:
            time.sleep(0.05)

    def contending():
        if in_line is not None:
            in_line.append(name)

    thread = threading.Thread(target=leadership.run, args=(lead, lambda: True, contending), daemon=True)
    thread.start()
    return leadership, thread


def test_one_master_and_a_stopped_master_hands_over_at_once(zk, names):
    log: list[tuple[str, int]] = []
    in_line: list[str] = []
    a, thread_a = run_contender(zk(), names.zk_root, "node-a", log, in_line)
    assert wait_until(lambda: len(log) == 1, timeout_s=15)
    b, thread_b = run_contender(zk(), names.zk_root, "node-b", log, in_line)
    assert wait_until(lambda: len(in_line) == 2, timeout_s=15), in_line
    time.sleep(0.5)  # node-b waits in line: nothing more happens
    assert log == [("node-a", 1)]
    # Each was told once as it got in line, node-b while it waits (a node makes its term's producer then).
    assert in_line == ["node-a", "node-b"]
    assert Leadership.master(zk(), names.zk_root) == "node-a"

    started = time.monotonic()
    a.stop()
    assert wait_until(lambda: len(log) == 2, timeout_s=5)
    assert log[1] == ("node-b", 2)
    assert time.monotonic() - started < 2.0  # no session timeout to wait for
    b.stop()
    thread_a.join(5)
    thread_b.join(5)
    assert not thread_a.is_alive() and not thread_b.is_alive()


def test_master_whose_session_expires_stops_and_another_takes_over(dev_stack, zk, names):
    log: list[tuple[str, int]] = []
    client_a = zk()
    a, _ = run_contender(client_a, names.zk_root, "node-a", log)
    assert wait_until(lambda: len(log) == 1, timeout_s=15)
    term_a = a.term
    b, _ = run_contender(zk(), names.zk_root, "node-b", log)

    expire_session(dev_stack, client_a)

    assert wait_until(lambda: not term_a.active, timeout_s=10)
    assert "ZooKeeper session" in term_a.ended_because
    assert wait_until(lambda: ("node-b", 2) in log, timeout_s=10)
    a.stop()
    b.stop()


def test_a_newer_epoch_ends_the_current_term(zk, names):
    log: list[tuple[str, int]] = []
    a, _ = run_contender(zk(), names.zk_root, "node-a", log)
    assert wait_until(lambda: len(log) == 1, timeout_s=15)
    term = a.term

    Epoch(zk(), names.zk_root).bump()  # what a master elected elsewhere would do

    assert wait_until(lambda: not term.active, timeout_s=5)
    assert "newer master" in term.ended_because
    a.stop()


def test_a_stop_that_comes_while_the_lock_is_won_still_ends_the_term_that_lock_begins(zk, names):
    # stop() while the winner bumps the epoch (a node stopped right after it started): it sees no term yet, and
    # the term about to begin must not lead for good (that node ignored SIGTERM).
    leadership = Leadership(zk(), names.zk_root, "node-a")
    bump = leadership.epoch.bump

    def bump_while_stopped() -> int:
        epoch = bump()
        leadership.stop()
        return epoch

    leadership.epoch.bump = bump_while_stopped  # type: ignore[method-assign]
    led: list[int] = []
    thread = threading.Thread(target=leadership.run, args=(lambda term: led.append(term.epoch),), daemon=True)
    thread.start()
    thread.join(10)
    assert not thread.is_alive(), "the leadership went on after stop()"
    assert led == [], "a term began after stop()"
    assert Leadership.master(zk(), names.zk_root) is None  # the lock given up


def test_the_membership_watch_says_at_once_when_a_node_registers_or_leaves_or_a_line_changes_and_stops_when_told(
        zk, names):
    observer, member_client = zk(), zk()
    changes: list[float] = []
    stopped = threading.Event()
    watch_membership(observer, names.zk_root, 2, lambda: changes.append(time.monotonic()), stopped.is_set)
    assert wait_until(lambda: len(changes) == 3, timeout_s=5), changes  # once as each watch is set: nodes, 2 lines
    seen = len(changes)

    def said_within(seconds: float) -> bool:
        nonlocal seen
        began = time.monotonic()
        said = wait_until(lambda: len(changes) > seen, timeout_s=seconds, interval_s=0.005)
        seen = len(changes)
        return said and changes[-1] - began < seconds

    membership = Membership(member_client, names.zk_root, "node-a")
    membership.claim(NodeRecord("node-a", Role.STANDBY), timeout_s=5)
    assert said_within(1.0), "a node registering"
    membership.publish(NodeRecord("node-a", Role.MASTER, lag=0))
    time.sleep(0.3)
    assert len(changes) == seen, "a registration's update is no change of the membership"
    leadership = Leadership(member_client, names.zk_root, "node-a", 1)
    leadership.lock.acquire()
    assert said_within(1.0), "a node in line for shard 1"
    member_client.stop()  # its session ends: its registration and its place in line go
    assert said_within(1.0), "a node gone"
    stopped.set()
    Membership(observer, names.zk_root, "node-b").claim(NodeRecord("node-b", Role.STANDBY), timeout_s=5)
    time.sleep(0.3)
    assert len(changes) == seen, "a watch told to stop still called"
