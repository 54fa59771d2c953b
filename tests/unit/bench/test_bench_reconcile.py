"""The reconcile suite's logic without Kafka or Spark: its size, the masters it times, their figures (issue 33)."""

from __future__ import annotations

from contextlib import ExitStack
from types import SimpleNamespace

import pytest
from rich.progress import Progress

from delayq.bench import reconcile_bench
from delayq.bench.reconcile_bench import (
    LOCAL_MASTER,
    MESSAGES_ENV,
    figure_key,
    masters_to_time,
    messages_from,
    parse_messages,
    target_s,
)
from delayq.bench.runner import BenchOptions, Context, reconcile_figure, suite_reconcile

STANDALONE = "spark://127.0.0.1:7077"


@pytest.mark.parametrize(("text", "count"), [
    ("10000000", 10_000_000), ("10_000_000", 10_000_000), ("10,000,000", 10_000_000), ("10M", 10_000_000),
    ("10m", 10_000_000), (" 2.5M ", 2_500_000), ("20k", 20_000), ("1", 1),
])
def test_a_count_is_read_as_written_by_hand(text, count):
    assert parse_messages(text) == count


@pytest.mark.parametrize("text", ["", "ten", "10G", "-5", "0", "0.5", "1.0001k", "10 M"])
def test_what_is_no_count_is_refused(text):
    with pytest.raises(ValueError, match="message"):
        parse_messages(text)


def test_the_size_is_the_suites_unless_the_variable_says():
    assert messages_from({}, 1_000_000) == 1_000_000
    assert messages_from({MESSAGES_ENV: "  "}, 20_000) == 20_000
    assert messages_from({MESSAGES_ENV: "10M"}, 1_000_000) == 10_000_000
    with pytest.raises(ValueError, match=f"^{MESSAGES_ENV}: not a message count: 'lots'"):
        messages_from({MESSAGES_ENV: "lots"}, 1_000_000)


def test_the_size_variable_is_not_one_delayq_would_refuse():
    # The timed `delayq reconcile` inherits the environment; delayq refuses a DELAYQ_ variable that is no setting.
    assert not MESSAGES_ENV.startswith("DELAYQ_")


def test_a_standalone_master_is_timed_after_local_2():
    assert masters_to_time(None) == masters_to_time("") == masters_to_time(" ") == [LOCAL_MASTER]
    assert masters_to_time("local[*]") == [LOCAL_MASTER]  # DELAYQ_SPARK_MASTER naming a local master: once only
    assert masters_to_time(f" {STANDALONE} ") == [LOCAL_MASTER, STANDALONE]
    with pytest.raises(ValueError, match="spark://HOST:PORT"):
        masters_to_time("yarn")


def test_figures_are_named_by_where_they_ran_and_10m_has_issue_33s_target():
    assert figure_key(LOCAL_MASTER) == "reconcile"
    assert figure_key(STANDALONE) == "reconcile_standalone"
    assert target_s(10_000_000) == 300 and target_s(1_000_000) == reconcile_bench.TARGET_S
    assert reconcile_bench.expected_counts(10_000_000) == (20_000_080, 10_000_040)


def run(elapsed: float, load: float = 1.0) -> dict:
    return {"elapsed_s": elapsed, "timings_s": {"spark_start": 5.0, "buffer": elapsed - 5.0},
            "load_before": [load, load, load], "load_after": [load + 1, load, load]}


def test_a_figure_keeps_each_runs_steps_and_load():
    figure = reconcile_figure(10_000_000, STANDALONE, [run(200.0, 1.5), run(190.0), run(230.0)])
    assert figure.key == "reconcile_standalone" and figure.unit == "s" and figure.better == "lower"
    assert figure.stats == {"median": 200.0, "min": 190.0, "max": 230.0, "runs": 3}
    assert "10,000,000 messages (20,000,080 buffer records, 10,000,040 deliveries)" in figure.label
    assert "standalone" in figure.label and STANDALONE not in figure.label  # a stable label: ports change
    assert figure.details["master"] == STANDALONE and figure.details["target_s"] == 300
    assert figure.details["timings_s"][0] == {"spark_start": 5.0, "buffer": 195.0}
    assert figure.details["load_before"][0] == [1.5, 1.5, 1.5]
    assert reconcile_figure(1_000_000, LOCAL_MASTER, [run(50.0)]).label.endswith("on local[2]")


def test_the_suite_alternates_the_masters_on_one_data_set(monkeypatch):
    written, timed = [], []
    monkeypatch.setenv(MESSAGES_ENV, "10M")
    monkeypatch.setenv(reconcile_bench.SPARK_MASTER_ENV, STANDALONE)

    def ensure_data(bootstrap, messages, progress):
        progress(5, 10)
        written.append((bootstrap, messages))

    def measured_run(bootstrap, messages, master, out):
        timed.append((master, messages))
        return run(100.0 if master == LOCAL_MASTER else 150.0)

    monkeypatch.setattr(reconcile_bench, "ensure_data", ensure_data)
    monkeypatch.setattr(reconcile_bench, "measured_run", measured_run)
    with ExitStack() as exits:
        ctx = Context(SimpleNamespace(bootstrap_servers="127.0.0.1:1"), BenchOptions(runs=2), Progress(disable=True),
                      exits)
        figures = suite_reconcile(ctx)
    assert written == [("127.0.0.1:1", 10_000_000)]
    assert timed == [(LOCAL_MASTER, 10_000_000), (STANDALONE, 10_000_000)] * 2
    assert [(f.key, f.stats["median"], f.stats["runs"]) for f in figures] == [
        ("reconcile", 100.0, 2), ("reconcile_standalone", 150.0, 2)]


def test_without_a_standalone_master_the_suite_times_local_2_at_its_size(monkeypatch):
    monkeypatch.delenv(MESSAGES_ENV, raising=False)
    monkeypatch.delenv(reconcile_bench.SPARK_MASTER_ENV, raising=False)
    timed = []
    monkeypatch.setattr(reconcile_bench, "ensure_data", lambda bootstrap, messages, progress: None)
    monkeypatch.setattr(reconcile_bench, "measured_run",
                        lambda bootstrap, messages, master, out: timed.append((master, messages)) or run(50.0))
    with ExitStack() as exits:
        ctx = Context(SimpleNamespace(bootstrap_servers="b"), BenchOptions(runs=1, quick=True), Progress(disable=True),
                      exits)
        figures = suite_reconcile(ctx)
    assert timed == [(LOCAL_MASTER, 20_000)]
    assert [f.key for f in figures] == ["reconcile"]


def test_tree_cpu_counts_the_children_of_the_process_too():
    import subprocess
    import sys

    burn = "import time\nwhile time.process_time() < 0.4: pass\ntime.sleep(0.3)"
    parent = (f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {burn!r}], check=True)\n{burn}")
    with subprocess.Popen([sys.executable, "-c", parent]) as child, reconcile_bench.TreeCpu(child.pid, 0.05) as cpu:
        assert child.wait(60) == 0
    assert 0.7 < cpu.seconds < 3.0  # both burned 0.4 s (and started Python)
