package io.shuffled.client;

import io.shuffled.client.wire.Auth;
import io.shuffled.client.wire.BufferKind;
import io.shuffled.client.wire.ErrorCode;
import io.shuffled.client.wire.Frame;
import io.shuffled.client.wire.FrameDecoder;
import io.shuffled.client.wire.FrameEncoder;
import io.shuffled.client.wire.FrameType;
import io.shuffled.client.wire.MsgPack;
import io.shuffled.client.wire.ProtocolException;
import io.shuffled.client.wire.Role;
import io.shuffled.client.wire.ShuffledException;
import io.shuffled.client.wire.U32s;
import io.shuffled.client.wire.Wire;
import java.io.BufferedOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.InterruptedIOException;
import java.io.OutputStream;
import java.net.SocketTimeoutException;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import javax.net.ssl.SSLContext;

/**
 * A blocking client for one shuffled daemon over one connection (PROTOCOL.md). Thread-safe: any
 * number of threads may open writers, readers and admin calls concurrently; a single writer or reader
 * must be used by one thread at a time.
 *
 * <p>One reader thread per connection decodes frames and dispatches them to the open streams. Frames
 * are written under one lock, each frame whole and flushed. Stream ids come from a counter starting at
 * 1 that wraps from 2^32−1 to 1 (§5).
 *
 * <p>Every wait (handshake, push credit, acks, admin responses, read data) is bounded by the
 * client's {@code timeoutMillis}; running out gives a {@link SocketTimeoutException}. Errors the daemon
 * reports come as {@link ShuffledException} with the wire code; when the connection breaks every open
 * stream fails with {@link ErrorCode#CONNECTION_LOST} (or the code of a fatal Error on stream 0).
 */
public final class ShuffleClient implements AutoCloseable {
    private static final byte[] NO_BYTES = new byte[0];

    /** Default bound of every blocking wait. */
    public static final long DEFAULT_TIMEOUT_MILLIS = 60_000;
    /** Default size of one writer's buffer, which holds bytes for all partitions until they are pushed. */
    public static final long DEFAULT_WRITER_BUFFER_BYTES = 16L << 20;

    /** What an open stream does with the frames and errors for it. Called on the reader thread. */
    interface StreamHandler {
        void onFrame(Frame frame) throws ShuffledException;

        void onError(ShuffledException error);

        /** Whether a DATA payload for this stream is wanted now (false: the decoder discards it). */
        default boolean wantsPayload() {
            return true;
        }
    }

    private final String address;
    private final Transport transport;
    private final OutputStream out;
    private final Object writeLock = new Object();
    private final FrameDecoder decoder;
    private final Thread readerThread;
    private final long timeoutMillis;
    private final long writerBufferBytes;
    private final Map<Long, StreamHandler> streams = new ConcurrentHashMap<>();
    private final CompletableFuture<Frame.HelloAck> ready = new CompletableFuture<>();
    private final Object idLock = new Object();
    private long nextStream = 1;
    private volatile ShuffledException lost;
    private volatile int segmentSize;
    /** The connection's region of shared memory (§6.3), null: pushes go through the socket. */
    private volatile SharedRegion region;
    /** The daemon may put the buffers of reads in the region (§6.3). */
    private volatile boolean readsInPlace;
    private volatile String daemonNode = "";
    /** The cluster secret (§6.1), null: none; the nonce this client sent in Hello. */
    private final byte[] secret;
    private final String nonce;
    private volatile boolean challenged;
    /** The application secret (§6.2), null: requests carry no token; tokens by application id. */
    private final byte[] appSecret;
    private final Map<String, String> tokens = new ConcurrentHashMap<>();

    private ShuffleClient(
            String address,
            Transport transport,
            long timeoutMillis,
            long writerBufferBytes,
            String secret,
            String appSecret,
            String nonce)
            throws IOException {
        this.address = address;
        this.nonce = nonce;
        this.secret = secret == null ? null : Auth.secretBytes(secret);
        this.appSecret = appSecret == null ? null : Auth.secretBytes(appSecret);
        this.transport = transport;
        this.out = new BufferedOutputStream(transport.output(), 64 << 10);
        this.timeoutMillis = timeoutMillis;
        this.writerBufferBytes = writerBufferBytes;
        this.decoder = new FrameDecoder(this::payloadTarget, Wire.DEFAULT_MAX_PAYLOAD);
        this.readerThread = new Thread(this::readLoop, "shuffled-client-reader " + address);
        this.readerThread.setDaemon(true);
        transport.trust(readerThread);
    }

    /**
     * Connects to {@code host:port}, {@code [ipv6]:port}, {@code tls:host:port} (checked against the JDK's
     * trust store) or {@code unix:/path} with the default timeouts.
     */
    public static ShuffleClient connect(String address) throws IOException {
        return connect(address, "jvm-client", DEFAULT_TIMEOUT_MILLIS, DEFAULT_WRITER_BUFFER_BYTES);
    }

    /**
     * Connects and does the handshake (Hello with role CLIENT, then HelloAck, §6).
     *
     * @param name informational name sent in Hello (e.g. the executor id)
     * @param timeoutMillis bound of the connect, the handshake and every later blocking wait
     * @param writerBufferBytes the size of each writer's one buffer: it collects bytes for all partitions
     *     and is pushed, ordered by partition and packed, when full (see {@link MapOutputWriter})
     */
    public static ShuffleClient connect(String address, String name, long timeoutMillis, long writerBufferBytes)
            throws IOException {
        return connect(address, name, timeoutMillis, writerBufferBytes, null, null);
    }

    /**
     * Connects with credentials (§6.1, §6.2).
     *
     * @param secret the cluster's shared secret (the daemon's {@code --secret-file}), or null; with it the
     *     client and the daemon prove to each other that they know it, and a wrong one fails here with
     *     {@link ErrorCode#AUTH_FAILED}
     * @param appSecret the application's secret, or null: requests then carry a token derived from it, and
     *     a daemon refuses requests about an application whose first writer had another one
     */
    public static ShuffleClient connect(
            String address, String name, long timeoutMillis, long writerBufferBytes, String secret, String appSecret)
            throws IOException {
        return connect(address, name, timeoutMillis, writerBufferBytes, secret, appSecret, null);
    }

    /**
     * Connects with credentials, over TLS for a {@code tls:host:port} address (the daemon's client TLS port).
     *
     * @param tls the context that checks the daemon's certificate and holds the client's own, if the daemon
     *     asks for one ({@link PemTls#context}); null: the JDK's defaults. Only for a {@code tls:} address: with
     *     any other, an {@link IllegalArgumentException}. A certificate refused on either side is a
     *     {@link ShuffledException} naming the address and the reason.
     */
    public static ShuffleClient connect(
            String address,
            String name,
            long timeoutMillis,
            long writerBufferBytes,
            String secret,
            String appSecret,
            SSLContext tls)
            throws IOException {
        boolean local = address.startsWith(Transport.UNIX); // the daemon's host: shared memory, if it offers it
        try {
            return open(address, name, timeoutMillis, writerBufferBytes, secret, appSecret, tls, local);
        } catch (RegionUnmapped e) {
            return open(address, name, timeoutMillis, writerBufferBytes, secret, appSecret, tls, false);
        }
    }

    private static ShuffleClient open(String address, String name, long timeoutMillis, long writerBufferBytes,
            String secret, String appSecret, SSLContext tls, boolean sharedMemory) throws IOException {
        Transport transport;
        try {
            transport = Transport.open(address, timeoutMillis, tls);
        } catch (IOException e) {
            throw cannotConnect(address, e);
        }
        return handshake(transport, address, name, timeoutMillis, writerBufferBytes, secret, appSecret,
                Auth.newNonce(), sharedMemory);
    }

    /** A region of shared memory the daemon offered that this client cannot map: it connects without one. */
    private static final class RegionUnmapped extends IOException {
        private static final long serialVersionUID = 1L;

        RegionUnmapped(IOException cause) {
            super(cause);
        }
    }

    /**
     * The handshake over a transport already open: Hello with {@code nonce}, then the challenge if the
     * daemon has a secret, then HelloAck. Package-private so the conversation checks can replay recorded
     * conversations through this client over an in-memory transport, with the nonce they were recorded with.
     */
    static ShuffleClient handshake(Transport transport, String address, String name, long timeoutMillis,
            long writerBufferBytes, String secret, String appSecret, String nonce) throws IOException {
        return handshake(transport, address, name, timeoutMillis, writerBufferBytes, secret, appSecret, nonce, false);
    }

    /** As above; {@code sharedMemory}: ask for a region of shared memory (§6.3) and map the one offered. */
    private static ShuffleClient handshake(Transport transport, String address, String name, long timeoutMillis,
            long writerBufferBytes, String secret, String appSecret, String nonce, boolean sharedMemory)
            throws IOException {
        ShuffleClient client;
        try {
            client = new ShuffleClient(address, transport, timeoutMillis, writerBufferBytes, secret, appSecret, nonce);
        } catch (IOException e) {
            transport.close();
            throw cannotConnect(address, e);
        }
        client.readerThread.start();
        try {
            Map<String, Object> info = new LinkedHashMap<>();
            info.put("name", name);
            if (sharedMemory) {
                info.put("features", List.of(Wire.SHM, Wire.SHM_READ));
            }
            info.put("nonce", client.nonce);
            Frame.HelloAck ack;
            try {
                client.send(FrameEncoder.encode(new Frame.Hello(Role.CLIENT, info)));
                ack = client.await(client.ready, "HelloAck");
            } catch (ShuffledException e) {
                throw lostBeforeHelloAck(address, e);
            }
            client.daemonNode = ack.node() == null ? "" : ack.node();
            client.segmentSize = ack.segmentSize();
            try {
                client.region = sharedMemory ? SharedRegion.of(ack) : null;
                client.readsInPlace = client.region != null && ack.agrees(Wire.SHM_READ);
            } catch (IOException e) {
                throw new RegionUnmapped(e);
            }
        } catch (IOException | RuntimeException e) {
            client.close();
            throw e;
        }
        return client;
    }

    /** A connection over TLS that ends before HelloAck most likely ended for the reason the hint gives. */
    private static ShuffledException lostBeforeHelloAck(String address, ShuffledException e) {
        if (e.code() != ErrorCode.CONNECTION_LOST || !address.startsWith(Transport.TLS)) {
            return e;
        }
        ShuffledException explained =
                new ShuffledException(ErrorCode.CONNECTION_LOST, e.getMessage() + Transport.ENDED_OVER_TLS);
        explained.initCause(e);
        return explained;
    }

    private static ShuffledException cannotConnect(String address, IOException e) {
        ShuffledException error = new ShuffledException(
                ErrorCode.CONNECTION_LOST, "cannot connect to shuffled at " + address + ": " + e.getMessage());
        error.initCause(e);
        return error;
    }

    // ------------------------------------------------------------------------------------------ public API

    /** The daemon's segment size from HelloAck: the largest payload and the size PushData is filled to. */
    public int segmentSize() {
        return segmentSize;
    }

    /** The daemon's node name from HelloAck ("" if it sent none). */
    public String daemonNode() {
        return daemonNode;
    }

    public String address() {
        return address;
    }

    /** False once the connection broke or was closed; a broken client stays broken (connect anew). */
    public boolean isOpen() {
        return lost == null;
    }

    /** Opens one map attempt's output, as many copies as the daemon's setting says (see below). */
    public MapOutputWriter openWriter(String app, long shuffle, long mapIndex, long attemptId, int numPartitions)
            throws IOException {
        return openWriter(app, shuffle, mapIndex, attemptId, numPartitions, 0);
    }

    /**
     * Opens one map attempt's output and waits for the daemon's first push credit (§12). {@code replicas}:
     * how many daemons should hold it, 1..{@link Wire#MAX_REPLICAS} (the daemon copies it to the others
     * before it acknowledges the commit), or 0 for the daemon's own setting.
     */
    public MapOutputWriter openWriter(
            String app, long shuffle, long mapIndex, long attemptId, int numPartitions, int replicas)
            throws IOException {
        return openWriter(app, shuffle, mapIndex, attemptId, numPartitions, replicas, null);
    }

    /**
     * As above; {@code durability}: {@code "object-store"} asks the daemon to upload the committed output to
     * its object store so any daemon can serve it once this one's host is lost, {@code "none"} not to, null
     * leaves it to the daemon's setting (§12.5).
     */
    public MapOutputWriter openWriter(String app, long shuffle, long mapIndex, long attemptId, int numPartitions,
            int replicas, String durability) throws IOException {
        return openWriter(app, shuffle, mapIndex, attemptId, numPartitions, replicas, durability, null);
    }

    /**
     * As above; {@code fsync}: {@code "commit"} makes {@link MapOutputWriter#commit} return only once the
     * output and its journal record are fsynced on the daemon (and its replicas), so that it survives the
     * machine's power loss whatever the daemon's {@code fsync} setting; null leaves it to that setting (§7.8).
     * A daemon without a data dir refuses {@code "commit"} with INVALID_REQUEST.
     */
    public MapOutputWriter openWriter(String app, long shuffle, long mapIndex, long attemptId, int numPartitions,
            int replicas, String durability, String fsync) throws IOException {
        check();
        if (numPartitions < 1 || numPartitions > Wire.MAX_PARTITIONS) {
            throw new IllegalArgumentException("numPartitions must be in 1.." + Wire.MAX_PARTITIONS);
        }
        long id = newStreamId();
        // Built first: a value the frame refuses must not leave a stream behind.
        Frame.OpenMapOutput open = new Frame.OpenMapOutput(id, app, shuffle, mapIndex, attemptId, numPartitions,
                token(app), replicas, durability, fsync);
        MapOutputWriter writer =
                new MapOutputWriter(this, id, attemptId, numPartitions, segmentSize, writerBufferBytes);
        streams.put(id, writer.handler());
        try {
            send(FrameEncoder.encode(open));
        } catch (IOException e) {
            streams.remove(id);
            throw e;
        }
        try {
            writer.awaitOpened();
        } catch (IOException | RuntimeException e) {
            writer.abandon(); // interrupted or timed out: the daemon must not keep the open attempt
            throw e;
        }
        return writer;
    }

    /**
     * Reads reduce partitions [{@code startPartition}, {@code endPartition}) of the named map attempts.
     * {@code locations} maps daemon addresses ("" = this client's daemon) to map attempt ids (§10.3).
     * The request is sent at once; take the chunks with {@link PartitionReader#next()}.
     */
    public PartitionReader read(
            String app, long shuffle, long startPartition, long endPartition, Map<String, long[]> locations)
            throws IOException {
        return read(app, shuffle, startPartition, endPartition, locations, PartitionReader.FLOATING);
    }

    /**
     * As {@link #read(String, long, long, long, Map)}, with at most {@code floating} floating buffers
     * (0 to {@link PartitionReader#FLOATING}): the reader's window is then at most
     * {@link PartitionReader#EXCLUSIVE} + {@code floating} segments, however long the daemon's backlog.
     */
    public PartitionReader read(
            String app,
            long shuffle,
            long startPartition,
            long endPartition,
            Map<String, long[]> locations,
            int floating)
            throws IOException {
        check();
        long id = newStreamId();
        long[] attempts = locations.values().stream().flatMapToLong(Arrays::stream).toArray();
        PartitionReader reader = new PartitionReader(this, id, floating, startPartition, endPartition, attempts);
        streams.put(id, reader.handler());
        try {
            send(FrameEncoder.encode(new Frame.PartitionRequest(
                    id, PartitionReader.EXCLUSIVE, app, shuffle, startPartition, endPartition, locations,
                    token(app))));
        } catch (IOException e) {
            streams.remove(id);
            throw e;
        }
        return reader;
    }

    /** Drops the shuffle's data on the daemon and, propagated, on every daemon it knows (§13). */
    public Map<String, Object> unregisterShuffle(String app, long shuffle) throws IOException {
        return unregisterShuffle(app, shuffle, true);
    }

    public Map<String, Object> unregisterShuffle(String app, long shuffle, boolean propagate) throws IOException {
        Map<String, Object> args = new LinkedHashMap<>();
        args.put("app", app);
        args.put("shuffle", shuffle);
        args.put("propagate", propagate);
        putToken(args, app);
        return admin("unregister_shuffle", args);
    }

    /** Drops all shuffles of the application (§13). */
    public Map<String, Object> removeApplication(String app) throws IOException {
        return removeApplication(app, true);
    }

    public Map<String, Object> removeApplication(String app, boolean propagate) throws IOException {
        Map<String, Object> args = new LinkedHashMap<>();
        args.put("app", app);
        args.put("propagate", propagate);
        putToken(args, app);
        return admin("remove_application", args);
    }

    /** The application token requests about {@code app} carry (§6.2); null without an application secret. */
    private String token(String app) {
        return appSecret == null ? null : tokens.computeIfAbsent(app, a -> Auth.appToken(appSecret, a));
    }

    private void putToken(Map<String, Object> args, String app) {
        String token = token(app);
        if (token != null) {
            args.put("token", token);
        }
    }

    /** The daemon's statistics: the raw msgpack map (ints are Long, nested maps are Maps). */
    public Map<String, Object> stats() throws IOException {
        return admin("stats", Map.of());
    }

    /** Any admin operation: one AdminRequest, then its AdminResponse or Error (§7.14). */
    public Map<String, Object> admin(String op, Map<String, ?> args) throws IOException {
        check();
        long id = newStreamId();
        CompletableFuture<Map<String, Object>> result = new CompletableFuture<>();
        streams.put(id, new StreamHandler() {
            @Override
            public void onFrame(Frame frame) throws ShuffledException {
                if (frame instanceof Frame.AdminResponse r) {
                    streams.remove(id);
                    result.complete(r.result());
                } else {
                    throw new ProtocolException(frame.type() + " on an admin stream");
                }
            }

            @Override
            public void onError(ShuffledException error) {
                streams.remove(id);
                result.completeExceptionally(error);
            }
        });
        try {
            send(FrameEncoder.encode(new Frame.AdminRequest(id, op, MsgPack.normalizeMap(args))));
            return await(result, "AdminResponse to " + op);
        } finally {
            streams.remove(id);
        }
    }

    /** Closes the connection; open streams fail with CONNECTION_LOST. */
    @Override
    public void close() {
        fail(new ShuffledException(ErrorCode.CONNECTION_LOST, "client closed"));
        try {
            transport.close();
        } catch (IOException ignored) {
            // closing anyway
        }
        if (Thread.currentThread() != readerThread) {
            try {
                readerThread.join(timeoutMillis);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }
    }

    // ------------------------------------------------------------------------------------------ internals

    long timeoutMillis() {
        return timeoutMillis;
    }

    /** The connection's region of shared memory, or null (§6.3). */
    SharedRegion region() {
        return region;
    }

    void check() throws ShuffledException {
        ShuffledException e = lost;
        if (e != null) {
            throw e;
        }
    }

    long newStreamId() {
        synchronized (idLock) {
            long id = nextStream;
            nextStream = id == Wire.MAX_U32 ? 1 : id + 1;
            return id;
        }
    }

    void forget(long stream) {
        streams.remove(stream);
    }

    /** Writes one whole frame and flushes. */
    void send(byte[] frame) throws IOException {
        send(frame, null, 0, null, 0);
    }

    /** Writes the first {@code length} bytes of {@code frame}. */
    void send(byte[] frame, int length) throws IOException {
        send(NO_BYTES, frame, length, null, 0);
    }

    /** Writes a frame prefix, then its payload (the first bytes of {@code first}, then of {@code second}). */
    void send(byte[] prefix, byte[] first, int firstLength, byte[] second, int secondLength) throws IOException {
        check();
        try {
            synchronized (writeLock) {
                out.write(prefix);
                if (firstLength > 0) {
                    out.write(first, 0, firstLength);
                }
                if (secondLength > 0) {
                    out.write(second, 0, secondLength);
                }
                out.flush();
            }
        } catch (IOException e) {
            ShuffledException lostNow =
                    new ShuffledException(ErrorCode.CONNECTION_LOST, "write to " + address + " failed: " + e);
            fail(lostNow);
            closeSocketQuietly();
            throw lostNow;
        }
    }

    /** Sends a frame and swallows failures (for cancels whose loss does not matter). */
    void sendQuietly(Frame frame) {
        if (lost != null) {
            return;
        }
        byte[] bytes = FrameEncoder.encode(frame);
        try {
            synchronized (writeLock) { // every send flushes: nothing of another frame is buffered here
                if (transport.writeLater(bytes)) {
                    return;
                }
            }
            send(bytes);
        } catch (IOException ignored) {
            // the connection is gone; the stream is over anyway
        }
    }

    <T> T await(CompletableFuture<T> future, String what) throws IOException {
        try {
            return future.get(timeoutMillis, TimeUnit.MILLISECONDS);
        } catch (ExecutionException e) {
            Throwable cause = e.getCause();
            if (cause instanceof ShuffledException s) {
                throw s;
            }
            throw new IOException(cause);
        } catch (TimeoutException e) {
            throw new SocketTimeoutException("no " + what + " from " + address + " within " + timeoutMillis + " ms");
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new InterruptedIOException("interrupted waiting for " + what);
        }
    }

    private ByteBuffer payloadTarget(FrameType type, long stream, int length) throws ProtocolException {
        if (type != FrameType.BUFFER_RESPONSE) {
            throw new ProtocolException(type + " is not sent to a client");
        }
        StreamHandler h = streams.get(stream);
        return h != null && h.wantsPayload() ? ByteBuffer.allocate(length) : null;
    }

    private void readLoop() {
        byte[] buf = new byte[64 << 10];
        try {
            InputStream in = transport.input();
            List<Frame> frames = new ArrayList<>();
            while (true) {
                int n = in.read(buf);
                if (n < 0) {
                    decoder.endOfInput();
                    fail(new ShuffledException(ErrorCode.CONNECTION_LOST, "shuffled at " + address + " closed"));
                    return;
                }
                frames.clear();
                decoder.feed(ByteBuffer.wrap(buf, 0, n), frames::add);
                for (Frame f : frames) {
                    dispatch(f);
                    if (lost != null) {
                        return;
                    }
                }
            }
        } catch (ProtocolException e) {
            // The daemon broke the protocol: tell it (Error on stream 0) and close (§8).
            try {
                synchronized (writeLock) {
                    out.write(FrameEncoder.encode(new Frame.ErrorResponse(0, e.code(), e.getMessage())));
                    out.flush();
                }
            } catch (IOException | RuntimeException ignored) {
                // best effort
            }
            fail(e);
            closeSocketQuietly();
        } catch (IOException e) {
            fail(new ShuffledException(ErrorCode.CONNECTION_LOST, "connection to " + address + " lost: " + e));
            closeSocketQuietly();
        } catch (RuntimeException e) {
            fail(new ShuffledException(ErrorCode.INTERNAL, "client reader failed: " + e));
            closeSocketQuietly();
        }
    }

    private void dispatch(Frame frame) throws ProtocolException {
        if (frame instanceof Frame.AuthChallenge challenge) {
            if (ready.isDone() || challenged) {
                throw new ProtocolException("AuthChallenge after the handshake");
            }
            answer(challenge);
            return;
        }
        if (frame instanceof Frame.HelloAck ack) {
            if (ready.isDone()) {
                throw new ProtocolException("HelloAck after the handshake");
            }
            if (secret != null && !challenged) {
                authFailed("shuffled at " + address
                        + " does not authenticate (it has no secret configured), but this client has one");
                return;
            }
            decoder.setMaxPayload(ack.segmentSize());
            ready.complete(ack);
            return;
        }
        if (!ready.isDone()) {
            if (frame instanceof Frame.ErrorResponse err && err.stream() == 0) {
                fail(err.toException());
                closeSocketQuietly();
                return;
            }
            throw new ProtocolException(frame.type() + " before HelloAck");
        }
        if (frame instanceof Frame.ErrorResponse err) {
            if (err.stream() == 0) {
                fail(err.toException());
                closeSocketQuietly();
                return;
            }
            StreamHandler h = streams.remove(err.stream());
            if (h != null) {
                h.onError(err.toException());
            }
            return;
        }
        if (frame instanceof Frame.Close) {
            fail(new ShuffledException(ErrorCode.CONNECTION_LOST, "shuffled at " + address + " sent Close"));
            closeSocketQuietly();
            return;
        }
        if (frame.stream() == 0) {
            throw new ProtocolException(frame.type() + " on stream 0");
        }
        switch (frame.type()) {
            case BUFFER_RESPONSE, PUSH_CREDIT, PUSH_SLOTS, COMMIT_ACK, ABORT_ACK, ADMIN_RESPONSE -> {
                StreamHandler h = streams.get(frame.stream());
                if (h != null) {
                    deliver(h, frame);
                }
                // else: a stream that ended or was cancelled; ignore (§5)
            }
            case BUFFER_PLACED -> inPlace((Frame.BufferPlaced) frame);
            default -> throw new ProtocolException(frame.type() + " is not sent to a client");
        }
    }

    private void deliver(StreamHandler h, Frame frame) throws ProtocolException {
        try {
            h.onFrame(frame);
        } catch (ProtocolException e) {
            throw e;
        } catch (ShuffledException e) {
            streams.remove(frame.stream());
            h.onError(e);
        }
    }

    /**
     * Buffers of a read the daemon put in slots of the region (§6.3): each is copied out to the heap (a read's
     * chunks are the caller's to keep) and handed to its read as the BufferResponse it stands for; the slots go
     * back to the daemon at once, in one ReturnSlots. A slot outside the region breaks the rules.
     */
    private void inPlace(Frame.BufferPlaced placed) throws ProtocolException {
        SharedRegion r = region;
        if (r == null || !readsInPlace) {
            throw new ProtocolException("BufferPlaced on a connection that did not agree on reads in place");
        }
        U32s p = placed.placed();
        long[] slots = new long[p.size() / Wire.BUFFER_PLACED_FIELDS];
        int taken = 0;
        try {
            for (; taken < slots.length; taken++) {
                int at = taken * Wire.BUFFER_PLACED_FIELDS;
                long slot = p.get(at + 3);
                long length = p.get(at + 4);
                r.check(slot, length);
                slots[taken] = slot;
                StreamHandler h = streams.get(placed.receiver());
                if (h != null && h.wantsPayload()) {
                    deliver(h, new Frame.BufferResponse(placed.receiver(), p.get(at), p.get(at + 1), BufferKind.DATA,
                            (int) length, r.copy(slot, length), p.get(at + 2)));
                }
            }
        } finally {
            if (taken > 0) {
                sendQuietly(new Frame.ReturnSlots(Arrays.copyOf(slots, taken)));
            }
        }
    }

    /** Fails the connection once: every open stream and pending wait get {@code error}. */
    /** The dialer's half of §6.1: check the daemon's proof, then prove ours ("" without a secret). */
    private void answer(Frame.AuthChallenge challenge) {
        challenged = true;
        String proof = "";
        if (secret != null) {
            String expected = Auth.acceptorProof(secret, nonce, challenge.nonce());
            if (challenge.nonce().length() < Auth.NONCE_HEX || !Auth.proofMatches(expected, challenge.proof())) {
                authFailed("shuffled at " + address
                        + " could not prove it has this client's secret: the secrets differ (or it is not shuffled)");
                return;
            }
            proof = Auth.dialerProof(secret, nonce, challenge.nonce());
        }
        try {
            send(FrameEncoder.encode(new Frame.AuthResponse(proof)));
        } catch (IOException e) {
            fail(new ShuffledException(ErrorCode.CONNECTION_LOST, "connection to " + address + " lost: " + e));
            closeSocketQuietly();
        }
    }

    private void authFailed(String message) {
        ShuffledException error = new ShuffledException(ErrorCode.AUTH_FAILED, message);
        try {
            synchronized (writeLock) {
                out.write(FrameEncoder.encode(new Frame.ErrorResponse(0, ErrorCode.AUTH_FAILED.code(), message)));
                out.flush();
            }
        } catch (IOException | RuntimeException ignored) {
            // best effort: the daemon learns why
        }
        fail(error);
        closeSocketQuietly();
    }

    private void fail(ShuffledException error) {
        synchronized (this) {
            if (lost != null) {
                return;
            }
            lost = error;
        }
        ready.completeExceptionally(error);
        for (Long id : new ArrayList<>(streams.keySet())) {
            StreamHandler h = streams.remove(id);
            if (h != null) {
                h.onError(error);
            }
        }
    }

    private void closeSocketQuietly() {
        try {
            transport.close();
        } catch (IOException ignored) {
            // already closing
        }
    }
}
