package io.shuffled.client;

import static io.shuffled.client.Checks.require;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import io.shuffled.client.wire.ErrorCode;
import io.shuffled.client.wire.PackedGroups;
import io.shuffled.client.wire.ProtocolException;
import io.shuffled.client.wire.Wire;
import java.io.ByteArrayOutputStream;
import java.io.File;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HexFormat;
import java.util.List;
import java.util.Random;
import java.util.function.LongPredicate;

/**
 * Checks of the writer's packing ({@link PackingBuffer}) and the reader's unpacking
 * ({@link PackedGroups}), without a daemon: whatever the writes, partitions, buffer size and segment size,
 * the groups read back to exactly the bytes written per partition; groups are full; writes in partition
 * order are pushed early, as one ascending sequence of full groups; every malformed payload is refused with
 * PROTOCOL.
 *
 * <p>Usage: {@code PackingCheck [proto/vectors/frames.json]}. With the golden vectors, also their
 * {@code packed} entries (PROTOCOL.md §15): the writer packs each valid push payload's runs into exactly
 * its bytes; each valid read payload passes the reader's check against its context and yields its runs
 * and pairs; each payload a reader must refuse is refused with its code. (Payloads only a daemon refuses,
 * and compressed runs, are not a client's to check: this client never compresses.)
 *
 * <p>Prints one line per check, then {@code N passed, M failed}; exits non-zero on any failure.
 */
public final class PackingCheck {
    private static final HexFormat HEX = HexFormat.of();
    private static final long ATTEMPT = (1L << 63) + 11; // a u64 above Long.MAX_VALUE

    public static void main(String[] args) throws IOException {
        Checks c = new Checks();
        c.check("a group is its attempt, run count, directory and data, big-endian", PackingCheck::format);
        c.check("random writes read back byte-exact for every buffer size, segment size and width",
                PackingCheck::roundTrips);
        c.check("groups fill the segment: only the last and those ending a sequence have room for another run",
                PackingCheck::groupsAreFull);
        c.check("writes in partition order leave early, as one ascending sequence of full groups",
                PackingCheck::orderedWritesAscend);
        c.check("out of order writes: a new sequence only when the buffer filled", PackingCheck::sequencesPerFill);
        c.check("a partition spanning many groups and buffers", PackingCheck::partitionSpansManyGroups);
        c.check("empty partitions and empty writes are in no directory", PackingCheck::emptyPartitions);
        c.check("runs are slices of the payload, several groups back to back", PackingCheck::runsAreSlices);
        c.check("malformed payloads are refused with PROTOCOL", PackingCheck::malformedRefused);
        if (args.length == 1) {
            JsonNode packed = new ObjectMapper().readTree(new File(args[0])).path("packed");
            for (JsonNode v : packed.path("valid")) {
                c.check("packed: " + v.path("name").asText(), () -> validVector(v));
            }
            for (JsonNode v : packed.path("invalid")) {
                if (v.path("detected_by").asText().equals("reader")) {
                    c.check("packed: " + v.path("name").asText(), () -> invalidVector(v));
                }
            }
        }
        c.exit();
    }

    // ------------------------------------------------------------------------------------------ helpers

    /** One write: {@code bytes} for {@code partition}. */
    private record Write(int partition, byte[] bytes) {}

    /** A pushed group, and whether it left before the writer finished (while writes were still coming). */
    private record Group(boolean early, byte[] payload) {}

    /** The partition range of a group: its first and last run. */
    private record Span(int first, int last) {}

    private static byte[] bytes(Random random, int partition, int length) {
        byte[] b = new byte[length];
        random.nextBytes(b);
        if (length > 0) {
            b[0] = (byte) partition;
        }
        return b;
    }

    private static List<Group> pack(long capacity, int segment, List<Write> writes) throws Exception {
        return pack(capacity, segment, writes, ATTEMPT);
    }

    /** Writes everything into a buffer of {@code capacity}, then finishes it; returns the groups it made. */
    private static List<Group> pack(long capacity, int segment, List<Write> writes, long attempt) throws Exception {
        List<Group> groups = new ArrayList<>();
        boolean[] finishing = {false};
        PackingBuffer buffer = new PackingBuffer(capacity, segment, attempt, (head, headLength, data, dataLength) -> {
            byte[] payload = Arrays.copyOf(head, headLength + dataLength);
            System.arraycopy(data, 0, payload, headLength, dataLength);
            groups.add(new Group(!finishing[0], payload));
        });
        for (Write w : writes) {
            buffer.write(w.partition(), w.bytes(), 0, w.bytes().length);
        }
        finishing[0] = true;
        buffer.finish();
        return groups;
    }

    /**
     * Checks each group as a daemon would (one well-formed group of the attempt, within the segment) and
     * returns the bytes of each partition, its runs concatenated in push order.
     */
    private static byte[][] unpack(List<Group> groups, int partitions, int segment) throws ProtocolException {
        ByteArrayOutputStream[] out = new ByteArrayOutputStream[partitions];
        for (Group g : groups) {
            ByteBuffer payload = ByteBuffer.wrap(g.payload());
            require(g.payload().length <= segment, "a group of " + g.payload().length + " bytes");
            int runs = PackedGroups.check(payload, 0, partitions, a -> a == ATTEMPT);
            PackedGroups.Cursor cursor = new PackedGroups.Cursor(payload);
            long data = 0;
            while (cursor.next()) {
                require(cursor.attempt() == ATTEMPT, "attempt " + cursor.attempt());
                ByteBuffer run = cursor.data();
                data += run.remaining();
                int p = cursor.partition();
                if (out[p] == null) {
                    out[p] = new ByteArrayOutputStream();
                }
                out[p].write(run.array(), run.arrayOffset() + run.position(), run.remaining());
            }
            require(PackedGroups.size(runs, data) == g.payload().length, "not exactly one group");
        }
        byte[][] result = new byte[partitions][];
        for (int p = 0; p < partitions; p++) {
            result[p] = out[p] == null ? new byte[0] : out[p].toByteArray();
        }
        return result;
    }

    private static byte[][] expected(List<Write> writes, int partitions) {
        ByteArrayOutputStream[] out = new ByteArrayOutputStream[partitions];
        for (int p = 0; p < partitions; p++) {
            out[p] = new ByteArrayOutputStream();
        }
        for (Write w : writes) {
            out[w.partition()].writeBytes(w.bytes());
        }
        byte[][] result = new byte[partitions][];
        for (int p = 0; p < partitions; p++) {
            result[p] = out[p].toByteArray();
        }
        return result;
    }

    private static void readsBack(List<Write> writes, int partitions, long capacity, int segment) throws Exception {
        byte[][] got = unpack(pack(capacity, segment, writes), partitions, segment);
        byte[][] want = expected(writes, partitions);
        for (int p = 0; p < partitions; p++) {
            require(Arrays.equals(got[p], want[p]), "capacity " + capacity + ", segment " + segment + ", "
                    + partitions + " partitions: partition " + p + " has " + got[p].length + " bytes, wrote "
                    + want[p].length);
        }
    }

    /** Sizes as a serializer hands them on: mostly small, some empty, now and then more than a segment. */
    private static int size(Random random) {
        return switch (random.nextInt(10)) {
            case 0 -> 0;
            case 1, 2, 3 -> 1 + random.nextInt(16);
            case 4, 5, 6 -> 100 + random.nextInt(300);
            case 7, 8 -> 1 + random.nextInt(5000);
            default -> random.nextInt(20) == 0 ? 70_000 + random.nextInt(1000) : random.nextInt(40_000);
        };
    }

    private static List<Write> randomWrites(Random random, int partitions, long total) {
        List<Write> writes = new ArrayList<>();
        for (long n = 0; n < total; ) {
            int p = random.nextInt(partitions);
            Write w = new Write(p, bytes(random, p, size(random)));
            writes.add(w);
            n += w.bytes().length;
        }
        return writes;
    }

    private static List<Span> spans(List<Group> groups) {
        List<Span> out = new ArrayList<>();
        for (Group g : groups) {
            PackedGroups.Cursor cursor = new PackedGroups.Cursor(ByteBuffer.wrap(g.payload()));
            cursor.next();
            int first = cursor.partition();
            int last = first;
            while (cursor.next()) {
                last = cursor.partition();
            }
            out.add(new Span(first, last));
        }
        return out;
    }

    // ------------------------------------------------------------------------------------------ checks

    private static void format() throws Exception {
        List<Write> writes = List.of(new Write(1, "k2v2".getBytes()), new Write(0, "k1v1".getBytes()),
                new Write(1, "k3v3".getBytes()));
        List<Group> groups = pack(1 << 20, 4096, writes, ATTEMPT);
        require(groups.size() == 1, groups.size() + " groups");
        String hex = HEX.formatHex(groups.get(0).payload());
        String want = "800000000000000b" + "00000002" + "00000000" + "00000004" + "00000001" + "00000008"
                + HEX.formatHex("k1v1k2v2k3v3".getBytes());
        require(hex.equals(want), "payload " + hex + ", expected " + want);
    }

    private static void roundTrips() throws Exception {
        Random random = new Random(25);
        for (int partitions : new int[] {1, 7, 200, 10_000}) {
            List<Write> writes = randomWrites(random, partitions, 600_000);
            for (long capacity : new long[] {1, 1000, 40_000, 1 << 20}) {
                for (int segment : new int[] {4096, 32768}) {
                    readsBack(writes, partitions, capacity, segment);
                }
            }
        }
    }

    /** Whether group {@code i + 1} starts a new sequence: its first partition is below group i's last. */
    private static boolean descends(List<Span> spans, int i) {
        return spans.get(i + 1).first() < spans.get(i).last();
    }

    private static void groupsAreFull() throws Exception {
        Random random = new Random(7);
        int segment = 4096;
        List<Group> groups = pack(100_000, segment, randomWrites(random, 2000, 1_000_000));
        List<Span> spans = spans(groups);
        for (int i = 0; i + 1 < groups.size(); i++) {
            // Full: not even a new run's directory entry and one byte would fit.
            require(descends(spans, i) || groups.get(i).payload().length > segment - Wire.GROUP_RUN - 1,
                    "group " + i + " of " + groups.get(i).payload().length + " bytes, and the next one goes on");
        }
    }

    private static void orderedWritesAscend() throws Exception {
        Random random = new Random(3);
        int partitions = 5000;
        int segment = 4096;
        List<Write> writes = new ArrayList<>();
        long total = 0;
        for (int p = 0; p < partitions; p++) {
            for (int i = random.nextInt(4); i > 0; i--) { // a few writes each, some partitions empty
                writes.add(new Write(p, bytes(random, p, 1 + random.nextInt(700))));
                total += writes.get(writes.size() - 1).bytes().length;
            }
        }
        List<Group> groups = pack(16 << 20, segment, writes, ATTEMPT);
        List<Span> spans = spans(groups);
        long early = 0;
        for (int i = 0; i < groups.size(); i++) {
            int length = groups.get(i).payload().length;
            require(i + 1 == groups.size() || !descends(spans, i), "group " + (i + 1) + " starts a new sequence");
            require(i + 1 == groups.size() || length > segment - Wire.GROUP_RUN - 1, "group " + i + " is not full");
            early += groups.get(i).early() ? length : 0;
        }
        // Buffered when the writes ended: under the eager threshold, and the packer's last group.
        long held = (PackingBuffer.EAGER_SEGMENTS + 1L) * segment;
        require(early >= total - held, early + " of " + total + " bytes left before the end");
        readsBack(writes, partitions, 16 << 20, segment);
    }

    private static void sequencesPerFill() throws Exception {
        Random random = new Random(11);
        int partitions = 300;
        int capacity = 30_000;
        List<Write> writes = randomWrites(random, partitions, 400_000);
        List<Group> groups = pack(capacity, 4096, writes, ATTEMPT);
        List<Span> spans = spans(groups);
        long data = 0;
        int sequences = 1;
        for (int i = 0; i < groups.size(); i++) {
            data += groups.get(i).payload().length;
            if (i + 1 < groups.size() && descends(spans, i)) {
                require(data >= capacity / 4, "a sequence of only " + data + " bytes: the buffer was not full");
                data = 0;
                sequences++;
            }
        }
        require(sequences > 2, sequences + " sequences: random writes never filled the buffer, the check cannot fail");
        readsBack(writes, partitions, capacity, 4096);
    }

    private static void partitionSpansManyGroups() throws Exception {
        Random random = new Random(5);
        List<Write> writes = new ArrayList<>();
        writes.add(new Write(2, bytes(random, 2, 300)));
        for (int i = 0; i < 64; i++) {
            writes.add(new Write(3, bytes(random, 3, 16_384)));
        }
        writes.add(new Write(3, bytes(random, 3, 1 << 20))); // one write larger than the buffer
        writes.add(new Write(4, bytes(random, 4, 10)));
        List<Group> groups = pack(100_000, 4096, writes);
        long holding3 = spans(groups).stream().filter(s -> s.first() <= 3 && s.last() >= 3).count();
        require(holding3 >= (2L << 20) / 4096, "partition 3 in " + holding3 + " groups");
        require(groups.stream().filter(Group::early).count() >= 20, "partition 3 left only at the end");
        readsBack(writes, 5, 100_000, 4096);
    }

    private static void emptyPartitions() throws Exception {
        require(pack(1000, 4096, List.of()).isEmpty(), "nothing written, yet a group");
        require(pack(1000, 4096, List.of(new Write(0, new byte[0]))).isEmpty(), "an empty write made a group");
        Random random = new Random(9);
        List<Write> writes = new ArrayList<>();
        for (int i = 0; i < 200; i++) {
            int p = i % 2 == 0 ? 3 : 9;
            writes.add(new Write(p, bytes(random, p, random.nextInt(50))));
            writes.add(new Write(i % 12, new byte[0]));
        }
        List<Group> groups = pack(2000, 4096, writes);
        for (Group g : groups) {
            PackedGroups.Cursor cursor = new PackedGroups.Cursor(ByteBuffer.wrap(g.payload()));
            while (cursor.next()) {
                require(cursor.partition() == 3 || cursor.partition() == 9, "a run of partition " + cursor.partition());
            }
        }
        readsBack(writes, 12, 2000, 4096);
    }

    private static byte[] group(long attempt, int[] partitions, byte[][] data) {
        ByteBuffer b = ByteBuffer.allocate(1 << 16);
        b.putLong(attempt).putInt(partitions.length);
        for (int i = 0; i < partitions.length; i++) {
            b.putInt(partitions[i]).putInt(data[i].length);
        }
        for (byte[] d : data) {
            b.put(d);
        }
        return Arrays.copyOf(b.array(), b.position());
    }

    private static byte[] concat(byte[]... parts) {
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        for (byte[] p : parts) {
            out.writeBytes(p);
        }
        return out.toByteArray();
    }

    private static void runsAreSlices() throws Exception {
        byte[] payload = concat(group(7, new int[] {4, 6}, new byte[][] {"ab".getBytes(), "cde".getBytes()}),
                group(8, new int[] {5}, new byte[][] {"f".getBytes()}));
        ByteBuffer buffer = ByteBuffer.wrap(payload);
        require(PackedGroups.check(buffer, 4, 7, a -> a == 7 || a == 8) == 3, "three runs");
        PackedGroups.Cursor cursor = new PackedGroups.Cursor(buffer);
        List<String> runs = new ArrayList<>();
        while (cursor.next()) {
            ByteBuffer d = cursor.data();
            require(d.array() == payload && d.position() == 0, "a run is not a slice of the payload");
            String text = new String(payload, d.arrayOffset(), d.limit());
            runs.add(cursor.partition() + "/" + cursor.attempt() + "/" + text);
        }
        require(runs.equals(List.of("4/7/ab", "6/7/cde", "5/8/f")), "runs " + runs);
    }

    private static void malformedRefused() throws ProtocolException {
        byte[] one = "x".getBytes();
        byte[] good = group(7, new int[] {1, 2}, new byte[][] {one, one});
        Object[][] cases = {
            {new byte[0], "empty payload"},
            {Arrays.copyOf(good, 11), "shorter than a group header"},
            {ByteBuffer.allocate(12).putLong(7).putInt(0).array(), "no runs"},
            {Arrays.copyOf(good, 12 + 8), "shorter than its directory"},
            {group(7, new int[] {2, 1}, new byte[][] {one, one}), "descending partitions"},
            {group(7, new int[] {1, 1}, new byte[][] {one, one}), "a partition twice"},
            {group(7, new int[] {1}, new byte[][] {new byte[0]}), "an empty run"},
            {group(7, new int[] {0}, new byte[][] {one}), "a partition below the range"},
            {group(7, new int[] {5}, new byte[][] {one}), "a partition at the end of the range"},
            {group(7, new int[] {-1}, new byte[][] {one}), "partition 2^32-1"},
            {group(9, new int[] {1}, new byte[][] {one}), "an attempt the request did not name"},
            {Arrays.copyOf(good, good.length - 1), "lengths past the payload"},
            {concat(good, new byte[5]), "trailing bytes"},
            {concat(good, group(7, new int[] {3}, new byte[][] {new byte[0]})), "a bad second group"},
        };
        require(runsOf(good) == 2, "the good group");
        for (Object[] c : cases) {
            try {
                int runs = runsOf((byte[]) c[0]);
                throw new AssertionError(c[1] + ": accepted, " + runs + " runs");
            } catch (ProtocolException e) {
                require(e.code() == ErrorCode.PROTOCOL, c[1] + ": code " + e.code());
            }
        }
    }

    private static int runsOf(byte[] payload) throws ProtocolException {
        return PackedGroups.check(ByteBuffer.wrap(payload), 1, 5, a -> a == 7);
    }

    // ------------------------------------------------------------------------------------------ golden vectors

    private static long u64(JsonNode n) {
        return n.bigIntegerValue().longValue();
    }

    /** What a vector's payload must pass: a push's or a read's context (PROTOCOL.md §15). */
    private static PackedGroups.Cursor checked(JsonNode v, byte[] payload) throws ProtocolException {
        JsonNode context = v.path("context");
        ByteBuffer buffer = ByteBuffer.wrap(payload);
        if (v.path("frame").asText().equals("PUSH_DATA")) {
            long attempt = u64(context.path("attempt"));
            PackedGroups.check(buffer, 0, context.path("partitions").asLong(), a -> a == attempt);
        } else {
            List<Long> named = new ArrayList<>();
            context.path("attempts").forEach(a -> named.add(u64(a)));
            LongPredicate isNamed = named::contains;
            PackedGroups.check(buffer, context.path("start").asLong(), context.path("end").asLong(), isNamed);
        }
        return new PackedGroups.Cursor(buffer);
    }

    private static String run(long attempt, long partition, String hex) {
        return Long.toUnsignedString(attempt) + "/" + partition + "/" + hex;
    }

    private static void validVector(JsonNode v) throws Exception {
        List<String> pairs = new ArrayList<>();
        String pair = null;
        StringBuilder pairData = new StringBuilder();
        for (JsonNode p : v.path("payloads")) {
            byte[] payload = HEX.parseHex(p.path("hex").asText());
            List<String> want = new ArrayList<>();
            for (JsonNode g : p.path("groups")) {
                for (JsonNode r : g.path("runs")) {
                    want.add(run(u64(g.path("attempt")), r.path("partition").asLong(), r.path("data_hex").asText()));
                }
            }
            List<String> got = new ArrayList<>();
            for (PackedGroups.Cursor runs = checked(v, payload); runs.next(); ) {
                ByteBuffer d = runs.data();
                String hex = HEX.formatHex(payload, d.arrayOffset(), d.arrayOffset() + d.remaining());
                got.add(run(runs.attempt(), runs.partition(), hex));
                String key = Long.toUnsignedString(runs.attempt()) + "/" + runs.partition();
                if (!key.equals(pair)) {
                    if (pair != null) {
                        pairs.add(pair + "/" + pairData);
                    }
                    pair = key;
                    pairData.setLength(0);
                }
                pairData.append(hex);
            }
            require(got.equals(want), "runs " + got + ", expected " + want);
            if (v.path("frame").asText().equals("PUSH_DATA")) {
                packsInto(v.path("context"), p, payload);
            }
        }
        pairs.add(pair + "/" + pairData);
        List<String> want = new ArrayList<>();
        for (JsonNode p : v.path("pairs")) {
            want.add(run(u64(p.path("attempt")), p.path("partition").asLong(), p.path("data_hex").asText()));
        }
        require(pairs.equals(want), "pairs " + pairs + ", expected " + want);
    }

    /** The writer, given a push payload's runs, packs exactly the payload's bytes. */
    private static void packsInto(JsonNode context, JsonNode p, byte[] payload) throws Exception {
        List<Write> writes = new ArrayList<>();
        for (JsonNode g : p.path("groups")) {
            for (JsonNode r : g.path("runs")) {
                writes.add(new Write((int) r.path("partition").asLong(), HEX.parseHex(r.path("data_hex").asText())));
            }
        }
        List<Group> groups = pack(1 << 20, Wire.DEFAULT_SEGMENT_SIZE, writes, u64(context.path("attempt")));
        List<String> got = groups.stream().map(g -> HEX.formatHex(g.payload())).toList();
        require(got.equals(List.of(HEX.formatHex(payload))), "packed " + got + ", expected " + HEX.formatHex(payload));
    }

    private static void invalidVector(JsonNode v) {
        byte[] payload = HEX.parseHex(v.path("hex").asText());
        ErrorCode code = ErrorCode.byCode(v.path("code").asInt());
        try {
            checked(v, payload);
            throw new AssertionError("accepted (" + v.path("reason").asText() + ")");
        } catch (ProtocolException e) {
            require(e.code() == code, "refused with " + e.code() + ", expected " + code);
        }
    }
}
