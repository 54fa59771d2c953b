"""``delayq produce``, ``delayq cancel ID``, ``delayq get ID``: one delayed message from the shell.

Where the cluster is comes from the ``DELAYQ_*`` settings (``delayq dev env`` prints them
for the embedded stack).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from delayq.cli import CommandError
from delayq.clock import DURATION_FORMS, format_span, parse_duration_ms
from delayq.errors import UsageError
from delayq.schedule import MIN_DUE_MS

if TYPE_CHECKING:
    from delayq.proxy import Producer
    from delayq.settings import Settings
# The earliest due time delayq takes (delayq.schedule.MIN_DUE_MS): 2000-01-01T00:00:00Z.
_MIN_AT = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=MIN_DUE_MS)


def duration_of(flag: str) -> Callable[[str], timedelta]:
    """The argparse type of option ``flag``: a duration in delayq's one grammar (delayq.clock).

    ``90``, ``250ms``, ``30s``, ``5m``, ``2h``, ``1d``, ``1w``; anything else raises
    argparse.ArgumentTypeError naming ``flag``, with the accepted forms.
    """
    def parse(text: str) -> timedelta:
        try:
            return timedelta(milliseconds=parse_duration_ms(text, flag))
        except UsageError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    return parse


def parse_at(text: str) -> datetime:
    """An ISO 8601 time with a timezone (``2026-12-01T09:00:00Z``, ``...+01:00``), not before 2000.

    Raises:
        argparse.ArgumentTypeError: not ISO 8601, no timezone, or before 2000-01-01
            (delayq refuses such due times: delayq.schedule.MIN_DUE_MS).
    """
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO 8601 time, e.g. 2026-12-01T09:00:00Z") from None
    if when.tzinfo is None or when.utcoffset() is None:
        raise argparse.ArgumentTypeError(f"{text!r} has no timezone: add one, e.g. {text}Z for UTC")
    if when < _MIN_AT:
        raise argparse.ArgumentTypeError(f"{text!r} is before 2000-01-01T00:00:00Z: delayq refuses due times "
                                         "before 2000")
    return when


def iso(when: datetime) -> str:
    """``when`` in ISO 8601, UTC written ``Z``."""
    text = when.isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def parse_header(text: str) -> tuple[str, bytes]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"header {text!r} must look like NAME=VALUE")
    return name, value.encode()


def register(subparsers) -> None:
    produce = subparsers.add_parser(
        "produce", help="send one message to a topic, now or later; prints the delay id of a delayed one",
        description="Send one message. With --delay, --at or --level it is held by delayq and the delay id is "
                    "printed; with --every or --cron it repeats under that id until cancelled.")
    produce.add_argument("--topic", required=True, help="target topic")
    when = produce.add_mutually_exclusive_group()
    when.add_argument("--delay", type=duration_of("--delay"), help=f"hold it this long: {DURATION_FORMS}")
    when.add_argument("--at", dest="deliver_at", type=parse_at, metavar="ISO8601",
                      help="deliver at this time, with a timezone: 2026-12-01T09:00:00Z")
    when.add_argument("--level", dest="delay_level", type=int, metavar="N",
                      help="a delay level (RocketMQ-style: 1 to 18 by default, setting DELAYQ_DELAY_LEVELS)")
    repeat = produce.add_mutually_exclusive_group()
    repeat.add_argument("--every", type=duration_of("--every"), metavar="DURATION",
                        help="repeat at this interval (the first at --delay/--at/--level, else one interval on)")
    repeat.add_argument("--cron", metavar="EXPRESSION", help="repeat at the matches of a five-field cron expression")
    produce.add_argument("--tz", default="UTC", help="the --cron expression's time zone (IANA name)")
    produce.add_argument("--times", type=int, help="repeat at most this many times in all")
    produce.add_argument("--until", type=parse_at, metavar="ISO8601", help="repeat with no occurrence after this")
    produce.add_argument("--expire-after", type=duration_of("--expire-after"), metavar="DURATION",
                         help="dead-letter it (reason expired) rather than deliver it later than this after its due "
                              "time; needs the cluster's feature level 2 (delayq upgrade finalize)")
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


def require_buffer_topic(producer: Producer, settings: Settings, timeout_s: float) -> None:
    """Fail at once, naming the topic and the fix, when the cluster's buffer topic does not exist.

    Without this a delayed produce or a cancel waits its whole timeout for a topic that is not there.

    Raises:
        CommandError: Kafka does not answer, or the buffer topic does not exist.
    """
    from confluent_kafka import KafkaError, KafkaException

    try:
        producer.buffer_partitions(timeout_s)
    except KafkaException as err:
        error = err.args[0]
        if error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            raise CommandError(f"on {settings.bootstrap_servers}: {error.str()}") from None
        raise CommandError(f"Kafka at {settings.bootstrap_servers} did not answer within {timeout_s:g}s: "
                           f"{error.str()}; is it running (delayq dev status)?") from None


def _produce(args: argparse.Namespace) -> int:
    from confluent_kafka import KafkaException

    from delayq.proxy import Producer
    from delayq.proxy.producer import send_and_wait
    from delayq.settings import Settings

    value = sys.stdin.buffer.read() if args.value == "-" else args.value.encode()
    key = args.key.encode() if args.key is not None else None
    settings = Settings()
    try:
        producer = Producer(settings.kafka_conf())
    except ValueError as err:  # a DELAYQ_* setting the producer refuses
        raise CommandError(str(err)) from err
    try:
        repeat = _repeat(args)
    except (ValueError, TypeError) as err:
        raise CommandError(str(err)) from err
    delayed = args.delay is not None or args.deliver_at is not None or bool(args.delay_level) or repeat is not None
    if delayed:
        require_buffer_topic(producer, settings, min(10.0, args.timeout))
    if args.deliver_at is not None:
        late = datetime.now(UTC) - args.deliver_at
        if late > timedelta(0):
            # Legal (it is delivered at once), but a time meant to be ahead may have come out behind.
            print(f"warning: --at {iso(args.deliver_at)} is {format_span(late)} in the past; "
                  "the message is delivered at once", file=sys.stderr, flush=True)
    ids: list[str | None] = []

    def send(report) -> None:
        try:
            ids.append(producer.produce(args.topic, value, key, headers=args.headers or None, on_delivery=report,
                                        delay=args.delay, deliver_at=args.deliver_at, delay_level=args.delay_level,
                                        repeat=repeat, expire_after=args.expire_after))
        except (ValueError, TypeError) as err:
            # Input the producer refuses before sending (a topic name, a delay past the maximum,
            # a delayq- header): one line, exit 2, as the parser's own refusals.
            raise CommandError(str(err)) from err

    try:
        msg = send_and_wait(producer, send, args.timeout)
    except KafkaException as err:
        raise CommandError(f"Kafka did not take the message: {err.args[0].str()}") from err
    if delayed:
        print(ids[0])
    else:
        print(f"delivered to {msg.topic()} [{msg.partition()}] at offset {msg.offset()}")
    return 0


def _repeat(args: argparse.Namespace):
    """The --every/--cron schedule (with --times/--until), or None."""
    from delayq.proxy import Cron, Every

    if args.every is not None:
        return Every(args.every, times=args.times, until=args.until)
    if args.cron is not None:
        return Cron(args.cron, tz=args.tz, times=args.times, until=args.until)
    if args.times is not None or args.until is not None or args.tz != "UTC":
        raise ValueError("--times, --until and --tz shape a repeating message: add --every or --cron")
    return None


def _cancel(args: argparse.Namespace) -> int:
    from confluent_kafka import KafkaException

    from delayq.proxy import Producer
    from delayq.proxy.producer import send_and_wait
    from delayq.settings import Settings
    from delayq.wire import check_delay_id

    try:
        check_delay_id(args.delay_id, "ID")
    except ValueError as err:  # not a delay id; nothing was sent
        raise CommandError(str(err)) from err
    settings = Settings()
    producer = Producer(settings.kafka_conf())
    require_buffer_topic(producer, settings, min(10.0, args.timeout))
    try:
        msg = send_and_wait(producer, lambda report: producer.cancel(args.delay_id, on_delivery=report),
                            args.timeout)
    except KafkaException as err:
        raise CommandError(f"the cancel was not written: {err.args[0].str()}") from err
    print(f"cancel of {args.delay_id} written to {msg.topic()} [{msg.partition()}] at offset {msg.offset()} "
          "(no effect if it was already delivered)")
    return 0


def _get(args: argparse.Namespace) -> int:
    from delayq.proxy import NodeUnreachable, lookup

    try:
        found = lookup(args.delay_id, timeout=args.timeout)
    except (NodeUnreachable, ValueError) as err:  # ValueError: not a delay id, or a node refused it
        raise CommandError(str(err)) from err
    if args.json:
        answer = {"id": found.delay_id, "pending": found.pending, "deliver_at_ms": found.deliver_at_ms,
                  "deliver_at": found.deliver_at.isoformat() if found.deliver_at else None,
                  "topic": found.topic, "node": found.node}
        # A series' occurrence and schedule, a retry's attempt: only for such messages.
        extra = {"occurrence": found.occurrence, "repeat": found.repeat, "attempt": found.attempt}
        print(json.dumps({**answer, **{k: v for k, v in extra.items() if v is not None}}))
    elif found.pending:
        if found.deliver_at is None:  # past the year 9999
            print(f"pending: due at {found.deliver_at_ms} ms since the epoch (after 9999) to topic {found.topic}")
        else:
            left = (found.deliver_at - datetime.now(UTC)).total_seconds()
            when = f"in {left:.1f} s" if left >= 0 else f"{-left:.1f} s overdue"
            occurrence = f", occurrence {found.occurrence} of a series ({found.repeat})" if found.occurrence else ""
            print(f"pending: due {found.deliver_at.isoformat()} ({when}) to topic {found.topic}{occurrence}")
    else:
        print(f"not pending: {found.delay_id} was delivered, cancelled, or never produced")
    return 0 if found.pending else 1
