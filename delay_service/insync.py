"""Whether the partitions a node writes can take acknowledged writes now: the node's view of Kafka's replication.

With fewer in-sync replicas than ``min.insync.replicas`` on a partition (two brokers of three
down, or a partition without a leader), Kafka refuses acknowledged writes there; librdkafka
retries them, so producers and masters wait and lose nothing, but nothing is delivered. A
node would look healthy meanwhile: its loops see only slow calls. The watch asks Kafka every
few seconds about the partitions this node's shards need written (their buffer partitions,
the dead-letter topic, and the ``__transaction_state`` partitions of their masters'
transactional ids) and gives the node the one line its /readyz says.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection

from confluent_kafka.admin import AdminClient

from delayq.settings import Settings

from .topics import (
    TRANSACTION_STATE_TOPIC,
    admin_client,
    coordinator_partition,
    insync_shortfalls,
    min_insync_or_one,
    shortfall_text,
)

log = logging.getLogger("delayq.node")

CHECK_S = 5.0
# How long an answer stands: a watch that could not ask Kafka since says nothing rather than something stale.
STALE_S = 3 * CHECK_S
# Topic configs change rarely: min.insync.replicas is read again this often.
CONFIG_REFRESH_S = 60.0


class InSyncWatch:
    """Asks Kafka every :data:`CHECK_S` whether the partitions this node's shards write have enough in-sync
    replicas; :attr:`problem` is the line saying where they have not.

    Args:
        settings: the node's.
        held: the buffer partitions and the transactional ids of the shards the node holds now.
    """

    def __init__(self, settings: Settings, held: Callable[[], tuple[Collection[int], Collection[str]]]):
        self.settings = settings
        self.held = held
        self._admin: AdminClient | None = None
        self._min_insync: dict[str, int] = {}
        self._configs_read_at = -CONFIG_REFRESH_S
        self._problem: str | None = None
        self._checked_at = -STALE_S

    @property
    def problem(self) -> str | None:
        if time.monotonic() - self._checked_at > STALE_S:
            return None
        return self._problem

    def run(self, stopping: threading.Event) -> None:
        while not stopping.wait(CHECK_S):
            self.check()

    def check(self) -> None:
        """Ask once; never raises (Kafka not answering is what the loops report themselves)."""
        try:
            if self._admin is None:
                self._admin = admin_client(self.settings)
            found = self._ask(self._admin)
        except Exception as err:  # a fresh client next time: one that failed may keep stale leaders
            log.debug("in-sync replicas not known: %s", err)
            self._admin = None
            return
        problem = shortfall_text(found) if found else None
        if problem != self._problem:
            if problem:
                log.warning("%s", problem)
            elif self._problem:
                log.info("every partition this node's shards write has enough in-sync replicas again")
        self._problem = problem
        self._checked_at = time.monotonic()

    def _ask(self, admin: AdminClient):
        partitions, transactional_ids = self.held()
        s = self.settings
        topics = [s.buffer_topic, s.dead_letter_topic, TRANSACTION_STATE_TOPIC]
        if time.monotonic() - self._configs_read_at > CONFIG_REFRESH_S:
            self._configs_read_at = time.monotonic()
            for topic in topics:  # a node may describe the buffer only: elsewhere leaders alone count
                self._min_insync[topic] = min_insync_or_one(admin, topic, 3.0)
        # Every topic's metadata: asking for one by name could make a broker create it.
        metadata = admin.list_topics(timeout=CHECK_S)
        state = metadata.topics.get(TRANSACTION_STATE_TOPIC)
        coordinators = ({coordinator_partition(t, len(state.partitions)) for t in transactional_ids}
                        if state is not None and state.error is None and state.partitions else set())
        return insync_shortfalls(admin, {s.buffer_topic: set(partitions), s.dead_letter_topic: None,
                                         TRANSACTION_STATE_TOPIC: coordinators}, CHECK_S, self._min_insync, metadata)
