"""The buffer and dead-letter topics: create them right, check existing ones, read their identity."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass

from confluent_kafka import IsolationLevel, KafkaError, KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, OffsetSpec

from delayq.errors import ConfigurationError, UnavailableError
from delayq.settings import Settings

DEAD_LETTER_RETENTION_MS = 30 * 24 * 3600 * 1000


def buffer_config(settings: Settings) -> dict[str, str]:
    return {
        "cleanup.policy": "compact",
        # Puts stay uncompacted at least this long, so reconciliation can see them.
        "min.compaction.lag.ms": str(settings.min_compaction_lag_ms),
        # How long a done/cancel tombstone survives compaction; nodes away longer rebuild.
        "delete.retention.ms": str(settings.delete_retention_ms),
    }


def dead_letter_config() -> dict[str, str]:
    return {"cleanup.policy": "delete", "retention.ms": str(DEAD_LETTER_RETENTION_MS)}


@dataclass
class TopicCheck:
    topic: str
    created: bool
    differences: list[str]


def admin_client(settings: Settings) -> AdminClient:
    return AdminClient(settings.kafka_conf())


def ensure_topics(settings: Settings, admin: AdminClient | None = None) -> list[TopicCheck]:
    """Create the buffer and dead-letter topics, or check existing ones; return what differs.

    Raises:
        UnavailableError: Kafka did not answer.
        KafkaException: the cluster refused to create or describe a topic.
    """
    admin = admin or admin_client(settings)
    wanted = [
        (settings.buffer_topic, settings.buffer_partitions, buffer_config(settings)),
        (settings.dead_letter_topic, 1, dead_letter_config()),
    ]
    try:
        existing = admin.list_topics(timeout=15).topics
    except KafkaException as err:
        raise UnavailableError(f"Kafka at {settings.bootstrap_servers} did not answer ({err.args[0].str()}): "
                               "is it running, and is DELAYQ_BOOTSTRAP_SERVERS right?") from err
    results = []
    for topic, partitions, config in wanted:
        if topic not in existing:
            futures = admin.create_topics([NewTopic(topic, partitions, settings.buffer_replication_factor,
                                                    config=config)])
            try:
                futures[topic].result(30)
                _wait_until_served(admin, topic, partitions, timeout_s=60.0)
                results.append(TopicCheck(topic, True, []))
                continue
            except KafkaException as err:
                if err.args[0].name() != "TOPIC_ALREADY_EXISTS":
                    raise
                existing = admin.list_topics(timeout=15).topics
        results.append(TopicCheck(topic, False, _differences(admin, topic, partitions, config, existing[topic])))
    return results


def _wait_until_served(admin: AdminClient, topic: str, partitions: int, timeout_s: float) -> None:
    """Wait until the brokers' metadata lists ``topic`` with a leader for each partition.

    CreateTopics answers once the controller has created the topic; a broker busy
    loading many partitions (just restarted) can take seconds more to serve it, and a
    node started meanwhile would find no buffer topic.

    Raises:
        UnavailableError: the topic is still not served after ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            metadata = admin.list_topics(topic, timeout=10).topics.get(topic)
        except KafkaException:
            metadata = None
        if (metadata is not None and metadata.error is None and len(metadata.partitions) == partitions
                and all(p.leader >= 0 for p in metadata.partitions.values())):
            return
        if time.monotonic() >= deadline:
            raise UnavailableError(f"topic {topic} was created but no broker serves all its {partitions} partitions "
                                   f"after {timeout_s:.0f}s: check the brokers' logs, then run `delayq init` again")
        time.sleep(0.2)


def _differences(admin: AdminClient, topic: str, partitions: int, config: dict[str, str], metadata) -> list[str]:
    found = []
    if len(metadata.partitions) != partitions:
        found.append(f"partitions: {len(metadata.partitions)}, configured {partitions} "
                     "(delayq keeps working; DELAYQ_BUFFER_PARTITIONS only applies at creation)")
    actual = describe_config(admin, topic)
    for key, value in config.items():
        if actual.get(key) != value:
            found.append(f"{key}: {actual.get(key)}, configured {value}")
    return found


def describe_config(admin: AdminClient, topic: str) -> dict[str, str]:
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    entries = admin.describe_configs([resource])[resource].result(30)
    return {name: entry.value for name, entry in entries.items()}


def buffer_partition_count(settings: Settings, admin: AdminClient) -> int | None:
    """The buffer topic's partition count; None if it does not exist.

    Raises:
        UnavailableError: Kafka did not answer.
    """
    try:
        # All topics, not the one by name: a broker with auto.create.topics.enable (Kafka's default) would
        # create a topic asked for by name, with its default partition count.
        metadata = admin.list_topics(timeout=15).topics.get(settings.buffer_topic)
    except KafkaException as err:
        raise UnavailableError(f"Kafka at {settings.bootstrap_servers} did not answer ({err.args[0].str()}): "
                               "is it running, and is DELAYQ_BOOTSTRAP_SERVERS right?") from err
    if metadata is None or metadata.error is not None or not metadata.partitions:
        return None
    return len(metadata.partitions)


@dataclass(frozen=True)
class BufferInfo:
    """What a node must know about the buffer topic before trusting its store."""

    topic_id: str
    partitions: list[int]
    delete_retention_ms: int
    min_compaction_lag_ms: int


def buffer_info(settings: Settings, admin: AdminClient) -> BufferInfo:
    """Raises:
        ConfigurationError: the buffer topic does not exist (run `delayq init`).
        UnavailableError: Kafka did not answer.
    """
    topic = settings.buffer_topic
    try:
        description = admin.describe_topics(TopicCollection([topic]), request_timeout=15)[topic].result(30)
    except KafkaException as err:
        error = err.args[0]
        if error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            raise ConfigurationError(f"buffer topic {topic} does not exist on {settings.bootstrap_servers}: "
                                     "create it with `delayq init`") from err
        raise UnavailableError(f"Kafka at {settings.bootstrap_servers} did not describe the buffer topic "
                               f"{topic} ({error.str()}): is it running, and is DELAYQ_BOOTSTRAP_SERVERS "
                               "right?") from err
    config = describe_config(admin, topic)
    return BufferInfo(str(description.topic_id), sorted(p.id for p in description.partitions),
                      int(config.get("delete.retention.ms", "86400000")), int(config.get("min.compaction.lag.ms", "0")))


def committed_end_offsets(admin: AdminClient, topic: str, partitions: list[int],
                          timeout_s: float = 15.0, *, committed: bool = True) -> dict[int, int]:
    """The last stable offset of each partition: where a read_committed reader is caught up.

    With ``committed=False``, the high watermark: the end of every acknowledged write,
    open transactions included.
    """
    return _offsets(_ask_end_offsets(admin, topic, partitions, timeout_s, committed))


def _ask_end_offsets(admin: AdminClient, topic: str, partitions: list[int], timeout_s: float,
                     committed: bool) -> dict[TopicPartition, Future]:
    requests = {TopicPartition(topic, p): OffsetSpec.latest() for p in partitions}
    isolation = IsolationLevel.READ_COMMITTED if committed else IsolationLevel.READ_UNCOMMITTED
    return admin.list_offsets(requests, isolation_level=isolation, request_timeout=timeout_s)


def _offsets(futures: dict[TopicPartition, Future]) -> dict[int, int]:
    return {tp.partition: future.result().offset for tp, future in futures.items()}


class EndOffsets:
    """Reads the buffer's end offsets (last stable or high watermark), replacing its AdminClient after any failure.

    After a broker restart, librdkafka's admin client can keep a partition's old leader
    epoch and be answered FENCED_LEADER_EPOCH on every ListOffsets from then on; a new
    client asks for fresh metadata. Thread-safe: ingest and delivery both read.
    """

    def __init__(self, settings: Settings, partitions: list[int], admin: AdminClient | None = None):
        self.settings = settings
        self.partitions = partitions
        self._admin = admin or admin_client(settings)
        self._lock = threading.Lock()

    def read(self, timeout_s: float = 15.0, *, committed: bool = True,
             partitions: list[int] | None = None) -> dict[int, int]:
        """Partition -> last stable offset of the buffer (``committed=False``: high watermark).

        Of ``partitions`` if given (a shard's), else of every partition.

        Raises:
            KafkaException: Kafka did not answer; the next call starts from a new client.
        """
        with self._lock:
            admin = self._admin
        asked = self.partitions if partitions is None else partitions
        if not asked:
            return {}
        try:
            ends = _offsets(_ask_end_offsets(admin, self.settings.buffer_topic, asked, timeout_s, committed))
            unknown = sorted(p for p, offset in ends.items() if offset < 0)
            if unknown:
                # librdkafka reports a partition it got no answer for as offset -1001 (invalid)
                # rather than as an error: that is no end offset to cover anything with.
                raise KafkaException(KafkaError(KafkaError.OFFSET_NOT_AVAILABLE,
                                                f"no end offset for buffer partitions {unknown}"))
            return ends
        except KafkaException:
            with self._lock:
                if self._admin is admin:
                    self._admin = admin_client(self.settings)
            raise
