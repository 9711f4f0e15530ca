package io.shuffled.spark.compat;

import org.apache.spark.Aggregator;
import org.apache.spark.Partitioner;
import org.apache.spark.ShuffleDependency;
import org.apache.spark.TaskContext;
import org.apache.spark.scheduler.MapStatus;
import org.apache.spark.scheduler.MapStatus$;
import org.apache.spark.serializer.Serializer;
import org.apache.spark.storage.BlockManagerId;
import org.apache.spark.util.collection.ExternalSorter;
import scala.Option;
import scala.math.Ordering;

/**
 * Spark 3.5 and 4.0: no row-based shuffle checksums, so the sorter and the map status take none.
 * (The other version of this class, in {@code checksums-rows}, is compiled for Spark 4.1 and later.)
 */
public final class Checksums {
    private Checksums() {}

    public static <K, V, C> ExternalSorter<K, V, C> sorter(TaskContext context, Option<Aggregator<K, V, C>> aggregator,
            Option<Partitioner> partitioner, Option<Ordering<K>> ordering, ShuffleDependency<?, ?, ?> dep) {
        return new ExternalSorter<>(context, aggregator, partitioner, ordering, dep.serializer());
    }

    public static void update(ShuffleDependency<?, ?, ?> dep, int partition, Object key, Object value) {}

    public static MapStatus mapStatus(BlockManagerId location, long[] lengths, long mapId,
            ShuffleDependency<?, ?, ?> dep) {
        return MapStatus$.MODULE$.apply(location, lengths, mapId);
    }
}
