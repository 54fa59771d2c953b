"""The continuous reconciliation's own logic (follow.py), no Spark or Kafka: the per-id state, the subscription,
findings, options and the command line. Its judgement is the batch job's: test_reconcile_rules.py runs every
rule through both."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from unittest import mock

import pandas as pd
import pytest
from pyspark.sql.streaming.state import GroupState

from delayq import Settings
from delayq.errors import UsageError
from delayq.spark.cli import add_arguments, follow_options_from_args, run
from delayq.spark.follow import (
    BUFFER_SIDE,
    DELIVERED_SIDE,
    FINDING_FLAGS,
    FOREVER_MS,
    Finding,
    FollowOptions,
    findings_of,
    follow_step,
    subscription,
)
from delayq.spark.options import ReconcileOptions
from delayq.spark.records import DONE, PUT

GRACE, RETAIN = 10_000, 60_000
RULES = ReconcileOptions(since_ms=0, until_ms=FOREVER_MS, out=Path("unused"), grace_ms=GRACE)


def record(side: int, kind: int, offset: int | None, due: int | None, ts: int = 1) -> dict:
    """A history record, as the job's input gives it to the step: its JSON and the fields the step reads."""
    fields = {"side": side, "kind": kind, "offset": offset, "ts": ts, "due": due, "topic": "orders", "written": 0}
    return {"id": "id-1", "record": json.dumps({k: v for k, v in fields.items() if v is not None}),
            "side": side, "kind": kind, "offset": offset, "due": due}


def frame(*records: dict) -> pd.DataFrame:
    return pd.DataFrame(list(records))  # a null offset or due arrives as NaN, as Spark's Arrow hands it over


class State:
    """GroupState's surface the step uses, recording what it was told (spec_set: nothing else exists)."""

    def __init__(self, now: int, stored: tuple | None = None, timed_out: bool = False):
        self.mock = mock.Mock(spec_set=GroupState)
        self.mock.getCurrentProcessingTimeMs.return_value = now
        self.mock.exists = stored is not None
        self.mock.get = stored
        self.mock.hasTimedOut = timed_out

    def updated(self) -> tuple:
        return self.mock.update.call_args.args[0]

    def timeout(self) -> int:
        return self.mock.setTimeoutDuration.call_args.args[0]


def run_step(state: State, *frames: pd.DataFrame) -> list[pd.DataFrame]:
    return list(follow_step(GRACE, RETAIN)(("id-1",), iter(frames), state.mock))


def test_new_records_are_kept_and_the_whole_history_emitted_with_a_timeout_at_due_plus_grace():
    state = State(now=1_000)
    [first] = run_step(state, frame(record(BUFFER_SIDE, PUT, 5, due=20_000)))
    records, count, put_offset, put_due, check_at, forget_at = state.updated()
    assert (count, put_offset, put_due, check_at, forget_at) == (1, 5, 20_000, 30_000, 30_000 + RETAIN)
    assert state.timeout() == 29_000
    assert first.to_dict("records") == [{"id": "id-1", "records": f"[{records}]", "fresh_from": 0,
                                         "judged_at": 1_000}]

    later = State(now=2_000, stored=state.updated())
    [second] = run_step(later, frame(record(DELIVERED_SIDE, 3, None, due=20_000, ts=1_900)))
    history = json.loads(second["records"][0])
    assert [r["side"] for r in history] == [BUFFER_SIDE, DELIVERED_SIDE] and "offset" not in history[1]
    assert (second["fresh_from"][0], later.updated()[1:4]) == (1, (2, 5, 20_000))


def test_the_latest_put_sets_the_check_a_reschedule_moves_it_a_done_does_not():
    state = State(now=1_000)
    run_step(state, frame(record(BUFFER_SIDE, PUT, 9, due=50_000), record(BUFFER_SIDE, PUT, 5, due=20_000),
                          record(BUFFER_SIDE, DONE, 11, due=None)))
    assert state.updated()[2:5] == (9, 50_000, 60_000)


def test_at_the_check_the_history_is_emitted_again_then_forgotten_after_the_retention():
    stored = ('{"side":0,"kind":0,"offset":5,"due":20000}', 1, 5, 20_000, 30_000, 90_000)
    check = State(now=30_500, stored=stored, timed_out=True)
    [emitted] = run_step(check)
    assert (emitted["fresh_from"][0], emitted["judged_at"][0]) == (1, 30_500)  # nothing fresh
    assert check.updated()[4:] == (None, 90_000) and check.timeout() == 59_500

    forget = State(now=90_000, stored=check.updated(), timed_out=True)
    assert run_step(forget) == []
    forget.mock.remove.assert_called_once_with()


def test_an_id_with_no_put_or_due_already_past_is_judged_now_and_only_forgotten_later():
    state = State(now=100_000)
    run_step(state, frame(record(DELIVERED_SIDE, 3, None, due=20_000)))
    assert state.updated()[4:] == (None, 100_000 + RETAIN)
    past = State(now=100_000)
    run_step(past, frame(record(BUFFER_SIDE, PUT, 5, due=20_000)))
    assert past.updated()[4:] == (None, 100_000 + RETAIN)


def matches(pattern: str, topic: str) -> bool:
    # Spark's Kafka source looks for the pattern anywhere in the name (find): it must be anchored.
    return re.search(pattern, topic) is not None


def test_the_subscription_reads_the_clusters_topics_and_targets_and_never_delayqs_own_or_kafkas():
    settings = Settings(cluster="shop", target_topics=["orders.*", "pay?"])
    pattern = subscription(settings, FollowOptions(checkpoint=Path("c"), rules=RULES))
    for topic in ("delayq-shop-buffer", "delayq-shop-dead-letter", "orders.eu", "orders.", "pays"):
        assert matches(pattern, topic), topic
    for topic in ("delayq-shop-reconcile-findings", "delayq-other-buffer", "delayq-other-dead-letter",
                  "delayq-other-reconcile-findings", "__consumer_offsets", "orders", "ordersXeu", "payments", "my-orders.eu"):
        assert not matches(pattern, topic), topic
    named = subscription(settings, FollowOptions(checkpoint=Path("c"), rules=RULES, topics=("a.b",)))
    assert matches(named, "a.b") and not matches(named, "axb") and not matches(named, "orders")


def test_each_raised_flag_is_one_finding_keyed_by_kind_id_and_version():
    judged = {"id": "id-1", "version": 12, "topic": "orders", "state": "scheduled", "delivered_count": 2,
              **dict.fromkeys(FINDING_FLAGS.values(), False), "is_duplicate": True, "is_early": True}
    found = findings_of([judged, {**judged, "id": "id-2", "is_duplicate": False, "is_early": False}])
    assert [(f.kind, f.key) for f in found] == [("duplicated", "duplicated:id-1:12"), ("early", "early:id-1:12")]
    record = json.loads(found[0].to_json(batch=3, found_ms=99))
    assert (record["batch"], record["found_ms"], record["delivered_count"], record["topic"]) == (3, 99, 2, "orders")
    assert Finding("missing", "id-3", None, {}).key == "missing:id-3:"
    assert set(FINDING_FLAGS) == {"duplicated", "missing", "unexpected", "early", "cancel_ignored", "reordered",
                                  "undeliverable"}


@pytest.mark.parametrize("change,message", [
    ({"metrics_port": 70_000}, "metrics port 70000 is no TCP port"),
    ({"trigger_s": 0}, "trigger of 0 s"),
    ({"retain_ms": -1}, "retain_ms -1"),
])
def test_follow_options_refuse_values_out_of_range_naming_them(change, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        FollowOptions(**{"checkpoint": Path("c"), "rules": RULES, **change})


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser, default_master="local[2]")
    return parser.parse_args(list(argv))


def test_follow_flags_become_options_and_the_rules_judge_whatever_the_due_time():
    options = follow_options_from_args(parse("--follow", "--checkpoint", "ck", "--grace", "30s", "--trigger", "3",
                                             "--retain", "2h", "--topics", "a,b", "--metrics-port", "0"))
    assert (options.checkpoint, options.trigger_s, options.retain_ms, options.topics, options.metrics_port) == (
        Path("ck"), 3.0, 7_200_000, ("a", "b"), 0)
    assert (options.rules.grace_ms, options.rules.since_ms, options.rules.until_ms) == (30_000, 0, FOREVER_MS)


@pytest.mark.parametrize("argv,message", [
    (("--follow",), "--follow needs --checkpoint DIR"),
    (("--follow", "--checkpoint", "ck", "--since", "2h", "--out", "r"),
     "--since, --out cannot go with --follow"),
    (("--follow", "--checkpoint", "ck", "--retain", "soon"), "--retain"),
])
def test_follow_flags_that_do_not_fit_are_one_usage_error_naming_them(argv, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        follow_options_from_args(parse(*argv))


def test_follow_only_flags_without_follow_are_refused_before_anything_starts(monkeypatch):
    monkeypatch.setenv("DELAYQ_SPARK_MASTER", "local[2]")
    with pytest.raises(UsageError, match=re.escape("--checkpoint, --trigger only go with --follow")):
        run(parse("--checkpoint", "ck", "--trigger", "3"))
