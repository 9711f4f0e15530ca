package io.shuffled.spark;

import org.apache.spark.SparkConf;
import org.apache.spark.shuffle.api.ShuffleDataIO;
import org.apache.spark.shuffle.api.ShuffleDriverComponents;
import org.apache.spark.shuffle.api.ShuffleExecutorComponents;

/**
 * Plugs shuffled's driver side into Spark ({@code spark.shuffle.sort.io.plugin.class}). Spark asks this
 * plugin, not the shuffle manager, whether map output survives its executor
 * ({@link ShuffledDriverComponents#supportsReliableStorage}) and tells it when a shuffle or the
 * application goes away.
 */
public final class ShuffledDataIO implements ShuffleDataIO {
    private final SparkConf conf;

    public ShuffledDataIO(SparkConf conf) {
        this.conf = conf;
    }

    @Override
    public ShuffleDriverComponents driver() {
        return new ShuffledDriverComponents(new ShuffledConf(conf));
    }

    /**
     * Only Spark's built-in sort shuffle asks for executor components; with shuffled the map side is
     * {@link ShuffledShuffleManager}, so getting here means the two settings do not match.
     */
    @Override
    public ShuffleExecutorComponents executor() {
        throw new UnsupportedOperationException("spark.shuffle.sort.io.plugin.class=" + getClass().getName()
                + " needs spark.shuffle.manager=" + ShuffledShuffleManager.class.getName());
    }
}
