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
 * One read stream seen as a sequence of blocks, each an {@link InputStream} over exactly the bytes of one
 * (partition, attempt) pair: one Spark shuffle block. Or, {@code batched}, over the bytes of all of one
 * attempt's pairs in the read's range, one after the other: what Spark's own reader fetches as one
 * {@code ShuffleBlockBatchId} when a coalesced read may (its blocks' compressed streams and serialized records
 * concatenate), read through one decompressing and one deserializing stream instead of one per pair.
 *
 * <p>This relies on PROTOCOL.md §10.1: on a stream whose request names a single location, the chunks
 * of one pair arrive together, in order, and one attempt's pairs together, in ascending partition order.
 * Chunks are consumed in place (no reassembly), so memory stays at the stream's credit. A block that shows
 * up again after it ended would mean the daemon broke that rule; it fails the read with
 * {@link ErrorCode#PROTOCOL} rather than returning a block in pieces.
 */
final class PairInput extends InputStream {
    /** Bytes and chunks taken from the stream, for the task's read metrics. */
    interface Listener {
        void chunk(int bytes, long waitNanos);
    }

    private final PartitionReader reader;
    private final Listener listener;
    /** Whether a block is all of an attempt's pairs (else one pair). */
    private final boolean batched;
    private final Set<Long> finished = new HashSet<>();
    private PartitionReader.Chunk pending;
    private ByteBuffer current;
    private int partition = -1;
    private long attempt = -1;
    private boolean inPair;
    private boolean ended;
    private IOException failure;

    PairInput(PartitionReader reader, Listener listener, boolean batched) {
        this.reader = reader;
        this.listener = listener;
        this.batched = batched;
    }

    /** Moves to the next block (skipping what is left of this one); false at the end of the stream. */
    boolean nextBlock() throws IOException {
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
        if (!finished.add(batched ? attempt : ((long) partition << 40) ^ attempt)) {
            throw new ShuffledException(ErrorCode.PROTOCOL, "chunks of partition " + partition + " of map attempt "
                    + attempt + " arrived after another " + (batched ? "attempt's" : "pair's")
                    + "; the daemon must send each pair's chunks, and each attempt's pairs, together");
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

    /** The block's (first) partition. */
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

    /** Makes sure bytes of the current block are at hand; false at the end of the block. */
    private boolean fill() throws IOException {
        while (inPair && (current == null || !current.hasRemaining())) {
            PartitionReader.Chunk next = ended ? null : take();
            if (next == null || next.attemptId() != attempt || (!batched && next.partition() != partition)) {
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
