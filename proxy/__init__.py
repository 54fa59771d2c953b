"""delayq.proxy: the drop-in producer, cancel and lookup, for user code.

Public surface::

    from delayq.proxy import Producer, cancel, lookup, Lookup, NodeUnreachable
    from delayq.proxy import Every, Cron, RetryPolicy, retry_later

The buffer's wire contract (frame, headers, partition rule, ids, reason codes) is
:mod:`delayq.wire`; the other parts of delayq import it from there, not from here.
"""

from .lookup import Lookup, NodeUnreachable, lookup
from .producer import Producer, cancel
from .repeat import Cron, Every
from .retry import RetryPolicy, retry_later

__all__ = [
    "Cron",
    "Every",
    "Lookup",
    "NodeUnreachable",
    "Producer",
    "RetryPolicy",
    "cancel",
    "lookup",
    "retry_later",
]
