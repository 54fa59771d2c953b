#!/usr/bin/env bash
# delayq with kcat: write a put (a delayed message) or a cancel to the buffer topic.
# The wire format is docs/DESIGN.md, "Wire format"; these are its kcat examples, runnable
# (tests/integration/test_other_clients.py runs them against real nodes).
#
#   delayq-kcat.sh put BROKERS BUFFER_TOPIC TOPIC DELAY_MS PAYLOAD [KEY [HEADER=VALUE ...]]
#       puts PAYLOAD (with KEY and headers, if given) to be delivered to TOPIC in DELAY_MS ms;
#       prints the delay id
#   delayq-kcat.sh cancel BROKERS BUFFER_TOPIC DELAY_ID
#       cancels it; prints the delay id
#
# BUFFER_TOPIC is delayq-<cluster>-buffer. A reschedule is a put with the same delay id
# (set ID=<the id> in the environment of a put); frame options go in OPTIONS (OPTIONS="every=60000
# times=5" repeats the message every minute, five times; "attempt=2" marks a retry). KCAT names the kcat to run (default: kcat).
# Needs python3 (the UUIDv7 and the CRC32) and GNU date. PAYLOAD and KEY must not contain
# byte 0x1e, kcat's message delimiter here; for any bytes, write the value to a file and
# give kcat the file name instead of stdin (kcat sends a file as one message).
set -euo pipefail
export LC_ALL=C  # ${#KEY} counts bytes, not characters
KCAT=${KCAT:-kcat}
usage="usage: $0 put BROKERS BUFFER_TOPIC TOPIC DELAY_MS PAYLOAD [KEY [HEADER=VALUE ...]]
       $0 cancel BROKERS BUFFER_TOPIC DELAY_ID"
[ $# -ge 4 ] || { echo "$usage" >&2; exit 2; }
OP=$1 BROKERS=$2 BUFFER=$3
shift 3

# The buffer's partition count, and the partition of an id: CRC32 of its bytes, modulo the count.
N=$("$KCAT" -L -b "$BROKERS" -t "$BUFFER" | sed -n 's/.* with \([0-9]*\) partitions.*/\1/p')
[ "${N:-0}" -gt 0 ] || { echo "buffer topic $BUFFER not found on $BROKERS (run delayq init)" >&2; exit 1; }
partition_of() {
  python3 -c 'import sys, zlib; print(zlib.crc32(sys.argv[1].encode()) % int(sys.argv[2]))' "$1" "$N"
}

case $OP in
put)
  [ $# -ge 3 ] || { echo "$usage" >&2; exit 2; }
  TOPIC=$1 DELAY_MS=$2 PAYLOAD=$3
  shift 3
  if [ $# -ge 1 ]; then KEY=$1 KEYLEN=${#1}; shift; else KEY= KEYLEN=-; fi
  HEADERS=()
  for header in "$@"; do HEADERS+=(-H "$header"); done
  # A new delay id: a UUIDv7 (time-ordered; any lower-case UUID is accepted). Python 3.14+: uuid.uuid7().
  ID=${ID:-$(python3 -c 'import os, time, uuid; ms = time.time_ns() // 10**6; r = int.from_bytes(os.urandom(10), "big"); print(uuid.UUID(int=ms << 80 | 7 << 76 | (r >> 68) << 64 | 2 << 62 | r & (1 << 62) - 1))')}
  P=$(partition_of "$ID")
  DUE=$(( $(date +%s%3N) + DELAY_MS ))
  # The value: the frame line (ended by \n), the user's key bytes, the payload. -D '\x1e' makes kcat
  # split messages at byte 0x1e instead of newlines, so the frame's newline stays inside the value.
  # OPTIONS: frame options, if any; OPTIONS="every=60000 times=5" makes it a repeating message.
  printf 'put %s %s %s%s\n%s%s' "$DUE" "$TOPIC" "$KEYLEN" "${OPTIONS:+ $OPTIONS}" "$KEY" "$PAYLOAD" \
    | "$KCAT" -P -b "$BROKERS" -X enable.idempotence=true -t "$BUFFER" -p "$P" -k "$ID" -D '\x1e' "${HEADERS[@]}"
  ;;
cancel)
  ID=$1
  P=$(partition_of "$ID")
  # key = the id, value = null (-Z sends the empty value after the key delimiter ':' as null).
  echo "$ID:" | "$KCAT" -P -b "$BROKERS" -X enable.idempotence=true -t "$BUFFER" -p "$P" -K: -Z -H delayq-op=cancel -H "delayq-id=$ID"
  ;;
*)
  echo "$usage" >&2
  exit 2
  ;;
esac
echo "$ID"
