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
