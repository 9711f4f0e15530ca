package io.shuffled.client;

import io.shuffled.client.wire.Frame;
import io.shuffled.client.wire.ProtocolException;
import io.shuffled.client.wire.Wire;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.MappedByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.LinkOption;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.Map;

/**
 * The connection's region of shared memory with its daemon (PROTOCOL.md §6.3): slots of the daemon's segment
 * size, where pushes put their packed groups and the daemon puts the buffers of reads, instead of sending them
 * through the socket.
 *
 * <p>Mapped in parts of at most 1 GiB (a {@link MappedByteBuffer} holds at most 2 GiB), each a whole number
 * of slots, so no slot straddles two parts. Writes use absolute puts: the task threads of an executor fill
 * different slots of one region at once. The daemon removes the file's name as soon as this client sends its
 * next frame; the mapping stays until the JVM unmaps it.
 */
final class SharedRegion {
    private static final long PART = 1L << 30;

    private final MappedByteBuffer[] parts;
    private final int slotSize;
    private final int slotsPerPart;
    private final long slots;

    private SharedRegion(MappedByteBuffer[] parts, int slotSize, int slotsPerPart, long slots) {
        this.parts = parts;
        this.slotSize = slotSize;
        this.slotsPerPart = slotsPerPart;
        this.slots = slots;
    }

    /**
     * The region a HelloAck gives, or null if it gives none; an IOException if it cannot be mapped (the
     * client then connects again without asking for one).
     */
    static SharedRegion of(Frame.HelloAck ack) throws IOException {
        if (!ack.agrees(Wire.SHM)) {
            return null;
        }
        if (!(ack.info().get(Wire.SHM) instanceof Map<?, ?> offer)
                || !(offer.get("path") instanceof String path)
                || !(offer.get("size") instanceof Long size)) {
            throw new IOException("the daemon's shm offer " + ack.info().get(Wire.SHM) + " names no region");
        }
        int slotSize = ack.segmentSize();
        if (size <= 0 || size % slotSize != 0) {
            throw new IOException("shared region of " + size + " bytes is not a whole number of slots");
        }
        try (FileChannel file = FileChannel.open(
                Path.of(path), StandardOpenOption.READ, StandardOpenOption.WRITE, LinkOption.NOFOLLOW_LINKS)) {
            if (file.size() != size) {
                throw new IOException("shared region " + path + " is " + file.size() + " bytes, not " + size);
            }
            int slotsPerPart = (int) (PART / slotSize);
            long partBytes = (long) slotsPerPart * slotSize;
            MappedByteBuffer[] parts = new MappedByteBuffer[(int) ((size + partBytes - 1) / partBytes)];
            for (int i = 0; i < parts.length; i++) {
                long start = i * partBytes;
                parts[i] = file.map(FileChannel.MapMode.READ_WRITE, start, Math.min(partBytes, size - start));
            }
            return new SharedRegion(parts, slotSize, slotsPerPart, size / slotSize);
        }
    }

    /** The first {@code length} bytes of {@code slot}, one {@link #check} took, copied to the heap. */
    ByteBuffer copy(long slot, long length) {
        byte[] out = new byte[(int) length];
        parts[(int) (slot / slotsPerPart)].get((int) (slot % slotsPerPart) * slotSize, out);
        return ByteBuffer.wrap(out);
    }

    /** A BufferPlaced entry names a slot of the region and a length a slot holds, or breaks the rules. */
    void check(long slot, long length) throws ProtocolException {
        if (slot >= slots || length < 1 || length > slotSize) {
            throw new ProtocolException("BufferPlaced: " + length + " bytes in slot " + slot + " (the region has "
                    + slots + " slots of " + slotSize + " bytes)");
        }
    }

    /** Puts {@code head} then {@code data} at the start of {@code slot}; they fit (a packed group's size). */
    void put(long slot, byte[] head, int headLength, byte[] data, int dataLength) {
        if (slot < 0 || slot >= slots || headLength + dataLength > slotSize) {
            throw new IllegalArgumentException("slot " + slot + " cannot take " + (headLength + dataLength) + " bytes");
        }
        MappedByteBuffer part = parts[(int) (slot / slotsPerPart)];
        int at = (int) (slot % slotsPerPart) * slotSize;
        part.put(at, head, 0, headLength);
        part.put(at + headLength, data, 0, dataLength);
    }
}
