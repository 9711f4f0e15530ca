package io.shuffled.spark.compat;

import org.apache.spark.Aggregator;
import org.apache.spark.Partitioner;
import org.apache.spark.ShuffleDependency;
import org.apache.spark.TaskContext;
import org.apache.spark.scheduler.MapStatus;
import org.apache.spark.scheduler.MapStatus$;
import org.apache.spark.shuffle.checksum.RowBasedChecksum;
import org.apache.spark.shuffle.checksum.RowBasedChecksum$;
import org.apache.spark.storage.BlockManagerId;
import org.apache.spark.util.collection.ExternalSorter;
import scala.Option;
import scala.math.Ordering;

/**
 * Spark 4.1 and later: row-based shuffle checksums ({@code spark.sql.shuffle.orderIndependentChecksum.enabled}).
 * A dependency that asks for them carries one checksum per reduce partition; the writer feeds every record
 * to its partition's checksum (Spark's sorter does so on the sorted path, {@link #update} on the unsorted
 * one) and the map status carries their aggregate, which the scheduler compares across attempts of a map
 * task to find map output that changed on a retry. Reads take no checksums.
 */
public final class Checksums {
    private static final RowBasedChecksum[] NONE = new RowBasedChecksum[0];

    private Checksums() {}

    public static <K, V, C> ExternalSorter<K, V, C> sorter(TaskContext context, Option<Aggregator<K, V, C>> aggregator,
            Option<Partitioner> partitioner, Option<Ordering<K>> ordering, ShuffleDependency<?, ?, ?> dep) {
        RowBasedChecksum[] rows = partitioner.isDefined() ? dep.rowBasedChecksums() : NONE;
        return new ExternalSorter<>(context, aggregator, partitioner, ordering, dep.serializer(), rows);
    }

    public static void update(ShuffleDependency<?, ?, ?> dep, int partition, Object key, Object value) {
        RowBasedChecksum[] rows = dep.rowBasedChecksums();
        if (rows.length > 0) {
            rows[partition].update(key, value);
        }
    }

    public static MapStatus mapStatus(BlockManagerId location, long[] lengths, long mapId,
            ShuffleDependency<?, ?, ?> dep) {
        long aggregate = RowBasedChecksum$.MODULE$.getAggregatedChecksumValue(dep.rowBasedChecksums());
        return MapStatus$.MODULE$.apply(location, lengths, mapId, aggregate);
    }
}
