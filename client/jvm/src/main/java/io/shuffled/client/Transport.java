package io.shuffled.client;

import java.io.Closeable;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.net.SocketTimeoutException;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.SocketChannel;
import java.security.GeneralSecurityException;
import java.security.cert.CertificateException;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.atomic.AtomicInteger;
import javax.net.ssl.SSLContext;
import javax.net.ssl.SSLParameters;
import javax.net.ssl.SSLSocket;

/**
 * The byte pipe under a {@link ShuffleClient}: TCP ({@code host:port}, {@code [ipv6]:port}), TLS over TCP to
 * the daemon's client TLS port ({@code tls:host:port}) or a Unix domain socket ({@code unix:/path}).
 *
 * <p>Writes must never be cut short by a thread interrupt: Spark interrupts task threads to kill
 * speculative copies, and half a frame would break the connection every other task shares. The streams of
 * a {@link Socket}, and of an {@link SSLSocket} layered on one, ignore interrupts; a {@link SocketChannel}
 * (the only way to reach a Unix socket) closes itself when a writing thread is interrupted, so Unix writes
 * run on one writer thread of the connection and the caller waits for them without reacting to interrupts
 * (but the connection's own reader thread's, which nothing interrupts: {@link #trust}).
 */
abstract class Transport implements Closeable {
    /** Bytes from the daemon; read by the connection's reader thread only. */
    abstract InputStream input() throws IOException;

    /** Bytes to the daemon; callers serialise writes themselves and write whole frames. */
    abstract OutputStream output() throws IOException;

    /**
     * {@code thread} (the connection's own reader, which no task interrupts) may write without the hop to a
     * writer thread that keeps a task's interrupt away from the socket: its credit and returned slots go out
     * as it reads, not after two thread switches each.
     */
    void trust(Thread thread) {}

    /**
     * Queues a whole frame to be written after those queued before it, without waiting, where a write would
     * otherwise wait for another thread (a task's credit to a Unix socket); false: write it as any other.
     */
    boolean writeLater(byte[] frame) {
        return false;
    }

    static final String TLS = "tls:";
    /** The prefix of a Unix socket's address: the daemon on this host (and its shared memory, §6.3). */
    static final String UNIX = "unix:";
    /**
     * Over TLS 1.3 a daemon checks the client's certificate after the client's side of the handshake is done,
     * and may end the connection without an alert when it wants one and got none it trusts: the client sees
     * only a connection that ends, during the handshake or just after it, which alone would not say why.
     */
    static final String ENDED_OVER_TLS =
            "; a daemon that asks for client certificates (--client-tls-ca) ends TLS connections that show none it"
                    + " trusts";

    /**
     * @param tls the context a {@code tls:} address is reached with; null: the JDK's defaults (its trust
     *     store). Refused for any other address: a caller that gave one expects encryption.
     */
    static Transport open(String address, long timeoutMillis, SSLContext tls) throws IOException {
        boolean overTls = address.startsWith(TLS);
        if (tls != null && !overTls) {
            throw new IllegalArgumentException("a TLS context needs a tls:host:port address, got " + address);
        }
        if (address.startsWith(UNIX)) {
            return new Unix(address.substring(UNIX.length()));
        }
        int timeout = (int) Math.min(Integer.MAX_VALUE, timeoutMillis);
        if (overTls) {
            return new Tcp(tlsSocket(parseAddress(address.substring(TLS.length())), timeout, tls));
        }
        return new Tcp(tcpSocket(parseAddress(address), timeout));
    }

    static InetSocketAddress parseAddress(String address) {
        int colon = address.lastIndexOf(':');
        if (colon <= 0) {
            throw new IllegalArgumentException("expected host:port, [ipv6]:port or unix:/path, got " + address);
        }
        String host = address.substring(0, colon);
        if (host.startsWith("[") && host.endsWith("]")) {
            host = host.substring(1, host.length() - 1);
        }
        int port;
        try {
            port = Integer.parseInt(address.substring(colon + 1));
        } catch (NumberFormatException e) {
            throw new IllegalArgumentException("bad port in " + address, e);
        }
        return new InetSocketAddress(host, port);
    }

    private static Socket tcpSocket(InetSocketAddress where, int timeoutMillis) throws IOException {
        Socket socket = new Socket();
        try {
            socket.setTcpNoDelay(true);
            socket.connect(where, timeoutMillis);
        } catch (IOException e) {
            socket.close();
            throw e;
        }
        return socket;
    }

    /**
     * TLS 1.2 or later over a connected socket, the daemon's certificate checked against the host name as
     * written in the address (an IP address against the certificate's IP names). The handshake is bounded
     * by the connect timeout; the timeout is lifted after it, since the reader thread waits on reads for as
     * long as the connection is idle.
     */
    private static SSLSocket tlsSocket(InetSocketAddress where, int timeoutMillis, SSLContext tls) throws IOException {
        Socket plain = tcpSocket(where, timeoutMillis);
        SSLSocket socket;
        try {
            SSLContext context = tls != null ? tls : SSLContext.getDefault();
            socket = (SSLSocket) context.getSocketFactory()
                    .createSocket(plain, where.getHostString(), where.getPort(), true);
        } catch (IOException | GeneralSecurityException | RuntimeException e) {
            plain.close();
            throw e instanceof IOException io ? io : new IOException("no TLS: " + e, e);
        }
        try {
            SSLParameters parameters = socket.getSSLParameters();
            parameters.setEndpointIdentificationAlgorithm("HTTPS");
            parameters.setProtocols(new String[] {"TLSv1.3", "TLSv1.2"});
            socket.setSSLParameters(parameters);
            socket.setSoTimeout(timeoutMillis);
            socket.startHandshake();
            socket.setSoTimeout(0);
        } catch (IOException e) {
            socket.close();
            boolean ended = !(e instanceof SocketTimeoutException || e.getCause() instanceof CertificateException);
            throw new IOException("TLS handshake failed: " + e.getMessage() + (ended ? ENDED_OVER_TLS : ""), e);
        }
        return socket;
    }

    private static final class Tcp extends Transport {
        private final Socket socket;

        Tcp(Socket socket) {
            this.socket = socket;
        }

        @Override
        InputStream input() throws IOException {
            return socket.getInputStream();
        }

        @Override
        OutputStream output() throws IOException {
            return socket.getOutputStream();
        }

        @Override
        public void close() throws IOException {
            socket.close();
        }
    }

    private static final class Unix extends Transport {
        private final SocketChannel channel;
        private final ExecutorService writer;
        private volatile Thread trusted;
        /** writes handed to the writer thread and not done: the reader thread writes directly only with none */
        private final AtomicInteger queued = new AtomicInteger();

        Unix(String path) throws IOException {
            channel = SocketChannel.open(StandardProtocolFamily.UNIX);
            try {
                channel.connect(UnixDomainSocketAddress.of(path));
            } catch (IOException e) {
                channel.close();
                throw e;
            }
            writer = Executors.newSingleThreadExecutor(r -> {
                Thread t = new Thread(r, "shuffled-client-writer unix:" + path);
                t.setDaemon(true);
                return t;
            });
        }

        @Override
        InputStream input() {
            return new InputStream() {
                @Override
                public int read() throws IOException {
                    byte[] one = new byte[1];
                    return read(one, 0, 1) < 0 ? -1 : one[0] & 0xff;
                }

                @Override
                public int read(byte[] b, int off, int len) throws IOException {
                    return channel.read(ByteBuffer.wrap(b, off, len));
                }
            };
        }

        @Override
        OutputStream output() {
            return new OutputStream() {
                @Override
                public void write(int b) throws IOException {
                    write(new byte[] {(byte) b}, 0, 1);
                }

                @Override
                public void write(byte[] b, int off, int len) throws IOException {
                    if (Thread.currentThread() == trusted && queued.get() == 0) {
                        writeAll(b, off, len);
                        return;
                    }
                    awaitUninterruptibly(queue(b, off, len));
                }
            };
        }

        /**
         * Hands a write to the writer thread, in order with those before it (callers hold the connection's write
         * lock, so the count is never raised while the reader thread looks at it).
         */
        private Future<Void> queue(byte[] b, int off, int len) {
            queued.incrementAndGet();
            try {
                return writer.submit(() -> {
                    try {
                        return writeAll(b, off, len);
                    } finally {
                        queued.decrementAndGet();
                    }
                });
            } catch (RejectedExecutionException e) {
                queued.decrementAndGet();
                throw e;
            }
        }

        private Void writeAll(byte[] b, int off, int len) throws IOException {
            ByteBuffer buf = ByteBuffer.wrap(b, off, len);
            while (buf.hasRemaining()) {
                channel.write(buf);
            }
            return null;
        }

        @Override
        void trust(Thread thread) {
            trusted = thread;
        }

        @Override
        boolean writeLater(byte[] frame) {
            if (Thread.currentThread() == trusted) {
                return false;
            }
            try {
                queue(frame, 0, frame.length); // a failure shows on the next read or write
            } catch (RejectedExecutionException closed) {
                // the connection is closed: a frame whose loss does not matter (sendQuietly)
            }
            return true;
        }

        private static void awaitUninterruptibly(Future<?> done) throws IOException {
            boolean interrupted = false;
            try {
                while (true) {
                    try {
                        done.get();
                        return;
                    } catch (InterruptedException e) {
                        interrupted = true;
                    } catch (ExecutionException e) {
                        Throwable cause = e.getCause();
                        throw cause instanceof IOException io ? io : new IOException(cause);
                    }
                }
            } finally {
                if (interrupted) {
                    Thread.currentThread().interrupt();
                }
            }
        }

        @Override
        public void close() throws IOException {
            writer.shutdownNow();
            channel.close();
        }
    }
}
