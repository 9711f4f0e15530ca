package io.shuffled.client.wire;

import java.nio.ByteBuffer;
import java.util.function.LongPredicate;

/**
 * The payload format of both data frames (PROTOCOL.md §3.3): packed groups. A group is one map attempt's
 * bytes for one or more reduce partitions, with its directory in front:
 *
 * <pre>
 * attempt u64 | count u32 (n &gt;= 1) | n x (partition u32, length u32) | the n runs' bytes back to back
 * </pre>
 *
 * Partitions strictly ascend and every run has at least one byte. A PushData carries exactly one group, a
 * DATA BufferResponse one or more back to back.
 *
 * <p>{@link #check} validates a payload in one pass over its directories (the data is not touched);
 * {@link Cursor} then walks its runs, each a slice of the payload (no copy).
 */
public final class PackedGroups {
    private PackedGroups() {}

    /** Bytes of a group with {@code runs} runs and {@code dataBytes} bytes of data. */
    public static long size(int runs, long dataBytes) {
        return Wire.GROUP_HEADER + (long) Wire.GROUP_RUN * runs + dataBytes;
    }

    /**
     * Checks a DATA BufferResponse payload against the read it answers: one or more groups back to back, each
     * of an attempt the request named, every partition in [{@code start}, {@code end}). Returns the number of
     * runs.
     *
     * @throws ProtocolException (PROTOCOL) naming the first violation
     */
    public static int check(ByteBuffer payload, long start, long end, LongPredicate named) throws ProtocolException {
        int base = payload.position();
        int limit = payload.limit();
        if (base == limit) {
            throw new ProtocolException("empty payload: it holds at least one packed group");
        }
        int runs = 0;
        int at = base;
        while (at < limit) {
            int rest = limit - at;
            if (rest < Wire.GROUP_HEADER) {
                throw bad(at - base, rest + " bytes, shorter than a group header");
            }
            long attempt = payload.getLong(at);
            long count = Integer.toUnsignedLong(payload.getInt(at + 8));
            if (count == 0) {
                throw bad(at - base, "no runs");
            }
            if (count > (rest - Wire.GROUP_HEADER) / Wire.GROUP_RUN) {
                throw bad(at - base, rest + " bytes, shorter than its directory of " + count + " runs");
            }
            if (!named.test(attempt)) {
                throw bad(at - base, "map attempt " + Long.toUnsignedString(attempt)
                        + " is not one the stream is for");
            }
            long data = 0;
            long previous = -1;
            int entry = at + Wire.GROUP_HEADER;
            for (int i = 0; i < count; i++, entry += Wire.GROUP_RUN) {
                long partition = Integer.toUnsignedLong(payload.getInt(entry));
                long length = Integer.toUnsignedLong(payload.getInt(entry + 4));
                if (partition <= previous) {
                    throw bad(at - base, "run " + i + " has partition " + partition + " after "
                            + previous + " (partitions must strictly ascend)");
                }
                if (partition < start || partition >= end) {
                    throw bad(at - base, "partition " + partition + " outside [" + start + ", " + end + ")");
                }
                if (length == 0) {
                    throw bad(at - base, "run " + i + " (partition " + partition + ") is empty");
                }
                previous = partition;
                data += length;
            }
            long after = limit - entry;
            if (data > after) {
                throw bad(at - base, "its runs hold " + data + " bytes, " + after + " follow its directory");
            }
            runs += (int) count;
            at = entry + (int) data;
        }
        return runs;
    }

    private static ProtocolException bad(int at, String what) {
        return new ProtocolException("packed group at byte " + at + ": " + what);
    }

    /**
     * Walks the runs of a payload that passed {@link #check}, in order: call {@link #next()}, then read the
     * run's {@link #partition()}, {@link #attempt()} and {@link #data()}.
     */
    public static final class Cursor {
        private final ByteBuffer payload;
        private int nextGroup;
        private int runsLeft;
        private int entry;
        private int dataAt;
        private int partition;
        private int length;
        private long attempt;

        public Cursor(ByteBuffer payload) {
            this.payload = payload;
            this.nextGroup = payload.position();
        }

        /** Moves to the next run; false after the last one. */
        public boolean next() {
            if (runsLeft == 0) {
                if (nextGroup >= payload.limit()) {
                    return false;
                }
                attempt = payload.getLong(nextGroup);
                runsLeft = payload.getInt(nextGroup + 8);
                entry = nextGroup + Wire.GROUP_HEADER;
                dataAt = entry + Wire.GROUP_RUN * runsLeft;
            } else {
                entry += Wire.GROUP_RUN;
                dataAt += length;
            }
            partition = payload.getInt(entry);
            length = payload.getInt(entry + 4);
            if (--runsLeft == 0) {
                nextGroup = dataAt + length;
            }
            return true;
        }

        /** The reduce partition of the current run (a u32 below 2^24, so it fits an int). */
        public int partition() {
            return partition;
        }

        /** The map attempt of the current run's group (a u64). */
        public long attempt() {
            return attempt;
        }

        /** The current run's bytes: a slice of the payload, position 0. */
        public ByteBuffer data() {
            return payload.slice(dataAt, length);
        }
    }
}
