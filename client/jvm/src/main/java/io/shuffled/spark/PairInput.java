package io.shuffled.spark;

import io.shuffled.client.PartitionReader;
import io.shuffled.client.wire.ErrorCode;
import io.shuffled.client.wire.ShuffledException;
import java.io.IOException;
import java.io.InputStream;
import java.nio.ByteBuffer;
import java.util.HashSet;
import java.util.Set;

/**
 * One read stream seen as a sequence of (partition, attempt) pairs, each an {@link InputStream} over
 * exactly the bytes that attempt wrote for that partition: one Spark shuffle block.
 *
 * <p>This relies on PROTOCOL.md §10.1: on a stream whose request names a single location, the chunks
 * of one pair arrive together, in order. Chunks are consumed in place (no reassembly), so memory stays
 * at the stream's credit. A pair that shows up again after it ended would mean the daemon broke that
 * rule; it fails the read with {@link ErrorCode#PROTOCOL} rather than returning a block in pieces.
 */
final class PairInput extends InputStream {
    /** Bytes and chunks taken from the stream, for the task's read metrics. */
    interface Listener {
        void chunk(int bytes, long waitNanos);
    }

    private final PartitionReader reader;
    private final Listener listener;
    private final Set<Long> finished = new HashSet<>();
    private PartitionReader.Chunk pending;
    private ByteBuffer current;
    private int partition = -1;
    private long attempt = -1;
    private boolean inPair;
    private boolean ended;
    private IOException failure;

    PairInput(PartitionReader reader, Listener listener) {
        this.reader = reader;
        this.listener = listener;
    }

    /** Moves to the next pair (skipping what is left of this one); false at the end of the stream. */
    boolean nextPair() throws IOException {
        while (inPair) {
            current = null;
            fill(); // drop the rest of the current pair
        }
        peek();
        if (pending == null) {
            return false;
        }
        partition = pending.partition();
        attempt = pending.attemptId();
        if (!finished.add(((long) partition << 40) ^ attempt)) {
            throw new ShuffledException(ErrorCode.PROTOCOL, "chunks of partition " + partition + " of map attempt "
                    + attempt + " arrived after another pair's; the daemon must send each pair's chunks together");
        }
        current = pending.data();
        pending = null;
        inPair = true;
        return true;
    }

    /** Makes the next chunk (or the stream's end) at hand without starting its pair. */
    void peek() throws IOException {
        if (pending == null && !ended) {
            pending = take();
        }
    }

    int partition() {
        return partition;
    }

    long attempt() {
        return attempt;
    }

    @Override
    public int read() throws IOException {
        if (!fill()) {
            return -1;
        }
        return current.get() & 0xff;
    }

    @Override
    public int read(byte[] b, int off, int len) throws IOException {
        if (len == 0) {
            return 0;
        }
        if (!fill()) {
            return -1;
        }
        int n = Math.min(len, current.remaining());
        current.get(b, off, n);
        return n;
    }

    @Override
    public int available() {
        return current == null ? 0 : current.remaining();
    }

    @Override
    public void close() {
        // the stream carries more pairs; PartitionReader is closed by its owner
    }

    /** Makes sure bytes of the current pair are at hand; false at the end of the pair. */
    private boolean fill() throws IOException {
        while (inPair && (current == null || !current.hasRemaining())) {
            PartitionReader.Chunk next = ended ? null : take();
            if (next == null || next.partition() != partition || next.attemptId() != attempt) {
                pending = next;
                inPair = false;
                current = null;
                return false;
            }
            current = next.data();
        }
        return inPair;
    }

    /**
     * What the read stream failed with, if it did. Serializers wrap what their input throws (Kryo in a
     * {@code KryoException}), so the reader asks here for the cause rather than trusting what reaches it.
     */
    IOException failure() {
        return failure;
    }

    private PartitionReader.Chunk take() throws IOException {
        long started = System.nanoTime();
        PartitionReader.Chunk c;
        try {
            c = reader.next();
        } catch (IOException e) {
            failure = e;
            throw e;
        }
        if (c == null) {
            ended = true;
        } else {
            listener.chunk(c.data().remaining(), System.nanoTime() - started);
        }
        return c;
    }
}
