"""Key -> partition, computed the way the producing client would have.

A delayed message must land beside the immediate messages with the same key, so the
master applies the partitioner the proxy recorded (the frame's ``partitioner=`` option), not its own.
librdkafka's names are used; Java clients' default is ``murmur2_random``.
"""

from __future__ import annotations

import zlib

from delayq.wire import PARTITIONERS

_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's Java murmur2 (``org.apache.kafka.common.utils.Utils.murmur2``), as a signed 32-bit int."""
    length = len(data)
    m, r = 0x5BD1E995, 24
    h = (0x9747B28C ^ length) & _MASK
    end = length & ~3
    for i in range(0, end, 4):
        k = int.from_bytes(data[i:i + 4], "little")
        k = (k * m) & _MASK
        k ^= k >> r
        k = (k * m) & _MASK
        h = (h * m) & _MASK
        h ^= k
    rest = length & 3
    if rest == 3:
        h ^= data[end + 2] << 16
    if rest >= 2:
        h ^= data[end + 1] << 8
    if rest >= 1:
        h ^= data[end]
        h = (h * m) & _MASK
    h ^= h >> 13
    h = (h * m) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def fnv1a(data: bytes) -> int:
    h = 0x811C9DC5
    for byte in data:
        h ^= byte
        h = (h * 0x01000193) & _MASK
    return h


def _crc32(key: bytes, count: int) -> int:
    return zlib.crc32(key) % count


def _murmur2(key: bytes, count: int) -> int:
    return (murmur2(key) & 0x7FFFFFFF) % count


def _fnv1a(key: bytes, count: int) -> int:
    return fnv1a(key) % count


_KEYED = {
    "consistent": _crc32,
    "consistent_random": _crc32,
    "murmur2": _murmur2,
    "murmur2_random": _murmur2,
    "fnv1a": _fnv1a,
    "fnv1a_random": _fnv1a,
}
# The *_random variants send null keys to a random partition; the others hash the empty key.
_NULL_KEY_HASHED = {"consistent", "murmur2", "fnv1a"}
DEFAULT_PARTITIONER = "consistent_random"  # librdkafka's default
# Every name the wire contract allows is computed here ("random" chooses no partition).
assert set(_KEYED) | {"random"} == PARTITIONERS, "delayq.wire.PARTITIONERS and partitioners.py disagree"


def partition_for(key: bytes | None, count: int, partitioner: str | None) -> int:
    """The partition a client using ``partitioner`` picks for ``key`` among ``count``; -1: the producer chooses."""
    name = partitioner or DEFAULT_PARTITIONER
    if name == "random" or name not in _KEYED:
        return -1
    if key is None:
        return _KEYED[name](b"", count) if name in _NULL_KEY_HASHED else -1
    return _KEYED[name](key, count)
