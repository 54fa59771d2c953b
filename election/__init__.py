"""delayq.election: ZooKeeper (kazoo) recipes for one delayq cluster.

Public surface::

    from delayq.election import connect, connect_for, ensure_cluster_root, evict, watch_membership
    from delayq.election import Leadership, Term, Epoch, Cursor, Membership, Layout, FencedError
    from delayq.election import NodeRecord, CursorRecord, ShardLayout, Role, DuplicateNodeId
    from delayq.election import Features, FeatureRecord, FinalizedLevel, ConcurrentFinalize, version_text
    from delayq.election import plan_finalize, FinalizePlan, FinalizeAction, check_node_speaks, LevelNotSpoken
"""

from .access import ensure_cluster_root
from .levels import FinalizeAction, FinalizePlan, LevelNotSpoken, check_node_speaks, plan_finalize
from .recipes import (
    ConcurrentFinalize,
    Cursor,
    DuplicateNodeId,
    Epoch,
    Features,
    FencedError,
    Layout,
    Leadership,
    Membership,
    Term,
    connect,
    connect_for,
    evict,
    watch_membership,
)
from .records import CursorRecord, FeatureRecord, FinalizedLevel, NodeRecord, Role, ShardLayout, version_text

__all__ = ["ConcurrentFinalize", "Cursor", "CursorRecord", "DuplicateNodeId", "Epoch", "FeatureRecord", "Features",
           "FencedError", "FinalizeAction", "FinalizePlan", "FinalizedLevel", "Layout", "Leadership",
           "LevelNotSpoken", "Membership", "NodeRecord", "Role", "ShardLayout", "Term", "check_node_speaks",
           "connect", "connect_for", "ensure_cluster_root", "evict", "plan_finalize", "version_text",
           "watch_membership"]
