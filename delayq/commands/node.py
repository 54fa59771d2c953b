"""``delayq node``: run one delay-service node until SIGTERM."""

from __future__ import annotations

import argparse
import logging
import os

from delayq.errors import DelayqError


def register(subparsers) -> None:
    node = subparsers.add_parser("node", help="run one delay-service node (settings from DELAYQ_* or --config)")
    node.add_argument("--config", help="a YAML or TOML settings file (same as DELAYQ_CONFIG)")
    node.add_argument("--log-level", choices=("DEBUG", "INFO", "WARNING", "ERROR"),
                      help="overrides DELAYQ_LOG_LEVEL")
    node.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from delayq.settings import Settings

    if args.config:
        os.environ["DELAYQ_CONFIG"] = args.config
    settings = Settings(**({"log_level": args.log_level} if args.log_level else {}))
    # A member process's lines say which member wrote them: they share the node's output.
    member = f"{settings.node_id} " if settings.node_group is not None else ""
    logging.basicConfig(level=settings.log_level, force=True,
                        format=f"%(asctime)s %(levelname)s %(name)s [{member}%(threadName)s] %(message)s")
    logging.getLogger("kazoo").setLevel(logging.WARNING)
    from delayq.delay_service import MemberProcesses, Node, die_with_parent
    from delayq.election import LevelNotSpoken

    try:
        if settings.processes > 1:
            return MemberProcesses(settings).run()
        if settings.node_group is not None:
            die_with_parent()
        return Node(settings).run()
    except DelayqError as err:
        # A node that cannot start says why in one line and exits 1 (an orchestrator restarts it); one too old
        # for the cluster's finalized feature level exits 2, as a refused command does: no restart helps it.
        logging.getLogger("delayq.node").error("node %s cannot start: %s", settings.node_id, err)
        return 2 if isinstance(err, LevelNotSpoken) else 1
