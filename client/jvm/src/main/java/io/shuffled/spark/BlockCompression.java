package io.shuffled.spark;

import io.shuffled.client.ShuffleClient;
import io.shuffled.client.wire.ShuffledException;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.spark.SparkConf;
import org.apache.spark.serializer.SerializerManager;
import org.apache.spark.storage.BlockId;

/**
 * Whether a map output's blocks go through Spark's codec. Compression is worth its CPU when the bytes would
 * otherwise cost something else: the network between hosts (reads of another host's outputs, replicas, uploads
 * to an object store), or pool memory once the daemon's pool fills (more spill). Map outputs that stay in the
 * memory of the one host that writes and reads them cost neither, and compressing and decompressing them again
 * can be most of what a shuffled session spends over Spark's built-in shuffle (docs/spark.md). So in {@code auto},
 * in an application whose executors all run on one host (a {@code local} or {@code local-cluster} master), each
 * map task asks its daemon, at most every {@link #RECHECK_NANOS}, how full its pool is and whether it has peers
 * or an object store (admin {@code pool}, PROTOCOL.md §13), and writes its blocks uncompressed while the pool is
 * less than half full and the daemon alone (and the application asks for neither replicas nor uploads). On a
 * cluster of several hosts no executor can tell which host will read an output, so {@code auto} compresses
 * there. The map status says which (see {@link DaemonLocation}), so a reader decompresses each map output as it
 * was written, whatever the daemon's state by then. IO encryption is applied either way. The default is
 * {@code on}: uncompressed outputs that later outgrow the pool make the daemon spill more and hold back the
 * pushes behind them, which measured slower than compressing everything (docs/performance.md).
 */
final class BlockCompression {
    /** How long a daemon's answer stands: map tasks of a busy executor do not ask one each. */
    static final long RECHECK_NANOS = 100_000_000L;

    /** {@code spark.shuffled.compression}. */
    enum Mode {
        /** Compress unless the bytes stay in the memory of one host. */
        AUTO,
        /** As {@code spark.shuffle.compress} says, always. */
        ON,
        /** Never. */
        OFF
    }

    private record Reading(long atNanos, boolean compress) {}

    private final Mode mode;
    private final Map<String, Reading> readings = new ConcurrentHashMap<>();

    private BlockCompression(Mode mode) {
        this.mode = mode;
    }

    /**
     * The JVM's choice: {@code spark.shuffled.compression}, off whenever {@code spark.shuffle.compress} is; in
     * {@code auto}, on unless the application runs on one host and keeps its outputs there (no replicas, no
     * uploads).
     */
    static BlockCompression of(ShuffledConf settings, SparkConf conf) {
        if (!conf.getBoolean("spark.shuffle.compress", true)) {
            return new BlockCompression(Mode.OFF);
        }
        boolean oneHost = conf.get("spark.master", "").startsWith("local");
        boolean leaves = !oneHost || settings.replicas > 1 || "object-store".equals(settings.durability);
        return new BlockCompression(settings.compression == Mode.AUTO && leaves ? Mode.ON : settings.compression);
    }

    /** Whether the map output a task is about to write into {@code client}'s daemon is compressed. */
    boolean compress(ShuffleClient client) throws IOException {
        if (mode != Mode.AUTO) {
            return mode == Mode.ON;
        }
        long now = System.nanoTime();
        Reading last = readings.get(client.daemonNode());
        if (last != null && now - last.atNanos() < RECHECK_NANOS) {
            return last.compress();
        }
        boolean compress;
        try {
            compress = pressed(client.admin("pool", Map.of()));
        } catch (ShuffledException e) {
            if (!client.isOpen()) {
                throw e; // the connection broke: the push would fail too, and the task with its reason
            }
            compress = true; // a daemon that will not say (one from before the `pool` operation): as Spark would
        }
        readings.put(client.daemonNode(), new Reading(now, compress));
        return compress;
    }

    /**
     * Whether a daemon's answer to {@code pool} (PROTOCOL.md §13) says its bytes cost more than the codec's CPU:
     * half its pool in use, other daemons on its ring, or an object store. An answer without them counts as
     * pressed.
     */
    static boolean pressed(Map<String, Object> pool) {
        if (!(pool.get("used") instanceof Long used) || !(pool.get("total") instanceof Long total)
                || !(pool.get("peers") instanceof Long peers) || !(pool.get("object_store") instanceof Boolean store)) {
            return true;
        }
        return peers > 0 || store || 2 * used >= total;
    }

    /** A block's stream for writing: Spark's codec (and encryption) when compressed, encryption alone if not. */
    static OutputStream wrap(SerializerManager serializers, BlockId id, OutputStream out, boolean compressed) {
        return compressed ? serializers.wrapStream(id, out) : serializers.wrapForEncryption(out);
    }

    /** A block's stream for reading, written as {@link #wrap(SerializerManager, BlockId, OutputStream, boolean)}. */
    static InputStream wrap(SerializerManager serializers, BlockId id, InputStream in, boolean compressed) {
        return compressed ? serializers.wrapStream(id, in) : serializers.wrapForEncryption(in);
    }
}
