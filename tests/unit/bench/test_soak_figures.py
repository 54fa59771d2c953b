"""The soak's figures per fault kind, and faults with several outages (a rolling restart's), on hand-made histories."""

from __future__ import annotations

from delayq.bench.soak_check import Delivery, FaultWindow, History, Message, Version, Write, judge, longest_stall

DUE = 100_000


def message(delay_id: str, due: int) -> Message:
    return Message(delay_id, "target", [Version(due, Write(sent_ms=1_000, acked_ms=1_005, partition=0, offset=1))])


def delivered(delay_id: str, due: int, at: int) -> Delivery:
    return Delivery(delay_id, due, at, "target", 0, 0, epoch=1)


def history(messages: list[Message], deliveries: list[Delivery], faults: list[FaultWindow]) -> History:
    return History({m.delay_id: m for m in messages}, deliveries, faults, judged_until_ms=10_000_000,
                   ended_ms=10_000_000)


def test_every_outage_of_a_fault_is_left_out_of_the_stall_beyond_outages():
    # A rolling restart out twice, 3 s each, inside a 20 s stall (owed from +1 s to +21 s).
    restart = FaultWindow("rolling_restart", DUE, DUE + 30_000, outage_ms=(DUE + 2_000, DUE + 5_000),
                          later_outages_ms=((DUE + 10_000, DUE + 13_000),))
    h = history([message("a", DUE)], [delivered("a", DUE, DUE + 21_000)], [restart])

    assert restart.outages == [(DUE + 2_000, DUE + 5_000), (DUE + 10_000, DUE + 13_000)]
    assert restart.outage_s == 6.0
    stall = longest_stall(h, beyond_outages=True)
    assert stall is not None and stall.seconds == 20.0 and stall.beyond_outages_s == 14.0


def test_overlapping_outages_of_two_faults_count_once():
    one = FaultWindow("broker_kill", DUE, DUE + 10_000, outage_ms=(DUE + 1_000, DUE + 8_000))
    other = FaultWindow("zookeeper_kill", DUE + 5_000, DUE + 12_000, outage_ms=(DUE + 5_000, DUE + 11_000))
    stall = longest_stall(history([message("a", DUE)], [delivered("a", DUE, DUE + 21_000)], [one, other]),
                          beyond_outages=True)

    assert stall is not None and stall.outage_ms == 10_000 and stall.beyond_outages_s == 10.0


def test_each_fault_kind_gets_its_count_windows_outages_lateness_and_stalls():
    kill = FaultWindow("broker_kill", DUE, DUE + 25_000, outage_ms=(DUE, DUE + 9_000))
    move = FaultWindow("leader_move", DUE + 100_000, DUE + 110_000)
    again = FaultWindow("broker_kill", DUE + 200_000, DUE + 215_000, outage_ms=(DUE + 200_000, DUE + 204_000))
    messages = [message("a", DUE), message("b", DUE + 101_000), message("c", DUE + 300_000),
                message("d", DUE + 201_000)]
    deliveries = [delivered("a", DUE, DUE + 12_000), delivered("b", DUE + 101_000, DUE + 101_050),
                  delivered("c", DUE + 300_000, DUE + 300_010), delivered("d", DUE + 201_000, DUE + 201_500)]

    findings = judge(history(messages, deliveries, [kill, move, again]))

    assert list(findings.by_fault_kind) == ["broker_kill", "leader_move"]
    kills = findings.by_fault_kind["broker_kill"]
    assert (kills.faults, kills.seconds, kills.longest_s, kills.outage_s) == (2, 40.0, 25.0, 13.0)
    assert (kills.lateness.count, kills.lateness.max) == (2, 12_000)
    # a's stall: owed from +1 s, delivered at +12 s: 11 s, of which 8 s with the cluster out.
    assert kills.stall is not None and kills.stall.seconds == 11.0
    assert kills.stall_beyond_outages is not None and kills.stall_beyond_outages.beyond_outages_s == 3.0
    moves = findings.by_fault_kind["leader_move"]
    assert (moves.faults, moves.lateness.count, moves.lateness.max, moves.stall) == (1, 1, 50, None)
    assert moves.as_dict()["max_stall_s"] == 0.0 and kills.as_dict()["max_stall_beyond_outages_s"] == 3.0
    # c fell due outside every fault.
    assert findings.lateness_outside_faults.count == 1 and findings.lateness_in_faults.count == 3


def test_a_short_stall_outside_the_outages_can_be_the_longest_beyond_them():
    # A 5 s stall wholly inside an outage (0 s beyond), and a 50 ms one outside any.
    kill = FaultWindow("broker_kill", DUE, DUE + 10_000, outage_ms=(DUE, DUE + 10_000))
    h = history([message("a", DUE), message("b", DUE + 50_000)],
                [delivered("a", DUE, DUE + 6_000), delivered("b", DUE + 50_000, DUE + 51_050)], [kill])

    assert longest_stall(h).seconds == 5.0  # type: ignore[union-attr]
    beyond = longest_stall(h, beyond_outages=True)
    assert beyond is not None and beyond.first_owed_id == "b" and beyond.beyond_outages_s == 0.05
