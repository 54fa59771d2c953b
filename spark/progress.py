"""Progress while the job runs: the step it is on, and the tasks of Spark's running stages."""

from __future__ import annotations

import threading
import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn


class SparkProgress:
    """A Rich progress display fed by the job's steps and by Spark's status tracker.

    Each finished step is printed as a line with its duration (so a log file or CI
    output shows the run too); the live part shows the current step and how many
    tasks of the active Spark stages are done.

    Example:
        >>> with SparkProgress() as progress:               # doctest: +SKIP
        ...     reconcile(settings, options, progress=progress.step)
    """

    def __init__(self, console: Console | None = None, poll_s: float = 0.5):
        self.console = console or Console(stderr=True)
        self._poll_s = poll_s
        self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                  MofNCompleteColumn(), TimeElapsedColumn(), console=self.console, transient=True)
        # Added before start(): rich shows them once the live display starts.
        self._step_task = self._progress.add_task("starting", total=None)
        self._tasks_task = self._progress.add_task("Spark: idle", total=None, visible=False)
        self._current: str | None = None
        self._started = 0.0
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._poll, name="delayq-spark-progress", daemon=True)

    def __enter__(self) -> SparkProgress:
        self._progress.start()
        self._poller.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._poller.join(timeout=5)
        self._finish_step(failed=exc_info[0] is not None)
        self._progress.stop()

    def step(self, text: str) -> None:
        """Start the next step of the run (the previous one is done)."""
        self._finish_step()
        self._current = text
        self._started = time.monotonic()
        self._progress.update(self._step_task, description=text)

    def _finish_step(self, failed: bool = False) -> None:
        if self._current is not None:
            mark = "[red]✗[/]" if failed else "[green]✓[/]"
            self.console.print(f"{mark} {self._current} [dim]({time.monotonic() - self._started:.1f} s)[/]",
                               highlight=False)
            self._current = None

    def _poll(self) -> None:
        while not self._stop.wait(self._poll_s):
            try:
                self._show_stages()
            except Exception:  # the JVM may be going away under us; progress must never fail the job
                continue

    def _show_stages(self) -> None:
        from pyspark import SparkContext

        context = SparkContext._active_spark_context
        if context is None:
            return
        tracker = context.statusTracker()
        stages = [info for info in (tracker.getStageInfo(s) for s in tracker.getActiveStageIds()) if info]
        if not stages:
            self._progress.update(self._tasks_task, visible=False)
            return
        total = sum(s.numTasks for s in stages)
        done = sum(s.numCompletedTasks for s in stages)
        running = sum(s.numActiveTasks for s in stages)
        names = ", ".join(str(s.stageId) for s in stages)
        self._progress.update(self._tasks_task, visible=True, total=total, completed=done,
                              description=f"Spark stage {names}: {running} task(s) running")
