"""Continuous reconciliation: ``delayq reconcile --follow``, the batch job's judgement as it happens.

A Structured Streaming query reads the buffer topic, the target topics and the
dead-letter topic as one Kafka source and keeps, per delay id, every record of it that
counts (Spark's state store: RocksDB, in the checkpoint folder). Each micro-batch hands
the *whole* history of every id it touched to the batch job's own rules
(:func:`.job.per_version`, :func:`.job.per_id`, :func:`.job.judge`): there is one
definition of exactly-once, and the streaming job judges an id exactly as the batch job
would over the same records (tests/unit/spark/test_reconcile_rules.py runs every rule
through both).

When each kind of finding is certain:

* a duplicate, an early delivery, an ignored cancel or reschedule, a reordered write and
  an unexpected delivery: in the micro-batch that read its evidence (a delivery is always
  appended after the put it delivers, and every micro-batch reads every partition to its end,
  so no put is read later than its deliveries);
* a missing message: once its due time plus the grace (``--grace``, the lateness the job
  tolerates: its watermark) has passed with no delivery. Each id holds a processing-time
  timeout at that moment; the micro-batch it fires in judges the id with everything read
  up to that batch's time, and the id is missing if its latest version was neither
  delivered nor dead-lettered by then.

An id's records are kept ``--retain`` past its due time plus the grace, or past its last
record if later, so a duplicate delivered that long after is still judged a duplicate;
later, the id is forgotten (its state removed) and a delivery of it would be judged a
delivery of an id unknown to the job: unexpected, still reported.

Findings go to a compacted Kafka topic (``delayq-<cluster>-reconcile-findings``), one record per
(kind, id, version) with its evidence, written in one Kafka transaction per micro-batch:
the findings already there are read back when the job starts, so a micro-batch run again
after a crash (Spark replays the batch its checkpoint had not committed) reports nothing
twice, and one that crashed before its transaction committed reports what it found when
it runs again. The same counts are Prometheus metrics (``delayq_reconcile_*``).
"""

from __future__ import annotations

import json
import logging
import math
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from delayq.signals import StopSignals

from .job import dead_letter_rows, delivery_rows, judge, per_id, per_version, topics_with_the_buffer
from .options import MAVEN_CENTRAL, ReconcileOptions
from .records import PUT
from .report import ANOMALY_FLAGS
from .session import STEP_JAR, ReconcileError, kafka_source_options, spark_session

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from delayq import Settings

log = logging.getLogger("delayq.spark.follow")

# Which side of the union a history row came from.
BUFFER_SIDE, DELIVERED_SIDE, DEAD_LETTER_SIDE = 0, 1, 2
SIDE_NAMES = {BUFFER_SIDE: "buffer", DELIVERED_SIDE: "delivered", DEAD_LETTER_SIDE: "dead_letter"}
# One record of an id that counts, whichever side: what per_version reads from each (``topic``: a put's
# target, a delivery's topic, a dead letter's put topic; ``written``: 0 but for buffer records).
HISTORY_COLUMNS = ("side", "kind", "offset", "ts", "due", "topic", "restores", "version", "cutoff", "follows",
                   "follows_cutoff", "written", "epoch")
HISTORY_SCHEMA = ("id STRING, side INT, kind INT, offset BIGINT, ts BIGINT, due BIGINT, topic STRING, "
                  "restores BIGINT, version BIGINT, cutoff BIGINT, follows BIGINT, follows_cutoff BIGINT, "
                  "written BIGINT, epoch BIGINT")
# What the stateful step reads per record: the record as JSON (built in the JVM: ``to_json``, nulls left out)
# and the few fields the step looks at itself: the id's latest put, how many puts, the versions delivered.
STEP_INPUT = ("id", "record", "side", "kind", "offset", "due", "version")
# What it emits per touched id: its whole history as a JSON array of records (the history columns), from
# which record on they are new in this micro-batch, the micro-batch's time (Spark's batch timestamp:
# everything appended before it has been read), and whether the history can hold a finding now (``judge``;
# false: counted read, not judged). One row per id, parsed back in the JVM (``from_json``).
EMITTED_SCHEMA = "id STRING, records STRING, fresh_from INT, judged_at BIGINT, judge BOOLEAN"
# A window wide enough for every due time: the continuous job judges each id whatever its due time.
FOREVER_MS = 253_402_300_799_000  # 9999-12-31T23:59:59Z
# What each finding kind is flagged by in the judged table: the report's anomaly kinds (a duplicate is
# "duplicated" here, as the metric's label says what happened to the message) and the undeliverable.
FINDING_FLAGS = {("duplicated" if kind == "duplicates" else kind): flag for kind, flag in ANOMALY_FLAGS.items()}
FINDING_FLAGS["undeliverable"] = "is_undeliverable"
KIND_HEADER = "delayq-reconcile-kind"
BATCH_HEADER = "delayq-reconcile-batch"
# Every delayq cluster's dead-letter and findings topics (their default names).
DEAD_LETTER_TOPIC_PATTERN = "delayq-*-dead-letter"
FINDINGS_TOPIC_PATTERN = "delayq-*-reconcile-findings"
STATE_STORE = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


@dataclass(frozen=True)
class FollowOptions:
    """One continuous reconciliation.

    Args:
        checkpoint: the folder of Spark's checkpoint (offsets, the ids' state); the job restarts from it.
        rules: the grace, tolerances and ack grace the judgement uses (its window is ignored: each id is judged
            whatever its due time, and expected once its due time plus the grace has passed).
        findings_topic: where findings go; None: ``<cluster>-reconcile-findings``.
        metrics_port: Prometheus metrics at ``http://<http_host>:<port>/metrics``; 0: none.
        trigger_s: seconds between micro-batches.
        retain_ms: how long an id is kept past its due time plus the grace (or its last record, if later).
        topics: target topics; None: every topic the cluster may deliver to (``target_topics``).
    """

    checkpoint: Path
    rules: ReconcileOptions
    findings_topic: str | None = None
    metrics_port: int = 9464
    trigger_s: float = 10.0
    retain_ms: int = 3_600_000
    topics: tuple[str, ...] | None = None
    master: str | None = "local[*]"
    maven_repository: str = MAVEN_CENTRAL
    spark_conf: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.checkpoint, (str, Path)):
            raise TypeError(f"checkpoint must be a folder path, not {type(self.checkpoint).__name__}")
        object.__setattr__(self, "checkpoint", Path(self.checkpoint))
        if isinstance(self.metrics_port, bool) or not isinstance(self.metrics_port, int):
            raise TypeError(f"metrics_port must be an int, not {type(self.metrics_port).__name__}")
        if not 0 <= self.metrics_port <= 65_535:
            raise ValueError(f"metrics port {self.metrics_port} is no TCP port: give 1-65535, or 0 for none")
        if isinstance(self.trigger_s, bool) or not isinstance(self.trigger_s, (int, float)):
            raise TypeError(f"trigger_s must be a number of seconds, not {type(self.trigger_s).__name__}")
        if not 0.1 <= self.trigger_s <= 3600:
            raise ValueError(f"trigger of {self.trigger_s} s: give 0.1 to 3600 seconds between micro-batches")
        if isinstance(self.retain_ms, bool) or not isinstance(self.retain_ms, int) or self.retain_ms < 0:
            raise ValueError(f"retain_ms {self.retain_ms!r} must be a duration in ms, 0 or more")

    def findings_topic_of(self, settings: Settings) -> str:
        return self.findings_topic or settings.reconcile_findings_topic


@dataclass(frozen=True)
class Finding:
    """One certain finding: what happened to which version of which id, and the evidence."""

    kind: str
    id: str
    version: int | None
    evidence: dict[str, Any]

    @property
    def key(self) -> str:
        """Its identity: the same finding found again (a micro-batch replayed) has the same key."""
        return f"{self.kind}:{self.id}:{'' if self.version is None else self.version}"

    def to_json(self, batch: int, found_ms: int) -> bytes:
        return json.dumps({"kind": self.kind, "id": self.id, "version": self.version, "batch": batch,
                           "found_ms": found_ms, **self.evidence}, sort_keys=True).encode()


# Evidence a finding record carries (the judged table's columns of the same name).
EVIDENCE = ("topic", "state", "due_ms", "put_ms", "delivered_count", "versions_delivered", "duplicate_records",
            "first_ms", "last_ms", "lateness_ms", "first_epoch", "last_epoch", "cancel_offset", "cancel_ms", "cutoff",
            "ignored", "dead_letters", "reorder_low_offset", "reorder_high_offset")


def findings_of(rows: Iterable[dict[str, Any]]) -> list[Finding]:
    """The findings of judged rows: one per flag raised on each (rows: :func:`.job.judge`'s, as dicts)."""
    found = []
    for row in rows:
        evidence = {name: row.get(name) for name in EVIDENCE}
        for kind, flag in FINDING_FLAGS.items():
            if row.get(flag):
                found.append(Finding(kind, row["id"], row.get("version"), evidence))
    return found


# -- the stateful step: each id's history, kept and emitted whole when touched ------------------------------


def follow_step(rows: DataFrame, grace_ms: int, retain_ms: int) -> DataFrame:
    """Each touched or timed-out id's whole history (:data:`EMITTED_SCHEMA`), from :data:`STEP_INPUT` rows.

    The step is ``delayq.spark.FollowStep`` (spark/jvm/src), a ``flatMapGroupsWithState`` in the JVM:
    new records are kept after the old ones and the whole history emitted (``fresh_from``: the
    first new record); a timeout is set at the latest put's due time plus ``grace_ms`` if that is
    still to come, else at the moment the id is forgotten. A timeout with no new records: at the
    check, the history emitted again (judged with everything read by now) and the next timeout set
    to the forgetting; at the forgetting, the state removed, nothing emitted. Two emissions that can
    hold no finding are not judged: a lone put before its check (emitted with ``judge`` false, so its
    record counts as read), and the check of an id with one put whose version was delivered (not
    emitted); FollowStep.java says why each is certain to hold none. The records stay JSON
    text from the JVM's ``to_json`` to the sink's ``from_json``. In Python
    (``applyInPandasWithState``) the same step cost a pandas DataFrame and a trip to a Python worker
    per id and call, and bounded the job at about 320 messages a second on two cores.

    Raises:
        ReconcileError: the JVM has no ``FollowStep`` (Spark was started without delayq's jar).
    """
    from pyspark.sql import DataFrame as PyDataFrame

    spark = rows.sparkSession
    step = _follow_step_class(spark)
    emitted = step.apply(rows._jdf, EMITTED_SCHEMA, grace_ms, retain_ms, BUFFER_SIDE, DELIVERED_SIDE, PUT)
    return PyDataFrame(emitted, spark)


def _follow_step_class(spark: SparkSession) -> Any:
    from py4j.java_gateway import JavaClass

    step = spark._jvm.delayq.spark.FollowStep  # type: ignore[union-attr]
    if not isinstance(step, JavaClass):
        raise ReconcileError(f"the continuous reconciliation's step (delayq.spark.FollowStep) is not on Spark's "
                             f"class path: give spark-submit --jars {STEP_JAR}")
    return step


# -- reading: one Kafka source for the buffer, the targets and the dead letters ------------------------------


def _glob_regex(glob: str) -> str:
    """A topic glob (``orders.*``) as a regular expression Java and Python read alike."""
    out = []
    i = 0
    while i < len(glob):
        char = glob[i]
        if char == "*":
            out.append(".*")
        elif char == "?":
            out.append(".")
        elif char == "[" and "]" in glob[i + 1:]:
            end = glob.index("]", i + 1)
            out.append("[" + glob[i + 1:end].replace("!", "^", 1) + "]")
            i = end
        else:
            out.append(re.escape(char))
        i += 1
    return "".join(out)


def subscription(settings: Settings, options: FollowOptions) -> str:
    """The pattern of topics the job subscribes to: the buffer, the dead letters and the target topics.

    Targets: ``options.topics`` if given, else every topic the cluster may deliver to
    (``target_topics``, globs); never Kafka's internal topics, delayq buffers or the
    findings topic. A target topic created later matches too and is read from its start.
    """
    from delayq.settings import BUFFER_TOPIC_PATTERN

    own = [re.escape(settings.buffer_topic), re.escape(settings.dead_letter_topic)]
    targets = [re.escape(t) for t in options.topics] if options.topics else [_glob_regex(g)
                                                                             for g in settings.target_topics]
    # Never a target: Kafka's internal topics, and any delayq cluster's buffer, dead letters and findings (a dead
    # letter or a finding carries a delay id, but is no delivery).
    never = [re.escape(options.findings_topic_of(settings)), "__.*", _glob_regex(BUFFER_TOPIC_PATTERN),
             _glob_regex(DEAD_LETTER_TOPIC_PATTERN), _glob_regex(FINDINGS_TOPIC_PATTERN)]
    # Anchored: Spark's Kafka source looks for the pattern anywhere in a topic's name (find, not matches).
    return f"^(?:(?:{'|'.join(own)})|(?!(?:{'|'.join(never)})$)(?:{'|'.join(targets)}))$"


def starting_offsets(settings: Settings, pattern: str, from_ms: int) -> str:
    """The first run's start: the buffer from its beginning, the other topics from ``from_ms`` (JSON).

    The buffer is compacted and holds every pending message from its start; deliveries and dead letters
    are read from the lookback on. A partition with nothing that recent starts at its end.
    """
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(settings.kafka_conf(**{"group.id": f"{settings.reconcile_group_prefix}-start",
                                               "enable.auto.commit": False}))
    try:
        topics = consumer.list_topics(timeout=15).topics
        offsets: dict[str, dict[str, int]] = {}
        asked = []
        for topic, metadata in topics.items():
            if not re.fullmatch(pattern, topic) or metadata.error is not None:
                continue
            for partition in metadata.partitions:
                if topic == settings.buffer_topic:
                    offsets.setdefault(topic, {})[str(partition)] = -2  # earliest
                else:
                    asked.append(TopicPartition(topic, partition, from_ms))
        for found in consumer.offsets_for_times(asked, timeout=15) if asked else []:
            offsets.setdefault(found.topic, {})[str(found.partition)] = found.offset if found.offset >= 0 else -1
    finally:
        consumer.close()
    return json.dumps(offsets)


def history_rows(buffer: DataFrame, deliveries: DataFrame, letters: DataFrame) -> DataFrame:
    """The three sides as history rows (:data:`HISTORY_SCHEMA`): what the job keeps per id.

    Args:
        buffer: :func:`.job.buffer_rows` (malformed records and marks take no part: left out here).
        deliveries: :func:`.job.delivery_rows`.
        letters: :func:`.job.dead_letter_rows` (only undeliverable messages' dead letters count).
    """
    from pyspark.sql import functions as F

    def side(number: int) -> Any:
        return F.lit(number).cast("int").alias("side")

    return (buffer.where(F.col("kind").isNotNull())
            .select("id", side(BUFFER_SIDE), "kind", "offset", "ts", "due", F.col("put_topic").alias("topic"),
                    "restores", "version", "cutoff", "follows", "follows_cutoff", "written")
            .unionByName(deliveries.select("id", side(DELIVERED_SIDE), "kind", "ts", "due",
                                           F.col("delivery_topic").alias("topic"), "version", "epoch"),
                         allowMissingColumns=True)
            .unionByName(letters.where(F.col("undeliverable") & F.col("id").isNotNull())
                         .select("id", side(DEAD_LETTER_SIDE), "ts", "due", F.col("put_topic").alias("topic"),
                                 "version"),
                         allowMissingColumns=True)
            .withColumn("written", F.coalesce("written", F.lit(0).cast("bigint")))
            .select(*(F.col(c) for c in ("id", *HISTORY_COLUMNS))))


def judge_histories(histories: DataFrame, topics: list[str], rules: ReconcileOptions,
                    expected_before_ms: int) -> DataFrame:
    """The batch job's judgement (per_version, per_id, judge) of whole histories (:data:`HISTORY_SCHEMA`).

    Args:
        histories: every record that counts of each id to judge.
        topics: every topic name in ``histories``.
        rules: the grace, tolerances and ack grace.
        expected_before_ms: messages due before this are expected delivered.
    """
    from pyspark.sql import functions as F

    side = F.col("side")
    buffer = histories.where(side == BUFFER_SIDE).select(
        "id", "kind", "offset", "due", F.col("topic").alias("put_topic"), "ts", "version", "cutoff", "restores",
        "follows", "follows_cutoff", "written")
    deliveries = histories.where(side == DELIVERED_SIDE).select(
        "id", "kind", "ts", "due", "epoch", "version", F.col("topic").alias("delivery_topic"))
    letters = histories.where(side == DEAD_LETTER_SIDE).select(
        "id", "ts", "due", "version", F.col("topic").alias("put_topic"), F.lit(True).alias("undeliverable"))
    versions = per_version(buffer, deliveries, topics, rules.early_tolerance_ms, dead_letters=letters,
                           reorder_tolerance_ms=rules.reorder_tolerance_ms)
    return judge(per_id(versions, topics, ack_grace_ms=rules.ack_grace_ms), rules,
                 expected_before_ms=expected_before_ms)


def follow_query_input(spark: SparkSession, settings: Settings, options: FollowOptions,
                       partitions: int) -> DataFrame:
    """The streaming DataFrame the sink sees: each touched id's whole history, once per micro-batch."""
    from pyspark.sql import functions as F

    from .job import buffer_rows

    pattern = subscription(settings, options)
    start_ms = int(time.time() * 1000) - options.rules.lookback_ms
    raw = (spark.readStream.format("kafka")
           .options(**kafka_source_options(settings, isolation_level=options.rules.isolation_level))
           .option("subscribePattern", pattern)
           .option("groupIdPrefix", settings.reconcile_group_prefix)
           .option("includeHeaders", "true")
           # Only the first run starts here; a restart resumes at the checkpoint's offsets.
           .option("startingOffsets", starting_offsets(settings, pattern, start_ms))
           # A record compacted away or past retention before the job read it is no longer evidence of anything.
           .option("failOnDataLoss", "false")
           .load())
    topic = F.col("topic")
    rows = history_rows(buffer_rows(raw.where(topic == settings.buffer_topic), partitions),
                        delivery_rows(raw.where((topic != settings.buffer_topic)
                                                & (topic != settings.dead_letter_topic))),
                        dead_letter_rows(raw.where(topic == settings.dead_letter_topic)))
    return follow_step(step_input(rows), options.rules.grace_ms, options.retain_ms)


def step_input(rows: DataFrame) -> DataFrame:
    """History rows as the stateful step reads them (:data:`STEP_INPUT`): each record as JSON, built in the JVM."""
    from pyspark.sql import functions as F

    record = F.to_json(F.struct(*(F.col(c) for c in HISTORY_COLUMNS)))
    return rows.select(*(record.alias(c) if c == "record" else F.col(c) for c in STEP_INPUT))


def emitted_histories(emitted: DataFrame) -> DataFrame:
    """The step's rows (one per touched id, its records as JSON) as history rows, with ``fresh``, ``judged_at``
    and ``judge``."""
    from pyspark.sql import functions as F

    fields = (field.split() for field in HISTORY_SCHEMA.split(", ")[1:])  # the history columns, id left out
    records = F.from_json("records", f"ARRAY<STRUCT<{', '.join(f'{name}: {kind}' for name, kind in fields)}>>")
    exploded = emitted.select("id", "fresh_from", "judged_at", "judge", F.posexplode(records).alias("at", "record"))
    return exploded.select("id", *(F.col(f"record.{c}").alias(c) for c in HISTORY_COLUMNS),
                           (F.col("at") >= F.col("fresh_from")).alias("fresh"), "judged_at", "judge")


# -- findings: a Kafka topic, exactly once, and metrics -----------------------------------------------------


class FindingsTopic:
    """The findings topic: created if absent, read back on start, written one transaction per micro-batch."""

    def __init__(self, settings: Settings, topic: str, transactional_id: str):
        from confluent_kafka import Producer

        self.settings, self.topic = settings, topic
        self._ensure()
        self.reported = self._read_back()
        self.producer = Producer(settings.kafka_conf(**{"transactional.id": transactional_id,
                                                        "enable.idempotence": True}))
        # Fences a previous run of this job still writing (a follower restarted while the old one hangs).
        self.producer.init_transactions(30)

    def _ensure(self) -> None:
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient(self.settings.kafka_conf())
        if self.topic in admin.list_topics(timeout=15).topics:
            return
        brokers = len(admin.list_topics(timeout=15).brokers)
        future = admin.create_topics([NewTopic(self.topic, 1, min(3, brokers),
                                               config={"cleanup.policy": "compact"})])[self.topic]
        try:
            future.result(30)
        except Exception as err:  # created meanwhile by another follower: fine; anything else: say so
            if "TOPIC_ALREADY_EXISTS" not in str(err):
                raise ReconcileError(f"findings topic {self.topic!r} could not be created: {err}") from err

    def _read_back(self) -> set[str]:
        """The keys of the findings already committed: a replayed micro-batch must not report them again.

        Read to each partition's end as a read_committed consumer sees it (the partition-EOF event): the
        offsets after the last finding are its transaction's commit marker, never delivered to a consumer.
        """
        from confluent_kafka import Consumer, KafkaError, TopicPartition

        consumer = Consumer(self.settings.kafka_conf(**{
            "group.id": f"{self.settings.reconcile_group_prefix}-findings", "enable.auto.commit": False,
            "isolation.level": "read_committed", "enable.partition.eof": True}))
        keys: set[str] = set()
        try:
            partitions = consumer.list_topics(self.topic, timeout=15).topics[self.topic].partitions
            wanted = {p for p in partitions
                      if consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=15)[1] > 0}
            consumer.assign([TopicPartition(self.topic, p, 0) for p in wanted])
            deadline = time.monotonic() + 60
            while wanted and time.monotonic() < deadline:
                record = consumer.poll(0.5)
                if record is None:
                    continue
                error = record.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        wanted.discard(record.partition())
                    continue
                key = record.key()
                if key is not None:
                    keys.add(key.decode())
            if wanted:
                raise ReconcileError(f"findings topic {self.topic!r} could not be read back in 60 s; it must be, "
                                     "or a replayed micro-batch would report its findings twice")
        finally:
            consumer.close()
        return keys

    def publish(self, findings: list[Finding], batch: int, found_ms: int) -> list[Finding]:
        """Write the findings not reported yet, in one transaction; return them."""
        fresh = list({f.key: f for f in findings if f.key not in self.reported}.values())
        if not fresh:
            return []
        self.producer.begin_transaction()
        for finding in fresh:
            self.producer.produce(self.topic, key=finding.key.encode(), value=finding.to_json(batch, found_ms),
                                  headers=[(KIND_HEADER, finding.kind.encode()), (BATCH_HEADER, str(batch).encode())])
        self.producer.commit_transaction(60)
        self.reported.update(f.key for f in fresh)
        return fresh


class FollowMetrics:
    """``delayq_reconcile_*``: findings by kind, records read by side, micro-batches, and the lag."""

    def __init__(self, port: int, host: str):
        from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

        self.registry = CollectorRegistry()
        self.findings = Counter("delayq_reconcile_findings", "Findings reported (each once), by kind",
                                ["kind"], registry=self.registry)
        self.records = Counter("delayq_reconcile_records", "Records read, by side (buffer, delivered, dead_letter)",
                               ["source"], registry=self.registry)
        self.batches = Counter("delayq_reconcile_batches", "Micro-batches finished", registry=self.registry)
        self.lag = Gauge("delayq_reconcile_lag_seconds", "Now minus the broker timestamp of the newest record the "
                         "last micro-batch judged", registry=self.registry)
        self.last_batch = Gauge("delayq_reconcile_last_batch_timestamp_seconds", "When the last micro-batch "
                                "finished (unix time)", registry=self.registry)
        self.ids = Gauge("delayq_reconcile_judged_ids", "Ids the last micro-batch judged", registry=self.registry)
        for kind in FINDING_FLAGS:
            self.findings.labels(kind)
        for name in SIDE_NAMES.values():
            self.records.labels(name)
        # Its start counts as the last batch: a job whose first micro-batch never finishes looks stalled
        # (DelayqReconcileStalled) from then on, not never.
        self.last_batch.set(time.time())
        self.server = start_http_server(port, addr=host, registry=self.registry)[0] if port else None

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()


@dataclass
class BatchSummary:
    """What one micro-batch did, for the progress line."""

    batch: int
    fresh: dict[str, int]
    ids: int
    findings: list[Finding]
    lag_s: float | None


class Follower:
    """The sink of the query: judges each micro-batch's histories and reports what it found."""

    def __init__(self, settings: Settings, options: FollowOptions, findings: FindingsTopic,
                 metrics: FollowMetrics | None, say: Callable[[BatchSummary], None]):
        self.settings, self.options, self.topic, self.metrics, self.say = settings, options, findings, metrics, say

    def on_batch(self, emitted: DataFrame, batch: int) -> None:
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        histories = emitted_histories(emitted).persist(StorageLevel.MEMORY_AND_DISK)
        try:
            fresh = F.col("fresh")
            sides = histories.groupBy("side").agg(
                F.count(F.when(fresh, 1)).alias("fresh"), F.max(F.when(fresh, F.col("ts"))).alias("newest"),
                F.max("judged_at").alias("judged_at"), F.collect_set("topic").alias("topics")).collect()
            if not sides:
                self._count(BatchSummary(batch, {}, 0, [], None), None)
                return
            judged_at = max(r["judged_at"] for r in sides)
            topics = sorted({t for r in sides for t in r["topics"]})
            judged = judge_histories(histories.where(F.col("judge")), topics, self.options.rules,
                                     judged_at - self.options.rules.grace_ms)
            # One pass of the judgement: how many ids it judged, and the few it flagged.
            flagged = F.expr(" OR ".join(FINDING_FLAGS.values()))
            [outcome] = judged.agg(F.count(F.lit(1)).alias("ids"), F.collect_list(
                F.when(flagged, F.struct(*judged.columns))).alias("flagged")).collect()
            ids = outcome["ids"]
            found = findings_of(r.asDict() for r in outcome["flagged"])
            reported = self.topic.publish(found, batch, judged_at)
            newest = max((r["newest"] for r in sides if r["newest"] is not None), default=None)
            lag = None if newest is None else max(0.0, time.time() - newest / 1000)
            self._count(BatchSummary(batch, {SIDE_NAMES[r["side"]]: r["fresh"] for r in sides}, ids, reported,
                                     lag), lag)
        finally:
            histories.unpersist()

    def _count(self, summary: BatchSummary, lag: float | None) -> None:
        if self.metrics is not None:
            for finding in summary.findings:
                self.metrics.findings.labels(finding.kind).inc()
            for side, count in summary.fresh.items():
                self.metrics.records.labels(side).inc(count)
            if lag is not None:
                self.metrics.lag.set(lag)
            self.metrics.ids.set(summary.ids)
            self.metrics.batches.inc()
            self.metrics.last_batch.set(time.time())
        self.say(summary)


def follow(settings: Settings, options: FollowOptions, *, say: Callable[[BatchSummary], None] | None = None,
           stop: threading.Event | None = None) -> None:
    """Run the continuous reconciliation until ``stop`` is set (or SIGTERM/SIGINT in the main thread).

    Raises:
        ReconcileError: Kafka does not answer, the buffer topic does not exist, Spark does not start,
            the findings topic cannot be created or read back, or the query fails.
    """
    partitions = topics_with_the_buffer(settings, [])[settings.buffer_topic]
    options.checkpoint.mkdir(parents=True, exist_ok=True)
    topic = options.findings_topic_of(settings)
    # One writer of findings per checkpoint: a second run on the same checkpoint fences the first.
    transactional_id = f"{settings.reconcile_transactional_id_prefix}{_digest(options.checkpoint.resolve())}"
    findings = FindingsTopic(settings, topic, transactional_id)
    conf = {"spark.sql.streaming.stateStore.providerClass": STATE_STORE,
            # Fixed by the first run of a checkpoint (the state is split by it): small, for a small driver.
            "spark.sql.shuffle.partitions": "8", **options.spark_conf}
    spark = spark_session(options.master, maven_repository=options.maven_repository, conf=conf)
    metrics = FollowMetrics(options.metrics_port, settings.http_host) if options.metrics_port else None
    follower = Follower(settings, options, findings, metrics, say or (lambda _summary: None))
    query: StreamingQuery = (follow_query_input(spark, settings, options, partitions).writeStream
                             .outputMode("update")
                             .foreachBatch(follower.on_batch)
                             .option("checkpointLocation", str(options.checkpoint / "spark"))
                             .trigger(processingTime=f"{options.trigger_s} seconds")
                             .queryName("delayq-reconcile-follow")
                             .start())
    stop = stop or threading.Event()
    # A micro-batch interrupted by the stop is no error to print: py4j would log its Java trace at ERROR.
    logging.getLogger("py4j").setLevel(logging.CRITICAL)
    try:
        with StopSignals() as signals:  # a pod's termination stops the query cleanly
            while not signals.sleep(0.5, until=stop.is_set) and not stop.is_set() and query.isActive:
                pass
        failure = query.exception()
        if failure is not None:
            raise ReconcileError(f"the continuous reconciliation stopped: {_first_line(str(failure))}")
    finally:
        query.stop()
        findings.producer.flush(10)
        if metrics is not None:
            metrics.close()


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text


def _digest(path: Path) -> str:
    import hashlib

    return hashlib.sha256(str(path).encode()).hexdigest()[:12]


def lag_text(lag_s: float | None) -> str:
    return "-" if lag_s is None or math.isnan(lag_s) else f"{lag_s:.1f} s"


__all__ = ["BATCH_HEADER", "FINDING_FLAGS", "KIND_HEADER", "BatchSummary", "Finding", "FollowOptions",
           "emitted_histories", "findings_of", "follow", "follow_step", "history_rows", "judge_histories", "step_input"]
