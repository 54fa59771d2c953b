"""The one settings model of delayq.

Every part reads its configuration from :class:`Settings`: environment variables
with the prefix ``DELAYQ_`` (``DELAYQ_BOOTSTRAP_SERVERS``, ``DELAYQ_ZK_CONNECT``,
...), or a YAML/TOML file named by ``DELAYQ_CONFIG``. Environment variables win
over the file. Any librdkafka setting passes through ``kafka`` (for example
``DELAYQ_KAFKA__SECURITY_PROTOCOL=SASL_SSL``; underscores in the key become dots).
"""

from __future__ import annotations

import difflib
import fnmatch
import logging
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
    YamlConfigSettingsSource,
)

from .clock import DAY_MS
from .errors import ConfigurationError
from .schedule import DEFAULT_DELAY_LEVELS, parse_delay_levels

ENV_PREFIX = "DELAYQ_"


class QuietRepeats(logging.Filter):
    """Passes a log line, then holds back lines like it (digits aside) for ``window_s``; the next one says how many.

    While a broker is down librdkafka says "Connect to ... failed" about twenty times a second
    per client: without this a node's log grows by thousands of identical lines a minute.
    """

    def __init__(self, window_s: float = 10.0, clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self.window_s = window_s
        self._clock = clock
        self._seen: dict[tuple[int, str], tuple[float, int]] = {}  # (level, shape) -> (passed at, held back)
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        key = (record.levelno, re.sub(r"\d+", "#", text))
        now = self._clock()
        with self._lock:
            passed_at, held = self._seen.get(key, (-float("inf"), 0))
            if now - passed_at < self.window_s:
                self._seen[key] = (passed_at, held + 1)
                return False
            if len(self._seen) > 1000:  # forget shapes not seen for a window
                self._seen = {k: v for k, v in self._seen.items() if now - v[0] < self.window_s}
            self._seen[key] = (now, 0)
        if held:
            record.msg, record.args = f"{text} (and {held} more like it in the last {now - passed_at:.0f}s)", None
        return True


# Where librdkafka's log lines go, in every client delayq creates (Settings.kafka_conf).
KAFKA_LOGGER = logging.getLogger("delayq.kafka")
KAFKA_LOGGER.addFilter(QuietRepeats())
# Variables delayq's own tools read that are not settings: the config file, the dev stack's and the
# jar cache's folders, a kcat to use, and the test suite's switch to keep the dev stack running.
TOOL_VARIABLES = frozenset({"DELAYQ_CONFIG", "DELAYQ_DEV_DIR", "DELAYQ_CACHE_DIR", "DELAYQ_KCAT",
                            "DELAYQ_TEST_KEEP_STACK", "DELAYQ_SCREENSHOTS"})
# What Kubernetes injects for a Service named "delayq" (the chart turns service links off; others may not).
_SERVICE_LINK = re.compile(r"DELAYQ_(SERVICE_(HOST|PORT)(_\w+)?|PORT(_\d+_(TCP|UDP)(_\w+)?)?)")


# A librdkafka setting whose name holds one of these is a secret (sasl.password, ssl.key.password,
# sasl.oauthbearer.client.secret, ssl.keystore.password, ...): kept as a SecretStr, never printed.
SECRET_NAME_PARTS = ("password", "secret", "key", "jaas", "token")
# What every delayq cluster names its buffer (Settings._derive_topic_names): no master delivers into one.
BUFFER_TOPIC_PATTERN = "delayq-*-buffer"
# Shown instead of a secret's value, wherever a value would be shown.
REDACTED = "**********"


def is_secret_name(name: str) -> bool:
    """True for a librdkafka setting that holds a secret (its name says password, secret, key, ...)."""
    lowered = name.lower()
    return any(part in lowered for part in SECRET_NAME_PARTS)


class DispatchLimit(BaseModel):
    """How fast a master delivers to one topic: ``rate`` messages a second, bursts of up to ``burst``.

    ``burst`` defaults to a tenth of a second's worth (at least 1): a backlog falling due at
    once leaves at the rate, not as one flood the size of a second.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    rate: float = Field(gt=0, description="messages a second to the topic, across the cluster")
    burst: int | None = Field(default=None, ge=1, description="messages at once when the topic was idle")

    @property
    def burst_size(self) -> int:
        return self.burst if self.burst is not None else max(1, int(self.rate / 10))


# Kafka's topic characters, plus fnmatch's wildcards.
_TOPIC_GLOB = re.compile(r"[A-Za-z0-9._\-*?\[\]!]+")


def _always_forbidden(buffer_topic: str, dead_letter_topic: str, topic: str) -> str | None:
    if topic == buffer_topic:
        return f"{topic} is this cluster's own buffer topic"
    if topic == dead_letter_topic:
        return f"{topic} is this cluster's own dead-letter topic"
    if topic.startswith("__"):
        return f"{topic} is a Kafka internal topic"
    if fnmatch.fnmatchcase(topic, BUFFER_TOPIC_PATTERN):
        return f"{topic} is a delayq buffer topic"
    return None


def _config_file() -> Path | None:
    name = os.environ.get("DELAYQ_CONFIG")
    return Path(name) if name else None


class Settings(BaseSettings):
    """Configuration of a delayq client or node.

    Example:
        >>> Settings(cluster="orders").buffer_topic
        'delayq-orders-buffer'
    """

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        extra="ignore",
        validate_default=True,
        # A ValidationError's text would quote every input, secrets too; validation_problems shows the safe ones.
        hide_input_in_errors=True,
    )

    # Where Kafka and ZooKeeper are.
    bootstrap_servers: str = "127.0.0.1:9092"
    zk_connect: str = "127.0.0.1:2181"
    zk_auth: SecretStr | None = Field(
        default=None,
        description="ZooKeeper digest credentials 'user:password': every znode of the cluster is then only "
                    "theirs to change (read stays open to all)")
    kafka: dict[str, str | SecretStr] = Field(
        default_factory=dict,
        description="librdkafka settings passed through untouched (SASL, SSL, ...); those whose name says "
                    "password, secret or key are kept secret")

    # Which cluster, and its topics.
    cluster: str = "default"
    buffer_topic: str = ""
    dead_letter_topic: str = ""
    buffer_partitions: int = Field(default=12, ge=1)
    buffer_replication_factor: int | None = Field(
        default=None, ge=1,
        description="replicas of each buffer and dead-letter partition, when `delayq init` creates them; unset: "
                    "min(brokers, 3) of the cluster it finds")
    buffer_min_insync_replicas: int | None = Field(
        default=None, ge=1,
        description="min.insync.replicas of the buffer and dead-letter topics at `delayq init`: a write is "
                    "acknowledged once this many replicas hold it; unset: the replication factor - 1 (at least 1)")
    min_compaction_lag_ms: int = Field(default=7 * DAY_MS, ge=0)
    delete_retention_ms: int = Field(default=7 * DAY_MS, ge=0)
    shards: int = Field(
        default=1, ge=1, le=1024,
        description="shards of the buffer, each with its own master: recorded in ZooKeeper by the first "
                    "`delayq init` (or node) and never changed after; a divisor of the buffer's partitions")
    replicas: int = Field(
        default=0, ge=0,
        description="live nodes that hold each shard; 0: every node holds every shard")

    # This node.
    node_id: str = Field(default_factory=socket.gethostname)
    processes: int = Field(
        default=1, ge=1, le=256,
        description="member processes this node runs, each a node of its own (`<node_id>-<i>`, HTTP port "
                    "http_port + 1 + i, data in data_dir/members/<i>) with its own GIL: the node's shards are split "
                    "between them, so its delivery and ingest use that many cores; http_port answers for them all")
    node_group: str | None = Field(
        default=None,
        description="set by a node for its member processes: the node id they are members of (placement "
                    "counts a group as one node)")
    data_dir: Path = Path("./delayq-data")
    http_host: str = "127.0.0.1"
    http_port: int = Field(default=8080, ge=0, le=65535)
    zk_session_timeout_ms: int = Field(default=6000, ge=1000)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    gc_tuned: bool = Field(
        default=True,
        description="the node's processes collect CPython's cyclic garbage every 50,000 allocations instead of 700 "
                    "and keep what they made at start out of later collections (delay_service/collector.py); "
                    "false: Python's defaults")
    store_block_cache_mb: int = Field(default=64, ge=1, description="RocksDB block cache of this node's store")
    store_write_buffer_mb: int = Field(default=32, ge=1, description="RocksDB memtable size")
    store_sync_writes: bool = Field(
        default=False, description="fsync every batch; off by default: the buffer topic re-supplies a lost tail"
    )
    store_copies: bool = Field(
        default=True,
        description="a node with no store of a shard (wiped, new, or one it must rebuild) first asks the nodes "
                    "holding the shard for a copy of theirs (GET /v1/shards/<k>/store on their HTTP port) and reads "
                    "the buffer on from the copy's offsets; false: always read the buffer from its start")

    # Delivery.
    delivery_batch_size: int = Field(default=2000, ge=1)
    delivery_max_attempts: int = Field(default=5, ge=1)
    delivery_retry_backoff_ms: int = Field(default=200, ge=0)
    dispatch_limits: dict[str, DispatchLimit] = Field(
        default_factory=dict,
        description="per target topic (a name or a glob like 'orders.*'; '*' for any other): the most "
                    "messages a second the cluster delivers to it, and the burst, as JSON: "
                    '{"orders": {"rate": 500, "burst": 1000}, "*": {"rate": 20000}}')

    target_topics: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["*"],
        description="the topics the master may deliver to: names or globs ('orders.*'), comma-separated in "
                    "DELAYQ_TARGET_TOPICS; a put to any other is dead-lettered forbidden-topic")

    # Producer side.
    max_delay_ms: int = Field(default=365 * DAY_MS, ge=1)
    delay_levels: str = Field(
        default=DEFAULT_DELAY_LEVELS,
        description="the delay of each produce(..., delay_level=N), RocketMQ-style: level 1 is the first")
    lookup_urls: list[str] = Field(
        default_factory=list, description="node HTTP base URLs for lookup; empty: found through ZooKeeper"
    )

    # Reconciliation.
    spark_master: str = Field(
        default="local[*]",
        description="the Spark master `delayq reconcile` runs its job on when --master is not given: local[*] "
                    "(inside the command), spark://host:7077 (a standalone cluster; `delayq dev env` prints the dev "
                    "stack's), yarn, k8s://...")
    # The web console (delay_service/console): `delayq console`, and /console on a node's HTTP port.
    console: bool = Field(
        default=False,
        description="serve the web console under /console on this node's HTTP port (its index of the buffer and "
                    "the dead letters in data_dir/console); `delayq console` serves it without this")
    console_actions: bool = Field(
        default=False,
        description="let the console cancel, reschedule and replay (after a login: console_user and "
                    "console_password, or console_token); off, it only shows")
    console_user: str | None = None
    console_password: SecretStr | None = None
    console_token: SecretStr | None = Field(
        default=None, description="a login by token (form or `Authorization: Bearer`) instead of user and password")
    console_secret_key: SecretStr | None = Field(
        default=None,
        description="signs the console's session cookie; unset, a random key per process (logins end with it, and "
                    "replicas of the console do not share them)")
    console_host: str = "127.0.0.1"
    console_port: int = Field(default=8090, ge=0, le=65535, description="where `delayq console` listens")
    console_data_dir: Path | None = Field(
        default=None, description="the console's index of the buffer and the dead letters; unset: data_dir/console")

    @field_validator("kafka", mode="before")
    @classmethod
    def _dotted_kafka_keys(cls, value: Any) -> Any:
        if isinstance(value, dict):
            dotted = {str(k).replace("_", ".").lower(): v for k, v in value.items()}
            return {k: v if isinstance(v, SecretStr) else SecretStr(str(v)) if is_secret_name(k) else str(v)
                    for k, v in dotted.items()}
        return value

    @field_validator("zk_auth")
    @classmethod
    def _zk_auth_is_user_and_password(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            user, colon, password = value.get_secret_value().partition(":")
            if not user or not colon or not password:
                # The value is a secret: the message never quotes it.
                raise ValueError("ZooKeeper digest credentials are 'user:password', with both parts non-empty")
        return value

    @field_validator("target_topics", mode="before")
    @classmethod
    def _target_topics_from_text(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("target_topics")
    @classmethod
    def _target_topics_are_globs(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("no target topic pattern: give names or globs, like 'orders,payments.*' ('*' for any)")
        for pattern in value:
            if not _TOPIC_GLOB.fullmatch(pattern):
                raise ValueError(f"{pattern!r} is no topic name or glob: use letters, digits, '.', '_', '-' and "
                                 "the wildcards '*', '?', '[...]'")
        return value

    @field_validator("delay_levels")
    @classmethod
    def _delay_levels_parse(cls, value: str) -> str:
        parse_delay_levels(value)
        return value

    @property
    def delay_levels_ms(self) -> tuple[int, ...]:
        """The delay of level N at index N - 1, in ms."""
        return parse_delay_levels(self.delay_levels)

    def dispatch_limit(self, topic: str) -> DispatchLimit | None:
        """The limit for deliveries to ``topic``: its own entry, else the longest glob matching it, else ``*``."""
        limits = self.dispatch_limits
        if not limits:
            return None
        found = limits.get(topic)
        if found is not None:
            return found
        matching = [pattern for pattern in limits if pattern != "*" and fnmatch.fnmatchcase(topic, pattern)]
        if matching:
            return limits[max(matching, key=len)]
        return limits.get("*")

    @field_validator("cluster")
    @classmethod
    def _cluster_is_a_path_segment(cls, value: str) -> str:
        if not value or "/" in value or value in (".", ".."):
            raise ValueError(f"cluster {value!r} must be a non-empty name without '/'")
        return value

    @model_validator(mode="after")
    def _derive_topic_names(self) -> Settings:
        if not self.buffer_topic:
            self.buffer_topic = f"delayq-{self.cluster}-buffer"
        if not self.dead_letter_topic:
            self.dead_letter_topic = f"delayq-{self.cluster}-dead-letter"
        return self

    def always_forbidden_target(self, topic: str) -> str | None:
        """Why no delayq message may ever go to ``topic``, whatever ``target_topics`` says; None if it may.

        The cluster's own buffer and dead-letter topics, any delayq buffer, and Kafka's internal
        topics: delivering into them would let a buffer writer forge delayq's own records.
        """
        return _always_forbidden(self.buffer_topic, self.dead_letter_topic, topic)

    def forbidden_target(self, topic: str) -> str | None:
        """Why the master may not deliver to ``topic`` (always forbidden, or not in ``target_topics``); None: it may.

        The master asks once per topic per batch (delivery's ``_route``), so nothing is cached here.
        """
        always = _always_forbidden(self.buffer_topic, self.dead_letter_topic, topic)
        if always is not None:
            return always
        if any(fnmatch.fnmatchcase(topic, pattern) for pattern in self.target_topics):
            return None
        return f"{topic} is not in the cluster's target topics ({','.join(self.target_topics)})"

    @property
    def zk_root(self) -> str:
        """The ZooKeeper folder of this cluster (DESIGN.md: /delayq/<cluster>)."""
        return f"/delayq/{self.cluster}"

    def transactional_id(self, shard: int = 0) -> str:
        """One per shard: a new master's producer fences the shard's old one at the broker.

        Shard 0's is ``delayq-<cluster>-master``, shard k's adds ``-<k>``: the same in every
        release, so a master of one release fences a master of another (a rolling upgrade).
        """
        return f"delayq-{self.cluster}-master" + (f"-{shard}" if shard else "")

    @property
    def dead_letter_group(self) -> str:
        """The consumer group whose committed buffer offsets say which malformed records are dead-lettered."""
        return f"delayq-{self.cluster}-dead-letters"

    @property
    def ingest_group(self) -> str:
        """The consumer group id of this node's buffer reader: it never commits (librdkafka wants one all the same)."""
        return f"{self.ingest_group_prefix}{self.node_id}"

    @property
    def ingest_group_prefix(self) -> str:
        return f"delayq-{self.cluster}-ingest-"

    @property
    def console_group(self) -> str:
        """The group id the console's index names (librdkafka wants one): it is assigned partitions, never joins."""
        return f"delayq-{self.cluster}-console"

    @property
    def reconcile_group_prefix(self) -> str:
        """The consumer groups of the reconciliation's Spark Kafka source start with this (its ``groupIdPrefix``)."""
        return f"delayq-{self.cluster}-reconcile"

    @property
    def reconcile_findings_topic(self) -> str:
        """Where the continuous reconciliation (``delayq reconcile --follow``) reports findings, by default."""
        return f"delayq-{self.cluster}-reconcile-findings"

    @property
    def reconcile_transactional_id_prefix(self) -> str:
        """The continuous reconciliation's transactional ids (one per checkpoint) start with this."""
        return f"{self.reconcile_group_prefix}-follow-"

    def kafka_conf(self, **overrides: Any) -> dict[str, Any]:
        """librdkafka configuration: bootstrap servers, pass-through settings, then overrides.

        librdkafka's own log lines go to the Python logger ``delayq.kafka`` (one line each,
        formatted like every other log line), never raw to stderr as ``%3|1795...|FAIL|...``.
        """
        conf: dict[str, Any] = {"bootstrap.servers": self.bootstrap_servers, "logger": KAFKA_LOGGER}
        conf.update(self.kafka_passthrough())
        conf.update(overrides)
        return conf

    def kafka_passthrough(self) -> dict[str, str]:
        """The ``kafka`` settings with their secrets revealed: only for handing to a Kafka client."""
        return {k: v.get_secret_value() if isinstance(v, SecretStr) else v for k, v in self.kafka.items()}

    @property
    def zk_credentials(self) -> str | None:
        """``zk_auth`` revealed: only for handing to the ZooKeeper client."""
        return self.zk_auth.get_secret_value() if self.zk_auth is not None else None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        check_environment(os.environ)
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        path = _config_file()
        if path is not None:
            if not path.is_file():
                raise ConfigurationError(f"DELAYQ_CONFIG names {path}, which is not a file: point it at the "
                                         "settings file, or unset it")
            file_source: YamlConfigSettingsSource | TomlConfigSettingsSource
            if path.suffix in (".yaml", ".yml"):
                file_source = YamlConfigSettingsSource(settings_cls, yaml_file=path)
            elif path.suffix == ".toml":
                file_source = TomlConfigSettingsSource(settings_cls, toml_file=path)
            else:
                raise ConfigurationError(f"DELAYQ_CONFIG {path}: use a .yaml, .yml or .toml file")
            check_file_keys(path, file_source())
            sources.append(file_source)
        sources.append(file_secret_settings)
        return tuple(sources)


def closest_setting(name: str, known: Iterable[str], prefix: str = "") -> str:
    """'did you mean X?' for the known name closest to ``name`` (compared without ``prefix``)."""
    bare = {k[len(prefix):].lower(): k for k in known}
    close = difflib.get_close_matches(name[len(prefix):].lower(), list(bare), n=1, cutoff=0.6)
    if close:
        return f"did you mean {bare[close[0]]}?"
    return "the settings are listed in docs/DESIGN.md, Configuration"


def check_environment(environ: Mapping[str, str]) -> None:
    """Refuse a ``DELAYQ_*`` variable that is no setting: a typo would otherwise be silently ignored.

    Raises:
        ConfigurationError: one line naming the variable and the closest setting.
    """
    settings = {ENV_PREFIX + name.upper() for name in Settings.model_fields}
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX) or name in settings or name in TOOL_VARIABLES:
            continue
        if name.startswith(ENV_PREFIX + "KAFKA__") and len(name) > len(ENV_PREFIX + "KAFKA__"):
            continue  # a librdkafka setting, passed through
        if _SERVICE_LINK.fullmatch(name):
            continue
        if name.startswith(ENV_PREFIX + "KAFKA_"):
            hint = f"did you mean {ENV_PREFIX}KAFKA__{name[len(ENV_PREFIX + 'KAFKA_'):].lstrip('_')}?"
        else:
            hint = closest_setting(name, settings | TOOL_VARIABLES, ENV_PREFIX)
        raise ConfigurationError(f"{name}: no such setting; {hint}")


def check_file_keys(path: Path, values: Mapping[str, object]) -> None:
    """Refuse a key of the settings file that is no setting.

    Raises:
        ConfigurationError: one line naming the file, the key and the closest setting.
    """
    for key in values:
        if key not in Settings.model_fields:
            raise ConfigurationError(f"{path}: {key}: no such setting; {closest_setting(key, Settings.model_fields)}")


def validation_problems(err: ValidationError, named: Callable[[str], str]) -> str:
    """Each error of ``err`` as "where = value: what is wanted", joined by "; ".

    ``named(field)`` says where the field's value came from (a variable, a conf key): the
    one place the wording of an invalid setting lives, for the command line and the producer.
    """
    problems = []
    for error in err.errors():
        field = str(error["loc"][0]) if error["loc"] else ""
        # Inside a structured setting (dispatch_limits.orders.rate), which part.
        inner = ".".join(str(part) for part in error["loc"][1:])
        where = f"{named(field)} ({inner})" if inner else named(field)
        secret = field == "zk_auth" or (field == "kafka" and (not inner or is_secret_name(inner)))
        shown = REDACTED if secret else f"{error.get('input')!r:.80}"
        problems.append(f"{where} = {shown}: {error['msg']}")
    return "; ".join(problems)


def settings_problem(err: ValidationError) -> str | None:
    """One line for an invalid setting (which variable, the value, what is wanted); None if not about Settings."""
    if err.title != Settings.__name__:
        return None
    return "invalid setting: " + validation_problems(
        err, lambda field: f"{ENV_PREFIX}{field.upper()}" if field in Settings.model_fields else field or "settings")
