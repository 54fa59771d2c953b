"""What ingest and delivery hand each other on a shard's master, each side through one small object.

Delivery tells ingest which ids it has committed a write for (:class:`InFlight`), so
neither delivers nor repairs them again before ingest reads the write back; ingest
tells the sleeping master when it stores a message due sooner than planned
(:class:`Wakeup`).
"""

from __future__ import annotations

import threading

from delayq.clock import now_ms
from delayq.election import Term

MAX_IDLE_WAIT_S = 1.0


class InFlight:
    """Ids the master committed a write for (a `done`, or a copy of a put) that ingest has not read back yet.

    Delivery adds ids just before it commits (ingest may read a record back before the
    commit call returns) and takes them back if the commit fails; ingest takes them out
    when it reads a `done`, a `cancel` or a master's copy of the id. Until then the
    master neither delivers nor repairs them.
    """

    def __init__(self) -> None:
        self._ids: set[str] = set()
        self._lock = threading.Lock()

    def add(self, ids: list[str]) -> None:
        with self._lock:
            self._ids.update(ids)

    def discard(self, ids: list[str]) -> None:
        with self._lock:
            self._ids.difference_update(ids)

    def snapshot(self) -> set[str]:
        with self._lock:
            return set(self._ids)


class Wakeup:
    """Lets ingest wake the sleeping master when it stores a message due sooner than it planned."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._planned_ms: int | None = None
        self._woken = False

    def sleep_until(self, due_ms: int | None, term: Term) -> None:
        with self._cond:
            self._planned_ms = due_ms
            self._woken = False
            timeout = MAX_IDLE_WAIT_S if due_ms is None else min(MAX_IDLE_WAIT_S, max(0, due_ms - now_ms()) / 1000)
            if timeout > 0 and term.active:
                self._cond.wait_for(lambda: self._woken or not term.active, timeout)
            self._planned_ms = None

    def earlier_due(self, due_ms: int) -> None:
        with self._cond:
            if self._planned_ms is None or due_ms < self._planned_ms:
                self._woken = True
                self._cond.notify_all()

    def poke(self) -> None:
        with self._cond:
            self._woken = True
            self._cond.notify_all()
