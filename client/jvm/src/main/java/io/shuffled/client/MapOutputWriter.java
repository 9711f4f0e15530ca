package io.shuffled.client;

import io.shuffled.client.wire.ErrorCode;
import io.shuffled.client.wire.Frame;
import io.shuffled.client.wire.FrameEncoder;
import io.shuffled.client.wire.ProtocolException;
import io.shuffled.client.wire.ShuffledException;
import io.shuffled.client.wire.Wire;
import java.io.IOException;
import java.io.InterruptedIOException;
import java.net.SocketTimeoutException;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.Condition;
import java.util.concurrent.locks.ReentrantLock;

/**
 * One map attempt's output on a push stream (PROTOCOL.md §12). Not thread-safe: one task thread uses it.
 *
 * <p>{@link #write} copies bytes into a per-partition buffer of the daemon's segment size and pushes a
 * buffer as one {@code PushData} when it is full; whole segments of a large write are pushed straight
 * from the caller's array. Partially filled buffers are capped at the client's writer buffer bytes: when
 * a partition needs a buffer beyond the cap, the fullest partial buffer is pushed early and its memory
 * reused. Each {@code PushData} takes one push credit; without credit the writer blocks until the daemon
 * grants some ({@code PushCredit}), at most the client's timeout ({@link SocketTimeoutException}).
 *
 * <p>{@link #commit()} pushes what is buffered, sends {@code CommitMapOutput} and returns the lengths of
 * {@code CommitAck}; {@link #abort()} discards the attempt. An {@code Error} on the stream fails every
 * later call with a {@link ShuffledException} carrying its code. {@link #close()} aborts unless committed.
 */
public final class MapOutputWriter implements AutoCloseable {
    private final ShuffleClient client;
    private final long stream;
    private final int numPartitions;
    private final int segmentSize;
    private final int maxBuffers;

    private final ReentrantLock lock = new ReentrantLock();
    private final Condition changed = lock.newCondition();
    // guarded by lock (written by the reader thread)
    private long credit;
    private boolean opened;
    private ShuffledException failure;
    private boolean done;
    private long[] lengths;

    // task thread only
    private final byte[][] buffers;
    private final int[] fill;
    private final List<Integer> holding = new ArrayList<>();
    private byte[] spare; // a flushed partition's buffer, reused by the next partition
    private long nextSequence;
    private long pushes;
    private long bytesWritten;
    private boolean finished;

    MapOutputWriter(ShuffleClient client, long stream, int numPartitions, int segmentSize, long bufferBytes) {
        this.client = client;
        this.stream = stream;
        this.numPartitions = numPartitions;
        this.segmentSize = segmentSize;
        this.maxBuffers = (int) Math.max(1, Math.min(numPartitions, bufferBytes / segmentSize));
        this.buffers = new byte[numPartitions][];
        this.fill = new int[numPartitions];
    }

    /** The writer id (stream id) on the connection. */
    public long streamId() {
        return stream;
    }

    public int numPartitions() {
        return numPartitions;
    }

    /** Bytes passed to {@link #write} so far. */
    public long bytesWritten() {
        return bytesWritten;
    }

    /** PushData frames sent so far. */
    public long pushes() {
        return pushes;
    }

    public void write(int partition, byte[] data) throws IOException {
        write(partition, data, 0, data.length);
    }

    /** Appends {@code len} bytes to reduce partition {@code partition}; may block for push credit. */
    public void write(int partition, byte[] data, int off, int len) throws IOException {
        if (finished) {
            throw new ShuffledException(ErrorCode.MAP_OUTPUT_STATE, "write after commit or abort");
        }
        if (partition < 0 || partition >= numPartitions) {
            throw new IllegalArgumentException("partition " + partition + " outside 0.." + (numPartitions - 1));
        }
        if (off < 0 || len < 0 || off > data.length - len) {
            throw new IndexOutOfBoundsException("off " + off + ", len " + len + ", array " + data.length);
        }
        raiseIfFailed();
        bytesWritten += len;
        while (len > 0) {
            if (fill[partition] == 0 && len >= segmentSize) {
                push(partition, data, off, segmentSize); // a whole segment: no copy
                off += segmentSize;
                len -= segmentSize;
                continue;
            }
            byte[] buf = buffers[partition];
            if (buf == null) {
                buf = takeBuffer(partition);
            }
            int n = Math.min(segmentSize - fill[partition], len);
            System.arraycopy(data, off, buf, fill[partition], n);
            fill[partition] += n;
            off += n;
            len -= n;
            if (fill[partition] == segmentSize) {
                fill[partition] = 0;
                push(partition, buf, 0, segmentSize);
            }
        }
    }

    /**
     * Pushes what is buffered for {@code partition} now instead of at commit; for callers that write
     * partitions one after another and are done with this one.
     */
    public void flush(int partition) throws IOException {
        if (partition < 0 || partition >= numPartitions) {
            throw new IllegalArgumentException("partition " + partition + " outside 0.." + (numPartitions - 1));
        }
        raiseIfFailed();
        if (finished || buffers[partition] == null) {
            return;
        }
        pushBuffered(partition);
        spare = buffers[partition];
        buffers[partition] = null;
        holding.remove(Integer.valueOf(partition));
    }

    /** Pushes what is buffered, commits, and returns the bytes stored per reduce partition (§12). */
    public long[] commit() throws IOException {
        if (finished) {
            throw new ShuffledException(ErrorCode.MAP_OUTPUT_STATE, "map output already committed or aborted");
        }
        raiseIfFailed();
        for (int p : holding) {
            pushBuffered(p);
        }
        finished = true;
        releaseBuffers();
        client.send(FrameEncoder.encode(new Frame.CommitMapOutput(stream, pushes)));
        awaitDone("CommitAck");
        lock.lock();
        try {
            return lengths.clone();
        } finally {
            lock.unlock();
        }
    }

    /**
     * Discards this attempt's output and waits for the daemon's AbortAck. Does nothing if the stream
     * already ended (committed, or failed: the daemon has discarded the output then).
     */
    public void abort() throws IOException {
        lock.lock();
        try {
            if (done || failure != null) {
                finished = true;
                releaseBuffers();
                return;
            }
        } finally {
            lock.unlock();
        }
        if (finished) {
            throw new ShuffledException(ErrorCode.MAP_OUTPUT_STATE, "map output already committed or aborted");
        }
        finished = true;
        releaseBuffers();
        client.send(FrameEncoder.encode(new Frame.AbortMapOutput(stream)));
        awaitDone("AbortAck");
    }

    /**
     * Aborts unless committed. If that cannot be confirmed (the commit's answer or the abort's did not
     * come, or the thread was interrupted), the abort is sent without waiting: the daemon must not keep
     * an open attempt on a connection the whole executor shares.
     */
    @Override
    public void close() {
        try {
            abort();
        } catch (IOException e) {
            abandon();
        }
    }

    /** Sends AbortMapOutput without waiting for its answer and stops listening to the stream. */
    void abandon() {
        lock.lock();
        try {
            if (done || failure != null) {
                return; // committed, or the daemon already ended the stream (and discarded the output)
            }
            finished = true;
        } finally {
            lock.unlock();
        }
        releaseBuffers();
        client.forget(stream);
        client.sendQuietly(new Frame.AbortMapOutput(stream));
    }

    // ------------------------------------------------------------------------------------------ internals

    private byte[] takeBuffer(int partition) throws IOException {
        byte[] buf;
        if (spare != null) {
            buf = spare;
            spare = null;
        } else if (holding.size() < maxBuffers) {
            buf = new byte[segmentSize];
        } else {
            // At the cap: reuse the buffer of the fullest other partition, pushing its bytes first.
            int victim = -1;
            for (int q : holding) {
                if (victim < 0 || fill[q] > fill[victim]) {
                    victim = q;
                }
            }
            buf = buffers[victim];
            pushBuffered(victim);
            buffers[victim] = null;
            holding.remove(Integer.valueOf(victim));
        }
        buffers[partition] = buf;
        holding.add(partition);
        return buf;
    }

    /** Pushes the partially filled buffer of {@code partition}, if it holds bytes. */
    private void pushBuffered(int partition) throws IOException {
        int n = fill[partition];
        if (n > 0) {
            fill[partition] = 0;
            push(partition, buffers[partition], 0, n);
        }
    }

    private void releaseBuffers() {
        spare = null;
        for (int q : holding) {
            buffers[q] = null;
            fill[q] = 0;
        }
        holding.clear();
    }

    /** Sends one PushData of {@code len} bytes after taking one credit (blocks for it). */
    private void push(int partition, byte[] data, int off, int len) throws IOException {
        long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(client.timeoutMillis());
        long seq;
        lock.lock();
        try {
            while (credit == 0 && failure == null) {
                long left = deadline - System.nanoTime();
                if (left <= 0) {
                    throw new SocketTimeoutException(
                            "no push credit from " + client.address() + " within " + client.timeoutMillis() + " ms");
                }
                changed.awaitNanos(left);
            }
            if (failure != null) {
                throw failure;
            }
            credit--;
            seq = nextSequence;
            nextSequence = (nextSequence + 1) & Wire.MAX_U32;
            pushes++;
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new InterruptedIOException("interrupted waiting for push credit");
        } finally {
            lock.unlock();
        }
        ByteBuffer prefix = ByteBuffer.allocate(FrameEncoder.PUSH_DATA_PREFIX);
        long crc = Wire.crc32c(ByteBuffer.wrap(data, off, len)); // once per buffer, checked by the daemon
        FrameEncoder.writePushDataPrefix(prefix, stream, seq, partition, len, crc);
        client.send(prefix.array(), data, off, len);
    }

    void awaitOpened() throws IOException {
        awaitCondition("PushCredit to open the push", true);
    }

    private void awaitDone(String what) throws IOException {
        awaitCondition(what, false);
    }

    private void awaitCondition(String what, boolean untilOpened) throws IOException {
        if (Thread.currentThread().isInterrupted()) {
            // A pending interrupt (a killed task) stops the caller even when the answer is already in.
            throw new InterruptedIOException("interrupted waiting for " + what);
        }
        long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(client.timeoutMillis());
        lock.lock();
        try {
            if (Thread.interrupted()) {
                // An interrupted task never waits, even when the answer is already here: otherwise
                // whether it fails would depend on how fast the daemon answered.
                throw new InterruptedException();
            }
            while (failure == null && !(untilOpened ? opened : done)) {
                long left = deadline - System.nanoTime();
                if (left <= 0) {
                    throw new SocketTimeoutException(
                            "no " + what + " from " + client.address() + " within " + client.timeoutMillis() + " ms");
                }
                changed.awaitNanos(left);
            }
            if (failure != null) {
                throw failure;
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new InterruptedIOException("interrupted waiting for " + what);
        } finally {
            lock.unlock();
        }
    }

    private void raiseIfFailed() throws ShuffledException {
        lock.lock();
        try {
            if (failure != null) {
                throw failure;
            }
        } finally {
            lock.unlock();
        }
    }

    ShuffleClient.StreamHandler handler() {
        return new ShuffleClient.StreamHandler() {
            @Override
            public void onFrame(Frame frame) throws ShuffledException {
                lock.lock();
                try {
                    if (frame instanceof Frame.PushCredit c) {
                        credit += c.credit();
                        opened = true;
                    } else if (frame instanceof Frame.CommitAck ack) {
                        client.forget(stream);
                        if (ack.count() != numPartitions) {
                            throw new ShuffledException(ErrorCode.INTERNAL, "CommitAck has " + ack.count()
                                    + " lengths for " + numPartitions + " partitions");
                        }
                        lengths = ack.lengths();
                        done = true;
                    } else if (frame instanceof Frame.AbortAck) {
                        client.forget(stream);
                        done = true;
                    } else {
                        throw new ProtocolException(frame.type() + " on a push stream");
                    }
                    changed.signalAll();
                } finally {
                    lock.unlock();
                }
            }

            @Override
            public void onError(ShuffledException error) {
                lock.lock();
                try {
                    if (failure == null && !done) {
                        failure = error;
                    }
                    changed.signalAll();
                } finally {
                    lock.unlock();
                }
            }
        };
    }
}
