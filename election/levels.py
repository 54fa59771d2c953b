"""The rules of a cluster's feature level over its records: what ``delayq upgrade finalize`` may do, who may start.

Pure: the nodes' registrations and the reading of the ``features`` znode in, a plan or a
refusal out (docs/DESIGN.md, "Versions and upgrades"). A level is raised only when every
registered node speaks it, never lowered, and a node that does not speak the finalized
level does not start.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from delayq import __version__
from delayq.errors import DelayqError
from delayq.features import SUPPORTED_LEVEL, FeatureLevel, feature_level, introduced_by

from .records import FinalizedLevel, NodeRecord, version_text


class LevelNotSpoken(DelayqError):
    """The cluster is finalized at a level this node does not speak: it must not start (run a newer delayq)."""


class FinalizeAction(enum.StrEnum):
    """What ``delayq upgrade finalize`` does."""

    RAISE = "raise"
    NOTHING = "nothing"
    REFUSED = "refused"


@dataclass(frozen=True, slots=True)
class FinalizePlan:
    """What a finalize does: raise to ``level``, nothing, or refuse; ``text`` says it in one line.

    ``level`` is the level aimed at (None when there is none: no node, or a damaged record),
    ``holdouts`` the registered nodes that do not speak it.
    """

    action: FinalizeAction
    level: int | None
    text: str
    holdouts: tuple[NodeRecord, ...] = ()
    adds: tuple[FeatureLevel, ...] = ()  # for a raise: the levels it adds, the lowest first


def plan_finalize(nodes: Sequence[NodeRecord], finalized: FinalizedLevel, cluster: str,
                  wanted: int | None = None) -> FinalizePlan:
    """What finalizing ``cluster`` at ``wanted`` does, given its registered ``nodes`` and its ``finalized`` level.

    Without ``wanted``, the level is the highest every registered node speaks, capped at this
    code's :data:`SUPPORTED_LEVEL`; when that is no higher than the cluster's, this code's
    level, so that the nodes which lack it are named.
    """
    current = finalized.level
    if current is None:
        return _refused(None, f"cannot finalize cluster {cluster}: {finalized.problem}")
    if not nodes:
        return _refused(None, f"cannot finalize cluster {cluster}: no node is registered in ZooKeeper, so nothing "
                              "shows that the nodes speak a higher feature level; start the nodes first (`delayq "
                              "node`, or the chart's StatefulSet), then run `delayq upgrade finalize` again")
    if wanted is None:
        common = min(SUPPORTED_LEVEL, *(node.highest_level for node in nodes))
        wanted = common if common > current else max(current, SUPPORTED_LEVEL)
    refused = f"cannot finalize cluster {cluster} at feature level {wanted}"
    # Nodes that do not speak the level the cluster has (only a recorded level can be above theirs): of 0.1.0,
    # started after the finalize, which they predate the start check of. Named, never a reason to lower it.
    behind: tuple[NodeRecord, ...] = ()
    predating = ""
    if finalized.record is not None:
        behind = tuple(node for node in nodes if node.highest_level < current)
        predating = "" if not behind else (
            f"; registered nodes that do not speak level {current} predate the start check: {_named(behind)}: stop "
            f"each, or upgrade it to delayq {finalized.record.introduced_by} or later")
    if wanted < current:
        return _refused(wanted, f"{refused}: it is finalized at level {current}, and a finalized level is never "
                                f"lowered (there is no downgrade of a finalized level){predating}", behind)
    if wanted == current:
        if behind:
            return _refused(wanted, f"{refused}: it is finalized at that level already{predating}", behind)
        return FinalizePlan(FinalizeAction.NOTHING, wanted,
                            f"nothing to do: cluster {cluster} is at {finalized.describe()} already")
    try:
        adds = tuple(feature_level(level) for level in range(current + 1, wanted + 1))
    except ValueError as err:
        return _refused(wanted, f"{refused}: {err}; run the finalize of the delayq release that introduced it")
    holdouts = tuple(node for node in nodes if node.highest_level < wanted)
    if holdouts:
        return _refused(wanted, f"{refused}: not every registered node speaks it: {_named(holdouts)}; upgrade each "
                                f"to delayq {introduced_by(wanted)} or later (or stop it), then run `delayq upgrade "
                                "finalize` again", holdouts)
    return FinalizePlan(FinalizeAction.RAISE, wanted,
                        f"finalize raises cluster {cluster} from feature level {current} to {wanted}: every "
                        f"registered node speaks it ({', '.join(node.node_id for node in nodes)})", adds=adds)


def check_node_speaks(finalized: FinalizedLevel, cluster: str) -> None:
    """Let this node start only if it speaks the cluster's finalized level (a damaged record does not stop it).

    Raises:
        LevelNotSpoken: the finalized level is above :data:`SUPPORTED_LEVEL`; one line naming the release to run.
    """
    record = finalized.record
    if record is not None and record.level > SUPPORTED_LEVEL:
        raise LevelNotSpoken(f"cluster {cluster} is finalized at feature level {record.level}, introduced by delayq "
                             f"{record.introduced_by}; this node runs delayq {__version__}, which speaks up to level "
                             f"{SUPPORTED_LEVEL}: run delayq {record.introduced_by} or later (a finalized level is "
                             "never lowered)")


def _refused(level: int | None, text: str, holdouts: tuple[NodeRecord, ...] = ()) -> FinalizePlan:
    return FinalizePlan(FinalizeAction.REFUSED, level, text, holdouts)


def _named(nodes: Sequence[NodeRecord]) -> str:
    return ", ".join(f"{node.node_id} (delayq {version_text(node.version)}, up to level {node.highest_level})"
                     for node in nodes)
