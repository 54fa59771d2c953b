"""Who may change a cluster's znodes: ZooKeeper digest ACLs (DESIGN.md, "ZooKeeper ACLs").

With credentials (``DELAYQ_ZK_AUTH=user:password``) every znode delayq creates under
``/delayq/<cluster>`` carries :func:`cluster_acl`: all rights for that digest identity, read
for anyone. Read stays open because nothing stored there is secret (node addresses, epochs,
cursors, the shard count) and because producers (``lookup``) and ``delayq status`` find the
nodes through it: they should not need credentials that could also rewrite the election.

The parent ``/delayq`` is shared by every cluster of the ensemble, possibly with other
credentials: anyone may read it and create a cluster folder in it, only its creator may
change or delete it.
"""

from __future__ import annotations

import logging
import posixpath
import uuid

from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError, NodeExistsError, NoNodeError
from kazoo.security import ACL, Id, Permissions, make_digest_acl

from delayq.errors import ConfigurationError

log = logging.getLogger("delayq.election")

ANYONE = Id("world", "anyone")


def cluster_acl(credentials: str | None) -> list[ACL] | None:
    """The ACL of every znode of a cluster: all rights for the digest identity, read for anyone; None: open."""
    if credentials is None:
        return None
    user, _, password = credentials.partition(":")
    return [make_digest_acl(user, password, all=True), ACL(Permissions.READ, ANYONE)]


def parent_acl(credentials: str) -> list[ACL]:
    """``/delayq``'s ACL: anyone may read it and create a cluster in it; only its creator changes or deletes it."""
    user, _, password = credentials.partition(":")
    return [make_digest_acl(user, password, all=True), ACL(Permissions.READ | Permissions.CREATE, ANYONE)]


def _is_open(acl: list[ACL]) -> bool:
    return any(entry.id == ANYONE and entry.perms & Permissions.WRITE for entry in acl)


def _owners(acl: list[ACL]) -> list[str]:
    """The user names of the digest identities with write rights (never their hashes)."""
    return sorted({entry.id.id.partition(":")[0] for entry in acl
                   if entry.id.scheme == "digest" and entry.perms & Permissions.WRITE})


def ensure_cluster_root(client: KazooClient, root: str, credentials: str | None, *, protect_existing: bool) -> None:
    """Create ``root`` (``/delayq/<cluster>``) with the cluster's ACL, and check this client may change it.

    With ``protect_existing`` (``delayq init``), a cluster created without credentials gets
    the ACL on every znode it has; otherwise (a node) an open cluster is only warned about.

    Raises:
        ConfigurationError: ZooKeeper refused this client (wrong or missing credentials), one
            line naming the path and the owners' user names.
    """
    acl = cluster_acl(credentials)
    try:
        if credentials is not None:
            parent = posixpath.dirname(root)
            if parent not in ("", "/") and not client.exists(parent):
                try:
                    client.create(parent, b"", acl=parent_acl(credentials), makepath=True)
                except NodeExistsError:
                    pass
        client.ensure_path(root, acl=acl)
        found, _ = client.get_acls(root)
        if credentials is not None and _is_open(found):
            if protect_existing:
                protected = apply_acl(client, root, acl or [])
                log.warning("cluster znodes under %s were open to anyone: %d now carry the ACL of %s", root,
                            protected, credentials.partition(":")[0])
            else:
                log.warning("cluster znodes under %s are open to anyone although DELAYQ_ZK_AUTH is set: run "
                            "`delayq init` with it to protect them", root)
        _check_may_write(client, root)
    except NoAuthError:
        raise ConfigurationError(_refused(client, root, credentials)) from None


def apply_acl(client: KazooClient, root: str, acl: list[ACL]) -> int:
    """Set ``acl`` on ``root`` and every znode below it; returns how many."""
    count = 0
    pending = [root]
    while pending:
        path = pending.pop()
        try:
            client.set_acls(path, acl)
            pending.extend(posixpath.join(path, child) for child in client.get_children(path))
        except NoNodeError:
            continue  # an ephemeral znode that went meanwhile
        count += 1
    return count


def _check_may_write(client: KazooClient, root: str) -> None:
    """Create and delete a scratch child: digest auth never fails at login, only at the first write."""
    probe = f"{root}/access-check-{uuid.uuid4().hex}"
    client.create(probe, b"", ephemeral=True)
    client.delete(probe)


def _refused(client: KazooClient, root: str, credentials: str | None) -> str:
    try:
        owners = _owners(client.get_acls(root)[0]) if client.exists(root) else []
    except NoAuthError:
        owners = []
    if not owners:
        try:
            owners = _owners(client.get_acls(posixpath.dirname(root))[0])
        except (NoAuthError, NoNodeError):
            owners = []
    belongs = f"its znodes belong to ZooKeeper digest user {', '.join(map(repr, owners))}" if owners else \
        "its ACL does not let this client write"
    if credentials is None:
        return (f"ZooKeeper refused an unauthenticated client on {root} (NoAuth): {belongs}; set DELAYQ_ZK_AUTH "
                "to that user's 'user:password'")
    return (f"ZooKeeper refused DELAYQ_ZK_AUTH user {credentials.partition(':')[0]!r} on {root} (NoAuth: a wrong "
            f"password or another user): {belongs}; set DELAYQ_ZK_AUTH to that user's 'user:password'")
