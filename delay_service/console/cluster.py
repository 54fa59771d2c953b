"""What the console knows of the cluster: ZooKeeper's view of it, and the nodes' answers about their shards.

:class:`ClusterView` reads the shards (master, epoch, holders) and the nodes' registrations through one
ZooKeeper client it keeps open (or the one its host node lends it), at most once a second however many
pages ask; and it asks the nodes holding each shard, in parallel and with short timeouts, for the shard's
pending histogram, its next messages and its delivery figures (``/v1/shards/<shard>/...``, records.py).
A shard none of whose nodes answers is *unavailable*: the pages say so, never fail for it.

The upcoming list is every shard's due-time order merged into one (:func:`merge_upcoming`), paged by one
opaque cursor that carries each shard's own (:func:`encode_cursor`).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import logging
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException

from delayq.clock import now_ms
from delayq.election import Epoch, Layout, Leadership, Membership, NodeRecord, connect_for
from delayq.errors import UnavailableError
from delayq.settings import Settings
from delayq.wire import buffer_partition, shard_of

from .records import (
    MAX_PAGE,
    NOW,
    PENDING,
    SHARDS_PATH,
    UPCOMING,
    Bucket,
    PendingHistogram,
    ShardNow,
    UpcomingItem,
    UpcomingPage,
    histogram_from_json,
    now_from_json,
    upcoming_from_json,
)

log = logging.getLogger("delayq.console")

MESSAGES_PATH = "/v1/messages/"
# How many rounds of asking the shards one upcoming page may take when a shard's topic filter stops at its
# scan limit before it found anything (records.UPCOMING_SCAN_LIMIT): bounded, so a page answers in time.
UPCOMING_ROUNDS = 3
# A page waits this long for ZooKeeper when the view has no session yet (it tries again a second later).
ZK_CONNECT_TIMEOUT_S = 2.0

T = TypeVar("T")
# GET a node's URL: (HTTP status, the JSON body). Raises OSError (urllib's errors are) when it does not answer.
Fetch = Callable[[str, float], tuple[int, Any]]


@dataclass(frozen=True)
class ShardRow:
    """One shard as ZooKeeper has it: its master, epoch and holders, and how far its master's node lags."""

    shard: int
    master: str | None
    epoch: int
    holders: tuple[str, ...]  # the nodes (or member processes) holding the shard
    ready: tuple[str, ...]  # of those, the ones caught up on it (that may master it)
    lag: int | None  # buffer records the master's node has not ingested yet (over all its shards); None: unknown


@dataclass(frozen=True)
class Overview:
    """The cluster as ZooKeeper has it, read at ``read_at_ms``; ``problem``: why it could not be read (one line)."""

    cluster: str
    shards: tuple[ShardRow, ...]
    nodes: tuple[NodeRecord, ...]
    partitions: int | None  # the buffer's partition count as the layout records it
    read_at_ms: int
    problem: str | None = None


@dataclass(frozen=True)
class PendingChart:
    """Every shard's :class:`PendingHistogram` summed: the overview's chart and its table.

    ``buckets``: the minute buckets of the next hour, then the hour buckets after it, each summed over the
    shards by start time. ``unavailable``: the shards left out (no node answered for them); ``counting``: the
    shards left out because their node is still making its first count of the store (it answers 503 "counting").
    """

    now_ms: int
    count: int
    overdue: int
    buckets: tuple[Bucket, ...]
    later: int
    unavailable: tuple[int, ...]
    counting: tuple[int, ...] = ()


@dataclass(frozen=True)
class UpcomingRow:
    shard: int
    item: UpcomingItem


@dataclass(frozen=True)
class MergedUpcoming:
    """One page of the merged upcoming list, due-time order; ``next``: the cursor of the next page (None: last)."""

    rows: tuple[UpcomingRow, ...]
    next: str | None
    unavailable: tuple[int, ...]  # shards no node answered for: their messages are missing from this page


@dataclass(frozen=True)
class NodeLookup:
    """What the nodes holding an id's shard say of it: pending (and when), or not held (delivered, cancelled,
    never put); ``answered`` False when none of them answered."""

    answered: bool
    pending: bool = False
    due_ms: int | None = None
    topic: str | None = None
    occurrence: int | None = None
    repeat: str | None = None


class NodeUnanswered(Exception):
    """No node holding a shard answered (down, too slow, or each said it does not hold the shard)."""


def fetch_json(url: str, timeout_s: float) -> tuple[int, Any]:
    """GET ``url``: (status, the JSON body) for any HTTP answer.

    Raises:
        OSError: the node did not answer in ``timeout_s`` or refused the connection (urllib's errors are OSErrors).
    """
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        try:
            return err.code, json.loads(err.read())
        except ValueError:
            return err.code, None
    except ValueError as err:  # not JSON: not a node of this version
        raise OSError(f"{url} answered no JSON: {err}") from None


class ClusterView:
    """The cluster as the console shows it; safe to use from many request threads at once.

    Args:
        settings: the cluster's (ZooKeeper, the root).
        zk: the ZooKeeper client to read through, owned by whoever passes it (a node lends its own); None: the
            view opens one when first asked and keeps it until :meth:`close`.
        timeout_s: how long a node may take to answer one question.
        cache_s: how long one reading of ZooKeeper serves the pages.
        fetch: how a node is asked (:func:`fetch_json`; tests give a stand-in).
    """

    def __init__(self, settings: Settings, *, zk: Callable[[], KazooClient] | None = None, timeout_s: float = 1.0,
                 cache_s: float = 1.0, fetch: Fetch = fetch_json, workers: int = 8):
        self.settings = settings
        self.timeout_s = timeout_s
        self.cache_s = cache_s
        self._lent_zk = zk
        self._own_zk: KazooClient | None = None
        self._fetch = fetch
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="console-ask")
        self._lock = threading.Lock()
        self._cached: Overview | None = None
        self._cached_at = float("-inf")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            if self._own_zk is not None:
                self._own_zk.stop()
                self._own_zk.close()
                self._own_zk = None

    # -- ZooKeeper -------------------------------------------------------------

    def overview(self) -> Overview:
        """ZooKeeper's view, read again when the last reading is older than ``cache_s``."""
        with self._lock:
            if time.monotonic() - self._cached_at < self.cache_s and self._cached is not None:
                return self._cached
            try:
                found = read_overview(self._zk(), self.settings)
            except UnavailableError as err:
                found = Overview(self.settings.cluster, (), (), None, now_ms(), problem=str(err))
            except KazooException as err:
                found = Overview(self.settings.cluster, (), (), None, now_ms(),
                                 problem=f"ZooKeeper at {self.settings.zk_connect} did not answer "
                                         f"({type(err).__name__}: {err}): it is asked again in a second")
            self._cached, self._cached_at = found, time.monotonic()
            return found

    def _zk(self) -> KazooClient:
        if self._lent_zk is not None:
            return self._lent_zk()
        if self._own_zk is None:
            self._own_zk = connect_for(self.settings, timeout_s=ZK_CONNECT_TIMEOUT_S)
        return self._own_zk

    # -- the nodes -----------------------------------------------------------

    def pending(self) -> PendingChart:
        """Every shard's pending histogram, summed (:func:`sum_histograms`)."""
        overview = self.overview()
        found = self._ask_every_shard(overview, [r.shard for r in overview.shards],
                                      lambda shard: f"{SHARDS_PATH}{shard}/{PENDING}", histogram_or_counting,
                                      accept=(200, 503))
        counting = tuple(shard for shard, answer in found.items() if answer is COUNTING)
        chart = sum_histograms({shard: answer if isinstance(answer, PendingHistogram) else None
                                for shard, answer in found.items() if answer is not COUNTING}, now_ms())
        return dataclasses.replace(chart, counting=counting)

    def now(self) -> dict[int, ShardNow | None]:
        """Shard -> its delivery figures now, asked of its master (None: no node answered for it)."""
        overview = self.overview()
        return self._ask_every_shard(overview, [r.shard for r in overview.shards],
                                     lambda shard: f"{SHARDS_PATH}{shard}/{NOW}", now_from_json)

    def upcoming(self, *, after: str | None, limit: int, topic: str | None = None,
                 shard: int | None = None) -> MergedUpcoming:
        """The next ``limit`` messages due over the shards (one shard: ``shard``), after the cursor ``after``.

        Raises:
            ValueError: ``after`` is no cursor this console wrote, or ``shard`` is no shard of the cluster.
        """
        overview = self.overview()
        shards = [row.shard for row in overview.shards]
        if shard is not None and shard not in shards:
            raise ValueError(f"shard {shard} is no shard of cluster {overview.cluster}: it has shards 0 to "
                             f"{len(shards) - 1}")
        positions = decode_cursor(after) if after else {k: "" for k in ([shard] if shard is not None else shards)}
        limit = max(1, min(limit, MAX_PAGE))
        rows: list[UpcomingRow] = []
        unavailable: tuple[int, ...] = ()
        for _ in range(UPCOMING_ROUNDS):
            if not positions or len(rows) >= limit:
                break
            wanted = limit - len(rows)
            paths = {k: _upcoming_path(k, position, wanted, topic) for k, position in positions.items()}
            pages = self._ask_every_shard(overview, list(paths), paths.__getitem__, upcoming_from_json)
            unavailable = tuple(k for k, page in pages.items() if page is None)
            taken, positions = merge_upcoming(positions, pages, wanted)
            rows.extend(taken)
            if taken or len(unavailable) == len(pages):
                break  # a page with something on it, or nobody answered: no use asking again
        return MergedUpcoming(tuple(rows), encode_cursor(positions) if positions else None, unavailable)

    def lookup(self, delay_id: str) -> NodeLookup:
        """Whether ``delay_id`` is pending, asked of the nodes holding its shard (``GET /v1/messages/<id>``)."""
        overview = self.overview()
        if overview.partitions is None or not overview.shards:
            return NodeLookup(answered=False)
        shard = shard_of(buffer_partition(delay_id, overview.partitions), len(overview.shards))
        try:
            status, body = self._ask(overview, shard, MESSAGES_PATH + delay_id, accept=(200, 404))
        except NodeUnanswered:
            return NodeLookup(answered=False)
        if status == 404:
            return NodeLookup(answered=True, pending=False)
        return NodeLookup(answered=True, pending=True, due_ms=body.get("deliver_at_ms"), topic=body.get("topic"),
                          occurrence=body.get("occurrence"), repeat=body.get("repeat"))

    def _ask_every_shard(self, overview: Overview, shards: Iterable[int], path: Callable[[int], str],
                         parse: Callable[[dict[str, Any]], T], accept: tuple[int, ...] = (200,)
                         ) -> dict[int, T | None]:
        """Shard -> ``parse`` of the answer to ``path(shard)``, asked of every shard at once; None: no answer."""

        def ask(shard: int) -> T | None:
            try:
                return parse(self._ask(overview, shard, path(shard), accept)[1])
            except NodeUnanswered as err:
                log.info("console: %s", err)
                return None
            except (KeyError, TypeError, ValueError) as err:  # a node that answers another shape
                log.warning("console: shard %d's answer to %s is not what this console reads: %s", shard,
                            path(shard), err)
                return None

        listed = list(shards)
        return dict(zip(listed, self._pool.map(ask, listed)))

    def _ask(self, overview: Overview, shard: int, path: str, accept: tuple[int, ...] = (200,)) -> tuple[int, Any]:
        """The first answer in ``accept`` from the nodes holding ``shard``, the master first.

        Raises:
            NodeUnanswered: none answered so (down, too slow, 421: no longer holds it, any other status).
        """
        said = []
        for node in candidates(overview, shard):
            url = (node.http or "").rstrip("/") + path  # a registration names its URL (candidates have one)
            try:
                status, body = self._fetch(url, self.timeout_s)
            except OSError as err:
                said.append(f"{node.node_id}: {err}")
                continue
            if status in accept:
                return status, body
            said.append(f"{node.node_id}: HTTP {status}")
        raise NodeUnanswered(f"no node answered for shard {shard} ({'; '.join(said) or 'none registered holds it'})")


def read_overview(client: KazooClient, settings: Settings) -> Overview:
    """The shards and live nodes of ``settings``' cluster, read through ``client``.

    Raises:
        KazooException: ZooKeeper did not answer.
    """
    root = settings.zk_root
    layout = Layout(client, root).read()
    members = Membership.members(client, root)
    by_id = {member.node_id: member for member in members}
    rows = []
    for shard in range(layout.shards if layout is not None else 1):
        master = Leadership.master(client, root, shard)
        holders = tuple(m.node_id for m in members if shard in m.shards)
        master_record = by_id.get(master) if master is not None else None
        rows.append(ShardRow(
            shard=shard, master=master, epoch=Epoch(client, root, shard).current(), holders=holders,
            ready=tuple(m.node_id for m in members if shard in m.ready),
            lag=master_record.lag if master_record is not None else None))
    return Overview(settings.cluster, tuple(rows), tuple(members), layout.partitions if layout is not None else None,
                    now_ms())


def candidates(overview: Overview, shard: int) -> list[NodeRecord]:
    """The nodes to ask about ``shard``, in order: its master, then its holders caught up on it by least lag,
    then the others holding it (an answer from a lagging store beats none)."""
    holding = [n for n in overview.nodes if shard in n.shards and n.http]
    row = next((r for r in overview.shards if r.shard == shard), None)
    master = row.master if row is not None else None

    def rank(node: NodeRecord) -> tuple[int, int]:
        if node.node_id == master:
            return 0, 0
        return (1 if shard in node.ready else 2), node.lag if node.lag is not None else 1 << 62

    return sorted(holding, key=rank)


class _Counting:
    """A node's answer that it is still making its first count of a shard's store (503 "counting")."""


COUNTING = _Counting()


def histogram_or_counting(body: dict[str, Any]) -> PendingHistogram | _Counting:
    """A node's answer to /pending: the histogram, or :data:`COUNTING` while it makes its first count."""
    return COUNTING if body.get("status") == "counting" else histogram_from_json(body)


def sum_histograms(histograms: Mapping[int, PendingHistogram | None], read_at_ms: int) -> PendingChart:
    """Each shard's histogram summed bucket by bucket (buckets of the same start time add up).

    Nodes whose clocks read different minutes give buckets a minute apart: they are kept apart, in order.
    ``read_at_ms``: the chart's time when no shard answered.
    """
    found = [h for h in histograms.values() if h is not None]
    minutes: dict[int, Bucket] = {}
    hours: dict[int, Bucket] = {}
    for histogram in found:
        for buckets, into in ((histogram.minutes, minutes), (histogram.hours, hours)):
            for bucket in buckets:
                known = into.get(bucket.start_ms)
                into[bucket.start_ms] = bucket if known is None else Bucket(
                    bucket.start_ms, bucket.width_ms, known.count + bucket.count)
    # A minute bucket a node's later clock made beyond another's hour buckets' start stays with the minutes.
    buckets = tuple(minutes[k] for k in sorted(minutes)) + tuple(hours[k] for k in sorted(hours))
    return PendingChart(
        now_ms=min((h.now_ms for h in found), default=read_at_ms),
        count=sum(h.count for h in found), overdue=sum(h.overdue for h in found), buckets=buckets,
        later=sum(h.later for h in found), unavailable=tuple(k for k, h in histograms.items() if h is None))


# -- the upcoming list's cursor ----------------------------------------------------


def encode_cursor(positions: Mapping[int, str]) -> str:
    """One opaque cursor for the merged list: each shard still to read, with its node cursor ("" from the start).

    A shard absent from it has nothing more to show.
    """
    text = json.dumps({str(shard): position for shard, position in sorted(positions.items())}, separators=(",", ":"))
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> dict[int, str]:
    """Raises: ValueError: ``cursor`` is not one :func:`encode_cursor` wrote."""
    try:
        data = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        positions = {int(shard): position for shard, position in data.items()}
    except (binascii.Error, UnicodeDecodeError, ValueError, AttributeError, TypeError):
        data = None
    if data is None or not all(isinstance(p, str) and k >= 0 for k, p in positions.items()):
        raise ValueError(f"after={cursor[:60]!r} is not a cursor of this console's upcoming list: follow the "
                         "page's next link, or leave after out to start from the first message due")
    return positions


def node_cursor(item: UpcomingItem) -> str:
    """A node's upcoming cursor right after ``item`` (records.UpcomingPage.next's form)."""
    return f"{item.due_ms}:{item.id}"


def _cursor_key(cursor: str) -> tuple[int, str] | None:
    due, _, delay_id = cursor.partition(":")
    return (int(due), delay_id) if due.isdigit() else None


def merge_upcoming(positions: Mapping[int, str], pages: Mapping[int, UpcomingPage | None],
                   limit: int) -> tuple[list[UpcomingRow], dict[int, str]]:
    """The first ``limit`` messages due over the shards' pages, and where each shard goes on from.

    A shard whose page says there is more (``next``) has been read only up to its ``next``: a message
    due later than the earliest such point may be preceded by one not read yet, so the page ends there.
    A shard that did not answer (None) keeps its position and is asked again on the next page.

    Returns:
        The rows in due-time order; the positions of the shards still to read (:func:`encode_cursor`).
    """
    horizon: tuple[int, str] | None = None  # the earliest point some shard has not read past
    for page in pages.values():
        if page is not None and page.next is not None:
            reached = _cursor_key(page.next) or ((page.items[-1].due_ms, page.items[-1].id) if page.items else None)
            if reached is not None and (horizon is None or reached < horizon):
                horizon = reached
    merged = sorted(((item.due_ms, item.id), shard, item) for shard, page in pages.items() if page is not None
                    for item in page.items)
    taken = [UpcomingRow(shard, item) for key, shard, item in merged if horizon is None or key <= horizon][:limit]
    last_taken: dict[int, UpcomingItem] = {row.shard: row.item for row in taken}
    count_taken: dict[int, int] = {}
    for row in taken:
        count_taken[row.shard] = count_taken.get(row.shard, 0) + 1
    after = dict(positions)
    for shard, page in pages.items():
        if page is None:
            continue
        if count_taken.get(shard, 0) < len(page.items):  # the limit or the horizon left some of its items
            if shard in last_taken:
                after[shard] = node_cursor(last_taken[shard])
        elif page.next is None:
            del after[shard]  # every message of the shard shown
        else:
            after[shard] = page.next
    return taken, after


def _upcoming_path(shard: int, position: str, limit: int, topic: str | None) -> str:
    query = {"limit": str(limit), **({"after": position} if position else {}), **({"topic": topic} if topic else {})}
    return f"{SHARDS_PATH}{shard}/{UPCOMING}?{urllib.parse.urlencode(query)}"
