"""A node's loop threads (delay_service/loops.py, Loops): a loop that dies takes the node down with it.

Real threads, no servers.
"""

from __future__ import annotations

import logging
import threading

from delayq.delay_service.loops import Loops


def test_a_loop_that_raises_is_the_node_failure_and_asks_the_node_to_stop(caplog):
    loops = Loops()
    broken = RuntimeError("the store went away")

    def fails() -> None:
        raise broken

    with caplog.at_level(logging.ERROR, logger="delayq.node"):
        thread = loops.spawn("ingest", fails)
        thread.join(5)

    assert loops.failure is broken and loops.stop_requested.is_set()
    assert not loops.alive()
    assert thread.name == "ingest" and thread.daemon
    assert "ingest loop failed" in caplog.text


def test_the_node_is_alive_while_every_loop_runs_and_a_loop_forgotten_no_longer_counts():
    loops = Loops()
    assert not loops.started and loops.alive(), "no loop yet: starting, nothing failed"
    release = threading.Event()
    running = loops.spawn("membership", lambda: release.wait(5))
    dropped = loops.spawn("election-3", lambda: None)
    dropped.join(5)

    assert loops.started
    assert not loops.alive(), "a loop ended without being forgotten: something stopped"
    loops.forget(dropped)
    assert loops.alive() and loops.threads == [running]

    release.set()
    loops.join(5)
    assert not running.is_alive() and loops.failure is None and not loops.stop_requested.is_set()


def test_a_failure_reported_outside_a_loop_stops_the_node_the_same_way():
    loops = Loops()
    duplicate = ValueError("node id taken")

    loops.fail(duplicate)

    assert loops.failure is duplicate and loops.stop_requested.is_set() and not loops.stopping.is_set()
