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
import java.util.ArrayDeque;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.Condition;
import java.util.concurrent.locks.ReentrantLock;
import java.util.zip.CRC32C;

/**
 * One map attempt's output on a push stream (PROTOCOL.md §12). Not thread-safe: one task thread uses it.
 *
 * <p>{@link #write} copies bytes for any partition into one bounded buffer (the client's writer buffer
 * bytes, see {@link PackingBuffer}). When it is full, and at commit, its bytes are ordered by partition
 * (a partition's writes keep their order) and pushed as packed groups filled to the daemon's segment
 * size, one {@code PushData} each, however many partitions a group holds. Writes that come in partition
 * order need no sort and are pushed as soon as a few segments of them are buffered; their groups are full
 * but the last and form one ascending sequence of partitions. Each
 * {@code PushData} takes one push credit; without credit the writer blocks until the daemon grants some
 * ({@code PushCredit}), at most the client's timeout ({@link SocketTimeoutException}).
 *
 * <p>{@link #commit()} pushes what is buffered, sends {@code CommitMapOutput} and returns the lengths of
 * {@code CommitAck}; {@link #abort()} discards the attempt. An {@code Error} on the stream fails every
 * later call with a {@link ShuffledException} carrying its code. {@link #close()} aborts unless committed.
 */
public final class MapOutputWriter implements AutoCloseable {
    /**
     * Groups one PushPlaced names at most. The groups a burst of pushes placed go in one frame, told when the
     * burst ends, before waiting for credit, or when this many are placed: the daemon takes them with one
     * frame's work, and the socket sees one write.
     */
    static final int PLACED_PER_FRAME = 64;

    private final ShuffleClient client;
    private final long stream;
    private final int numPartitions;

    private final ReentrantLock lock = new ReentrantLock();
    private final Condition changed = lock.newCondition();
    // written under lock (by the reader thread)
    private long credit;
    /** With shared memory (§6.3): the slots granted and not used, one per credit; the rest came as PushCredit. */
    private final ArrayDeque<Long> slots = new ArrayDeque<>();
    private boolean opened;
    /** Volatile so that each write checks it without taking the lock. */
    private volatile ShuffledException failure;
    private boolean done;
    private long[] lengths;

    // task thread only
    private final PackingBuffer buffer;
    private final byte[] prefix = new byte[FrameEncoder.PUSH_DATA_PREFIX];
    /** The connection's region of shared memory, null: PushData through the socket. */
    private final SharedRegion region;
    /** A PushPlaced being built: the groups placed and not yet told, up to {@link #PLACED_PER_FRAME}. */
    private final byte[] placed;
    private int placedGroups;
    private final CRC32C crc = new CRC32C();
    private long nextSequence;
    private long pushes;
    private long bytesWritten;
    private boolean finished;
    /** What stopped a push half way (a timeout, an interrupt): the buffer's state is lost, so no more writes. */
    private Exception pushFailed;

    MapOutputWriter(
            ShuffleClient client, long stream, long attempt, int numPartitions, int segmentSize, long bufferBytes) {
        this.client = client;
        this.stream = stream;
        this.numPartitions = numPartitions;
        this.region = client.region();
        this.placed = region == null ? null : new byte[Wire.HEADER_SIZE + PLACED_PER_FRAME * Wire.PUSH_PLACED_FIXED];
        this.buffer = new PackingBuffer(bufferBytes, segmentSize, attempt, this::push);
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

    /** Appends {@code len} bytes to reduce partition {@code partition}; may push (and block for push credit). */
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
        try {
            buffer.write(partition, data, off, len);
            if (placedGroups > 0) {
                tellPlaced();
            }
        } catch (IOException | RuntimeException e) {
            pushFailed = e;
            throw e;
        }
    }

    /** Pushes what is buffered, commits, and returns the bytes stored per reduce partition (§12). */
    public long[] commit() throws IOException {
        if (finished) {
            throw new ShuffledException(ErrorCode.MAP_OUTPUT_STATE, "map output already committed or aborted");
        }
        raiseIfFailed();
        try {
            buffer.finish();
            if (placedGroups > 0) {
                tellPlaced();
            }
        } catch (IOException | RuntimeException e) {
            pushFailed = e;
            throw e;
        }
        finished = true;
        buffer.release();
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
                buffer.release();
                return;
            }
        } finally {
            lock.unlock();
        }
        if (finished) {
            throw new ShuffledException(ErrorCode.MAP_OUTPUT_STATE, "map output already committed or aborted");
        }
        finished = true;
        buffer.release();
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
        buffer.release();
        client.forget(stream);
        client.sendQuietly(new Frame.AbortMapOutput(stream));
    }

    // ------------------------------------------------------------------------------------------ internals

    /**
     * Sends one packed group as one PushData after taking one push credit (blocks for it); with shared memory,
     * puts it in the credit's slot and adds it to the next PushPlaced (credit the daemon granted as PushCredit,
     * its tmpfs having no room for a slot, goes as PushData).
     */
    private void push(byte[] head, int headLength, byte[] data, int dataLength) throws IOException {
        long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(client.timeoutMillis());
        long seq;
        long slot = -1;
        if (placedGroups > 0 && !hasCredit()) {
            tellPlaced(); // the daemon frees credit only for groups it was told of
        }
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
            if (!slots.isEmpty()) {
                slot = slots.removeFirst();
            }
            seq = nextSequence;
            nextSequence = (nextSequence + 1) & Wire.MAX_U32;
            pushes++;
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new InterruptedIOException("interrupted waiting for push credit");
        } finally {
            lock.unlock();
        }
        crc.reset(); // once per group, checked by the daemon
        crc.update(head, 0, headLength);
        crc.update(data, 0, dataLength);
        if (slot >= 0) {
            region.put(slot, head, headLength, data, dataLength);
            FrameEncoder.putPlacedEntry(placed, placedGroups, seq, crc.getValue(), slot, headLength + dataLength);
            if (++placedGroups == PLACED_PER_FRAME) {
                tellPlaced();
            }
            return;
        }
        if (placedGroups > 0) {
            tellPlaced(); // the groups placed before this one go first: the daemon takes them in order
        }
        FrameEncoder.writePushDataPrefix(ByteBuffer.wrap(prefix), stream, seq, headLength + dataLength, crc.getValue());
        client.send(prefix, head, headLength, data, dataLength);
    }

    /** Sends the PushPlaced of the groups placed since the last one. */
    private void tellPlaced() throws IOException {
        int length = FrameEncoder.writePushPlacedHeader(placed, stream, placedGroups);
        placedGroups = 0;
        client.send(placed, length);
    }

    private boolean hasCredit() {
        lock.lock();
        try {
            return credit > 0;
        } finally {
            lock.unlock();
        }
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
        ShuffledException e = failure;
        if (e != null) {
            throw e;
        }
        if (pushFailed != null) {
            throw new ShuffledException(ErrorCode.MAP_OUTPUT_STATE,
                    "a push of this map output failed (" + pushFailed + "): it can only be aborted");
        }
    }

    ShuffleClient.StreamHandler handler() {
        return new ShuffleClient.StreamHandler() {
            @Override
            public void onFrame(Frame frame) throws ShuffledException {
                lock.lock();
                try {
                    if (frame instanceof Frame.PushCredit c) { // with shared memory: its tmpfs had no room
                        credit += c.credit();
                        opened = true;
                    } else if (frame instanceof Frame.PushSlots s && region != null) {
                        for (int i = 0; i < s.slots().size(); i++) {
                            slots.addLast(s.slots().get(i));
                        }
                        credit += s.slots().size();
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
