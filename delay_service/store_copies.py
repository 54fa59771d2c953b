"""A shard's store copied from a node that holds it: a wiped or new node ready in the time of a file copy.

A store is the buffer's view up to the offsets it records, each batch applied whole with its
offsets (store/time_index.py). So a consistent copy of another node's store (a RocksDB
checkpoint: hard links, taken between two batches) is the store this node would have built by
reading the buffer up to those offsets, and it reads on from there as a node restarted on its
own disk does. Reading 10 million records through Python costs 13 us each (BENCHMARKS.md, the
rebuild row); copying their files costs what the disk and the network do.

The contract, one home for both sides:

- ``GET /v1/shards/<shard>/store`` on a node holding the shard answers 200 with the store's
  files as a tar stream (``application/x-tar``), flat names, ``Connection: close``; header
  :data:`FILES_HEADER` counts the files and :data:`BYTES_HEADER` their bytes, which the
  receiver checks. 421 when the node does not hold the shard.
- The receiver (:func:`copy_from_peers`) asks the nodes that hold the shard (ready ones first)
  in turn, unpacks into a folder of its own beside the store's place and moves it there only
  once every file arrived whole; anything less is deleted and the next node asked. The node
  then opens the copy as any store (its format, its buffer topic id, its offsets checked), and
  reads the buffer from the copy's offsets. With no copy, the buffer is read from its start.

A copy holds every pending message of the shard, payloads included, which no other node
endpoint gives. On a cluster with ZooKeeper credentials (``DELAYQ_ZK_AUTH``, the secured
mode, where Kafka's ACLs keep the buffer from strangers) a node answers a copy only to a
request carrying :func:`authorization`: an HMAC of the cluster and shard keyed by those
credentials, which every node of the cluster has and no one else needs. Without them the
buffer itself is open to whoever reaches Kafka, and so is a copy.
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import io
import logging
import os
import shutil
import tarfile
import time
import urllib.parse
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from delayq.settings import Settings
from delayq.store import StoreError, TimeIndex

log = logging.getLogger("delayq.node")

STORE = "store"  # the page of /v1/shards/<shard>/ that answers the store's copy
TAR_TYPE = "application/x-tar"
FILES_HEADER = "X-Delayq-Store-Files"
BYTES_HEADER = "X-Delayq-Store-Bytes"
COPIES_DIR = "copies"  # <data_dir>/copies/<uuid>: checkpoints being sent, copies being received
# How long one read from the sending node may take (not the whole copy, which takes as long as its bytes do).
READ_TIMEOUT_S = 15.0
CHUNK = 1 << 20


@dataclass(frozen=True)
class Copied:
    """A copy received: from which node, its size, how long it took."""

    source: str
    files: int
    size: int
    seconds: float


def authorization(settings: Settings, shard: int) -> str | None:
    """The ``Authorization`` value a copy of ``shard``'s store is asked and answered with; None without ZooKeeper
    credentials (nothing is asked then)."""
    secret = settings.zk_credentials
    if secret is None:
        return None
    proof = hmac.new(secret.encode(), f"delayq-store-copy/{settings.cluster}/{shard}".encode(), hashlib.sha256)
    return f"Bearer {proof.hexdigest()}"


def authorized(settings: Settings, shard: int, given: str | None) -> bool:
    """Whether a request for a copy of ``shard``'s store carries what :func:`authorization` gives (constant time)."""
    wanted = authorization(settings, shard)
    return wanted is None or hmac.compare_digest((given or "").encode(), wanted.encode())


def remove_leftovers(data_dir: Path, shards: Path) -> None:
    """At a node's start: the copies a process of it was sending (in ``data_dir``) or receiving (beside the stores
    in ``shards``) when it died; none is under way then."""
    shutil.rmtree(Path(data_dir) / COPIES_DIR, ignore_errors=True)
    for partial in Path(shards).glob("*.copy-*"):
        shutil.rmtree(partial, ignore_errors=True)


def make_copy(store: TimeIndex, data_dir: Path) -> Path:
    """A checkpoint of ``store`` in a new folder under ``data_dir``/copies (the caller sends it, then removes it).

    Raises:
        StoreError: the store is closed or RocksDB could not make the copy.
    """
    folder = Path(data_dir) / COPIES_DIR
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"out-{uuid.uuid4().hex}"
    store.checkpoint(path)
    return path


def copy_facts(folder: Path) -> tuple[int, int]:
    """The files of a copy (a checkpoint is flat) and their bytes."""
    sizes = [entry.stat().st_size for entry in folder.iterdir() if entry.is_file()]
    return len(sizes), sum(sizes)


def send_copy(out: IO[bytes] | io.BufferedIOBase, folder: Path) -> None:
    """Write the files of ``folder`` to ``out`` as a tar stream, then remove the folder (sent or not)."""
    try:
        with tarfile.open(fileobj=out, mode="w|", bufsize=CHUNK, format=tarfile.PAX_FORMAT) as tar:
            for entry in sorted(folder.iterdir()):
                if entry.is_file():
                    tar.add(entry, arcname=entry.name, recursive=False)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def receive_copy(url: str, shard: int, into: Path, proof: str | None = None) -> tuple[int, int]:
    """Fetch shard ``shard``'s store from the node at ``url`` into the new folder ``into``; its files and bytes.

    Raises:
        CopyRefused: the node did not send a whole copy (``into`` may hold part of one: the caller removes it).
        OSError: the connection failed.
    """
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise CopyRefused(f"{url} is not an http:// address")
    connection = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=READ_TIMEOUT_S)
    try:
        connection.request("GET", f"/v1/shards/{shard}/{STORE}", headers={"Authorization": proof} if proof else {})
        answer = connection.getresponse()
        if answer.status != 200:
            raise CopyRefused(f"answered {answer.status}: {answer.read(500).decode(errors='replace')}")
        try:
            files, size = int(answer.getheader(FILES_HEADER, "")), int(answer.getheader(BYTES_HEADER, ""))
        except ValueError as err:
            raise CopyRefused(f"no {FILES_HEADER}/{BYTES_HEADER} headers (a node of an older delayq?)") from err
        into.mkdir(parents=True)
        got_files = got_size = 0
        try:
            with tarfile.open(fileobj=answer, mode="r|", bufsize=CHUNK) as tar:
                for member in tar:
                    # A checkpoint is flat: any other name (a path, a link) is not a store's file.
                    if not member.isfile() or member.name != os.path.basename(member.name) or member.name in ("",
                                                                                                            ".", ".."):
                        raise CopyRefused(f"unexpected entry {member.name[:100]!r} in the copy")
                    source = tar.extractfile(member)
                    assert source is not None  # a regular file
                    with open(into / member.name, "wb") as target:
                        shutil.copyfileobj(source, target, CHUNK)
                    got_files, got_size = got_files + 1, got_size + member.size
        except tarfile.TarError as err:
            raise CopyRefused(f"the copy broke off: {err}") from err
        if (got_files, got_size) != (files, size):
            raise CopyRefused(f"received {got_files} files of {got_size} bytes, announced {files} of {size}")
        return files, size
    finally:
        connection.close()


class CopyRefused(Exception):
    """A node did not send a whole copy of a store."""


def copy_from_peers(peers: Iterable[tuple[str, str]], shard: int, path: Path,
                    proof: str | None = None) -> Copied | None:
    """Shard ``shard``'s store at ``path`` (not there yet), copied from the first of ``peers`` (node id, HTTP
    address) that sends a whole one, asked with ``proof`` (:func:`authorization`); None if none did (the node
    reads the buffer from its start)."""
    for node_id, url in peers:
        into = path.parent / f"{path.name}.copy-{uuid.uuid4().hex[:8]}"
        started = time.monotonic()
        try:
            files, size = receive_copy(url, shard, into, proof)
            if not TimeIndex.exists(into):
                raise CopyRefused("the files received are not a delayq store")
            into.rename(path)
        except (CopyRefused, OSError, StoreError) as err:
            log.warning("shard %d: no copy of the store from %s (%s): %s", shard, node_id, url, err)
            shutil.rmtree(into, ignore_errors=True)
            continue
        took = time.monotonic() - started
        log.info("shard %d: store copied from %s: %d files, %.1f MB in %.1fs (%.0f MB/s); reading the buffer from "
                 "its offsets", shard, node_id, files, size / 1e6, took, size / 1e6 / max(took, 1e-3))
        return Copied(node_id, files, size, took)
    return None
