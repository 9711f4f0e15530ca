package io.shuffled.spark;

import org.apache.spark.sql.catalyst.InternalRow;
import scala.Product2;
import scala.Tuple2;
import scala.collection.AbstractIterator;
import scala.collection.Iterator;

/**
 * The records of a map task as objects that stay valid after the next one arrives, for the one writer path
 * that keeps records as objects (Spark's {@code ExternalSorter}: IO encryption, a codec whose streams do not
 * concatenate, map-side combine).
 *
 * <p>Spark SQL hands a shuffle writer one mutable row object, rewritten for each record, and copies the rows
 * itself only for shuffle managers other than a {@code SortShuffleManager}; {@link ShuffledShuffleManager} is
 * one, because its other paths serialize each record at once. So here every row is copied, as Spark's exchange
 * would have done: a row's {@code copy()}, anything else (RDD records, which Spark never copies) passed on as
 * it is.
 */
final class RowCopies<K, V> extends AbstractIterator<Product2<K, V>> {
    private final Iterator<Product2<K, V>> records;

    private RowCopies(Iterator<Product2<K, V>> records) {
        this.records = records;
    }

    static <K, V> Iterator<Product2<K, V>> of(Iterator<Product2<K, V>> records) {
        return new RowCopies<>(records);
    }

    @Override
    public boolean hasNext() {
        return records.hasNext();
    }

    @Override
    @SuppressWarnings("unchecked")
    public Product2<K, V> next() {
        Product2<K, V> record = records.next();
        K key = record._1();
        V value = record._2();
        if (value instanceof InternalRow row) {
            return new Tuple2<>(key instanceof InternalRow k ? (K) k.copy() : key, (V) row.copy());
        }
        return record;
    }
}
