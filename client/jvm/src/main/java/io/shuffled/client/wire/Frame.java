package io.shuffled.client.wire;

import java.nio.ByteBuffer;
import java.util.Arrays;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;

/**
 * One decoded frame (PROTOCOL.md §7). Field names follow the golden vectors' JSON.
 *
 * <p>u32 fields are {@code long}s in 0..2^32−1, checked on construction. u64 fields (attempt ids,
 * commit lengths) are {@code long}s whose bits are the unsigned value. Constructors refuse values a
 * sender must never put on the wire (e.g. credit 0), so a frame that exists can be encoded.
 *
 * <p>Maps (Hello info, admin args and results) are normalized with {@link MsgPack#normalize} and
 * compare with {@code equals}. Payloads are {@link ByteBuffer}s holding exactly the payload between
 * position and limit (ByteBuffer equality compares content); a payload the decoder was told to discard
 * is {@code null} while {@code length} still says how long it was.
 */
public sealed interface Frame {
    FrameType type();

    /** The header's stream id (0 for connection-level frames). */
    long stream();

    /** Hello (0x01), sent first by the dialer (§6, §7.1). */
    record Hello(Role role, int version, Map<String, Object> info) implements Frame {
        public Hello {
            Objects.requireNonNull(role, "role");
            Wire.checkU16("version", version);
            info = MsgPack.normalizeMap(info);
        }

        public Hello(Role role, Map<String, ?> info) {
            this(role, Wire.VERSION, MsgPack.normalizeMap(info));
        }

        @Override
        public FrameType type() {
            return FrameType.HELLO;
        }

        @Override
        public long stream() {
            return 0;
        }
    }

    /** HelloAck (0x02), the acceptor's answer (§6, §7.1). */
    record HelloAck(Role role, int version, Map<String, Object> info) implements Frame {
        public HelloAck {
            Objects.requireNonNull(role, "role");
            Wire.checkU16("version", version);
            info = MsgPack.normalizeMap(info);
        }

        public HelloAck(Role role, Map<String, ?> info) {
            this(role, Wire.VERSION, MsgPack.normalizeMap(info));
        }

        /** The acceptor's node name, or null if it sent none. */
        public String node() {
            return info.get("node") instanceof String s ? s : null;
        }

        /** The announced segment size (the decoder has checked it), 32768 when absent (§7.1). */
        public int segmentSize() {
            return info.get("segment_size") instanceof Long n ? (int) (long) n : Wire.DEFAULT_SEGMENT_SIZE;
        }

        /** Whether the acceptor lists {@code feature} in {@code features}: both ends agreed on it (§6). */
        public boolean agrees(String feature) {
            return info.get("features") instanceof List<?> features && features.contains(feature);
        }

        @Override
        public FrameType type() {
            return FrameType.HELLO_ACK;
        }

        @Override
        public long stream() {
            return 0;
        }
    }

    /** Error (0x03): fatal on stream 0, ends one stream otherwise (§7.2, §8). */
    record ErrorResponse(long stream, int code, String message) implements Frame {
        public ErrorResponse {
            Wire.checkU32("stream", stream);
            Wire.checkU16("code", code);
            Objects.requireNonNull(message, "message");
        }

        public ErrorResponse(long stream, ErrorCode code, String message) {
            this(stream, code.code(), message);
        }

        /** What the code means; unknown codes are INTERNAL. */
        public ErrorCode errorCode() {
            return ErrorCode.fromWire(code);
        }

        public ShuffledException toException() {
            return ShuffledException.fromWire(code, message);
        }

        @Override
        public FrameType type() {
            return FrameType.ERROR;
        }
    }

    /** AuthChallenge (0x05), stream 0: the acceptor's nonce and proof (§6.1). */
    record AuthChallenge(String nonce, String proof) implements Frame {
        public AuthChallenge {
            Objects.requireNonNull(nonce, "nonce");
            Objects.requireNonNull(proof, "proof");
        }

        @Override
        public FrameType type() {
            return FrameType.AUTH_CHALLENGE;
        }

        @Override
        public long stream() {
            return 0;
        }
    }

    /** AuthResponse (0x06), stream 0: the dialer's proof, "" without a secret (§6.1). */
    record AuthResponse(String proof) implements Frame {
        public AuthResponse {
            Objects.requireNonNull(proof, "proof");
        }

        @Override
        public FrameType type() {
            return FrameType.AUTH_RESPONSE;
        }

        @Override
        public long stream() {
            return 0;
        }
    }

    /** Close (0x04), stream 0, empty (§7.3). */
    record Close() implements Frame {
        @Override
        public FrameType type() {
            return FrameType.CLOSE;
        }

        @Override
        public long stream() {
            return 0;
        }
    }

    /**
     * PartitionRequest (0x10): opens read stream {@code receiver} (§7.4). {@code locations} maps daemon
     * addresses ("" = the receiving daemon) to u64 map attempt ids, in wire order. {@code token}: the
     * application token (§6.2), null when the request carries none.
     */
    record PartitionRequest(
            long receiver,
            long credit,
            String app,
            long shuffle,
            long start,
            long end,
            Map<String, long[]> locations,
            String token)
            implements Frame {
        public PartitionRequest {
            Wire.checkU32("receiver", receiver);
            Wire.checkU32("credit", credit);
            Objects.requireNonNull(app, "app");
            Map<String, long[]> copy = new LinkedHashMap<>();
            for (Map.Entry<String, long[]> e : locations.entrySet()) {
                copy.put(Objects.requireNonNull(e.getKey(), "location address"), e.getValue().clone());
            }
            locations = Collections.unmodifiableMap(copy);
        }

        public PartitionRequest(
                long receiver, long credit, String app, long shuffle, long start, long end,
                Map<String, long[]> locations) {
            this(receiver, credit, app, shuffle, start, end, locations, null);
        }

        @Override
        public FrameType type() {
            return FrameType.PARTITION_REQUEST;
        }

        @Override
        public long stream() {
            return receiver;
        }

        @Override
        public boolean equals(Object o) {
            if (!(o instanceof PartitionRequest p)) {
                return false;
            }
            if (receiver != p.receiver || credit != p.credit || shuffle != p.shuffle || start != p.start
                    || end != p.end || !app.equals(p.app) || !Objects.equals(token, p.token)
                    || locations.size() != p.locations.size()) {
                return false;
            }
            for (Map.Entry<String, long[]> e : locations.entrySet()) {
                long[] other = p.locations.get(e.getKey());
                if (other == null || !Arrays.equals(e.getValue(), other)) {
                    return false;
                }
            }
            return true;
        }

        @Override
        public int hashCode() {
            int h = Objects.hash(receiver, credit, app, shuffle, start, end, token);
            for (Map.Entry<String, long[]> e : locations.entrySet()) {
                h += e.getKey().hashCode() ^ Arrays.hashCode(e.getValue()); // order-independent, like Map
            }
            return h;
        }

        @Override
        public String toString() {
            StringBuilder sb = new StringBuilder("PartitionRequest[receiver=").append(receiver)
                    .append(", credit=").append(credit).append(", app=").append(app)
                    .append(", shuffle=").append(shuffle).append(", start=").append(start)
                    .append(", end=").append(end).append(", locations={");
            String sep = "";
            for (Map.Entry<String, long[]> e : locations.entrySet()) {
                sb.append(sep).append('"').append(e.getKey()).append("\"=").append(unsignedList(e.getValue()));
                sep = ", ";
            }
            return sb.append("}, token=").append(token).append(']').toString();
        }
    }

    /** AddCredit (0x11): {@code credit} (> 0) more data buffers on read stream {@code receiver} (§7.5). */
    record AddCredit(long receiver, long credit) implements Frame {
        public AddCredit {
            Wire.checkU32("receiver", receiver);
            Wire.checkU32("credit", credit);
            if (credit == 0) {
                throw new IllegalArgumentException("credit must be > 0");
            }
        }

        @Override
        public FrameType type() {
            return FrameType.ADD_CREDIT;
        }

        @Override
        public long stream() {
            return receiver;
        }
    }

    /**
     * BufferResponse (0x12): a data buffer or the END_OF_PARTITION event of read stream {@code receiver}
     * (§7.6). A DATA payload is one or more packed groups ({@link PackedGroups}). An event has length 0, a
     * null payload and crc 0. {@code crc} is the CRC32C (u32) the sender put in the frame; the receiver
     * compares it with the payload's.
     */
    record BufferResponse(long receiver, long sequence, long backlog, BufferKind kind, int length, ByteBuffer payload,
            long crc) implements Frame {
        public BufferResponse {
            Wire.checkU32("crc", crc);
            Wire.checkU32("receiver", receiver);
            Wire.checkU32("sequence", sequence);
            Wire.checkU32("backlog", backlog);
            Objects.requireNonNull(kind, "kind");
            if (length < 0) {
                throw new IllegalArgumentException("negative payload length");
            }
            if (kind == BufferKind.END_OF_PARTITION) {
                if (length != 0 || (payload != null && payload.hasRemaining())) {
                    throw new IllegalArgumentException("an END_OF_PARTITION event carries no payload");
                }
                payload = null;
                if (crc != 0) {
                    throw new IllegalArgumentException("an END_OF_PARTITION event has crc 0");
                }
            } else if (payload != null && payload.remaining() != length) {
                throw new IllegalArgumentException(
                        "payload has " + payload.remaining() + " bytes, length says " + length);
            }
        }

        /** A DATA buffer whose payload is {@code payload}'s remaining bytes, with their crc. */
        public static BufferResponse data(long receiver, long sequence, long backlog, ByteBuffer payload) {
            return new BufferResponse(receiver, sequence, backlog, BufferKind.DATA, payload.remaining(), payload,
                    Wire.crc32c(payload));
        }

        /** The END_OF_PARTITION event (no payload). */
        public static BufferResponse endOfPartition(long receiver, long sequence) {
            return new BufferResponse(receiver, sequence, 0, BufferKind.END_OF_PARTITION, 0, null, 0);
        }

        public boolean isEvent() {
            return kind != BufferKind.DATA;
        }

        @Override
        public FrameType type() {
            return FrameType.BUFFER_RESPONSE;
        }

        @Override
        public long stream() {
            return receiver;
        }
    }

    /** CancelPartitionRequest (0x13): the opener no longer wants read stream {@code receiver} (§7.7). */
    record CancelPartitionRequest(long receiver) implements Frame {
        public CancelPartitionRequest {
            Wire.checkU32("receiver", receiver);
        }

        @Override
        public FrameType type() {
            return FrameType.CANCEL_PARTITION_REQUEST;
        }

        @Override
        public long stream() {
            return receiver;
        }
    }

    /**
     * OpenMapOutput (0x20): opens push stream {@code writer} for one map attempt (§7.8); attempt is a u64.
     * {@code replicas}: copies wanted, 1..{@link Wire#MAX_REPLICAS}, or 0 to leave it to the daemon (the key
     * is then absent). {@code durability}: one of {@link Wire#DURABILITIES} (§12.5), or null to leave it to the
     * daemon (absent). {@code fsync}: {@code "commit"} ({@link Wire#FSYNCS}) so that the CommitAck means the
     * output survives a power loss, or null for the daemon's own {@code fsync} setting (absent). The daemon-only
     * keys ({@code replica_of}, {@code app_key}) are not a client's to send.
     */
    record OpenMapOutput(long writer, String app, long shuffle, long mapIndex, long attempt, long partitions,
            String token, int replicas, String durability, String fsync) implements Frame {
        public OpenMapOutput {
            Wire.checkU32("writer", writer);
            Objects.requireNonNull(app, "app");
            if (replicas < 0 || replicas > Wire.MAX_REPLICAS) {
                throw new IllegalArgumentException("replicas must be 1.." + Wire.MAX_REPLICAS + " (or 0: unset)");
            }
            if (durability != null && !Wire.DURABILITIES.contains(durability)) {
                throw new IllegalArgumentException("durability must be one of " + Wire.DURABILITIES + " (or null)");
            }
            if (fsync != null && !Wire.FSYNCS.contains(fsync)) {
                throw new IllegalArgumentException("fsync must be one of " + Wire.FSYNCS + " (or null)");
            }
        }

        /** With the daemon's fsync setting. */
        public OpenMapOutput(long writer, String app, long shuffle, long mapIndex, long attempt, long partitions,
                String token, int replicas, String durability) {
            this(writer, app, shuffle, mapIndex, attempt, partitions, token, replicas, durability, null);
        }

        /** With the daemon's durability and fsync settings. */
        public OpenMapOutput(long writer, String app, long shuffle, long mapIndex, long attempt, long partitions,
                String token, int replicas) {
            this(writer, app, shuffle, mapIndex, attempt, partitions, token, replicas, null, null);
        }

        /** With the daemon's number of copies. */
        public OpenMapOutput(
                long writer, String app, long shuffle, long mapIndex, long attempt, long partitions, String token) {
            this(writer, app, shuffle, mapIndex, attempt, partitions, token, 0);
        }

        /** Without an application token (§6.2), with the daemon's number of copies. */
        public OpenMapOutput(long writer, String app, long shuffle, long mapIndex, long attempt, long partitions) {
            this(writer, app, shuffle, mapIndex, attempt, partitions, null, 0);
        }

        @Override
        public FrameType type() {
            return FrameType.OPEN_MAP_OUTPUT;
        }

        @Override
        public long stream() {
            return writer;
        }
    }

    /** PushCredit (0x21): {@code credit} (> 0) more PushData frames on push stream {@code writer} (§7.9). */
    record PushCredit(long writer, long credit) implements Frame {
        public PushCredit {
            Wire.checkU32("writer", writer);
            Wire.checkU32("credit", credit);
            if (credit == 0) {
                throw new IllegalArgumentException("credit must be > 0");
            }
        }

        @Override
        public FrameType type() {
            return FrameType.PUSH_CREDIT;
        }

        @Override
        public long stream() {
            return writer;
        }
    }

    /**
     * PushData (0x22): exactly one packed group ({@link PackedGroups}) of push stream {@code writer} and its
     * CRC32C (§7.10).
     */
    record PushData(long writer, long sequence, int length, ByteBuffer payload, long crc) implements Frame {
        public PushData {
            Wire.checkU32("crc", crc);
            Wire.checkU32("writer", writer);
            Wire.checkU32("sequence", sequence);
            if (length < 0) {
                throw new IllegalArgumentException("negative payload length");
            }
            if (payload != null && payload.remaining() != length) {
                throw new IllegalArgumentException(
                        "payload has " + payload.remaining() + " bytes, length says " + length);
            }
        }

        /** With {@code payload}'s remaining bytes and their crc. */
        public PushData(long writer, long sequence, ByteBuffer payload) {
            this(writer, sequence, payload.remaining(), payload, Wire.crc32c(payload));
        }

        @Override
        public FrameType type() {
            return FrameType.PUSH_DATA;
        }

        @Override
        public long stream() {
            return writer;
        }
    }

    /** CommitMapOutput (0x23): the writer sent {@code pushes} PushData frames; commit them (§7.11). */
    record CommitMapOutput(long writer, long pushes) implements Frame {
        public CommitMapOutput {
            Wire.checkU32("writer", writer);
            Wire.checkU32("pushes", pushes);
        }

        @Override
        public FrameType type() {
            return FrameType.COMMIT_MAP_OUTPUT;
        }

        @Override
        public long stream() {
            return writer;
        }
    }

    /** CommitAck (0x24): u64 bytes stored per reduce partition (§7.12). */
    record CommitAck(long writer, long[] lengths) implements Frame {
        public CommitAck {
            Wire.checkU32("writer", writer);
            lengths = lengths.clone();
        }

        @Override
        public long[] lengths() {
            return lengths.clone();
        }

        /** Stored bytes of reduce partition {@code i} (unsigned). */
        public long length(int i) {
            return lengths[i];
        }

        public int count() {
            return lengths.length;
        }

        @Override
        public FrameType type() {
            return FrameType.COMMIT_ACK;
        }

        @Override
        public long stream() {
            return writer;
        }

        @Override
        public boolean equals(Object o) {
            return o instanceof CommitAck c && writer == c.writer && Arrays.equals(lengths, c.lengths);
        }

        @Override
        public int hashCode() {
            return Long.hashCode(writer) * 31 + Arrays.hashCode(lengths);
        }

        @Override
        public String toString() {
            return "CommitAck[writer=" + writer + ", lengths=" + unsignedList(lengths) + "]";
        }
    }

    /**
     * PushSlots (0x27): push credit on a connection with shared memory, one per slot named, each the place in
     * the connection's region where the writer may put one packed group (§6.3, §7.9a).
     */
    record PushSlots(long writer, U32s slots) implements Frame {
        public PushSlots {
            Wire.checkU32("writer", writer);
            Objects.requireNonNull(slots, "slots");
        }

        public PushSlots(long writer, long[] slots) {
            this(writer, new U32s("slots", slots, 1));
        }

        @Override
        public FrameType type() {
            return FrameType.PUSH_SLOTS;
        }

        @Override
        public long stream() {
            return writer;
        }
    }

    /**
     * PushPlaced (0x28): PushData for one or more packed groups the writer put in slots of the connection's region
     * (§6.3, §7.10a): {@code placed} holds each group's sequence, CRC32C, slot and length, one after the other.
     */
    record PushPlaced(long writer, U32s placed) implements Frame {
        public PushPlaced {
            Wire.checkU32("writer", writer);
            Objects.requireNonNull(placed, "placed");
        }

        public PushPlaced(long writer, long[] placed) {
            this(writer, new U32s("placed groups", placed, Wire.PLACED_FIELDS));
        }

        @Override
        public FrameType type() {
            return FrameType.PUSH_PLACED;
        }

        @Override
        public long stream() {
            return writer;
        }
    }

    /**
     * BufferPlaced (0x14): DATA BufferResponses for one or more buffers of read stream {@code receiver} the daemon
     * put in slots of the connection's region (§6.3, §7.6a): {@code placed} holds each one's sequence, backlog,
     * CRC32C, slot and length, one after the other.
     */
    record BufferPlaced(long receiver, U32s placed) implements Frame {
        public BufferPlaced {
            Wire.checkU32("receiver", receiver);
            Objects.requireNonNull(placed, "placed");
        }

        public BufferPlaced(long receiver, long[] placed) {
            this(receiver, new U32s("placed buffers", placed, Wire.BUFFER_PLACED_FIELDS));
        }

        @Override
        public FrameType type() {
            return FrameType.BUFFER_PLACED;
        }

        @Override
        public long stream() {
            return receiver;
        }
    }

    /** ReturnSlots (0x15): the client is done with these slots BufferPlaced named; on stream 0 (§6.3, §7.6b). */
    record ReturnSlots(U32s slots) implements Frame {
        public ReturnSlots {
            Objects.requireNonNull(slots, "slots");
        }

        public ReturnSlots(long[] slots) {
            this(new U32s("slots", slots, 1));
        }

        @Override
        public FrameType type() {
            return FrameType.RETURN_SLOTS;
        }

        @Override
        public long stream() {
            return 0;
        }
    }

    /** AbortMapOutput (0x25): discard push stream {@code writer} (§7.13). */
    record AbortMapOutput(long writer) implements Frame {
        public AbortMapOutput {
            Wire.checkU32("writer", writer);
        }

        @Override
        public FrameType type() {
            return FrameType.ABORT_MAP_OUTPUT;
        }

        @Override
        public long stream() {
            return writer;
        }
    }

    /** AbortAck (0x26) (§7.13). */
    record AbortAck(long writer) implements Frame {
        public AbortAck {
            Wire.checkU32("writer", writer);
        }

        @Override
        public FrameType type() {
            return FrameType.ABORT_ACK;
        }

        @Override
        public long stream() {
            return writer;
        }
    }

    /** AdminRequest (0x30) on admin stream {@code request} (§7.14, §13). */
    record AdminRequest(long request, String op, Map<String, Object> args) implements Frame {
        public AdminRequest {
            Wire.checkU32("request", request);
            Objects.requireNonNull(op, "op");
            args = MsgPack.normalizeMap(args);
        }

        @Override
        public FrameType type() {
            return FrameType.ADMIN_REQUEST;
        }

        @Override
        public long stream() {
            return request;
        }
    }

    /** AdminResponse (0x31): the result map of admin stream {@code request} (§7.14, §13). */
    record AdminResponse(long request, Map<String, Object> result) implements Frame {
        public AdminResponse {
            Wire.checkU32("request", request);
            result = MsgPack.normalizeMap(result);
        }

        @Override
        public FrameType type() {
            return FrameType.ADMIN_RESPONSE;
        }

        @Override
        public long stream() {
            return request;
        }
    }

    private static String unsignedList(long[] values) {
        StringBuilder sb = new StringBuilder("[");
        for (int i = 0; i < values.length; i++) {
            sb.append(i == 0 ? "" : ", ").append(Long.toUnsignedString(values[i]));
        }
        return sb.append(']').toString();
    }
}
