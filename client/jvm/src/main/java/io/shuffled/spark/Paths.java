package io.shuffled.spark;

import java.util.concurrent.atomic.AtomicLong;

/**
 * How often this JVM took each path of the plugin's writer: the Spark tests read them to check which path a
 * job took (whether each record was serialized at once or kept by Spark's sorter).
 */
public final class Paths {
    /** Map outputs written with one open serialization stream per partition (few partitions, no combine). */
    static final AtomicLong UNSORTED = new AtomicLong();
    /** Map outputs serialized at once and sorted as bytes ({@link SerializedSortWriter}). */
    static final AtomicLong SERIALIZED = new AtomicLong();
    /** Map outputs written through Spark's {@code ExternalSorter} (combine, IO encryption, opaque codecs). */
    static final AtomicLong SORTED = new AtomicLong();

    private Paths() {}

    /** {unsorted, serialized, sorted} map outputs so far. */
    public static long[] mapOutputs() {
        return new long[] {UNSORTED.get(), SERIALIZED.get(), SORTED.get()};
    }
}
