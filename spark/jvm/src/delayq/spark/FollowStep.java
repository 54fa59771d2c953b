package delayq.spark;

import java.io.Serializable;
import java.util.Collections;
import java.util.Iterator;

import org.apache.spark.api.java.function.FlatMapGroupsWithStateFunction;
import org.apache.spark.api.java.function.MapFunction;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.streaming.GroupState;
import org.apache.spark.sql.streaming.GroupStateTimeout;
import org.apache.spark.sql.streaming.OutputMode;
import org.apache.spark.sql.types.StructType;

/**
 * The stateful step of {@code delayq reconcile --follow} (spark/follow.py): each delay id's history kept in
 * Spark's state store and emitted whole whenever the id is touched or its check falls due.
 *
 * <p>It runs in the JVM because it is per id: as a Python function ({@code applyInPandasWithState}) it cost a
 * pandas DataFrame and a round trip to a Python worker per id and call, which bounded the job at about 320
 * messages a second on two cores. Here it joins strings and compares a few numbers. The judgement itself
 * stays where it is, the batch job's Spark SQL (spark/job.py), applied to what this step emits.
 *
 * <p>Input rows (follow.py's {@code STEP_INPUT}, found by name): id, the record as JSON (built by
 * {@code to_json}), side, kind, offset, due, version. Output rows ({@code EMITTED_SCHEMA}, in its order): id,
 * the whole history as a JSON array, the index of the first record new in this call, the micro-batch's
 * processing time, and whether the history can hold a finding now ({@code judge}).
 *
 * <p>Two histories cannot, and are not judged (the judgement is the job's costly part):
 * <ul>
 * <li>an id whose only record is a put whose check is still to come: no finding needs fewer than two records
 * (a delivery or a dead letter beside the put, two producer writes for a reorder) but a missing message, and
 * that is certain only at the check. Emitted all the same, {@code judge} false: its record is counted read.
 * <li>the check of an id with one put whose version was delivered: the check exists to find that version
 * missing or undeliverable, and everything else was judged when its evidence was read. Nothing is emitted.
 * An id with several puts (a reschedule, a master's copy, a series) is judged at its check whatever it holds.
 * </ul>
 *
 * <p>State per id ({@link IdState}): the records joined by commas, how many, how many were puts, the latest
 * put's offset and due time, the highest version delivered, when the check falls due (due time plus the grace;
 * null once done or when there is no put) and when the id is forgotten (the retention after the check, or
 * after its last record if later).
 */
public final class FollowStep implements FlatMapGroupsWithStateFunction<String, Row, FollowStep.IdState, Row> {
    private static final long serialVersionUID = 1L;

    private final long graceMs;
    private final long retainMs;
    // follow.py's BUFFER_SIDE and DELIVERED_SIDE and records.py's PUT: what marks a buffer put or a delivery.
    private final int bufferSide;
    private final int deliveredSide;
    private final int put;
    // Where the input rows hold the record, side, kind, offset, due time and version.
    private final int record, side, kind, offset, due, version;

    public FollowStep(long graceMs, long retainMs, int bufferSide, int deliveredSide, int put, StructType input) {
        this.graceMs = graceMs;
        this.retainMs = retainMs;
        this.bufferSide = bufferSide;
        this.deliveredSide = deliveredSide;
        this.put = put;
        this.version = input.fieldIndex("version");
        this.record = input.fieldIndex("record");
        this.side = input.fieldIndex("side");
        this.kind = input.fieldIndex("kind");
        this.offset = input.fieldIndex("offset");
        this.due = input.fieldIndex("due");
    }

    /**
     * The step applied to a streaming DataFrame of STEP_INPUT rows, grouped by its {@code id} column: what
     * follow.py calls through py4j. {@code emitted} is follow.py's EMITTED_SCHEMA (id, records, fresh_from,
     * judged_at, judge, in that order).
     */
    public static Dataset<Row> apply(Dataset<Row> input, String emitted, long graceMs, long retainMs,
                                     int bufferSide, int deliveredSide, int put) {
        int id = input.schema().fieldIndex("id");
        MapFunction<Row, String> key = row -> row.getString(id);
        return input.groupByKey(key, Encoders.STRING()).flatMapGroupsWithState(
                new FollowStep(graceMs, retainMs, bufferSide, deliveredSide, put, input.schema()), OutputMode.Update(),
                Encoders.bean(IdState.class), Encoders.row(StructType.fromDDL(emitted)),
                GroupStateTimeout.ProcessingTimeTimeout());
    }

    @Override
    public Iterator<Row> call(String id, Iterator<Row> rows, GroupState<IdState> state) {
        long now = state.getCurrentProcessingTimeMs();
        IdState kept = state.exists() ? state.get() : new IdState();
        int oldCount = kept.getCount();
        StringBuilder records = new StringBuilder(kept.getRecords());
        int count = oldCount;
        int puts = kept.getPuts();
        Long putOffset = kept.getPutOffset();
        Long putDue = kept.getPutDue();
        Long delivered = kept.getDelivered();
        boolean fresh = false;
        while (rows.hasNext()) {
            Row row = rows.next();
            fresh = true;
            if (records.length() > 0) {
                records.append(',');
            }
            records.append(row.getString(record));
            count++;
            if (row.isNullAt(side)) {
                continue;
            }
            int from = row.getInt(side);
            if (from == bufferSide && !row.isNullAt(kind) && row.getInt(kind) == put) {
                puts++;
                // The latest put: a buffer put at a higher offset than the latest so far.
                if (!row.isNullAt(offset) && !row.isNullAt(due)
                        && (putOffset == null || row.getLong(offset) > putOffset)) {
                    putOffset = row.getLong(offset);
                    putDue = row.getLong(due);
                }
            } else if (from == deliveredSide && !row.isNullAt(version)
                    && (delivered == null || row.getLong(version) > delivered)) {
                delivered = row.getLong(version);
            }
        }
        Long checkAt;
        long forgetAt;
        boolean emit = true;
        boolean judge = true;
        if (!fresh) {  // a timeout: the check, or the forgetting
            if (kept.getCheckAt() == null || now >= kept.getForgetAt()) {
                state.remove();
                return Collections.emptyIterator();
            }
            checkAt = null;
            forgetAt = kept.getForgetAt();
            emit = !(puts == 1 && putOffset != null && putOffset.equals(delivered));
        } else {
            checkAt = putDue == null || putDue + graceMs <= now ? null : putDue + graceMs;
            forgetAt = Math.max(now, putDue != null ? putDue + graceMs : now) + retainMs;
            judge = !(count == 1 && checkAt != null);
        }
        IdState next = new IdState();
        next.setRecords(records.toString());
        next.setCount(count);
        next.setPuts(puts);
        next.setPutOffset(putOffset);
        next.setPutDue(putDue);
        next.setDelivered(delivered);
        next.setCheckAt(checkAt);
        next.setForgetAt(forgetAt);
        state.update(next);
        state.setTimeoutDuration(Math.max(1L, (checkAt != null ? checkAt : forgetAt) - now));
        if (!emit) {
            return Collections.emptyIterator();
        }
        return Collections.singletonList(RowFactory.create(id, "[" + records + "]", oldCount, now, judge)).iterator();
    }

    /** An id's state (a bean: Spark's encoder reads and writes it by its getters and setters). */
    public static final class IdState implements Serializable {
        private static final long serialVersionUID = 1L;
        private String records = "";
        private int count;
        private int puts;
        private Long putOffset;
        private Long putDue;
        private Long delivered;
        private Long checkAt;
        private long forgetAt;

        public String getRecords() { return records; }
        public void setRecords(String records) { this.records = records; }
        public int getCount() { return count; }
        public void setCount(int count) { this.count = count; }
        public int getPuts() { return puts; }
        public void setPuts(int puts) { this.puts = puts; }
        public Long getDelivered() { return delivered; }
        public void setDelivered(Long delivered) { this.delivered = delivered; }
        public Long getPutOffset() { return putOffset; }
        public void setPutOffset(Long putOffset) { this.putOffset = putOffset; }
        public Long getPutDue() { return putDue; }
        public void setPutDue(Long putDue) { this.putDue = putDue; }
        public Long getCheckAt() { return checkAt; }
        public void setCheckAt(Long checkAt) { this.checkAt = checkAt; }
        public long getForgetAt() { return forgetAt; }
        public void setForgetAt(long forgetAt) { this.forgetAt = forgetAt; }
    }
}
