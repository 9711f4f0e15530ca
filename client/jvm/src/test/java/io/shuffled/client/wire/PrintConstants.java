package io.shuffled.client.wire;

/**
 * Prints the codec's constants, one {@code kind NAME value} line each, so a Python test can compare
 * them with {@code shuffled/protocol/errors.py} and {@code shuffled/protocol/frames.py}.
 */
public final class PrintConstants {
    private PrintConstants() {}

    public static void main(String[] args) {
        for (ErrorCode c : ErrorCode.values()) {
            System.out.println("error " + c.name() + " " + c.code());
        }
        for (FrameType t : FrameType.values()) {
            System.out.println("frame " + t.name() + " " + t.code());
        }
        for (Role r : Role.values()) {
            System.out.println("role " + r.name() + " " + r.code());
        }
        for (BufferKind k : BufferKind.values()) {
            System.out.println("kind " + k.name() + " " + k.code());
        }
        System.out.println("const VERSION " + Wire.VERSION);
        System.out.println("const HEADER_SIZE " + Wire.HEADER_SIZE);
        System.out.println("const HELLO_FIXED " + Wire.HELLO_FIXED);
        System.out.println("const BUFFER_RESPONSE_FIXED " + Wire.BUFFER_RESPONSE_FIXED);
        System.out.println("const PUSH_DATA_FIXED " + Wire.PUSH_DATA_FIXED);
        System.out.println("const MAX_CONTROL_BODY " + Wire.MAX_CONTROL_BODY);
        System.out.println("const DEFAULT_MAX_PAYLOAD " + Wire.DEFAULT_MAX_PAYLOAD);
        System.out.println("const MAX_STREAMS_PER_CONNECTION " + Wire.MAX_STREAMS_PER_CONNECTION);
        System.out.println("const MAX_REPLICAS " + Wire.MAX_REPLICAS);
        System.out.println("const MAGIC " + Wire.MAGIC);
    }
}
