"""delayq.election: ZooKeeper (kazoo) recipes for one delayq cluster.

Public surface::

    from delayq.election import connect, Leadership, Term, Epoch, Cursor, Membership, FencedError
"""

from .recipes import Cursor, Epoch, FencedError, Leadership, Membership, Term, connect

__all__ = ["Cursor", "Epoch", "FencedError", "Leadership", "Membership", "Term", "connect"]
