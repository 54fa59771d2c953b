"""SIGTERM and SIGINT for delayq's long-running processes, caught without a lock.

Python runs a signal handler in the main thread, between two bytecodes of whatever that thread is running,
which may be ``threading.Event.wait`` holding the event's own (non-reentrant) lock as it enters or leaves its
wait. A handler that calls ``Event.set()`` then waits for that lock forever, and the process ignores every later
SIGTERM: a 2-minute soak's node did so for 60 s until it was killed, and a busy loop on ``Event.wait(0)`` does it
for 27 signals of 40. On a busy node the window is not small: the main thread waits for the GIL while it holds
the lock. So the handlers here only store a number, and the main thread sleeps in short steps and looks.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

# How long the main thread sleeps between two looks: a signal is seen within it (the handler runs during the
# sleep, which then goes on to its end, PEP 475).
STEP_S = 0.05
STOP = (signal.SIGTERM, signal.SIGINT)


class StopSignals:
    """Stop signals (SIGTERM, SIGINT) and wake-up signals (SIGCHLD, say) as values the main thread reads.

    >>> with StopSignals() as signals:
    ...     while not signals.sleep(0.2, until=failed.is_set):
    ...         ...
    ...     stopping.set()  # ordinary code: events are set here, never in a handler

    Installed in the main thread only (Python's rule); elsewhere it catches nothing and only sleeps.
    """

    def __init__(self, *, wake: tuple[signal.Signals, ...] = ()) -> None:
        self.wake = wake
        self.received: int | None = None  # the first stop signal, once one came
        self._caught = 0  # signals caught (stop or wake-up); sleep() returns when it moved since its last look
        self._seen = 0
        self._before: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for number in (*STOP, *self.wake):
                self._before[number] = signal.signal(number, self._handle)
        return self

    def __exit__(self, *_exc: object) -> None:
        for number, handler in self._before.items():
            signal.signal(number, handler)
        self._before.clear()

    def _handle(self, number: int, _frame: FrameType | None) -> None:
        # Stores and counts only: see the module's docstring for why nothing here may take a lock.
        if number in STOP and self.received is None:
            self.received = number
        self._caught += 1

    @property
    def stopped(self) -> bool:
        """Whether a stop signal came."""
        return self.received is not None

    def sleep(self, timeout_s: float, until: Callable[[], bool] | None = None) -> bool:
        """Sleep up to ``timeout_s``, ending early once a signal was caught (since the last call returned) or
        ``until()`` is true; returns :attr:`stopped`. ``until`` must not block (``Event.is_set``, say)."""
        deadline = time.monotonic() + timeout_s
        while self._caught == self._seen and not (until is not None and until()):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(STEP_S, left))
        self._seen = self._caught
        return self.stopped


@contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """SIGTERM raises ``KeyboardInterrupt`` in the main thread, as Ctrl-C does: a command that tears down what it
    started (the soak, the demo) unwinds the same way for both. Raising takes no lock, so it cannot hang."""
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupt(_number: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt


__all__ = ["STEP_S", "StopSignals", "sigterm_interrupts"]
