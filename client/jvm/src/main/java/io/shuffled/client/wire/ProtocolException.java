package io.shuffled.client.wire;

/**
 * The peer's bytes break proto/PROTOCOL.md. Raised by the decoder with the code to report in an
 * {@code Error} on stream 0 (usually {@link ErrorCode#PROTOCOL}; {@link ErrorCode#UNSUPPORTED_VERSION}
 * for a Hello of another version). Fatal for the connection.
 */
public class ProtocolException extends ShuffledException {
    private static final long serialVersionUID = 1L;

    public ProtocolException(String message) {
        super(ErrorCode.PROTOCOL, message);
    }

    public ProtocolException(ErrorCode code, String message) {
        super(code, message);
    }
}
