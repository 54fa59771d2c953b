"""Whether the topics a node writes can take acknowledged writes now: the node's view of Kafka's replication.

With fewer in-sync replicas than ``min.insync.replicas`` on a partition (two brokers of three
down, or a partition without a leader), Kafka refuses acknowledged writes there; librdkafka
retries them, so producers and masters wait and lose nothing, but nothing is delivered. A
node would look healthy meanwhile: its loops see only slow calls. The watch asks Kafka every
few seconds and gives the node the one line its /readyz says.
"""

from __future__ import annotations

import logging
import threading
import time

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from delayq.settings import Settings

from .topics import TRANSACTION_STATE_TOPIC, admin_client, insync_shortfalls, shortfall_text

log = logging.getLogger("delayq.node")

CHECK_S = 5.0
# How long an answer stands: a watch that could not ask Kafka since says nothing rather than something stale.
STALE_S = 3 * CHECK_S


class InSyncWatch:
    """Asks Kafka every :data:`CHECK_S` whether the buffer, the dead-letter topic and Kafka's transaction
    state have enough in-sync replicas; :attr:`problem` is the line saying where they have not."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.topics = [settings.buffer_topic, settings.dead_letter_topic, TRANSACTION_STATE_TOPIC]
        self._admin: AdminClient | None = None
        self._problem: str | None = None
        self._checked_at = 0.0

    @property
    def problem(self) -> str | None:
        if time.monotonic() - self._checked_at > STALE_S:
            return None
        return self._problem

    def run(self, stopping: threading.Event) -> None:
        while not stopping.is_set():
            self.check()
            stopping.wait(CHECK_S)

    def check(self) -> None:
        if self._admin is None:
            self._admin = admin_client(self.settings)
        try:
            found = insync_shortfalls(self._admin, self.topics, timeout_s=CHECK_S)
        except KafkaException:
            # Kafka not answering is what the loops report themselves; a fresh client next time (one that
            # failed may keep stale leaders after a broker restart).
            self._admin = None
            return
        problem = shortfall_text(found) if found else None
        if problem != self._problem:
            if problem:
                log.warning("%s", problem)
            elif self._problem:
                log.info("every partition delayq writes has enough in-sync replicas again")
        self._problem = problem
        self._checked_at = time.monotonic()
