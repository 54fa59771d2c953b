// A delayed message for delayq, written with franz-go (github.com/twmb/franz-go), a pure-Go Kafka client.
// The wire format is docs/DESIGN.md, "Wire format".
//
//	delayq-producer BOOTSTRAP BUFFER_TOPIC TARGET_TOPIC DELAY_MS PAYLOAD [KEY]
//	    puts PAYLOAD (with KEY, if given) to be delivered to TARGET_TOPIC in DELAY_MS ms; prints the delay id
//	delayq-producer --cancel BOOTSTRAP BUFFER_TOPIC DELAY_ID
//	    cancels it (if written before its due time, it is never delivered); prints the delay id
//
// BUFFER_TOPIC is delayq-<cluster>-buffer. A reschedule is a put with the same delay id:
// call put() below with the id the first put printed.
package main

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"os"
	"regexp"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

var delayIDPattern = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// newDelayID is a UUIDv7 (48-bit Unix ms, version 7, random bits, variant 10) in lower-case text.
func newDelayID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	var ms [8]byte
	binary.BigEndian.PutUint64(ms[:], uint64(time.Now().UnixMilli()))
	copy(b[:6], ms[2:])
	b[6] = 0x70 | b[6]&0x0f
	b[8] = 0x80 | b[8]&0x3f
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// bufferPartition is the partition every record of delayID must be written to: CRC-32 (IEEE) of the id's
// bytes modulo the buffer's partition count. franz-go's own partitioner (murmur2 for a key) would pick
// another, and delayq dead-letters a record on the wrong partition: always set it explicitly.
func bufferPartition(delayID string, partitions int) int32 {
	return int32(crc32.ChecksumIEEE([]byte(delayID)) % uint32(partitions))
}

// putValue is a put's value: the frame line, then the user's key bytes, then the payload.
func putValue(deliverAtMs int64, topic string, key, payload []byte) []byte {
	keyLength := "-"
	if key != nil {
		keyLength = strconv.Itoa(len(key))
	}
	// franz-go's default partitioner hashes a key with murmur2 as the Java client does (and spreads
	// records without one): delayq delivers to the partition it would pick for an immediate send.
	frame := fmt.Sprintf("put %d %s %s partitioner=murmur2_random\n", deliverAtMs, topic, keyLength)
	value := append([]byte(frame), key...)
	return append(value, payload...)
}

// newClient is an idempotent producer (franz-go's default) that waits for every in-sync replica, and
// takes each record's partition as given.
func newClient(bootstrap string) (*kgo.Client, error) {
	return kgo.NewClient(
		kgo.SeedBrokers(bootstrap),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProduceRequestTimeout(15*time.Second),
	)
}

// partitionCount is the buffer topic's partition count, from the cluster's metadata.
func partitionCount(ctx context.Context, client *kgo.Client, bufferTopic string) (int, error) {
	topics, err := kadm.NewClient(client).ListTopics(ctx, bufferTopic)
	if err != nil {
		return 0, err
	}
	details, ok := topics[bufferTopic]
	if !ok || details.Err != nil || len(details.Partitions) == 0 {
		return 0, fmt.Errorf("buffer topic %s not found (run `delayq init` first): %v", bufferTopic, details.Err)
	}
	return len(details.Partitions), nil
}

// put writes a put of delayID (a new id, or an existing one to reschedule it); it waits for the ack.
func put(ctx context.Context, client *kgo.Client, bufferTopic, delayID, topic string, deliverAtMs int64,
	key, payload []byte) error {
	partitions, err := partitionCount(ctx, client, bufferTopic)
	if err != nil {
		return err
	}
	record := &kgo.Record{Topic: bufferTopic, Partition: bufferPartition(delayID, partitions),
		Key: []byte(delayID), Value: putValue(deliverAtMs, topic, key, payload),
		Headers: nil} // the user's headers go here; none may start "delayq-"
	return client.ProduceSync(ctx, record).FirstErr()
}

// cancel writes a cancel of delayID: a null value and the headers delayq-op and delayq-id.
func cancel(ctx context.Context, client *kgo.Client, bufferTopic, delayID string) error {
	partitions, err := partitionCount(ctx, client, bufferTopic)
	if err != nil {
		return err
	}
	record := &kgo.Record{Topic: bufferTopic, Partition: bufferPartition(delayID, partitions),
		Key: []byte(delayID), Value: nil, Headers: []kgo.RecordHeader{
			{Key: "delayq-op", Value: []byte("cancel")}, {Key: "delayq-id", Value: []byte(delayID)}}}
	return client.ProduceSync(ctx, record).FirstErr()
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	os.Exit(2)
}

func main() {
	args := os.Args[1:]
	ctx, stop := context.WithTimeout(context.Background(), 30*time.Second)
	defer stop()
	if len(args) == 4 && args[0] == "--cancel" {
		delayID := args[3]
		if !delayIDPattern.MatchString(delayID) {
			fail("not a delay id (a lower-case UUID): %s", delayID)
		}
		client, err := newClient(args[1])
		if err != nil {
			fail("cannot make a Kafka client: %v", err)
		}
		defer client.Close()
		if err := cancel(ctx, client, args[2], delayID); err != nil {
			fail("the cancel of %s was not written: %v", delayID, err)
		}
		fmt.Println(delayID)
		return
	}
	if len(args) != 5 && len(args) != 6 {
		fail("usage: delayq-producer BOOTSTRAP BUFFER_TOPIC TARGET_TOPIC DELAY_MS PAYLOAD [KEY]\n" +
			"       delayq-producer --cancel BOOTSTRAP BUFFER_TOPIC DELAY_ID")
	}
	delayMs, err := strconv.ParseInt(args[3], 10, 64)
	if err != nil || delayMs < 0 {
		fail("DELAY_MS must be a whole number of milliseconds >= 0, not %q", args[3])
	}
	var key []byte
	if len(args) == 6 {
		key = []byte(args[5])
	}
	client, err := newClient(args[0])
	if err != nil {
		fail("cannot make a Kafka client: %v", err)
	}
	defer client.Close()
	delayID := newDelayID()
	deliverAtMs := time.Now().UnixMilli() + delayMs // Unix epoch milliseconds
	if err := put(ctx, client, args[1], delayID, args[2], deliverAtMs, key, []byte(args[4])); err != nil {
		fail("the put was not written: %v", err)
	}
	fmt.Println(delayID)
}
