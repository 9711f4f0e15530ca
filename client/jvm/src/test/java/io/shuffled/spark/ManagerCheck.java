package io.shuffled.spark;

import org.apache.spark.SparkEnv;
import org.apache.spark.shuffle.sort.SortShuffleManager;

/**
 * What Spark SQL asks of the shuffle manager before each shuffle, for the Spark tests: whether it is a
 * {@code SortShuffleManager} (then it hands the writer its rows uncopied). Asked here because py4j cannot
 * reflect on {@code SparkEnv} itself (some of its methods name classes pyspark does not ship).
 */
public final class ManagerCheck {
    private ManagerCheck() {}

    @SuppressWarnings("deprecation") // 4.3 deprecates it for blockingShuffleManager(), which returns the same one
    public static boolean sortBased() {
        return SparkEnv.get().shuffleManager() instanceof SortShuffleManager;
    }
}
