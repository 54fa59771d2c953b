"""What a shard master prepares while the broker commits its last transaction.

A commit takes a round trip to the transaction coordinator and the partitions' leaders.
If the next message due is covered already (a backlog), the master picks and routes the
next batch meanwhile; if not, it waits until that message falls due and reads the end
offsets its cover needs then, so the cover's round trip overlaps the commit's instead of
following it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import wait as wait_for_future

from delayq.clock import now_ms
from delayq.store import TimeIndex

from .cover import Ends, ShardCover
from .routing import Outgoing, Router, Undeliverable

# While a commit lasts and messages are falling due, how often the master reads the buffer's
# end offsets for the next cover (one ListOffsets round trip each).
EARLY_ENDS_INTERVAL_S = 0.002

Batch = tuple[list[Outgoing], list[Undeliverable]]


class Lookahead:
    """The next batch (picked under the current cutoff) or the next cover's end offsets, made during a commit.

    Only the delivery loop takes them, and drops them whenever what they assumed stops
    holding: a new cover (a batch records the cutoff it was picked under), a repair, or a
    commit that failed (they were prepared with its ids out of the store's picks).
    """

    def __init__(self, store: TimeIndex, cover: ShardCover, router: Router, batch_size: int,
                 skip: Callable[[int], set[str]], log: logging.LoggerAdapter):
        self.store = store
        self.cover = cover
        self.router = router
        self.batch_size = batch_size
        self.skip = skip
        self.log = log
        self._batch: Batch | None = None
        self._ends: Ends | None = None

    def take(self) -> tuple[Batch | None, Ends | None]:
        """What was prepared, once; nothing is prepared after."""
        taken = self._batch, self._ends
        self.drop()
        return taken

    def drop(self) -> None:
        self._batch = self._ends = None

    def during(self, commit: Future[None]) -> None:
        """Use the time the broker takes to commit (the ids being committed are in flight already).

        Never raises: whatever fails here is done again by the next batch.
        """
        try:
            now = now_ms()
            skip = self.skip(now)
            upcoming = self.store.due(2**62, 1, skip=skip)
            if not upcoming:
                return
            due = upcoming[0].deliver_at_ms
            if due <= self.cover.cutoff.covers_ms:
                entries = self.cover.pick(self.store, self.batch_size, skip)
                if entries:
                    self._batch = self.router.route(entries, now)
                return
            while not commit.done():
                wait_ms = due - now_ms()
                if wait_ms > 0:
                    wait_for_future([commit], timeout=wait_ms / 1000)
                    continue
                # Read again while the commit lasts: the later the read, the more it covers (a
                # cover up to them waits for this commit's markers).
                self._ends = self.cover.read_ends()
                wait_for_future([commit], timeout=EARLY_ENDS_INTERVAL_S)
        except Exception as err:  # the commit's outcome decides; the next batch starts afresh
            self.log.info("could not prepare the next batch during a commit: %s", err)
            self.drop()
