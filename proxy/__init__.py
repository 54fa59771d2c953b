"""delayq.proxy: the drop-in producer and the envelope codec shared by every part.

Public surface::

    from delayq.proxy import Producer, cancel, lookup, Lookup, NodeUnreachable
    from delayq.proxy import envelope          # header names, Envelope, parse_buffer_record, ...
    from delayq.proxy import buffer_partition  # which buffer partition holds a delay id
"""

from . import envelope
from .envelope import BufferRecord, Envelope, MalformedRecord, check_delay_id, new_delay_id, parse_buffer_record
from .lookup import Lookup, NodeUnreachable, lookup
from .producer import Producer, buffer_partition, cancel

__all__ = [
    "BufferRecord",
    "Envelope",
    "Lookup",
    "MalformedRecord",
    "NodeUnreachable",
    "Producer",
    "buffer_partition",
    "cancel",
    "check_delay_id",
    "envelope",
    "lookup",
    "new_delay_id",
    "parse_buffer_record",
]
