package io.shuffled.client.wire;

import static io.shuffled.client.Checks.require;

import io.shuffled.client.Checks;
import io.shuffled.client.Checks.Body;
import java.math.BigInteger;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HexFormat;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * Checks of the hand-written msgpack and the decoder's edges that the golden vectors do not reach
 * (boundaries of every msgpack form, strictness, header-time refusal, payload sinks, encoder refusals).
 * No dependencies beyond the JDK. Prints one line per check and then {@code N passed, M failed}; exits
 * non-zero on any failure.
 */
public final class CodecSelfTest {
    private static final HexFormat HEX = HexFormat.of();

    private final Checks checks = new Checks();

    public static void main(String[] args) {
        CodecSelfTest t = new CodecSelfTest();
        t.msgpackWriter();
        t.msgpackReader();
        t.decoder();
        t.fuzz();
        t.encoder();
        t.constants();
        t.checks.exit();
    }

    private void check(String name, Body body) {
        checks.check(name, body);
    }

    private static void equal(Object got, Object expected) {
        require(expected.equals(got), "got " + got + ", expected " + expected);
    }

    private static String hex(MsgPack.Writer w) {
        return HEX.formatHex(w.toByteArray());
    }

    private static Object read(String hex) throws ProtocolException {
        byte[] b = HEX.parseHex(hex);
        MsgPack.Reader r = new MsgPack.Reader(b, 0, b.length, "test");
        Object v = r.readValue();
        require(r.atEnd(), "bytes left after the value");
        return v;
    }

    private static void refused(String hex, String why) {
        try {
            Object v = read(hex);
            throw new AssertionError(why + ": accepted " + HEX.formatHex(HEX.parseHex(hex)) + " as " + v);
        } catch (ProtocolException e) {
            require(e.code() == ErrorCode.PROTOCOL, why + ": code " + e.code());
        }
    }

    private static void refusedFrame(byte[] frame, ErrorCode code, String why) {
        try {
            FrameDecoder d = new FrameDecoder();
            List<Frame> out = d.feed(ByteBuffer.wrap(frame));
            d.endOfInput();
            throw new AssertionError(why + ": accepted, decoded " + out);
        } catch (ProtocolException e) {
            require(e.code() == code, why + ": code " + e.code() + " (" + e.getMessage() + "), expected " + code);
        }
    }

    /** A control frame with this type, stream and body, bypassing the encoder. */
    private static byte[] frame(FrameType type, long stream, byte[] body) {
        ByteBuffer b = ByteBuffer.allocate(Wire.HEADER_SIZE + body.length);
        FrameEncoder.writeHeader(b, type, stream, body.length);
        return b.put(body).array();
    }

    private static byte[] helloBody(int role, Map<String, ?> info) {
        byte[] map = new MsgPack.Writer().writeValue(info).toByteArray();
        return ByteBuffer.allocate(8 + map.length).putInt(Wire.MAGIC).putShort((short) Wire.VERSION).put((byte) role)
                .put((byte) 0).put(map).array();
    }

    private static Map<String, Object> mapOf(Object... kv) {
        Map<String, Object> m = new LinkedHashMap<>();
        for (int i = 0; i < kv.length; i += 2) {
            m.put((String) kv[i], kv[i + 1]);
        }
        return m;
    }

    // ------------------------------------------------------------------------------------------ msgpack out

    private void msgpackWriter() {
        check("msgpack: unsigned integers in their shortest form", () -> {
            long[] values = {0, 127, 128, 255, 256, 65535, 65536, 0xFFFF_FFFFL, 0x1_0000_0000L, Long.MAX_VALUE, -1L};
            String[] forms = {"00", "7f", "cc80", "ccff", "cd0100", "cdffff", "ce00010000", "ceffffffff",
                "cf0000000100000000", "cf7fffffffffffffff", "cfffffffffffffffff"};
            for (int i = 0; i < values.length; i++) {
                equal(hex(new MsgPack.Writer().writeUnsigned(values[i])), forms[i]);
            }
        });
        check("msgpack: signed integers in their shortest form", () -> {
            long[] values = {5, 200, -1, -32, -33, -128, -129, -32768, -32769, Integer.MIN_VALUE,
                Integer.MIN_VALUE - 1L, Long.MIN_VALUE};
            String[] forms = {"05", "ccc8", "ff", "e0", "d0df", "d080", "d1ff7f", "d18000", "d2ffff7fff", "d280000000",
                "d3ffffffff7fffffff", "d38000000000000000"};
            for (int i = 0; i < values.length; i++) {
                equal(hex(new MsgPack.Writer().writeSigned(values[i])), forms[i]);
            }
        });
        check("msgpack: BigInteger range -2^63..2^64-1", () -> {
            equal(hex(new MsgPack.Writer().writeInteger(BigInteger.ONE.shiftLeft(64).subtract(BigInteger.ONE))),
                    "cfffffffffffffffff");
            equal(hex(new MsgPack.Writer().writeInteger(BigInteger.valueOf(-5))), "fb");
            for (BigInteger bad : new BigInteger[] {BigInteger.ONE.shiftLeft(64),
                BigInteger.ONE.shiftLeft(63).negate().subtract(BigInteger.ONE)}) {
                try {
                    new MsgPack.Writer().writeInteger(bad);
                    throw new AssertionError("wrote " + bad);
                } catch (IllegalArgumentException expected) {
                    // refused
                }
            }
        });
        check("msgpack: str, bin, array and map headers at every boundary", () -> {
            equal(hex(new MsgPack.Writer().writeString("")), "a0");
            equal(hex(new MsgPack.Writer().writeString("x".repeat(31))).substring(0, 2), "bf");
            equal(hex(new MsgPack.Writer().writeString("x".repeat(32))).substring(0, 4), "d920");
            equal(hex(new MsgPack.Writer().writeString("x".repeat(255))).substring(0, 4), "d9ff");
            equal(hex(new MsgPack.Writer().writeString("x".repeat(256))).substring(0, 6), "da0100");
            equal(hex(new MsgPack.Writer().writeString("x".repeat(65536))).substring(0, 10), "db00010000");
            equal(hex(new MsgPack.Writer().writeBin(new byte[0])), "c400");
            equal(hex(new MsgPack.Writer().writeBin(new byte[256])).substring(0, 6), "c50100");
            equal(hex(new MsgPack.Writer().writeBin(new byte[65536])).substring(0, 10), "c600010000");
            equal(hex(new MsgPack.Writer().writeArrayHeader(15)), "9f");
            equal(hex(new MsgPack.Writer().writeArrayHeader(16)), "dc0010");
            equal(hex(new MsgPack.Writer().writeArrayHeader(65536)), "dd00010000");
            equal(hex(new MsgPack.Writer().writeMapHeader(15)), "8f");
            equal(hex(new MsgPack.Writer().writeMapHeader(16)), "de0010");
            equal(hex(new MsgPack.Writer().writeMapHeader(65536)), "df00010000");
        });
        check("msgpack: UTF-8 strings, lone surrogates refused", () -> {
            equal(hex(new MsgPack.Writer().writeString("café ✗")), "a9636166c3a920e29c97");
            try {
                new MsgPack.Writer().writeString("a\ud800b");
                throw new AssertionError("wrote a lone surrogate");
            } catch (IllegalArgumentException expected) {
                // refused
            }
        });
        check("msgpack: nil, bools, nested values in map order", () -> {
            Map<String, Object> m = mapOf("b", true, "a", List.of(1, "x", false), "n", null, "z", new byte[] {1});
            equal(hex(new MsgPack.Writer().writeValue(m)), "84a162c3a1619301a178c2a16ec0a17ac40101");
        });
        check("msgpack: normalize gives Long, BigInteger only above 2^63-1, Bin, immutable copies", () -> {
            Object v = MsgPack.normalize(mapOf("i", 7, "s", (short) 3, "b", BigInteger.TEN,
                    "u", BigInteger.ONE.shiftLeft(63), "bytes", new byte[] {1, 2}));
            equal(v, mapOf("i", 7L, "s", 3L, "b", 10L, "u", BigInteger.ONE.shiftLeft(63),
                    "bytes", new MsgPack.Bin(new byte[] {1, 2})));
            try {
                @SuppressWarnings("unchecked")
                Map<String, Object> m = (Map<String, Object>) v;
                m.put("x", 1L);
                throw new AssertionError("normalized map is mutable");
            } catch (UnsupportedOperationException expected) {
                // immutable
            }
            for (Object bad : new Object[] {1.5, Map.of(1, 2), new Object()}) {
                try {
                    MsgPack.normalize(bad);
                    throw new AssertionError("normalized " + bad);
                } catch (IllegalArgumentException expected) {
                    // refused
                }
            }
        });
    }

    // ------------------------------------------------------------------------------------------ msgpack in

    private void msgpackReader() {
        check("msgpack: every integer form decodes, uint64 above 2^63-1 as BigInteger", () -> {
            equal(read("7f"), 127L);
            equal(read("e0"), -32L);
            equal(read("ccff"), 255L);
            equal(read("cdffff"), 65535L);
            equal(read("ceffffffff"), 0xFFFF_FFFFL);
            equal(read("cf7fffffffffffffff"), Long.MAX_VALUE);
            equal(read("cf8000000000000000"), BigInteger.ONE.shiftLeft(63));
            equal(read("d080"), -128L);
            equal(read("d0ff"), -1L);
            equal(read("d18000"), -32768L);
            equal(read("d280000000"), (long) Integer.MIN_VALUE);
            equal(read("d38000000000000000"), Long.MIN_VALUE);
            equal(read("d37fffffffffffffff"), Long.MAX_VALUE);
        });
        check("msgpack: str8/16/32, bin, nested containers, nil and bools decode", () -> {
            equal(read("d903616263"), "abc");
            equal(read("da0003616263"), "abc");
            equal(read("db00000003616263"), "abc");
            equal(read("c4020102"), new MsgPack.Bin(new byte[] {1, 2}));
            equal(read("dc000201c3"), List.of(1L, true));
            equal(read("de0001a16190"), Map.of("a", List.of()));
            require(read("c0") == null, "nil");
            equal(read("c2"), false);
        });
        check("msgpack: floats, ext types and 0xc1 are refused", () -> {
            refused("ca3f800000", "float32");
            refused("cb3ff0000000000000", "float64");
            refused("d40100", "fixext1");
            refused("c70101ff", "ext8");
            refused("c1", "never-used byte");
        });
        check("msgpack: truncated values are refused", () -> {
            refused("", "nothing");
            refused("cd01", "uint16 cut short");
            refused("cf00000000", "uint64 cut short");
            refused("a3616263".substring(0, 6), "str cut short");
            refused("d9", "str8 without its length");
            refused("c405", "bin cut short");
            refused("93 01 02".replace(" ", ""), "array cut short");
            refused("82a16101", "map cut short");
        });
        check("msgpack: huge counts are refused before allocating", () -> {
            refused("ddffffffff", "array32 of 2^32-1 elements in 5 bytes");
            refused("dfffffffff", "map32 of 2^32-1 entries in 5 bytes");
            refused("dbffffffff", "str32 of 4 GiB");
            refused("c6ffffffff", "bin32 of 4 GiB");
        });
        check("msgpack: invalid UTF-8, non-str keys and duplicate keys are refused", () -> {
            refused("a2c328", "malformed UTF-8");
            refused("a3eda080", "UTF-8 encoded surrogate");
            refused("810102", "int key");
            refused("81c4016101", "bin key");
            refused("82a16101a16102", "duplicate key");
        });
        check("msgpack: nesting deeper than MAX_DEPTH is refused, at MAX_DEPTH accepted", () -> {
            String ok = "91".repeat(MsgPack.MAX_DEPTH) + "c0";
            read(ok);
            refused("91".repeat(MsgPack.MAX_DEPTH + 1) + "c0", "too deep");
            refused("81a161".repeat(MsgPack.MAX_DEPTH + 1) + "c0", "maps too deep");
        });
        check("msgpack: a body must be exactly one map", () -> {
            for (String[] c : new String[][] {{"", "empty"}, {"90", "array"}, {"80c0", "trailing byte"},
                {"a161", "str"}}) {
                byte[] b = HEX.parseHex(c[0]);
                try {
                    new MsgPack.Reader(b, 0, b.length, "test").readWholeMap();
                    throw new AssertionError(c[1] + ": accepted");
                } catch (ProtocolException e) {
                    equal(e.code(), ErrorCode.PROTOCOL);
                }
            }
        });
    }

    // ------------------------------------------------------------------------------------------ decoder

    private void decoder() {
        check("decoder: an oversized data frame is refused when its 12th header byte arrives", () -> {
            for (FrameType t : new FrameType[] {FrameType.BUFFER_RESPONSE, FrameType.PUSH_DATA}) {
                ByteBuffer header = ByteBuffer.allocate(12);
                FrameEncoder.writeHeader(header, t, 1, t.fixedPart() + 1001L);
                FrameDecoder d = new FrameDecoder(FrameDecoder.HEAP, 1000);
                byte[] h = header.array();
                d.feed(h, 0, 11);
                try {
                    d.feed(h, 11, 1);
                    throw new AssertionError(t + ": header accepted");
                } catch (ProtocolException e) {
                    equal(e.code(), ErrorCode.PROTOCOL);
                }
            }
        });
        check("decoder: a control body over the limit is refused from the header alone", () -> {
            ByteBuffer header = ByteBuffer.allocate(12);
            FrameEncoder.writeHeader(header, FrameType.ADMIN_RESPONSE, 1, 0xFFFF_FFFFL);
            refusedFrame(header.array(), ErrorCode.PROTOCOL, "4 GiB body");
            FrameDecoder d = new FrameDecoder(FrameDecoder.HEAP, 100, 64);
            ByteBuffer small = ByteBuffer.allocate(12);
            FrameEncoder.writeHeader(small, FrameType.ADMIN_RESPONSE, 1, 65);
            try {
                d.feed(small.flip());
                throw new AssertionError("accepted 65 > 64");
            } catch (ProtocolException e) {
                equal(e.code(), ErrorCode.PROTOCOL);
            }
        });
        check("decoder: setMaxPayload raises and lowers the data limit", () -> {
            byte[] f = FrameEncoder.encode(new Frame.PushData(1, 0, ByteBuffer.allocate(40000)));
            FrameDecoder d = new FrameDecoder();
            d.setMaxPayload(65536);
            equal(d.feed(ByteBuffer.wrap(f)).size(), 1);
            d.setMaxPayload(4096);
            try {
                d.feed(ByteBuffer.wrap(f));
                throw new AssertionError("accepted 40000 > 4096");
            } catch (ProtocolException e) {
                equal(e.code(), ErrorCode.PROTOCOL);
            }
        });
        check("decoder: payloads land in the sink's buffer; null discards but keeps the length", () -> {
            ByteBuffer pool = ByteBuffer.allocateDirect(64);
            List<String> calls = new ArrayList<>();
            FrameDecoder d = new FrameDecoder((type, stream, length) -> {
                calls.add(type + "/" + stream + "/" + length);
                if (stream == 2) {
                    return null;
                }
                return pool.duplicate().position(10).limit(10 + length);
            }, 1000);
            byte[] data = FrameEncoder.encode(Frame.BufferResponse.data(1, 0, 3, ByteBuffer.wrap("hello".getBytes())));
            byte[] dropped = FrameEncoder.encode(new Frame.PushData(2, 0, ByteBuffer.wrap(new byte[] {9, 9})));
            byte[] both = ByteBuffer.allocate(data.length + dropped.length).put(data).put(dropped).array();
            List<Frame> out = new ArrayList<>();
            for (byte b : both) {
                d.feed(ByteBuffer.wrap(new byte[] {b}), out::add);
            }
            equal(calls, List.of("BUFFER_RESPONSE/1/5", "PUSH_DATA/2/2"));
            Frame.BufferResponse br = (Frame.BufferResponse) out.get(0);
            equal(br.backlog(), 3L);
            equal(br.payload(), ByteBuffer.wrap("hello".getBytes()));
            byte[] inPool = new byte[5];
            pool.duplicate().position(10).get(inPool);
            equal(new String(inPool), "hello");
            Frame.PushData pd = (Frame.PushData) out.get(1);
            require(pd.payload() == null && pd.length() == 2, "discarded payload: " + pd);
        });
        check("decoder: a sink's CREDIT_VIOLATION refuses the frame", () -> {
            FrameDecoder d = new FrameDecoder((type, stream, length) -> {
                throw new ProtocolException(ErrorCode.CREDIT_VIOLATION, "no credit");
            }, 1000);
            try {
                d.feed(ByteBuffer.wrap(FrameEncoder.encode(new Frame.PushData(1, 0, ByteBuffer.allocate(1)))));
                throw new AssertionError("accepted");
            } catch (ProtocolException e) {
                equal(e.code(), ErrorCode.CREDIT_VIOLATION);
            }
        });
        check("decoder: after an error every call throws it again", () -> {
            FrameDecoder d = new FrameDecoder();
            ProtocolException first = null;
            try {
                d.feed(ByteBuffer.wrap(HEX.parseHex("000000000500000000000001")));
            } catch (ProtocolException e) {
                first = e;
            }
            require(first != null, "unknown type accepted");
            for (int i = 0; i < 2; i++) {
                try {
                    d.feed(ByteBuffer.wrap(FrameEncoder.encode(new Frame.Close())));
                    throw new AssertionError("decoded after an error");
                } catch (ProtocolException e) {
                    require(e == first, "a different error");
                }
            }
            try {
                d.endOfInput();
                throw new AssertionError("endOfInput after an error");
            } catch (ProtocolException e) {
                require(e == first, "a different error");
            }
        });
        check("decoder: Hello, HelloAck and Close only on stream 0", () -> {
            refusedFrame(frame(FrameType.CLOSE, 3, new byte[0]), ErrorCode.PROTOCOL, "Close on stream 3");
            refusedFrame(frame(FrameType.HELLO, 1, helloBody(1, Map.of())), ErrorCode.PROTOCOL, "Hello on stream 1");
            refusedFrame(frame(FrameType.HELLO_ACK, 1, helloBody(2, Map.of())), ErrorCode.PROTOCOL,
                    "HelloAck on stream 1");
        });
        check("decoder: Hello/HelloAck info rules (daemon node, key types, segment_size)", () -> {
            refusedFrame(frame(FrameType.HELLO, 0, helloBody(2, Map.of())), ErrorCode.PROTOCOL, "daemon without node");
            refusedFrame(frame(FrameType.HELLO, 0, helloBody(2, Map.of("node", ""))), ErrorCode.PROTOCOL,
                    "daemon with an empty node");
            refusedFrame(frame(FrameType.HELLO, 0, helloBody(1, Map.of("name", 5))), ErrorCode.PROTOCOL,
                    "name as an int");
            refusedFrame(frame(FrameType.HELLO, 0, helloBody(2, mapOf("node", "a:1", "segment_size", "32k"))),
                    ErrorCode.PROTOCOL, "segment_size as a str");
            refusedFrame(frame(FrameType.HELLO_ACK, 0, helloBody(2, Map.of("segment_size", 1000))), ErrorCode.PROTOCOL,
                    "segment_size not a multiple of 4096");
            refusedFrame(frame(FrameType.HELLO_ACK, 0, helloBody(2, Map.of("segment_size", true))), ErrorCode.PROTOCOL,
                    "segment_size as a bool");
            FrameDecoder d = new FrameDecoder();
            Frame.HelloAck ack = (Frame.HelloAck) d.feed(ByteBuffer.wrap(frame(FrameType.HELLO_ACK, 0,
                    helloBody(2, mapOf("node", "n:1", "segment_size", 65536, "future", List.of(1)))))).get(0);
            equal(ack.segmentSize(), 65536);
            equal(ack.node(), "n:1");
            Frame.HelloAck bare = (Frame.HelloAck) d.feed(ByteBuffer.wrap(frame(FrameType.HELLO_ACK, 0,
                    helloBody(2, Map.of())))).get(0);
            equal(bare.segmentSize(), Wire.DEFAULT_SEGMENT_SIZE);
        });
        check("decoder: Error messages decode leniently, unknown codes mean INTERNAL", () -> {
            byte[] body = ByteBuffer.allocate(5).putShort((short) 999).put(new byte[] {'a', (byte) 0xff, 'b'}).array();
            Frame.ErrorResponse e = (Frame.ErrorResponse) new FrameDecoder()
                    .feed(ByteBuffer.wrap(frame(FrameType.ERROR, 4, body))).get(0);
            equal(e.code(), 999);
            equal(e.errorCode(), ErrorCode.INTERNAL);
            equal(e.message(), "a\ufffdb");
            equal(e.toException().code(), ErrorCode.INTERNAL);
            require(new Frame.ErrorResponse(0, ErrorCode.SEQUENCE_GAP, "x").toException() instanceof ProtocolException,
                    "SEQUENCE_GAP is a protocol error");
        });
        check("decoder: OpenMapOutput with a negative attempt or an int beyond a long is refused", () -> {
            Map<String, Object> m = mapOf("app", "a", "shuffle", 1, "map_index", 0, "attempt", -1, "partitions", 2);
            refusedFrame(frame(FrameType.OPEN_MAP_OUTPUT, 1, new MsgPack.Writer().writeValue(m).toByteArray()),
                    ErrorCode.PROTOCOL, "attempt -1");
            m.put("attempt", 1);
            m.put("shuffle", BigInteger.ONE.shiftLeft(63));
            refusedFrame(frame(FrameType.OPEN_MAP_OUTPUT, 1, new MsgPack.Writer().writeValue(m).toByteArray()),
                    ErrorCode.PROTOCOL, "shuffle 2^63");
            m.put("shuffle", -3);
            Frame.OpenMapOutput o = (Frame.OpenMapOutput) new FrameDecoder().feed(ByteBuffer.wrap(
                    frame(FrameType.OPEN_MAP_OUTPUT, 1, new MsgPack.Writer().writeValue(m).toByteArray()))).get(0);
            equal(o.shuffle(), -3L); // a value check for the daemon (INVALID_REQUEST), not a decoding error
        });
        check("decoder: PartitionRequest locations must map to arrays of u64", () -> {
            Map<String, Object> m = mapOf("app", "a", "shuffle", 1, "start", 0, "end", 1, "locations",
                    Map.of("", 5));
            refusedFrame(frame(FrameType.PARTITION_REQUEST, 1, prefixed(m)), ErrorCode.PROTOCOL, "attempts not a list");
            m.put("locations", Map.of("", List.of("x")));
            refusedFrame(frame(FrameType.PARTITION_REQUEST, 1, prefixed(m)), ErrorCode.PROTOCOL, "attempt as str");
            m.put("locations", Map.of("", List.of(true)));
            refusedFrame(frame(FrameType.PARTITION_REQUEST, 1, prefixed(m)), ErrorCode.PROTOCOL, "attempt as bool");
            m.put("locations", List.of());
            refusedFrame(frame(FrameType.PARTITION_REQUEST, 1, prefixed(m)), ErrorCode.PROTOCOL, "locations array");
        });
        check("decoder: end of input inside a payload is a broken connection", () -> {
            byte[] f = FrameEncoder.encode(new Frame.PushData(1, 0, ByteBuffer.allocate(10)));
            FrameDecoder d = new FrameDecoder();
            d.feed(f, 0, f.length - 1);
            require(d.hasPartialFrame(), "no partial frame");
            try {
                d.endOfInput();
                throw new AssertionError("clean end");
            } catch (ProtocolException e) {
                equal(e.code(), ErrorCode.PROTOCOL);
            }
        });
        check("decoder: a large control body split in small pieces", () -> {
            Map<String, Object> result = mapOf("blob", "y".repeat(300_000), "n", List.of(1, 2, 3));
            byte[] f = FrameEncoder.encode(new Frame.AdminResponse(7, result));
            FrameDecoder d = new FrameDecoder();
            List<Frame> out = new ArrayList<>();
            for (int pos = 0; pos < f.length; pos += 977) {
                d.feed(ByteBuffer.wrap(f, pos, Math.min(977, f.length - pos)), out::add);
            }
            equal(out, List.of(new Frame.AdminResponse(7, result)));
        });
    }

    private void fuzz() {
        check("decoder: corrupted and truncated frames only ever raise ProtocolException", () -> {
            List<byte[]> seeds = new ArrayList<>();
            for (Frame f : sampleFrames()) {
                seeds.add(FrameEncoder.encode(f));
            }
            java.util.Random random = new java.util.Random(7);
            int refused = 0;
            for (int round = 0; round < 20000; round++) {
                byte[] b = seeds.get(random.nextInt(seeds.size())).clone();
                int flips = 1 + random.nextInt(3);
                for (int i = 0; i < flips; i++) {
                    int at = random.nextInt(b.length);
                    int flipped = b[at] ^ (1 << random.nextInt(8));
                    b[at] = (byte) (random.nextInt(4) == 0 ? random.nextInt(256) : flipped);
                }
                if (random.nextInt(8) == 0) {
                    b = Arrays.copyOf(b, random.nextInt(b.length + 1));
                }
                FrameDecoder d = new FrameDecoder();
                try {
                    int step = 1 + random.nextInt(16);
                    for (int pos = 0; pos < b.length; pos += step) {
                        d.feed(ByteBuffer.wrap(b, pos, Math.min(step, b.length - pos)));
                    }
                    d.endOfInput();
                } catch (ProtocolException e) {
                    refused++;
                } catch (RuntimeException e) {
                    throw new AssertionError(HEX.formatHex(b) + ": " + e, e);
                }
            }
            require(refused > 1000, "only " + refused + " corrupted inputs refused");
        });
        check("decoder: nesting in a frame up to MAX_DEPTH decodes, deeper is PROTOCOL", () -> {
            String deep = "91".repeat(MsgPack.MAX_DEPTH - 1) + "c0";
            byte[] ok = HEX.parseHex("81a178" + deep);
            Frame.AdminResponse r = (Frame.AdminResponse) new FrameDecoder()
                    .feed(ByteBuffer.wrap(frame(FrameType.ADMIN_RESPONSE, 1, ok))).get(0);
            equal(FrameEncoder.controlBody(r).length, ok.length);
            refusedFrame(frame(FrameType.ADMIN_RESPONSE, 1, HEX.parseHex("81a17891" + deep)), ErrorCode.PROTOCOL,
                    "one level deeper");
        });
    }

    private static List<Frame> sampleFrames() {
        return List.of(
                new Frame.Hello(Role.CLIENT, Map.of("name", "e")),
                new Frame.Hello(Role.DAEMON, mapOf("node", "n:1", "segment_size", 32768)),
                new Frame.HelloAck(Role.DAEMON, mapOf("node", "n:1", "segment_size", 4096)),
                new Frame.ErrorResponse(5, ErrorCode.PEER_UNAVAILABLE, "gone \u2717"),
                new Frame.Close(),
                new Frame.AuthChallenge(Auth.newNonce(), "p"),
                new Frame.AuthResponse(""),
                new Frame.PartitionRequest(4, 2, "app", 1, 0, 1, Map.of("", new long[] {1L}), "tok"),
                new Frame.OpenMapOutput(5, "app", 0, 0, 1L, 2, "tok"),
                new Frame.PartitionRequest(1, 0, "app", 2, 0, 9, Map.of("", new long[] {-1L, 0L}, "h:1",
                        new long[] {300})),
                new Frame.AddCredit(1, 0xFFFF_FFFFL),
                Frame.BufferResponse.data(1, 0, 0, ByteBuffer.allocate(0)),
                Frame.BufferResponse.data(1, 1, 2, ByteBuffer.wrap(new byte[] {5, 6, 7})),
                Frame.BufferResponse.endOfPartition(1, 1),
                new Frame.CancelPartitionRequest(1),
                new Frame.OpenMapOutput(2, "app", 0, 0, -2L, 1 << 24),
                new Frame.OpenMapOutput(6, "app", 1, 2, 3L, 4, null, 0, null, "commit"),
                new Frame.OpenMapOutput(7, "app", 1, 2, 3L, 4, "tok", 2, "object-store", "commit"),
                new Frame.PushCredit(2, 1),
                new Frame.PushData(2, 0, ByteBuffer.wrap(new byte[] {1})),
                new Frame.PushSlots(2, new long[] {0, 0xFFFF_FFFFL}),
                new Frame.PushPlaced(2, new long[] {1, 0xFFFF_FFFFL, 7, 32768}),
                new Frame.PushPlaced(2, new long[] {1, 0, 7, 32768, 2, 9, 8, 1}),
                new Frame.BufferPlaced(1, new long[] {0, 3, 0xFFFF_FFFFL, 9, 32768}),
                new Frame.BufferPlaced(1, new long[] {1, 2, 0, 9, 1, 2, 1, 7, 10, 100}),
                new Frame.ReturnSlots(new long[] {9, 0xFFFF_FFFFL}),
                new Frame.CommitMapOutput(2, 1),
                new Frame.CommitAck(2, new long[] {1, -1L}),
                new Frame.AbortMapOutput(3),
                new Frame.AbortAck(3),
                new Frame.AdminRequest(4, "stats", Map.of()),
                new Frame.AdminRequest(4, "unregister_shuffle", mapOf("app", "a", "shuffle", 3, "propagate", true)),
                new Frame.AdminResponse(4, mapOf("bin", new byte[] {0}, "big", BigInteger.ONE.shiftLeft(64)
                        .subtract(BigInteger.ONE), "neg", -5, "nil", null, "list", List.of(List.of(), Map.of()))));
    }

    private static byte[] prefixed(Map<String, Object> m) {
        byte[] map = new MsgPack.Writer().writeValue(m).toByteArray();
        return ByteBuffer.allocate(4 + map.length).putInt(2).put(map).array();
    }

    // ------------------------------------------------------------------------------------------ encoder

    private void encoder() {
        check("encoder: frames refuse values a sender must not send", () -> {
            Body[] bad = {
                () -> new Frame.AddCredit(1, 0),
                () -> new Frame.PushCredit(1, 0),
                () -> new Frame.PushSlots(1, new long[0]),
                () -> new Frame.PushPlaced(1, new long[] {0, 0, 1L << 32, 1}),
                () -> new Frame.PushPlaced(1, new long[] {0, 0, 1}),
                () -> new Frame.BufferPlaced(1, new long[] {0, 0, 0, 1}),
                () -> new Frame.ReturnSlots(new long[0]),
                () -> new Frame.AddCredit(-1, 1),
                () -> new Frame.CommitMapOutput(1, 1L << 32),
                () -> new Frame.ErrorResponse(0, 70000, ""),
                () -> new Frame.BufferResponse(1, 0, 0, BufferKind.END_OF_PARTITION, 1, ByteBuffer.allocate(1), 0),
                () -> new Frame.BufferResponse(1, 0, 0, BufferKind.END_OF_PARTITION, 0, null, 5),
                () -> new Frame.PushData(1, 0, 3, ByteBuffer.allocate(2), 0),
                () -> FrameEncoder.encode(new Frame.PushData(1, 0, 3, null, 0)),
                () -> FrameEncoder.encode(new Frame.AdminResponse(1, Map.of("x", "y".repeat(Wire.MAX_CONTROL_BODY)))),
                () -> new Frame.OpenMapOutput(1, "app", 0, 0, 1, 1, null, 0, null, "always"),
            };
            for (int i = 0; i < bad.length; i++) {
                try {
                    bad[i].run();
                    throw new AssertionError("case " + i + " accepted");
                } catch (IllegalArgumentException expected) {
                    // refused
                }
            }
        });
        check("encoder: prefix writers match whole-frame encoding; payload position untouched", () -> {
            ByteBuffer payload = ByteBuffer.wrap("abcdef".getBytes()).position(2);
            Frame.BufferResponse b = Frame.BufferResponse.data(3, 4, 5, payload);
            byte[] whole = FrameEncoder.encode(b);
            equal(payload.position(), 2);
            ByteBuffer prefix = ByteBuffer.allocate(FrameEncoder.BUFFER_RESPONSE_PREFIX);
            FrameEncoder.writeBufferResponsePrefix(prefix, 3, 4, 5, BufferKind.DATA, 4, Wire.crc32c(payload));
            require(Arrays.equals(Arrays.copyOf(whole, prefix.capacity()), prefix.array()), "BufferResponse prefix");
            equal(new String(whole, prefix.capacity(), 4), "cdef");
            ByteBuffer p2 = ByteBuffer.allocate(FrameEncoder.PUSH_DATA_PREFIX);
            FrameEncoder.writePushDataPrefix(p2, 9, 0xFFFF_FFFFL, 4, Wire.crc32c(ByteBuffer.wrap(new byte[4])));
            byte[] whole2 = FrameEncoder.encode(new Frame.PushData(9, 0xFFFF_FFFFL, ByteBuffer.wrap(new byte[4])));
            require(Arrays.equals(Arrays.copyOf(whole2, p2.capacity()), p2.array()), "PushData prefix");
        });
        check("encoder: round trip of every frame type through the decoder", () -> {
            List<Frame> frames = sampleFrames();
            ByteBuffer all = ByteBuffer.allocate(4096);
            for (Frame f : frames) {
                FrameEncoder.encode(f, all);
            }
            FrameDecoder d = new FrameDecoder();
            List<Frame> out = d.feed(all.flip());
            d.endOfInput();
            equal(out, frames);
            require(out.stream().map(Frame::type).distinct().count() == FrameType.values().length, "types missing");
        });
    }

    // ------------------------------------------------------------------------------------------ constants

    private void constants() {
        check("constants: frame type codes are unique and found by fromCode", () -> {
            for (FrameType t : FrameType.values()) {
                equal(FrameType.fromCode(t.code()), t);
            }
            require(FrameType.fromCode(0) == null && FrameType.fromCode(0x07) == null
                    && FrameType.fromCode(0x32) == null && FrameType.fromCode(-1) == null, "unknown codes");
        });
        check("constants: error codes ascend from 1 and unknown ones map to INTERNAL", () -> {
            ErrorCode[] all = ErrorCode.values();
            equal(all[0].code(), 1);
            for (int i = 1; i < all.length; i++) {
                require(all[i].code() > all[i - 1].code(), "ascending codes at " + all[i]);
            }
            int max = all[all.length - 1].code();
            equal(ErrorCode.fromWire(0), ErrorCode.INTERNAL);
            equal(ErrorCode.fromWire(max + 1), ErrorCode.INTERNAL);
            require(ErrorCode.byCode(max + 1) == null, "byCode(max + 1)");
        });
    }
}
