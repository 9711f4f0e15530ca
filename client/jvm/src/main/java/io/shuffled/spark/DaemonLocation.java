package io.shuffled.spark;

import org.apache.spark.storage.BlockManagerId;
import org.apache.spark.storage.BlockManagerId$;
import scala.Option;

/**
 * Names a daemon in Spark's map output bookkeeping. A {@code MapStatus} location is a
 * {@link BlockManagerId}; ours carries the daemon's node name (its advertised {@code host:port}) as the
 * executor id, so that when a read fails Spark's usual reaction, "forget every output of that executor",
 * forgets exactly the outputs held by the failed daemon. The host is the writing executor's host (the
 * daemon runs next to it), which keeps Spark's reduce-task locality working. A map output written without
 * compression ({@link BlockCompression}) says so in the topology info, which Spark serializes with the location
 * in the map status; without it, the blocks are as {@code spark.shuffle.compress} says. The mark makes the two
 * kinds two locations of one daemon (a {@link BlockManagerId}'s equality includes it): the reader takes each as
 * it finds it, and blames a failed read on that same id, so that Spark's "forget this map output" (which compares
 * whole ids) finds it; forgetting by executor id or host, as on a lost executor, ignores the mark.
 */
final class DaemonLocation {
    static final String PREFIX = "shuffled@";
    private static final Option<String> UNCOMPRESSED = Option.apply("shuffled:uncompressed");

    private DaemonLocation() {}

    static BlockManagerId of(String daemonNode, String executorHost) {
        return of(daemonNode, executorHost, true);
    }

    /** The location of a map output whose blocks were written {@code compressed} or not. */
    static BlockManagerId of(String daemonNode, String executorHost, boolean compressed) {
        if (daemonNode.isEmpty() || daemonNode.startsWith("0.0.0.0:") || daemonNode.startsWith("[::]:")) {
            throw new IllegalStateException("the shuffled daemon calls itself '" + daemonNode + "', which does not "
                    + "tell daemons apart: start it with --advertise HOST:PORT");
        }
        int port = 1; // BlockManagerId insists on a positive port; only the executor id is used to find data
        int colon = daemonNode.lastIndexOf(':');
        if (colon > 0) {
            try {
                port = Math.max(1, Integer.parseInt(daemonNode.substring(colon + 1)));
            } catch (NumberFormatException ignored) {
                // not host:port; keep 1
            }
        }
        return BlockManagerId$.MODULE$.apply(
                PREFIX + daemonNode, executorHost, port, compressed ? Option.empty() : UNCOMPRESSED);
    }

    /** The daemon node a location names; fails for map output that shuffled did not write. */
    static String daemonOf(BlockManagerId location) {
        String id = location.executorId();
        if (!id.startsWith(PREFIX)) {
            throw new IllegalStateException("map output at " + location + " was not written through shuffled "
                    + "(is spark.shuffle.manager the same on every executor?)");
        }
        return id.substring(PREFIX.length());
    }

    /** Whether the map outputs at a location went through Spark's codec (when it compresses at all). */
    static boolean compressed(BlockManagerId location) {
        return !location.topologyInfo().equals(UNCOMPRESSED);
    }
}
