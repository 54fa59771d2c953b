"""A producer's gate on the cluster's finalized feature level: nothing goes to the buffer that its nodes cannot read.

A request that needs a level above 1 (a frame option of a newer level, delayq/features.py) is
checked against the level recorded in ZooKeeper (``<zk_root>/features``): read the first time
such a request comes, with a one-shot watch that marks the reading stale when the znode
changes (or the session is lost), so a ``delayq upgrade finalize`` is seen by the next such
request without restarting the producer. Requests of level 1, all 0.1.0 knew, never reach
ZooKeeper: a producer without ZooKeeper access works as before. A finalized level is never
lowered, so a level once seen lets its requests through without asking again, even while
ZooKeeper is away. (Not a kazoo DataWatch: its worker retries a read without end while the
client stops, and the producer's close() hung joining it.)
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from delayq.errors import DelayqError, UnavailableError
from delayq.extras import require
from delayq.features import UNRECORDED_LEVEL, introduced_by
from delayq.settings import Settings

if TYPE_CHECKING:
    from kazoo.client import KazooClient

    from delayq.election import FinalizedLevel

# How long the first request of a higher level waits for ZooKeeper: as long as the producer waits for
# the buffer's metadata (Producer.buffer_partitions).
READ_TIMEOUT_S = 10.0


class LevelNotFinalized(DelayqError, ValueError):
    """A request needs a feature level the cluster has not finalized (or whose record cannot be read); nothing
    was sent. The message says what needs which level and how to get it."""


def level_refusal(needed: int, what: str, finalized: FinalizedLevel, cluster: str) -> str | None:
    """Why ``what``, which needs feature level ``needed``, may not be sent to ``cluster``; None if it may."""
    if finalized.level is None:
        return f"{what} needs feature level {needed}, and cluster {cluster}'s level cannot be read: {finalized.problem}"
    if needed <= finalized.level:
        return None
    release = introduced_by(needed)
    return (f"{what} needs feature level {needed} (delayq {release}), but cluster {cluster} is finalized at level "
            f"{finalized.level}: upgrade every node to delayq {release} or later, then run `delayq upgrade finalize`")


class FeatureGate:
    """What a producer may write, by the cluster's finalized feature level.

    Example:
        >>> gate = FeatureGate(settings)
        >>> gate.require_level(2, "expires=")   # before the put is sent; raises if the cluster is below level 2
        >>> gate.close()                        # with the producer
    """

    def __init__(self, settings: Settings, timeout_s: float = READ_TIMEOUT_S):
        self._settings = settings
        self._timeout_s = timeout_s
        self._lock = threading.Lock()  # one connection, whichever thread asks first
        self._client: KazooClient | None = None
        self._finalized: FinalizedLevel | None = None  # the last reading
        # Set by the one-shot watch (kazoo's event thread) when the znode changed after the last reading.
        self._stale = False

    def require_level(self, level: int, what: str) -> None:
        """Let a request that needs feature ``level`` through, or refuse it before anything is sent.

        Args:
            level: the feature level the request needs (delayq/features.py).
            what: the request as the user names it (``"expires="``), for the message.

        Raises:
            LevelNotFinalized: the cluster is finalized below ``level``, or its record is damaged.
            UnavailableError: ZooKeeper did not answer within the timeout (the next request asks again).
            MissingExtra: kazoo, which reads the level, is not installed (``delayq[zookeeper]``).
        """
        if level <= UNRECORDED_LEVEL:
            return
        refusal = level_refusal(level, what, self._finalized_level(level, what), self._settings.cluster)
        if refusal is not None:
            raise LevelNotFinalized(refusal)

    def close(self) -> None:
        """Close the ZooKeeper client, if a request ever opened one."""
        with self._lock:
            client, self._client, self._finalized = self._client, None, None
        if client is not None:
            _stop(client)

    def _finalized_level(self, level: int, what: str) -> FinalizedLevel:
        with self._lock:
            seen = self._finalized
            if seen is not None and seen.level is not None and seen.level >= level:
                return seen  # levels only rise: no need to ask again
            if seen is None or self._stale:
                seen = self._finalized = self._read(level, what)
            return seen

    def _read(self, level: int, what: str) -> FinalizedLevel:
        """Read the ``features`` znode (connecting the first time) and watch it for its next change; the reading.

        Raises:
            UnavailableError: ZooKeeper did not answer (the next request connects again).
            MissingExtra: kazoo is not installed.
        """
        settings = self._settings
        require("zookeeper", f"{what} (feature level {level}, which the producer checks in ZooKeeper first)")
        from kazoo.client import KazooState
        from kazoo.exceptions import KazooException

        from delayq.election import Features, connect_for

        unanswered = (f"{what} needs feature level {level}, and whether cluster {settings.cluster} is finalized at "
                      "it is recorded in ZooKeeper, which did not answer")
        if self._client is None:
            try:
                self._client = connect_for(settings, timeout_s=self._timeout_s)
            except UnavailableError as err:
                raise UnavailableError(f"{unanswered}: {err}") from err
            # A new session has none of the old one's watches: what changed meanwhile went unseen.
            self._client.add_listener(lambda state: self._changed() if state == KazooState.LOST else None)
        self._stale = False
        try:
            return Features(self._client, settings.zk_root).read(lambda _event: self._changed())
        except KazooException as err:
            client, self._client = self._client, None
            _stop(client)
            raise UnavailableError(f"{unanswered}: {str(err) or type(err).__name__}") from err

    def _changed(self) -> None:
        # kazoo's event thread: one assignment, no lock; the next request that needs it reads again.
        self._stale = True


def _stop(client: KazooClient) -> None:
    client.stop()
    client.close()
