package io.shuffled.spark;

import java.util.concurrent.ConcurrentHashMap;
import org.apache.spark.ShuffleDependency;
import org.apache.spark.SparkConf;
import org.apache.spark.SparkEnv;
import org.apache.spark.TaskContext;
import org.apache.spark.network.buffer.ManagedBuffer;
import org.apache.spark.network.shuffle.MergedBlockMeta;
import org.apache.spark.shuffle.BaseShuffleHandle;
import org.apache.spark.shuffle.IndexShuffleBlockResolver;
import org.apache.spark.shuffle.ShuffleHandle;
import org.apache.spark.shuffle.ShuffleReadMetricsReporter;
import org.apache.spark.shuffle.ShuffleReader;
import org.apache.spark.shuffle.ShuffleWriteMetricsReporter;
import org.apache.spark.shuffle.ShuffleWriter;
import org.apache.spark.shuffle.sort.SortShuffleManager;
import org.apache.spark.storage.BlockId;
import org.apache.spark.storage.ShuffleMergedBlockId;
import scala.Option;
import scala.collection.immutable.Seq;

/**
 * Spark's entry point ({@code spark.shuffle.manager=io.shuffled.spark.ShuffledShuffleManager}): map tasks
 * push into the shuffled daemon next to their executor, reduce tasks read through it.
 *
 * <p>It extends Spark's {@link SortShuffleManager} and overrides everything that manager does, for one
 * reason: Spark SQL copies every row before a shuffle ({@code ShuffleExchangeExec.needToCopyObjectsBeforeShuffle})
 * unless the shuffle manager is a {@code SortShuffleManager}, whose writers serialize each row before the next
 * arrives (its rows are mutable and reused). Every path of {@link ShuffledWriter} does that too, or copies
 * the rows it must keep ({@link RowCopies}), so the copy is only cost. The parent's constructor does what it
 * does in every Spark application that uses the built-in shuffle (an {@link IndexShuffleBlockResolver} and a
 * map of task ids, nothing on disk); nothing of the parent runs afterwards.
 *
 * <p>Executors keep no shuffle files, so {@link #unregisterShuffle} has nothing to delete locally; the
 * daemons' copies are freed by the driver ({@link ShuffledDriverComponents}, enabled with
 * {@code spark.shuffle.sort.io.plugin.class=io.shuffled.spark.ShuffledDataIO}).
 */
public final class ShuffledShuffleManager extends SortShuffleManager {
    private final DaemonClients clients;
    private final NoLocalBlocks blocks;
    /** Whether map outputs are compressed: one per JVM, which keeps what its daemons last said. */
    private final BlockCompression compression;

    /** The constructor Spark looks for first ({@code ShuffleManager.create}). */
    public ShuffledShuffleManager(SparkConf conf, boolean isDriver) {
        super(conf);
        SparkLine.ofJar().check(org.apache.spark.package$.MODULE$.SPARK_VERSION(),
                scala.util.Properties$.MODULE$.versionNumberString());
        ShuffledConf settings = new ShuffledConf(conf);
        this.blocks = new NoLocalBlocks(conf);
        this.compression = BlockCompression.of(settings, conf);
        this.clients = new DaemonClients(settings, isDriver ? "spark-driver" : "spark-executor");
    }

    @Override
    public <K, V, C> ShuffleHandle registerShuffle(int shuffleId, ShuffleDependency<K, V, C> dependency) {
        return new BaseShuffleHandle<>(shuffleId, dependency);
    }

    @Override
    @SuppressWarnings("unchecked")
    public <K, V> ShuffleWriter<K, V> getWriter(
            ShuffleHandle handle, long mapId, TaskContext context, ShuffleWriteMetricsReporter metrics) {
        return new ShuffledWriter<>((BaseShuffleHandle<K, V, Object>) handle, mapId, context, metrics, clients,
                ShuffledWriter.Executor.of(SparkEnv.get(), compression));
    }

    @Override
    @SuppressWarnings("unchecked")
    public <K, C> ShuffleReader<K, C> getReader(ShuffleHandle handle, int startMapIndex, int endMapIndex,
            int startPartition, int endPartition, TaskContext context, ShuffleReadMetricsReporter metrics) {
        return new ShuffledReader<>((BaseShuffleHandle<K, ?, C>) handle, startMapIndex, endMapIndex,
                startPartition, endPartition, context, metrics, clients);
    }

    @Override
    public boolean unregisterShuffle(int shuffleId) {
        return true;
    }

    @Override
    public IndexShuffleBlockResolver shuffleBlockResolver() {
        return blocks;
    }

    @Override
    public void stop() {
        clients.close();
    }

    /**
     * Executors serve no shuffle blocks: map output lives in the daemons, and map statuses name daemons,
     * never executors, so Spark's block transfer never asks for one. If something does, say why. (An
     * {@link IndexShuffleBlockResolver} because the parent declares its resolver as one; it holds no files,
     * so block migration at decommissioning finds none to move.)
     */
    private static final class NoLocalBlocks extends IndexShuffleBlockResolver {
        NoLocalBlocks(SparkConf conf) {
            super(conf, null, new ConcurrentHashMap<>());
        }

        private static UnsupportedOperationException refuse(Object block) {
            return new UnsupportedOperationException("shuffle block " + block + " is held by a shuffled daemon, "
                    + "not by executor " + SparkEnv.get().executorId() + "; read it through ShuffledShuffleManager");
        }

        @Override
        public ManagedBuffer getBlockData(BlockId blockId, Option<String[]> dirs) {
            throw refuse(blockId);
        }

        @Override
        public Seq<ManagedBuffer> getMergedBlockData(ShuffleMergedBlockId blockId, Option<String[]> dirs) {
            throw refuse(blockId);
        }

        @Override
        public MergedBlockMeta getMergedBlockMeta(ShuffleMergedBlockId blockId, Option<String[]> dirs) {
            throw refuse(blockId);
        }
    }
}
