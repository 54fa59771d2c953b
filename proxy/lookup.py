"""``delayq.lookup(id)``: is this delayed message still pending, and when is it due?

Asks a node's ``GET /v1/messages/{id}``. Nodes come from ``Settings.lookup_urls``
(``DELAYQ_LOOKUP_URLS``) when set, else from the live registrations in ZooKeeper
(``<zk_root>/nodes/*``): the master of the id's shard first, then the other nodes
holding that shard, least lag first (a standby that lags behind the buffer may not
know an id produced a moment ago). A node that does not hold the id's shard answers
421, and the next one is asked.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

from pydantic import BaseModel, ValidationError

from delayq.errors import DelayqError
from delayq.extras import require
from delayq.settings import Settings
from delayq.wire import buffer_partition, check_delay_id, shard_of

MESSAGES_PATH = "/v1/messages/"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class NodeUnreachable(DelayqError):
    """No delay-service node answered; the message lists who was asked and what to do."""


@dataclass(frozen=True, slots=True)
class Lookup:
    """What a node knows of one delay id.

    ``pending`` False means the node holds no such message: delivered, cancelled, or
    never produced (a node cannot tell these apart once compaction ran). ``deliver_at``
    is None for a due time past 9999-12-31, which ``datetime`` cannot hold;
    ``deliver_at_ms`` is exact. For a repeating message, ``occurrence`` is the number of
    the occurrence pending (``deliver_at`` its due time) and ``repeat`` its schedule as the
    buffer's frame options (``every=60000 times=5``); for a retry, ``attempt`` its number.
    """

    delay_id: str
    pending: bool
    deliver_at: datetime | None = None
    deliver_at_ms: int | None = None
    topic: str | None = None
    node: str = ""
    occurrence: int | None = None
    repeat: str | None = None
    attempt: int | None = None


class _Answer(BaseModel):
    id: str
    status: Literal["pending", "not_found"]
    deliver_at_ms: int | None = None
    topic: str | None = None
    occurrence: int | None = None
    repeat: str | None = None
    attempt: int | None = None


def node_urls(settings: Settings, timeout: float = 3.0, delay_id: str | None = None) -> list[str]:
    """The HTTP base URLs of the cluster's nodes: ``lookup_urls``, else ZooKeeper's live nodes.

    With ``delay_id``, the nodes that can answer for it come first: its shard's master, then
    that shard's other holders (least lag first), then the rest.

    Raises:
        NodeUnreachable: ZooKeeper did not answer, or no node is registered there.
        MissingExtra: no ``lookup_urls``, and kazoo is not installed (``delayq[zookeeper]``).
    """
    if settings.lookup_urls:
        return [url.rstrip("/") for url in settings.lookup_urls]
    require("zookeeper", "finding the nodes through ZooKeeper", instead="or name the nodes with DELAYQ_LOOKUP_URLS")
    from delayq.election import Layout, Membership, Role, connect_for

    try:
        client = connect_for(settings, timeout_s=timeout)
    except DelayqError as err:
        raise NodeUnreachable(f"{err}; or name the nodes with DELAYQ_LOOKUP_URLS") from err
    try:
        members = Membership.members(client, settings.zk_root)
        layout = Layout(client, settings.zk_root).read() if delay_id is not None else None
    finally:
        client.stop()
        client.close()
    shard = (shard_of(buffer_partition(delay_id, layout.partitions), layout.shards)
             if delay_id is not None and layout is not None else 0)
    # The shard's master has ingested everything it delivers; among its holders, the least lag knows most.
    # (A record without shards is an older node's, which holds the whole buffer.)
    members.sort(key=lambda m: (shard not in m.masters and not (m.role == Role.MASTER and not m.shards),
                                bool(m.shards) and shard not in m.shards, m.lag if m.lag is not None else 1 << 62))
    urls = [m.http.rstrip("/") for m in members if m.http]
    if not urls:
        raise NodeUnreachable(f"no live delayq node registered under {settings.zk_root}/nodes in ZooKeeper at "
                              f"{settings.zk_connect}: start one with `delayq node` (cluster {settings.cluster!r}), "
                              "or name the nodes with DELAYQ_LOOKUP_URLS")
    return urls


def lookup(delay_id: str, *, settings: Settings | None = None, timeout: float = 2.0) -> Lookup:
    """Ask the delay service whether ``delay_id`` is pending, and when it is due.

    Example:
        >>> found = delayq.lookup(delay_id)
        >>> found.pending, found.deliver_at
        (True, datetime.datetime(2026, 11, 22, 10, 0, 30, 120000, tzinfo=datetime.timezone.utc))

    Args:
        delay_id: the id ``Producer.produce()`` returned.
        settings: where the cluster is; default :class:`delayq.Settings` from ``DELAYQ_*``.
        timeout: seconds to wait for each node (and for ZooKeeper).

    Returns:
        A :class:`Lookup`: ``pending`` with ``deliver_at`` (UTC) and ``topic``, or not pending.

    Raises:
        TypeError, ValueError: ``delay_id`` is not a delay id.
        NodeUnreachable: no node answered; the message lists the nodes tried and why.
    """
    check_delay_id(delay_id)
    settings = settings if settings is not None else Settings()
    failures = []
    for url in node_urls(settings, timeout, delay_id):
        try:
            return _ask(url, delay_id, timeout)
        except _NodeFailed as err:
            failures.append(f"{url}: {err}")
    raise NodeUnreachable("no delayq node answered the lookup (" + "; ".join(failures) + "): check that "
                          "`delayq node` runs and that DELAYQ_LOOKUP_URLS or ZooKeeper name it")


class _NodeFailed(Exception):
    pass


def _ask(url: str, delay_id: str, timeout: float) -> Lookup:
    try:
        with urllib.request.urlopen(f"{url}{MESSAGES_PATH}{delay_id}", timeout=timeout) as response:
            status, body = response.status, response.read()
    except urllib.error.HTTPError as err:
        status, body = err.code, err.read()
    except (OSError, ValueError) as err:
        raise _NodeFailed(getattr(err, "reason", None) or err) from err
    if status == 400:
        raise ValueError(f"the node at {url} refused the id {delay_id!r}: {body[:300].decode(errors='replace')}")
    if status == 421:  # it does not hold the id's shard
        raise _NodeFailed(f"does not hold the id's shard (HTTP 421 {body[:200].decode(errors='replace')})")
    if status not in (200, 404):
        raise _NodeFailed(f"HTTP {status} {body[:200].decode(errors='replace')}")
    try:
        answer = _Answer.model_validate(json.loads(body))
    except (ValueError, ValidationError) as err:
        raise _NodeFailed(f"HTTP {status} that is not a delayq answer ({body[:100]!r}): "
                          "is this a delayq node?") from err
    if answer.id != delay_id:
        raise _NodeFailed(f"answered for id {answer.id!r}, not {delay_id!r}")
    if answer.status == "not_found":
        return Lookup(delay_id, False, node=url)
    if answer.deliver_at_ms is None:
        raise _NodeFailed("answered pending without deliver_at_ms")
    try:
        deliver_at: datetime | None = _EPOCH + timedelta(milliseconds=answer.deliver_at_ms)
    except OverflowError:  # past 9999-12-31, which a frame's 18 digits reach: the exact ms stays in deliver_at_ms
        deliver_at = None
    return Lookup(delay_id, True, deliver_at, answer.deliver_at_ms, answer.topic, url, answer.occurrence,
                  answer.repeat, answer.attempt)
