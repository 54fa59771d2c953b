"""Dispatch limits: how fast a shard's master delivers to each target topic (setting ``dispatch_limits``).

A token bucket per topic: ``rate`` tokens a second, at most ``burst`` saved up; each
delivery takes one. The cluster's limit is shared by its shards' masters, each taking
an equal part (ids hash evenly over the shards), so S masters together deliver at most
``rate`` a second to a topic. A message whose topic has no token left waits, in due
order, in the master's memory (delivery.py), until the bucket has refilled a little
(:data:`RELEASE_S` worth of tokens, or the whole burst if that is less): a transaction
per token would cost more than the messages.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from delayq.settings import Settings

# How much of a second's rate a throttled topic waits to have refilled before its messages are picked again.
RELEASE_S = 0.05


@dataclass
class _Bucket:
    rate: float  # tokens a second
    capacity: float
    tokens: float
    updated: float  # monotonic s

    def refill(self, now: float) -> None:
        self.tokens = min(self.capacity, self.tokens + (now - self.updated) * self.rate)
        self.updated = now

    @property
    def release_level(self) -> float:
        return min(self.capacity, max(1.0, self.rate * RELEASE_S))


class DispatchLimiter:
    """The token buckets of one shard's master, one per target topic that has a limit."""

    def __init__(self, settings: Settings, shards: int, clock: Callable[[], float] = time.monotonic):
        self._settings = settings
        self._shards = max(1, shards)
        self._clock = clock
        self._buckets: dict[str, _Bucket | None] = {}

    @property
    def active(self) -> bool:
        """Whether any topic has a limit."""
        return bool(self._settings.dispatch_limits)

    def _bucket(self, topic: str) -> _Bucket | None:
        try:
            return self._buckets[topic]
        except KeyError:
            pass
        limit = self._settings.dispatch_limit(topic)
        bucket = None
        if limit is not None:
            capacity = max(1.0, limit.burst_size / self._shards)
            bucket = _Bucket(limit.rate / self._shards, capacity, capacity, self._clock())
        self._buckets[topic] = bucket
        return bucket

    def take(self, topic: str) -> bool:
        """Take one delivery to ``topic`` from its bucket: False when there is none left now."""
        bucket = self._bucket(topic)
        if bucket is None:
            return True
        if bucket.tokens < 1.0:
            bucket.refill(self._clock())
            if bucket.tokens < 1.0:
                return False
        bucket.tokens -= 1.0
        return True

    def give_back(self, topic: str) -> None:
        """Return a token :meth:`take` gave for a delivery that did not happen."""
        bucket = self._bucket(topic)
        if bucket is not None:
            bucket.tokens = min(bucket.capacity, bucket.tokens + 1.0)

    def released(self, topic: str) -> bool:
        """Whether ``topic``'s waiting messages may be picked again (its bucket has refilled enough)."""
        bucket = self._bucket(topic)
        if bucket is None:
            return True
        bucket.refill(self._clock())
        return bucket.tokens >= bucket.release_level

    def release_in(self, topic: str) -> float:
        """Seconds until :meth:`released` turns True for ``topic`` (0 if it is)."""
        bucket = self._bucket(topic)
        if bucket is None:
            return 0.0
        bucket.refill(self._clock())
        return max(0.0, (bucket.release_level - bucket.tokens) / bucket.rate)
