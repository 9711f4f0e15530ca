package io.shuffled.spark;

import java.io.InputStream;
import java.io.OutputStream;
import org.apache.spark.SparkConf;
import org.apache.spark.io.CompressionCodec;
import org.apache.spark.io.LZ4CompressionCodec;

/**
 * A compression codec Spark does not know (any third-party one): LZ4 underneath, but not an LZ4 codec class,
 * so {@code CompressionCodec.supportsConcatenationOfSerializedStreams} says its streams may not follow each other
 * in one block and the plugin's writer takes Spark's sorter for wide shuffles (the Spark tests set it with
 * {@code spark.io.compression.codec=io.shuffled.spark.OpaqueLz4Codec}).
 */
public final class OpaqueLz4Codec implements CompressionCodec {
    private final LZ4CompressionCodec lz4;

    public OpaqueLz4Codec(SparkConf conf) {
        this.lz4 = new LZ4CompressionCodec(conf);
    }

    @Override
    public OutputStream compressedOutputStream(OutputStream out) {
        return lz4.compressedOutputStream(out);
    }

    @Override
    public InputStream compressedInputStream(InputStream in) {
        return lz4.compressedInputStream(in);
    }
}
