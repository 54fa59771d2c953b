"""examples/order_timeouts_quix.py, run as its users run it: quixstreams from PyPI (``delayq[quix]``).

quixstreams pins confluent-kafka below 2.13 and pydantic below 2.14, and delayq's own
environment has newer ones (confluent_kafka.aio): the example runs in a virtualenv of
its own, made once with ``pip install -e .[quix]`` (what a user's ``pip install
"delayq[quix]"`` resolves, at constraints-quix.txt's versions) and kept in the delayq cache, keyed by
pyproject.toml and that lock.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Producer
from support.kafka_testing import create_topics, read_topic
from support.service_testing import assert_reconcile_clean, now_ms

from delayq import wire
from delayq.paths import cache_dir

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "order_timeouts_quix.py"


@pytest.fixture(scope="session")
def quix_python() -> str:
    """The python of a virtualenv with ``delayq[quix]`` installed from this clone, at constraints-quix.txt's versions.

    Made once per clone, pyproject and lock: the virtualenv holds an editable install of this clone.
    """
    lock = ROOT / "constraints-quix.txt"
    stamp = hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + lock.read_bytes() + str(ROOT).encode()
                           ).hexdigest()[:16]
    venv = cache_dir() / f"venv-quix-{stamp}"
    python = venv / "bin" / "python"
    done = venv / ".installed"
    if not done.exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        installed = subprocess.run([str(python), "-m", "pip", "install", "-q", "-c", str(lock), "-e", f"{ROOT}[quix]"],
                                   capture_output=True, text=True, timeout=900)
        if installed.returncode != 0:
            pytest.fail(f"pip install -e '.[quix]' failed (exit {installed.returncode}): "
                        f"{installed.stderr.strip()[-1500:]}", pytrace=False)
        done.write_text("ok\n")
    return str(python)


def test_the_quixstreams_example_times_out_unpaid_orders_once_and_paid_ones_never(
        cluster, settings, names, quix_python, tmp_path):
    events, timeouts = names.topic("order-events"), names.topic("order-timeouts")
    create_topics(settings.bootstrap_servers, [events, timeouts], partitions=3)
    cluster.start("node-a")
    since = now_ms()
    orders = [f"o-{i}" for i in range(30)]
    paid = set(orders[::3])  # every third order is paid before its timeout
    producer = Producer({"bootstrap.servers": settings.bootstrap_servers})
    for order in orders:  # keyed by order: an order's events stay in order on one partition
        producer.produce(events, json.dumps({"order": order, "event": "placed"}).encode(), order.encode())
    for order in sorted(paid):
        producer.produce(events, json.dumps({"order": order, "event": "paid"}).encode(), order.encode())
    producer.flush(10)

    env = {**os.environ, "KAFKA": settings.bootstrap_servers, "DELAYQ_CLUSTER": settings.cluster,
           "ORDER_EVENTS": events, "ORDER_TIMEOUTS": timeouts, "ORDER_TIMEOUT_S": "4", "RUN_FOR_S": "12",
           "CONSUMER_GROUP": f"quix-{uuid.uuid4().hex[:8]}"}
    env.pop("DELAYQ_LOOKUP_URLS", None)
    started = time.monotonic()
    run = subprocess.run([quix_python, str(EXAMPLE)], env=env, capture_output=True, text=True, timeout=120)
    log = (run.stdout + run.stderr)[-3000:]

    records = read_topic(settings.bootstrap_servers, timeouts, expect=len(orders) - len(paid), timeout_s=30,
                         idle_s=2)
    delivered = Counter(json.loads(r.value())["order"] for r in records)
    assert delivered == Counter({order: 1 for order in orders if order not in paid}), log
    for record in records:
        headers = dict(record.headers())
        assert record.timestamp()[1] >= int(headers[wire.DELIVER_AT]), "delivered early"
        assert json.loads(record.value())["action"] == "cancel if unpaid"
        assert record.key() == json.loads(record.value())["order"].encode()
    assert time.monotonic() - started >= 4
    assert_reconcile_clean(settings, since, tmp_path / "reconcile", len(orders) - len(paid))


SINK_RULES = r"""
from unittest import mock
from confluent_kafka import KafkaError
import delayq
from delayq.quix import DelaySink, delay_id_for


def refused(call, error, wanted, why):
    try:
        call()
    except error as err:
        assert wanted in str(err), err
    else:
        raise AssertionError(why)


reports = []
producer = mock.Mock(spec_set=delayq.Producer)
producer.produce.side_effect = lambda *args, on_delivery, **kwargs: reports.append(on_delivery)
producer.cancel.side_effect = lambda delay_id, on_delivery: reports.append(on_delivery)
producer.flush.return_value = 0
sink = DelaySink("order-timeouts", delay=1800,
                 delay_id=lambda value, key, ts, headers: delay_id_for("unpaid", value["order"]),
                 cancel_when=lambda value, key, ts, headers: value["event"] == "paid")
sink._producer = producer
sink.add({"order": "o-1", "event": "placed"}, b"o-1", 0, [], "order-events", 0, 0)
sink.add({"order": "o-1", "event": "paid"}, b"o-1", 0, [], "order-events", 0, 1)
args, kwargs = producer.produce.call_args
assert args[0] == "order-timeouts" and kwargs["delay"] == 1800, (args, kwargs)
assert kwargs["delay_id"] == delay_id_for("unpaid", "o-1") == producer.cancel.call_args[0][0]
for report in reports:
    report(None, None)
sink.flush()                                   # every write confirmed: the checkpoint may commit
sink.add({"order": "o-2", "event": "placed"}, b"o-2", 0, [], "order-events", 0, 2)
reports[-1](KafkaError(KafkaError._MSG_TIMED_OUT), None)
refused(sink.flush, RuntimeError, "not committed, the rows come again", "a failed write let the checkpoint commit")
producer.flush.return_value = 3                # Kafka did not confirm in time
refused(sink.flush, RuntimeError, "3 delayed message(s)", "unconfirmed writes let the checkpoint commit")
for bad, wanted in (({}, "either delay"), ({"delay": 1, "due": abs}, "not both"),
                    ({"delay": 1, "cancel_when": bool}, "cancel_when needs delay_id")):
    refused(lambda: DelaySink("t", **bad), ValueError, wanted, bad)
print("ok")
"""


def test_the_sink_lets_a_checkpoint_commit_only_once_kafka_holds_every_write(quix_python):
    """DelaySink's flush() is quixstreams' checkpoint: it fails while a write is unconfirmed or failed."""
    done = subprocess.run([quix_python, "-c", SINK_RULES], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
