package io.shuffled.client.wire;

/**
 * Wire error codes (PROTOCOL.md §8); the same numbers as {@code shuffled/protocol/errors.py}.
 *
 * <p>{@link #fetchFailure()}: a Spark reader that gets this code on a read stream should report the
 * shuffle data as lost ({@code FetchFailedException}). {@link #retryable()}: repeating the same
 * operation later may succeed.
 */
public enum ErrorCode {
    PROTOCOL(1, false, false),
    UNSUPPORTED_VERSION(2, false, false),
    AUTH_FAILED(3, false, false),
    UNKNOWN_STREAM(4, false, false),
    PARTITION_NOT_FOUND(5, true, false),
    PEER_UNAVAILABLE(6, true, false),
    LIMIT_EXCEEDED(7, false, false),
    CREDIT_VIOLATION(8, false, false),
    SEQUENCE_GAP(9, false, false),
    MAP_OUTPUT_STATE(10, false, false),
    CANCELLED(11, false, false),
    SHUTTING_DOWN(12, false, true),
    INTERNAL(13, false, false),
    DUPLICATE_CONNECTION(14, false, true),
    INVALID_REQUEST(15, false, false),
    CONNECTION_LOST(16, true, true),
    STORAGE_ERROR(17, false, true),
    QUOTA_EXCEEDED(18, false, false),
    CORRUPT_DATA(19, true, false),
    TIMEOUT(21, true, true);

    private final int code;
    private final boolean fetchFailure;
    private final boolean retryable;

    ErrorCode(int code, boolean fetchFailure, boolean retryable) {
        this.code = code;
        this.fetchFailure = fetchFailure;
        this.retryable = retryable;
    }

    /** The u16 on the wire. */
    public int code() {
        return code;
    }

    public boolean fetchFailure() {
        return fetchFailure;
    }

    public boolean retryable() {
        return retryable;
    }

    /** The code with this number, or null if version 1 defines none. */
    public static ErrorCode byCode(int code) {
        for (ErrorCode c : values()) {
            if (c.code == code) {
                return c;
            }
        }
        return null;
    }

    /** What a received code means: unknown codes are {@link #INTERNAL} (§7.2). */
    public static ErrorCode fromWire(int code) {
        ErrorCode c = byCode(code);
        return c == null ? INTERNAL : c;
    }
}
