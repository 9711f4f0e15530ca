package io.shuffled.client;

import static io.shuffled.client.Checks.require;

import io.shuffled.client.wire.Auth;
import io.shuffled.client.wire.ErrorCode;
import io.shuffled.client.wire.PackedGroups;
import io.shuffled.client.wire.ShuffledException;
import java.io.ByteArrayOutputStream;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.IdentityHashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;

/**
 * The client's push and read streams against a {@link ScriptedDaemon}: each PushData is one well-formed
 * group (checked as a daemon checks it), the commit counts them and its lengths are the directories'; a
 * read yields one chunk per run, each a slice of its buffer, and a buffer becomes credit only once the
 * caller moved past its last run; a buffer with a malformed group or a wrong CRC32C fails the read (PROTOCOL,
 * CORRUPT_DATA) and cancels it, and the connection serves on; a writer whose push timed out (its buffer
 * half pushed) refuses to go on and can only be aborted. Prints one line per check, then
 * {@code N passed, M failed}; exits non-zero on any failure.
 */
public final class StreamsCheck {
    private static final int SEGMENT = 4096;
    private static final int PARTITIONS = 300;
    private static final long ATTEMPT = 77;
    private static final long TIMEOUT_MILLIS = 10_000;

    public static void main(String[] args) throws Exception {
        Checks c = new Checks();
        ScriptedDaemon daemon = new ScriptedDaemon(SEGMENT);
        // A writer buffer of 1500 bytes: groups small enough that a read buffer holds several.
        try (ShuffleClient client = ShuffleClient.handshake(
                daemon, "scripted", "check", TIMEOUT_MILLIS, 1500, null, null, Auth.newNonce())) {
            byte[][] written = new byte[PARTITIONS][];
            c.check("a writer pushes one well-formed group per PushData and commits their count",
                    () -> push(client, daemon, written));
            c.check("a read yields one chunk per run, slices of its buffers, byte-exact per partition",
                    () -> readBack(client, daemon, written));
            c.check("a buffer becomes credit when next() moves past its last run", () -> credit(client, daemon));
            c.check("a malformed buffer fails the read with PROTOCOL and cancels it; the connection serves on",
                    () -> malformed(client, daemon));
            c.check("a buffer failing its CRC32C fails the read with CORRUPT_DATA", () -> corrupt(client, daemon));
        }
        c.check("a writer whose push timed out takes no more writes; close() aborts it", StreamsCheck::stalled);
        c.exit();
    }

    // ------------------------------------------------------------------------------------------ checks

    private static void push(ShuffleClient client, ScriptedDaemon daemon, byte[][] written) throws Exception {
        Random random = new Random(27);
        ByteArrayOutputStream[] out = new ByteArrayOutputStream[PARTITIONS];
        long[] lengths;
        long pushes;
        try (MapOutputWriter w = client.openWriter("app", 1, 0, ATTEMPT, PARTITIONS)) {
            for (int i = 0; i < 3000; i++) {
                int p = random.nextInt(PARTITIONS);
                byte[] b = new byte[random.nextInt(i % 100 == 0 ? 20_000 : 200)];
                random.nextBytes(b);
                w.write(p, b);
                if (out[p] == null) {
                    out[p] = new ByteArrayOutputStream();
                }
                out[p].writeBytes(b);
            }
            lengths = w.commit();
            pushes = w.pushes();
        }
        require(daemon.problems().isEmpty(), "the daemon found " + daemon.problems());
        List<byte[]> groups = daemon.committed(ATTEMPT);
        require(groups != null && groups.size() == pushes && pushes > 20, pushes + " pushes");
        for (int p = 0; p < PARTITIONS; p++) {
            written[p] = out[p] == null ? new byte[0] : out[p].toByteArray();
            require(lengths[p] == written[p].length, "CommitAck: partition " + p + " has " + lengths[p] + " bytes");
        }
    }

    /** The committed groups, several to a buffer as a daemon combines them, each buffer within a segment. */
    private static List<ScriptedDaemon.Buffer> buffers(List<byte[]> groups) {
        List<ScriptedDaemon.Buffer> out = new ArrayList<>();
        ByteArrayOutputStream pending = new ByteArrayOutputStream();
        for (byte[] g : groups) {
            if (pending.size() + g.length > SEGMENT) {
                out.add(new ScriptedDaemon.Buffer(pending.toByteArray()));
                pending.reset();
            }
            pending.writeBytes(g);
        }
        out.add(new ScriptedDaemon.Buffer(pending.toByteArray()));
        return out;
    }

    private static void readBack(ShuffleClient client, ScriptedDaemon daemon, byte[][] written) throws Exception {
        List<byte[]> groups = daemon.committed(ATTEMPT);
        List<ScriptedDaemon.Buffer> buffers = buffers(groups);
        require(buffers.size() < groups.size(), "no buffer holds two groups");
        long runs = 0;
        for (byte[] g : groups) {
            runs += PackedGroups.check(ByteBuffer.wrap(g), 0, PARTITIONS, a -> a == ATTEMPT);
        }
        daemon.serve(buffers);
        ByteArrayOutputStream[] got = new ByteArrayOutputStream[PARTITIONS];
        Map<byte[], Boolean> arrays = new IdentityHashMap<>();
        long chunks = 0;
        try (PartitionReader r = client.read("app", 1, 0, PARTITIONS, Map.of("", new long[] {ATTEMPT}))) {
            for (PartitionReader.Chunk c = r.next(); c != null; c = r.next()) {
                chunks++;
                ByteBuffer d = c.data();
                require(c.attemptId() == ATTEMPT && d.position() == 0, "chunk " + c);
                arrays.put(d.array(), true);
                if (got[c.partition()] == null) {
                    got[c.partition()] = new ByteArrayOutputStream();
                }
                got[c.partition()].write(d.array(), d.arrayOffset(), d.remaining());
            }
        }
        require(chunks == runs, chunks + " chunks for " + runs + " runs");
        require(arrays.size() == buffers.size(), "the chunks lie in " + arrays.size() + " arrays, "
                + buffers.size() + " buffers came: a run was copied");
        for (int p = 0; p < PARTITIONS; p++) {
            byte[] bytes = got[p] == null ? new byte[0] : got[p].toByteArray();
            require(Arrays.equals(bytes, written[p]), "partition " + p + ": " + bytes.length + " bytes read, "
                    + written[p].length + " written");
        }
    }

    /** A group of attempt 77 with one byte for each of {@code partitions}. */
    private static byte[] group(int... partitions) {
        ByteBuffer b = ByteBuffer.allocate(12 + 9 * partitions.length).putLong(ATTEMPT).putInt(partitions.length);
        for (int p : partitions) {
            b.putInt(p).putInt(1);
        }
        for (int p : partitions) {
            b.put((byte) p);
        }
        return b.array();
    }

    private static void credit(ShuffleClient client, ScriptedDaemon daemon) throws Exception {
        int buffers = 5;
        List<ScriptedDaemon.Buffer> served = new ArrayList<>();
        for (int i = 0; i < buffers; i++) {
            served.add(new ScriptedDaemon.Buffer(group(3 * i, 3 * i + 1, 3 * i + 2)));
        }
        daemon.serve(served);
        long before = daemon.creditAdded();
        try (PartitionReader r = client.read("app", 1, 0, PARTITIONS, Map.of("", new long[] {ATTEMPT}), 0)) {
            for (int run = 0; run < 3 * buffers; run++) {
                PartitionReader.Chunk c = r.next();
                require(c != null && c.partition() == run, "run " + run + ": " + c);
                // Two buffers come on the initial credit, each further one on the credit of a consumed one.
                // (Once the last one was sent, END_OF_PARTITION follows it and no credit is due any more.)
                long added = daemon.creditAdded() - before;
                require(run >= 3 * (buffers - 2) || added == run / 3,
                        "at run " + run + " the client granted " + added + " credit");
            }
            require(r.next() == null, "more runs than were sent");
        }
    }

    private static void failedRead(ShuffleClient client, ScriptedDaemon daemon, List<ScriptedDaemon.Buffer> buffers,
            ErrorCode code, int goodRuns) throws Exception {
        daemon.serve(buffers);
        int cancels = daemon.cancels();
        int runs = 0;
        try (PartitionReader r = client.read("app", 1, 1, 10, Map.of("", new long[] {ATTEMPT}))) {
            while (r.next() != null) {
                runs++;
            }
            throw new AssertionError("the read ended without an error after " + runs + " runs");
        } catch (ShuffledException e) {
            require(e.code() == code, "failed with " + e.code() + ": " + e.getMessage());
        }
        require(runs == goodRuns, runs + " runs before the error, expected " + goodRuns);
        require(daemon.awaitCancels(cancels + 1, TIMEOUT_MILLIS), "the read was not cancelled");
        require(client.isOpen(), "the connection broke");
    }

    private static void malformed(ShuffleClient client, ScriptedDaemon daemon) throws Exception {
        byte[] good = group(1, 2);
        byte[] outside = group(3, 10); // the read is for [1, 10)
        byte[] other = group(4);
        other[7] = 78; // attempt 78, which the read does not name
        byte[] cut = Arrays.copyOf(group(5, 6), 12 + 16 + 1);
        for (byte[] bad : new byte[][] {outside, other, cut}) {
            failedRead(client, daemon, List.of(new ScriptedDaemon.Buffer(good), new ScriptedDaemon.Buffer(bad)),
                    ErrorCode.PROTOCOL, 2);
        }
        daemon.serve(List.of(new ScriptedDaemon.Buffer(good)));
        try (PartitionReader r = client.read("app", 1, 1, 10, Map.of("", new long[] {ATTEMPT}))) {
            require(r.readAll().length == 2, "a good read after the failed ones");
        }
    }

    private static void corrupt(ShuffleClient client, ScriptedDaemon daemon) throws Exception {
        byte[] good = group(1, 2);
        long wrong = new ScriptedDaemon.Buffer(good).crc() ^ 1;
        failedRead(client, daemon, List.of(new ScriptedDaemon.Buffer(good, wrong)), ErrorCode.CORRUPT_DATA, 0);
    }

    private static void stalled() throws Exception {
        ScriptedDaemon stingy = new ScriptedDaemon(SEGMENT);
        stingy.withholdPushCredit();
        long timeout = 300; // how long the writer waits for credit that never comes
        try (ShuffleClient client =
                ShuffleClient.handshake(stingy, "stingy", "check", timeout, 1 << 20, null, null, Auth.newNonce())) {
            MapOutputWriter w = client.openWriter("app", 2, 0, ATTEMPT, PARTITIONS);
            byte[] bytes = new byte[SEGMENT];
            try {
                for (int p = 0; p < PARTITIONS; p++) { // in order: full groups leave as they fill
                    w.write(p, bytes);
                }
                throw new AssertionError("wrote " + PARTITIONS + " segments on two credits");
            } catch (java.net.SocketTimeoutException expected) {
                // the third push found no credit
            }
            try {
                w.write(0, bytes);
                throw new AssertionError("a write after the failed push was taken");
            } catch (ShuffledException e) {
                require(e.code() == ErrorCode.MAP_OUTPUT_STATE, "failed with " + e.code());
            }
            w.close();
            require(stingy.aborts() == 1, "close() did not abort the attempt");
        }
    }
}
