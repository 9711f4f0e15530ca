package io.shuffled.client.wire;

/** The {@code role} byte of Hello and HelloAck (§6, §7.1). */
public enum Role {
    CLIENT(1),
    /** A peer daemon (in Hello) or the answering daemon (in HelloAck, always). */
    DAEMON(2);

    private final int code;

    Role(int code) {
        this.code = code;
    }

    public int code() {
        return code;
    }

    /** The role with this code, or null (a fatal PROTOCOL error on the wire). */
    public static Role fromCode(int code) {
        for (Role r : values()) {
            if (r.code == code) {
                return r;
            }
        }
        return null;
    }
}
