"""`delayq bench` end to end on one tiny suite: results.json and the BENCHMARKS.md table."""

from __future__ import annotations

import json

import pytest

from delayq.bench.report import BEGIN, END
from delayq.bench.runner import BenchOptions, run_bench
from delayq.dev import KAFKA_VERSION

pytestmark = pytest.mark.integration


def test_quick_delivery_suite_writes_results_and_table_beside_the_peer(dev_stack, tmp_path):
    results, markdown = tmp_path / "results.json", tmp_path / "BENCHMARKS.md"
    markdown.write_text(f"# Benchmarks\n\nWritten by hand.\n\n{BEGIN}\nold table\n{END}\n\n## How to reproduce\n")

    code = run_bench(BenchOptions(only=["delivery"], runs=1, quick=True, results=results, markdown=markdown),
                     stack=dev_stack)

    assert code == 0
    data = json.loads(results.read_text())
    figure = data["figures"]["delivery"]
    assert figure["unit"] == "msg/s" and figure["runs"] == 1 and figure["quick"] is True
    assert figure["median"] > 0 and figure["peer"]["median"] > 0
    assert figure["ratio"] == pytest.approx(figure["median"] / figure["peer"]["median"])
    assert data["machine"]["cores"] >= 1 and data["versions"]["Kafka"] == KAFKA_VERSION
    assert data["versions"]["Redis"].startswith("7.")
    text = markdown.read_text()
    assert text.startswith("# Benchmarks\n\nWritten by hand.") and text.endswith("## How to reproduce\n")
    assert "old table" not in text
    assert "| figure | delayq | spread | runs | Redis peer (spread) | delayq / Redis | better |" in text
    assert "| delivery of 10,000 due messages to Kafka (master / poller) (quick) |" in text


def test_quick_produce_suite_times_delayed_against_plain_produce(dev_stack, tmp_path):
    results, markdown = tmp_path / "results.json", tmp_path / "BENCHMARKS.md"

    code = run_bench(BenchOptions(only=["produce"], runs=1, quick=True, results=results, markdown=markdown),
                     stack=dev_stack)

    assert code == 0
    figures = json.loads(results.read_text())["figures"]
    plain, delayed, ratio = figures["produce.plain"], figures["produce.delayed"], figures["produce.ratio"]
    assert plain["unit"] == delayed["unit"] == "µs" and plain["runs"] == delayed["runs"] == 5
    # The envelope, the id and the checks cost something: a delayed call is never cheaper than a plain one.
    assert 0 < plain["median"] < delayed["median"]
    assert ratio["min"] <= ratio["median"] <= ratio["max"] and ratio["median"] > 1
    assert ratio["details"]["background_cores"] >= 0
