package io.shuffled.client.wire;

/** The {@code kind} u16 of a BufferResponse (§7.6). */
public enum BufferKind {
    /** One data buffer; costs one credit. */
    DATA(0),
    /** The event that ends a read stream: no payload, no credit. */
    END_OF_PARTITION(1);

    private final int code;

    BufferKind(int code) {
        this.code = code;
    }

    public int code() {
        return code;
    }

    /** The kind with this code, or null (a fatal PROTOCOL error on the wire). */
    public static BufferKind fromCode(int code) {
        for (BufferKind k : values()) {
            if (k.code == code) {
                return k;
            }
        }
        return null;
    }
}
