"""Shadowed ids: a buffer whose newest record of an id says something other than the store, fixed before compaction.

Compaction keeps only an id's newest buffer record. When a reschedule raced a `done` (the
`done` of an older version landed after the newer put), or a write was appended twice,
that newest record would rebuild a different store than the one every node has now. The
master writes the right record last (TimeIndex.shadowed has the rules): a pending id gets
its stored put again (``restores=`` its version), a copy of a message no longer pending
gets a `done` of the copy's version.
"""

from __future__ import annotations

import logging

from delayq.election import Term
from delayq.store import TimeIndex

from . import stored
from .transactions import ShardTransactions


class ShadowRepair:
    """One transaction of repairs; the ids are in flight until ingest reads the writes back."""

    def __init__(self, store: TimeIndex, transactions: ShardTransactions, unreadable: set[str],
                 log: logging.LoggerAdapter):
        self.store = store
        self.transactions = transactions
        self.unreadable = unreadable  # ids whose stored form cannot be read: never picked (the router's set)
        self.log = log

    def repair(self, term: Term, shadowed: dict[str, bytes | None], cutoffs: dict[int, int]) -> None:
        """Write each shadowed id's right record; ``cutoffs`` go into the `done`s (the cover's now).

        Raises:
            KafkaException: the transaction failed (the caller decides).
            LeadershipLost: the term ended before the commit.
        """
        writes: list[tuple[str, stored.PendingMessage, bool]] = []
        for delay_id, copy in shadowed.items():
            value = copy
            if value is None:
                entry = self.store.get(delay_id)
                if entry is None:
                    continue  # settled since the marks were read
                value = entry.payload
            try:
                writes.append((delay_id, stored.unpack(value), copy is None))
            except stored.MalformedStoredEntry as err:
                self.log.error("message %s: %s; not repairing it", delay_id, err)
                self.unreadable.add(delay_id)
        if not writes:
            return
        self.transactions.begin()
        for delay_id, pending, put_again in writes:
            if put_again:
                self.transactions.write_put(delay_id, pending)
            else:
                self.transactions.write_done(delay_id, pending, cutoffs.get(pending.buffer_partition, 0))
        self.transactions.commit(term, [delay_id for delay_id, _, _ in writes])
        self.log.info("repaired %d shadowed ids in the buffer (a reschedule raced a done, or a write was appended "
                      "twice)", len(writes))
