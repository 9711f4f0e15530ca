package io.shuffled.spark;

import io.shuffled.spark.compat.Checksums;
import java.io.IOException;
import java.io.OutputStream;
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
 * one growing byte array ({@link FillBuffer}), and only the record numbers are sorted, by partition. Spark's
 * object sorter would keep every record as an object (which Spark SQL must copy for it), sort the objects and
 * serialize them afterwards, partition by partition.
 *
 * <p>When the buffered bytes and their index reach {@code spark.shuffled.sortBufferSize} or Spark's memory
 * manager grants no more (a fill), and at the end, the records are ordered by partition, then arrival, and each
 * partition's records are copied, in that order, through one stream wrapped by Spark's {@link SerializerManager}
 * (compression, unless {@link BlockCompression} leaves this map output uncompressed) into the partition's part of
 * the push stream. A partition that had records in several fills
 * therefore gets several compressed streams back to back in its block, which is why the path needs a codec
 * whose streams concatenate (or no compression) and no IO encryption ({@link #applies}); its serialized records
 * concatenate by the serializer's promise. Every stream costs a header and a compressor (tens of KiB
 * allocated) and compresses worse than one longer stream, so at thousands of partitions a map output written
 * in few fills is markedly smaller and cheaper to write and read. The push stream's buffer
 * ({@code spark.shuffled.writerBufferSize}) is apart.
 */
public final class SerializedSortWriter<K, V> {
    @SuppressWarnings("unchecked")
    private static final ClassTag<Object> ANY = (ClassTag<Object>) (ClassTag<?>) ClassTag$.MODULE$.Any();

    private final ShuffleDependency<K, V, ?> dep;
    private final long mapId;
    private final SerializerManager serializers;
    /** Whether the map output's blocks go through Spark's codec ({@link BlockCompression}). */
    private final boolean compressed;
    private final ShuffledWriter.PartitionOutput sink;
    private final TaskMemory memory;
    /** {@code spark.shuffled.sortBufferSize}: bytes of serialized records plus their index that make a fill. */
    private final long fillBytes;

    SerializedSortWriter(ShuffleDependency<K, V, ?> dep, long mapId, SerializerManager serializers, boolean compressed,
            ShuffledWriter.PartitionOutput sink, TaskMemory memory, long fillBytes) {
        this.dep = dep;
        this.mapId = mapId;
        this.serializers = serializers;
        this.compressed = compressed;
        this.sink = sink;
        this.memory = memory;
        this.fillBytes = fillBytes;
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
        Partitioner partitioner = dep.partitioner();
        FillBuffer fill = new FillBuffer(memory, fillBytes, partitioner.numPartitions());
        try {
            SerializationStream stream = dep.serializer().newInstance().serializeStream(fill);
            long count = 0;
            while (input.hasNext()) {
                Product2<K, V> record = input.next();
                int partition = partitioner.getPartition(record._1());
                fill.startRecord(partition);
                stream.writeKey(record._1(), ANY);
                stream.writeValue(record._2(), ANY);
                stream.flush(); // the record's bytes must be in the array before the next one starts
                Checksums.update(dep, partition, record._1(), record._2());
                count++;
                if (!fill.roomForNext()) {
                    writeOut(fill);
                }
            }
            stream.close();
            writeOut(fill);
            Counts.SERIALIZED.incrementAndGet();
            return count;
        } finally {
            fill.release();
        }
    }

    /** Writes the fill's records partition by partition, one wrapped stream each, and empties it. */
    private void writeOut(FillBuffer fill) throws IOException {
        fill.sortByPartition();
        byte[] buf = fill.buf;
        int[] starts = fill.starts;
        int[] order = fill.order;
        int records = fill.records;
        int i = 0;
        while (i < records) {
            int partition = fill.parts[order[i]];
            sink.partition = partition;
            OutputStream out = BlockCompression.wrap(
                    serializers, new ShuffleBlockId(dep.shuffleId(), mapId, partition), sink, compressed);
            int from = 0;
            int to = 0;
            for (int end = fill.ends[partition]; i < end; i++) {
                int r = order[i];
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
        fill.clear();
    }
}
