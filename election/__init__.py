"""delayq.election: ZooKeeper (kazoo) recipes for one delayq cluster.

Public surface::

    from delayq.election import connect, Leadership, Term, Epoch, Cursor, Membership, FencedError
    from delayq.election import NodeRecord, CursorRecord, Role, DuplicateNodeId
"""

from .recipes import Cursor, DuplicateNodeId, Epoch, FencedError, Leadership, Membership, Term, connect
from .records import CursorRecord, NodeRecord, Role

__all__ = ["Cursor", "CursorRecord", "DuplicateNodeId", "Epoch", "FencedError", "Leadership", "Membership",
           "NodeRecord", "Role", "Term", "connect"]
