package io.shuffled.spark;

import io.shuffled.client.ShuffleClient;
import io.shuffled.client.wire.ErrorCode;
import io.shuffled.client.wire.ShuffledException;
import java.io.IOException;
import java.io.InterruptedIOException;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;

/**
 * The connections of one JVM to its daemons: one {@link ShuffleClient} per address, shared by all tasks
 * (the client multiplexes streams) and reopened after it breaks. A task's daemon is chosen from
 * {@code spark.shuffled.address} by executor id (or task id, see {@link ShuffledConf.DaemonChoice}); if
 * it cannot be reached the next address in the list is tried, so a restarted or lost daemon does not
 * stall every retry; when none can, the task waits for one that was there to come back, up to the plugin's
 * timeout.
 */
final class DaemonClients implements AutoCloseable {
    private static final long FIRST_PAUSE_MILLIS = 50;
    private static final long MAX_PAUSE_MILLIS = 1000;

    private final ShuffledConf conf;
    private final String name;
    private final Map<String, ShuffleClient> clients = new ConcurrentHashMap<>();
    /** Addresses this JVM has connected to at least once: a daemon that was there is worth waiting for. */
    private final Set<String> reached = ConcurrentHashMap.newKeySet();

    DaemonClients(ShuffledConf conf, String name) {
        this.conf = conf;
        this.name = name;
    }

    /** What a task does with its daemon; may fail over to the next one (see {@link #withDaemon}). */
    interface DaemonCall<T> {
        T apply(ShuffleClient client) throws IOException;
    }

    /** {@code spark.shuffled.replicas}: copies of each map output, 0 for the daemons' own setting. */
    int replicas() {
        return conf.replicas;
    }

    /** {@code spark.shuffled.writerBufferSize}: a map task's push buffer. */
    long writerBufferBytes() {
        return conf.writerBufferBytes;
    }

    /** {@code spark.shuffled.sortBufferSize}: the most a map task's serialized records take before they go. */
    long sortBufferBytes() {
        return conf.sortBufferBytes;
    }

    /** {@code spark.shuffled.durability}: "object-store", "none", or null for the daemons' own setting. */
    String durability() {
        return conf.durability;
    }

    /** {@code spark.shuffled.fsync}: "commit", or null for the daemons' own setting. */
    String fsync() {
        return conf.fsync;
    }

    /** The daemon a task reads through. */
    ShuffleClient forTask(String executorId, long taskAttemptId) throws IOException {
        return withDaemon(executorId, taskAttemptId, c -> c);
    }

    /**
     * Runs {@code call} against the task's daemon, or the next address in the list if that daemon cannot
     * be reached or is shutting down (it refuses new pushes while it drains). When no daemon answers but
     * this JVM has reached one before, the round is tried again with a growing pause until
     * {@code spark.shuffled.timeout} has passed: a daemon that restarts (systemd, Kubernetes) is back
     * within seconds, and a task that failed at once would be retried at once by Spark and fail again,
     * aborting the job before the daemon is up. A JVM that never reached any daemon fails at once: that is
     * a wrong address or a daemon that is not running, and waiting would only delay the message.
     */
    <T> T withDaemon(String executorId, long taskAttemptId, DaemonCall<T> call) throws IOException {
        long deadline = System.nanoTime() + conf.timeoutMillis * 1_000_000L;
        long pauseMillis = FIRST_PAUSE_MILLIS;
        while (true) {
            ShuffledException unreachable;
            try {
                return eachDaemon(executorId, taskAttemptId, call);
            } catch (ShuffledException e) {
                if (!reachNext(e) || reached.isEmpty() || System.nanoTime() + pauseMillis * 1_000_000L > deadline) {
                    throw e;
                }
                unreachable = e;
            }
            try {
                Thread.sleep(pauseMillis); // a backoff between rounds, not a synchronisation
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                InterruptedIOException kill = new InterruptedIOException("killed while waiting for a daemon");
                kill.initCause(unreachable);
                throw kill;
            }
            pauseMillis = Math.min(2 * pauseMillis, MAX_PAUSE_MILLIS);
        }
    }

    /** One round over the addresses, the task's own daemon first. */
    private <T> T eachDaemon(String executorId, long taskAttemptId, DaemonCall<T> call) throws IOException {
        List<String> addresses = conf.addresses;
        int n = addresses.size();
        int first = first(executorId, taskAttemptId);
        ShuffledException last = null;
        for (int i = 0; i < n; i++) {
            try {
                return call.apply(client(addresses.get((first + i) % n)));
            } catch (ShuffledException e) {
                if (!reachNext(e)) {
                    throw e;
                }
                last = e;
            }
        }
        throw last;
    }

    /** Failures that say nothing about the call, only that this daemon cannot take it now. */
    private static boolean reachNext(ShuffledException e) {
        return e.code() == ErrorCode.CONNECTION_LOST || e.code() == ErrorCode.SHUTTING_DOWN;
    }

    /** The address a task tries first: its own daemon, the one to blame when no daemon answers. */
    String taskDaemon(String executorId, long taskAttemptId) {
        return conf.addresses.get(first(executorId, taskAttemptId));
    }

    private int first(String executorId, long taskAttemptId) {
        long key = conf.choice == ShuffledConf.DaemonChoice.TASK ? taskAttemptId : executorKey(executorId);
        return (int) Math.floorMod(key, (long) conf.addresses.size());
    }

    /** An open client for {@code address}, connecting (again) if needed. */
    ShuffleClient client(String address) throws IOException {
        ShuffleClient c = clients.get(address);
        if (c != null && c.isOpen()) {
            return c;
        }
        synchronized (this) {
            c = clients.get(address);
            if (c != null && c.isOpen()) {
                return c;
            }
            if (c != null) {
                c.close();
            }
            c = ShuffleClient.connect(
                    address, name, conf.timeoutMillis, conf.writerBufferBytes, conf.secret, conf.appSecret,
                    conf.tlsFor(address));
            clients.put(address, c);
            reached.add(address);
            return c;
        }
    }

    private static long executorKey(String executorId) {
        try {
            return Long.parseLong(executorId);
        } catch (NumberFormatException e) {
            return "driver".equals(executorId) ? 0 : executorId.hashCode();
        }
    }

    @Override
    public synchronized void close() {
        for (ShuffleClient c : clients.values()) {
            c.close();
        }
        clients.clear();
    }
}
