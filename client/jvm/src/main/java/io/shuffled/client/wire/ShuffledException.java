package io.shuffled.client.wire;

import java.io.IOException;

/** An error of the shuffle service, carrying the wire code it travels as (PROTOCOL.md §8). */
public class ShuffledException extends IOException {
    private static final long serialVersionUID = 1L;

    private final ErrorCode code;

    public ShuffledException(ErrorCode code, String message) {
        super(message == null || message.isEmpty() ? code.name() : message);
        this.code = code;
    }

    public ErrorCode code() {
        return code;
    }

    /** A Spark reader should treat this as lost shuffle data. */
    public boolean fetchFailure() {
        return code.fetchFailure();
    }

    public boolean retryable() {
        return code.retryable();
    }

    /** The exception a received Error frame stands for (unknown codes become INTERNAL). */
    public static ShuffledException fromWire(int code, String message) {
        ErrorCode c = ErrorCode.fromWire(code);
        return switch (c) {
            case PROTOCOL, UNSUPPORTED_VERSION, CREDIT_VIOLATION, SEQUENCE_GAP -> new ProtocolException(c, message);
            default -> new ShuffledException(c, message);
        };
    }
}
