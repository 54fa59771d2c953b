"""Stop signals caught without a lock: a process told to stop stops, however busy its main thread is."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

from delayq.signals import STEP_S, StopSignals, sigterm_interrupts

# A main thread that looks for the signal as often as it can, beside a thread that wants the GIL: where the
# signal's handler lands in the middle of the look most often. With an Event set by the handler and
# ``Event.wait(0)`` as the look, 27 of 40 such processes ignored SIGTERM for good (2026-11-29).
BUSY_CHILD = textwrap.dedent("""
    import sys, threading
    from delayq.signals import StopSignals

    def spin():
        while True:
            sum(range(1000))

    threading.Thread(target=spin, daemon=True).start()
    with StopSignals() as signals:
        print("ready", flush=True)
        looks = 0
        while not signals.sleep(0):
            looks += 1
    print(signals.received, looks, flush=True)
""")


def test_a_busy_main_thread_stops_on_every_sigterm():
    children = [subprocess.Popen([sys.executable, "-c", BUSY_CHILD], stdout=subprocess.PIPE, text=True)
                for _ in range(16)]
    try:
        for child in children:
            assert child.stdout is not None and child.stdout.readline() == "ready\n"
        time.sleep(0.2)
        for child in children:
            child.send_signal(signal.SIGTERM)
        results = []
        for child in children:
            out, _ = child.communicate(timeout=10)
            results.append(out.split())
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    hung = [c.pid for c in children if c.returncode != 0]
    assert not hung, f"{len(hung)} of {len(children)} busy processes ignored SIGTERM"
    assert all(int(received) == signal.SIGTERM and int(looks) > 0 for received, looks in results), results


def test_sleep_ends_at_its_timeout_or_when_until_is_true():
    signals = StopSignals()
    started = time.monotonic()
    assert signals.sleep(0.2) is False
    assert 0.2 <= time.monotonic() - started < 0.2 + 5 * STEP_S
    done = threading.Event()
    threading.Timer(0.1, done.set).start()
    started = time.monotonic()
    assert signals.sleep(10, until=done.is_set) is False
    assert time.monotonic() - started < 0.1 + 5 * STEP_S


def test_a_stop_signal_ends_the_sleep_and_is_kept():
    with StopSignals() as signals:
        threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGINT)).start()
        started = time.monotonic()
        assert signals.sleep(10) is True
        assert time.monotonic() - started < 0.1 + 5 * STEP_S
        assert signals.received == signal.SIGINT and signals.stopped
        assert signals.sleep(0) is True  # stopped stays stopped


def test_a_wake_up_signal_ends_one_sleep_without_stopping():
    with StopSignals(wake=(signal.SIGUSR1,)) as signals:
        threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGUSR1)).start()
        started = time.monotonic()
        assert signals.sleep(10) is False
        assert time.monotonic() - started < 0.1 + 5 * STEP_S
        started = time.monotonic()
        assert signals.sleep(0.2) is False  # the wake-up was used up by the sleep it ended
        assert time.monotonic() - started >= 0.2


def test_the_handlers_before_come_back_on_exit_and_other_threads_install_none():
    before = signal.getsignal(signal.SIGTERM)
    with StopSignals(wake=(signal.SIGUSR1,)):
        assert signal.getsignal(signal.SIGTERM) is not before
    assert signal.getsignal(signal.SIGTERM) is before
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL

    def elsewhere() -> None:
        with StopSignals():
            seen.append(signal.getsignal(signal.SIGTERM))

    seen: list[object] = []
    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    assert seen == [before]


def test_sigterm_interrupts_like_ctrl_c():
    try:
        with sigterm_interrupts():
            threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGTERM)).start()
            time.sleep(5)
    except KeyboardInterrupt:
        pass
    else:
        raise AssertionError("SIGTERM did not interrupt the sleep")
