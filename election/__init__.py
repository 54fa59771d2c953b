"""delayq.election: ZooKeeper (kazoo) recipes for one delayq cluster.

Public surface::

    from delayq.election import connect, connect_for, ensure_cluster_root
    from delayq.election import Leadership, Term, Epoch, Cursor, Membership, Layout, FencedError
    from delayq.election import NodeRecord, CursorRecord, ShardLayout, Role, DuplicateNodeId
"""

from .access import ensure_cluster_root
from .recipes import (
    Cursor,
    DuplicateNodeId,
    Epoch,
    FencedError,
    Layout,
    Leadership,
    Membership,
    Term,
    connect,
    connect_for,
)
from .records import CursorRecord, NodeRecord, Role, ShardLayout

__all__ = ["Cursor", "CursorRecord", "DuplicateNodeId", "Epoch", "FencedError", "Layout", "Leadership",
           "Membership", "NodeRecord", "Role", "ShardLayout", "Term", "connect", "connect_for",
           "ensure_cluster_root"]
