package io.shuffled.spark;

import io.shuffled.spark.compat.Checksums;
import java.io.IOException;
import java.io.OutputStream;
import java.util.Arrays;
import org.apache.spark.Partitioner;
import org.apache.spark.ShuffleDependency;
import org.apache.spark.serializer.SerializationStream;
import org.apache.spark.serializer.SerializerManager;
import org.apache.spark.storage.ShuffleBlockId;
import scala.Product2;
import scala.collection.Iterator;
import scala.reflect.ClassTag;
import scala.reflect.ClassTag$;

/**
 * The writer's path for wide shuffles without map-side combine whose serializer lets serialized records be
 * moved (Spark SQL's rows, Kryo): each record is serialized as it arrives, by one serialization stream, into
 * one growing byte array, and only a long per record, {@code partition << 32 | record number}, is sorted.
 * Spark's object sorter would keep every record as an object (which Spark SQL must copy for it), sort the
 * objects and serialize them afterwards, partition by partition.
 *
 * <p>When the buffered bytes and their index reach {@code spark.shuffled.sortBufferSize} or Spark's memory
 * manager grants no more (a fill), and at the end, the index is sorted (by partition, then arrival) and each
 * partition's records are copied, in that order, through one stream wrapped by Spark's {@link SerializerManager}
 * (compression) into the partition's part of the push stream. A partition that had records in several fills
 * therefore gets several compressed streams back to back in its block, which is why the path needs a codec
 * whose streams concatenate (or no compression) and no IO encryption ({@link #applies}); its serialized records
 * concatenate by the serializer's promise. Every stream costs a header and a compressor (tens of KiB
 * allocated) and compresses worse than one longer stream, so at thousands of partitions a map output written
 * in few fills is markedly smaller and cheaper to write and read.
 *
 * <p>The memory is the task's heap, held as its execution memory ({@link TaskMemory}): the arrays grow by
 * doubling, each step asked of Spark first, so a task writes in fills as large as its share of memory allows
 * (as Spark's own serialized sorter spills when its memory runs out), and an executor is never asked for
 * heap Spark did not count. Only a record that does not fit in what is left grows the arrays regardless; its
 * fill goes out after it. The push stream's buffer ({@code spark.shuffled.writerBufferSize}) is apart.
 */
public final class SerializedSortWriter<K, V> {
    /** The largest fill: positions in a fill are ints. */
    private static final long MAX_FILL_BYTES = 1L << 30;
    /** Index bytes per record: its sort key and where its bytes start. */
    private static final int INDEX_BYTES = 12;

    @SuppressWarnings("unchecked")
    private static final ClassTag<Object> ANY = (ClassTag<Object>) (ClassTag<?>) ClassTag$.MODULE$.Any();

    private final ShuffleDependency<K, V, ?> dep;
    private final long mapId;
    private final SerializerManager serializers;
    private final ShuffledWriter.PartitionOutput sink;
    private final TaskMemory memory;
    /** Bytes of serialized records plus their index (12 bytes a record) that make a fill at most. */
    private final long fillBytes;
    private final Bytes bytes = new Bytes();
    /** {@code partition << 32 | record number} of each buffered record. */
    private long[] keys = new long[1024];
    /** Where each buffered record starts in {@link #bytes}; one more slot for the end of the last. */
    private int[] starts = new int[1025];
    private int records;
    /** A record grew the arrays beyond what Spark granted: its fill goes out after it. */
    private boolean full;

    SerializedSortWriter(ShuffleDependency<K, V, ?> dep, long mapId, SerializerManager serializers,
            ShuffledWriter.PartitionOutput sink, TaskMemory memory, long fillBytes) {
        this.dep = dep;
        this.mapId = mapId;
        this.serializers = serializers;
        this.sink = sink;
        this.memory = memory;
        this.fillBytes = Math.min(fillBytes, MAX_FILL_BYTES);
    }

    /**
     * Whether this path can write {@code dep}: no map-side combine, a serializer whose records can be moved,
     * and ({@code streamsConcatenate}, decided once per executor) compressed streams that may follow each
     * other in one block.
     */
    static boolean applies(ShuffleDependency<?, ?, ?> dep, boolean streamsConcatenate) {
        return streamsConcatenate && !dep.mapSideCombine() && dep.serializer().supportsRelocationOfSerializedObjects();
    }

    /** Writes every record into the push stream through {@link #sink}; returns how many. */
    long write(Iterator<? extends Product2<K, V>> input) throws IOException {
        try {
            SerializationStream stream = dep.serializer().newInstance().serializeStream(bytes);
            Partitioner partitioner = dep.partitioner();
            long count = 0;
            while (input.hasNext()) {
                Product2<K, V> record = input.next();
                int partition = partitioner.getPartition(record._1());
                starts[records] = bytes.size;
                keys[records] = (long) partition << 32 | records;
                records++;
                stream.writeKey(record._1(), ANY);
                stream.writeValue(record._2(), ANY);
                stream.flush(); // the record's bytes must be in the array before the next one starts
                Checksums.update(dep, partition, record._1(), record._2());
                count++;
                if (full || !roomForNext()) {
                    writeFill();
                }
            }
            stream.close();
            writeFill();
            Counts.SERIALIZED.incrementAndGet();
            return count;
        } finally {
            memory.keep(0);
        }
    }

    /**
     * Whether the fill takes another record: under its bound, with a free index slot and a sixteenth of the
     * bytes array free (so that a record rarely grows it midway), growing either as far as Spark grants.
     */
    private boolean roomForNext() {
        if (bytes.size + (long) INDEX_BYTES * records >= fillBytes) {
            return false;
        }
        if (records + 1 == starts.length) {
            int length = 2 * records;
            if (!reserve((long) INDEX_BYTES * length)) {
                return false;
            }
            keys = Arrays.copyOf(keys, length);
            starts = Arrays.copyOf(starts, length + 1);
            memory.keep(capacity());
        }
        int length = bytes.buf.length;
        if (length - bytes.size < length >>> 4 && length < fillBytes) {
            int larger = (int) Math.min(2L * length, fillBytes);
            if (!reserve(larger)) {
                return false;
            }
            bytes.buf = Arrays.copyOf(bytes.buf, larger);
            memory.keep(capacity());
        }
        return true;
    }

    /** Asks Spark for the arrays held now and {@code more} bytes of a new one, both held while it is copied. */
    private boolean reserve(long more) {
        return memory.hold(capacity() + more);
    }

    /** Bytes of the arrays held now. */
    private long capacity() {
        return bytes.buf.length + 8L * keys.length + 4L * starts.length;
    }

    /** Writes the buffered records partition by partition, one wrapped stream each, and empties the buffer. */
    private void writeFill() throws IOException {
        Arrays.sort(keys, 0, records);
        starts[records] = bytes.size;
        byte[] buf = bytes.buf;
        int i = 0;
        while (i < records) {
            int partition = (int) (keys[i] >>> 32);
            sink.partition = partition;
            OutputStream out = serializers.wrapStream(new ShuffleBlockId(dep.shuffleId(), mapId, partition), sink);
            int from = 0;
            int to = 0;
            for (; i < records && (int) (keys[i] >>> 32) == partition; i++) {
                int r = (int) keys[i];
                if (starts[r] != to) { // not right after the previous record: write the run so far
                    if (to > from) {
                        out.write(buf, from, to - from);
                    }
                    from = starts[r];
                }
                to = starts[r + 1];
            }
            out.write(buf, from, to - from);
            out.close();
        }
        if (records > 0) {
            Counts.FILLS.incrementAndGet();
        }
        records = 0;
        bytes.size = 0;
        full = false;
    }

    /** The serialized records of a fill, back to back. */
    private final class Bytes extends OutputStream {
        byte[] buf = new byte[64 << 10];
        int size;

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
                int larger = (int) Math.max(need, Math.min(2L * buf.length, Integer.MAX_VALUE - 8));
                full |= !reserve(larger);
                buf = Arrays.copyOf(buf, larger);
                memory.keep(capacity());
            }
        }
    }
}
