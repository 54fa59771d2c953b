"""The cluster's feature levels: one home for what each level lets nodes and producers write.

A level is a set of things a node must be able to read: frame options of the buffer's puts,
and what the store keeps. A cluster speaks the level recorded as finalized in ZooKeeper
(``/delayq/<cluster>/features``, :class:`delayq.election.FeatureRecord`): nothing of a higher
level is written, so an older node never meets a record it cannot read. ``delayq upgrade
finalize`` raises it once every registered node speaks the next level; it is never lowered.
Kafka's ``metadata.version`` works the same way (docs/DESIGN.md, "Versions and upgrades").

Example:
    >>> SUPPORTED_LEVEL                 # the highest level this code speaks
    2
    >>> introduced_by(SUPPORTED_LEVEL)  # the release a node must run for it
    '0.2.0'
"""

from __future__ import annotations

from dataclasses import dataclass

from delayq import __version__


@dataclass(frozen=True, slots=True)
class FeatureLevel:
    """One level: the release that introduced it, the frame options it adds (delayq/wire.py's names), what it adds."""

    level: int
    release: str
    frame_options: tuple[str, ...]
    store_format: int  # the format of the nodes' stores at this level (delayq.store; a node migrates in place)
    adds: str


LEVELS: tuple[FeatureLevel, ...] = (
    FeatureLevel(
        1, "0.1.0",
        ("partition", "partitioner", "value=null", "restores", "every", "multiplier", "cron", "tz", "times", "until",
         "occurrence", "follows", "cutoff", "attempt"), 4,
        "the wire and store of 0.1.0: every frame option it reads, stored form 4, store format delayq-time-index-4"),
    FeatureLevel(
        2, "0.2.0", ("level", "expires"), 5,
        "frame option level=N (a frame that uses an option above level 1 says the level it needs), "
        "expires=<epoch ms> (stored form 5), store format 5 (the producer writes of copy detection in a column "
        "family of their own; migrated in place when the level is finalized), member processes (a node's "
        "registration with a group, which placement counts as one node: DELAYQ_PROCESSES)"),
)

# The level that brings member processes (DELAYQ_PROCESSES, delay_service/members.py): a node of an older release
# places shards without the members' group, so they run only on a cluster finalized at it (or a new one).
MEMBERS_LEVEL = 2

# The highest level this code speaks: what a new cluster starts at, and what its nodes register.
SUPPORTED_LEVEL = LEVELS[-1].level
# The level of a cluster whose ZooKeeper records none: one that ran 0.1.0, which records no level.
UNRECORDED_LEVEL = LEVELS[0].level


def feature_level(level: int) -> FeatureLevel:
    """The entry of ``level`` in the table.

    Raises:
        ValueError: this code does not know ``level`` (a newer delayq introduced it, or it is no level).
    """
    if not UNRECORDED_LEVEL <= level <= SUPPORTED_LEVEL:
        raise ValueError(f"feature level {level} is not one delayq {__version__} knows (levels {UNRECORDED_LEVEL} to "
                         f"{SUPPORTED_LEVEL})")
    return LEVELS[level - 1]


def introduced_by(level: int) -> str:
    """The delayq release that introduced ``level``: a node speaks it from that release on.

    Raises:
        ValueError: as :func:`feature_level`.
    """
    return feature_level(level).release
