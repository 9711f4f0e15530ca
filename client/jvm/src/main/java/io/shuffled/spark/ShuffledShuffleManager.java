package io.shuffled.spark;

import io.shuffled.spark.compat.LineShuffleManager;
import org.apache.spark.ShuffleDependency;
import org.apache.spark.SparkConf;
import org.apache.spark.SparkEnv;
import org.apache.spark.TaskContext;
import org.apache.spark.network.buffer.ManagedBuffer;
import org.apache.spark.network.shuffle.MergedBlockMeta;
import org.apache.spark.shuffle.BaseShuffleHandle;
import org.apache.spark.shuffle.ShuffleBlockResolver;
import org.apache.spark.shuffle.ShuffleHandle;
import org.apache.spark.shuffle.ShuffleReadMetricsReporter;
import org.apache.spark.shuffle.ShuffleReader;
import org.apache.spark.shuffle.ShuffleWriteMetricsReporter;
import org.apache.spark.shuffle.ShuffleWriter;
import org.apache.spark.storage.BlockId;
import org.apache.spark.storage.ShuffleMergedBlockId;
import scala.Option;
import scala.collection.immutable.Seq;

/**
 * Spark's entry point ({@code spark.shuffle.manager=io.shuffled.spark.ShuffledShuffleManager}): map tasks
 * push into the shuffled daemon next to their executor, reduce tasks read through it.
 *
 * <p>Executors keep no shuffle files, so {@link #unregisterShuffle} has nothing to delete locally; the
 * daemons' copies are freed by the driver ({@link ShuffledDriverComponents}, enabled with
 * {@code spark.shuffle.sort.io.plugin.class=io.shuffled.spark.ShuffledDataIO}).
 */
public final class ShuffledShuffleManager implements LineShuffleManager {
    private final DaemonClients clients;

    /** The constructor Spark looks for first ({@code ShuffleManager.create}). */
    public ShuffledShuffleManager(SparkConf conf, boolean isDriver) {
        SparkLine.ofJar().check(org.apache.spark.package$.MODULE$.SPARK_VERSION(),
                scala.util.Properties$.MODULE$.versionNumberString());
        ShuffledConf settings = new ShuffledConf(conf);
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
                ShuffledWriter.Executor.of(SparkEnv.get()));
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
    public ShuffleBlockResolver shuffleBlockResolver() {
        return NoLocalBlocks.INSTANCE;
    }

    @Override
    public void stop() {
        clients.close();
    }

    /**
     * Executors serve no shuffle blocks: map output lives in the daemons, and map statuses name daemons,
     * never executors, so Spark's block transfer never asks for one. If something does, say why.
     */
    private static final class NoLocalBlocks implements ShuffleBlockResolver {
        static final NoLocalBlocks INSTANCE = new NoLocalBlocks();

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

        @Override
        public void stop() {
            // nothing held
        }
    }
}
