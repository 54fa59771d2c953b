"""delayq.election: ZooKeeper (kazoo) recipes for one delayq cluster.

Public surface::

    from delayq.election import connect, Leadership, Term, Epoch, Cursor, Membership, Layout, FencedError
    from delayq.election import NodeRecord, CursorRecord, ShardLayout, Role, DuplicateNodeId
"""

from .recipes import Cursor, DuplicateNodeId, Epoch, FencedError, Layout, Leadership, Membership, Term, connect
from .records import CursorRecord, NodeRecord, Role, ShardLayout

__all__ = ["Cursor", "CursorRecord", "DuplicateNodeId", "Epoch", "FencedError", "Layout", "Leadership",
           "Membership", "NodeRecord", "Role", "ShardLayout", "Term", "connect"]
