"""The stores of the shards a node holds: where they live, opening one it can trust, following the cluster's level.

A store is a view of the buffer, so one that cannot be trusted is not repaired: it is wiped
and read again from the buffer, and the node says why (:class:`RebuildReason`, the label of
``delayq_store_rebuilds_total``). One a store format old is migrated in place instead
(docs/DESIGN.md, "Store formats follow the finalized feature level").
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from confluent_kafka.admin import AdminClient
from kazoo.client import KazooClient
from kazoo.exceptions import KazooException

from delayq import wire
from delayq.clock import now_ms
from delayq.election import Features, ShardLayout
from delayq.features import SUPPORTED_LEVEL, UNRECORDED_LEVEL, feature_level
from delayq.settings import Settings
from delayq.store import StoreError, StoreFormatError, StoreOptions, TimeIndex

from .metrics import NodeMetrics
from .store_copies import authorization, copy_from_peers
from .topics import BufferInfo, EndOffsets, committed_end_offsets

log = logging.getLogger("delayq.node")


class RebuildReason(enum.StrEnum):
    """Why a node wiped its store and read the buffer again: the label of delayq_store_rebuilds_total."""

    FORMAT = "format"                    # two or more store formats old (or newer): no in-place migration
    TOPIC_RECREATED = "topic-recreated"  # the buffer topic has another id than the store was built from
    STALE = "stale"                      # away longer than delete.retention.ms: tombstones may be gone
    OFFSETS_AHEAD = "offsets-ahead"      # a stored offset is past the topic's end: the topic was recreated


SHARDS_DIR = "shards"  # <data_dir>/shards/<k>: one store per shard held
MEMBERS_DIR = "members"  # <data_dir>/members/<i>: member i's data folder (DELAYQ_PROCESSES > 1, members.py)
META_TOPIC_ID = "buffer_topic_id"
# How often the node reads the cluster's finalized feature level: a finalize migrates the stores within it.
FOLLOW_LEVEL_EVERY_S = 5.0


def forget_stores(root: Path, why: str) -> None:
    """Delete the shard stores under ``root`` (``root/shards/<k>``) that no process uses any more; ``why`` is logged.

    When a node's data folder changes shape (``DELAYQ_PROCESSES`` raised or lowered), the stores
    of the old shape would stay on disk for good. They are views of the buffer: deleting one
    costs at most a rebuild. One that is open (its process still runs) or no store is left alone.
    """
    folder = root / SHARDS_DIR
    if not folder.is_dir():
        return
    for path in sorted(folder.iterdir()):
        try:
            TimeIndex.destroy(path)
        except StoreError as err:
            log.warning("left %s: %s", path, err)
            continue
        log.info("removed store %s: %s", path, why)


class ShardStores:
    """Opens the stores of the shards a node takes, and keeps them in the store format of the cluster's level.

    ``layout`` and ``end_offsets`` are given once known (the node learns the layout from
    ZooKeeper, and its ingest's reader of end offsets is made after that).
    """

    def __init__(self, settings: Settings, info: BufferInfo, metrics: NodeMetrics, admin: AdminClient):
        self.settings = settings
        self.info = info
        self.metrics = metrics
        self.admin = admin
        self.layout: ShardLayout | None = None
        self.end_offsets: EndOffsets | None = None
        # The other nodes holding a shard (node id, HTTP address), asked for a copy of a store this node lacks
        # (store_copies.py); None: none are asked (DELAYQ_STORE_COPIES=false, or before ZooKeeper is known).
        self.peers: Callable[[int], list[tuple[str, str]]] | None = None
        # The store format of the cluster's finalized level (delayq.features): new stores are made in it, older
        # ones migrated to it in place. Until the cluster is finalized above level 1 it is 0.1.0's, so that a node
        # can go back to 0.1.0 on its data directory.
        self.store_format = feature_level(UNRECORDED_LEVEL).store_format
        self._level_read_at = 0.0  # monotonic s
        # Copies of stores this node lacks, taken beside the placement loop (copying()), and the shards whose
        # store such a copy brought or failed to bring: open() asks for none again (it would come from the same nodes).
        self._copies: dict[int, threading.Thread] = {}
        self._copy_tried: set[int] = set()

    def path(self, shard: int) -> Path:
        return Path(self.settings.data_dir) / SHARDS_DIR / str(shard)

    def destroy(self, shard: int) -> None:
        """Delete shard ``shard``'s store (closed) and forget its metric series."""
        TimeIndex.destroy(self.path(shard))
        self.metrics.forget_shard(shard)

    def copying(self, shard: int, done: Callable[[], None]) -> bool:
        """Whether a copy of shard ``shard``'s store from a node holding it is under way; one is started now if this
        node has no store of the shard and holders may give one.

        The copy runs in a thread of its own (a store of millions of messages takes seconds to copy, more on a slow
        network): the placement loop that asks goes on deciding meanwhile, so a shard left without a master is
        not kept waiting by another shard's copy. ``done()`` is called when the copy ends; the shard is then taken
        (:meth:`open`) with the copy or, none having come, an empty store that ingest fills from the buffer.
        """
        running = self._copies.get(shard)
        if running is not None:
            if running.is_alive():
                return True
            del self._copies[shard]
            return False
        path = self.path(shard)
        if self.peers is None or shard in self._copy_tried or TimeIndex.exists(path):
            return False

        def copy() -> None:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                self._copy(shard, path)
            except Exception as err:  # never a crash: the shard is taken all the same, from the buffer
                log.warning("shard %d: no copy of the store: %s", shard, err)
            finally:
                done()

        log.info("shard %d: no store here: copying one from a node holding it; the shard is taken once it came",
                 shard)
        self._copy_tried.add(shard)
        thread = threading.Thread(target=copy, name=f"store-copy-{shard}", daemon=True)
        self._copies[shard] = thread
        thread.start()
        return True

    def open(self, shard: int) -> TimeIndex:
        """Shard ``shard``'s store, rebuilt from the buffer if it cannot be trusted (see RebuildReason).

        Raises:
            StoreError: the store cannot be opened or deleted now.
            KafkaException: Kafka did not answer (the store is closed again).
        """
        info = self.info
        path = self.path(shard)
        path.parent.mkdir(parents=True, exist_ok=True)
        options = StoreOptions(block_cache_mb=self.settings.store_block_cache_mb,
                               write_buffer_mb=self.settings.store_write_buffer_mb,
                               sync_writes=self.settings.store_sync_writes)
        shard_metrics = self.metrics.shard(shard)
        rebuilds = shard_metrics.rebuilds
        started = time.monotonic()
        tried = shard in self._copy_tried  # by copying(): its copy, if one came, is the store at ``path``
        self._copy_tried.discard(shard)
        copied = tried or (not TimeIndex.exists(path) and self._copy(shard, path))
        rebuilt = False  # by _rebuilt(): a copy it checked, or empty, so nothing left to check
        try:
            store = TimeIndex(path, options, store_format=self.store_format)
        except StoreFormatError as err:
            # Two or more formats old (or newer): the store is a view of the buffer, rebuilt from it (or copied).
            log.warning("store %s will be rebuilt from the buffer: %s", path, err)
            rebuilds.labels(RebuildReason.FORMAT.value).inc()
            TimeIndex.destroy(path)
            store = self._rebuilt(shard, path, options, copy=not copied)
            rebuilt = True
        if store.found_format != store.store_format:
            self._migrated(shard, store, store.found_format, time.monotonic() - started)
        shard_metrics.store_format.set(store.store_format)
        try:
            # Kafka may not answer here (a broker restarting): the store must not stay open, locked,
            # behind the error, or the next attempt to take the shard would find it locked.
            found = None if rebuilt else self._rebuild_reason(store, shard)
            if found is not None:
                code, why = found
                log.warning("store %s will be rebuilt from the buffer: %s: %s", path, code.value, why)
                rebuilds.labels(code.value).inc()
                store.close()
                TimeIndex.destroy(path)
                # One copy at the most: a second would come from the same nodes.
                store = self._rebuilt(shard, path, options, copy=not copied)
            store.set_meta(META_TOPIC_ID, info.topic_id.encode())
        except BaseException:
            store.close()
            raise
        return store

    def _rebuilt(self, shard: int, path: Path, options: StoreOptions, *, copy: bool) -> TimeIndex:
        """The store of ``shard`` at ``path`` (none there now): a holder's copy if ``copy`` and one comes that can be
        trusted, else an empty one that ingest fills from the buffer's start.

        Raises:
            StoreError: a store cannot be opened or deleted now.
            KafkaException: Kafka did not answer (the store is closed again).
        """
        if copy and self._copy(shard, path):
            try:
                store = TimeIndex(path, options, store_format=self.store_format)
            except StoreFormatError as err:  # a holder's store this code cannot read or migrate
                log.warning("the copy of store %s is not used: %s", path, err)
                TimeIndex.destroy(path)
                return TimeIndex(path, options, store_format=self.store_format)
            try:
                found = self._rebuild_reason(store, shard)
            except BaseException:
                store.close()
                raise
            if found is None:
                return store
            log.warning("the copy of store %s is not used: %s: %s", path, found[0].value, found[1])
            store.close()
            TimeIndex.destroy(path)
        return TimeIndex(path, options, store_format=self.store_format)

    def _copy(self, shard: int, path: Path) -> bool:
        """Put a copy of another node's store of ``shard`` at ``path`` (no store there); whether one came."""
        if self.peers is None:
            return False
        try:
            peers = self.peers(shard)
        except KazooException as err:
            log.warning("shard %d: no copy of the store: the nodes holding it could not be read: %s", shard, err)
            return False
        copied = copy_from_peers(peers, shard, path, authorization(self.settings, shard))
        if copied is None:
            return False
        shard_metrics = self.metrics.shard(shard)
        shard_metrics.store_copies.inc()
        shard_metrics.store_copy_seconds.set(copied.seconds)
        return True

    def level_due(self) -> bool:
        """Whether :meth:`follow_level` is due again."""
        return time.monotonic() - self._level_read_at >= FOLLOW_LEVEL_EVERY_S

    def follow_level(self, zk: KazooClient, held: Iterable[tuple[int, TimeIndex]]) -> None:
        """Read the cluster's finalized level; when it brings a newer store format, migrate the ``held`` stores to it.

        Raises:
            KazooException: ZooKeeper did not answer.
            StoreError: a store could not be migrated (it stays of its format; the next reading tries again).
        """
        self._level_read_at = time.monotonic()
        level = Features(zk, self.settings.zk_root).read().level
        # A damaged record says nothing (logged at start); a level above this node's is refused at its start.
        if level is None or level > SUPPORTED_LEVEL:
            return
        wanted = feature_level(level).store_format
        if wanted > self.store_format:
            log.info("cluster %s is finalized at feature level %d: store format %d from now on",
                     self.settings.cluster, level, wanted)
            self.store_format = wanted
        # Every reading, not only the one that saw the level rise: a store whose migration failed is tried again.
        for shard, store in held:
            if store.store_format < self.store_format:
                started = time.monotonic()
                found = store.upgrade_format(self.store_format)
                if found is not None:
                    self._migrated(shard, store, found, time.monotonic() - started)

    def _migrated(self, shard: int, store: TimeIndex, found: int, took_s: float) -> None:
        log.info("store %s migrated in place from store format %d to %d in %.2fs (no rebuild)", store.path, found,
                 store.store_format, took_s)
        shard_metrics = self.metrics.shard(shard)
        shard_metrics.migrations.inc()
        shard_metrics.store_format.set(store.store_format)

    def _rebuild_reason(self, store: TimeIndex, shard: int) -> tuple[RebuildReason, str] | None:
        info = self.info
        known_id = store.get_meta(META_TOPIC_ID)
        if known_id is not None and known_id.decode() != info.topic_id:
            return RebuildReason.TOPIC_RECREATED, (f"the store was built from buffer topic id {known_id.decode()}, "
                                                   f"the buffer now has id {info.topic_id}")
        last = store.last_ingest_ms()
        if last is not None and now_ms() - last > info.delete_retention_ms:
            return RebuildReason.STALE, (f"last ingest {(now_ms() - last) / 1000:.0f}s ago is longer than the "
                                         f"buffer's delete.retention.ms {info.delete_retention_ms}: tombstones may "
                                         "have been compacted away")
        layout = self.layout
        partitions = wire.shard_partitions(shard, layout.shards if layout else 1, len(info.partitions))
        # Through ingest's reader of end offsets, which replaces its admin client after a failure: after a
        # broker restart a client can be answered FENCED_LEADER_EPOCH for good.
        ends = self.end_offsets.read(partitions=partitions) if self.end_offsets is not None else \
            committed_end_offsets(self.admin, self.settings.buffer_topic, partitions)
        for partition, offset in store.offsets().items():
            if offset > ends.get(partition, 0):
                return RebuildReason.OFFSETS_AHEAD, (f"persisted offset {offset} of partition {partition} is above "
                                                     f"the topic's end offset {ends.get(partition, 0)}: the topic "
                                                     "was recreated")
        return None
