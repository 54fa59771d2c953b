"""The soak's judge on hand-made histories: each rule of the product's promise, with no server."""

from __future__ import annotations

from delayq import wire
from delayq.bench.soak_check import (
    ANOMALY_KINDS,
    BufferScan,
    Delivery,
    Fate,
    FaultWindow,
    History,
    Message,
    Version,
    Write,
    compare_with_reconcile,
    failures,
    judge,
    longest_stall,
    missing_by_buffer_partition,
    owed_versions,
)

DUE = 100_000


def acked(at_ms: int, offset: int = 0) -> Write:
    return Write(sent_ms=at_ms - 5, acked_ms=at_ms, partition=0, offset=offset)


def message(delay_id: str, *dues: int, cancel_acked_at: int | None = None, put_acked_at: int = 1_000,
            reschedule_acked_at: int | None = None) -> Message:
    """A message put at ``put_acked_at`` due ``dues[0]``, rescheduled to each later due, maybe cancelled."""
    versions = [Version(dues[0], acked(put_acked_at, offset=1))]
    for index, due in enumerate(dues[1:], start=2):
        versions.append(Version(due, acked(reschedule_acked_at or put_acked_at + 10, offset=index)))
    cancel = acked(cancel_acked_at, offset=9) if cancel_acked_at is not None else None
    return Message(delay_id, "target", versions, cancel)


def delivered(delay_id: str, due: int, at: int, offset: int = 0, version: int | None = None) -> Delivery:
    return Delivery(delay_id, due, at, "target", 0, offset, epoch=1, version=version)


def history(messages: list[Message], deliveries: list[Delivery], *, until: int = 10_000_000,
            faults: list[FaultWindow] | None = None) -> History:
    return History({m.delay_id: m for m in messages}, deliveries, faults or [], judged_until_ms=until,
                   ended_ms=until)


def kinds(h: History) -> dict[str, int]:
    counts = judge(h).counts
    return {k: counts[k] for k in ANOMALY_KINDS if counts[k]}


# -- plain messages ------------------------------------------------------------


def test_a_plain_message_delivered_once_on_time_breaks_no_rule():
    h = history([message("a", DUE)], [delivered("a", DUE, DUE + 20)])

    findings = judge(h)

    assert kinds(h) == {}
    assert findings.counts["delivered"] == 1
    assert findings.lateness_outside_faults.p50 == 20


def test_a_delivery_at_exactly_the_due_time_is_not_early():
    assert kinds(history([message("a", DUE)], [delivered("a", DUE, DUE)])) == {}


def test_a_delivery_one_ms_before_the_due_time_is_early():
    h = history([message("a", DUE)], [delivered("a", DUE, DUE - 1)])

    assert kinds(h) == {"early": 1}
    assert "1 ms before its due time" in judge(h).by_kind("early")[0].rule


def test_the_same_version_delivered_twice_is_duplicated_with_both_offsets_as_evidence():
    h = history([message("a", DUE)], [delivered("a", DUE, DUE + 5, offset=3), delivered("a", DUE, DUE + 9, offset=7)])

    anomaly = judge(h).by_kind("duplicated")[0]

    assert kinds(h) == {"duplicated": 1}
    assert [d["offset"] for d in anomaly.evidence["deliveries"]] == [3, 7]


def test_a_message_never_delivered_is_missing_once_it_is_due_before_the_cutoff():
    assert kinds(history([message("a", DUE)], [], until=DUE + 1)) == {"missing": 1}
    assert kinds(history([message("a", DUE)], [], until=DUE)) == {}


def test_missing_versions_are_grouped_by_the_buffer_partition_their_put_went_to():
    on_three = [message(name, DUE + n, put_acked_at=2_000 + n) for n, name in enumerate("abc")]
    for n, m in enumerate(on_three):
        m.versions[0].put.partition, m.versions[0].put.offset = 3, 40 + n
    elsewhere = message("d", DUE + 500, put_acked_at=4_000)
    elsewhere.versions[0].put.partition, elsewhere.versions[0].put.offset = 5, 7
    delivered_one = message("e", DUE)

    findings = judge(history([*on_three, elsewhere, delivered_one], [delivered("e", DUE, DUE + 5)], until=DUE + 1000))

    assert missing_by_buffer_partition(findings, started_ms=1_000) == {
        "3": {"count": 3, "offsets": [40, 42], "acked_s": [1.0, 1.0], "due_s": [99.0, 99.0]},
        "5": {"count": 1, "offsets": [7, 7], "acked_s": [3.0, 3.0], "due_s": [99.5, 99.5]},
    }


def test_a_put_that_failed_may_or_may_not_be_delivered():
    m = message("a", DUE)
    m.versions[0].put.error = "Local: Message timed out"

    assert m.fate(0) is Fate.MAY
    assert kinds(history([m], [])) == {}
    assert kinds(history([m], [delivered("a", DUE, DUE + 1)])) == {}


def test_deliveries_of_unknown_ids_or_unknown_due_times_are_unexpected():
    h = history([message("a", DUE)], [delivered("a", DUE, DUE + 1), delivered("a", DUE + 7, DUE + 9),
                                      delivered("zzz", DUE, DUE + 1)])

    rules = [a.rule for a in judge(h).by_kind("unexpected")]

    assert kinds(h) == {"unexpected": 2}
    assert any("never produced" in r for r in rules)
    assert any("no version of this id" in r for r in rules)


def test_the_version_header_is_evidence_not_a_rule_a_restored_copy_has_another_offset():
    h = history([message("a", DUE)], [delivered("a", DUE, DUE + 1, version=42)], until=DUE + 1)

    assert kinds(h) == {}
    assert judge(h).counts["delivered"] == 1


def test_a_duplicate_shows_the_version_header_of_each_delivery():
    h = history([message("a", DUE)], [delivered("a", DUE, DUE + 1, version=1), delivered("a", DUE, DUE + 9, version=7)])

    assert [d["version"] for d in judge(h).by_kind("duplicated")[0].evidence["deliveries"]] == [1, 7]


# -- cancels -------------------------------------------------------------------


def test_a_cancel_acked_before_the_due_time_must_win():
    m = message("a", DUE, cancel_acked_at=DUE - 1)

    assert m.fate(0) is Fate.MUST_NOT
    assert kinds(history([m], [])) == {}
    h = history([m], [delivered("a", DUE, DUE + 3)])
    assert kinds(h) == {"cancel_ignored": 1}
    anomaly = judge(h).by_kind("cancel_ignored")[0]
    assert "cancel acknowledged at 99999 ms" in anomaly.rule
    assert anomaly.evidence["cancel"]["buffer_offset"] == 9


def test_a_cancel_acked_at_or_after_the_due_time_is_a_race_either_outcome_is_fine():
    m = message("a", DUE, cancel_acked_at=DUE)

    assert m.fate(0) is Fate.MAY
    assert kinds(history([m], [])) == {}
    assert kinds(history([m], [delivered("a", DUE, DUE + 3)])) == {}
    assert kinds(history([m], [delivered("a", DUE, DUE + 3), delivered("a", DUE, DUE + 4, offset=1)])) == {
        "duplicated": 1}


def test_a_cancel_never_acknowledged_leaves_the_message_free_to_arrive_once():
    m = message("a", DUE)
    m.cancel = Write(sent_ms=DUE - 500)

    assert m.fate(0) is Fate.MAY
    assert kinds(history([m], [])) == {}


# -- reschedules ---------------------------------------------------------------


def test_a_reschedule_acked_before_the_old_due_time_moves_the_message():
    m = message("a", DUE, DUE + 5_000, reschedule_acked_at=DUE - 200)

    assert [m.fate(0), m.fate(1)] == [Fate.MUST_NOT, Fate.MUST]
    assert kinds(history([m], [delivered("a", DUE + 5_000, DUE + 5_010)])) == {}


def test_a_rescheduled_version_never_delivered_is_a_lost_reschedule_and_a_first_put_never_delivered_missing():
    moved = message("a", DUE, DUE + 5_000, reschedule_acked_at=DUE - 200)
    h = history([moved, message("b", DUE)], [], until=DUE + 6_000)

    assert kinds(h) == {"lost_reschedule": 1, "missing": 1}
    lost = judge(h).by_kind("lost_reschedule")[0]
    assert lost.delay_id == "a" and lost.evidence["version_index"] == 1
    assert lost.rule == "the reschedule to 105000 ms, acknowledged at 99800 ms, must be delivered exactly once: never delivered"


def test_a_stale_version_delivered_after_a_reschedule_acked_before_its_due_time_is_no_ignored_cancel():
    m = message("a", DUE, DUE + 5_000, reschedule_acked_at=DUE - 200)
    h = history([m], [delivered("a", DUE, DUE + 2), delivered("a", DUE + 5_000, DUE + 5_010)])

    assert kinds(h) == {"stale_version": 1}
    assert "a reschedule acknowledged at 99800 ms" in judge(h).by_kind("stale_version")[0].rule


def test_a_stale_version_delivered_instead_of_its_reschedule_is_both_a_stale_version_and_a_lost_reschedule():
    m = message("a", DUE, DUE + 5_000, reschedule_acked_at=DUE - 200)
    h = history([m], [delivered("a", DUE, DUE + 2)], until=DUE + 6_000)

    assert kinds(h) == {"stale_version": 1, "lost_reschedule": 1}
    assert failures(judge(h), crashes=0, stall_limit_s=100, comparison=None) == [
        "1 stale version", "1 lost reschedule"]


def test_a_reschedule_acked_after_the_old_due_time_may_follow_a_delivery_of_the_old_version():
    m = message("a", DUE, DUE + 5_000, reschedule_acked_at=DUE + 300)
    both = [delivered("a", DUE, DUE + 2), delivered("a", DUE + 5_000, DUE + 5_010)]

    assert [m.fate(0), m.fate(1)] == [Fate.MAY, Fate.MUST]
    assert kinds(history([m], both)) == {}
    assert kinds(history([m], both[1:])) == {}
    assert kinds(history([m], both[:1], until=DUE + 6_000)) == {"lost_reschedule": 1}


def test_a_rescheduled_version_delivered_before_its_new_due_time_is_early():
    m = message("a", DUE, DUE + 5_000, reschedule_acked_at=DUE - 200)

    assert kinds(history([m], [delivered("a", DUE + 5_000, DUE + 4_000)])) == {"early": 1}


def test_owed_versions_are_those_that_must_arrive_exactly_once():
    plain = message("a", DUE)
    cancelled = message("b", DUE, cancel_acked_at=DUE - 1)
    moved = message("c", DUE, DUE + 5_000, reschedule_acked_at=DUE - 200)

    assert sorted(owed_versions([plain, cancelled, moved])) == [("a", DUE), ("c", DUE + 5_000)]


# -- the buffer's order ---------------------------------------------------------


def test_a_write_acknowledged_first_but_at_the_later_buffer_offset_is_reordered():
    m = message("a", DUE)
    m.versions[0].put = Write(sent_ms=1_000, acked_ms=3_000, partition=2, offset=17)
    m.cancel = Write(sent_ms=1_500, acked_ms=2_000, partition=2, offset=20)
    h = history([m], [])

    anomaly = judge(h).by_kind("reordered")[0]

    assert kinds(h) == {"reordered": 1}
    assert anomaly.rule == ("the cancel (sent at 1500 ms, acknowledged at 2000 ms) is at buffer offset 20 of "
                            "partition 2, after the put (sent at 1000 ms, acknowledged at 3000 ms) at offset 17: "
                            "the cancel was acknowledged first")
    (first, later), = anomaly.evidence["pairs"]
    assert (first["write"], first["acked_ms"], first["buffer_offset"]) == ("put", 3_000, 17)
    assert (later["write"], later["acked_ms"], later["buffer_offset"]) == ("cancel", 2_000, 20)


def test_a_write_sent_first_but_at_the_later_buffer_offset_is_reordered_though_acked_in_buffer_order():
    # A retried put without idempotence: sent first, landed (and acked) after the cancel sent behind it.
    m = message("a", DUE)
    m.versions[0].put = Write(sent_ms=1_000, acked_ms=3_000, partition=2, offset=21)
    m.cancel = Write(sent_ms=1_500, acked_ms=2_000, partition=2, offset=20)

    anomaly = judge(history([m], [])).by_kind("reordered")[0]

    assert anomaly.rule.endswith("after the cancel (sent at 1500 ms, acknowledged at 2000 ms) at offset 20: the put "
                                 "was sent first")


def test_writes_in_the_order_they_were_sent_and_acknowledged_are_not_reordered():
    m = message("a", DUE, DUE + 5_000, cancel_acked_at=DUE - 100, reschedule_acked_at=DUE - 500)

    assert [v.put.offset for v in m.versions] + [m.cancel.offset] == [1, 2, 9]
    assert kinds(history([m], [delivered("a", DUE + 5_000, DUE + 5_001)])) == {"cancel_ignored": 1}
    assert kinds(history([m], [])) == {}


def test_writes_sent_and_acked_in_the_same_millisecond_have_no_order_to_break_and_failed_writes_no_offset():
    same_ms = message("a", DUE)
    same_ms.versions[0].put = Write(sent_ms=900, acked_ms=1_000, partition=0, offset=5)
    same_ms.cancel = Write(sent_ms=900, acked_ms=1_000, partition=0, offset=4)
    failed = message("b", DUE)
    failed.cancel = Write(sent_ms=950, acked_ms=500, error="Local: Message timed out")

    assert kinds(history([same_ms, failed], [], until=0)) == {}


def test_a_reordered_reschedule_names_the_reschedule():
    m = message("a", DUE, DUE + 5_000, reschedule_acked_at=2_000)
    m.versions[1].put.offset = 0  # acknowledged after the put (offset 1), yet before it in the buffer

    anomaly = judge(history([m], [delivered("a", DUE + 5_000, DUE + 5_001)])).by_kind("reordered")[0]

    assert anomaly.rule.startswith("the put (sent at 995 ms, acknowledged at 1000 ms) is at buffer offset 1 of "
                                   "partition 0, after the reschedule 1 (sent at 1995 ms, acknowledged at 2000 ms) "
                                   "at offset 0: the put was sent and acknowledged first")


# A realistic due time: the wire refuses one before 2000 (a scanned put due at DUE would be malformed).
SCAN_DUE = 1_900_000_000_000
ID_A = "0190a3e4-5b6c-7d8e-9f00-112233445566"
ID_B = "0190a3e4-5b6c-7d8e-9f00-aabbccddeeff"


def put(due: int, restores: int | None = None) -> bytes:
    return wire.put_value(due, "target", b"k1", b"soak message 1", restores=restores)


def test_a_put_the_buffer_holds_at_two_offsets_is_found_and_reported_written_twice_not_an_anomaly():
    scan = BufferScan()
    scan.add(3, 10, ID_A.encode(), put(SCAN_DUE), 1_000)
    scan.add(3, 11, ID_A.encode(), None, 0)  # a cancel or a done: no put
    scan.add(3, 12, ID_A.encode(), put(SCAN_DUE + 5_000), 1_050)  # the reschedule: another value
    scan.add(3, 13, ID_A.encode(), put(SCAN_DUE), 1_000)  # the put again: same value and timestamp
    scan.add(3, 14, ID_A.encode(), put(SCAN_DUE, restores=10), 1_000)  # a master's copy: its own write
    scan.add(3, 15, ID_B.encode(), put(SCAN_DUE), 2_000)  # the same value under another id
    scan.add(3, 16, ID_B.encode(), put(SCAN_DUE), 2_001)  # and the same id and value, another timestamp
    scan.add(3, 13, ID_A.encode(), put(SCAN_DUE), 1_000)  # a record read again is not a third copy

    assert [(r.delay_id, r.partition, r.offsets, r.due_ms) for r in scan.repeated] == [(ID_A, 3, (10, 13), SCAN_DUE)]
    assert scan.as_dict() == {"records": 8, "producer_puts": 6, "twice_written": 1, "error": None}
    # A retried put, as a producer without idempotence writes it: its first copy (10) landed but its ack was
    # lost, the reschedule landed behind it (12), the retry after that (13): reported, and acked, last.
    m = Message(ID_A, "target", [Version(SCAN_DUE, Write(990, 1_070, partition=3, offset=13)),
                                 Version(SCAN_DUE + 5_000, Write(1_050, 1_060, partition=3, offset=12))])
    h = History({ID_A: m}, [delivered(ID_A, SCAN_DUE + 5_000, SCAN_DUE + 5_001)], repeated_puts=scan.repeated,
                judged_until_ms=SCAN_DUE + 10_000)

    findings = judge(h)

    assert kinds(h) == {"reordered": 1}  # the retry (13) landed after the reschedule (12)
    assert findings.counts["twice_written"] == 1
    [copied] = findings.written_twice
    assert copied["id"] == ID_A
    assert copied["what"] == (f"the put due {SCAN_DUE} ms (timestamp 1000 ms), produced once, is in the buffer 2 "
                              "times: partition 3, offsets 10, 13")
    assert (copied["buffer_partition"], copied["buffer_offsets"]) == (3, [10, 13])


def test_a_put_the_buffer_holds_twice_and_delivered_once_passes_the_soak():
    scan = BufferScan()
    for offset in (4, 9):
        scan.add(0, offset, ID_A.encode(), put(SCAN_DUE), 1_000)
    m = Message(ID_A, "target", [Version(SCAN_DUE, acked(1_000, offset=4))])
    h = History({ID_A: m}, [delivered(ID_A, SCAN_DUE, SCAN_DUE + 3)], repeated_puts=scan.repeated,
                judged_until_ms=SCAN_DUE + 10_000)

    findings = judge(h)

    assert failures(findings, crashes=0, stall_limit_s=15, comparison=None) == []
    assert findings.counts["twice_written"] == 1 and findings.written_twice[0]["buffer_offsets"] == [4, 9]
    # Each copy delivered, as a node that took the copy for a new write would: a duplicate, which fails.
    again = History({ID_A: m}, [delivered(ID_A, SCAN_DUE, SCAN_DUE + 3), delivered(ID_A, SCAN_DUE, SCAN_DUE + 9)],
                    repeated_puts=scan.repeated, judged_until_ms=SCAN_DUE + 10_000)
    assert failures(judge(again), crashes=0, stall_limit_s=15, comparison=None) == ["1 duplicated"]


def test_a_put_twice_in_the_buffer_under_an_id_the_soak_never_produced_is_not_the_soaks_to_count():
    scan = BufferScan()
    for offset in (1, 2):
        scan.add(0, offset, ID_B.encode(), put(SCAN_DUE), 1_000)

    findings = judge(History({}, [], repeated_puts=scan.repeated))
    assert (findings.counts["twice_written"], findings.written_twice) == (0, [])


def test_a_malformed_record_is_no_put():
    scan = BufferScan()
    for offset in (1, 2):
        scan.add(0, offset, b"not-an-id", put(SCAN_DUE), 1_000)
        scan.add(0, offset + 10, ID_A.encode(), b"no frame", 1_000)

    assert (scan.records, scan.puts, scan.repeated) == (4, 0, [])


def test_a_buffer_not_read_to_its_end_fails_the_soak():
    findings = judge(history([message("a", DUE)], [delivered("a", DUE, DUE + 1)]))

    assert failures(findings, crashes=0, stall_limit_s=15, comparison=None, buffer_error="Local: Timed out") == [
        "the buffer was not read to its end, puts written twice not counted: Local: Timed out"]


# -- lateness and stalls -------------------------------------------------------


def test_lateness_is_split_by_whether_a_fault_window_overlaps_the_wait():
    fault = FaultWindow("kafka_kill", DUE + 100, DUE + 9_000)
    h = history([message("a", DUE), message("b", DUE + 20_000)],
                [delivered("a", DUE, DUE + 8_000), delivered("b", DUE + 20_000, DUE + 20_030)], faults=[fault])

    findings = judge(h)

    assert findings.lateness_in_faults.as_dict() == {"count": 1, "p50": 8_000, "p99": 8_000, "max": 8_000}
    assert findings.lateness_outside_faults.max == 30


def test_the_longest_stall_runs_from_one_second_after_the_due_time_to_the_next_delivery():
    h = history([message("a", DUE), message("b", DUE + 100)],
                [delivered("a", DUE, DUE + 12_000), delivered("b", DUE + 100, DUE + 12_001)])

    stall = longest_stall(h)

    assert stall is not None
    assert (stall.start_ms, stall.end_ms) == (DUE + 1_000, DUE + 12_000)
    assert stall.first_owed_id == "a"


def test_a_stall_continues_past_a_delivery_while_an_older_message_is_still_owed():
    # "a" stays undelivered; an early-bird delivery of "b" at +5 s does not end the stall for good.
    h = history([message("a", DUE), message("b", DUE + 4_000)],
                [delivered("b", DUE + 4_000, DUE + 5_000)], until=DUE + 20_000)

    stall = longest_stall(h)

    assert stall is not None
    assert (stall.start_ms, stall.end_ms) == (DUE + 5_000, DUE + 20_000)
    assert stall.first_owed_id == "a"


def test_a_put_acknowledged_after_its_due_time_is_owed_only_from_its_ack():
    late_put = message("a", DUE, put_acked_at=DUE + 10_000)

    stall = longest_stall(history([late_put], [delivered("a", DUE, DUE + 10_500)]))

    assert stall is None


def test_deliveries_on_time_leave_no_stall_and_cancelled_messages_are_never_owed():
    h = history([message("a", DUE), message("b", DUE, cancel_acked_at=DUE - 10)],
                [delivered("a", DUE, DUE + 50)])

    assert longest_stall(h) is None
    assert judge(h).max_stall_s == 0


def test_a_stall_names_the_fault_windows_it_overlaps():
    fault = FaultWindow("kafka_kill", DUE - 1_000, DUE + 4_000)
    h = history([message("a", DUE)], [delivered("a", DUE, DUE + 30_000)], faults=[fault])

    stall = longest_stall(h)

    assert stall is not None and stall.during_faults == ["kafka_kill"]
    assert stall.seconds == 29.0


def test_time_with_kafka_down_does_not_count_against_the_nodes():
    outage = FaultWindow("kafka_kill", DUE, DUE + 25_000, outage_ms=(DUE + 500, DUE + 18_500))
    h = history([message("a", DUE)], [delivered("a", DUE, DUE + 21_000)], faults=[outage])
    findings = judge(h)

    assert findings.max_stall_s == 20.0
    assert findings.max_stall_beyond_outages_s == 2.5  # owed from +1 s, Kafka back at +18.5 s
    assert failures(findings, crashes=0, stall_limit_s=15, comparison=None) == []


def test_a_stall_well_beyond_the_outage_fails_and_says_how_much_was_outage():
    outage = FaultWindow("kafka_kill", DUE, DUE + 25_000, outage_ms=(DUE + 500, DUE + 10_500))
    findings = judge(history([message("a", DUE)], [delivered("a", DUE, DUE + 41_000)], faults=[outage]))

    assert failures(findings, crashes=0, stall_limit_s=15, comparison=None) == [
        "delivery stalled 40.0s (9.5s of it with Kafka or ZooKeeper down, 30.5s beyond), longer than 15s"]


def test_the_stall_that_counts_is_the_longest_beyond_outages_not_the_longest_overall():
    outage = FaultWindow("kafka_kill", DUE, DUE + 30_000, outage_ms=(DUE, DUE + 30_000))
    h = history([message("a", DUE), message("b", DUE + 100_000)],
                [delivered("a", DUE, DUE + 31_000), delivered("b", DUE + 100_000, DUE + 110_000)], faults=[outage])
    findings = judge(h)

    assert findings.stall is not None and findings.stall.first_owed_id == "a"
    assert findings.stall_beyond_outages is not None and findings.stall_beyond_outages.first_owed_id == "b"
    assert findings.max_stall_beyond_outages_s == 9.0


# -- the verdict and the reconciliation ----------------------------------------


def test_the_verdict_names_each_broken_rule_and_passes_a_clean_run():
    clean = judge(history([message("a", DUE)], [delivered("a", DUE, DUE + 1)]))
    broken = judge(history([message("a", DUE)], [], until=DUE + 100_000))

    assert failures(clean, crashes=0, stall_limit_s=15, comparison=None) == []
    reasons = failures(broken, crashes=1, stall_limit_s=15, comparison=None, missing_fault_kinds=["kafka_kill"])
    assert reasons == ["1 missing", "1 node crash(es) no fault caused", "delivery stalled 99.0s, longer than 15s",
                       "faults never injected: kafka_kill"]


def test_the_reconciliation_agrees_when_it_flags_the_same_ids_even_under_other_kinds():
    m = message("a", DUE, DUE + 5_000, reschedule_acked_at=DUE - 200)
    h = history([m, message("b", DUE)], [delivered("a", DUE, DUE + 2), delivered("a", DUE + 5_000, DUE + 5_010),
                                         delivered("b", DUE, DUE + 3)])
    findings = judge(h)
    report = {"anomalies": {"duplicates": ["a"], "missing": [], "early": ["a"], "unexpected": []},
              "totals": {"duplicates": 1, "missing": 0, "early": 1, "unexpected": 0, "expected": 2}}

    comparison = compare_with_reconcile(findings, report, 1)

    assert comparison.agrees
    assert comparison.totals["duplicated"] == 1 and comparison.totals["cancel_ignored"] is None


def test_ids_flagged_by_one_side_only_are_a_disagreement():
    h = history([message("a", DUE), message("b", DUE)], [delivered("b", DUE, DUE + 3)], until=DUE + 60_000)
    findings = judge(h)
    report = {"anomalies": {"duplicates": ["b"], "missing": []}, "totals": {}}

    comparison = compare_with_reconcile(findings, report, 1)

    assert not comparison.agrees
    assert comparison.soak_only == {"a": ["missing"]}
    assert comparison.reconcile_only == {"b": ["duplicates"]}
    assert failures(findings, crashes=0, stall_limit_s=100, comparison=comparison) == [
        "1 missing", "the reconciliation disagrees on 2 id(s)"]


def test_the_reconciliations_reordered_ids_are_compared_id_by_id_and_its_written_twice_count_shown():
    reordered = message("a", DUE)
    reordered.cancel = Write(sent_ms=500, acked_ms=900, partition=0, offset=3)  # before the put's ack, after it
    reordered.versions[0].put.acked_ms = 1_000
    scan = BufferScan()
    for offset in (4, 5):
        scan.add(0, offset, ID_A.encode(), put(SCAN_DUE), 1_000)
    twice = Message(ID_A, "target", [Version(SCAN_DUE, acked(1_000, offset=5))])
    h = History({"a": reordered, ID_A: twice}, [delivered(ID_A, SCAN_DUE, SCAN_DUE + 3)], repeated_puts=scan.repeated)
    findings = judge(h)
    report = {"anomalies": {"duplicates": [], "reordered": ["a"]},
              "totals": {"duplicates": 0, "reordered": 1, "twice_written": 1}}

    comparison = compare_with_reconcile(findings, report, 1)

    assert findings.flagged_ids() == {"a": {"reordered"}}
    assert comparison.agrees
    assert (comparison.totals["reordered"], comparison.totals["twice_written"]) == (1, 1)
    assert not compare_with_reconcile(findings, {"anomalies": {"reordered": []}}, 1).agrees


def test_a_reconciliation_that_did_not_run_fails_the_soak():
    h = history([message("a", DUE)], [delivered("a", DUE, DUE + 1)])
    findings = judge(h)

    comparison = compare_with_reconcile(findings, None, 2, "exit code 2: Spark did not start")

    assert failures(findings, crashes=0, stall_limit_s=15, comparison=comparison) == [
        "the reconciliation did not run: exit code 2: Spark did not start"]


# -- repeating messages --------------------------------------------------------


def series(delay_id: str, *dues: int, cancel_acked_at: int | None = None) -> Message:
    """A repeating message: one put, its occurrences due at ``dues``, maybe cancelled."""
    put = acked(1_000, offset=1)
    cancel = acked(cancel_acked_at, offset=9) if cancel_acked_at is not None else None
    return Message(delay_id, "target", [Version(due, put) for due in dues], cancel, series=True)


def test_each_occurrence_of_a_series_must_be_delivered_once_and_a_skipped_one_is_missing():
    dues = (DUE, DUE + 1000, DUE + 2000)
    whole = history([series("s", *dues)], [delivered("s", due, due + 5) for due in dues])
    assert kinds(whole) == {}
    assert (judge(whole).counts["series"], judge(whole).counts["rescheduled"]) == (1, 0)
    skipped = history([series("s", *dues)], [delivered("s", due, due + 5) for due in (dues[0], dues[2])])
    assert kinds(skipped) == {"missing": 1}
    repeated = history([series("s", *dues)], [delivered("s", due, due + 5) for due in (*dues, dues[1])])
    assert kinds(repeated) == {"duplicated": 1}


def test_a_series_cancel_ends_the_occurrences_due_after_it_and_races_the_one_due_before():
    dues = (DUE, DUE + 1000, DUE + 2000)
    cancelled = series("s", *dues, cancel_acked_at=DUE + 500)
    assert [cancelled.fate(i) for i in range(3)] == [Fate.MAY, Fate.MUST_NOT, Fate.MUST_NOT]
    assert kinds(history([cancelled], [delivered("s", DUE, DUE + 5)])) == {}
    assert kinds(history([cancelled], [delivered("s", DUE, DUE + 5), delivered("s", DUE + 1000, DUE + 1003)])) == {
        "cancel_ignored": 1}
