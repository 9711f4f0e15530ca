package io.shuffled.client;

import io.shuffled.client.wire.PackedGroups;
import io.shuffled.client.wire.Wire;
import java.io.IOException;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.nio.ByteOrder;
import java.util.Arrays;

/**
 * The one bounded buffer of a map attempt's writer: bytes for any reduce partitions go in as they come,
 * and leave packed by partition into groups of at most a segment (PROTOCOL.md §3.3), each handed to a
 * {@link GroupSink} (the writer pushes it as one PushData).
 *
 * <p>As in Spark's own map-side sorter, the bytes are appended to pages and a long per record indexes them:
 * {@code partition << 39 | position}, the position being where the record's 4-byte length and bytes lie.
 * When the buffer is full its index is put in partition order by a stable radix sort of its partition bits
 * (a byte per pass, as many passes as the highest partition needs), so records of one partition stay in
 * the order they came and a partition's bytes keep their order, and its records are packed.
 *
 * <p>A write to the partition of the previous record extends that record, so a caller that writes one
 * partition after another adds one record per partition (per page) and its index is in order as it
 * stands. In a buffer larger than {@link #EAGER_SEGMENTS} segments such writes are packed as soon as that
 * much of them is buffered: they need no sort, and the pages they would fill could only cost memory and
 * cache misses. Only full groups leave then: the packer keeps its last, partly filled group, and the next
 * writes continue it, so the groups of writes in partition order are all full but the last and form one
 * ascending sequence of partitions. A full buffer, like the last one at {@link #finish}, goes out whole,
 * its last group included (out-of-order writes: the next round starts a new sequence anyway).
 *
 * <p>Per appended record the work is a copy and at most one index entry; per packed record, its share of a
 * radix pass (if any) and one copy into the group; per group, the directory. The capacity bounds pages plus
 * index (and the sort's second index); pages are allocated as the buffer fills and kept until
 * {@link #release}.
 */
final class PackingBuffer {
    /** Receives each packed group: its header and directory, then its data. */
    interface GroupSink {
        void group(byte[] head, int headLength, byte[] data, int dataLength) throws IOException;
    }

    /** Writes in partition order are packed once this many segments of them are buffered. */
    static final int EAGER_SEGMENTS = 8;
    private static final int LENGTH = 4;
    /** An index entry and its place in the radix sort's second array. */
    private static final int INDEX_ENTRY = 16;
    /** What a record costs of the capacity besides its bytes: its length in the page and its index entries. */
    static final int RECORD_OVERHEAD = LENGTH + INDEX_ENTRY;
    /** The smallest capacity: one record of one byte. */
    static final int MIN_CAPACITY = RECORD_OVERHEAD + 1;
    /** Pages stay below half of G1's smallest region (1 MiB): larger arrays are humongous, costly to allocate. */
    private static final int MAX_PAGE = 256 << 10;
    private static final int POSITION_BITS = 39; // partitions below 2^24 keep the index positive
    private static final long POSITION_MASK = (1L << POSITION_BITS) - 1;
    private static final VarHandle INT = MethodHandles.byteArrayViewVarHandle(int[].class, ByteOrder.BIG_ENDIAN);
    private static final VarHandle LONG = MethodHandles.byteArrayViewVarHandle(long[].class, ByteOrder.BIG_ENDIAN);

    private final long capacity;
    private final long eager;
    private final int pageSize;
    private final byte[][] pages;
    private long[] index = new long[256];
    private long[] scratch = new long[0];
    private int records;
    /** Whether the index is in partition order as it stands (writes came in partition order). */
    private boolean inOrder = true;
    private int maxPartition;
    /** Bytes counted against the capacity: the pages up to {@link #position} and the index entries. */
    private long used;
    /** Where the next byte goes, in page order. */
    private long position;
    private int lastPartition = -1;

    private final Packer packer;

    PackingBuffer(long capacity, int segmentSize, long attempt, GroupSink sink) {
        this.capacity = Math.max(MIN_CAPACITY, capacity);
        long eagerBytes = (long) EAGER_SEGMENTS * segmentSize;
        this.eager = eagerBytes < this.capacity ? eagerBytes : Long.MAX_VALUE;
        this.pageSize = (int) Math.min(MAX_PAGE, this.capacity);
        this.pages = new byte[(int) ((this.capacity + pageSize - 1) / pageSize)][];
        this.packer = new Packer(segmentSize, attempt, sink);
    }

    /** Buffers {@code len} bytes for {@code partition}; packs what is buffered when the buffer is full. */
    void write(int partition, byte[] src, int off, int len) throws IOException {
        int n = append(partition, src, off, len);
        while (n < len) {
            pack(false); // full: push it all, then take the rest
            n += append(partition, src, off + n, len - n);
        }
        if (inOrder && used >= eager) {
            pack(true);
        }
    }

    /** Packs everything buffered, the last group included. */
    void finish() throws IOException {
        pack(false);
    }

    /** Empties the buffer and lets go of its memory. */
    void release() {
        Arrays.fill(pages, null);
        index = new long[0];
        scratch = new long[0];
        reset();
    }

    /** Appends as much as fits; returns how many bytes it took (less than {@code len} only when full). */
    private int append(int partition, byte[] src, int off, int len) {
        int taken = 0;
        while (taken < len) {
            int inPage = (int) (position % pageSize);
            int room = pageSize - inPage;
            boolean extend = partition == lastPartition && inPage != 0;
            long left = capacity - used - (extend ? 0 : RECORD_OVERHEAD);
            if (!extend && room <= LENGTH) {
                if (used + room > capacity) {
                    break;
                }
                position += room; // too little of the page left for a record: go on in the next one
                used += room;
                continue;
            }
            int n = (int) Math.min(Math.min(len - taken, left), extend ? room : room - LENGTH);
            if (n <= 0) {
                break;
            }
            byte[] page = page(position);
            if (extend) {
                int at = (int) ((index[records - 1] & POSITION_MASK) % pageSize);
                INT.set(page, at, (int) INT.get(page, at) + n);
            } else {
                if (records == index.length) {
                    index = Arrays.copyOf(index, Math.max(256, 2 * records));
                }
                index[records++] = (long) partition << POSITION_BITS | position;
                INT.set(page, inPage, n);
                inOrder &= partition >= lastPartition;
                lastPartition = partition;
                maxPartition = Math.max(maxPartition, partition);
                inPage += LENGTH;
                position += LENGTH;
                used += RECORD_OVERHEAD;
            }
            System.arraycopy(src, off + taken, page, inPage, n);
            position += n;
            used += n;
            taken += n;
        }
        return taken;
    }

    private byte[] page(long at) {
        int i = (int) (at / pageSize);
        if (pages[i] == null) {
            pages[i] = new byte[pageSize];
        }
        return pages[i];
    }

    /**
     * Hands every buffered record to the packer in partition order and empties the buffer; the packer
     * pushes every group it fills, and the last one too unless {@code keepLast}.
     */
    private void pack(boolean keepLast) throws IOException {
        if (!inOrder) {
            sortByPartition();
        }
        for (int r = 0; r < records; r++) {
            long entry = index[r];
            long at = entry & POSITION_MASK;
            byte[] page = pages[(int) (at / pageSize)];
            int inPage = (int) (at % pageSize);
            packer.add((int) (entry >>> POSITION_BITS), page, inPage + LENGTH, (int) INT.get(page, inPage));
        }
        if (!keepLast) {
            packer.emit();
        }
        reset();
    }

    private void reset() {
        records = 0;
        used = 0;
        position = 0;
        lastPartition = -1;
        maxPartition = 0;
        inOrder = true;
    }

    /** LSD radix sort of the index by its partition bits, a byte at a time: stable, O(records) per pass. */
    private void sortByPartition() {
        if (scratch.length < records) {
            scratch = new long[index.length];
        }
        long[] from = index;
        long[] to = scratch;
        int[] counts = new int[256];
        for (int shift = POSITION_BITS; maxPartition >>> (shift - POSITION_BITS) != 0; shift += 8) {
            Arrays.fill(counts, 0);
            for (int i = 0; i < records; i++) {
                counts[(int) (from[i] >>> shift) & 0xff]++;
            }
            for (int d = 0, at = 0; d < 256; d++) {
                int n = counts[d];
                counts[d] = at;
                at += n;
            }
            for (int i = 0; i < records; i++) {
                long e = from[i];
                to[counts[(int) (e >>> shift) & 0xff]++] = e;
            }
            long[] t = from;
            from = to;
            to = t;
        }
        index = from;
        scratch = to;
    }

    /** Fills one group at a time: its directory in {@link #head}, its bytes in {@link #data}. */
    private static final class Packer {
        private final int segmentSize;
        private final long attempt;
        private final GroupSink sink;
        private final byte[] head;
        private final byte[] data;
        private int runs;
        private int filled;
        private int partition = -1;
        private int runStart;

        Packer(int segmentSize, long attempt, GroupSink sink) {
            this.segmentSize = segmentSize;
            this.attempt = attempt;
            this.sink = sink;
            int maxRuns = (segmentSize - Wire.GROUP_HEADER) / (Wire.GROUP_RUN + 1);
            this.head = new byte[Wire.GROUP_HEADER + Wire.GROUP_RUN * maxRuns];
            this.data = new byte[segmentSize - Wire.GROUP_HEADER - Wire.GROUP_RUN];
        }

        void add(int p, byte[] src, int off, int len) throws IOException {
            if (p < partition) {
                emit(); // runs of a group ascend: a lower partition starts the next one
            }
            while (len > 0) {
                boolean newRun = p != partition;
                int free = segmentSize - (int) PackedGroups.size(newRun ? runs + 1 : runs, filled);
                if (free <= 0) {
                    emit();
                    continue;
                }
                if (newRun) {
                    closeRun();
                    INT.set(head, Wire.GROUP_HEADER + Wire.GROUP_RUN * runs, p);
                    runs++;
                    partition = p;
                    runStart = filled;
                }
                int n = Math.min(free, len);
                System.arraycopy(src, off, data, filled, n);
                filled += n;
                off += n;
                len -= n;
            }
        }

        private void closeRun() {
            if (runs > 0) {
                INT.set(head, Wire.GROUP_HEADER + Wire.GROUP_RUN * (runs - 1) + 4, filled - runStart);
            }
        }

        void emit() throws IOException {
            if (runs == 0) {
                return;
            }
            closeRun();
            LONG.set(head, 0, attempt);
            INT.set(head, 8, runs);
            sink.group(head, (int) PackedGroups.size(runs, 0), data, filled);
            runs = 0;
            filled = 0;
            partition = -1;
        }
    }
}
