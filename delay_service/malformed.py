"""A shard master's share of the dead-letter ledger: malformed buffer records copied once per cluster.

Every node keeps the malformed records of its shards in its store (ingest); the master
copies those the ledger's mark has not passed to the dead-letter topic, in one
transaction that also moves the mark past them (dead_letters.py has the ledger). With
none waiting, it only moves the mark: at the start of a term, and every
LEDGER_REFRESH_S, so the ledger group's committed offsets never expire.
"""

from __future__ import annotations

import logging
import time

from confluent_kafka import TopicPartition

from delayq import wire
from delayq.election import Term
from delayq.settings import Settings

from . import stored
from .dead_letters import produce_copy
from .ingest import ShardFeed
from .transactions import ShardTransactions

# How often the master commits the ledger's mark when no malformed record comes: well within Kafka's
# offsets.retention.minutes (7 days), after which the group's offsets expire.
LEDGER_REFRESH_S = 6 * 3600.0
# Malformed records dead-lettered per transaction.
DEAD_LETTER_BATCH = 1000


class MalformedCopies:
    """The ledger's mark as this term last read or committed it, and the transactions that move it."""

    def __init__(self, settings: Settings, feed: ShardFeed, transactions: ShardTransactions,
                 log: logging.LoggerAdapter):
        self.settings = settings
        self.feed = feed
        self.store = feed.store
        self.metrics = feed.metrics
        self.transactions = transactions
        self.log = log
        self._handled: dict[int, int] | None = None
        self._refresh_at = 0.0

    def read_mark(self) -> None:
        """Read the ledger's mark: after init_transactions, no older master's transaction can still move it.

        Raises:
            KafkaException: the group coordinator did not answer.
        """
        self._handled = self.feed.ledger.handled(self.feed.partitions)
        self._refresh_at = 0.0

    @property
    def due(self) -> bool:
        """Malformed records wait, or the mark is due for its refresh."""
        return bool(self.store.malformed_count) or time.monotonic() >= self._refresh_at

    def copy(self, term: Term) -> None:
        """Dead-letter the malformed records no master has copied yet, and commit the mark past them.

        Raises:
            KafkaException: an error that may pass (the caller waits and tries again).
            LeadershipLost: the term ended before the commit.
        """
        handled = dict(self._handled or {})
        # The offsets first: every malformed record below them is in the list read after them.
        positions = self.store.offsets()
        entries = self.store.malformed(DEAD_LETTER_BATCH)
        marks = dict(handled)
        if len(entries) < DEAD_LETTER_BATCH:
            for partition, offset in positions.items():
                marks[partition] = max(marks.get(partition, 0), offset)
        todo = []
        for entry in entries:
            marks[entry.partition] = max(marks.get(entry.partition, 0), entry.offset + 1)
            if entry.offset >= handled.get(entry.partition, 0):
                todo.append(entry)
        self.transactions.begin()
        producer = self.transactions.open_producer()
        copies: list[tuple[str, str]] = []
        for entry in todo:
            source = f"{self.settings.buffer_topic}/{entry.partition}/{entry.offset}"
            try:
                record = stored.unpack_malformed(entry.payload)
            except stored.MalformedStoredEntry as err:
                self.log.error("malformed buffer record %s: %s; not dead-lettered (the original is still there)",
                               source, err)
                continue
            produce_copy(producer, self.settings.dead_letter_topic, record.key, record.value,
                         [*record.headers, (wire.DEAD_LETTER_REASON, record.reason.encode()),
                          (wire.DEAD_LETTER_SOURCE, source.encode())])
            copies.append((source, record.reason))
        producer.send_offsets_to_transaction(
            [TopicPartition(self.settings.buffer_topic, p, o) for p, o in sorted(marks.items())],
            self.feed.ledger.group_metadata(), 30)
        self.transactions.commit(term, [])
        self._handled = marks
        self._refresh_at = time.monotonic() + LEDGER_REFRESH_S
        self.store.forget_malformed(marks)
        self.metrics.malformed_waiting.set(self.store.malformed_count)
        for source, reason in copies:
            code = wire.Reason.of(reason)
            self.metrics.dead_lettered.labels(code.value if code else "unknown").inc()
            self.log.warning("buffer record %s is malformed, dead-lettered: %s", source, reason)
