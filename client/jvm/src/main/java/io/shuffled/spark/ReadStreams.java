package io.shuffled.spark;

import io.shuffled.client.PartitionReader;
import io.shuffled.client.ShuffleClient;
import io.shuffled.client.wire.ErrorCode;
import io.shuffled.client.wire.ShuffledException;
import java.io.IOException;
import java.util.ArrayList;
import java.util.List;

/**
 * The read streams of one reduce task, one per location, all through the task's daemon: opened a few ahead
 * of the one being read ({@link #OPEN_AHEAD}), so the next daemons already send under their initial credit
 * while this one is read, and a task's buffered memory stays bounded however many daemons hold its input.
 *
 * <p>A daemon that drains refuses new reads with {@code SHUTTING_DOWN} (PROTOCOL.md §8). A stream refused
 * before it delivered a byte is opened again, with the ones behind it, through
 * {@link DaemonClients#withDaemon}: another daemon of {@code spark.shuffled.address}, or the same one once
 * it is back, within {@code spark.shuffled.timeout}. Without this a rolling restart would turn every read
 * that reaches a closing daemon into a fetch failure and a recomputed stage. A refusal after bytes were
 * consumed ends the read as any error does: those bytes are in the task's records already.
 */
final class ReadStreams implements AutoCloseable {
    /** Read streams open beyond the one being read (each holds up to its credit in buffers). */
    static final int OPEN_AHEAD = 3;

    /** Sends the read request of one location through {@code client}. */
    interface Opener {
        PartitionReader open(ShuffleClient client, int location) throws IOException;
    }

    private final DaemonClients clients;
    private final String executorId;
    private final long taskAttemptId;
    private final int locations;
    private final Opener opener;
    private final List<PartitionReader> streams = new ArrayList<>();
    private ShuffleClient client;

    ReadStreams(DaemonClients clients, String executorId, long taskAttemptId, int locations, Opener opener) {
        this.clients = clients;
        this.executorId = executorId;
        this.taskAttemptId = taskAttemptId;
        this.locations = locations;
        this.opener = opener;
    }

    /** The daemon the streams go through; null before the first {@link #start}. */
    ShuffleClient client() {
        return client;
    }

    /**
     * The blocks of location {@code index} (locations are started in order; {@code batched}: see
     * {@link PairInput}), with its first chunk (or its end) at hand, so that a refusal shows here rather than
     * after the caller took bytes.
     */
    PairInput start(int index, boolean batched, PairInput.Listener listener) throws IOException {
        if (client == null) {
            client = clients.forTask(executorId, taskAttemptId);
        }
        try {
            return first(index, listener, batched);
        } catch (ShuffledException e) {
            if (e.code() != ErrorCode.SHUTTING_DOWN) {
                throw e;
            }
            return clients.withDaemon(executorId, taskAttemptId, c -> {
                client = c;
                return first(index, listener, batched);
            });
        }
    }

    private PairInput first(int index, PairInput.Listener listener, boolean batched) throws IOException {
        while (streams.size() < Math.min(locations, index + 1 + OPEN_AHEAD)) {
            streams.add(opener.open(client, streams.size()));
        }
        PairInput input = new PairInput(streams.get(index), listener, batched);
        try {
            input.peek();
        } catch (IOException e) {
            drop(index); // nothing of them was taken: a retry opens them anew
            throw e;
        }
        return input;
    }

    private void drop(int from) {
        List<PartitionReader> rest = streams.subList(from, streams.size());
        for (PartitionReader r : rest) {
            r.close();
            Counts.streamDone(r.taken());
        }
        rest.clear();
    }

    @Override
    public void close() {
        drop(0);
    }
}
