"""What ingest and delivery hand each other: ids in flight, and the wake-up for a message due sooner."""

from __future__ import annotations

import threading
import time

from delayq.clock import now_ms
from delayq.delay_service.handoff import InFlight, Wakeup
from delayq.election import Term


def test_ids_in_flight_until_ingest_reads_them_back_and_a_snapshot_is_a_copy():
    in_flight = InFlight()
    in_flight.add(["a", "b"])
    snapshot = in_flight.snapshot()
    snapshot.add("c")

    in_flight.discard(["a"])

    assert in_flight.snapshot() == {"b"}


def sleep_in_thread(wakeup: Wakeup, due_ms: int, term: Term) -> tuple[threading.Thread, list[float]]:
    slept: list[float] = []

    def sleep() -> None:
        started = time.monotonic()
        wakeup.sleep_until(due_ms, term)
        slept.append(time.monotonic() - started)

    thread = threading.Thread(target=sleep)
    thread.start()
    time.sleep(0.05)
    return thread, slept


def test_a_message_due_sooner_than_planned_wakes_the_master_and_a_later_one_does_not():
    wakeup = Wakeup()
    term = Term(1)
    thread, slept = sleep_in_thread(wakeup, now_ms() + 800, term)

    wakeup.earlier_due(now_ms() + 5_000)  # later than planned: sleeps on
    time.sleep(0.1)
    assert thread.is_alive()
    wakeup.earlier_due(now_ms())
    thread.join(2)

    assert slept and slept[0] < 0.6


def test_the_end_of_the_term_wakes_the_master():
    wakeup = Wakeup()
    term = Term(1)
    thread, slept = sleep_in_thread(wakeup, now_ms() + 800, term)

    term.end("handed over")
    wakeup.poke()
    thread.join(2)

    assert slept and slept[0] < 0.6
