package io.shuffled.spark;

import java.util.concurrent.atomic.AtomicLong;

/**
 * What this JVM's shuffle writers and readers did, by path: the Spark tests read these to check which path a
 * job took (whether each record was serialized at once or kept by Spark's sorter; whether a coalesced read
 * took an attempt's pairs as one block), and the `shapes` benchmark to break a stage's work down (time to open
 * and commit map outputs; requests, buffers and their bytes, runs and blocks per reduce task).
 */
public final class Counts {
    /** Map outputs written with one open serialization stream per partition (few partitions, no combine). */
    static final AtomicLong UNSORTED = new AtomicLong();
    /** Map outputs serialized at once and sorted as bytes ({@link SerializedSortWriter}). */
    static final AtomicLong SERIALIZED = new AtomicLong();
    /** Map outputs written through Spark's {@code ExternalSorter} (combine, IO encryption, opaque codecs). */
    static final AtomicLong SORTED = new AtomicLong();
    /** Map outputs written through Spark's codec and without it ({@link BlockCompression}). */
    static final AtomicLong COMPRESSED = new AtomicLong();
    static final AtomicLong UNCOMPRESSED = new AtomicLong();
    /** Fills the serialized path wrote out: each gives each of its partitions a (compressed) stream. */
    static final AtomicLong FILLS = new AtomicLong();
    /** Time map tasks spent opening their map output (until the daemon's first credit) and committing it. */
    static final AtomicLong OPEN_NANOS = new AtomicLong();
    static final AtomicLong COMMIT_NANOS = new AtomicLong();
    /** Blocks read as one (partition, attempt) pair each. */
    static final AtomicLong PAIR_BLOCKS = new AtomicLong();
    /** Blocks read as all of an attempt's pairs in a range ({@link PairInput}, batched). */
    static final AtomicLong BATCH_BLOCKS = new AtomicLong();
    /** Reads (reduce tasks' readers), their read streams (one request each), DATA buffers, bytes and runs. */
    static final AtomicLong READS = new AtomicLong();
    static final AtomicLong STREAMS = new AtomicLong();
    static final AtomicLong BUFFERS = new AtomicLong();
    static final AtomicLong BUFFER_BYTES = new AtomicLong();
    static final AtomicLong RUNS = new AtomicLong();

    private Counts() {}

    /** {unsorted, serialized, sorted} map outputs so far. */
    public static long[] mapOutputs() {
        return new long[] {UNSORTED.get(), SERIALIZED.get(), SORTED.get()};
    }

    /** {compressed, uncompressed} map outputs so far. */
    public static long[] compression() {
        return new long[] {COMPRESSED.get(), UNCOMPRESSED.get()};
    }

    /** Fills the serialized path wrote out so far (at least one a map output it wrote). */
    public static long fills() {
        return FILLS.get();
    }

    /** {nanoseconds opening map outputs, nanoseconds committing them} so far. */
    public static long[] writerWaits() {
        return new long[] {OPEN_NANOS.get(), COMMIT_NANOS.get()};
    }

    /** {pair, batch} blocks read so far. */
    public static long[] blocks() {
        return new long[] {PAIR_BLOCKS.get(), BATCH_BLOCKS.get()};
    }

    /** {reads, read streams, DATA buffers, their bytes, runs} so far. */
    public static long[] reads() {
        return new long[] {READS.get(), STREAMS.get(), BUFFERS.get(), BUFFER_BYTES.get(), RUNS.get()};
    }

    /** A reader's read stream is done with: what it took. */
    static void streamDone(long[] taken) {
        STREAMS.incrementAndGet();
        BUFFERS.addAndGet(taken[0]);
        BUFFER_BYTES.addAndGet(taken[1]);
        RUNS.addAndGet(taken[2]);
    }
}
