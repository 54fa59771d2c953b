"""The chart's Grafana dashboard (helm/delayq/files/grafana-dashboard.json) against a real node's /metrics.

Every panel must query series a node serves, grouped and labelled by labels those series carry: a renamed metric,
a Counter queried without ``_total`` or a histogram without ``_bucket`` would be an empty panel in Grafana.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from support.kafka_testing import create_topics, read_topic
from support.process_testing import wait_until

import delayq
from delayq.spark.follow import FollowMetrics

pytestmark = pytest.mark.integration

DASHBOARD = Path(__file__).resolve().parents[2] / "helm" / "delayq" / "files" / "grafana-dashboard.json"
# Labels Prometheus adds when it scrapes a node through the chart's ServiceMonitor (the node itself sets none of
# them), and the dashboard's variables select by.
SCRAPE_LABELS = {"namespace", "job", "pod", "instance", "service", "endpoint", "container"}


def dashboard_queries() -> list[tuple[str, str, str]]:
    """(panel title, PromQL expression, legend format) of every query of every panel."""
    dashboard = json.loads(DASHBOARD.read_text())
    return [(panel["title"], target["expr"], target.get("legendFormat", ""))
            for panel in dashboard["panels"] for target in panel.get("targets", [])]


def metric_names(expr: str) -> set[str]:
    """The delayq series an expression reads (PromQL identifiers starting with ``delayq_``)."""
    return set(re.findall(r"\bdelayq_[a-zA-Z0-9_]+", expr))


def labels_used(expr: str, legend: str) -> set[str]:
    """Labels an expression groups by (``by``/``without``), selects on, or its legend shows (``{{label}}``)."""
    labels = {label.strip() for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr)
              for label in group.split(",") if label.strip()}
    labels |= {label for selector in re.findall(r"\{([^}]*)\}", expr)
               for label in re.findall(r"([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)", selector)}
    labels |= set(re.findall(r"\{\{\s*([a-zA-Z_]\w*)\s*\}\}", legend))
    return labels


def served_series(exposition: str) -> dict[str, set[str]]:
    """Sample name -> the label names its samples carry, as Prometheus would ingest them from ``exposition``."""
    served: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            served.setdefault(sample.name, set()).update(sample.labels)
    return served


def test_the_query_parsers_find_metrics_and_labels():
    expr = ('histogram_quantile(0.99, sum by (le) (rate(delayq_delivery_lateness_seconds_bucket'
            '{namespace="$namespace", pod=~"$pod"}[5m]))) + sum without (shard, reason) (delayq_dead_lettered_total)')

    assert metric_names(expr) == {"delayq_delivery_lateness_seconds_bucket", "delayq_dead_lettered_total"}
    assert labels_used(expr, "{{pod}} {{ op }}") == {"le", "namespace", "pod", "shard", "reason", "op"}
    assert served_series('# TYPE delayq_x counter\ndelayq_x_total{shard="0"} 1.0\n') == {"delayq_x_total": {"shard"}}


@pytest.mark.settings(buffer_partitions=2, delete_retention_ms=2000)
def test_every_metric_and_label_the_dashboard_queries_is_served_by_a_node_or_the_reconciliation(cluster, settings, names):
    target = names.topic("target")
    create_topics(settings.bootstrap_servers, [target])
    producer = delayq.Producer({"bootstrap.servers": settings.bootstrap_servers, "delayq.cluster": settings.cluster,
                                "linger.ms": 1})
    node = cluster.start("node-a")
    producer.produce(target, b"later", delay=600)
    producer.flush(10)
    assert wait_until(lambda: node.metric("delayq_pending") == 1, timeout_s=20)
    # Back after longer than the buffer's delete.retention.ms, the node rebuilds its store (a labelled series of
    # delayq_store_rebuilds_total); the counters start again at 0 with the new process.
    assert node.stop() == 0
    time.sleep(2.5)
    node = cluster.start("node-a")
    assert node.metric("delayq_store_rebuilds_total", reason="stale") == 1
    for i in range(5):
        producer.produce(target, f"m{i}".encode(), delay=1 + i / 10)
    # A delayed message to a topic that does not exist is dead-lettered (reason missing-topic) when it falls due.
    producer.produce(names.topic("does-not-exist"), b"nowhere", delay=0.5)
    producer.flush(10)
    assert len(read_topic(settings.bootstrap_servers, target, expect=5, timeout_s=30)) == 5
    assert wait_until(lambda: node.metric("delayq_dead_lettered_total", reason="missing-topic") >= 1 and
                      node.metric("delayq_delivered_total") >= 5, timeout_s=30)

    status, body = node.get("/metrics")
    assert status == 200
    served = served_series(body.decode())
    # The continuous reconciliation's own series (delayq reconcile --follow), as its metrics endpoint serves them.
    follower = FollowMetrics(0, "127.0.0.1")  # port 0: the registry alone, no server
    for name, labels in served_series(generate_latest(follower.registry).decode()).items():
        served.setdefault(name, set()).update(labels)
    queries = dashboard_queries()

    assert len(queries) >= 10
    missing, unlabelled = [], []
    for title, expr, legend in queries:
        names_in_expr = metric_names(expr)
        assert names_in_expr, f"panel {title!r} queries no delayq series: {expr}"
        missing += [f"{title}: {name}" for name in sorted(names_in_expr - served.keys())]
        carried = set().union(*(served.get(name, set()) for name in names_in_expr))
        unlabelled += [f"{title}: {label}" for label in sorted(labels_used(expr, legend) - SCRAPE_LABELS - carried)]
    assert not missing, f"panels query series no node and no reconciliation serves: {missing}"
    assert not unlabelled, f"panels use labels the node's series do not carry: {unlabelled}"
    # What the panels show is there, with the labels they split it by.
    assert {"le"} <= served["delayq_delivery_lateness_seconds_bucket"]
    assert {"reason", "shard"} <= served["delayq_dead_lettered_total"]
    assert {"reason", "shard"} <= served["delayq_store_rebuilds_total"]
