package io.shuffled.client.wire;

import java.math.BigInteger;
import java.nio.ByteBuffer;
import java.nio.CharBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CharsetDecoder;
import java.nio.charset.CharsetEncoder;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * The subset of MessagePack the protocol uses (PROTOCOL.md §3.2): nil, bool, int (every width up to
 * uint64/int64), str, bin, array and map with str keys. Floats, ext types and the unused byte 0xc1 are
 * refused.
 *
 * <p>Value model, as the {@link Reader} returns it and {@link #normalize} produces it: {@code null},
 * {@link Boolean}, {@link Long} (every integer that fits a signed long), {@link BigInteger} (only for
 * uint64 values 2^63..2^64−1), {@link String}, {@link Bin}, unmodifiable {@link List} and unmodifiable
 * insertion-ordered {@link Map} with {@link String} keys. Values normalized this way compare with
 * {@code equals}.
 *
 * <p>The {@link Writer} writes the shortest form of every integer, string, array and map header, the
 * way msgpack-python ({@code packb(obj, use_bin_type=True)}) does, so its bytes match the golden vectors.
 */
public final class MsgPack {
    private MsgPack() {}

    /** Nesting deeper than this is refused (by both the reader and {@link #normalize}). */
    public static final int MAX_DEPTH = 512;

    private static final BigInteger TWO_64 = BigInteger.ONE.shiftLeft(64);
    private static final BigInteger LONG_MIN = BigInteger.valueOf(Long.MIN_VALUE);

    /** A msgpack bin value; compares by content. */
    public record Bin(byte[] bytes) {
        public Bin {
            bytes = bytes.clone();
        }

        @Override
        public byte[] bytes() {
            return bytes.clone();
        }

        public int length() {
            return bytes.length;
        }

        @Override
        public boolean equals(Object o) {
            return o instanceof Bin b && Arrays.equals(bytes, b.bytes);
        }

        @Override
        public int hashCode() {
            return Arrays.hashCode(bytes);
        }

        @Override
        public String toString() {
            return "Bin[" + java.util.HexFormat.of().formatHex(bytes) + "]";
        }
    }

    // ------------------------------------------------------------------------------------------ value model

    /**
     * A value in the model above: integers of any Java type become Long (or BigInteger for
     * 2^63..2^64−1), {@code byte[]} becomes {@link Bin}, maps and lists become unmodifiable copies.
     *
     * @throws IllegalArgumentException for a value msgpack-in-this-protocol cannot carry (floats,
     *     non-string map keys, integers outside −2^63..2^64−1, other objects)
     */
    public static Object normalize(Object value) {
        return normalize(value, 0);
    }

    /** {@link #normalize} for a map; {@code null} becomes the empty map. */
    public static Map<String, Object> normalizeMap(Map<String, ?> map) {
        if (map == null) {
            return Collections.emptyMap();
        }
        return normalizeMap(map, 0);
    }

    private static Object normalize(Object value, int depth) {
        if (depth > MAX_DEPTH) {
            throw new IllegalArgumentException("values nested deeper than " + MAX_DEPTH);
        }
        if (value == null || value instanceof Boolean || value instanceof String || value instanceof Bin) {
            return value;
        }
        if (value instanceof Long || value instanceof Integer || value instanceof Short || value instanceof Byte) {
            return ((Number) value).longValue();
        }
        if (value instanceof BigInteger b) {
            if (b.compareTo(LONG_MIN) < 0 || b.compareTo(TWO_64) >= 0) {
                throw new IllegalArgumentException("integer " + b + " is outside -2^63..2^64-1");
            }
            return b.bitLength() < 64 ? (Object) b.longValue() : b;
        }
        if (value instanceof byte[] bytes) {
            return new Bin(bytes);
        }
        if (value instanceof Map<?, ?> m) {
            return normalizeMap(m, depth);
        }
        if (value instanceof List<?> list) {
            List<Object> out = new ArrayList<>(list.size());
            for (Object item : list) {
                out.add(normalize(item, depth + 1));
            }
            return Collections.unmodifiableList(out);
        }
        throw new IllegalArgumentException("cannot encode a " + value.getClass().getName() + " as msgpack");
    }

    private static Map<String, Object> normalizeMap(Map<?, ?> map, int depth) {
        Map<String, Object> out = new LinkedHashMap<>(Math.max(4, map.size() * 2));
        for (Map.Entry<?, ?> e : map.entrySet()) {
            if (!(e.getKey() instanceof String key)) {
                throw new IllegalArgumentException("map keys must be strings, got " + e.getKey());
            }
            out.put(key, normalize(e.getValue(), depth + 1));
        }
        return Collections.unmodifiableMap(out);
    }

    // ------------------------------------------------------------------------------------------ writer

    /** Appends msgpack to a growable byte array. */
    public static final class Writer {
        private byte[] buf;
        private int size;
        private final CharsetEncoder utf8 = StandardCharsets.UTF_8.newEncoder()
                .onMalformedInput(CodingErrorAction.REPORT)
                .onUnmappableCharacter(CodingErrorAction.REPORT);

        public Writer() {
            this(64);
        }

        public Writer(int initialCapacity) {
            buf = new byte[Math.max(16, initialCapacity)];
        }

        public int size() {
            return size;
        }

        public byte[] toByteArray() {
            return Arrays.copyOf(buf, size);
        }

        /** Copies what was written into {@code out}. */
        public void writeTo(ByteBuffer out) {
            out.put(buf, 0, size);
        }

        private void ensure(int more) {
            if (size + more > buf.length) {
                long want = Math.max((long) buf.length * 2, (long) size + more);
                if (want > Integer.MAX_VALUE - 8) {
                    throw new IllegalArgumentException("msgpack value too large");
                }
                buf = Arrays.copyOf(buf, (int) want);
            }
        }

        private void put1(int b) {
            ensure(1);
            buf[size++] = (byte) b;
        }

        private void putN(int tag, long value, int bytes) {
            ensure(1 + bytes);
            buf[size++] = (byte) tag;
            for (int shift = 8 * (bytes - 1); shift >= 0; shift -= 8) {
                buf[size++] = (byte) (value >>> shift);
            }
        }

        public Writer writeNil() {
            put1(0xc0);
            return this;
        }

        public Writer writeBool(boolean v) {
            put1(v ? 0xc3 : 0xc2);
            return this;
        }

        /** A signed integer in its shortest form (non-negative values use the unsigned forms). */
        public Writer writeSigned(long v) {
            if (v >= 0) {
                return writeUnsigned(v);
            }
            if (v >= -32) {
                put1((int) v & 0xff); // negative fixint
            } else if (v >= Byte.MIN_VALUE) {
                putN(0xd0, v, 1);
            } else if (v >= Short.MIN_VALUE) {
                putN(0xd1, v, 2);
            } else if (v >= Integer.MIN_VALUE) {
                putN(0xd2, v, 4);
            } else {
                putN(0xd3, v, 8);
            }
            return this;
        }

        /** The bits of {@code v} as an unsigned 64-bit integer (u64 fields), shortest form. */
        public Writer writeUnsigned(long v) {
            if (v >= 0 && v <= 0x7f) {
                put1((int) v);
            } else if (v >= 0 && v <= 0xff) {
                putN(0xcc, v, 1);
            } else if (v >= 0 && v <= 0xffff) {
                putN(0xcd, v, 2);
            } else if (v >= 0 && v <= Wire.MAX_U32) {
                putN(0xce, v, 4);
            } else {
                putN(0xcf, v, 8); // includes 2^63..2^64-1, whose bits are negative as a long
            }
            return this;
        }

        /** An integer in −2^63..2^64−1. */
        public Writer writeInteger(BigInteger v) {
            if (v.signum() >= 0 && v.compareTo(TWO_64) < 0) {
                return writeUnsigned(v.longValue());
            }
            if (v.compareTo(LONG_MIN) >= 0 && v.signum() < 0) {
                return writeSigned(v.longValue());
            }
            throw new IllegalArgumentException("integer " + v + " is outside -2^63..2^64-1");
        }

        /** A str (UTF-8); strings that are not valid Unicode (lone surrogates) are refused. */
        public Writer writeString(String s) {
            byte[] bytes;
            if (isAscii(s)) {
                bytes = s.getBytes(StandardCharsets.ISO_8859_1);
            } else {
                try {
                    ByteBuffer encoded = utf8.reset().encode(CharBuffer.wrap(s));
                    bytes = new byte[encoded.remaining()];
                    encoded.get(bytes);
                } catch (CharacterCodingException e) {
                    throw new IllegalArgumentException("string is not valid Unicode: " + e);
                }
            }
            int n = bytes.length;
            if (n <= 31) {
                put1(0xa0 | n);
            } else if (n <= 0xff) {
                putN(0xd9, n, 1);
            } else if (n <= 0xffff) {
                putN(0xda, n, 2);
            } else {
                putN(0xdb, n, 4);
            }
            ensure(n);
            System.arraycopy(bytes, 0, buf, size, n);
            size += n;
            return this;
        }

        private static boolean isAscii(String s) {
            for (int i = 0; i < s.length(); i++) {
                if (s.charAt(i) >= 0x80) {
                    return false;
                }
            }
            return true;
        }

        public Writer writeBin(byte[] b) {
            int n = b.length;
            if (n <= 0xff) {
                putN(0xc4, n, 1);
            } else if (n <= 0xffff) {
                putN(0xc5, n, 2);
            } else {
                putN(0xc6, n, 4);
            }
            ensure(n);
            System.arraycopy(b, 0, buf, size, n);
            size += n;
            return this;
        }

        public Writer writeArrayHeader(int n) {
            if (n < 0) {
                throw new IllegalArgumentException("negative array size");
            }
            if (n <= 15) {
                put1(0x90 | n);
            } else if (n <= 0xffff) {
                putN(0xdc, n, 2);
            } else {
                putN(0xdd, n, 4);
            }
            return this;
        }

        public Writer writeMapHeader(int n) {
            if (n < 0) {
                throw new IllegalArgumentException("negative map size");
            }
            if (n <= 15) {
                put1(0x80 | n);
            } else if (n <= 0xffff) {
                putN(0xde, n, 2);
            } else {
                putN(0xdf, n, 4);
            }
            return this;
        }

        /** Any value {@link MsgPack#normalize} accepts; maps keep their iteration order. */
        public Writer writeValue(Object value) {
            return writeValue(value, 0);
        }

        private Writer writeValue(Object value, int depth) {
            if (depth > MAX_DEPTH) {
                throw new IllegalArgumentException("values nested deeper than " + MAX_DEPTH);
            }
            if (value == null) {
                return writeNil();
            }
            if (value instanceof Boolean b) {
                return writeBool(b);
            }
            if (value instanceof String s) {
                return writeString(s);
            }
            if (value instanceof Long || value instanceof Integer || value instanceof Short || value instanceof Byte) {
                return writeSigned(((Number) value).longValue());
            }
            if (value instanceof BigInteger b) {
                return writeInteger(b);
            }
            if (value instanceof Bin b) {
                return writeBin(b.bytes);
            }
            if (value instanceof byte[] b) {
                return writeBin(b);
            }
            if (value instanceof Map<?, ?> m) {
                writeMapHeader(m.size());
                for (Map.Entry<?, ?> e : m.entrySet()) {
                    if (!(e.getKey() instanceof String key)) {
                        throw new IllegalArgumentException("map keys must be strings, got " + e.getKey());
                    }
                    writeString(key);
                    writeValue(e.getValue(), depth + 1);
                }
                return this;
            }
            if (value instanceof List<?> list) {
                writeArrayHeader(list.size());
                for (Object item : list) {
                    writeValue(item, depth + 1);
                }
                return this;
            }
            throw new IllegalArgumentException("cannot encode a " + value.getClass().getName() + " as msgpack");
        }
    }

    // ------------------------------------------------------------------------------------------ reader

    /**
     * Reads msgpack from a byte range, strictly: truncated values, unsupported types, invalid UTF-8 in a
     * str, non-str map keys, duplicate map keys and excessive nesting are {@link ProtocolException}s
     * ({@link ErrorCode#PROTOCOL}).
     */
    public static final class Reader {
        private final byte[] buf;
        private final int end;
        private int pos;
        private final String what;
        private final CharsetDecoder utf8 = StandardCharsets.UTF_8.newDecoder()
                .onMalformedInput(CodingErrorAction.REPORT)
                .onUnmappableCharacter(CodingErrorAction.REPORT);

        /** @param what names the frame in error messages */
        public Reader(byte[] buf, int offset, int length, String what) {
            if (offset < 0 || length < 0 || offset + length > buf.length) {
                throw new IndexOutOfBoundsException("bad range");
            }
            this.buf = buf;
            this.pos = offset;
            this.end = offset + length;
            this.what = what;
        }

        public boolean atEnd() {
            return pos == end;
        }

        public int remaining() {
            return end - pos;
        }

        private ProtocolException bad(String message) {
            return new ProtocolException(what + ": body is not valid msgpack (" + message + ")");
        }

        private void need(long n) throws ProtocolException {
            if (n > end - pos) {
                throw bad("value needs " + n + " more bytes, " + (end - pos) + " left");
            }
        }

        private long readN(int bytes) throws ProtocolException {
            need(bytes);
            long v = 0;
            for (int i = 0; i < bytes; i++) {
                v = (v << 8) | (buf[pos++] & 0xff);
            }
            return v;
        }

        /** The next value, in the model described on {@link MsgPack}. */
        public Object readValue() throws ProtocolException {
            return readValue(0);
        }

        /**
         * The whole range as exactly one map (PROTOCOL.md §3.2: a control body is one map that fills it).
         */
        public Map<String, Object> readWholeMap() throws ProtocolException {
            if (atEnd()) {
                throw bad("empty body, a map is required");
            }
            int tag = buf[pos] & 0xff;
            if (!((tag >= 0x80 && tag <= 0x8f) || tag == 0xde || tag == 0xdf)) {
                throw new ProtocolException(what + ": body must be a msgpack map");
            }
            @SuppressWarnings("unchecked")
            Map<String, Object> map = (Map<String, Object>) readValue(0);
            if (!atEnd()) {
                throw bad((end - pos) + " bytes after the map");
            }
            return map;
        }

        private Object readValue(int depth) throws ProtocolException {
            if (depth > MAX_DEPTH) {
                throw bad("nested deeper than " + MAX_DEPTH);
            }
            need(1);
            int tag = buf[pos++] & 0xff;
            if (tag <= 0x7f) {
                return (long) tag;
            }
            if (tag >= 0xe0) {
                return (long) (byte) tag;
            }
            if (tag <= 0x8f) {
                return readMap(tag & 0x0f, depth);
            }
            if (tag <= 0x9f) {
                return readArray(tag & 0x0f, depth);
            }
            if (tag <= 0xbf) {
                return readStr(tag & 0x1f);
            }
            switch (tag) {
                case 0xc0:
                    return null;
                case 0xc2:
                    return Boolean.FALSE;
                case 0xc3:
                    return Boolean.TRUE;
                case 0xc4:
                    return readBin(readN(1));
                case 0xc5:
                    return readBin(readN(2));
                case 0xc6:
                    return readBin(readN(4));
                case 0xcc:
                    return readN(1);
                case 0xcd:
                    return readN(2);
                case 0xce:
                    return readN(4);
                case 0xcf: {
                    long bits = readN(8);
                    return bits >= 0 ? (Object) bits : new BigInteger(Long.toUnsignedString(bits));
                }
                case 0xd0:
                    return (long) (byte) readN(1);
                case 0xd1:
                    return (long) (short) readN(2);
                case 0xd2:
                    return (long) (int) readN(4);
                case 0xd3:
                    return readN(8);
                case 0xd9:
                    return readStr(readN(1));
                case 0xda:
                    return readStr(readN(2));
                case 0xdb:
                    return readStr(readN(4));
                case 0xdc:
                    return readArray(readN(2), depth);
                case 0xdd:
                    return readArray(readN(4), depth);
                case 0xde:
                    return readMap(readN(2), depth);
                case 0xdf:
                    return readMap(readN(4), depth);
                case 0xca:
                case 0xcb:
                    throw bad("floats are not used by the protocol");
                case 0xc7:
                case 0xc8:
                case 0xc9:
                case 0xd4:
                case 0xd5:
                case 0xd6:
                case 0xd7:
                case 0xd8:
                    throw bad("ext types are not used by the protocol");
                default: // 0xc1
                    throw bad(String.format("byte 0x%02x is never used", tag));
            }
        }

        private String readStr(long n) throws ProtocolException {
            need(n);
            int len = (int) n;
            String s;
            try {
                s = utf8.reset().decode(ByteBuffer.wrap(buf, pos, len)).toString();
            } catch (CharacterCodingException e) {
                throw bad("str is not valid UTF-8");
            }
            pos += len;
            return s;
        }

        private Bin readBin(long n) throws ProtocolException {
            need(n);
            int len = (int) n;
            Bin b = new Bin(Arrays.copyOfRange(buf, pos, pos + len));
            pos += len;
            return b;
        }

        private List<Object> readArray(long n, int depth) throws ProtocolException {
            need(n); // every element takes at least one byte: refuse absurd counts before allocating
            List<Object> out = new ArrayList<>((int) n);
            for (long i = 0; i < n; i++) {
                out.add(readValue(depth + 1));
            }
            return Collections.unmodifiableList(out);
        }

        private Map<String, Object> readMap(long n, int depth) throws ProtocolException {
            need(2 * n); // every entry takes at least two bytes
            Map<String, Object> out = new LinkedHashMap<>((int) Math.min(2 * n + 2, 1 << 16));
            for (long i = 0; i < n; i++) {
                Object key = readValue(depth + 1);
                if (!(key instanceof String k)) {
                    throw bad("map keys must be str, got " + describe(key));
                }
                Object value = readValue(depth + 1);
                if (out.containsKey(k)) {
                    throw bad("duplicate map key '" + k + "'");
                }
                out.put(k, value);
            }
            return Collections.unmodifiableMap(out);
        }
    }

    /** The msgpack type of a model value, for error messages. */
    public static String describe(Object value) {
        if (value == null) {
            return "nil";
        }
        if (value instanceof Boolean) {
            return "bool";
        }
        if (value instanceof Long || value instanceof BigInteger) {
            return "int";
        }
        if (value instanceof String) {
            return "str";
        }
        if (value instanceof Bin) {
            return "bin";
        }
        if (value instanceof List) {
            return "array";
        }
        if (value instanceof Map) {
            return "map";
        }
        return value.getClass().getSimpleName();
    }
}
