"""The rules of a cluster's feature level (election/levels.py): what `delayq upgrade finalize` may do, which nodes may start.

Pure: node records and the reading of the ``features`` znode in, a plan or a refusal out. No server.
"""

from __future__ import annotations

import pytest

import delayq
from delayq.election import (
    FeatureRecord,
    FinalizeAction,
    FinalizedLevel,
    LevelNotSpoken,
    NodeRecord,
    Role,
    check_node_speaks,
    plan_finalize,
)
from delayq.features import SUPPORTED_LEVEL, feature_level

PATH = "/delayq/orders/features"
NOTHING_RECORDED = FinalizedLevel.of(PATH, None, None)
NEW = NodeRecord("node-new", Role.MASTER)  # this code: speaks SUPPORTED_LEVEL
NEWER = NodeRecord("node-newer", Role.STANDBY, version="0.3.0", feature_level=3)
OLD = NodeRecord("node-old", Role.STANDBY, version=None, feature_level=None)  # as read from a node of 0.1.0


def finalized_at(level: int) -> FinalizedLevel:
    return FinalizedLevel.of(PATH, FeatureRecord(level, "0.2.0", 1_767_225_600_000, "0.2.0").to_json(), 3)


def test_by_default_finalize_raises_the_level_to_the_highest_every_registered_node_speaks():
    plan = plan_finalize([NEW, NEWER], NOTHING_RECORDED, "orders")
    assert (plan.action, plan.level) == (FinalizeAction.RAISE, SUPPORTED_LEVEL)
    assert plan.text == "finalize raises cluster orders from feature level 1 to 2: every registered node speaks it " \
                        "(node-new, node-newer)"
    assert plan.adds == (feature_level(2),)


def test_the_default_is_capped_at_the_highest_level_this_delayq_knows():
    plan = plan_finalize([NEWER], NOTHING_RECORDED, "orders")
    assert (plan.action, plan.level) == (FinalizeAction.RAISE, SUPPORTED_LEVEL)


def test_finalize_refuses_while_a_registered_node_does_not_speak_the_level_naming_each_one():
    plan = plan_finalize([NEW, OLD], NOTHING_RECORDED, "orders", wanted=2)
    assert (plan.action, plan.level, plan.holdouts) == (FinalizeAction.REFUSED, 2, (OLD,))
    assert plan.text == ("cannot finalize cluster orders at feature level 2: not every registered node speaks it: "
                         "node-old (delayq 0.1.0 or older, up to level 1); upgrade each to delayq 0.2.0 or later (or "
                         "stop it), then run `delayq upgrade finalize` again")


def test_by_default_with_no_higher_level_in_common_finalize_aims_at_this_delayqs_and_names_who_lacks_it():
    plan = plan_finalize([NEW, OLD], NOTHING_RECORDED, "orders")
    assert plan == plan_finalize([NEW, OLD], NOTHING_RECORDED, "orders", wanted=SUPPORTED_LEVEL)


def test_finalize_at_the_level_the_cluster_has_does_nothing():
    plan = plan_finalize([NEW], finalized_at(2), "orders")
    assert (plan.action, plan.level) == (FinalizeAction.NOTHING, 2)
    assert plan.text == ("nothing to do: cluster orders is at feature level 2 (finalized by delayq 0.2.0 at "
                         "2026-01-01T00:00:00Z) already")


def test_lowering_a_finalized_level_is_refused_in_one_line():
    plan = plan_finalize([NEW], finalized_at(2), "orders", wanted=1)
    assert plan.action == FinalizeAction.REFUSED
    assert plan.text == ("cannot finalize cluster orders at feature level 1: it is finalized at level 2, and a "
                         "finalized level is never lowered (there is no downgrade of a finalized level)")


def test_a_node_of_0_1_0_started_after_the_finalize_is_named_as_predating_the_start_check():
    plan = plan_finalize([NEW, OLD], finalized_at(2), "orders")
    assert (plan.action, plan.level) == (FinalizeAction.REFUSED, 2)
    assert plan.text == ("cannot finalize cluster orders at feature level 2: it is finalized at that level already; "
                         "registered nodes that do not speak level 2 predate the start check: node-old (delayq 0.1.0 "
                         "or older, up to level 1): stop each, or upgrade it to delayq 0.2.0 or later")
    lowered = plan_finalize([NEW, OLD], finalized_at(2), "orders", wanted=1)
    assert lowered.text.endswith("(there is no downgrade of a finalized level); registered nodes that do not speak "
                                 "level 2 predate the start check: node-old (delayq 0.1.0 or older, up to level 1): "
                                 "stop each, or upgrade it to delayq 0.2.0 or later")


def test_with_no_node_registered_finalize_refuses_and_says_to_start_the_nodes_first():
    plan = plan_finalize([], NOTHING_RECORDED, "orders")
    assert (plan.action, plan.level) == (FinalizeAction.REFUSED, None)
    assert plan.text == ("cannot finalize cluster orders: no node is registered in ZooKeeper, so nothing shows that "
                         "the nodes speak a higher feature level; start the nodes first (`delayq node`, or the "
                         "chart's StatefulSet), then run `delayq upgrade finalize` again")


def test_a_level_this_delayq_does_not_know_is_refused():
    plan = plan_finalize([NEWER], NOTHING_RECORDED, "orders", wanted=3)
    assert plan.action == FinalizeAction.REFUSED
    assert plan.text == (f"cannot finalize cluster orders at feature level 3: feature level 3 is not one delayq "
                         f"{delayq.__version__} knows (levels 1 to 2); run the finalize of the delayq release that "
                         "introduced it")


def test_a_damaged_record_is_refused_with_its_problem():
    damaged = FinalizedLevel.of(PATH, b"garbage", 0)
    plan = plan_finalize([NEW], damaged, "orders")
    assert plan.action == FinalizeAction.REFUSED
    assert plan.text == f"cannot finalize cluster orders: {damaged.problem}"


@pytest.mark.parametrize("plan", [plan_finalize([NEW, OLD], NOTHING_RECORDED, "orders", wanted=2),
                                  plan_finalize([], NOTHING_RECORDED, "orders"),
                                  plan_finalize([NEW], finalized_at(2), "orders", wanted=1)])
def test_every_refusal_is_one_line(plan):
    assert plan.action == FinalizeAction.REFUSED and "\n" not in plan.text


def test_a_node_that_speaks_the_finalized_level_may_start():
    for finalized in (NOTHING_RECORDED, finalized_at(1), finalized_at(SUPPORTED_LEVEL)):
        check_node_speaks(finalized, "orders")


def test_a_damaged_record_does_not_keep_a_node_from_starting():
    check_node_speaks(FinalizedLevel.of(PATH, b"garbage", 0), "orders")


def test_a_node_older_than_the_finalized_level_is_refused_in_one_line_naming_the_release_it_needs():
    newer = FinalizedLevel.of(PATH, FeatureRecord(3, "0.3.0", 1_767_225_600_000, "0.3.1").to_json(), 0)
    with pytest.raises(LevelNotSpoken) as refused:
        check_node_speaks(newer, "orders")
    assert str(refused.value) == (f"cluster orders is finalized at feature level 3, introduced by delayq 0.3.0; this "
                                  f"node runs delayq {delayq.__version__}, which speaks up to level 2: run delayq "
                                  "0.3.0 or later (a finalized level is never lowered)")
