"""The soak's judge on hand-made histories: each rule of the product's promise, with no server."""

from __future__ import annotations

from delayq.bench.soak_check import (
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
    return {k: counts[k] for k in ("duplicated", "missing", "early", "cancel_ignored", "unexpected") if counts[k]}


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
    assert kinds(history([m], [], until=DUE + 6_000)) == {"missing": 1}


def test_a_reschedule_that_lost_to_the_old_version_is_cancel_ignored():
    m = message("a", DUE, DUE + 5_000, reschedule_acked_at=DUE - 200)
    h = history([m], [delivered("a", DUE, DUE + 2), delivered("a", DUE + 5_000, DUE + 5_010)])

    assert kinds(h) == {"cancel_ignored": 1}
    assert "a reschedule acknowledged" in judge(h).by_kind("cancel_ignored")[0].rule


def test_a_reschedule_acked_after_the_old_due_time_may_follow_a_delivery_of_the_old_version():
    m = message("a", DUE, DUE + 5_000, reschedule_acked_at=DUE + 300)
    both = [delivered("a", DUE, DUE + 2), delivered("a", DUE + 5_000, DUE + 5_010)]

    assert [m.fate(0), m.fate(1)] == [Fate.MAY, Fate.MUST]
    assert kinds(history([m], both)) == {}
    assert kinds(history([m], both[1:])) == {}
    assert kinds(history([m], both[:1], until=DUE + 6_000)) == {"missing": 1}


def test_a_rescheduled_version_delivered_before_its_new_due_time_is_early():
    m = message("a", DUE, DUE + 5_000, reschedule_acked_at=DUE - 200)

    assert kinds(history([m], [delivered("a", DUE + 5_000, DUE + 4_000)])) == {"early": 1}


def test_owed_versions_are_those_that_must_arrive_exactly_once():
    plain = message("a", DUE)
    cancelled = message("b", DUE, cancel_acked_at=DUE - 1)
    moved = message("c", DUE, DUE + 5_000, reschedule_acked_at=DUE - 200)

    assert sorted(owed_versions([plain, cancelled, moved])) == [("a", DUE), ("c", DUE + 5_000)]


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
