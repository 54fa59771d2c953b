// A delayed message for delayq, written with the plain Java KafkaProducer (kafka-clients 3.x or 4.x, Java 11+).
// The wire format is docs/DESIGN.md, "Wire format".
//
//   java DelayqProducer BOOTSTRAP BUFFER_TOPIC TARGET_TOPIC DELAY_MS PAYLOAD [KEY]
//       puts PAYLOAD (with KEY, if given) to be delivered to TARGET_TOPIC in DELAY_MS ms; prints the delay id
//   java DelayqProducer --cancel BOOTSTRAP BUFFER_TOPIC DELAY_ID
//       cancels it (if written before its due time, it is never delivered); prints the delay id
//
// BUFFER_TOPIC is delayq-<cluster>-buffer. A reschedule is a put with the same delay id:
// call put() below with the id the first put printed.

import java.nio.charset.StandardCharsets;
import java.security.SecureRandom;
import java.util.Properties;
import java.util.UUID;
import java.util.zip.CRC32;

import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public final class DelayqProducer {
    private static final SecureRandom RANDOM = new SecureRandom();

    /** A new delay id: a UUIDv7 (48-bit Unix ms, version 7, random bits, variant 10) in lower-case text. */
    static String newDelayId() {
        long ms = System.currentTimeMillis();
        long high = (ms << 16) | 0x7000L | (RANDOM.nextInt() & 0x0FFFL);
        long low = (RANDOM.nextLong() & 0x3FFFFFFFFFFFFFFFL) | 0x8000000000000000L;
        return new UUID(high, low).toString();
    }

    /**
     * The buffer partition every record of {@code delayId} must be written to: CRC32 of the id's bytes
     * modulo the buffer's partition count. The Java client's own partitioner (murmur2) would pick
     * another, and delayq dead-letters a record on the wrong partition: always set it explicitly.
     */
    static int bufferPartition(String delayId, int partitions) {
        CRC32 crc = new CRC32();
        crc.update(delayId.getBytes(StandardCharsets.US_ASCII));
        return (int) (crc.getValue() % partitions);
    }

    /** A put's value: the frame line, then the user's key bytes, then the payload. */
    static byte[] putValue(long deliverAtMs, String topic, byte[] key, byte[] payload) {
        // This producer's partitioner for the user's key is the Java client's default, murmur2
        // (random for a null key): delayq delivers to the partition it would pick for an immediate send.
        String frame = "put " + deliverAtMs + " " + topic + " " + (key == null ? "-" : key.length)
                + " partitioner=murmur2_random\n";
        byte[] head = frame.getBytes(StandardCharsets.US_ASCII);
        byte[] userKey = key == null ? new byte[0] : key;
        byte[] value = new byte[head.length + userKey.length + payload.length];
        System.arraycopy(head, 0, value, 0, head.length);
        System.arraycopy(userKey, 0, value, head.length, userKey.length);
        System.arraycopy(payload, 0, value, head.length + userKey.length, payload.length);
        return value;
    }

    static KafkaProducer<byte[], byte[]> producer(String bootstrap) {
        Properties props = new Properties();
        props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ProducerConfig.ACKS_CONFIG, "all");
        props.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        props.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, "15000");
        props.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        return new KafkaProducer<>(props);
    }

    /** Writes a put of {@code delayId} (a new id, or an existing one to reschedule it); waits for the ack. */
    static void put(KafkaProducer<byte[], byte[]> producer, String bufferTopic, String delayId, String topic,
                    long deliverAtMs, byte[] key, byte[] payload) throws Exception {
        int partition = bufferPartition(delayId, producer.partitionsFor(bufferTopic).size());
        RecordHeaders headers = new RecordHeaders();  // the user's headers go here; none may start "delayq-"
        producer.send(new ProducerRecord<>(bufferTopic, partition, delayId.getBytes(StandardCharsets.US_ASCII),
                putValue(deliverAtMs, topic, key, payload), headers)).get();
    }

    /** Writes a cancel of {@code delayId}: a null value and the headers delayq-op and delayq-id. */
    static void cancel(KafkaProducer<byte[], byte[]> producer, String bufferTopic, String delayId) throws Exception {
        int partition = bufferPartition(delayId, producer.partitionsFor(bufferTopic).size());
        RecordHeaders headers = new RecordHeaders();
        headers.add("delayq-op", "cancel".getBytes(StandardCharsets.US_ASCII));
        headers.add("delayq-id", delayId.getBytes(StandardCharsets.US_ASCII));
        producer.send(new ProducerRecord<>(bufferTopic, partition, delayId.getBytes(StandardCharsets.US_ASCII),
                null, headers)).get();
    }

    public static void main(String[] args) throws Exception {
        if (args.length == 4 && args[0].equals("--cancel")) {
            String delayId = args[3];
            if (!delayId.matches("[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")) {
                System.err.println("not a delay id (a lower-case UUID): " + delayId);
                System.exit(2);
            }
            try (KafkaProducer<byte[], byte[]> producer = producer(args[1])) {
                cancel(producer, args[2], delayId);
            }
            System.out.println(delayId);
            return;
        }
        if (args.length != 5 && args.length != 6) {
            System.err.println("usage: DelayqProducer BOOTSTRAP BUFFER_TOPIC TARGET_TOPIC DELAY_MS PAYLOAD [KEY]\n"
                    + "       DelayqProducer --cancel BOOTSTRAP BUFFER_TOPIC DELAY_ID");
            System.exit(2);
        }
        String delayId = newDelayId();
        long delayMs = Long.parseLong(args[3]);
        byte[] key = args.length == 6 ? args[5].getBytes(StandardCharsets.UTF_8) : null;
        try (KafkaProducer<byte[], byte[]> producer = producer(args[0])) {
            long deliverAtMs = System.currentTimeMillis() + delayMs;  // Unix epoch milliseconds
            put(producer, args[1], delayId, args[2], deliverAtMs, key, args[4].getBytes(StandardCharsets.UTF_8));
        }
        System.out.println(delayId);
    }
}
