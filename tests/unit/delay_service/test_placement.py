"""The placement rules (delay_service/placement.py): who holds each shard, who masters it. Pure: no servers."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from delayq import wire
from delayq.delay_service.placement import holders, masters

CLUSTER = "orders"


def nodes(count: int) -> list[str]:
    return [f"node-{i}" for i in range(count)]


def load(plan: dict[int, str | None]) -> Counter:
    return Counter(node for node in plan.values() if node is not None)


def test_the_shard_of_a_partition_is_the_partition_modulo_the_shard_count():
    assert [wire.shard_of(p, 6) for p in range(12)] == [0, 1, 2, 3, 4, 5] * 2
    assert wire.shard_partitions(2, 6, 12) == [2, 8]
    assert sorted(p for k in range(4) for p in wire.shard_partitions(k, 4, 12)) == list(range(12))


def test_with_replicas_0_every_live_node_holds_every_shard():
    assert holders(CLUSTER, 3, ["b", "a", "c"], 0) == {k: ["a", "b", "c"] for k in range(3)}
    assert holders(CLUSTER, 2, ["a", "b"], 5) == {0: ["a", "b"], 1: ["a", "b"]}, "R above N: all hold all"


@pytest.mark.parametrize(("count", "shards", "replicas"), [(3, 6, 2), (4, 6, 2), (3, 6, 1), (5, 12, 2), (7, 16, 3)])
def test_each_shard_has_r_distinct_holders_and_no_node_holds_more_than_its_share(count, shards, replicas):
    placed = holders(CLUSTER, shards, nodes(count), replicas)
    assert all(len(set(held)) == replicas for held in placed.values())
    per_node = Counter(node for held in placed.values() for node in held)
    assert max(per_node.values()) <= math.ceil(shards * replicas / count)


def test_holders_depend_on_the_membership_only_not_on_its_order():
    assert holders(CLUSTER, 6, ["c", "a", "b"], 2) == holders(CLUSTER, 6, ["a", "b", "c"], 2)


@pytest.mark.parametrize("count", [1, 2, 3, 4, 5, 6, 7])
def test_n_healthy_nodes_master_at_most_ceil_s_over_n_and_differ_by_one_at_most(count):
    plan = masters(CLUSTER, 6, {k: nodes(count) for k in range(6)}, {})
    assert all(plan[k] is not None for k in range(6))
    per_node = [load(plan)[n] for n in nodes(count)]
    assert max(per_node) <= math.ceil(6 / count) and max(per_node) - min(per_node) <= 1


def test_a_dead_nodes_shards_go_to_the_survivors_and_nothing_else_moves():
    before = masters(CLUSTER, 6, {k: nodes(3) for k in range(6)}, {})
    dead = "node-2"
    current = {k: (n if n != dead else None) for k, n in before.items()}
    after = masters(CLUSTER, 6, {k: ["node-0", "node-1"] for k in range(6)}, current)
    assert all(after[k] == before[k] for k in range(6) if before[k] != dead), "a survivor's shard moved"
    assert load(after) == Counter({"node-0": 3, "node-1": 3})


def test_a_node_that_comes_back_or_joins_takes_a_share_from_the_busiest():
    survivors = {k: ["node-0", "node-1"] for k in range(6)}
    two = masters(CLUSTER, 6, survivors, {})
    three = masters(CLUSTER, 6, {k: nodes(3) for k in range(6)}, two)
    assert load(three) == Counter(dict.fromkeys(nodes(3), 2))
    assert sum(two[k] != three[k] for k in range(6)) == 2, "only the new node's two shards move"
    four = masters(CLUSTER, 6, {k: nodes(4) for k in range(6)}, three)
    assert sorted(load(four).values()) == [1, 1, 2, 2]
    assert sum(three[k] != four[k] for k in range(6)) == 1, "2, 2, 2 becomes 2, 2, 1, 1: one shard moves"


def test_a_plan_is_stable_once_reached():
    rng = random.Random(20261124)
    for _ in range(500):
        count, shards, replicas = rng.randint(1, 7), rng.choice([1, 2, 3, 4, 6, 8, 12]), rng.choice([0, 1, 2, 3])
        placed = holders(CLUSTER, shards, nodes(count), replicas)
        plan = masters(CLUSTER, shards, placed, {k: rng.choice([*placed[k], None]) for k in placed})
        again = masters(CLUSTER, shards, placed, plan)
        assert masters(CLUSTER, shards, placed, again) == again, "the plan still moves after two rounds"
        assert all(again[k] in placed[k] for k in placed), "a master that does not hold its shard"
        assert max(load(again).values()) <= math.ceil(shards / count)


def test_a_shard_nobody_may_master_has_no_planned_master_and_the_others_do():
    plan = masters(CLUSTER, 3, {0: ["a"], 1: [], 2: ["a", "b"]}, {})
    assert plan[1] is None and plan[0] == "a" and plan[2] == "b"


def test_masters_are_chosen_only_among_the_nodes_that_may_master_each_shard():
    placed = holders(CLUSTER, 6, nodes(3), 1)
    plan = masters(CLUSTER, 6, placed, {})
    assert all(plan[k] == placed[k][0] for k in range(6))


def grouped(machines: int, processes: int) -> tuple[list[str], dict[str, str]]:
    """``processes`` member processes on each of ``machines`` nodes: their ids and their groups."""
    members = {f"m{i}-{j}": f"m{i}" for i in range(machines) for j in range(processes)}
    return sorted(members), members


@pytest.mark.parametrize(("machines", "processes", "shards", "replicas"),
                         [(1, 2, 2, 0), (1, 3, 6, 0), (2, 2, 6, 0), (3, 2, 6, 2), (3, 4, 12, 1), (2, 3, 4, 1)])
def test_member_processes_split_their_groups_shards_one_member_each_balanced(machines, processes, shards, replicas):
    live, groups = grouped(machines, processes)
    placed = holders(CLUSTER, shards, live, replicas, groups)
    by_machine = holders(CLUSTER, shards, [f"m{i}" for i in range(machines)], replicas)
    for shard, held in placed.items():
        # Each machine that holds the shard as a node would holds it in exactly one of its processes.
        assert sorted(groups[member] for member in held) == by_machine[shard]
    for machine in range(machines):
        mine = Counter(m for held in placed.values() for m in held if groups[m] == f"m{machine}")
        share = sum(f"m{machine}" in held for held in by_machine.values())
        assert sum(mine.values()) == share
        assert max(mine.values(), default=0) <= math.ceil(share / processes), "a process holds more than its share"


def test_a_dead_members_shards_go_to_its_siblings_and_nodes_without_groups_place_as_before():
    live, groups = grouped(1, 2)
    both = holders(CLUSTER, 2, live, 0, groups)
    assert sorted(len(held) for held in both.values()) == [1, 1] and both[0] != both[1]
    survivor = [m for m in live if m != both[0][0]]
    assert holders(CLUSTER, 2, survivor, 0, groups) == {0: survivor, 1: survivor}
    assert holders(CLUSTER, 6, nodes(3), 2, {}) == holders(CLUSTER, 6, nodes(3), 2)
    assert holders(CLUSTER, 6, nodes(3), 2, {n: n for n in nodes(3)}) == holders(CLUSTER, 6, nodes(3), 2)
