package io.shuffled.client;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import io.shuffled.client.wire.Auth;
import io.shuffled.client.wire.ErrorCode;
import io.shuffled.client.wire.Frame;
import io.shuffled.client.wire.FrameDecoder;
import io.shuffled.client.wire.FrameEncoder;
import io.shuffled.client.wire.ShuffledException;
import io.shuffled.client.wire.Wire;
import java.io.ByteArrayOutputStream;
import java.io.File;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import java.util.Random;

/**
 * Replays the recorded conversations (proto/vectors/conversations.json, written by
 * proto/vectors/record.py from the Python protocol connection) against this client.
 *
 * <p>Usage: {@code java -cp <jar>:<test jar>:<pyspark jars>/* io.shuffled.client.ConversationCheck
 * proto/vectors/conversations.json}. Two kinds of line per conversation, "ok" or "FAIL":
 *
 * <ul>
 *   <li>{@code [codec]}, every conversation: each step's bytes decode (whole and in random splits) into
 *       frames that encode back to the same bytes, and the proofs of a handshake are the ones this
 *       client's {@link Auth} computes for the recorded nonces (or, with another secret, are not);
 *   <li>{@code [client]}, the conversations a client dials: a real {@link ShuffleClient} talks over an
 *       in-memory transport that plays the recorded daemon, each of its steps released once the client
 *       has sent what the recording sent before it. The client must send the recorded bytes, byte for
 *       byte (a fatal error: the same frame type and code), and see what the recording's client saw.
 * </ul>
 *
 * <p>The last line is {@code N passed, M failed}; the exit status is 0 only when M is 0.
 */
public final class ConversationCheck {
    private static final HexFormat HEX = HexFormat.of();
    private static final long TIMEOUT_MILLIS = 10_000;
    /** The recorder's first nonce, which its dialer takes (record.py's fixed_nonces). */
    private static final String DIALER_NONCE = String.format("%032x", 1);

    private int passed;
    private int failed;

    public static void main(String[] args) throws Exception {
        if (args.length != 1) {
            System.err.println("usage: ConversationCheck path/to/conversations.json");
            System.exit(2);
        }
        JsonNode root = new ObjectMapper().readTree(new File(args[0]));
        ConversationCheck check = new ConversationCheck();
        for (JsonNode c : root.path("conversations")) {
            String name = c.path("name").asText();
            check.entry(name + " [codec]", () -> codec(c));
            Scenario scenario = scenario(name);
            if (scenario != null) {
                check.entry(name + " [client]", () -> replay(c, scenario));
            }
        }
        System.out.println(check.passed + " passed, " + check.failed + " failed");
        System.exit(check.failed == 0 ? 0 : 1);
    }

    // ------------------------------------------------------------------------------------------ harness

    private interface Check {
        void run() throws Exception;
    }

    private void entry(String name, Check check) {
        try {
            check.run();
            passed++;
            System.out.println("ok   " + name);
        } catch (Exception | AssertionError e) {
            failed++;
            System.out.println("FAIL " + name + ": " + e);
        }
    }

    private static void require(boolean ok, String what) {
        if (!ok) {
            throw new AssertionError(what);
        }
    }

    // ------------------------------------------------------------------------------------------ [codec]

    private static void codec(JsonNode conversation) throws Exception {
        Random random = new Random(7);
        String dialerNonce = null;
        Frame.AuthChallenge challenge = null;
        for (JsonNode step : conversation.path("steps")) {
            byte[] bytes = HEX.parseHex(step.path("hex").asText());
            List<Frame> frames = decode(bytes, bytes.length);
            require(frames.equals(decode(bytes, 1 + random.nextInt(16))), "a split decodes differently");
            ByteArrayOutputStream again = new ByteArrayOutputStream();
            for (Frame f : frames) {
                again.write(FrameEncoder.encode(f));
                if (f instanceof Frame.Hello h && h.info().get("nonce") instanceof String n) {
                    dialerNonce = n;
                } else if (f instanceof Frame.AuthChallenge ch) {
                    challenge = ch;
                } else if (f instanceof Frame.AuthResponse r && challenge != null) {
                    byte[] secret = conversation.path("secret").asText().getBytes(StandardCharsets.UTF_8);
                    require(Auth.dialerProof(secret, dialerNonce, challenge.nonce()).equals(r.proof()), "dialer proof");
                }
            }
            require(Arrays.equals(again.toByteArray(), bytes), "frames encode to other bytes: " + frames);
        }
        if (challenge != null && !conversation.path("secret").isNull()) {
            byte[] secret = conversation.path("secret").asText().getBytes(StandardCharsets.UTF_8);
            boolean same = Auth.acceptorProof(secret, dialerNonce, challenge.nonce()).equals(challenge.proof());
            boolean wrong = conversation.path("name").asText().contains("wrong");
            require(same != wrong, wrong ? "a wrong secret's proof matched" : "acceptor proof");
        }
    }

    private static List<Frame> decode(byte[] bytes, int step) throws Exception {
        FrameDecoder decoder = new FrameDecoder(FrameDecoder.HEAP, Wire.DEFAULT_MAX_PAYLOAD);
        List<Frame> out = new ArrayList<>();
        for (int pos = 0; pos < bytes.length; pos += step) {
            decoder.feed(ByteBuffer.wrap(bytes, pos, Math.min(step, bytes.length - pos)), out::add);
        }
        decoder.endOfInput();
        return out;
    }

    // ------------------------------------------------------------------------------------------ [client]

    /** What a client does in one conversation, given its connection (null: the handshake fails). */
    private interface Scenario {
        void run(ReplayTransport transport, String secret) throws Exception;
    }

    private static Scenario scenario(String name) {
        return switch (name) {
            case "handshake-plain", "handshake-secret" -> (t, secret) -> connect(t, secret).close();
            case "handshake-wrong-secret" -> (t, secret) -> {
                try {
                    connect(t, secret).close();
                    throw new AssertionError("the handshake succeeded with another secret");
                } catch (ShuffledException e) {
                    require(e.code() == ErrorCode.AUTH_FAILED, "failed with " + e.code());
                }
            };
            case "admin-calls" -> (t, secret) -> {
                try (ShuffleClient client = connect(t, secret)) {
                    require(client.stats().equals(Map.of("node", "198.18.0.1:7337")), "stats answer");
                    try {
                        client.admin("flush", Map.of("app", "app-9"));
                        throw new AssertionError("a failed admin call returned");
                    } catch (ShuffledException e) {
                        require(e.code() == ErrorCode.PARTITION_NOT_FOUND, "failed with " + e.code());
                    }
                }
            };
            case "push-committed" -> (t, secret) -> {
                // A writer buffer that holds just the first two writes: the third finds it full, so they are
                // pushed as one group, and the third, which continues partition 1, as another at commit.
                long twoRecords = 2 * (PackingBuffer.RECORD_OVERHEAD + 4);
                try (ShuffleClient client = connect(t, secret, twoRecords)) {
                    MapOutputWriter writer = client.openWriter("app-1", 3, 0, 11, 2);
                    writer.write(0, "k1v1".getBytes(StandardCharsets.UTF_8));
                    writer.write(1, "k2v2".getBytes(StandardCharsets.UTF_8));
                    writer.write(1, "k3v3".getBytes(StandardCharsets.UTF_8));
                    require(Arrays.equals(writer.commit(), new long[] {4, 8}), "commit lengths");
                }
            };
            default -> null;
        };
    }

    private static ShuffleClient connect(ReplayTransport transport, String secret) throws IOException {
        return connect(transport, secret, 1 << 20);
    }

    private static ShuffleClient connect(ReplayTransport transport, String secret, long writerBuffer)
            throws IOException {
        return ShuffleClient.handshake(
                transport, "replay", "recorder", TIMEOUT_MILLIS, writerBuffer, secret, null, DIALER_NONCE);
    }

    private static void replay(JsonNode conversation, Scenario scenario) throws Exception {
        List<byte[]> daemon = new ArrayList<>();
        List<Integer> due = new ArrayList<>();
        ByteArrayOutputStream expected = new ByteArrayOutputStream();
        String fatal = null;
        for (JsonNode step : conversation.path("steps")) {
            byte[] bytes = HEX.parseHex(step.path("hex").asText());
            if (step.path("from").asText().equals("dialer")) {
                expected.write(bytes);
            } else {
                daemon.add(bytes);
                due.add(expected.size());
                if (step.has("fatal")) { // the client finds this step fatal: it answers on stream 0, then stops
                    fatal = step.path("fatal").asText();
                }
            }
        }
        ReplayTransport transport = new ReplayTransport(daemon, due);
        JsonNode secret = conversation.path("secret");
        scenario.run(transport, secret.isNull() ? null : secret.asText());
        byte[] sent = transport.sent();
        byte[] want = expected.toByteArray();
        if (fatal == null) {
            require(Arrays.equals(sent, want), "sent " + HEX.formatHex(sent) + ", recorded " + HEX.formatHex(want));
            return;
        }
        // The fatal ErrorResponse's text is the implementation's own: compare everything before it, then its code.
        List<Frame> got = decode(sent, sent.length);
        List<Frame> recorded = decode(want, want.length);
        require(got.size() == recorded.size(), "sent " + got + ", recorded " + recorded);
        require(got.subList(0, got.size() - 1).equals(recorded.subList(0, recorded.size() - 1)), "frames differ");
        Frame last = got.get(got.size() - 1);
        require(last instanceof Frame.ErrorResponse e && e.stream() == 0 && e.code() == ErrorCode.valueOf(fatal).code(),
                "the last frame is " + last);
    }

    /** The recorded daemon: its steps, each readable once the client has written {@code due} bytes. */
    private static final class ReplayTransport extends QueueTransport {
        private final List<byte[]> steps;
        private final List<Integer> due;
        private final ByteArrayOutputStream written = new ByteArrayOutputStream();
        private int released;
        private boolean closed;

        ReplayTransport(List<byte[]> steps, List<Integer> due) {
            this.steps = steps;
            this.due = due;
            release();
        }

        synchronized byte[] sent() {
            return written.toByteArray();
        }

        @Override
        synchronized void received(byte[] b, int off, int len) {
            if (!closed) {
                written.write(b, off, len);
                release();
            }
        }

        private void release() {
            while (released < steps.size() && written.size() >= due.get(released)) {
                reply(steps.get(released++));
            }
        }

        @Override
        public synchronized void close() {
            closed = true;
            super.close();
        }
    }
}
