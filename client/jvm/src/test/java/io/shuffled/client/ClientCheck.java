package io.shuffled.client;

import io.shuffled.client.wire.ErrorCode;
import io.shuffled.client.wire.ShuffledException;
import java.io.ByteArrayOutputStream;
import java.io.InterruptedIOException;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.Map;

/**
 * Checks the blocking client against a running daemon. Prints one line per check, then
 * {@code N passed, M failed}; exits non-zero on any failure.
 *
 * <pre>
 * ClientCheck HOST:PORT                          the full check (push, read back, errors, cleanup)
 * ClientCheck HOST:PORT push APP SHUFFLE A...    push attempts A... with the test pattern and commit
 * ClientCheck HOST:PORT push-fsync APP SHUFFLE A...  the same, each asking for its commit to follow an fsync
 * ClientCheck HOST:PORT verify APP SHUFFLE A...  read every partition back and compare with the pattern
 * ClientCheck HOST:PORT auth SECRET               against a daemon with that secret: handshake, app tokens
 * ClientCheck HOST:PORT corrupt APP SHUFFLE A     a read whose data fails its CRC32C ends with CORRUPT_DATA
 * </pre>
 *
 * <p>The pattern is the one of {@code tests/cluster.py payload()}; sizes come from {@link #size}, so the
 * Python tests can push or verify the same data.
 */
public final class ClientCheck {
    static final int PARTITIONS = 4;

    private int passed;
    private int failed;

    /** Bytes attempt number {@code index} (0, 1, 2, ...) writes to {@code partition}. */
    public static int size(int index, int partition) {
        return switch (partition) {
            case 0 -> 0;
            case 1 -> 100 + index;
            case 2 -> 40_000 + 1000 * index;
            default -> (3 << 20) + 17 * index;
        };
    }

    /** Same bytes as tests/cluster.py payload(attempt, partition, size). */
    public static byte[] pattern(long attempt, int partition, int size) {
        byte[] seed = (Long.toUnsignedString(attempt) + ":" + partition + ":").getBytes(StandardCharsets.US_ASCII);
        byte[] out = new byte[size];
        for (int i = 0; i < size; i++) {
            out[i] = seed[(i % 64) % seed.length];
        }
        return out;
    }

    public static void main(String[] args) throws Exception {
        if (args.length < 1) {
            System.err.println("usage: ClientCheck HOST:PORT [push|push-fsync|verify APP SHUFFLE ATTEMPT...]");
            System.exit(2);
        }
        ClientCheck c = new ClientCheck();
        if (args.length == 3 && args[1].equals("auth")) {
            try {
                c.authCheck(args[0], args[2]);
            } catch (Exception e) {
                c.fail("unexpected " + e);
                e.printStackTrace();
            }
            System.out.println(c.passed + " passed, " + c.failed + " failed");
            System.exit(c.failed == 0 ? 0 : 1);
        }
        try (ShuffleClient client = ShuffleClient.connect(args[0])) {
            String mode = args.length > 1 ? args[1] : "check";
            if (mode.equals("check")) {
                c.fullCheck(client);
            } else {
                String app = args[2];
                long shuffle = Long.parseLong(args[3]);
                long[] attempts = Arrays.stream(args, 4, args.length).mapToLong(Long::parseUnsignedLong).toArray();
                if (mode.equals("push")) {
                    c.push(client, app, shuffle, attempts, null);
                } else if (mode.equals("push-fsync")) {
                    c.push(client, app, shuffle, attempts, "commit");
                } else if (mode.equals("verify")) {
                    c.verify(client, app, shuffle, attempts);
                } else if (mode.equals("corrupt")) {
                    c.expectError(ErrorCode.CORRUPT_DATA, "a buffer that fails its CRC32C ends the read", () -> {
                        try (PartitionReader r = client.read(app, shuffle, 0, PARTITIONS, Map.of("", attempts))) {
                            while (r.next() != null) {
                                // drain until the error
                            }
                        }
                    });
                } else {
                    throw new IllegalArgumentException("unknown mode " + mode);
                }
            }
        } catch (Exception e) {
            c.fail("unexpected " + e);
            e.printStackTrace();
        }
        System.out.println(c.passed + " passed, " + c.failed + " failed");
        System.exit(c.failed == 0 ? 0 : 1);
    }

    // ------------------------------------------------------------------------------------------ harness

    private void ok(String name) {
        passed++;
        System.out.println("ok   " + name);
    }

    private void fail(String name) {
        failed++;
        System.out.println("FAIL " + name);
    }

    private void check(boolean cond, String name) {
        if (cond) {
            ok(name);
        } else {
            fail(name);
        }
    }

    private interface Body {
        void run() throws Exception;
    }

    /** Runs {@code body} and expects a ShuffledException with {@code code}. */
    private void expectError(ErrorCode code, String name, Body body) {
        try {
            body.run();
            fail(name + ": no error");
        } catch (ShuffledException e) {
            check(e.code() == code, name + " (got " + e.code() + ": " + e.getMessage() + ")");
        } catch (Exception e) {
            fail(name + ": " + e);
        }
    }

    // ------------------------------------------------------------------------------------------ modes

    /** Against a daemon started with {@code secret} in its secret-file (PROTOCOL.md §6.1, §6.2). */
    private void authCheck(String address, String secret) throws Exception {
        long timeout = 20_000;
        long buffer = ShuffleClient.DEFAULT_WRITER_BUFFER_BYTES;
        String app = "java-auth-" + ProcessHandle.current().pid();
        long[] attempts = {7, 8};
        expectError(ErrorCode.AUTH_FAILED, "a wrong secret is refused at connect",
                () -> ShuffleClient.connect(address, "wrong", timeout, buffer, secret + "x", null).close());
        expectError(ErrorCode.AUTH_FAILED, "no secret is refused at connect",
                () -> ShuffleClient.connect(address, "none", timeout, buffer, null, null).close());
        try (ShuffleClient owner = ShuffleClient.connect(address, "owner", timeout, buffer, secret + "\n", "app-a");
                ShuffleClient other = ShuffleClient.connect(address, "other", timeout, buffer, secret, "app-b")) {
            push(owner, app, 1, attempts, null); // the data carries CRC32Cs the daemon checks
            verify(owner, app, 1, attempts); // and the reader checks them on arrival
            expectError(ErrorCode.AUTH_FAILED, "another application secret cannot read", () -> {
                try (PartitionReader r = other.read(app, 1, 0, PARTITIONS, Map.of("", attempts))) {
                    r.next();
                }
            });
            expectError(ErrorCode.AUTH_FAILED, "another application secret cannot remove the application",
                    () -> other.removeApplication(app, false));
            check(other.isOpen(), "a refused request leaves the connection open");
            verify(owner, app, 1, attempts);
            check(owner.removeApplication(app, false).get("freed_segments") instanceof Long,
                    "the owner removes its application");
        }
    }

    private void fullCheck(ShuffleClient client) throws Exception {
        String app = "java-check-" + ProcessHandle.current().pid();
        long shuffle = 3;
        long[] attempts = {1000, 1001, (1L << 40) + 5};
        check(client.segmentSize() >= 4096 && client.segmentSize() % 4096 == 0,
                "handshake: segment_size " + client.segmentSize());

        push(client, app, shuffle, attempts, null);
        verify(client, app, shuffle, attempts);

        // all partitions in one stream: chunks arrive tagged with partition and attempt
        Map<String, long[]> locations = Map.of("", attempts);
        Map<String, ByteArrayOutputStream> got = new HashMap<>();
        try (PartitionReader r = client.read(app, shuffle, 0, PARTITIONS, locations)) {
            for (PartitionReader.Chunk ch = r.next(); ch != null; ch = r.next()) {
                ByteBuffer d = ch.data();
                got.computeIfAbsent(ch.attemptId() + "/" + ch.partition(), k -> new ByteArrayOutputStream())
                        .write(d.array(), d.arrayOffset() + d.position(), d.remaining());
            }
        }
        boolean allSame = true;
        for (int i = 0; i < attempts.length; i++) {
            for (int p = 0; p < PARTITIONS; p++) {
                ByteArrayOutputStream b = got.get(attempts[i] + "/" + p);
                byte[] bytes = b == null ? new byte[0] : b.toByteArray();
                allSame &= Arrays.equals(bytes, pattern(attempts[i], p, size(i, p)));
            }
        }
        check(allSame, "one stream over partitions [0, " + PARTITIONS + "): every (attempt, partition) byte-exact");

        // the window: a reader given 3 floating buffers never holds credit for more than 2 + 3, however long
        // the backlog (partition 3 is about 290 segments); one given the default grows past that
        for (int floating : new int[] {3, PartitionReader.FLOATING}) {
            try (PartitionReader r = client.read(app, shuffle, 3, 4, locations, floating)) {
                long bytes = 0;
                for (PartitionReader.Chunk ch = r.next(); ch != null; ch = r.next()) {
                    bytes += ch.data().remaining();
                }
                long want = 0;
                for (int i = 0; i < attempts.length; i++) {
                    want += size(i, 3);
                }
                int peak = r.peakWindow();
                check(bytes == want && (floating == 3 ? peak <= 5 : peak > 5),
                        "floating " + floating + ": " + bytes + " of " + want + " bytes, window at most " + peak);
            }
        }

        // empty range and empty locations: just END_OF_PARTITION
        try (PartitionReader r = client.read(app, shuffle, 1, 1, locations)) {
            check(r.next() == null, "empty range ends at once");
        }

        // a reader closed early cancels its stream; the connection stays usable
        PartitionReader early = client.read(app, shuffle, 3, 4, locations);
        check(early.next() != null, "early close: first chunk");
        early.close();
        check(early.next() == null, "early close: next() after close is null");

        // a named attempt that is open but not committed, and one never pushed
        MapOutputWriter open = client.openWriter(app, shuffle, 9, 999, PARTITIONS);
        open.write(1, pattern(999, 1, 5000));
        long[] withOpen = {attempts[0], 999};
        expectError(ErrorCode.PARTITION_NOT_FOUND, "read naming an uncommitted attempt: PARTITION_NOT_FOUND",
                () -> client.read(app, shuffle, 0, PARTITIONS, Map.of("", withOpen)).next());
        open.abort();
        ok("abort of an open attempt");
        expectError(ErrorCode.PARTITION_NOT_FOUND, "read naming an aborted attempt: PARTITION_NOT_FOUND",
                () -> client.read(app, shuffle, 0, PARTITIONS, Map.of("", withOpen)).readAll());
        expectError(ErrorCode.PARTITION_NOT_FOUND, "read of an unknown shuffle: PARTITION_NOT_FOUND",
                () -> client.read(app, 77, 0, 1, Map.of("", new long[] {1})).next());
        try {
            client.read(app, shuffle, 0, 1, Map.of("", new long[] {424242})).next();
            fail("PartitionNotFound is a fetch failure: no error");
        } catch (ShuffledException e) {
            check(e.code().code() == 5 && e.fetchFailure(), "PartitionNotFound has wire code 5, a fetch failure");
        }
        expectError(ErrorCode.INVALID_REQUEST, "read beyond the partition count: INVALID_REQUEST",
                () -> client.read(app, shuffle, 0, PARTITIONS + 1, locations).next());

        // a committed attempt cannot be opened again: the stream error carries its code
        expectError(ErrorCode.MAP_OUTPUT_STATE, "reopening a committed attempt: MAP_OUTPUT_STATE",
                () -> client.openWriter(app, shuffle, 0, attempts[0], PARTITIONS).commit());
        expectError(ErrorCode.INVALID_REQUEST, "partitions mismatch: INVALID_REQUEST",
                () -> client.openWriter(app, shuffle, 5, 5555, PARTITIONS + 1).commit());

        // writer close() without commit aborts
        try (MapOutputWriter w = client.openWriter(app, shuffle, 6, 6666, PARTITIONS)) {
            w.write(2, new byte[100]);
        }
        expectError(ErrorCode.PARTITION_NOT_FOUND, "closed (aborted) writer's attempt is not readable",
                () -> client.read(app, shuffle, 2, 3, Map.of("", new long[] {6666})).next());

        // a task interrupted while it waits for its first push credit: the attempt must not stay open
        Thread.currentThread().interrupt();
        try {
            client.openWriter(app, shuffle, 7, 7777, PARTITIONS);
            fail("interrupted openWriter: no error");
        } catch (InterruptedIOException e) {
            ok("interrupted openWriter throws InterruptedIOException");
        } finally {
            Thread.interrupted();
        }
        check(waitNoOpenOutputs(client), "interrupted openWriter leaves no open map output in the daemon");

        Map<String, Object> before = client.stats();
        check(longAt(before, "store", "stored_segments") > 0, "stats: data stored before unregister");
        Map<String, Object> freed = client.unregisterShuffle(app, shuffle);
        check(freed.get("freed_segments") instanceof Long n && n > 0, "unregister_shuffle frees segments " + freed);
        check(longAt(waitPoolIdle(client), "pool", "used") == 0, "stats: pool used == 0 after unregister");
        expectError(ErrorCode.PARTITION_NOT_FOUND, "unregistered shuffle is gone",
                () -> client.read(app, shuffle, 0, 1, locations).next());
        Map<String, Object> removed = client.removeApplication(app);
        check(removed.containsKey("freed_segments"), "remove_application answers " + removed);
        expectError(ErrorCode.INVALID_REQUEST, "unknown admin op: INVALID_REQUEST",
                () -> client.admin("no_such_op", Map.of()));
    }

    /** Polls stats until no read or push holds pool memory (the daemon frees asynchronously). */
    private static Map<String, Object> waitPoolIdle(ShuffleClient client) throws Exception {
        long deadline = System.nanoTime() + 20_000_000_000L;
        Map<String, Object> s = client.stats();
        while (longAt(s, "pool", "used") != 0 && System.nanoTime() < deadline) {
            Thread.sleep(20);
            s = client.stats();
        }
        return s;
    }

    /** Polls stats until the daemon holds no open map output and no push stream. */
    private static boolean waitNoOpenOutputs(ShuffleClient client) throws Exception {
        long deadline = System.nanoTime() + 20_000_000_000L;
        Map<String, Object> s = client.stats();
        while (longAt(s, "store", "open_map_outputs") + longAt(s, "streams", "pushing") != 0) {
            if (System.nanoTime() > deadline) {
                return false;
            }
            Thread.sleep(20);
            s = client.stats();
        }
        return true;
    }

    @SuppressWarnings("unchecked")
    private static long longAt(Map<String, Object> stats, String section, String key) {
        Object v = ((Map<String, Object>) stats.get(section)).get(key);
        return v instanceof Long n ? n : -1;
    }

    /** Pushes every attempt with the pattern, in interleaved pieces of varied size, and checks the lengths. */
    private void push(ShuffleClient client, String app, long shuffle, long[] attempts, String fsync)
            throws Exception {
        for (int i = 0; i < attempts.length; i++) {
            try (MapOutputWriter w = client.openWriter(app, shuffle, i, attempts[i], PARTITIONS, 0, null, fsync)) {
                byte[][] data = new byte[PARTITIONS][];
                int[] pos = new int[PARTITIONS];
                for (int p = 0; p < PARTITIONS; p++) {
                    data[p] = pattern(attempts[i], p, size(i, p));
                }
                int piece = 1;
                boolean more = true;
                while (more) {
                    more = false;
                    for (int p = 0; p < PARTITIONS; p++) {
                        int n = Math.min(piece, data[p].length - pos[p]);
                        if (n > 0) {
                            w.write(p, data[p], pos[p], n);
                            pos[p] += n;
                        }
                        more |= pos[p] < data[p].length;
                    }
                    piece = piece * 3 + 7; // 1, 10, 37, ... up to whole segments and beyond
                }
                w.write(0, new byte[0], 0, 0);
                long[] lengths = w.commit();
                long[] want = new long[PARTITIONS];
                for (int p = 0; p < PARTITIONS; p++) {
                    want[p] = size(i, p);
                }
                check(Arrays.equals(lengths, want),
                        "commit attempt " + Long.toUnsignedString(attempts[i]) + ": lengths " + Arrays.toString(lengths));
            }
        }
    }

    /** Reads each partition back with locations {"": attempts} and compares per (attempt, partition). */
    private void verify(ShuffleClient client, String app, long shuffle, long[] attempts) throws Exception {
        Map<Long, Integer> index = new LinkedHashMap<>();
        for (int i = 0; i < attempts.length; i++) {
            index.put(attempts[i], i);
        }
        for (int p = 0; p < PARTITIONS; p++) {
            Map<Long, ByteArrayOutputStream> got = new HashMap<>();
            boolean rightPartition = true;
            boolean knownAttempt = true;
            int chunks = 0;
            try (PartitionReader r = client.read(app, shuffle, p, p + 1, Map.of("", attempts))) {
                for (PartitionReader.Chunk ch = r.next(); ch != null; ch = r.next()) {
                    chunks++;
                    rightPartition &= ch.partition() == p;
                    knownAttempt &= index.containsKey(ch.attemptId());
                    ByteBuffer d = ch.data();
                    got.computeIfAbsent(ch.attemptId(), k -> new ByteArrayOutputStream())
                            .write(d.array(), d.arrayOffset() + d.position(), d.remaining());
                }
            }
            check(rightPartition && knownAttempt, "read partition " + p + ": " + chunks + " chunks, tags right");
            for (int i = 0; i < attempts.length; i++) {
                ByteArrayOutputStream b = got.get(attempts[i]);
                byte[] bytes = b == null ? new byte[0] : b.toByteArray();
                byte[] want = pattern(attempts[i], p, size(i, p));
                check(Arrays.equals(bytes, want), "partition " + p + " attempt " + Long.toUnsignedString(attempts[i])
                        + ": " + bytes.length + " bytes byte-exact (want " + want.length + ")");
            }
        }
    }
}
