package io.shuffled.client;

import io.shuffled.client.wire.BufferKind;
import io.shuffled.client.wire.ErrorCode;
import io.shuffled.client.wire.Frame;
import io.shuffled.client.wire.FrameDecoder;
import io.shuffled.client.wire.FrameEncoder;
import io.shuffled.client.wire.PackedGroups;
import io.shuffled.client.wire.ProtocolException;
import io.shuffled.client.wire.Role;
import io.shuffled.client.wire.Wire;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * A daemon played in memory, for checks of what a real daemon never does (malformed or corrupt buffers) and
 * of how the client frames its pushes. It checks every PushData as PROTOCOL.md §7.10 says (sequence, CRC32C,
 * exactly one group of the stream's attempt) and answers CommitMapOutput with the lengths its directories
 * add up to. A read is answered with the payloads the check queued with {@link #serve}, as credit allows,
 * then END_OF_PARTITION.
 */
final class ScriptedDaemon extends QueueTransport {
    /** One BufferResponse to send: its payload and the CRC32C to put in the frame. */
    record Buffer(byte[] payload, long crc) {
        Buffer(byte[] payload) {
            this(payload, Wire.crc32c(ByteBuffer.wrap(payload)));
        }
    }

    /** One push stream: its attempt and partitions, and the groups pushed so far. */
    private record Push(long attempt, int partitions, List<byte[]> groups) {}

    private final int segmentSize;
    private final FrameDecoder decoder;
    private final Map<Long, Push> pushes = new HashMap<>();
    private final Map<Long, List<byte[]>> committed = new LinkedHashMap<>();
    private final ArrayDeque<Buffer> reads = new ArrayDeque<>();
    private final List<String> problems = new ArrayList<>();
    private long readStream;
    private long readCredit;
    private long readSequence;
    private long creditAdded;
    private int cancels;
    private int aborts;
    private boolean stingy;

    ScriptedDaemon(int segmentSize) {
        this.segmentSize = segmentSize;
        this.decoder = new FrameDecoder(FrameDecoder.HEAP, segmentSize);
    }

    /** Queues the buffers the next read gets. */
    synchronized void serve(List<Buffer> buffers) {
        reads.addAll(buffers);
    }

    /** The groups the attempt pushed, in push order (null: not committed). */
    synchronized List<byte[]> committed(long attempt) {
        return committed.get(attempt);
    }

    /** From now on a push stream gets its first two credits and no more (its writer runs out). */
    synchronized void withholdPushCredit() {
        stingy = true;
    }

    synchronized int aborts() {
        return aborts;
    }

    /** Credit the client granted with AddCredit so far, on any read. */
    synchronized long creditAdded() {
        return creditAdded;
    }

    synchronized int cancels() {
        return cancels;
    }

    /** Waits until {@code n} CancelPartitionRequests came in all (the client sends one from its reader thread). */
    synchronized boolean awaitCancels(int n, long timeoutMillis) throws InterruptedException {
        long deadline = System.currentTimeMillis() + timeoutMillis;
        for (long left = timeoutMillis; cancels < n && left > 0; left = deadline - System.currentTimeMillis()) {
            wait(left);
        }
        return cancels >= n;
    }

    /** What the daemon found wrong with the client's frames (a real daemon would answer with an Error). */
    synchronized List<String> problems() {
        return List.copyOf(problems);
    }

    @Override
    synchronized void received(byte[] b, int off, int len) throws IOException {
        decoder.feed(ByteBuffer.wrap(b, off, len), this::handle);
    }

    // ------------------------------------------------------------------------------------------ the daemon

    private void send(Frame frame) {
        reply(FrameEncoder.encode(frame));
    }

    private void handle(Frame frame) {
        if (frame instanceof Frame.Hello) {
            send(new Frame.HelloAck(Role.DAEMON, Map.of("node", "scripted:1", "segment_size", (long) segmentSize)));
        } else if (frame instanceof Frame.OpenMapOutput o) {
            pushes.put(o.writer(), new Push(o.attempt(), (int) o.partitions(), new ArrayList<>()));
            send(new Frame.PushCredit(o.writer(), 2));
        } else if (frame instanceof Frame.PushData d) {
            pushed(d);
        } else if (frame instanceof Frame.CommitMapOutput c) {
            commit(c);
        } else if (frame instanceof Frame.AbortMapOutput a) {
            pushes.remove(a.writer());
            aborts++;
            send(new Frame.AbortAck(a.writer()));
        } else if (frame instanceof Frame.PartitionRequest r) {
            readStream = r.receiver();
            readCredit = r.credit();
            readSequence = 0;
            sendReads();
        } else if (frame instanceof Frame.AddCredit a) {
            creditAdded += a.credit();
            if (a.receiver() == readStream) {
                readCredit += a.credit();
                sendReads();
            }
        } else if (frame instanceof Frame.CancelPartitionRequest c) {
            cancels++;
            notifyAll();
            if (c.receiver() == readStream) {
                readStream = 0;
                reads.clear();
            }
        } else {
            problems.add("unexpected " + frame);
        }
    }

    private void pushed(Frame.PushData d) {
        Push push = pushes.get(d.writer());
        ByteBuffer payload = d.payload();
        try {
            if (d.sequence() != push.groups().size()) {
                throw new ProtocolException("sequence " + d.sequence() + " after " + push.groups().size() + " pushes");
            }
            if (Wire.crc32c(payload) != d.crc()) {
                throw new ProtocolException(ErrorCode.CORRUPT_DATA, "CRC32C mismatch");
            }
            int runs = PackedGroups.check(payload, 0, push.partitions(), a -> a == push.attempt());
            if (PackedGroups.size(runs, dataBytes(payload)) != payload.remaining()) {
                throw new ProtocolException("more than one group"); // each group has a header
            }
        } catch (ProtocolException e) {
            problems.add("PushData " + d.sequence() + ": " + e.getMessage());
        }
        byte[] group = new byte[payload.remaining()];
        payload.duplicate().get(group);
        push.groups().add(group);
        if (!stingy) {
            send(new Frame.PushCredit(d.writer(), 1));
        }
    }

    private static long dataBytes(ByteBuffer payload) {
        PackedGroups.Cursor cursor = new PackedGroups.Cursor(payload);
        long n = 0;
        while (cursor.next()) {
            n += cursor.data().remaining();
        }
        return n;
    }

    private void commit(Frame.CommitMapOutput c) {
        Push push = pushes.remove(c.writer());
        if (c.pushes() != push.groups().size()) {
            problems.add("CommitMapOutput says " + c.pushes() + " pushes, " + push.groups().size() + " came");
        }
        long[] lengths = new long[push.partitions()];
        for (byte[] g : push.groups()) {
            PackedGroups.Cursor cursor = new PackedGroups.Cursor(ByteBuffer.wrap(g));
            while (cursor.next()) {
                lengths[cursor.partition()] += cursor.data().remaining();
            }
        }
        committed.put(push.attempt(), push.groups());
        send(new Frame.CommitAck(c.writer(), lengths));
    }

    private void sendReads() {
        while (readStream != 0 && readCredit > 0 && !reads.isEmpty()) {
            Buffer b = reads.poll();
            readCredit--;
            send(new Frame.BufferResponse(readStream, readSequence++, reads.size(), BufferKind.DATA,
                    b.payload().length, ByteBuffer.wrap(b.payload()), b.crc()));
        }
        if (readStream != 0 && reads.isEmpty()) {
            send(Frame.BufferResponse.endOfPartition(readStream, readSequence++));
            readStream = 0;
        }
    }
}
