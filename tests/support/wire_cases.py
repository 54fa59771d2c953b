"""One table of buffer records, valid and malformed, that every reader of the buffer must classify alike.

The node (delayq.wire.parse_buffer_record in ingest) and the reconciliation (Spark)
are both held to it: same op for a valid record, same reason code for a malformed one.
Records are on a buffer of ``PARTITIONS`` partitions; ``partition`` None means "the id's own".
"""

from __future__ import annotations

from dataclasses import dataclass

from delayq import wire

PARTITIONS = 3
ID = "0190a3e4-5b6c-7d8e-9f00-112233445566"
OWN = wire.buffer_partition(ID, PARTITIONS)
OTHER = (OWN + 1) % PARTITIONS
DUE = b"1800000000000"


@dataclass(frozen=True)
class Case:
    name: str
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]
    expected: bytes | wire.Reason  # the op of a valid record, or the code of a malformed one
    partition: int = OWN
    text: str = ""  # a piece of the reason's text, for malformed records


def _put(frame: bytes, rest: bytes = b"x") -> bytes:
    return frame + b"\n" + rest


K = ID.encode()
MARK = wire.mark_id(1, PARTITIONS).encode()
CANCEL = [(wire.OP, b"cancel"), (wire.ID, K)]
CASES = [
    Case("put", K, _put(b"put " + DUE + b" orders -"), [], wire.OP_PUT),
    Case("put with key and options", K, _put(b"put " + DUE + b" orders 2 partition=1 partitioner=murmur2", b"kkv"),
         [("trace", b"1")], wire.OP_PUT),
    Case("put of a null value", K, b"put " + DUE + b" orders - value=null\n", [], wire.OP_PUT),
    Case("master's copy", K, _put(b"put " + DUE + b" orders - restores=7"), [], wire.OP_PUT),
    Case("expiring put (level 2)", K, _put(b"put " + DUE + b" orders - level=2 expires=1800000001000"), [],
         wire.OP_PUT),
    Case("a frame that says level 2 and uses nothing of it", K, _put(b"put " + DUE + b" orders - level=2"), [],
         wire.OP_PUT),
    Case("repeating every 1 s, 5 times", K, _put(b"put " + DUE + b" orders - every=1000 times=5"), [], wire.OP_PUT),
    Case("repeating, growing intervals", K, _put(b"put " + DUE + b" orders - every=1000 multiplier=1.5"), [],
         wire.OP_PUT),
    Case("repeating by cron", K, _put(b"put " + DUE + b" orders - cron=*/5_*_*_*_1-5 tz=Europe/Berlin until="
                                      + DUE), [], wire.OP_PUT),
    Case("a master's next occurrence", K,
         _put(b"put " + DUE + b" orders - every=1000 occurrence=3 follows=12 cutoff=14"), [], wire.OP_PUT),
    Case("a retry", K, _put(b"put " + DUE + b" orders - partition=0 attempt=2"), [], wire.OP_PUT),
    Case("cancel", K, None, CANCEL, wire.OP_CANCEL),
    Case("cancel without delayq-id", K, None, [(wire.OP, b"cancel")], wire.OP_CANCEL),
    Case("done", K, None, wire.done_headers(ID, 7, 9), wire.OP_DONE),
    Case("partition mark", MARK, None, wire.done_headers(MARK.decode(), 0, 0), wire.OP_DONE, 1),
    # -- malformed --------------------------------------------------------
    Case("cancel on the wrong partition", K, None, CANCEL, wire.Reason.WRONG_PARTITION, OTHER, "crc32(id)"),
    Case("put on the wrong partition", K, _put(b"put " + DUE + b" orders -"), [], wire.Reason.WRONG_PARTITION, OTHER),
    Case("put of a partition mark's id", MARK, _put(b"put " + DUE + b" orders -"), [], wire.Reason.BAD_ID, 1,
         "partition mark"),
    Case("cancel of a partition mark's id", MARK, None, [(wire.OP, b"cancel"), (wire.ID, MARK)], wire.Reason.BAD_ID,
         1, "partition mark"),
    Case("no key", None, _put(b"put " + DUE + b" orders -"), [], wire.Reason.BAD_ID, 0, "no key"),
    Case("empty key", b"", None, CANCEL, wire.Reason.BAD_ID, 0, "no key"),
    Case("key not a UUID", b"order-17", _put(b"put " + DUE + b" orders -"), [], wire.Reason.BAD_ID,
         wire.buffer_partition("order-17", PARTITIONS), "not a delay id"),
    Case("key an upper-case UUID", ID.upper().encode(), None, [(wire.OP, b"cancel")], wire.Reason.BAD_ID,
         wire.buffer_partition(ID.upper(), PARTITIONS), "lower-case"),
    Case("key not ASCII", b"\xff", None, [(wire.OP, b"cancel")], wire.Reason.BAD_ID,
         wire.buffer_partition(b"\xff", PARTITIONS)),
    Case("no frame", K, b"payload without a frame", [], wire.Reason.BAD_FRAME, OWN, "must start with 'put"),
    Case("empty value", K, b"", [], wire.Reason.BAD_FRAME),
    Case("three fields", K, _put(b"put " + DUE + b" orders"), [], wire.Reason.BAD_FRAME),
    Case("frame line ends \\r\\n", K, b"put " + DUE + b" orders -\r\nx", [], wire.Reason.BAD_FRAME, OWN,
         "key length"),
    Case("frame line ends \\r\\n after a key length", K, b"put " + DUE + b" orders 1\r\nkx", [],
         wire.Reason.BAD_FRAME),
    Case("key length past the end", K, _put(b"put " + DUE + b" orders 5", b"abc"), [], wire.Reason.BAD_FRAME, OWN,
         "runs past the end"),
    Case("due time not digits", K, _put(b"put soon orders -"), [], wire.Reason.BAD_FRAME),
    Case("negative due time", K, _put(b"put -5 orders -"), [], wire.Reason.BAD_FRAME),
    Case("two spaces", K, _put(b"put  " + DUE + b" orders -"), [], wire.Reason.BAD_FRAME),
    Case("topic Kafka refuses", K, _put(b"put " + DUE + b" a/b -"), [], wire.Reason.BAD_FRAME, OWN, "topic"),
    Case("topic not UTF-8", K, _put(b"put " + DUE + b" \xff -"), [], wire.Reason.BAD_FRAME),
    Case("value=null with bytes after", K, _put(b"put " + DUE + b" orders - value=null", b"left"), [],
         wire.Reason.BAD_FRAME, OWN, "bytes follow"),
    Case("option twice", K, _put(b"put " + DUE + b" orders - partition=1 partition=2"), [], wire.Reason.BAD_FRAME,
         OWN, "twice"),
    Case("frame line too long", K, b"put " + DUE + b" orders -" + b" " * 600 + b"\nx", [], wire.Reason.BAD_FRAME),
    Case("unknown option", K, _put(b"put " + DUE + b" orders - bogus=1"), [], wire.Reason.UNKNOWN_OPTION, OWN,
         "bogus=1"),
    Case("unknown partitioner", K, _put(b"put " + DUE + b" orders - partitioner=sticky"), [],
         wire.Reason.UNKNOWN_OPTION, OWN, "partitioner 'sticky'"),
    Case("every and cron", K, _put(b"put " + DUE + b" orders - every=1000 cron=*_*_*_*_*"), [],
         wire.Reason.BAD_FRAME, OWN, "not both"),
    Case("occurrence without a schedule", K, _put(b"put " + DUE + b" orders - occurrence=2"), [],
         wire.Reason.BAD_FRAME, OWN, "repeating message"),
    Case("multiplier without every", K, _put(b"put " + DUE + b" orders - cron=*_*_*_*_* multiplier=2"), [],
         wire.Reason.BAD_FRAME, OWN, "needs every"),
    Case("multiplier below 1", K, _put(b"put " + DUE + b" orders - every=5 multiplier=0.5"), [],
         wire.Reason.BAD_FRAME, OWN, "from 1"),
    Case("every=0", K, _put(b"put " + DUE + b" orders - every=0"), [], wire.Reason.BAD_FRAME, OWN, "at least 1"),
    Case("cron with four fields", K, _put(b"put " + DUE + b" orders - cron=*_*_*_*"), [], wire.Reason.BAD_FRAME,
         OWN, "five fields"),
    Case("cron out of range", K, _put(b"put " + DUE + b" orders - cron=61_*_*_*_*"), [], wire.Reason.BAD_FRAME,
         OWN, "not valid"),
    Case("unknown time zone", K, _put(b"put " + DUE + b" orders - cron=*_*_*_*_* tz=Mars/Olympus"), [],
         wire.Reason.BAD_FRAME, OWN, "time zone"),
    Case("cutoff without follows", K, _put(b"put " + DUE + b" orders - every=5 cutoff=3"), [], wire.Reason.BAD_FRAME,
         OWN, "needs follows"),
    Case("schedule option twice", K, _put(b"put " + DUE + b" orders - every=5 every=6"), [], wire.Reason.BAD_FRAME,
         OWN, "twice"),
    Case("expires= without level=", K, _put(b"put " + DUE + b" orders - expires=1800000001000"), [],
         wire.Reason.BAD_FRAME, OWN, "must say level=2"),
    Case("expires= before the due time", K, _put(b"put " + DUE + b" orders - level=2 expires=1700000000000"), [],
         wire.Reason.BAD_FRAME, OWN, "before its deliver-at time"),
    Case("expires= on a repeating message", K, _put(b"put " + DUE + b" orders - level=2 every=5 expires=" + DUE),
         [], wire.Reason.BAD_FRAME, OWN, "repeating message"),
    Case("level=1", K, _put(b"put " + DUE + b" orders - level=1"), [], wire.Reason.BAD_FRAME, OWN, "only from 2"),
    Case("level= twice", K, _put(b"put " + DUE + b" orders - level=2 level=2"), [], wire.Reason.BAD_FRAME, OWN,
         "twice"),
    Case("due time in seconds", K, _put(b"put 1795404000 orders -"), [], wire.Reason.BAD_DUE_TIME, OWN,
         "seconds"),
    Case("due time 1", K, _put(b"put 1 orders -"), [], wire.Reason.BAD_DUE_TIME),
    Case("put with a delayq- header", K, _put(b"put " + DUE + b" orders -"), [(wire.OP, b"put")],
         wire.Reason.RESERVED_HEADER, OWN, "carries header delayq-op"),
    Case("put with delayq-id", K, _put(b"put " + DUE + b" orders -"), [("ok", b"1"), (wire.ID, K)],
         wire.Reason.RESERVED_HEADER),
    Case("tombstone without op", K, None, [], wire.Reason.BAD_CONTROL, OWN, "needs header delayq-op"),
    Case("tombstone with an unknown op", K, None, [(wire.OP, b"launch")], wire.Reason.BAD_CONTROL),
    Case("tombstone with op put", K, None, [(wire.OP, b"put")], wire.Reason.BAD_CONTROL),
    Case("op twice", K, None, [(wire.OP, b"cancel"), (wire.OP, b"cancel")], wire.Reason.BAD_CONTROL, OWN,
         "appears twice"),
    Case("delayq-id not the key", K, None, [(wire.OP, b"cancel"), (wire.ID, b"other")], wire.Reason.BAD_CONTROL,
         OWN, "differs from the record key"),
    Case("cancel with a version", K, None, [*CANCEL, (wire.VERSION, b"1")], wire.Reason.BAD_CONTROL, OWN,
         "only a done"),
    Case("done with a bad version", K, None, [(wire.OP, b"done"), (wire.VERSION, b"7x")], wire.Reason.BAD_CONTROL,
         OWN, "delayq-version"),
    Case("done with a null version", K, None, [(wire.OP, b"done"), (wire.VERSION, None)], wire.Reason.BAD_CONTROL),
    Case("done without version and cutoff", K, None, [(wire.OP, b"done"), (wire.ID, K)], wire.Reason.BAD_CONTROL,
         OWN, "a done needs headers delayq-version"),
    Case("done without a cutoff", K, None, [(wire.OP, b"done"), (wire.ID, K), (wire.VERSION, b"7")],
         wire.Reason.BAD_CONTROL, OWN, "no delayq-cutoff"),
    Case("done with a negative cutoff", K, None, [(wire.OP, b"done"), (wire.VERSION, b"1"), (wire.CUTOFF, b"-1")],
         wire.Reason.BAD_CONTROL, OWN, "delayq-cutoff"),
]
