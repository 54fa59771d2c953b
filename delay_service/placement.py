"""Which live nodes hold each shard, and which of them masters it: pure rules, the same on every node.

Every node computes both from the same ZooKeeper membership records (``nodes/*``), so
they agree without talking, once they have read the same records; until then the
election lock of each shard keeps one master at a time, whatever they think.

- :func:`holders`: with ``replicas`` 0, every live node holds every shard. With R > 0,
  each shard is held by R live nodes, chosen in R balanced rounds (the least loaded
  node first, rendezvous hashing breaking ties: each node scores each shard), so no
  node holds more than R * ceil(S / N) shards. Nodes of one **group** (the member
  processes one ``delayq node`` runs with ``DELAYQ_PROCESSES`` > 1, docs/DESIGN.md
  "Member processes") count as one node in those rules, and split what their group
  holds between them: each shard of the group's goes to one member, balanced, so a
  machine holds a shard once however many processes it runs.
- :func:`masters`: among the nodes that may master a shard (they hold it and have
  caught up on it), the current master keeps it while its count is within its quota
  (S = q * N + r: r nodes may master q + 1 shards, the others q); the rest go to the
  least loaded, ties broken by the rendezvous score. So with N healthy nodes none
  masters more than ceil(S / N), and a change moves as few masterships as it can.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Mapping


def score(cluster: str, shard: int, node_id: str) -> int:
    """The rendezvous score of ``node_id`` for ``shard`` of ``cluster``: higher wins."""
    digest = hashlib.blake2b(f"{cluster}\0{shard}\0{node_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def holders(cluster: str, shards: int, nodes: Iterable[str], replicas: int,
            groups: Mapping[str, str] | None = None) -> dict[int, list[str]]:
    """Shard -> the live nodes that should hold it (sorted): all of them, or ``replicas`` of them.

    With R > 0, R rounds each give every shard one more holder, as :func:`masters` gives
    masters (balanced, the rendezvous score breaking ties): no node holds more than
    R * ceil(S / N) shards.

    ``groups``: node -> its group, for the nodes that are member processes of one node (a
    node not in it is a group of its own). The rules above place shards on groups; each
    group's shards are then split between its live members, one member each, balanced.
    """
    live = sorted(set(nodes))
    members: dict[str, list[str]] = {}
    for node in live:
        members.setdefault((groups or {}).get(node, node), []).append(node)
    if all(len(listed) == 1 for listed in members.values()):
        return _holders(cluster, shards, live, replicas)
    by_group = _holders(cluster, shards, members, replicas)
    placed: dict[int, list[str]] = {shard: [] for shard in range(shards)}
    for group, listed in members.items():
        held = {shard: listed if group in holding else [] for shard, holding in by_group.items()}
        for shard, member in masters(f"{cluster}\0group\0{group}", shards, held, {}).items():
            if member is not None:
                placed[shard].append(member)
    return {shard: sorted(nodes_) for shard, nodes_ in placed.items()}


def _holders(cluster: str, shards: int, nodes: Iterable[str], replicas: int) -> dict[int, list[str]]:
    live = sorted(set(nodes))
    if replicas == 0 or replicas >= len(live):
        return {shard: list(live) for shard in range(shards)}
    chosen: dict[int, list[str]] = {shard: [] for shard in range(shards)}
    for round_ in range(replicas):
        others = {shard: [node for node in live if node not in chosen[shard]] for shard in range(shards)}
        held = Counter(node for listed in chosen.values() for node in listed)
        # The nodes holding fewest so far get this round's larger quotas.
        fewest_first = sorted(live, key=lambda node: (held[node], node))
        for shard, node in masters(f"{cluster}\0holder{round_}", shards, others, {}, fewest_first).items():
            if node is not None:
                chosen[shard].append(node)
    return {shard: sorted(nodes_) for shard, nodes_ in chosen.items()}


def masters(cluster: str, shards: int, eligible: Mapping[int, Iterable[str]],
            current: Mapping[int, str | None], larger_quotas_first: list[str] | None = None) -> dict[int, str | None]:
    """Shard -> the node that should master it (None: no node may), from who may and who does now.

    ``eligible[k]``: the nodes that hold shard k and have caught up on it; ``current[k]``:
    its master now, if any. ``larger_quotas_first``: who gets the q + 1 quotas first
    (default: those mastering most now, so fewer masterships move).
    """
    may = {shard: sorted(set(eligible.get(shard, ()))) for shard in range(shards)}
    nodes = sorted(set().union(*may.values())) if may else []
    plan: dict[int, str | None] = dict.fromkeys(range(shards))
    if not nodes:
        return plan
    base, extra = divmod(shards, len(nodes))
    # The nodes mastering most now keep the larger quotas: fewer masterships move.
    now = Counter(node for shard, node in current.items() if node is not None and node in may.get(shard, ()))
    by_load = sorted(nodes, key=lambda node: (-now[node], node))
    if larger_quotas_first is not None:
        rank = {node: index for index, node in enumerate(larger_quotas_first)}
        by_load = sorted(nodes, key=lambda node: (rank.get(node, len(rank)), node))
    strict = {node: base + (1 if rank < extra else 0) for rank, node in enumerate(by_load)}
    plan, fits = _assign(cluster, shards, may, current, strict)
    if not fits:  # the holders leave those quotas out of reach: every node up to ceil(S / N) then
        plan, _ = _assign(cluster, shards, may, current, dict.fromkeys(nodes, base + (1 if extra else 0)))
    return plan


def _assign(cluster: str, shards: int, may: Mapping[int, list[str]], current: Mapping[int, str | None],
            quota: Mapping[str, int]) -> tuple[dict[int, str | None], bool]:
    """A plan within ``quota`` where it can be; whether it is (no node over its quota)."""
    plan: dict[int, str | None] = dict.fromkeys(range(shards))
    load: Counter[str] = Counter()
    for shard in range(shards):
        node = current.get(shard)
        if node is not None and node in may[shard] and load[node] < quota[node]:
            plan[shard] = node
            load[node] += 1
    fits = True
    for shard in range(shards):
        if plan[shard] is not None or not may[shard]:
            continue
        pool = [node for node in may[shard] if load[node] < quota[node]]
        if not pool and _make_room(shard, may, plan, load, quota):
            pool = [node for node in may[shard] if load[node] < quota[node]]
        fits = fits and bool(pool)
        # Under quota first; if every candidate stays at its quota, the least loaded.
        node = min(pool or may[shard], key=lambda n: (load[n], -score(cluster, shard, n)))
        plan[shard] = node
        load[node] += 1
    return plan, fits


def _make_room(shard: int, may: Mapping[int, list[str]], plan: dict[int, str | None], load: Counter[str],
               quota: Mapping[str, int]) -> bool:
    """Free a candidate of ``shard``: move a chain of masterships until one ends on a node under quota.

    A breadth-first search for an augmenting path (bipartite matching with quotas): the
    shortest chain wins, so as few masterships move as can. True if one was found and moved.
    """
    came_from: dict[int, tuple[int, str] | None] = {shard: None}  # shard -> (the shard before it, the node between)
    queue = [shard]
    while queue:
        current = queue.pop(0)
        for node in may[current]:
            if current != shard and load[node] < quota[node]:
                # current moves to node; each shard before it on the chain moves to the node it came through.
                load[node] += 1
                step: int | None = current
                target = node
                while step is not None and came_from[step] is not None:
                    before, via = came_from[step]  # type: ignore[misc]
                    plan[step] = target
                    step, target = before, via
                load[target] -= 1  # the first node of the chain gave its shard away: room for ``shard``
                return True
            for other, master in sorted(plan.items()):
                if master == node and other not in came_from:
                    came_from[other] = (current, node)
                    queue.append(other)
    return False
