package io.shuffled.client;

import io.shuffled.client.wire.ErrorCode;
import io.shuffled.client.wire.Frame;
import io.shuffled.client.wire.PackedGroups;
import io.shuffled.client.wire.ProtocolException;
import io.shuffled.client.wire.ShuffledException;
import io.shuffled.client.wire.Wire;
import java.io.IOException;
import java.io.InterruptedIOException;
import java.net.SocketTimeoutException;
import java.nio.ByteBuffer;
import java.util.ArrayDeque;
import java.util.Arrays;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.Condition;
import java.util.concurrent.locks.ReentrantLock;

/**
 * One read stream (PROTOCOL.md §10) under credit-based flow control (§11). Not thread-safe: one task
 * thread calls {@link #next()}; the connection's reader thread delivers buffers.
 *
 * <p>Each DATA buffer holds packed groups (§7.6): {@link #next()} hands out one {@link Chunk} per run, a
 * slice of the received buffer, and the buffer counts as consumed once {@code next()} moves past its last
 * run. A buffer is checked on arrival: its CRC32C (a mismatch fails the stream with
 * {@link ErrorCode#CORRUPT_DATA}), then its groups' structure, against the request's partition range and
 * map attempts (a violation fails it with {@link ErrorCode#PROTOCOL}); either way the stream is cancelled.
 *
 * <p>Flow control follows §11.2 for a gate with one channel: the request carries the {@link #EXCLUSIVE}
 * buffers as initial credit; the {@code backlog} of each DATA buffer makes the channel take up to
 * {@link #FLOATING} more buffers (each one new credit) so that it holds {@code backlog + EXCLUSIVE} free
 * ones; when the caller moves on from a chunk its buffer becomes credit again, or returns to the floating
 * pool if the channel holds more than it needs. So at most {@code EXCLUSIVE + FLOATING} received buffers
 * (queued plus the one the caller holds) exist per reader. New credit is announced with one
 * {@code AddCredit} carrying all unannounced credit, sent right after the event (a received buffer or a
 * consumed chunk) that makes it due: {@link #ANNOUNCE_BATCH} unannounced, or the daemon short of credit.
 *
 * <p>Sequence numbers are checked (a gap fails the stream with {@link ErrorCode#SEQUENCE_GAP} and cancels
 * it). An {@code Error} from the daemon surfaces from {@link #next()} as a {@link ShuffledException};
 * {@link ShuffledException#code()} tells e.g. {@link ErrorCode#PARTITION_NOT_FOUND} apart, and
 * {@link ShuffledException#fetchFailure()} says whether Spark should treat it as lost shuffle data.
 */
public final class PartitionReader implements AutoCloseable {
    /** Buffers each read stream owns; the initial credit of the PartitionRequest. */
    public static final int EXCLUSIVE = 2;
    /**
     * The most buffers a reader may add from its floating pool as the backlog grows (PROTOCOL.md §11.2: 64,
     * not Flink's 8, since a read here has one channel); a reader may be given fewer (the Spark plugin
     * divides {@code spark.reducer.maxSizeInFlight} among a task's open streams).
     */
    public static final int FLOATING = 64;
    /**
     * New credit is announced once this much is unannounced, or while the daemon holds less than this
     * (PROTOCOL.md §11.2): one {@code AddCredit} per released chunk cost a socket write each.
     */
    static final int ANNOUNCE_BATCH = 8;

    /**
     * One run of a reduce partition: part of the bytes map attempt {@code attemptId} wrote for
     * {@code partition}. {@code data} is a slice of the received heap buffer (position 0), the caller's to
     * keep.
     */
    public record Chunk(int partition, long attemptId, ByteBuffer data) {
        /** The payload as a new array. */
        public byte[] bytes() {
            ByteBuffer d = data.duplicate();
            byte[] out = new byte[d.remaining()];
            d.get(out);
            return out;
        }
    }

    private final ShuffleClient client;
    private final long stream;
    /** floating buffers this reader may take, at most {@link #FLOATING} */
    private final int floating;
    /** the request's partition range and map attempts (sorted), which every received group must keep to */
    private final long start;
    private final long end;
    private final long[] attempts;
    /** the runs of the buffer the caller is in (task thread only) */
    private PackedGroups.Cursor current;

    private final ReentrantLock lock = new ReentrantLock();
    private final Condition changed = lock.newCondition();
    // guarded by lock
    private final ArrayDeque<ByteBuffer> queue = new ArrayDeque<>();
    private int inUse;
    private int floatingHeld;
    private long serverCredit = EXCLUSIVE;
    private long unannounced;
    private long backlog;
    private long expectedSequence;
    private int peakWindow = EXCLUSIVE;
    private boolean ended;
    /** Volatile so that {@link #next()} sees a close between the runs of one buffer without the lock. */
    private volatile boolean closed;
    private ShuffledException error;
    /** What the caller took: DATA buffers, their payload bytes, runs (only the reading thread counts). */
    private long buffersTaken;
    private long bytesTaken;
    private long runsTaken;

    PartitionReader(ShuffleClient client, long stream, int floating, long start, long end, long[] attempts) {
        if (floating < 0 || floating > FLOATING) {
            throw new IllegalArgumentException("floating buffers must be in 0.." + FLOATING + ", got " + floating);
        }
        this.client = client;
        this.stream = stream;
        this.floating = floating;
        this.start = start;
        this.end = end;
        this.attempts = attempts.clone();
        Arrays.sort(this.attempts);
    }

    /**
     * The most buffers this reader has held credit for at once (its exclusive ones plus the floating ones
     * it took): its window, which never exceeds {@code EXCLUSIVE} plus the floating buffers it was given.
     */
    public int peakWindow() {
        lock.lock();
        try {
            return peakWindow;
        } finally {
            lock.unlock();
        }
    }

    /**
     * What this reader handed over so far: {DATA buffers, their payload bytes (packed groups with their
     * directories), runs}. For the caller's reading thread (the Spark plugin's read breakdown).
     */
    public long[] taken() {
        return new long[] {buffersTaken, bytesTaken, runsTaken};
    }

    /** The receiver id (stream id) on the connection. */
    public long streamId() {
        return stream;
    }

    /**
     * The next run, or null after END_OF_PARTITION. Moving past a buffer's last run releases the buffer
     * (it becomes credit). Blocks for data at most the client's timeout ({@link SocketTimeoutException}).
     *
     * @throws ShuffledException the daemon's error for this stream (with its code), or the connection's
     */
    public Chunk next() throws IOException {
        if (current != null) {
            if (!closed && current.next()) {
                return chunk();
            }
            current = null;
        }
        long announce;
        lock.lock();
        try {
            if (closed && error == null && queue.isEmpty()) {
                return null;
            }
            announce = releaseCurrentLocked();
        } finally {
            lock.unlock();
        }
        sendCredit(announce);
        long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(client.timeoutMillis());
        lock.lock();
        try {
            while (queue.isEmpty() && !ended && error == null) {
                long left = deadline - System.nanoTime();
                if (left <= 0) {
                    throw new SocketTimeoutException("no data on read stream " + stream + " from "
                            + client.address() + " within " + client.timeoutMillis() + " ms");
                }
                changed.awaitNanos(left);
            }
            if (!queue.isEmpty()) {
                inUse = 1;
                ByteBuffer payload = queue.poll();
                buffersTaken++;
                bytesTaken += payload.remaining();
                current = new PackedGroups.Cursor(payload);
                current.next(); // checked on arrival: it holds at least one run
                return chunk();
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new InterruptedIOException("interrupted waiting for read data");
        } finally {
            lock.unlock();
        }
        ShuffledException e = failure();
        close();
        if (e != null) {
            throw e;
        }
        return null;
    }

    private Chunk chunk() {
        runsTaken++;
        return new Chunk(current.partition(), current.attempt(), current.data());
    }

    /** Convenience: every remaining chunk's bytes concatenated (for small partitions and tests). */
    public byte[] readAll() throws IOException {
        java.io.ByteArrayOutputStream out = new java.io.ByteArrayOutputStream();
        for (Chunk c = next(); c != null; c = next()) {
            ByteBuffer d = c.data();
            out.write(d.array(), d.arrayOffset() + d.position(), d.remaining());
        }
        return out.toByteArray();
    }

    /** Whether END_OF_PARTITION arrived, or the stream failed or was closed. */
    public boolean finished() {
        lock.lock();
        try {
            return ended || closed || error != null;
        } finally {
            lock.unlock();
        }
    }

    /** Stops reading: sends CancelPartitionRequest unless the stream already ended (§7.7). */
    @Override
    public void close() {
        boolean cancel;
        lock.lock();
        try {
            if (closed) {
                return;
            }
            closed = true;
            cancel = !ended && error == null;
            ended = true;
            queue.clear();
            inUse = 0;
            changed.signalAll();
        } finally {
            lock.unlock();
        }
        client.forget(stream);
        if (cancel) {
            client.sendQuietly(new Frame.CancelPartitionRequest(stream));
        }
    }

    // ------------------------------------------------------------------------------------------ internals

    private ShuffledException failure() {
        lock.lock();
        try {
            return error;
        } finally {
            lock.unlock();
        }
    }

    private long free() {
        return EXCLUSIVE + floatingHeld - queue.size() - inUse;
    }

    /** The caller is done with its chunk: the buffer is credit again, or goes back to the floating pool. */
    private long releaseCurrentLocked() {
        if (inUse == 0) {
            return 0;
        }
        inUse = 0;
        if (floatingHeld > 0 && free() > backlog + EXCLUSIVE) {
            floatingHeld--;
        } else {
            unannounced++;
        }
        return takeAnnouncementLocked();
    }

    private long takeAnnouncementLocked() {
        if (ended || closed || error != null) {
            return 0; // no AddCredit for an ended stream (§11.2)
        }
        if (unannounced < ANNOUNCE_BATCH && serverCredit >= ANNOUNCE_BATCH) {
            return 0; // held back until there is more, or the daemon runs short (§11.2)
        }
        long n = unannounced;
        unannounced = 0;
        serverCredit += n;
        return n;
    }

    private void sendCredit(long n) {
        if (n > 0) {
            client.sendQuietly(new Frame.AddCredit(stream, n));
        }
    }

    ShuffleClient.StreamHandler handler() {
        return new ShuffleClient.StreamHandler() {
            @Override
            public void onFrame(Frame frame) throws ShuffledException {
                if (!(frame instanceof Frame.BufferResponse b)) {
                    throw new ProtocolException(frame.type() + " on a read stream");
                }
                long announce = 0;
                boolean gap = false;
                // Checked before taking the lock, once per buffer, on the reader thread (§7.6).
                ByteBuffer payload = b.isEvent() ? null : b.payload();
                long crc = payload == null ? 0 : Wire.crc32c(payload);
                String malformed = crc == b.crc() ? structure(payload) : null;
                lock.lock();
                try {
                    if (closed || ended || error != null) {
                        return;
                    }
                    if (b.sequence() != expectedSequence) {
                        error = new ShuffledException(ErrorCode.SEQUENCE_GAP, "read stream " + stream
                                + ": expected sequence " + expectedSequence + ", got " + b.sequence());
                        gap = true;
                    } else if (payload != null && crc != b.crc()) {
                        error = new ShuffledException(ErrorCode.CORRUPT_DATA, "read stream " + stream + ": buffer "
                                + b.sequence() + " failed its CRC32C check (got " + Long.toHexString(crc)
                                + ", the frame says " + Long.toHexString(b.crc()) + ")");
                        gap = true; // the stream ends here: cancel it at the daemon
                    } else if (malformed != null) {
                        error = new ShuffledException(ErrorCode.PROTOCOL,
                                "read stream " + stream + ": buffer " + b.sequence() + ": " + malformed);
                        gap = true;
                    } else {
                        expectedSequence = (expectedSequence + 1) & Wire.MAX_U32;
                        if (b.isEvent()) {
                            ended = true;
                        } else {
                            if (serverCredit == 0) {
                                throw new ProtocolException(ErrorCode.CREDIT_VIOLATION,
                                        "BufferResponse without credit on read stream " + stream);
                            }
                            serverCredit--;
                            queue.add(payload);
                            backlog = b.backlog();
                            while (free() < backlog + EXCLUSIVE && floatingHeld < floating) {
                                floatingHeld++;
                                unannounced++;
                            }
                            peakWindow = Math.max(peakWindow, EXCLUSIVE + floatingHeld);
                            announce = takeAnnouncementLocked();
                        }
                    }
                    changed.signalAll();
                } finally {
                    lock.unlock();
                }
                if (gap || finishedByEvent()) {
                    client.forget(stream);
                }
                if (gap) {
                    client.sendQuietly(new Frame.CancelPartitionRequest(stream));
                }
                sendCredit(announce);
            }

            @Override
            public void onError(ShuffledException e) {
                lock.lock();
                try {
                    if (error == null && !ended) {
                        error = e;
                    }
                    changed.signalAll();
                } finally {
                    lock.unlock();
                }
            }

            @Override
            public boolean wantsPayload() {
                lock.lock();
                try {
                    return !closed && !ended && error == null;
                } finally {
                    lock.unlock();
                }
            }
        };
    }

    /** What is wrong with a DATA payload's packed groups, or null (a discarded payload is not looked at). */
    private String structure(ByteBuffer payload) {
        if (payload == null) {
            return null;
        }
        try {
            PackedGroups.check(payload, start, end, a -> Arrays.binarySearch(attempts, a) >= 0);
            return null;
        } catch (ProtocolException e) {
            return e.getMessage();
        }
    }

    private boolean finishedByEvent() {
        lock.lock();
        try {
            return ended && !closed;
        } finally {
            lock.unlock();
        }
    }
}
