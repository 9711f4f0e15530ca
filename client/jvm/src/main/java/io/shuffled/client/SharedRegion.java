package io.shuffled.client;

import io.shuffled.client.wire.Frame;
import io.shuffled.client.wire.ProtocolException;
import io.shuffled.client.wire.Wire;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.MappedByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.LinkOption;
import java.nio.file.OpenOption;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.Map;

/**
 * The connection's region of shared memory with its daemon (PROTOCOL.md §6.3): slots of the daemon's segment
 * size, where pushes put their packed groups (a file mapped read-write) and, with reads in place, the daemon
 * puts the buffers of reads (read slots, numbered on from the push slots, in a second file mapped read-only),
 * instead of sending them through the socket.
 *
 * <p>Each file is mapped in parts of at most 1 GiB (a {@link MappedByteBuffer} holds at most 2 GiB), each a
 * whole number of slots, so no slot straddles two parts. Writes use absolute puts: the task threads of an
 * executor fill different slots of one region at once. The daemon removes the files' names as soon as this
 * client sends its next frame; the mappings stay until the JVM unmaps them.
 */
final class SharedRegion {
    private static final long PART = 1L << 30;

    private final Slots push;
    /** The read slots, or null: the daemon does not put reads' buffers in the region. */
    private final Slots reads;

    private SharedRegion(Slots push, Slots reads) {
        this.push = push;
        this.reads = reads;
    }

    /**
     * The region a HelloAck gives, or null if it gives none; an IOException if it cannot be mapped (the
     * client then connects again without asking for one).
     */
    static SharedRegion of(Frame.HelloAck ack) throws IOException {
        if (!ack.agrees(Wire.SHM)) {
            return null;
        }
        Object offer = ack.info().get(Wire.SHM);
        int slotSize = ack.segmentSize();
        Slots push = Slots.map(offer, slotSize, true);
        if (push == null) {
            throw new IOException("the daemon's shm offer " + offer + " names no region");
        }
        if (!ack.agrees(Wire.SHM_READ)) {
            return new SharedRegion(push, null);
        }
        Slots reads = offer instanceof Map<?, ?> named ? Slots.map(named.get("reads"), slotSize, false) : null;
        if (reads == null) {
            throw new IOException("the daemon's shm offer " + offer + " names no file of read slots");
        }
        return new SharedRegion(push, reads);
    }

    /** The first {@code length} bytes of read slot {@code slot}, one {@link #check} took, copied to the heap. */
    ByteBuffer copy(long slot, long length) {
        byte[] out = new byte[(int) length];
        reads.get(slot - push.count, out);
        return ByteBuffer.wrap(out);
    }

    /** A BufferPlaced entry names a read slot and a length a slot holds, or breaks the rules. */
    void check(long slot, long length) throws ProtocolException {
        long count = reads == null ? 0 : reads.count;
        if (slot < push.count || slot >= push.count + count || length < 1 || length > push.slotSize) {
            throw new ProtocolException("BufferPlaced: " + length + " bytes in slot " + slot + " (the read slots are "
                    + push.count + ".." + (push.count + count - 1) + ", of " + push.slotSize + " bytes)");
        }
    }

    /** Puts {@code head} then {@code data} at the start of push slot {@code slot}; they fit (a group's size). */
    void put(long slot, byte[] head, int headLength, byte[] data, int dataLength) {
        if (slot < 0 || slot >= push.count || headLength + dataLength > push.slotSize) {
            throw new IllegalArgumentException("slot " + slot + " cannot take " + (headLength + dataLength) + " bytes");
        }
        MappedByteBuffer part = push.part(slot);
        int at = push.offset(slot);
        part.put(at, head, 0, headLength);
        part.put(at + headLength, data, 0, dataLength);
    }

    /** One file of slots, mapped. */
    private static final class Slots {
        final MappedByteBuffer[] parts;
        final int slotSize;
        final int slotsPerPart;
        final long count;

        private Slots(MappedByteBuffer[] parts, int slotSize, int slotsPerPart, long count) {
            this.parts = parts;
            this.slotSize = slotSize;
            this.slotsPerPart = slotsPerPart;
            this.count = count;
        }

        /** The file an offer's {@code {"path", "size"}} names, mapped; null if it names none. */
        static Slots map(Object offer, int slotSize, boolean writable) throws IOException {
            if (!(offer instanceof Map<?, ?> named)
                    || !(named.get("path") instanceof String path)
                    || !(named.get("size") instanceof Long size)) {
                return null;
            }
            if (size <= 0 || size % slotSize != 0) {
                throw new IOException("shared region of " + size + " bytes is not a whole number of slots");
            }
            OpenOption[] how = writable
                    ? new OpenOption[] {StandardOpenOption.READ, StandardOpenOption.WRITE, LinkOption.NOFOLLOW_LINKS}
                    : new OpenOption[] {StandardOpenOption.READ, LinkOption.NOFOLLOW_LINKS};
            try (FileChannel file = FileChannel.open(Path.of(path), how)) {
                if (file.size() != size) {
                    throw new IOException("shared region " + path + " is " + file.size() + " bytes, not " + size);
                }
                int slotsPerPart = (int) (PART / slotSize);
                long partBytes = (long) slotsPerPart * slotSize;
                FileChannel.MapMode mode = writable ? FileChannel.MapMode.READ_WRITE : FileChannel.MapMode.READ_ONLY;
                MappedByteBuffer[] parts = new MappedByteBuffer[(int) ((size + partBytes - 1) / partBytes)];
                for (int i = 0; i < parts.length; i++) {
                    long start = i * partBytes;
                    parts[i] = file.map(mode, start, Math.min(partBytes, size - start));
                }
                return new Slots(parts, slotSize, slotsPerPart, size / slotSize);
            }
        }

        MappedByteBuffer part(long slot) {
            return parts[(int) (slot / slotsPerPart)];
        }

        int offset(long slot) {
            return (int) (slot % slotsPerPart) * slotSize;
        }

        void get(long slot, byte[] out) {
            part(slot).get(offset(slot), out);
        }
    }
}
