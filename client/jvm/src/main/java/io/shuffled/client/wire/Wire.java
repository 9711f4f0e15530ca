package io.shuffled.client.wire;

import java.nio.ByteBuffer;

/**
 * Fixed numbers of the shuffled wire protocol, version 3 (proto/PROTOCOL.md).
 *
 * <p>All binary integers on the wire are big-endian and unsigned. This codec keeps u32 values in a
 * {@code long} (0..{@link #MAX_U32}) and u64 values in a {@code long} read as unsigned
 * ({@link Long#compareUnsigned}, {@link Long#toUnsignedString}), as PROTOCOL.md §16 recommends.
 */
public final class Wire {
    private Wire() {}

    /** {@code SHFD}, body offset 0 of Hello and HelloAck (§7.1). */
    public static final int MAGIC = 0x53484644;
    /** The one protocol version this codec speaks (§6). */
    public static final int VERSION = 3;

    /** length u32, type u8, flags u8, reserved u16, stream u32 (§4). */
    public static final int HEADER_SIZE = 12;
    /** magic, version u16, role u8, reserved u8 (§7.1). */
    public static final int HELLO_FIXED = 8;
    /** code u16 (§7.2). */
    public static final int ERROR_FIXED = 2;
    /** sequence u32, backlog u32, kind u16, reserved u16, crc u32 (§7.6). */
    public static final int BUFFER_RESPONSE_FIXED = 16;
    /** sequence u32, crc u32 (§7.10). */
    public static final int PUSH_DATA_FIXED = 8;
    /** One group of a PushPlaced body: sequence, crc, slot, length, u32 each (§7.10a); a body holds one or more. */
    public static final int PUSH_PLACED_FIXED = 16;
    /** u32s per group of a PushPlaced body. */
    public static final int PLACED_FIELDS = 4;
    /** One buffer of a BufferPlaced body: sequence, backlog, crc, slot, length, u32 each (§7.6a); one or more. */
    public static final int BUFFER_PLACED_FIXED = 20;
    /** u32s per buffer of a BufferPlaced body. */
    public static final int BUFFER_PLACED_FIELDS = 5;
    /** The Hello/HelloAck feature of pushes through shared memory (§6.3). */
    public static final String SHM = "shm";
    /** With {@link #SHM}: the daemon may put served buffers in the region too (§6.3). */
    public static final String SHM_READ = "shm-read";
    /** A packed group's attempt u64 and run count u32, before its directory (§3.3). */
    public static final int GROUP_HEADER = 12;
    /** One directory entry of a packed group: partition u32, length u32 (§3.3). */
    public static final int GROUP_RUN = 8;

    /** Largest body of any frame except BufferResponse and PushData (§9). */
    public static final int MAX_CONTROL_BODY = 8 << 20;
    /** Data payload limit until a HelloAck announces another segment size (§9). */
    public static final int DEFAULT_MAX_PAYLOAD = 32 << 10;
    /** Segment size to assume when a HelloAck has no {@code segment_size} (§7.1). */
    public static final int DEFAULT_SEGMENT_SIZE = 32 << 10;
    /** Segment sizes are multiples of this, and at least this (§7.1). */
    public static final int SEGMENT_SIZE_UNIT = 4096;
    /** Read and push streams one party may have open on a connection (§9). */
    public static final int MAX_STREAMS_PER_CONNECTION = 65536;
    /** Largest partition count of a shuffle (§9). */
    public static final long MAX_PARTITIONS = 1L << 24;
    /** What an OpenMapOutput may ask of its committed output ({@code durability}, §7.8, §12.5). */
    public static final java.util.List<String> DURABILITIES = java.util.List.of("none", "object-store");
    /** When an OpenMapOutput may ask its CommitAck to wait for an fsync of its output ({@code fsync}, §7.8). */
    public static final java.util.List<String> FSYNCS = java.util.List.of("commit");

    /** Most copies of one map output an OpenMapOutput may ask for ({@code replicas}, §7.8). */
    public static final int MAX_REPLICAS = 4;

    public static final long MAX_U32 = 0xFFFF_FFFFL;
    public static final int MAX_U16 = 0xFFFF;

    /** CRC32C of {@code payload}'s remaining bytes (its position is not moved): the data frames' {@code crc}. */
    public static long crc32c(ByteBuffer payload) {
        java.util.zip.CRC32C crc = new java.util.zip.CRC32C();
        crc.update(payload.duplicate());
        return crc.getValue();
    }

    static long checkU32(String what, long value) {
        if (value < 0 || value > MAX_U32) {
            throw new IllegalArgumentException(what + " must be a u32 (0.." + MAX_U32 + "), got " + value);
        }
        return value;
    }

    static int checkU16(String what, int value) {
        if (value < 0 || value > MAX_U16) {
            throw new IllegalArgumentException(what + " must be a u16 (0.." + MAX_U16 + "), got " + value);
        }
        return value;
    }
}
