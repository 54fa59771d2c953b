"""The bench's bookkeeping without a broker: options, figures, merging results, the markdown table, members."""

from __future__ import annotations

import pytest

from delayq.bench.redis_peer import RedisUnavailable, decode_member, encode_member, redis_server_binary
from delayq.bench.report import BEGIN, END, Figure, number, write_markdown
from delayq.bench.runner import BenchOptions, merge_results

ENV = {"machine": {"cores": 2, "memory_gib": 8.0, "cpu": "Test CPU", "os": "Test OS", "kernel": "6.1",
                   "load_average_at_start": 0.5},
       "versions": {"Python": "3.11.7", "delayq": "0.1.0", "Kafka": "4.3.1"}}


def figure(suite: str, key: str, values, peer=None) -> Figure:
    made = Figure(key, f"{key} label", "ms", "lower", values, peer=peer)
    made.suite = suite
    return made


def test_options_refuse_unknown_suites_and_runs_below_one():
    with pytest.raises(ValueError, match="only: unknown suite 'nope'"):
        BenchOptions(only=["ingest", "nope"])
    with pytest.raises(ValueError, match="runs must be a whole number of at least 1, not 0"):
        BenchOptions(runs=0)
    with pytest.raises(ValueError, match="capacity_runs"):
        BenchOptions(capacity_runs=-1)
    assert BenchOptions(only=["reconcile", "ingest"]).suites() == ["ingest", "reconcile"]


def test_quick_runs_write_apart_from_the_committed_results():
    quick, full = BenchOptions(quick=True), BenchOptions()
    assert quick.results_path != full.results_path and quick.markdown_path != full.markdown_path
    assert full.results_path.name == "results.json" and full.markdown_path.name == "BENCHMARKS.md"
    assert quick.sizes.capacity < full.sizes.capacity == 10_000_000


def test_figure_is_the_median_of_its_runs_with_min_max_and_ratio_to_the_peer():
    made = figure("lateness", "p99", [30, 10, 20], peer=[5, 4, 6])
    data = made.to_json(date="2026-01-01T00:00:00", quick=False)
    assert (data["median"], data["min"], data["max"], data["runs"]) == (20, 10, 30, 3)
    assert data["peer"]["median"] == 5 and data["ratio"] == 4.0
    with pytest.raises(ValueError, match="better must be"):
        Figure("x", "x", "ms", "faster", [1])
    with pytest.raises(ValueError, match="give values"):
        Figure("x", "x", "ms", "lower")


def test_merge_replaces_the_suites_measured_and_keeps_the_others():
    old = merge_results({}, [figure("ingest", "ingest", [1]), figure("lateness", "lateness.a", [2]),
                             figure("lateness", "lateness.gone", [3])], ENV, BenchOptions(), "2026-01-01")
    new = merge_results(old, [figure("lateness", "lateness.a", [9])], ENV, BenchOptions(), "2026-01-02")
    assert list(new["figures"]) == ["ingest", "lateness.a"]
    assert new["figures"]["ingest"]["median"] == 1 and new["figures"]["ingest"]["measured_at"] == "2026-01-01"
    assert new["figures"]["lateness.a"]["median"] == 9


def test_table_goes_between_the_markers_and_the_hand_written_text_stays(tmp_path):
    path = tmp_path / "BENCHMARKS.md"
    path.write_text(f"# intro\n\n{BEGIN}\nstale\n{END}\n\n## reproduce\n`delayq bench`\n")
    results = merge_results({}, [figure("expiry", "expiry", [1500, 1200], peer=[600, 500])], ENV,
                            BenchOptions(), "2026-01-01T10:00:00")

    write_markdown(path, results)
    write_markdown(path, results)  # idempotent: one table, not two

    text = path.read_text()
    assert text.startswith("# intro\n\n") and text.endswith("## reproduce\n`delayq bench`\n")
    assert text.count(BEGIN) == 1 and "stale" not in text
    assert "| expiry label | 1,350 ms | 1,200–1,500 | 2 | 550 ms (500–600) | 2.45 | lower |" in text
    assert "2 cores (Test CPU), 8.0 GiB RAM" in text and "Versions: delayq 0.1.0, Kafka 4.3.1, Python 3.11.7." in text


def test_table_is_appended_to_a_file_without_markers(tmp_path):
    path = tmp_path / "B.md"
    path.write_text("# only prose\n")
    write_markdown(path, merge_results({}, [figure("ingest", "ingest", [1])], ENV, BenchOptions(), "2026-01-01"))
    assert path.read_text().startswith("# only prose\n\n" + BEGIN)


def test_numbers_keep_three_significant_digits_or_whole_units():
    values = (35012.4, 435.4, 12.44, 3.074, 2.0, 11.0)
    assert [number(v) for v in values] == ["35,012", "435", "12.4", "3.07", "2", "11"]


def test_member_round_trips_id_topic_key_and_value():
    member = encode_member(b"0123456789abcdef", "orders-timeouts", b"\x00key|", b"\x00" * 200)
    assert decode_member(member) == (b"0123456789abcdef", "orders-timeouts", b"\x00key|", b"\x00" * 200)
    assert decode_member(encode_member(b"x" * 16, "t", b"", b"")) == (b"x" * 16, "t", b"", b"")


def test_missing_redis_server_without_install_says_so(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RedisUnavailable, match="redis-server is not on PATH"):
        redis_server_binary(install=False)


# -- the delivery figure: timed from the target's broker timestamps -------------------------------------------


def test_delivery_rate_runs_from_the_first_to_the_last_append_time():
    from delayq.bench.service_bench import delivery_rate

    appended = [1_000_000 + i // 10 for i in range(10_001)]  # 10,001 records over 1,000 ms
    assert delivery_rate(appended, 10_001, started_ms=999_990) == 10_000.0


@pytest.mark.parametrize("appended,count,started,why", [
    ([5, 6, 7], 4, 0, "read 3 delivered records, expected 4"),
    ([5, 6, 7], 3, 6, "appended 1 ms before the node started"),
    ([7, 7, 7], 3, 0, "within one millisecond"),
])
def test_a_delivery_run_whose_records_do_not_add_up_is_refused(appended, count, started, why):
    from delayq.bench.service_bench import BenchRunInvalid, delivery_rate

    with pytest.raises(BenchRunInvalid, match=why):
        delivery_rate(appended, count, started_ms=started)


def test_a_run_of_some_suites_on_another_host_keeps_the_peers_versions_and_the_header_names_each_cpu(tmp_path):
    with_peer = {**ENV, "versions": {**ENV["versions"], "Redis": "7.0.15"}}
    old = merge_results({}, [figure("expiry", "expiry", [1], peer=[2]), figure("rebuild", "rebuild", [3])],
                        with_peer, BenchOptions(), "2026-01-01")
    elsewhere = {**ENV, "machine": {**ENV["machine"], "cpu": "Other CPU"}}
    new = merge_results(old, [figure("rebuild", "rebuild", [4])], elsewhere, BenchOptions(), "2026-01-02")

    assert new["versions"]["Redis"] == "7.0.15"  # the expiry figure's peer still stands in the table
    assert (new["figures"]["expiry"]["cpu"], new["figures"]["rebuild"]["cpu"]) == ("Test CPU", "Other CPU")
    path = tmp_path / "BENCHMARKS.md"
    write_markdown(path, new)
    text = path.read_text()
    assert "(Test CPU: expiry; Other CPU: rebuild)" in text and "Redis 7.0.15" in text
    write_markdown(path, merge_results(new, [figure("expiry", "expiry", [1], peer=[2])], elsewhere, BenchOptions(),
                                       "2026-01-03"))
    assert "cores (Other CPU)," in path.read_text()  # every figure of one CPU again: named once
