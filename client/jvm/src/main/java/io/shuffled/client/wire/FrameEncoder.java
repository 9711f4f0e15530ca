package io.shuffled.client.wire;

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.Map;

/**
 * Frames to bytes (PROTOCOL.md §4, §7). Stateless and thread-safe.
 *
 * <p>Control frames are built whole ({@link #encode(Frame)}). For data frames a connection can write
 * the header and fixed part with {@link #writeBufferResponsePrefix} / {@link #writePushDataPrefix} and
 * then the payload from where it already lies (gathering write), without copying it.
 *
 * <p>msgpack maps are written with the keys in the order §7 lists them and every integer, string and
 * header in its shortest form, which is what the golden vectors contain.
 */
public final class FrameEncoder {
    private FrameEncoder() {}

    /** Header + fixed part of a BufferResponse. */
    public static final int BUFFER_RESPONSE_PREFIX = Wire.HEADER_SIZE + Wire.BUFFER_RESPONSE_FIXED;
    /** Header + fixed part of a PushData. */
    public static final int PUSH_DATA_PREFIX = Wire.HEADER_SIZE + Wire.PUSH_DATA_FIXED;

    /** The whole frame as a new array. */
    public static byte[] encode(Frame frame) {
        if (frame instanceof Frame.BufferResponse b) {
            ByteBuffer out = ByteBuffer.allocate(BUFFER_RESPONSE_PREFIX + b.length());
            writeBufferResponsePrefix(out, b.receiver(), b.sequence(), b.backlog(), b.kind(), b.length(), b.crc());
            putPayload(out, b.payload(), b.length());
            return out.array();
        }
        if (frame instanceof Frame.PushData p) {
            ByteBuffer out = ByteBuffer.allocate(PUSH_DATA_PREFIX + p.length());
            writePushDataPrefix(out, p.writer(), p.sequence(), p.length(), p.crc());
            putPayload(out, p.payload(), p.length());
            return out.array();
        }
        byte[] body = controlBody(frame);
        ByteBuffer out = ByteBuffer.allocate(Wire.HEADER_SIZE + body.length);
        writeHeader(out, frame.type(), frame.stream(), body.length);
        out.put(body);
        return out.array();
    }

    /** Appends the whole frame to {@code out} (its position advances). */
    public static void encode(Frame frame, ByteBuffer out) {
        out.put(encode(frame));
    }

    /** The 12-byte header: length, type, flags 0, reserved 0, stream (§4). */
    public static void writeHeader(ByteBuffer out, FrameType type, long stream, long bodyLength) {
        Wire.checkU32("body length", bodyLength);
        Wire.checkU32("stream", stream);
        out.putInt((int) bodyLength).put((byte) type.code()).put((byte) 0).putShort((short) 0).putInt((int) stream);
    }

    /** Header and fixed part of a BufferResponse whose payload of {@code payloadLength} bytes follows. */
    public static void writeBufferResponsePrefix(
            ByteBuffer out, long receiver, long sequence, long backlog, BufferKind kind, int payloadLength, long crc) {
        if (kind != BufferKind.DATA && (payloadLength != 0 || crc != 0)) {
            throw new IllegalArgumentException("an END_OF_PARTITION event carries no payload");
        }
        if (payloadLength < 0) {
            throw new IllegalArgumentException("negative payload length");
        }
        writeHeader(out, FrameType.BUFFER_RESPONSE, receiver, (long) Wire.BUFFER_RESPONSE_FIXED + payloadLength);
        out.putInt((int) Wire.checkU32("sequence", sequence))
                .putInt((int) Wire.checkU32("backlog", backlog))
                .putShort((short) kind.code())
                .putShort((short) 0)
                .putInt((int) Wire.checkU32("crc", crc));
    }

    /**
     * Header and fixed part of a PushData whose payload of {@code payloadLength} bytes follows, with the
     * payload's CRC32C ({@link Wire#crc32c}).
     */
    public static void writePushDataPrefix(ByteBuffer out, long writer, long sequence, int payloadLength, long crc) {
        if (payloadLength < 0) {
            throw new IllegalArgumentException("negative payload length");
        }
        writeHeader(out, FrameType.PUSH_DATA, writer, (long) Wire.PUSH_DATA_FIXED + payloadLength);
        out.putInt((int) Wire.checkU32("sequence", sequence)).putInt((int) Wire.checkU32("crc", crc));
    }

    /**
     * A PushPlaced (§7.10a) of the first {@code groups} entries already in {@code frame} after its header (see
     * {@link #putPlacedEntry}): its header written in place, without allocating. Returns the frame's length.
     */
    public static int writePushPlacedHeader(byte[] frame, long writer, int groups) {
        if (groups <= 0) {
            throw new IllegalArgumentException("a PushPlaced names at least one group");
        }
        int body = groups * Wire.PUSH_PLACED_FIXED;
        writeHeader(ByteBuffer.wrap(frame), FrameType.PUSH_PLACED, writer, body);
        return Wire.HEADER_SIZE + body;
    }

    /** The {@code index}th group's entry of a PushPlaced being built in {@code frame}. */
    public static void putPlacedEntry(byte[] frame, int index, long sequence, long crc, long slot, int length) {
        ByteBuffer.wrap(frame, Wire.HEADER_SIZE + index * Wire.PUSH_PLACED_FIXED, Wire.PUSH_PLACED_FIXED)
                .putInt((int) Wire.checkU32("sequence", sequence)).putInt((int) Wire.checkU32("crc", crc))
                .putInt((int) Wire.checkU32("slot", slot)).putInt(length);
    }

    private static void putPayload(ByteBuffer out, ByteBuffer payload, int length) {
        if (payload == null) {
            if (length != 0) {
                throw new IllegalArgumentException("cannot encode a data frame whose payload was discarded");
            }
            return;
        }
        out.put(payload.duplicate());
    }

    /** The body of a control frame (everything but BufferResponse and PushData). */
    public static byte[] controlBody(Frame frame) {
        byte[] body = controlBodyUnchecked(frame);
        if (body.length > Wire.MAX_CONTROL_BODY) {
            throw new IllegalArgumentException(
                    frame.type() + " body of " + body.length + " bytes exceeds the limit " + Wire.MAX_CONTROL_BODY);
        }
        return body;
    }

    private static byte[] controlBodyUnchecked(Frame frame) {
        if (frame instanceof Frame.Hello h) {
            return hello(h.version(), h.role(), h.info());
        }
        if (frame instanceof Frame.HelloAck h) {
            return hello(h.version(), h.role(), h.info());
        }
        if (frame instanceof Frame.ErrorResponse e) {
            byte[] text = e.message().getBytes(StandardCharsets.UTF_8); // lone surrogates become '?'
            return ByteBuffer.allocate(Wire.ERROR_FIXED + text.length).putShort((short) e.code()).put(text).array();
        }
        if (frame instanceof Frame.AuthChallenge c) {
            MsgPack.Writer w = new MsgPack.Writer();
            w.writeMapHeader(2);
            w.writeString("nonce").writeString(c.nonce());
            w.writeString("proof").writeString(c.proof());
            return w.toByteArray();
        }
        if (frame instanceof Frame.AuthResponse r) {
            MsgPack.Writer w = new MsgPack.Writer();
            w.writeMapHeader(1);
            w.writeString("proof").writeString(r.proof());
            return w.toByteArray();
        }
        if (frame instanceof Frame.Close
                || frame instanceof Frame.CancelPartitionRequest
                || frame instanceof Frame.AbortMapOutput
                || frame instanceof Frame.AbortAck) {
            return new byte[0];
        }
        if (frame instanceof Frame.PartitionRequest p) {
            MsgPack.Writer w = new MsgPack.Writer(128);
            w.writeMapHeader(p.token() == null ? 5 : 6);
            w.writeString("app").writeString(p.app());
            w.writeString("shuffle").writeSigned(p.shuffle());
            w.writeString("start").writeSigned(p.start());
            w.writeString("end").writeSigned(p.end());
            w.writeString("locations").writeMapHeader(p.locations().size());
            for (Map.Entry<String, long[]> e : p.locations().entrySet()) {
                w.writeString(e.getKey()).writeArrayHeader(e.getValue().length);
                for (long attempt : e.getValue()) {
                    w.writeUnsigned(attempt);
                }
            }
            if (p.token() != null) {
                w.writeString("token").writeString(p.token());
            }
            ByteBuffer out = ByteBuffer.allocate(4 + w.size()).putInt((int) p.credit());
            w.writeTo(out);
            return out.array();
        }
        if (frame instanceof Frame.AddCredit a) {
            return u32(a.credit());
        }
        if (frame instanceof Frame.OpenMapOutput m) {
            MsgPack.Writer w = new MsgPack.Writer(96);
            w.writeMapHeader(5 + (m.token() == null ? 0 : 1) + (m.replicas() == 0 ? 0 : 1)
                    + (m.durability() == null ? 0 : 1) + (m.fsync() == null ? 0 : 1));
            w.writeString("app").writeString(m.app());
            w.writeString("shuffle").writeSigned(m.shuffle());
            w.writeString("map_index").writeSigned(m.mapIndex());
            w.writeString("attempt").writeUnsigned(m.attempt());
            w.writeString("partitions").writeSigned(m.partitions());
            if (m.token() != null) {
                w.writeString("token").writeString(m.token());
            }
            if (m.replicas() != 0) {
                w.writeString("replicas").writeSigned(m.replicas());
            }
            if (m.durability() != null) {
                w.writeString("durability").writeString(m.durability());
            }
            if (m.fsync() != null) {
                w.writeString("fsync").writeString(m.fsync());
            }
            return w.toByteArray();
        }
        if (frame instanceof Frame.PushCredit c) {
            return u32(c.credit());
        }
        if (frame instanceof Frame.PushSlots s) {
            return u32s(s.slots());
        }
        if (frame instanceof Frame.PushPlaced p) {
            return u32s(p.placed());
        }
        if (frame instanceof Frame.BufferPlaced p) {
            return u32s(p.placed());
        }
        if (frame instanceof Frame.ReturnSlots r) {
            return u32s(r.slots());
        }
        if (frame instanceof Frame.CommitMapOutput c) {
            return u32(c.pushes());
        }
        if (frame instanceof Frame.CommitAck c) {
            ByteBuffer out = ByteBuffer.allocate(4 + 8 * c.count()).putInt(c.count());
            for (int i = 0; i < c.count(); i++) {
                out.putLong(c.length(i));
            }
            return out.array();
        }
        if (frame instanceof Frame.AdminRequest r) {
            MsgPack.Writer w = new MsgPack.Writer();
            w.writeMapHeader(2);
            w.writeString("op").writeString(r.op());
            w.writeString("args").writeValue(r.args());
            return w.toByteArray();
        }
        if (frame instanceof Frame.AdminResponse r) {
            return new MsgPack.Writer().writeValue(r.result()).toByteArray();
        }
        throw new IllegalArgumentException(frame.type() + " is a data frame, not a control frame");
    }

    private static byte[] hello(int version, Role role, Map<String, Object> info) {
        MsgPack.Writer w = new MsgPack.Writer();
        w.writeValue(info);
        ByteBuffer out = ByteBuffer.allocate(Wire.HELLO_FIXED + w.size())
                .putInt(Wire.MAGIC)
                .putShort((short) version)
                .put((byte) role.code())
                .put((byte) 0);
        w.writeTo(out);
        return out.array();
    }

    private static byte[] u32s(U32s values) {
        ByteBuffer out = ByteBuffer.allocate(4 * values.size());
        for (int i = 0; i < values.size(); i++) {
            out.putInt((int) values.get(i));
        }
        return out.array();
    }

    private static byte[] u32(long value) {
        return ByteBuffer.allocate(4).putInt((int) value).array();
    }
}
