package io.shuffled.spark;

import io.shuffled.client.MapOutputWriter;
import io.shuffled.client.ShuffleClient;
import io.shuffled.spark.compat.Checksums;
import java.io.IOException;
import java.io.OutputStream;
import org.apache.spark.ShuffleDependency;
import org.apache.spark.SparkConf;
import org.apache.spark.SparkEnv;
import org.apache.spark.TaskContext;
import org.apache.spark.io.CompressionCodec$;
import org.apache.spark.scheduler.MapStatus;
import org.apache.spark.serializer.SerializationStream;
import org.apache.spark.serializer.SerializerInstance;
import org.apache.spark.serializer.SerializerManager;
import org.apache.spark.shuffle.BaseShuffleHandle;
import org.apache.spark.shuffle.ShuffleWriteMetricsReporter;
import org.apache.spark.shuffle.ShuffleWriter;
import org.apache.spark.storage.ShuffleBlockId;
import org.apache.spark.util.collection.ExternalSorter;
import scala.Option;
import scala.Product2;
import scala.Tuple2;
import scala.collection.Iterator;
import scala.reflect.ClassTag;
import scala.reflect.ClassTag$;

/**
 * Writes one map task's output into the executor's daemon.
 *
 * <p>Each reduce partition is written as one serialization stream, wrapped by Spark's
 * {@link SerializerManager} (encryption as configured, compression as {@link BlockCompression} decides for the
 * whole map output), into the map attempt's push
 * stream. With no map-side combine and at most Spark's {@code spark.shuffle.sort.bypassMergeThreshold}
 * partitions, records are serialized as they arrive, one open stream per partition, as Spark's bypass-merge
 * writer does. Wider shuffles without map-side combine whose serializer can relocate serialized records (Spark
 * SQL's rows, Kryo), under a codec whose streams concatenate and without IO encryption, are serialized at
 * once and sorted as bytes ({@link SerializedSortWriter}). Everything else goes through Spark's own
 * {@link ExternalSorter} first (the one the built-in sort shuffle uses: combining, grouping by partition,
 * spilling under Spark's memory manager; Spark SQL's rows are copied for it, {@link RowCopies}), which hands back
 * one partition at a time. So the bytes stored for a
 * (partition, attempt) pair are exactly what the built-in shuffle would put in that block, and any Spark
 * serializer reads them back.
 *
 * <p>Either way the serialized bytes of all partitions go into the push stream's one buffer
 * ({@code spark.shuffled.writerBufferSize}, see {@link MapOutputWriter}), which is pushed packed by
 * partition whenever it fills, so the daemon receives data while the task still runs, and a wide shuffle
 * costs a few bytes of directory per block rather than a buffer per partition. The sorter's partitions come
 * in order: they need no sort and leave as soon as a few segments are buffered, as one ascending sequence.
 * Commit is atomic on the daemon; its per-partition byte counts go
 * into the {@link MapStatus}, which AQE uses to coalesce partitions and split skewed ones. Any failure
 * aborts the attempt, so nothing of it is ever read.
 *
 * <p>The writer is given its daemons ({@link DaemonClients}) and what it needs of its executor
 * ({@link Executor}); it never looks them up itself.
 */
final class ShuffledWriter<K, V, C> extends ShuffleWriter<K, V> {
    @SuppressWarnings("unchecked")
    private static final ClassTag<Object> ANY = (ClassTag<Object>) (ClassTag<?>) ClassTag$.MODULE$.Any();

    /**
     * What the writer needs of its executor: the application, the executor (it picks the task's daemon), the
     * host its map statuses name, Spark's limit for unsorted writing, the serializer manager and whether to
     * compress.
     */
    record Executor(String appId, String executorId, String host, int bypassMergeThreshold,
            SerializerManager serializers, boolean streamsConcatenate, BlockCompression compression) {
        static Executor of(SparkEnv env, BlockCompression compression) {
            SparkConf conf = env.conf();
            return new Executor(conf.getAppId(), env.executorId(), env.blockManager().blockManagerId().host(),
                    conf.getInt("spark.shuffle.sort.bypassMergeThreshold", 200), env.serializerManager(),
                    streamsConcatenate(conf, env.serializerManager()), compression);
        }

        /**
         * Whether a block may hold several of the wrapped streams back to back: no IO encryption (each
         * encrypted stream starts with its own IV), and shuffle compression off or a codec that reads
         * concatenated streams as one.
         */
        static boolean streamsConcatenate(SparkConf conf, SerializerManager serializers) {
            return !serializers.encryptionEnabled() && (!conf.getBoolean("spark.shuffle.compress", true)
                    || CompressionCodec$.MODULE$.supportsConcatenationOfSerializedStreams(
                            CompressionCodec$.MODULE$.createCodec(conf)));
        }
    }

    private final BaseShuffleHandle<K, V, C> handle;
    private final long mapId;
    private final TaskContext context;
    private final ShuffleWriteMetricsReporter metrics;
    private final DaemonClients clients;
    private final Executor executor;
    private MapOutputWriter output;
    private MapStatus status;
    private long[] lengths = new long[0];
    /** Whether this map output's blocks go through Spark's codec ({@link BlockCompression}). */
    private boolean compressed;
    private boolean stopped;

    ShuffledWriter(
            BaseShuffleHandle<K, V, C> handle,
            long mapId,
            TaskContext context,
            ShuffleWriteMetricsReporter metrics,
            DaemonClients clients,
            Executor executor) {
        this.handle = handle;
        this.mapId = mapId;
        this.context = context;
        this.metrics = metrics;
        this.clients = clients;
        this.executor = executor;
    }

    @Override
    public void write(Iterator<Product2<K, V>> records) throws IOException {
        ShuffleDependency<K, V, C> dep = handle.dependency();
        int partitions = dep.partitioner().numPartitions();
        long opening = System.nanoTime();
        ShuffleClient client = clients.withDaemon(executor.executorId(), context.taskAttemptId(), c -> {
            output = c.openWriter(executor.appId(), dep.shuffleId(), context.partitionId(), mapId, partitions,
                    clients.replicas(), clients.durability(), clients.fsync());
            return c;
        });
        Counts.OPEN_NANOS.addAndGet(System.nanoTime() - opening);
        compressed = executor.compression().compress(client);
        (compressed ? Counts.COMPRESSED : Counts.UNCOMPRESSED).incrementAndGet();
        long written;
        if (!dep.mapSideCombine() && partitions <= executor.bypassMergeThreshold()) {
            written = writeUnsorted(records, dep);
            Counts.UNSORTED.incrementAndGet();
        } else if (SerializedSortWriter.applies(dep, executor.streamsConcatenate())) {
            TaskMemory memory = new TaskMemory(context.taskMemoryManager());
            try {
                written = new SerializedSortWriter<>(dep, mapId, executor.serializers(), compressed,
                        new PartitionOutput(output, 0, metrics), memory, clients.sortBufferBytes()).write(records);
            } finally { // as Spark's serialized writer does when it stops, on every line
                context.taskMetrics().incPeakExecutionMemory(memory.peak());
            }
        } else {
            ExternalSorter<K, V, ?> sorter = dep.mapSideCombine()
                    ? Checksums.<K, V, C>sorter(context, dep.aggregator(), Option.apply(dep.partitioner()),
                            dep.keyOrdering(), dep)
                    : Checksums.<K, V, V>sorter(
                            context, Option.empty(), Option.apply(dep.partitioner()), Option.empty(), dep);
            try {
                sorter.insertAll(RowCopies.of(records)); // the sorter keeps records: Spark SQL's rows are reused
                written = writePartitions(sorter, dep);
            } finally {
                sorter.stop();
            }
            Counts.SORTED.incrementAndGet();
        }
        long started = System.nanoTime();
        lengths = output.commit();
        long committing = System.nanoTime() - started;
        metrics.incWriteTime(committing);
        Counts.COMMIT_NANOS.addAndGet(committing);
        metrics.incRecordsWritten(written);
        long bytes = 0;
        for (long n : lengths) {
            bytes += n;
        }
        metrics.incBytesWritten(bytes);
        status = Checksums.mapStatus(
                DaemonLocation.of(client.daemonNode(), executor.host(), compressed), lengths, mapId, dep);
    }

    /**
     * Without map-side combine and with few partitions, records are serialized as they come, into one
     * open stream per partition (as Spark's bypass-merge writer does with files): no sort of the records;
     * the streams' bytes meet in the push stream's buffer.
     */
    private long writeUnsorted(Iterator<Product2<K, V>> records, ShuffleDependency<K, V, C> dep) throws IOException {
        SerializerInstance serializer = dep.serializer().newInstance();
        int partitions = dep.partitioner().numPartitions();
        SerializationStream[] streams = new SerializationStream[partitions];
        long count = 0;
        while (records.hasNext()) {
            Product2<K, V> record = records.next();
            int partition = dep.partitioner().getPartition(record._1());
            SerializationStream stream = streams[partition];
            if (stream == null) {
                stream = streams[partition] = serializer.serializeStream(block(dep, partition,
                        new PartitionOutput(output, partition, metrics)));
            }
            stream.writeKey(record._1(), ANY);
            stream.writeValue(record._2(), ANY);
            Checksums.update(dep, partition, record._1(), record._2());
            count++;
        }
        for (SerializationStream stream : streams) {
            if (stream != null) {
                stream.close();
            }
        }
        return count;
    }

    /** Serializes every partition the sorter yields into the push stream; returns the records written. */
    private long writePartitions(ExternalSorter<K, V, ?> sorter, ShuffleDependency<K, V, C> dep) throws IOException {
        SerializerInstance serializer = dep.serializer().newInstance();
        PartitionOutput sink = new PartitionOutput(output, 0, metrics);
        long records = 0;
        Iterator<? extends Tuple2<Object, ? extends Iterator<? extends Product2<K, ?>>>> parts =
                sorter.partitionedIterator();
        while (parts.hasNext()) {
            Tuple2<Object, ? extends Iterator<? extends Product2<K, ?>>> part = parts.next();
            Iterator<? extends Product2<K, ?>> it = part._2();
            if (!it.hasNext()) {
                continue;
            }
            int partition = (Integer) part._1();
            sink.partition = partition;
            SerializationStream stream = serializer.serializeStream(block(dep, partition, sink));
            while (it.hasNext()) {
                Product2<K, ?> record = it.next();
                stream.writeKey(record._1(), ANY);
                stream.writeValue(record._2(), ANY);
                records++;
            }
            stream.close();
        }
        return records;
    }

    /** A partition's block stream: encrypted and compressed as this map output is. */
    private OutputStream block(ShuffleDependency<K, V, C> dep, int partition, OutputStream sink) {
        return BlockCompression.wrap(executor.serializers(), new ShuffleBlockId(dep.shuffleId(), mapId, partition),
                sink, compressed);
    }

    @Override
    public Option<MapStatus> stop(boolean success) {
        if (stopped) {
            return Option.empty();
        }
        stopped = true;
        if (success && status != null) {
            return Option.apply(status);
        }
        if (output != null) {
            output.close(); // aborts unless committed: a failed attempt leaves nothing readable
        }
        if (success) {
            throw new IllegalStateException(
                    "map task attempt " + mapId + " stopped as a success, but its output was never committed");
        }
        return Option.empty();
    }

    @Override
    public long[] getPartitionLengths() {
        return lengths;
    }

    /**
     * The bytes of the partition being serialized, handed to the push stream. Closing the serialization
     * stream closes this too; that must not end the push stream, which spans every partition.
     */
    static final class PartitionOutput extends OutputStream {
        private final MapOutputWriter output;
        private final ShuffleWriteMetricsReporter metrics;
        int partition;

        PartitionOutput(MapOutputWriter output, int partition, ShuffleWriteMetricsReporter metrics) {
            this.output = output;
            this.partition = partition;
            this.metrics = metrics;
        }

        @Override
        public void write(int b) throws IOException {
            write(new byte[] {(byte) b}, 0, 1);
        }

        /** Spark's write time is the time spent handing bytes on (here: buffering, and pushing when full). */
        @Override
        public void write(byte[] b, int off, int len) throws IOException {
            long started = System.nanoTime();
            output.write(partition, b, off, len);
            metrics.incWriteTime(System.nanoTime() - started);
        }

        @Override
        public void close() {
            // the push stream outlives one partition
        }
    }
}
