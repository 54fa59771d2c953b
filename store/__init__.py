"""delayq.store: the RocksDB time index every delay-service node keeps.

Public surface::

    from delayq.store import TimeIndex, StoreOptions, Put, Remove, Malformed, MalformedEntry, StoredEntry, ApplyResult
    from delayq.store import StoreError, StoreFormatError
    from delayq.store import producer_write  # a producer's put or cancel, to apply a copy of it once
    from delayq.store import pack_producer_write  # the same, unchecked: ingest's reader
"""

from .options import StoreOptions
from .time_index import (
    ApplyResult,
    Malformed,
    MalformedEntry,
    Put,
    Remove,
    StoredEntry,
    StoreError,
    StoreFormatError,
    StoreOp,
    TimeIndex,
    pack_producer_write,
    producer_write,
)

__all__ = [
    "ApplyResult",
    "Malformed",
    "MalformedEntry",
    "Put",
    "Remove",
    "StoreError",
    "StoreFormatError",
    "StoreOp",
    "StoreOptions",
    "StoredEntry",
    "TimeIndex",
    "pack_producer_write",
    "producer_write",
]
