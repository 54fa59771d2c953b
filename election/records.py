"""The records delayq keeps in ZooKeeper, typed: one home for what nodes write and status, lookup and the chart read.

Paths (docs/DESIGN.md, "Election, epoch, cursor"): ``layout`` holds the
:class:`ShardLayout` (JSON), ``nodes/<node-id>`` a :class:`NodeRecord`,
``shards/<k>/cursor`` a :class:`CursorRecord`.
Readers take what they know and ignore what they do not, so a newer node's extra
field never breaks an older ``delayq status``; a record that is not JSON of this
shape is skipped, never a crash.
"""

from __future__ import annotations

import enum
import json
from dataclasses import asdict, dataclass, fields
from typing import Any

from delayq import __version__


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
        if not all(isinstance(values.get(k), (str, type(None))) for k in ("http", "host", "version")):
            return None
        values.setdefault("version", None)  # an older node's record: not this code's version
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


def _object(data: bytes) -> dict[str, Any] | None:
    try:
        found = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    return found if isinstance(found, dict) else None
