package io.shuffled.spark;

import org.apache.spark.storage.BlockManagerId;
import org.apache.spark.storage.BlockManagerId$;
import scala.Option;

/**
 * Names a daemon in Spark's map output bookkeeping. A {@code MapStatus} location is a
 * {@link BlockManagerId}; ours carries the daemon's node name (its advertised {@code host:port}) as the
 * executor id, so that when a read fails Spark's usual reaction, "forget every output of that executor",
 * forgets exactly the outputs held by the failed daemon. The host is the writing executor's host (the
 * daemon runs next to it), which keeps Spark's reduce-task locality working.
 */
final class DaemonLocation {
    static final String PREFIX = "shuffled@";

    private DaemonLocation() {}

    static BlockManagerId of(String daemonNode, String executorHost) {
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
        return BlockManagerId$.MODULE$.apply(PREFIX + daemonNode, executorHost, port, Option.empty());
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
}
