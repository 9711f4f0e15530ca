package io.shuffled.spark;

import java.io.OutputStream;
import java.util.Arrays;

/**
 * One fill of {@link SerializedSortWriter}: the records' serialized bytes back to back (it is the output stream
 * they are serialized into) and, per record, its partition and where it starts; sorted by partition when the
 * fill is written out.
 *
 * <p>The arrays are the task's heap, held as its execution memory ({@link TaskMemory}), and managed as Spark's
 * own serialized sorter manages its pages: they start small and grow, by doubling or to what Spark grants,
 * between records and only with Spark's grant, which may make the task's other operators spill (as that
 * sorter's growth does); the first time Spark grants less than asked they grow no more and fills keep the
 * size they have. A record that does not fit in what is left grows the bytes array regardless (there is no
 * stopping midway), beyond the bound if it must; if Spark refused that growth the fill goes out after the
 * record, and once a fill is out the array shrinks back within the bound and what Spark granted.
 */
final class FillBuffer extends OutputStream {
    /** The largest fill: positions in a fill are ints. */
    static final long MAX_FILL_BYTES = 1L << 30;
    /** The bytes array's first size, and its least. */
    static final int FIRST_BYTES = 64 << 10;
    /** Index bytes per record: its partition, where its bytes start and its place in the sorted order. */
    private static final int INDEX_BYTES = 12;

    private final TaskMemory memory;
    /** Bytes of serialized records plus their index that make a fill at most. */
    private final long fillBytes;
    /** The records' bytes, back to back. */
    byte[] buf = new byte[FIRST_BYTES];
    int size;
    /** The partition of each record. */
    int[] parts = new int[1024];
    /** Where each record starts in {@link #buf}; one more slot for the end of the last. */
    int[] starts = new int[1025];
    /** The record numbers ordered by partition, then arrival ({@link #sortByPartition}). */
    int[] order = new int[1024];
    /** Per partition, where its records end in {@link #order} once sorted. */
    final int[] ends;
    int records;
    /** A record grew the bytes array beyond what Spark granted: the fill must go out after it. */
    private boolean full;
    /** Spark once granted less than asked: the arrays grow no more. */
    private boolean refused;

    FillBuffer(TaskMemory memory, long fillBytes, int partitions) {
        this.memory = memory;
        this.fillBytes = Math.min(fillBytes, MAX_FILL_BYTES);
        this.ends = new int[partitions];
        memory.hold(capacity());
    }

    /** Starts a record of {@code partition}: its bytes are what is written until the next one starts. */
    void startRecord(int partition) {
        if (partition < 0 || partition >= ends.length) {
            throw new IllegalStateException("the partitioner put a record in partition " + partition + " of "
                    + ends.length);
        }
        starts[records] = size;
        parts[records] = partition;
        records++;
    }

    /**
     * After a record: whether the fill takes another, under its bound, with a free index slot and a sixteenth
     * of the bytes array free (so that a record rarely grows it midway), growing either as far as Spark grants.
     */
    boolean roomForNext() {
        if (full || size + (long) INDEX_BYTES * records >= fillBytes) {
            return false;
        }
        if (records + 1 == starts.length) {
            int length = 2 * records;
            if (grant((long) INDEX_BYTES * length) < (long) INDEX_BYTES * length) {
                memory.keep(capacity());
                return false;
            }
            parts = Arrays.copyOf(parts, length);
            starts = Arrays.copyOf(starts, length + 1);
            order = new int[length];
            memory.keep(capacity());
        }
        int length = buf.length;
        if (length - size < length >>> 4 && length < fillBytes) {
            long asked = Math.min(2L * length, fillBytes);
            long granted = grant(asked);
            if (granted < asked && granted <= length + (length >>> 3)) { // a partial grant not worth a copy
                memory.keep(capacity());
                return false;
            }
            buf = Arrays.copyOf(buf, (int) granted);
            memory.keep(capacity());
        }
        return true;
    }

    /**
     * Puts the record numbers in {@link #order} by partition, then arrival, and where each partition's end in
     * {@link #ends}: a counting sort, two passes over the records and one over the partitions, where sorting
     * a long per record took about 5 % of a session's JVM samples at 10,000 partitions.
     */
    void sortByPartition() {
        starts[records] = size;
        int at = 0;
        Arrays.fill(ends, 0);
        for (int r = 0; r < records; r++) {
            ends[parts[r]]++;
        }
        for (int p = 0; p < ends.length; p++) { // each partition's start
            int n = ends[p];
            ends[p] = at;
            at += n;
        }
        for (int r = 0; r < records; r++) { // each start moves on to its partition's end
            order[ends[parts[r]]++] = r;
        }
    }

    /**
     * Empties the fill (written out); a bytes array a record grew beyond the bound or beyond Spark's grant
     * shrinks back within both.
     */
    void clear() {
        records = 0;
        size = 0;
        full = false;
        long over = Math.max(capacity() - memory.getUsed(), 0);
        long target = Math.max(FIRST_BYTES, Math.min(buf.length - over, fillBytes));
        if (target < buf.length) {
            buf = new byte[(int) target];
            memory.keep(capacity());
        }
    }

    /** Gives the task's memory back (the arrays are garbage with the writer). */
    void release() {
        memory.keep(0);
    }

    @Override
    public void write(int b) {
        grow(1);
        buf[size++] = (byte) b;
    }

    @Override
    public void write(byte[] b, int off, int len) {
        grow(len);
        System.arraycopy(b, off, buf, size, len);
        size += len;
    }

    /** In the middle of a record there is no choice: the array grows, and if Spark refused, the fill is full. */
    private void grow(int len) {
        if (len > buf.length - size) {
            long need = (long) size + len;
            if (need > Integer.MAX_VALUE - 8) {
                throw new IllegalStateException("a serialized record of " + len + " bytes does not fit in an array");
            }
            // within the bound, by doubling; beyond it (a record that does not fit), by the record's own size
            long record = records > 0 ? need - starts[records - 1] : need;
            long most = need > fillBytes ? Math.min(need + record, Integer.MAX_VALUE - 8) : fillBytes;
            int larger = (int) Math.max(need, Math.min(2L * buf.length, most));
            full |= grant(larger) < larger;
            buf = Arrays.copyOf(buf, larger);
            memory.keep(capacity());
        }
    }

    /**
     * Asks Spark for a new array of {@code size} bytes beside those held now (both are live while it is
     * copied); returns how much of it Spark granted, all unless it refused, after which it is asked no more.
     */
    private long grant(long size) {
        if (refused) {
            return 0;
        }
        long granted = memory.hold(capacity() + size) - capacity();
        refused = granted < size;
        return Math.max(granted, 0);
    }

    /** Bytes of the arrays held now. */
    private long capacity() {
        return buf.length + 4L * parts.length + 4L * starts.length + 4L * order.length + 4L * ends.length;
    }
}
