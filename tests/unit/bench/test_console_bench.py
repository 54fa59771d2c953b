"""The console bench's pure parts: what it writes, how it reads pages, how it times them, its figures and table."""

from __future__ import annotations

import pytest

from delayq import wire
from delayq.bench import console_bench
from delayq.bench.console_bench import (
    Answer,
    PageAsk,
    deep_cursor,
    fill_plan,
    index_lag_in,
    malformed_record,
    next_page_href,
    node_console_from,
    row_ids,
    sizes_from,
    spread_due,
    time_pages,
)
from delayq.bench.report import console_rows, console_table, render_markdown
from delayq.bench.runner import SUITES, BenchOptions
from delayq.delay_service.console.cluster import decode_cursor

ID_A = "0190a3e4-5b6c-7d8e-9f00-112233445566"
ID_B = "0190a3e4-5b6c-7d8e-9f00-112233445567"


def test_the_fill_splits_every_message_over_four_topics_one_of_them_rare():
    plan = fill_plan(10_000_000)
    assert [(fill.name, fill.count) for fill in plan] == [
        ("orders", 6_000_000), ("emails", 3_000_000), ("reports", 999_900), (console_bench.RARE_TOPIC, 100)]
    assert sum(fill.count for fill in fill_plan(20_003)) == 20_003
    assert fill_plan(5)[-1].count == 1, "the rare topic has a message however few there are"
    with pytest.raises(ValueError, match="at least 4 pending messages"):
        fill_plan(3)


def test_due_times_spread_evenly_over_the_span_from_the_start():
    due = spread_due(1_000, 4, span_ms=400)
    assert [due(i) for i in range(4)] == [1_000, 1_100, 1_200, 1_300]


def test_planted_records_are_malformed_as_the_node_reads_them_one_in_a_hundred_with_the_rare_code():
    partitions = 6
    codes = []
    for i in range(200):
        record = malformed_record(i, partitions)
        with pytest.raises(wire.MalformedRecord) as found:
            wire.parse_buffer_record(record.key, record.value, record.headers, partition=record.partition,
                                     partitions=partitions)
        assert found.value.code == record.code
        codes.append(record.code)
    assert codes.count(wire.Reason.BAD_FRAME) == 2
    assert codes.count(wire.Reason.WRONG_PARTITION) == 198


def test_sizes_come_from_the_environment_as_counts_or_default():
    assert sizes_from({}, 10_000_000, 100_000) == (10_000_000, 100_000)
    assert sizes_from({"BENCH_CONSOLE_PENDING": "200k", "BENCH_CONSOLE_DEAD_LETTERS": "1,000"}, 1, 1) == (
        200_000, 1_000)
    with pytest.raises(ValueError, match="BENCH_CONSOLE_DEAD_LETTERS: not a message count"):
        sizes_from({"BENCH_CONSOLE_DEAD_LETTERS": "lots"}, 1, 1)
    assert node_console_from({"BENCH_CONSOLE_NODE": "1"}) and node_console_from({"BENCH_CONSOLE_NODE": "True"})
    assert not node_console_from({}) and not node_console_from({"BENCH_CONSOLE_NODE": "0"})


def test_healthz_says_whether_the_index_starts_is_behind_or_caught_up():
    assert index_lag_in("ok (the index is starting)\n") is None
    assert index_lag_in("ok (the index is 1,234,567 records behind)\n") == 1_234_567
    assert index_lag_in("ok (the index is 0 records behind)\n") == 0
    with pytest.raises(ValueError, match="neither 'the index is starting'"):
        index_lag_in("ok\n")


def test_a_page_gives_its_next_link_and_its_rows_ids():
    page = (f'<table id="upcoming"><tr data-id="{ID_A}"><td>a</td></tr><tr data-id="{ID_B}"></tr></table>'
            '<p><a href="/console/upcoming">first page</a> '
            '<a id="next-page" href="/console/upcoming?after=abc&amp;topic=x">next page</a></p>')
    assert next_page_href(page) == "/console/upcoming?after=abc&topic=x"
    assert next_page_href('<a href="/console/upcoming">first page</a>') is None
    assert row_ids(page) == [ID_A, ID_B]


def test_a_walk_keeps_where_it_ended_and_its_times_summed_up():
    walk = console_bench.Walk("http://x/console/dead-letters?after=ab", 3, [5.0, 7.0, 100.0, 6.0])
    assert walk.summary() == {"url": "http://x/console/dead-letters?after=ab", "pages": 3, "median_ms": 6.5,
                              "p95_ms": 100.0, "max_ms": 100.0}


def test_a_deep_cursor_starts_every_shard_at_the_first_message_due_at_that_time():
    assert decode_cursor(deep_cursor(2, 1_700_000_000_000)) == {
        0: f"1700000000000:{console_bench.NIL_ID}", 1: f"1700000000000:{console_bench.NIL_ID}"}
    wire.check_delay_id(console_bench.NIL_ID)  # a node takes it in a cursor


def test_pages_are_timed_round_robin_after_the_warm_ups_and_pass_on_p95_answers_and_their_table():
    asked = []
    slow_every = iter(range(10_000))

    def get(url: str) -> Answer:
        asked.append(url)
        if url == "/b":
            return Answer(200, 500.0 if next(slow_every) % 10 == 0 else 20.0, b'<table id="b"><tr data-id="x">')
        return Answer(503 if len(asked) == 7 else 200, 10.0 if len(asked) > 2 else 99.0, b'<table id="a">')

    a, b = time_pages([PageAsk("k.a", "a", "/a", 'id="a"'), PageAsk("k.b", "b", "/b", 'id="b"')], warmups=2,
                      rounds=10, get=get)
    assert asked[:4] == ["/a", "/b", "/a", "/b"]
    assert len(a.times_ms) == len(b.times_ms) == 10 and a.first_ms == 99.0
    assert a.statuses == {200: 9, 503: 1} and not a.passed, "an answer other than 200 fails the page"
    assert b.statuses == {200: 10} and b.rows == 1 and b.p95_ms == 500.0 and not b.passed
    fast = time_pages([PageAsk("k.c", "c", "/c", "table")], warmups=1, rounds=20,
                      get=lambda url: Answer(200, 299.0, b"<table>"))[0]
    assert fast.passed
    missing = time_pages([PageAsk("k.c", "c", "/c", 'id="c"')], warmups=0, rounds=3,
                         get=lambda url: Answer(200, 1.0, b"an error page"))[0]
    assert not missing.marked and not missing.passed


def run_result(passed: bool = True) -> dict:
    page = {"key": "console.standalone.overview", "label": "`delayq console`: overview", "url": "http://x/console/",
            "mark": "m", "times_ms": [10.0, 20.0, 400.0], "first_ms": 50.0, "statuses": {200: 3}, "bytes": 100,
            "rows": 5, "marked": True, "p95_ms": 400.0, "passed": passed}
    return {"pending_planned": 200_000, "pending": 199_990.0, "dead_letters": 1_000, "series": 500,
            "topics": {"orders": 120_000, "audit": 2}, "fill_s": 30.0, "histogram_first_count_s": 0.5,
            "machine": {"cores": 2, "cpu": "Test CPU"}, "dead_letter_s": 20.0, "timing_s": 5.0, "cpu_s_while_timed": {"console": 2.0, "node": 1.0},
            "index": {"records": 300_000, "seconds": 10.0, "records_per_s": 30_000},
            "load_average": {"before": [2.5, 2.0, 1.0], "after": [3.0, 2.0, 1.0]}, "node_console": False,
            "dead_letter_walks": {}, "pages": [page]}


def test_figures_are_one_a_page_and_the_index_build_and_the_table_reads_them(tmp_path):
    made = console_bench.figures(run_result(passed=False))
    assert [f.key for f in made] == ["console.standalone.overview", "console.index_build"]
    page, build = made
    assert (page.stats["median"], page.stats["max"], page.details["p95_ms"], page.unit) == (20.0, 400.0, 400.0, "ms")
    assert build.stats["median"] == 30_000 and build.unit == "records/s"
    figures = {}
    for figure in made:
        figure.suite = "console"
        figures[figure.key] = figure.to_json(date="2026-12-01", quick=False)
    assert console_rows(figures) == [{"page": "`delayq console`: overview", "median": "20 ms", "p95": "400 ms",
                                      "max": "400 ms", "target": "300 ms", "requests": "3", "verdict": "**no**"}]
    table = console_table(figures)
    assert "on 2 cores (Test CPU)" in table[1] and "199,990 pending" in table[1] and "30,000 records/s" in table[1] and "Load average 2.5" in table[1]
    assert table[-1] == "| `delayq console`: overview | 20 ms | 400 ms | 400 ms | 300 ms | **no** |"
    results = {"machine": {"cores": 2, "memory_gib": 8.0, "cpu": "c", "os": "o", "kernel": "k",
                           "load_average_at_start": 1.0}, "versions": {"delayq": "0"}, "figures": figures}
    assert table[-1] in render_markdown(results)
    assert console_table({}) == []


def test_the_console_suite_runs_only_when_named():
    assert "console" in SUITES
    assert "console" not in BenchOptions().suites()
    assert BenchOptions(only=["console"]).suites() == ["console"]
