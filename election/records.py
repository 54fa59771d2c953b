"""The records delayq keeps in ZooKeeper, typed: one home for what nodes write and status, lookup and the chart read.

Paths (docs/DESIGN.md, "Election, epoch, cursor"): ``layout`` holds the
:class:`ShardLayout` (JSON), ``nodes/<node-id>`` a :class:`NodeRecord`,
``shards/<k>/cursor`` a :class:`CursorRecord`, ``features`` a :class:`FeatureRecord`.
Readers take what they know and ignore what they do not, so a newer node's extra
field never breaks an older ``delayq status``; a record that is not JSON of this
shape is skipped (the feature record: reported, :class:`FinalizedLevel`), never a crash.
"""

from __future__ import annotations

import enum
import json
from dataclasses import asdict, dataclass, fields
from datetime import UTC, datetime
from typing import Any

from delayq import __version__
from delayq.clock import now_ms
from delayq.features import SUPPORTED_LEVEL, UNRECORDED_LEVEL, introduced_by


class Role(enum.StrEnum):
    """What a node is doing for its cluster."""

    STARTING = "starting"
    STANDBY = "standby"
    MASTER = "master"


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """A live node's registration: who it is, where its HTTP API answers, and how far along it is."""

    node_id: str
    role: Role
    http: str | None = None
    host: str | None = None
    lag: int | None = None  # buffer records not yet ingested; None until first known
    pending: int | None = None
    epoch: int = 0  # the epoch of its latest term as master of any shard
    updated_at_ms: int | None = None
    shards: tuple[int, ...] = ()  # the shards it holds (ingests into a store of their own)
    ready: tuple[int, ...] = ()  # of those, the ones it has caught up on since it took them: it may master them
    masters: tuple[int, ...] = ()  # the shards it is master of
    # The delayq version of the node that wrote the record (so a rolling upgrade shows who runs what):
    # this code's by default; None when read from a node of 0.1.0 or older, whose records lack the field.
    version: str | None = __version__
    # The highest feature level the node speaks (delayq/features.py), which `delayq upgrade finalize` checks:
    # this code's by default; None when read from a node of 0.1.0, which lacks the field and speaks level 1.
    feature_level: int | None = SUPPORTED_LEVEL
    # The oldest store format among the stores it holds (delayq.store): after a finalize that brings a new
    # store format, the node's stores are migrated once this reaches it. None: it holds no store, or it is of
    # 0.1.0, which does not say (its stores are of format 4).
    store_format: int | None = None
    # The node whose member process this is (DELAYQ_PROCESSES > 1): placement counts a group as one node and
    # splits its shards between its members. None: a node of its own.
    group: str | None = None

    @property
    def highest_level(self) -> int:
        """The highest feature level the node speaks: 1 for a node of 0.1.0, which does not say."""
        return self.feature_level if self.feature_level is not None else UNRECORDED_LEVEL

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "role": self.role.value, "shards": list(self.shards), "ready": list(self.ready),
                "masters": list(self.masters)}

    @classmethod
    def from_json(cls, data: bytes) -> NodeRecord | None:
        """The record in ``data``; None if it is not one (damaged, or not delayq's)."""
        found = _object(data)
        if found is None or not isinstance(found.get("node_id"), str):
            return None
        try:
            role = Role(found.get("role", Role.STARTING))
        except ValueError:
            return None
        known = {f.name for f in fields(cls)} - {"node_id", "role"}
        values = {k: v for k, v in found.items() if k in known}
        if not all(isinstance(values.get(k), (int, type(None))) and not isinstance(values.get(k), bool)
                   for k in ("lag", "pending", "updated_at_ms")):
            return None
        if not all(isinstance(values.get(k), (str, type(None))) for k in ("http", "host", "version", "group")):
            return None
        # An older node's record lacks these: not this code's version and level.
        values.setdefault("version", None)
        for name in ("feature_level", "store_format"):
            number = values.setdefault(name, None)
            if number is not None and (type(number) is not int or number < 1):
                return None
        if not isinstance(values.get("epoch", 0), int):
            return None
        for name in ("shards", "ready", "masters"):
            listed = values.get(name, [])
            if not isinstance(listed, list) or not all(type(k) is int and k >= 0 for k in listed):
                return None
            values[name] = tuple(listed)
        return cls(node_id=found["node_id"], role=role, **values)


@dataclass(frozen=True, slots=True)
class ShardLayout:
    """How the cluster's buffer is cut into shards, recorded once (``delayq init``) and never changed.

    Buffer partition p belongs to shard ``p % shards`` (:func:`delayq.wire.shard_of`);
    ``partitions`` is the buffer's partition count, a multiple of ``shards``.
    """

    shards: int
    partitions: int
    created_at_ms: int = 0

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> ShardLayout | None:
        found = _object(data)
        if found is None:
            return None
        values: dict[str, int] = {}
        for f in fields(cls):
            value = found.get(f.name, 0)
            if type(value) is not int:
                return None
            values[f.name] = value
        if values["shards"] < 1 or values["partitions"] < 1:
            return None
        return cls(**values)


@dataclass(frozen=True, slots=True)
class CursorRecord:
    """The master's progress after each committed batch (written with the znode version: a stale master is fenced)."""

    epoch: int
    node_id: str
    watermark_deliver_at_ms: int
    last_id: str
    delivered: int
    committed_at_ms: int

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: bytes) -> CursorRecord | None:
        found = _object(data)
        if found is None:
            return None
        try:
            return cls(**{f.name: found[f.name] for f in fields(cls)})
        except (KeyError, TypeError):
            return None


def version_text(version: str | None) -> str:
    """A node's version as people read it: nodes say their version from 0.2.0 on, so a record without one is older."""
    return version if version is not None else "0.1.0 or older"


@dataclass(frozen=True, slots=True)
class FeatureRecord:
    """The cluster's finalized feature level: nodes and producers write nothing of a higher level.

    Written by ``delayq init`` of a new cluster and by ``delayq upgrade finalize``, each time with the
    znode version it read (a compare-and-set), and only ever raised.
    """

    level: int
    # The release that introduced the level: a node too old to know the level names the release it needs.
    introduced_by: str
    finalized_at_ms: int
    finalized_by: str  # the delayq version that wrote the record

    @classmethod
    def of(cls, level: int) -> FeatureRecord:
        """The record this code writes to finalize ``level`` now.

        Raises:
            ValueError: this code does not know ``level``.
        """
        return cls(level, introduced_by(level), now_ms(), __version__)

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: bytes) -> FeatureRecord | None:
        """The record in ``data``; None if it is not one."""
        found = _object(data)
        if found is None:
            return None
        level, at = found.get("level"), found.get("finalized_at_ms")
        if type(level) is not int or level < 1 or type(at) is not int:
            return None
        texts = (found.get("introduced_by"), found.get("finalized_by"))
        if not all(isinstance(text, str) for text in texts):
            return None
        return cls(level, found["introduced_by"], at, found["finalized_by"])


@dataclass(frozen=True, slots=True)
class FinalizedLevel:
    """The ``features`` znode as read: its record, or none (a cluster that ran 0.1.0), or why it is not one.

    ``znode_version`` is the version a compare-and-set writes over (None: no znode); ``problem``
    the one line saying the znode holds no feature record, which callers report and never crash on.
    """

    path: str
    record: FeatureRecord | None = None
    znode_version: int | None = None
    problem: str | None = None

    @classmethod
    def of(cls, path: str, data: bytes | None, znode_version: int | None) -> FinalizedLevel:
        """The reading of the znode at ``path``: ``data`` and ``znode_version`` None when it does not exist."""
        if znode_version is None:
            return cls(path)
        record = FeatureRecord.from_json(data or b"")
        if record is None:
            return cls(path, None, znode_version,
                       f"ZooKeeper node {path} does not hold a delayq feature record ({(data or b'')[:80]!r}): "
                       "another program wrote there; delete that node, then run `delayq upgrade finalize` to "
                       "record the level again")
        return cls(path, record, znode_version)

    @property
    def recorded(self) -> bool:
        """Whether the znode exists (a damaged one too)."""
        return self.znode_version is not None

    @property
    def level(self) -> int | None:
        """The level the cluster speaks; None when the record is damaged and it cannot be told."""
        if self.record is not None:
            return self.record.level
        return None if self.problem is not None else UNRECORDED_LEVEL

    def describe(self) -> str:
        """One line: the level and who finalized it when, or that none is recorded, or the problem."""
        if self.problem is not None:
            return self.problem
        if self.record is None:
            return f"feature level {UNRECORDED_LEVEL} (none recorded: a cluster that ran delayq 0.1.0)"
        when = datetime.fromtimestamp(self.record.finalized_at_ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return f"feature level {self.record.level} (finalized by delayq {self.record.finalized_by} at {when})"

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready, with the one line of :meth:`describe` as ``text``."""
        return {"level": self.level, "record": self.record.as_dict() if self.record is not None else None,
                "problem": self.problem, "text": self.describe()}


def _object(data: bytes) -> dict[str, Any] | None:
    try:
        found = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    return found if isinstance(found, dict) else None
