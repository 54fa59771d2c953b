"""The one settings model of delayq.

Every part reads its configuration from :class:`Settings`: environment variables
with the prefix ``DELAYQ_`` (``DELAYQ_BOOTSTRAP_SERVERS``, ``DELAYQ_ZK_CONNECT``,
...), or a YAML/TOML file named by ``DELAYQ_CONFIG``. Environment variables win
over the file. Any librdkafka setting passes through ``kafka`` (for example
``DELAYQ_KAFKA__SECURITY_PROTOCOL=SASL_SSL``; underscores in the key become dots).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
    YamlConfigSettingsSource,
)

DAY_MS = 24 * 3600 * 1000


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
        env_prefix="DELAYQ_",
        env_nested_delimiter="__",
        extra="ignore",
        validate_default=True,
    )

    # Where Kafka and ZooKeeper are.
    bootstrap_servers: str = "127.0.0.1:9092"
    zk_connect: str = "127.0.0.1:2181"
    zk_auth: str | None = Field(
        default=None, description="ZooKeeper digest credentials 'user:password', if the ensemble wants them"
    )
    kafka: dict[str, str] = Field(
        default_factory=dict, description="librdkafka settings passed through untouched (SASL, SSL, ...)"
    )

    # Which cluster, and its topics.
    cluster: str = "default"
    buffer_topic: str = ""
    dead_letter_topic: str = ""
    buffer_partitions: int = Field(default=12, ge=1)
    buffer_replication_factor: int = Field(default=1, ge=1)
    min_compaction_lag_ms: int = Field(default=7 * DAY_MS, ge=0)
    delete_retention_ms: int = Field(default=7 * DAY_MS, ge=0)

    # This node.
    node_id: str = Field(default_factory=socket.gethostname)
    data_dir: Path = Path("./delayq-data")
    http_host: str = "127.0.0.1"
    http_port: int = Field(default=8080, ge=0, le=65535)
    zk_session_timeout_ms: int = Field(default=6000, ge=1000)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    store_block_cache_mb: int = Field(default=64, ge=1, description="RocksDB block cache of this node's store")
    store_write_buffer_mb: int = Field(default=32, ge=1, description="RocksDB memtable size")
    store_sync_writes: bool = Field(
        default=False, description="fsync every batch; off by default: the buffer topic re-supplies a lost tail"
    )

    # Delivery.
    delivery_batch_size: int = Field(default=2000, ge=1)
    delivery_max_attempts: int = Field(default=5, ge=1)
    delivery_retry_backoff_ms: int = Field(default=200, ge=0)

    # Producer side.
    max_delay_ms: int = Field(default=365 * DAY_MS, ge=1)
    lookup_urls: list[str] = Field(
        default_factory=list, description="node HTTP base URLs for lookup; empty: found through ZooKeeper"
    )

    @field_validator("kafka", mode="before")
    @classmethod
    def _dotted_kafka_keys(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {str(k).replace("_", ".").lower(): str(v) for k, v in value.items()}
        return value

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

    @property
    def zk_root(self) -> str:
        """The ZooKeeper folder of this cluster (DESIGN.md: /delayq/<cluster>)."""
        return f"/delayq/{self.cluster}"

    @property
    def transactional_id(self) -> str:
        """One per cluster: a new master's producer fences the old one at the broker."""
        return f"delayq-{self.cluster}-master"

    def kafka_conf(self, **overrides: Any) -> dict[str, Any]:
        """librdkafka configuration: bootstrap servers, pass-through settings, then overrides."""
        conf: dict[str, Any] = {"bootstrap.servers": self.bootstrap_servers}
        conf.update(self.kafka)
        conf.update(overrides)
        return conf

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        path = _config_file()
        if path is not None:
            if not path.is_file():
                raise ValueError(f"DELAYQ_CONFIG names {path}, which is not a file")
            if path.suffix in (".yaml", ".yml"):
                sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=path))
            elif path.suffix == ".toml":
                sources.append(TomlConfigSettingsSource(settings_cls, toml_file=path))
            else:
                raise ValueError(f"DELAYQ_CONFIG {path}: use a .yaml, .yml or .toml file")
        sources.append(file_secret_settings)
        return tuple(sources)
