"""delayq.store: the RocksDB time index every delay-service node keeps.

Public surface::

    from delayq.store import TimeIndex, StoreOptions, Put, Remove, Malformed, MalformedEntry, StoredEntry, ApplyResult
    from delayq.store import PendingByDue, Upcoming  # TimeIndex.pending_by_due's buckets, TimeIndex.upcoming's page
    from delayq.store import StoreError, StoreFormatError
    from delayq.store import OLDEST_FORMAT, NEWEST_FORMAT  # the store formats this code opens (4 migrates to 5)
    from delayq.store import producer_write  # a producer's put or cancel, to apply a copy of it once
    from delayq.store import pack_producer_write  # the same, unchecked: ingest's reader
    from delayq.store import put_frame, remove_frame, malformed_frame, decode  # ops between processes
"""

from .ops import (
    Malformed,
    Put,
    Remove,
    StoreOp,
    decode,
    malformed_frame,
    pack_producer_write,
    producer_write,
    put_frame,
    remove_frame,
)
from .options import StoreOptions
from .pending_by_due import MAX_DAYS, PendingByDue
from .time_index import (
    NEWEST_FORMAT,
    OLDEST_FORMAT,
    ApplyResult,
    MalformedEntry,
    StoredEntry,
    StoreError,
    StoreFormatError,
    TimeIndex,
    Upcoming,
)

__all__ = [
    "MAX_DAYS",
    "NEWEST_FORMAT",
    "OLDEST_FORMAT",
    "ApplyResult",
    "Malformed",
    "MalformedEntry",
    "PendingByDue",
    "Put",
    "Remove",
    "StoreError",
    "StoreFormatError",
    "StoreOp",
    "StoreOptions",
    "StoredEntry",
    "TimeIndex",
    "Upcoming",
    "decode",
    "malformed_frame",
    "pack_producer_write",
    "producer_write",
    "put_frame",
    "remove_frame",
]
