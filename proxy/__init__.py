"""delayq.proxy: the drop-in producer and the envelope codec shared by every part.

Public surface::

    from delayq.proxy import envelope          # header names, Envelope, parse_buffer_record, ...
"""

from . import envelope
from .envelope import BufferRecord, Envelope, MalformedRecord, check_delay_id, new_delay_id, parse_buffer_record

__all__ = [
    "BufferRecord",
    "Envelope",
    "MalformedRecord",
    "check_delay_id",
    "envelope",
    "new_delay_id",
    "parse_buffer_record",
]
