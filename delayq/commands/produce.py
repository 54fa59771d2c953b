"""``delayq produce``, ``delayq cancel ID``, ``delayq get ID``: one delayed message from the shell.

Where the cluster is comes from the ``DELAYQ_*`` settings (``delayq dev env`` prints them
for the embedded stack).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from datetime import datetime, timedelta, timezone

from confluent_kafka import KafkaException

from delayq import Settings
from delayq.cli import CommandError

_UNITS = {"ms": timedelta(milliseconds=1), "s": timedelta(seconds=1), "m": timedelta(minutes=1),
          "h": timedelta(hours=1), "d": timedelta(days=1)}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")


def parse_duration(text: str) -> timedelta:
    """``30s``, ``5m``, ``2h``, ``1d``, ``250ms``, ``1h30m``, or plain seconds (``90``, ``1.5``).

    Raises:
        argparse.ArgumentTypeError: anything else, with the accepted forms.
    """
    text = text.strip()
    if re.fullmatch(r"\d+(?:\.\d+)?", text):
        return timedelta(seconds=float(text))
    if text and re.fullmatch(f"(?:{_PART.pattern})+", text):
        return sum((float(n) * _UNITS[unit] for n, unit in _PART.findall(text)), timedelta())
    raise argparse.ArgumentTypeError(f"{text!r} is not a duration: use e.g. 30s, 5m, 2h, 1d, 250ms, 1h30m "
                                     "or plain seconds")


def parse_at(text: str) -> datetime:
    """An ISO 8601 time with a timezone (``2026-12-01T09:00:00Z``, ``...+01:00``)."""
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO 8601 time, e.g. 2026-12-01T09:00:00Z") from None
    if when.tzinfo is None:
        raise argparse.ArgumentTypeError(f"{text!r} has no timezone: add one, e.g. {text}Z for UTC")
    return when


def parse_header(text: str) -> tuple[str, bytes]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"header {text!r} must look like NAME=VALUE")
    return name, value.encode()


def register(subparsers) -> None:
    produce = subparsers.add_parser(
        "produce", help="send one message to a topic, now or later; prints the delay id of a delayed one",
        description="Send one message. With --delay or --at it is held by delayq and the delay id is printed.")
    produce.add_argument("--topic", required=True, help="target topic")
    when = produce.add_mutually_exclusive_group()
    when.add_argument("--delay", type=parse_duration, help="hold it this long: 30s, 5m, 2h, 1d, 250ms, 1h30m")
    when.add_argument("--at", dest="deliver_at", type=parse_at, metavar="ISO8601",
                      help="deliver at this time, with a timezone: 2026-12-01T09:00:00Z")
    produce.add_argument("--key", help="message key (UTF-8)")
    produce.add_argument("--header", dest="headers", action="append", type=parse_header, default=[],
                         metavar="NAME=VALUE", help="a header; repeat for more")
    produce.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for Kafka to take it")
    produce.add_argument("value", metavar="VALUE|-", help="the payload (UTF-8), or - to read it from stdin")
    produce.set_defaults(func=_produce)

    cancel = subparsers.add_parser("cancel", help="cancel a delayed message by its delay id")
    cancel.add_argument("delay_id", metavar="ID")
    cancel.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for Kafka to take it")
    cancel.set_defaults(func=_cancel)

    get = subparsers.add_parser("get", help="is a delayed message still pending, and when is it due (exit 1: not)")
    get.add_argument("delay_id", metavar="ID")
    get.add_argument("--json", action="store_true", help="print the answer as JSON")
    get.add_argument("--timeout", type=float, default=2.0, help="seconds to wait for each node")
    get.set_defaults(func=_get)


def _produce(args: argparse.Namespace) -> int:
    from delayq.proxy import Producer
    from delayq.proxy.producer import send_and_wait

    value = sys.stdin.buffer.read() if args.value == "-" else args.value.encode()
    key = args.key.encode() if args.key is not None else None
    producer = Producer(Settings().kafka_conf())
    delayed = args.delay is not None or args.deliver_at is not None
    ids: list[str | None] = []

    def send(report) -> None:
        ids.append(producer.produce(args.topic, value, key, headers=args.headers or None, on_delivery=report,
                                    delay=args.delay, deliver_at=args.deliver_at))

    try:
        msg = send_and_wait(producer, send, args.timeout)
    except KafkaException as err:
        raise CommandError(f"Kafka did not take the message: {err.args[0]}") from err
    if delayed:
        print(ids[0])
    else:
        print(f"delivered to {msg.topic()} [{msg.partition()}] at offset {msg.offset()}")
    return 0


def _cancel(args: argparse.Namespace) -> int:
    from delayq.proxy import cancel

    try:
        msg = cancel(args.delay_id, conf=Settings().kafka_conf(), timeout=args.timeout)
    except KafkaException as err:
        raise CommandError(f"the cancel was not written: {err.args[0]}") from err
    print(f"cancel of {args.delay_id} written to {msg.topic()} [{msg.partition()}] at offset {msg.offset()} "
          "(no effect if it was already delivered)")
    return 0


def _get(args: argparse.Namespace) -> int:
    from delayq.proxy import NodeUnreachable, lookup

    try:
        found = lookup(args.delay_id, timeout=args.timeout)
    except NodeUnreachable as err:
        raise CommandError(str(err)) from err
    if args.json:
        print(json.dumps({"id": found.delay_id, "pending": found.pending, "deliver_at_ms": found.deliver_at_ms,
                          "deliver_at": found.deliver_at.isoformat() if found.deliver_at else None,
                          "topic": found.topic, "node": found.node}))
    elif found.pending:
        left = (found.deliver_at - datetime.now(timezone.utc)).total_seconds()
        when = f"in {left:.1f} s" if left >= 0 else f"{-left:.1f} s overdue"
        print(f"pending: due {found.deliver_at.isoformat()} ({when}) to topic {found.topic}")
    else:
        print(f"not pending: {found.delay_id} was delivered, cancelled, or never produced")
    return 0 if found.pending else 1
