"""The buffer and dead-letter topics: create them right, check existing ones, read their identity."""

from __future__ import annotations

import threading
import time
from collections.abc import Collection, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field

from confluent_kafka import IsolationLevel, KafkaError, KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, OffsetSpec

from delayq.errors import ConfigurationError, UnavailableError
from delayq.settings import Settings

DEAD_LETTER_RETENTION_MS = 30 * 24 * 3600 * 1000
# How often the master's producer and ingest's consumer read the cluster's metadata, whatever else happens. A
# broker lost stays its partitions' leader in the metadata until the controllers fence it (seconds later), and
# librdkafka, which only asks again quickly while a leader is unknown, then waited for its 5-minute refresh or
# an error to learn the new one: commits and reads stayed behind a plain producer by seconds
# (test_replicated_kafka). A metadata request a second per client costs the brokers nothing.
LEADER_REFRESH_CONF = {"topic.metadata.refresh.interval.ms": 1000}


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


@dataclass(frozen=True)
class Replication:
    """How a delayq topic is replicated: its replication factor and ``min.insync.replicas``."""

    factor: int
    min_insync: int


@dataclass(frozen=True)
class TopicFacts:
    """What ``delayq init`` found of a topic (the smallest replica count over its partitions)."""

    partitions: int
    replication_factor: int
    min_insync_replicas: int
    cleanup_policy: str
    min_compaction_lag_ms: int | None

    def describe(self) -> str:
        lag = "" if self.min_compaction_lag_ms is None else f", min.compaction.lag.ms {self.min_compaction_lag_ms}"
        partitions = f"{self.partitions} partition{'' if self.partitions == 1 else 's'}"
        return (f"{partitions}, replication factor {self.replication_factor}, min.insync.replicas "
                f"{self.min_insync_replicas}, cleanup.policy {self.cleanup_policy}{lag}")


@dataclass
class TopicCheck:
    topic: str
    created: bool
    differences: list[str]
    # What the topic is now (None only where describing it failed), and one line per risk it runs.
    found: TopicFacts | None = None
    warnings: list[str] = field(default_factory=list)


def admin_client(settings: Settings) -> AdminClient:
    return AdminClient(settings.kafka_conf())


def replication_for(settings: Settings, brokers: int) -> Replication:
    """The replication delayq's topics get on brokers: the settings', else min(brokers, 3) and one less.

    Raises:
        ConfigurationError: the replication factor is above the broker count, or min.insync.replicas above it.
    """
    factor = settings.buffer_replication_factor or min(brokers, 3)
    if factor > brokers:
        raise ConfigurationError(
            f"buffer replication factor {factor} is more than the {brokers} broker{'s' if brokers > 1 else ''} of "
            f"the Kafka cluster at {settings.bootstrap_servers}: choose at most {brokers} "
            "(--replication-factor / DELAYQ_BUFFER_REPLICATION_FACTOR), or add brokers")
    min_insync = settings.buffer_min_insync_replicas or max(1, factor - 1)
    if min_insync > factor:
        raise ConfigurationError(
            f"buffer min.insync.replicas {min_insync} is more than its replication factor {factor}: no write "
            "could ever be acknowledged; choose at most the replication factor (--min-insync-replicas / "
            "DELAYQ_BUFFER_MIN_INSYNC_REPLICAS), usually one less")
    return Replication(factor, min_insync)


def replication_warnings(topic: str, facts: TopicFacts, brokers: int) -> list[str]:
    """One line per way ``topic`` can lose acknowledged writes on a cluster of ``brokers`` (none on one broker)."""
    if brokers < 2:
        return []
    if facts.replication_factor == 1:
        return [f"{topic} has one replica on a cluster of {brokers} brokers: losing the broker that holds a partition "
                "loses its pending messages; raise its replication factor (kafka-reassign-partitions) to "
                f"{min(brokers, 3)}"]
    if facts.min_insync_replicas == 1 and brokers >= 3:
        return [f"{topic} has min.insync.replicas 1: a write acknowledged by its leader alone is lost if that broker "
                f"dies before a follower copies it; set it to {facts.replication_factor - 1} (kafka-configs --alter "
                f"--entity-type topics --entity-name {topic} --add-config min.insync.replicas="
                f"{facts.replication_factor - 1})"]
    return []


def ensure_topics(settings: Settings, admin: AdminClient | None = None) -> list[TopicCheck]:
    """Create the buffer and dead-letter topics, or check existing ones; return what differs.

    Raises:
        UnavailableError: Kafka did not answer.
        KafkaException: the cluster refused to create or describe a topic.
    """
    admin = admin or admin_client(settings)
    try:
        metadata = admin.list_topics(timeout=15)
    except KafkaException as err:
        raise UnavailableError(f"Kafka at {settings.bootstrap_servers} did not answer ({err.args[0].str()}): "
                               "is it running, and is DELAYQ_BOOTSTRAP_SERVERS right?") from err
    existing, live = metadata.topics, len(metadata.brokers)
    # The cluster's size: the brokers up, and any that hold a replica while down (one broker restarting
    # does not make a cluster of three a cluster of two).
    brokers = len(set(metadata.brokers) | {r for t in existing.values() for p in t.partitions.values()
                                           for r in p.replicas})
    results = []
    for topic, partitions, config in ((settings.buffer_topic, settings.buffer_partitions, buffer_config(settings)),
                                      (settings.dead_letter_topic, 1, dead_letter_config())):
        created = False
        if topic not in existing:
            replication = replication_for(settings, brokers)
            if replication.factor > live:
                raise UnavailableError(
                    f"only {live} of the Kafka cluster's {brokers} brokers are up at {settings.bootstrap_servers}: "
                    f"{topic} cannot be created with {replication.factor} replicas now; start the others and run "
                    "`delayq init` again, or choose fewer (--replication-factor)")
            config = {**config, "min.insync.replicas": str(replication.min_insync)}
            futures = admin.create_topics([NewTopic(topic, partitions, replication.factor, config=config)])
            try:
                futures[topic].result(30)
                wait_until_served(admin, topic, partitions, timeout_s=60.0)
                created = True
            except KafkaException as err:
                if err.args[0].name() != "TOPIC_ALREADY_EXISTS":
                    raise
            existing = {**existing, topic: _served(admin, topic, timeout_s=60.0)}
        facts = topic_facts(admin, topic, existing[topic])
        differences = [] if created else _differences(settings, partitions, config, facts, describe_config(
            admin, topic))
        results.append(TopicCheck(topic, created, differences, facts, replication_warnings(topic, facts, brokers)))
    return results


def _served(admin: AdminClient, topic: str, timeout_s: float):
    """``topic``'s metadata once the broker answering knows it (another may not yet, just after its creation)."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = admin.list_topics(timeout=15).topics.get(topic)
        if found is not None and found.error is None and found.partitions:
            return found
        if time.monotonic() >= deadline:
            raise UnavailableError(f"topic {topic} exists but no broker describes it after {timeout_s:.0f}s: check "
                                   "the brokers' logs, then run `delayq init` again")
        time.sleep(0.2)


# Kafka's own topic whose partitions hold the transactions' state: a master's commits need a leader and
# min.insync.replicas (transaction.state.log.min.isr) of its replicas in sync there, as in the buffer.
TRANSACTION_STATE_TOPIC = "__transaction_state"


@dataclass(frozen=True)
class InSyncShortfall:
    """Partitions of ``topic`` with fewer replicas in sync (or no leader) than its min.insync.replicas."""

    topic: str
    partitions: tuple[int, ...]
    in_sync: int  # the fewest in sync among them (0: no leader)
    min_insync: int

    def describe(self) -> str:
        which = ",".join(map(str, self.partitions))
        return (f"{self.topic} partition{'s' if len(self.partitions) > 1 else ''} {which} "
                f"({self.in_sync} in sync, min.insync.replicas {self.min_insync})")


def insync_shortfalls(admin: AdminClient, topics: Mapping[str, Collection[int] | None], timeout_s: float = 5.0,
                      min_insync: Mapping[str, int] | None = None, metadata=None) -> list[InSyncShortfall]:
    """Which partitions of ``topics`` (topic -> the partitions to look at, None: all) cannot take an acknowledged
    write now: fewer in-sync replicas than min.insync.replicas, or no leader. Topics that do not exist (or that
    this principal may not see) are left out. ``min_insync`` gives a topic's, else it is described (1 where that
    is refused: only a missing leader counts then). ``metadata``: a list_topics() answer just read, else one is
    read (of every topic: asking for one by name could make a broker create it).

    Raises:
        KafkaException: Kafka did not answer within ``timeout_s``.
    """
    found = (metadata or admin.list_topics(timeout=timeout_s)).topics
    result = []
    for topic, wanted in topics.items():
        metadata = found.get(topic)
        if metadata is None or metadata.error is not None:
            continue
        needed = (min_insync or {}).get(topic)
        if needed is None:
            needed = min_insync_or_one(admin, topic, timeout_s)
        short = {p.id: (len(p.isrs) if p.leader >= 0 else 0) for p in metadata.partitions.values()
                 if (wanted is None or p.id in wanted) and (p.leader < 0 or len(p.isrs) < needed)}
        if short:
            result.append(InSyncShortfall(topic, tuple(sorted(short)), min(short.values()), needed))
    return result


def min_insync_replicas(admin: AdminClient, topic: str, timeout_s: float = 15.0) -> int:
    """``topic``'s min.insync.replicas (``__transaction_state``'s is the brokers' transaction.state.log.min.isr).

    Raises:
        KafkaException: Kafka did not answer, or refused (no DESCRIBE_CONFIGS on the topic).
    """
    return int(describe_config(admin, topic, timeout_s).get("min.insync.replicas") or 1)


def min_insync_or_one(admin: AdminClient, topic: str, timeout_s: float) -> int:
    """:func:`min_insync_replicas`, or 1 where it cannot be read (refused, timed out): leaders alone count then."""
    try:
        return min_insync_replicas(admin, topic, timeout_s)
    except Exception:
        return 1


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode`` of ``text``: a signed 32-bit int over its UTF-16 code units."""
    value = 0
    data = text.encode("utf-16-be")
    for index in range(0, len(data), 2):
        value = (31 * value + int.from_bytes(data[index:index + 2], "big")) & 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def coordinator_partition(transactional_id: str, partitions: int) -> int:
    """The ``__transaction_state`` partition holding ``transactional_id``: its leader is the id's coordinator.

    Kafka's ``Utils.abs(transactionalId.hashCode) % transaction.state.log.num.partitions``, where
    ``Utils.abs`` takes ``Integer.MIN_VALUE`` to 0.
    """
    hashed = java_string_hash(transactional_id)
    return (0 if hashed == -(1 << 31) else abs(hashed)) % partitions


def shortfall_text(shortfalls: list[InSyncShortfall]) -> str:
    """One line: which partitions have too few in-sync replicas, and what happens meanwhile."""
    where = "; ".join(shortfall.describe() for shortfall in shortfalls)
    return (f"Kafka has fewer in-sync replicas than min.insync.replicas on {where}: writes there wait "
            "(none fails, none is lost) until enough brokers are back")


def topic_facts(admin: AdminClient, topic: str, metadata, timeout_s: float = 30.0) -> TopicFacts:
    # Just created, a topic may be unknown for a moment to the broker that answers describe_configs.
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            config = describe_config(admin, topic)
            break
        except KafkaException as err:
            if err.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART or time.monotonic() >= deadline:
                raise
            time.sleep(0.2)
    lag = config.get("min.compaction.lag.ms")
    return TopicFacts(
        partitions=len(metadata.partitions),
        replication_factor=min((len(p.replicas) for p in metadata.partitions.values()), default=0),
        min_insync_replicas=int(config.get("min.insync.replicas", "1")),
        cleanup_policy=config.get("cleanup.policy", "?"),
        min_compaction_lag_ms=int(lag) if lag is not None and "compact" in config.get("cleanup.policy", "") else None,
    )


def wait_until_served(admin: AdminClient, topic: str, partitions: int, timeout_s: float) -> None:
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


def _differences(settings: Settings, partitions: int, config: dict[str, str], facts: TopicFacts,
                 actual: dict[str, str]) -> list[str]:
    """What an existing topic has other than the settings ask: a replication not asked for explicitly is
    judged against the topic's own factor (its min ISR one less), not against the cluster's size now."""
    found = []
    if facts.partitions != partitions:
        found.append(f"partitions: {facts.partitions}, configured {partitions} "
                     "(delayq keeps working; DELAYQ_BUFFER_PARTITIONS only applies at creation)")
    factor = settings.buffer_replication_factor or facts.replication_factor
    if facts.replication_factor != factor:
        found.append(f"replication factor: {facts.replication_factor}, configured {factor} "
                     "(delayq keeps working; change it with kafka-reassign-partitions)")
    min_insync = settings.buffer_min_insync_replicas or max(1, factor - 1)
    for key, value in {**config, "min.insync.replicas": str(min_insync)}.items():
        if actual.get(key) != value:
            found.append(f"{key}: {actual.get(key)}, configured {value}")
    return found


def describe_config(admin: AdminClient, topic: str, timeout_s: float = 30.0) -> dict[str, str]:
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    entries = admin.describe_configs([resource], request_timeout=timeout_s)[resource].result(timeout_s + 5)
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


# How long one read of the end offsets may wait once a read failed, until one succeeds. A read sent to a broker just
# lost (the metadata names it leader until the controllers fence it) waits for its whole timeout, and the next one,
# through a new client with the new leaders, only starts then: reads this short find the new leaders within half a
# second of the move, where the callers' own timeouts (2 and 5 s) kept covers and ingest behind Kafka for that long.
FAILING_CALL_S = 0.5


class EndOffsets:
    """Reads the buffer's end offsets (last stable or high watermark), replacing its AdminClient after any failure.

    After a broker restart, librdkafka's admin client can keep a partition's old leader
    epoch and be answered FENCED_LEADER_EPOCH on every ListOffsets from then on; a new
    client asks for fresh metadata. After a failure, reads wait at most FAILING_CALL_S until
    one succeeds. Thread-safe: ingest and delivery both read.
    """

    def __init__(self, settings: Settings, partitions: list[int], admin: AdminClient | None = None):
        self.settings = settings
        self.partitions = partitions
        self._admin = admin or admin_client(settings)
        self._lock = threading.Lock()
        self.failing = False

    def read(self, timeout_s: float = 15.0, *, committed: bool = True,
             partitions: list[int] | None = None) -> dict[int, int]:
        """Partition -> last stable offset of the buffer (``committed=False``: high watermark).

        Of ``partitions`` if given (a shard's), else of every partition.

        Raises:
            KafkaException: Kafka did not answer; the next call starts from a new client.
        """
        return self.ask(timeout_s, committed=committed, partitions=partitions).result()

    def ask(self, timeout_s: float = 15.0, *, committed: bool = True,
            partitions: list[int] | None = None) -> AskedEnds:
        """Ask for the end offsets :meth:`read` returns, without waiting for the answer.

        Raises:
            KafkaException: the request could not be sent; the next call starts from a new client.
        """
        with self._lock:
            admin = self._admin
            if self.failing:
                timeout_s = min(timeout_s, FAILING_CALL_S)
        asked = self.partitions if partitions is None else partitions
        try:
            futures = _ask_end_offsets(admin, self.settings.buffer_topic, asked, timeout_s, committed) if asked else {}
        except KafkaException:
            self._replace(admin)
            raise
        return AskedEnds(self, admin, futures)

    def _replace(self, failed: AdminClient) -> None:
        with self._lock:
            self.failing = True
            if self._admin is failed:
                self._admin = admin_client(self.settings)

    def _answered(self) -> None:
        with self._lock:
            self.failing = False


class AskedEnds:
    """End offsets asked for (:meth:`EndOffsets.ask`): :meth:`done` once Kafka answered or the request timed out."""

    def __init__(self, owner: EndOffsets, admin: AdminClient, futures: dict[TopicPartition, Future]):
        self._owner, self._admin, self._futures = owner, admin, futures

    def done(self) -> bool:
        return all(future.done() for future in self._futures.values())

    def result(self) -> dict[int, int]:
        """Partition -> end offset (waits for the answer).

        Raises:
            KafkaException: Kafka did not answer for every partition; the owner's next request
                starts from a new client.
        """
        try:
            ends = _offsets(self._futures)
            unknown = sorted(p for p, offset in ends.items() if offset < 0)
            if unknown:
                # librdkafka reports a partition it got no answer for as offset -1001 (invalid)
                # rather than as an error: that is no end offset to cover anything with.
                raise KafkaException(KafkaError(KafkaError.OFFSET_NOT_AVAILABLE,
                                                f"no end offset for buffer partitions {unknown}"))
            self._owner._answered()
            return ends
        except KafkaException:
            self._owner._replace(self._admin)
            raise
