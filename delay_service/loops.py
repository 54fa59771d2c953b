"""The threads of a node: each runs one loop, and a loop that dies takes the node down with it."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger("delayq.node")


class Loops:
    """A node's loop threads, the first failure among them, and the two stop signals they answer to.

    ``stop_requested`` is set by a signal, by a failure, or by the node's stop: the node begins to stop, and
    the placement takes no shard from then on. ``stopping`` is set once every term has ended: the loops that
    run until the node stops (ingest, membership, the in-sync watch) end then.

    Example:
        >>> loops = Loops()
        >>> loops.spawn("ingest", lambda: ingest.run(loops.stopping))
        >>> loops.stop_requested.wait(); loops.stopping.set(); loops.join(30)
    """

    def __init__(self) -> None:
        self.threads: list[threading.Thread] = []
        self.failure: BaseException | None = None
        self.stop_requested = threading.Event()
        self.stopping = threading.Event()

    def spawn(self, name: str, target: Callable[[], None]) -> threading.Thread:
        """Run ``target`` in a daemon thread called ``name``; if it raises, the node fails and stops."""

        def guarded() -> None:
            try:
                target()
            except BaseException as err:  # a dead loop must take the node down, not idle silently
                log.exception("%s loop failed", name)
                self.fail(err)

        thread = threading.Thread(target=guarded, name=name, daemon=True)
        thread.start()
        self.threads.append(thread)
        return thread

    def fail(self, err: BaseException) -> None:
        """The node cannot go on: keep ``err`` as its failure (its exit code says so) and ask it to stop."""
        self.failure = err
        self.stop_requested.set()

    def forget(self, thread: threading.Thread) -> None:
        """Stop counting ``thread``, which ended on purpose (the loop of a shard dropped), as one of the node's."""
        self.threads.remove(thread)

    @property
    def started(self) -> bool:
        """Whether any loop was spawned: until then the node is still starting."""
        return bool(self.threads)

    def alive(self) -> bool:
        """No loop failed and every one still runs."""
        return self.failure is None and all(thread.is_alive() for thread in list(self.threads))

    def join(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for each loop to end."""
        for thread in list(self.threads):
            thread.join(timeout_s)
