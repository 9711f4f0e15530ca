package io.shuffled.client.wire;

import java.math.BigInteger;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.function.Consumer;

/**
 * Incremental decoder: bytes in, frames out, in any split (one byte at a time works). Not thread-safe;
 * one per connection.
 *
 * <p>Every rule of PROTOCOL.md that can be checked from the bytes alone is enforced, and a violation
 * is a {@link ProtocolException} carrying the code to report on stream 0. Header checks (§4: unknown
 * type, nonzero flags or reserved, a length over the limits of §9 or under a data frame's fixed part)
 * happen as soon as the 12 header bytes are in, before any of the body is buffered. After an
 * exception the decoder is dead: every further call throws the same exception.
 *
 * <p>The payload of a data frame (BufferResponse DATA, PushData) is copied straight into the buffer a
 * {@link PayloadSink} chooses for it, e.g. a pooled segment; the header and fixed part say its length
 * before it arrives. The decoder checks neither credit nor sequence numbers nor which frames the
 * connection's state allows; those belong to the connection (a sink may throw
 * {@link ErrorCode#CREDIT_VIOLATION}).
 *
 * <p>Stricter than the Python reference codec in a few places that cannot be told apart in Java types
 * or are MUSTs of the spec checked there at another layer: Hello/HelloAck/Close must be on stream 0, a
 * daemon's Hello must carry a non-empty {@code node}, known Hello/HelloAck info keys must have their
 * types, a HelloAck {@code segment_size} must be a valid segment size, int fields must fit a signed
 * long, and u64 fields (attempt ids) must not be negative (also in OpenMapOutput). msgpack map keys must
 * be str and unique.
 */
public final class FrameDecoder {

    /** Chooses where a data frame's payload lands. */
    @FunctionalInterface
    public interface PayloadSink {
        /**
         * A buffer with exactly {@code length} bytes remaining for the payload of a DATA BufferResponse
         * or a PushData (the decoder writes through a duplicate; the frame's payload is a slice of it),
         * or null to discard the payload (e.g. late buffers of a cancelled stream).
         *
         * @throws ProtocolException to refuse the frame (e.g. CREDIT_VIOLATION)
         */
        ByteBuffer target(FrameType type, long stream, int length) throws ProtocolException;
    }

    /** Payloads land in new heap buffers. */
    public static final PayloadSink HEAP = (type, stream, length) -> ByteBuffer.allocate(length);

    private enum State { HEADER, BODY, PAYLOAD, FAILED }

    private static final int INITIAL_BODY = 256;
    private static final int KEEP_BODY = 64 << 10;
    /** Largest payload or control limit: a whole frame's length must still fit an int. */
    private static final int MAX_LIMIT = Integer.MAX_VALUE - 64;

    private final PayloadSink sink;
    private final int maxControl;
    private int maxPayload;

    private State state = State.HEADER;
    private final byte[] header = new byte[Wire.HEADER_SIZE];
    private int headerFill;
    private FrameType type;
    private long stream;
    private int length;
    private byte[] body = new byte[INITIAL_BODY];
    private int bodyNeed;
    private int bodyFill;
    private Frame pending;
    private ByteBuffer payloadWrite;
    private int payloadLeft;
    private ProtocolException failure;

    /** Heap payloads, the default payload limit (32 KiB) and the 8 MiB control limit. */
    public FrameDecoder() {
        this(HEAP, Wire.DEFAULT_MAX_PAYLOAD);
    }

    public FrameDecoder(PayloadSink sink, int maxPayload) {
        this(sink, maxPayload, Wire.MAX_CONTROL_BODY);
    }

    public FrameDecoder(PayloadSink sink, int maxPayload, int maxControl) {
        checkLimit(maxPayload);
        checkLimit(maxControl);
        this.sink = sink;
        this.maxPayload = maxPayload;
        this.maxControl = maxControl;
    }

    /** The data payload limit; a client sets it to the {@code segment_size} of its daemon's HelloAck (§9). */
    public void setMaxPayload(int maxPayload) {
        checkLimit(maxPayload);
        this.maxPayload = maxPayload;
    }

    private static void checkLimit(int limit) {
        if (limit < 0 || limit > MAX_LIMIT) {
            throw new IllegalArgumentException("limits must be in 0.." + MAX_LIMIT + ", got " + limit);
        }
    }

    public int maxPayload() {
        return maxPayload;
    }

    /** True while a frame has started but not ended: the end of input now would cut it (§2.3). */
    public boolean hasPartialFrame() {
        return state == State.BODY || state == State.PAYLOAD || (state == State.HEADER && headerFill > 0);
    }

    /**
     * The connection's input ended.
     *
     * @throws ProtocolException if it ended inside a frame (a broken connection, §2.3), or if the
     *     decoder failed earlier
     */
    public void endOfInput() throws ProtocolException {
        if (failure != null) {
            throw failure;
        }
        if (hasPartialFrame()) {
            throw fail(new ProtocolException("input ends inside a frame"));
        }
    }

    /** Decodes all of {@code in} (its position moves to its limit); returns the frames completed. */
    public List<Frame> feed(ByteBuffer in) throws ProtocolException {
        List<Frame> out = new ArrayList<>();
        feed(in, out::add);
        return out;
    }

    public List<Frame> feed(byte[] bytes, int offset, int len) throws ProtocolException {
        return feed(ByteBuffer.wrap(bytes, offset, len));
    }

    /** Decodes all of {@code in}, handing each completed frame to {@code out} as soon as it is complete. */
    public void feed(ByteBuffer in, Consumer<? super Frame> out) throws ProtocolException {
        if (failure != null) {
            throw failure;
        }
        try {
            while (in.hasRemaining()) {
                switch (state) {
                    case HEADER -> {
                        int n = Math.min(Wire.HEADER_SIZE - headerFill, in.remaining());
                        in.get(header, headerFill, n);
                        headerFill += n;
                        if (headerFill == Wire.HEADER_SIZE) {
                            headerFill = 0;
                            beginFrame(out);
                        }
                    }
                    case BODY -> {
                        int n = Math.min(bodyNeed - bodyFill, in.remaining());
                        ensureBody(bodyFill + n);
                        in.get(body, bodyFill, n);
                        bodyFill += n;
                        if (bodyFill == bodyNeed) {
                            endBody(out);
                        }
                    }
                    case PAYLOAD -> {
                        int n = Math.min(payloadLeft, in.remaining());
                        if (payloadWrite != null) {
                            ByteBuffer src = in.duplicate();
                            src.limit(src.position() + n);
                            payloadWrite.put(src);
                        }
                        in.position(in.position() + n);
                        payloadLeft -= n;
                        if (payloadLeft == 0) {
                            emitPending(out);
                        }
                    }
                    default -> throw new IllegalStateException(state.name());
                }
            }
        } catch (ProtocolException e) {
            throw fail(e);
        }
    }

    private ProtocolException fail(ProtocolException e) {
        state = State.FAILED;
        failure = e;
        pending = null;
        payloadWrite = null;
        return e;
    }

    private void ensureBody(int size) {
        if (size > body.length) {
            body = java.util.Arrays.copyOf(body, (int) Math.min(bodyNeed, Math.max(size, 2L * body.length)));
        }
    }

    // ---------------------------------------------------------------------------------------- header

    private void beginFrame(Consumer<? super Frame> out) throws ProtocolException {
        ByteBuffer h = ByteBuffer.wrap(header);
        long len = Integer.toUnsignedLong(h.getInt());
        int code = h.get() & 0xff;
        int flags = h.get() & 0xff;
        int reserved = h.getShort() & 0xffff;
        long sid = Integer.toUnsignedLong(h.getInt());
        FrameType t = FrameType.fromCode(code);
        if (t == null) {
            throw new ProtocolException(String.format("unknown frame type 0x%02x", code));
        }
        if (flags != 0 || reserved != 0) {
            throw new ProtocolException(t + ": flags and reserved bits must be zero");
        }
        if (t.connectionLevel() && sid != 0) {
            throw new ProtocolException(t + " must be sent on stream 0, not " + sid);
        }
        if (t.isData()) {
            if (len < t.fixedPart()) {
                throw new ProtocolException(t + ": frame of " + len + " bytes is shorter than its fixed part");
            }
            if (len - t.fixedPart() > maxPayload) {
                throw new ProtocolException(
                        t + ": payload of " + (len - t.fixedPart()) + " bytes exceeds the limit " + maxPayload);
            }
            bodyNeed = t.fixedPart();
        } else {
            if (len > maxControl) {
                throw new ProtocolException(t + ": body of " + len + " bytes exceeds the limit " + maxControl);
            }
            bodyNeed = (int) len;
        }
        type = t;
        stream = sid;
        length = (int) len;
        bodyFill = 0;
        state = State.BODY;
        if (bodyNeed == 0) {
            endBody(out);
        }
    }

    private void endBody(Consumer<? super Frame> out) throws ProtocolException {
        state = State.HEADER;
        if (type.isData()) {
            beginPayload(out);
        } else {
            out.accept(decodeControl(type, stream, body, 0, bodyNeed));
        }
        if (body.length > KEEP_BODY) {
            body = new byte[INITIAL_BODY];
        }
    }

    // ---------------------------------------------------------------------------------------- data frames

    private void beginPayload(Consumer<? super Frame> out) throws ProtocolException {
        ByteBuffer fixed = ByteBuffer.wrap(body, 0, bodyNeed);
        int payloadLength = length - bodyNeed;
        long sequence = Integer.toUnsignedLong(fixed.getInt());
        if (type == FrameType.BUFFER_RESPONSE) {
            long backlog = Integer.toUnsignedLong(fixed.getInt());
            int kindCode = fixed.getShort() & 0xffff;
            fixed.getShort(); // reserved: receivers ignore it (§7.6)
            long crc = Integer.toUnsignedLong(fixed.getInt());
            BufferKind kind = BufferKind.fromCode(kindCode);
            if (kind == null) {
                throw new ProtocolException("BufferResponse: unknown kind " + kindCode);
            }
            if (kind != BufferKind.DATA) {
                if (payloadLength != 0 || crc != 0) {
                    throw new ProtocolException("BufferResponse: an event carries no payload and a zero crc");
                }
                out.accept(new Frame.BufferResponse(stream, sequence, backlog, kind, 0, null, 0));
                return;
            }
            ByteBuffer region = target(payloadLength);
            pending = new Frame.BufferResponse(stream, sequence, backlog, kind, payloadLength, region, crc);
            startPayload(region, payloadLength, out);
        } else {
            long crc = Integer.toUnsignedLong(fixed.getInt());
            ByteBuffer region = target(payloadLength);
            pending = new Frame.PushData(stream, sequence, payloadLength, region, crc);
            startPayload(region, payloadLength, out);
        }
    }

    private ByteBuffer target(int payloadLength) throws ProtocolException {
        ByteBuffer t = sink.target(type, stream, payloadLength);
        if (t == null) {
            return null;
        }
        if (t.remaining() != payloadLength) {
            throw new IllegalStateException(
                    "payload sink returned " + t.remaining() + " bytes for a payload of " + payloadLength);
        }
        return t.slice();
    }

    private void startPayload(ByteBuffer region, int payloadLength, Consumer<? super Frame> out) {
        payloadWrite = region == null ? null : region.duplicate();
        payloadLeft = payloadLength;
        if (payloadLength == 0) {
            emitPending(out);
        } else {
            state = State.PAYLOAD;
        }
    }

    private void emitPending(Consumer<? super Frame> out) {
        Frame f = pending;
        pending = null;
        payloadWrite = null;
        state = State.HEADER;
        out.accept(f);
    }

    // ---------------------------------------------------------------------------------------- control frames

    /** Decodes the body of a control frame (everything but BufferResponse and PushData). */
    public static Frame decodeControl(FrameType type, long stream, byte[] buf, int off, int len)
            throws ProtocolException {
        String name = type.name();
        switch (type) {
            case HELLO, HELLO_ACK:
                return decodeHello(type, buf, off, len);
            case AUTH_CHALLENGE: {
                Map<String, Object> m = new MsgPack.Reader(buf, off, len, name).readWholeMap();
                return new Frame.AuthChallenge(str(m, "nonce", name), str(m, "proof", name));
            }
            case AUTH_RESPONSE: {
                Map<String, Object> m = new MsgPack.Reader(buf, off, len, name).readWholeMap();
                return new Frame.AuthResponse(str(m, "proof", name));
            }
            case ERROR: {
                if (len < Wire.ERROR_FIXED) {
                    throw new ProtocolException("Error: body shorter than its code");
                }
                int code = ((buf[off] & 0xff) << 8) | (buf[off + 1] & 0xff);
                // lenient: malformed UTF-8 becomes U+FFFD (§7.2)
                String message = new String(buf, off + 2, len - 2, StandardCharsets.UTF_8);
                return new Frame.ErrorResponse(stream, code, message);
            }
            case CLOSE, CANCEL_PARTITION_REQUEST, ABORT_MAP_OUTPUT, ABORT_ACK: {
                if (len != 0) {
                    throw new ProtocolException(name + ": must have an empty body");
                }
                return switch (type) {
                    case CLOSE -> new Frame.Close();
                    case CANCEL_PARTITION_REQUEST -> new Frame.CancelPartitionRequest(stream);
                    case ABORT_MAP_OUTPUT -> new Frame.AbortMapOutput(stream);
                    default -> new Frame.AbortAck(stream);
                };
            }
            case ADD_CREDIT: {
                long credit = u32Body(buf, off, len, name);
                if (credit == 0) {
                    throw new ProtocolException("AddCredit: credit must be positive");
                }
                return new Frame.AddCredit(stream, credit);
            }
            case PUSH_CREDIT: {
                long credit = u32Body(buf, off, len, name);
                if (credit == 0) {
                    throw new ProtocolException("PushCredit: credit must be positive");
                }
                return new Frame.PushCredit(stream, credit);
            }
            case PUSH_SLOTS:
                return new Frame.PushSlots(stream, u32Entries(buf, off, len, 4, name));
            case PUSH_PLACED:
                return new Frame.PushPlaced(stream, u32Entries(buf, off, len, Wire.PUSH_PLACED_FIXED, name));
            case BUFFER_PLACED:
                return new Frame.BufferPlaced(stream, u32Entries(buf, off, len, Wire.BUFFER_PLACED_FIXED, name));
            case RETURN_SLOTS:
                return new Frame.ReturnSlots(u32Entries(buf, off, len, 4, name));
            case COMMIT_MAP_OUTPUT:
                return new Frame.CommitMapOutput(stream, u32Body(buf, off, len, name));
            case COMMIT_ACK: {
                if (len < 4) {
                    throw new ProtocolException("CommitAck: body shorter than its count");
                }
                ByteBuffer b = ByteBuffer.wrap(buf, off, len);
                long n = Integer.toUnsignedLong(b.getInt());
                if (len != 4 + 8 * n) {
                    throw new ProtocolException(
                            "CommitAck: " + n + " lengths need " + (4 + 8 * n) + " bytes, got " + len);
                }
                long[] lengths = new long[(int) n];
                for (int i = 0; i < n; i++) {
                    lengths[i] = b.getLong();
                }
                return new Frame.CommitAck(stream, lengths);
            }
            case PARTITION_REQUEST: {
                if (len < 4) {
                    throw new ProtocolException("PartitionRequest: body shorter than its credit");
                }
                long credit = Integer.toUnsignedLong(ByteBuffer.wrap(buf, off, 4).getInt());
                Map<String, Object> m = new MsgPack.Reader(buf, off + 4, len - 4, name).readWholeMap();
                return new Frame.PartitionRequest(
                        stream,
                        credit,
                        str(m, "app", name),
                        int64(m, "shuffle", name),
                        int64(m, "start", name),
                        int64(m, "end", name),
                        locations(m.get("locations")),
                        optionalStr(m, "token", name));
            }
            case OPEN_MAP_OUTPUT: {
                Map<String, Object> m = new MsgPack.Reader(buf, off, len, name).readWholeMap();
                return new Frame.OpenMapOutput(
                        stream,
                        str(m, "app", name),
                        int64(m, "shuffle", name),
                        int64(m, "map_index", name),
                        u64(m.get("attempt"), name + ": field 'attempt'"),
                        int64(m, "partitions", name),
                        optionalStr(m, "token", name),
                        replicas(m, name),
                        oneOf(m, "durability", Wire.DURABILITIES, name),
                        oneOf(m, "fsync", Wire.FSYNCS, name));
            }
            case ADMIN_REQUEST: {
                Map<String, Object> m = new MsgPack.Reader(buf, off, len, name).readWholeMap();
                String op = str(m, "op", name);
                Map<String, Object> args = Map.of();
                if (m.containsKey("args")) {
                    if (!(m.get("args") instanceof Map<?, ?>)) {
                        throw new ProtocolException("AdminRequest: 'args' must be a map");
                    }
                    args = asMap(m.get("args"));
                }
                return new Frame.AdminRequest(stream, op, args);
            }
            case ADMIN_RESPONSE:
                return new Frame.AdminResponse(stream, new MsgPack.Reader(buf, off, len, name).readWholeMap());
            default:
                throw new IllegalArgumentException(name + " is not a control frame");
        }
    }

    private static Frame decodeHello(FrameType type, byte[] buf, int off, int len) throws ProtocolException {
        String name = type == FrameType.HELLO ? "Hello" : "HelloAck";
        if (len < Wire.HELLO_FIXED) {
            throw new ProtocolException(name + ": body shorter than its fixed part");
        }
        ByteBuffer b = ByteBuffer.wrap(buf, off, len);
        int magic = b.getInt();
        int version = b.getShort() & 0xffff;
        int roleCode = b.get() & 0xff;
        if (magic != Wire.MAGIC) {
            throw new ProtocolException(name + String.format(": bad magic 0x%08x", magic));
        }
        if (version != Wire.VERSION) {
            throw new ProtocolException(
                    ErrorCode.UNSUPPORTED_VERSION,
                    "protocol version " + version + " not supported (this side speaks " + Wire.VERSION + ")");
        }
        Role role = Role.fromCode(roleCode);
        if (role == null) {
            throw new ProtocolException(name + ": unknown role " + roleCode);
        }
        Map<String, Object> info =
                new MsgPack.Reader(buf, off + Wire.HELLO_FIXED, len - Wire.HELLO_FIXED, name).readWholeMap();
        optional(info, "name", String.class, name);
        String node = optional(info, "node", String.class, name);
        Long segmentSize = optional(info, "segment_size", Long.class, name);
        if (type == FrameType.HELLO) {
            if (role == Role.DAEMON && (node == null || node.isEmpty())) {
                throw new ProtocolException("Hello: a daemon's Hello must name its node address");
            }
            return new Frame.Hello(role, version, info);
        }
        if (segmentSize != null
                && (segmentSize < Wire.SEGMENT_SIZE_UNIT
                        || segmentSize > Integer.MAX_VALUE
                        || segmentSize % Wire.SEGMENT_SIZE_UNIT != 0)) {
            throw new ProtocolException("HelloAck: segment_size " + segmentSize + " is not a positive multiple of "
                    + Wire.SEGMENT_SIZE_UNIT);
        }
        return new Frame.HelloAck(role, version, info);
    }

    // ---------------------------------------------------------------------------------------- fields

    /**
     * A body of one or more entries of {@code entry} bytes of u32s (PushSlots, PushPlaced, BufferPlaced,
     * ReturnSlots), as one array.
     */
    private static long[] u32Entries(byte[] buf, int off, int len, int entry, String name) throws ProtocolException {
        if (len == 0 || len % entry != 0) {
            String what = entry == 4 ? "u32s" : "entries of " + entry + " bytes";
            throw new ProtocolException(name + ": body must be one or more " + what + ", got " + len + " bytes");
        }
        ByteBuffer b = ByteBuffer.wrap(buf, off, len);
        long[] values = new long[len / 4];
        for (int i = 0; i < values.length; i++) {
            values[i] = Integer.toUnsignedLong(b.getInt());
        }
        return values;
    }

    private static long u32Body(byte[] buf, int off, int len, String name) throws ProtocolException {
        if (len != 4) {
            throw new ProtocolException(name + ": body must be 4 bytes, got " + len);
        }
        return Integer.toUnsignedLong(ByteBuffer.wrap(buf, off, 4).getInt());
    }

    private static ProtocolException wrongType(String what, String key) {
        return new ProtocolException(what + ": field '" + key + "' missing or of the wrong type");
    }

    private static String optionalStr(Map<String, Object> m, String key, String what) throws ProtocolException {
        return m.get(key) == null ? null : str(m, key, what);
    }

    private static String str(Map<String, Object> m, String key, String what) throws ProtocolException {
        if (m.get(key) instanceof String s) {
            return s;
        }
        throw wrongType(what, key);
    }

    /** An int field: any msgpack integer that fits a signed long (never a bool). */
    private static long int64(Map<String, Object> m, String key, String what) throws ProtocolException {
        Object v = m.get(key);
        if (v instanceof Long n) {
            return n;
        }
        if (v instanceof BigInteger) {
            throw new ProtocolException(what + ": field '" + key + "' is out of range (" + v + ")");
        }
        throw wrongType(what, key);
    }

    /** OpenMapOutput's optional {@code replicas} (§7.8): 1..MAX_REPLICAS, or 0 when absent. */
    private static int replicas(Map<String, Object> m, String what) throws ProtocolException {
        if (m.get("replicas") == null) {
            return 0;
        }
        long n = int64(m, "replicas", what);
        if (n < 1 || n > Wire.MAX_REPLICAS) {
            throw new ProtocolException(what + ": 'replicas' must be an integer in 1.." + Wire.MAX_REPLICAS);
        }
        return (int) n;
    }

    /**
     * An optional string key whose values are a closed set (OpenMapOutput's {@code durability} and {@code fsync},
     * §7.8): null when absent; any other value is a fatal PROTOCOL error.
     */
    private static String oneOf(Map<String, Object> m, String key, List<String> values, String what)
            throws ProtocolException {
        String value = optionalStr(m, key, what);
        if (value != null && !values.contains(value)) {
            throw new ProtocolException(what + ": '" + key + "' must be one of " + values);
        }
        return value;
    }

    /** A u64 field: a msgpack integer in 0..2^64−1, returned as the bits of a long. */
    private static long u64(Object v, String what) throws ProtocolException {
        if (v instanceof Long n) {
            if (n < 0) {
                throw new ProtocolException(what + " must be an unsigned 64-bit integer, got " + n);
            }
            return n;
        }
        if (v instanceof BigInteger b) {
            return b.longValue(); // the reader only produces BigInteger for 2^63..2^64-1
        }
        throw new ProtocolException(what + " missing or not an integer");
    }

    private static <T> T optional(Map<String, Object> m, String key, Class<T> cls, String what)
            throws ProtocolException {
        if (!m.containsKey(key)) {
            return null;
        }
        Object v = m.get(key);
        if (!cls.isInstance(v)) {
            throw new ProtocolException(what + ": info '" + key + "' must be " + (cls == Long.class ? "an int"
                    : "a str") + ", got " + MsgPack.describe(v));
        }
        return cls.cast(v);
    }

    @SuppressWarnings("unchecked")
    private static Map<String, Object> asMap(Object v) {
        return (Map<String, Object>) v;
    }

    private static Map<String, long[]> locations(Object value) throws ProtocolException {
        if (!(value instanceof Map<?, ?>)) {
            throw new ProtocolException("PartitionRequest: 'locations' must be a map");
        }
        Map<String, long[]> out = new LinkedHashMap<>();
        for (Map.Entry<String, Object> e : asMap(value).entrySet()) {
            if (!(e.getValue() instanceof List<?> attempts)) {
                throw new ProtocolException("PartitionRequest: 'locations' maps address strings to attempt lists");
            }
            long[] ids = new long[attempts.size()];
            for (int i = 0; i < ids.length; i++) {
                ids[i] = u64(attempts.get(i), "PartitionRequest: attempt id");
            }
            out.put(e.getKey(), ids);
        }
        return out;
    }
}
