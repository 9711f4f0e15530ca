package io.shuffled.client.wire;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.File;
import java.math.BigInteger;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.EnumSet;
import java.util.HexFormat;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.Set;
import java.util.TreeSet;

/**
 * Checks the Java codec against the golden vectors (proto/vectors/frames.json, PROTOCOL.md §15).
 *
 * <p>Usage: {@code java -cp <jar>:<test jar>:<pyspark jars>/* io.shuffled.client.wire.VectorCheck
 * proto/vectors/frames.json}. The JSON is read with Jackson (shipped with Spark, so on the pyspark
 * classpath); its integers are arbitrary precision.
 *
 * <p>One line per entry of the file, "ok" or "FAIL":
 *
 * <ul>
 *   <li>{@code vectors}: build the frame from its fields, encode it and compare the bytes; decode the
 *       hex whole and one byte at a time and compare the frame (and that no partial frame is left);
 *   <li>{@code decode_only}: the same decoding checks, and the decoded frame survives re-encoding;
 *   <li>{@code invalid}: decoding (whole and one byte at a time) fails with the expected code, from the
 *       bytes alone, or, for {@code at_eof} entries, only when the end of input is announced.
 * </ul>
 *
 * <p>Then file-wide checks, one line each: the version and payload limit match, every frame type, both
 * buffer kinds and both roles have a vector, and all vectors back to back decode in one stream in any
 * split. The last line is {@code N passed, M failed}: N counts passing entries of the file, M failing
 * entries plus failing file-wide checks. The exit status is 0 only when M is 0.
 */
public final class VectorCheck {
    private static final HexFormat HEX = HexFormat.of();

    private int passed;
    private int failed;
    private int maxPayload;

    public static void main(String[] args) throws Exception {
        if (args.length != 1) {
            System.err.println("usage: VectorCheck path/to/frames.json");
            System.exit(2);
        }
        JsonNode root = new ObjectMapper().readTree(new File(args[0]));
        VectorCheck check = new VectorCheck();
        check.run(root);
        System.out.println(check.passed + " passed, " + check.failed + " failed");
        System.exit(check.failed == 0 ? 0 : 1);
    }

    private void run(JsonNode root) {
        maxPayload = root.path("max_payload").asInt(-1);
        for (JsonNode v : root.path("vectors")) {
            entry(v.path("name").asText(), () -> checkVector(v, true));
        }
        for (JsonNode v : root.path("decode_only")) {
            entry(v.path("name").asText(), () -> checkVector(v, false));
        }
        for (JsonNode v : root.path("invalid")) {
            entry(v.path("name").asText(), () -> checkInvalid(v));
        }
        fileCheck("protocol_version is " + Wire.VERSION, () -> {
            JsonNode version = root.path("protocol_version");
            require(version.asInt() == Wire.VERSION, "file speaks " + version);
        });
        fileCheck("max_payload is the default limit", () -> {
            require(maxPayload == Wire.DEFAULT_MAX_PAYLOAD, "file says " + maxPayload);
        });
        fileCheck("every frame type, buffer kind and role has a vector", () -> coverage(root.path("vectors")));
        fileCheck("auth: proofs and application token (§6.1, §6.2)", () -> {
            JsonNode a = root.path("auth");
            byte[] secret = HEX.parseHex(a.path("secret_hex").asText());
            String dn = a.path("dialer_nonce").asText();
            String an = a.path("acceptor_nonce").asText();
            require(Auth.acceptorProof(secret, dn, an).equals(a.path("acceptor_proof").asText()), "acceptor proof");
            require(Auth.dialerProof(secret, dn, an).equals(a.path("dialer_proof").asText()), "dialer proof");
            byte[] appSecret = HEX.parseHex(a.path("app_secret_hex").asText());
            require(Auth.appToken(appSecret, a.path("app").asText()).equals(a.path("app_token").asText()), "token");
        });
        fileCheck("all vectors back to back, one byte at a time and in random splits", () -> backToBack(root));
    }

    // ------------------------------------------------------------------------------------------ harness

    private interface Check {
        void run() throws Exception;
    }

    private void entry(String name, Check check) {
        String problem = attempt(check);
        if (problem == null) {
            passed++;
            System.out.println("ok   " + name);
        } else {
            failed++;
            System.out.println("FAIL " + name + ": " + problem);
        }
    }

    private void fileCheck(String name, Check check) {
        String problem = attempt(check);
        if (problem == null) {
            System.out.println("ok   [file] " + name);
        } else {
            failed++;
            System.out.println("FAIL [file] " + name + ": " + problem);
        }
    }

    private static String attempt(Check check) {
        try {
            check.run();
            return null;
        } catch (AssertionError e) {
            return e.getMessage();
        } catch (Exception e) {
            return e.toString();
        }
    }

    private static void require(boolean condition, String message) {
        if (!condition) {
            throw new AssertionError(message);
        }
    }

    // ------------------------------------------------------------------------------------------ checks

    private void checkVector(JsonNode v, boolean encode) throws Exception {
        Frame expected = build(v.path("frame"));
        byte[] bytes = HEX.parseHex(v.path("hex").asText());
        if (encode) {
            byte[] got = FrameEncoder.encode(expected);
            require(HEX.formatHex(got).equals(v.path("hex").asText()), "encoded " + HEX.formatHex(got));
            ByteBuffer into = ByteBuffer.allocate(got.length + 3).position(3);
            FrameEncoder.encode(expected, into);
            require(!into.hasRemaining(), "encode(frame, buffer) wrote " + (into.position() - 3) + " bytes");
        }
        List<Frame> whole = decode(bytes, bytes.length);
        require(whole.equals(List.of(expected)), "decoded " + whole + ", expected " + expected);
        List<Frame> bytewise = decode(bytes, 1);
        require(bytewise.equals(List.of(expected)), "one byte at a time: decoded " + bytewise);
        if (!encode) {
            byte[] again = FrameEncoder.encode(whole.get(0));
            require(decode(again, again.length).equals(whole), "re-encoded " + HEX.formatHex(again) + " differs");
        }
    }

    /** Decodes {@code bytes} handing the decoder {@code step} bytes at a time; the input must end cleanly. */
    private List<Frame> decode(byte[] bytes, int step) throws ProtocolException {
        FrameDecoder decoder = new FrameDecoder(FrameDecoder.HEAP, maxPayload);
        List<Frame> out = new ArrayList<>();
        for (int pos = 0; pos < bytes.length; pos += step) {
            decoder.feed(ByteBuffer.wrap(bytes, pos, Math.min(step, bytes.length - pos)), out::add);
        }
        require(!decoder.hasPartialFrame(), "a partial frame is left after the input");
        decoder.endOfInput();
        return out;
    }

    private void checkInvalid(JsonNode v) {
        byte[] bytes = HEX.parseHex(v.path("hex").asText());
        int code = v.path("code").asInt();
        boolean atEof = v.path("at_eof").asBoolean();
        require(ErrorCode.byCode(code) != null, "code " + code + " is not an ErrorCode");
        for (int step : new int[] {bytes.length, 1}) {
            String how = step == 1 ? "one byte at a time" : "whole";
            FrameDecoder decoder = new FrameDecoder(FrameDecoder.HEAP, maxPayload);
            List<Frame> out = new ArrayList<>();
            ProtocolException error = null;
            int pos = 0;
            try {
                for (; pos < bytes.length; pos += step) {
                    decoder.feed(ByteBuffer.wrap(bytes, pos, Math.min(step, bytes.length - pos)), out::add);
                }
            } catch (ProtocolException e) {
                error = e;
            }
            if (atEof) {
                require(error == null, how + ": refused before the end of input: " + error);
                require(out.isEmpty() && decoder.hasPartialFrame(), how + ": expected a partial frame, got " + out);
                try {
                    decoder.endOfInput();
                } catch (ProtocolException e) {
                    error = e;
                }
            }
            require(error != null, how + ": accepted, decoded " + out);
            require(error.code().code() == code,
                    how + ": code " + error.code() + " (" + error.getMessage() + "), expected " + code);
        }
    }

    private void coverage(JsonNode vectors) throws Exception {
        Set<FrameType> types = EnumSet.noneOf(FrameType.class);
        Set<BufferKind> kinds = EnumSet.noneOf(BufferKind.class);
        Set<Role> roles = EnumSet.noneOf(Role.class);
        for (JsonNode v : vectors) {
            Frame f = build(v.path("frame"));
            types.add(f.type());
            if (f instanceof Frame.BufferResponse b) {
                kinds.add(b.kind());
            } else if (f instanceof Frame.Hello h) {
                roles.add(h.role());
            } else if (f instanceof Frame.HelloAck h) {
                roles.add(h.role());
            }
        }
        Set<String> missing = new TreeSet<>();
        EnumSet.complementOf(EnumSet.copyOf(types)).forEach(t -> missing.add(t.name()));
        for (BufferKind k : BufferKind.values()) {
            if (!kinds.contains(k)) {
                missing.add(k.name());
            }
        }
        for (Role r : Role.values()) {
            if (!roles.contains(r)) {
                missing.add(r.name());
            }
        }
        require(missing.isEmpty(), "no vector for " + missing);
    }

    private void backToBack(JsonNode root) throws Exception {
        ByteBuffer all = ByteBuffer.allocate(1 << 20);
        List<Frame> expected = new ArrayList<>();
        for (JsonNode v : root.path("vectors")) {
            all.put(HEX.parseHex(v.path("hex").asText()));
            expected.add(build(v.path("frame")));
        }
        byte[] stream = new byte[all.position()];
        all.flip().get(stream);
        require(decode(stream, 1).equals(expected), "one byte at a time: frames differ");
        Random random = new Random(20240101);
        for (int round = 0; round < 20; round++) {
            FrameDecoder decoder = new FrameDecoder(FrameDecoder.HEAP, maxPayload);
            List<Frame> out = new ArrayList<>();
            for (int pos = 0; pos < stream.length; ) {
                int n = Math.min(1 + random.nextInt(64), stream.length - pos);
                decoder.feed(ByteBuffer.wrap(stream, pos, n), out::add);
                pos += n;
            }
            decoder.endOfInput();
            require(out.equals(expected), "random split (round " + round + "): frames differ");
        }
    }

    // ------------------------------------------------------------------------------------------ JSON → frames

    private static final Map<String, List<String>> FIELDS = new LinkedHashMap<>();

    static {
        FIELDS.put("HELLO", List.of("role", "version", "info"));
        FIELDS.put("HELLO_ACK", List.of("role", "version", "info"));
        FIELDS.put("ERROR", List.of("stream", "code", "message"));
        FIELDS.put("CLOSE", List.of());
        FIELDS.put("AUTH_CHALLENGE", List.of("nonce", "proof"));
        FIELDS.put("AUTH_RESPONSE", List.of("proof"));
        FIELDS.put("PARTITION_REQUEST", List.of("receiver", "credit", "app", "shuffle", "start", "end", "locations"));
        FIELDS.put("ADD_CREDIT", List.of("receiver", "credit"));
        FIELDS.put("BUFFER_RESPONSE",
                List.of("receiver", "sequence", "backlog", "kind", "payload_hex", "crc"));
        FIELDS.put("CANCEL_PARTITION_REQUEST", List.of("receiver"));
        FIELDS.put("OPEN_MAP_OUTPUT", List.of("writer", "app", "shuffle", "map_index", "attempt", "partitions"));
        FIELDS.put("PUSH_CREDIT", List.of("writer", "credit"));
        FIELDS.put("PUSH_DATA", List.of("writer", "sequence", "payload_hex", "crc"));
        FIELDS.put("PUSH_SLOTS", List.of("writer", "slots"));
        FIELDS.put("PUSH_PLACED", List.of("writer", "placed"));
        FIELDS.put("BUFFER_PLACED", List.of("receiver", "placed"));
        FIELDS.put("RETURN_SLOTS", List.of("stream", "slots"));
        FIELDS.put("COMMIT_MAP_OUTPUT", List.of("writer", "pushes"));
        FIELDS.put("COMMIT_ACK", List.of("writer", "lengths"));
        FIELDS.put("ABORT_MAP_OUTPUT", List.of("writer"));
        FIELDS.put("ABORT_ACK", List.of("writer"));
        FIELDS.put("ADMIN_REQUEST", List.of("request", "op", "args"));
        FIELDS.put("ADMIN_RESPONSE", List.of("request", "result"));
    }

    /** The frame a vector's {@code frame} object describes (PROTOCOL.md §15), as the decoder returns it. */
    static Frame build(JsonNode f) {
        String type = f.path("type").asText();
        List<String> fields = FIELDS.get(type);
        require(fields != null, "unknown frame type '" + type + "'");
        Set<String> present = new TreeSet<>();
        f.fieldNames().forEachRemaining(present::add);
        present.remove("type");
        String token = optionalText(f, present, "token"); // §6.2
        int replicas = f.has("replicas") ? (int) i64(f, "replicas") : 0; // optional key (§7.8)
        present.remove("replicas");
        String durability = optionalText(f, present, "durability"); // §7.8
        String fsync = optionalText(f, present, "fsync"); // §7.8
        require(present.equals(new TreeSet<>(fields)), type + " has fields " + present + ", expected " + fields);
        switch (type) {
            case "HELLO":
                return new Frame.Hello(Role.valueOf(text(f, "role")), (int) u32(f, "version"), map(f, "info"));
            case "HELLO_ACK":
                return new Frame.HelloAck(Role.valueOf(text(f, "role")), (int) u32(f, "version"), map(f, "info"));
            case "ERROR":
                return new Frame.ErrorResponse(u32(f, "stream"), (int) u32(f, "code"), text(f, "message"));
            case "CLOSE":
                return new Frame.Close();
            case "AUTH_CHALLENGE":
                return new Frame.AuthChallenge(text(f, "nonce"), text(f, "proof"));
            case "AUTH_RESPONSE":
                return new Frame.AuthResponse(text(f, "proof"));
            case "PARTITION_REQUEST": {
                Map<String, long[]> locations = new LinkedHashMap<>();
                for (Map.Entry<String, JsonNode> e : f.path("locations").properties()) {
                    long[] ids = new long[e.getValue().size()];
                    for (int i = 0; i < ids.length; i++) {
                        ids[i] = u64(e.getValue().get(i), "locations");
                    }
                    locations.put(e.getKey(), ids);
                }
                return new Frame.PartitionRequest(u32(f, "receiver"), u32(f, "credit"), text(f, "app"),
                        i64(f, "shuffle"), i64(f, "start"), i64(f, "end"), locations, token);
            }
            case "ADD_CREDIT":
                return new Frame.AddCredit(u32(f, "receiver"), u32(f, "credit"));
            case "BUFFER_RESPONSE": {
                BufferKind kind = BufferKind.valueOf(text(f, "kind"));
                byte[] payload = HEX.parseHex(text(f, "payload_hex"));
                return new Frame.BufferResponse(u32(f, "receiver"), u32(f, "sequence"), u32(f, "backlog"), kind,
                        payload.length, kind == BufferKind.DATA ? ByteBuffer.wrap(payload) : null, u32(f, "crc"));
            }
            case "CANCEL_PARTITION_REQUEST":
                return new Frame.CancelPartitionRequest(u32(f, "receiver"));
            case "OPEN_MAP_OUTPUT":
                return new Frame.OpenMapOutput(u32(f, "writer"), text(f, "app"), i64(f, "shuffle"),
                        i64(f, "map_index"), u64(f.get("attempt"), "attempt"), i64(f, "partitions"), token,
                        replicas, durability, fsync);
            case "PUSH_CREDIT":
                return new Frame.PushCredit(u32(f, "writer"), u32(f, "credit"));
            case "PUSH_DATA":
                byte[] pushed = HEX.parseHex(text(f, "payload_hex"));
                return new Frame.PushData(u32(f, "writer"), u32(f, "sequence"), pushed.length, ByteBuffer.wrap(pushed),
                        u32(f, "crc"));
            case "PUSH_SLOTS":
                return new Frame.PushSlots(u32(f, "writer"), longs(f, "slots"));
            case "PUSH_PLACED":
                return new Frame.PushPlaced(u32(f, "writer"), longs(f, "placed"));
            case "BUFFER_PLACED":
                return new Frame.BufferPlaced(u32(f, "receiver"), longs(f, "placed"));
            case "RETURN_SLOTS":
                require(u32(f, "stream") == 0, "ReturnSlots travels on stream 0");
                return new Frame.ReturnSlots(longs(f, "slots"));
            case "COMMIT_MAP_OUTPUT":
                return new Frame.CommitMapOutput(u32(f, "writer"), u32(f, "pushes"));
            case "COMMIT_ACK":
                return new Frame.CommitAck(u32(f, "writer"), longs(f, "lengths"));
            case "ABORT_MAP_OUTPUT":
                return new Frame.AbortMapOutput(u32(f, "writer"));
            case "ABORT_ACK":
                return new Frame.AbortAck(u32(f, "writer"));
            case "ADMIN_REQUEST":
                return new Frame.AdminRequest(u32(f, "request"), text(f, "op"), map(f, "args"));
            case "ADMIN_RESPONSE":
                return new Frame.AdminResponse(u32(f, "request"), map(f, "result"));
            default:
                throw new AssertionError("unhandled frame type " + type);
        }
    }

    /** An optional string key, null when absent; taken off {@code present}, which then holds the required ones. */
    private static String optionalText(JsonNode f, Set<String> present, String key) {
        present.remove(key);
        return f.has(key) ? text(f, key) : null;
    }

    private static String text(JsonNode f, String key) {
        JsonNode n = f.get(key);
        require(n != null && n.isTextual(), "'" + key + "' must be a string");
        return n.asText();
    }

    private static BigInteger integer(JsonNode n, String what) {
        require(n != null && n.isIntegralNumber(), "'" + what + "' must be an integer");
        return n.bigIntegerValue();
    }

    private static long u32(JsonNode f, String key) {
        BigInteger v = integer(f.get(key), key);
        require(v.signum() >= 0 && v.bitLength() <= 32, "'" + key + "' is not a u32: " + v);
        return v.longValue();
    }

    /** The list {@code key} of u64s (u32s are checked by the frame's constructor). */
    private static long[] longs(JsonNode f, String key) {
        JsonNode list = f.path(key);
        long[] values = new long[list.size()];
        for (int i = 0; i < values.length; i++) {
            values[i] = u64(list.get(i), key);
        }
        return values;
    }

    private static long u64(JsonNode n, String what) {
        BigInteger v = integer(n, what);
        require(v.signum() >= 0 && v.bitLength() <= 64, "'" + what + "' is not a u64: " + v);
        return v.longValue();
    }

    private static long i64(JsonNode f, String key) {
        BigInteger v = integer(f.get(key), key);
        require(v.bitLength() <= 63, "'" + key + "' does not fit a long: " + v);
        return v.longValue();
    }

    private static Map<String, Object> map(JsonNode f, String key) {
        JsonNode n = f.get(key);
        require(n != null && n.isObject(), "'" + key + "' must be an object");
        @SuppressWarnings("unchecked")
        Map<String, Object> m = (Map<String, Object>) value(n);
        return m;
    }

    /** A JSON value as a msgpack model value (objects keep their key order: it is the wire order). */
    private static Object value(JsonNode n) {
        if (n.isObject()) {
            Map<String, Object> m = new LinkedHashMap<>();
            n.properties().forEach(e -> m.put(e.getKey(), value(e.getValue())));
            return MsgPack.normalizeMap(m);
        }
        if (n.isArray()) {
            List<Object> list = new ArrayList<>();
            n.forEach(item -> list.add(value(item)));
            return MsgPack.normalize(list);
        }
        if (n.isTextual()) {
            return n.asText();
        }
        if (n.isBoolean()) {
            return n.asBoolean();
        }
        if (n.isNull()) {
            return null;
        }
        if (n.isIntegralNumber()) {
            return MsgPack.normalize(n.bigIntegerValue());
        }
        throw new AssertionError("unsupported JSON value " + n);
    }
}
