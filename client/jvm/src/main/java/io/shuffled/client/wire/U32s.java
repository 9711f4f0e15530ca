package io.shuffled.client.wire;

import java.util.Arrays;

/**
 * One or more u32s of a frame's body, compared by value: a PushSlots' slots (§7.9a), a PushPlaced's groups
 * of four fields (§7.10a). Immutable, so the records holding it compare and print as any record.
 */
public final class U32s {
    private final long[] values;

    /** {@code values}, a positive multiple of {@code per} of them, each a u32 ({@code name} says which). */
    public U32s(String name, long[] values, int per) {
        if (values.length == 0 || values.length % per != 0) {
            throw new IllegalArgumentException(
                    "one or more " + name + (per > 1 ? " of " + per + " values each" : "") + ", got " + values.length);
        }
        this.values = values.clone();
        for (long value : this.values) {
            Wire.checkU32(name, value);
        }
    }

    public int size() {
        return values.length;
    }

    public long get(int i) {
        return values[i];
    }

    public long[] toArray() {
        return values.clone();
    }

    @Override
    public boolean equals(Object o) {
        return o instanceof U32s u && Arrays.equals(values, u.values);
    }

    @Override
    public int hashCode() {
        return Arrays.hashCode(values);
    }

    @Override
    public String toString() {
        return Arrays.toString(values);
    }
}
