package io.shuffled.client.wire;

/**
 * Frame types (PROTOCOL.md §7) with where each may travel.
 *
 * <p>The direction flags transcribe the table of §7; enforcing them (and the handshake order of §6)
 * is the connection's job, not the decoder's: a frame of a known type in the wrong direction is a
 * fatal {@link ErrorCode#PROTOCOL} error there.
 */
public enum FrameType {
    //                       code  fixed  client sends  client receives  on peer connections
    HELLO(0x01, -1, true, false, true),
    HELLO_ACK(0x02, -1, false, true, true),
    ERROR(0x03, -1, true, true, true),
    CLOSE(0x04, -1, true, true, true),
    AUTH_CHALLENGE(0x05, -1, false, true, true),
    AUTH_RESPONSE(0x06, -1, true, false, true),
    PARTITION_REQUEST(0x10, -1, true, false, true),
    ADD_CREDIT(0x11, -1, true, false, true),
    BUFFER_RESPONSE(0x12, Wire.BUFFER_RESPONSE_FIXED, false, true, true),
    CANCEL_PARTITION_REQUEST(0x13, -1, true, false, true),
    BUFFER_PLACED(0x14, -1, false, true, false),
    RETURN_SLOTS(0x15, -1, true, false, false),
    OPEN_MAP_OUTPUT(0x20, -1, true, false, false),
    PUSH_CREDIT(0x21, -1, false, true, false),
    PUSH_DATA(0x22, Wire.PUSH_DATA_FIXED, true, false, false),
    COMMIT_MAP_OUTPUT(0x23, -1, true, false, false),
    COMMIT_ACK(0x24, -1, false, true, false),
    ABORT_MAP_OUTPUT(0x25, -1, true, false, false),
    ABORT_ACK(0x26, -1, false, true, false),
    PUSH_SLOTS(0x27, -1, false, true, false),
    PUSH_PLACED(0x28, -1, true, false, false),
    ADMIN_REQUEST(0x30, -1, true, false, true),
    ADMIN_RESPONSE(0x31, -1, false, true, true);

    private static final FrameType[] BY_CODE = new FrameType[256];

    static {
        for (FrameType t : values()) {
            BY_CODE[t.code] = t;
        }
    }

    private final int code;
    private final int fixedPart;
    private final boolean clientSends;
    private final boolean clientReceives;
    private final boolean onPeerConnections;

    FrameType(int code, int fixedPart, boolean clientSends, boolean clientReceives, boolean onPeerConnections) {
        this.code = code;
        this.fixedPart = fixedPart;
        this.clientSends = clientSends;
        this.clientReceives = clientReceives;
        this.onPeerConnections = onPeerConnections;
    }

    /** The u8 in the header. */
    public int code() {
        return code;
    }

    /** True for BufferResponse and PushData: fixed binary part, then a payload limited by the segment size. */
    public boolean isData() {
        return fixedPart >= 0;
    }

    /** Size of a data frame's fixed part after the header; -1 for control frames. */
    public int fixedPart() {
        return fixedPart;
    }

    /** Hello, HelloAck and Close travel on stream 0 only (§5). */
    public boolean connectionLevel() {
        return this == HELLO || this == HELLO_ACK || this == CLOSE || this == AUTH_CHALLENGE || this == AUTH_RESPONSE;
    }

    /** A client may send this frame to its daemon (C→D or "any" in §7). */
    public boolean clientMaySend() {
        return clientSends;
    }

    /** A client may receive this frame from its daemon (D→C or "any" in §7). */
    public boolean clientMayReceive() {
        return clientReceives;
    }

    /** The frame may travel between two daemons (D↔D or "any" in §7). */
    public boolean allowedBetweenDaemons() {
        return onPeerConnections;
    }

    /** The type with this header code, or null if there is none (a fatal PROTOCOL error on the wire). */
    public static FrameType fromCode(int code) {
        return code >= 0 && code < BY_CODE.length ? BY_CODE[code] : null;
    }
}
