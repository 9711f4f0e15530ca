package io.shuffled.client;

import java.io.Closeable;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.SocketChannel;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;

/**
 * The byte pipe under a {@link ShuffleClient}: TCP ({@code host:port}, {@code [ipv6]:port}) or a Unix
 * domain socket ({@code unix:/path}).
 *
 * <p>Writes must never be cut short by a thread interrupt: Spark interrupts task threads to kill
 * speculative copies, and half a frame would break the connection every other task shares. A
 * {@link Socket}'s streams ignore interrupts; a {@link SocketChannel} (the only way to reach a Unix
 * socket) closes itself when a writing thread is interrupted, so Unix writes run on one writer thread
 * of the connection and the caller waits for them without reacting to interrupts.
 */
abstract class Transport implements Closeable {
    /** Bytes from the daemon; read by the connection's reader thread only. */
    abstract InputStream input() throws IOException;

    /** Bytes to the daemon; callers serialise writes themselves and write whole frames. */
    abstract OutputStream output() throws IOException;

    static Transport open(String address, long timeoutMillis) throws IOException {
        if (address.startsWith("unix:")) {
            return new Unix(address.substring("unix:".length()));
        }
        return new Tcp(parseAddress(address), timeoutMillis);
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

    private static final class Tcp extends Transport {
        private final Socket socket = new Socket();

        Tcp(InetSocketAddress where, long timeoutMillis) throws IOException {
            try {
                socket.setTcpNoDelay(true);
                socket.connect(where, (int) Math.min(Integer.MAX_VALUE, timeoutMillis));
            } catch (IOException e) {
                socket.close();
                throw e;
            }
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
                    Future<?> done = writer.submit(() -> {
                        ByteBuffer buf = ByteBuffer.wrap(b, off, len);
                        while (buf.hasRemaining()) {
                            channel.write(buf);
                        }
                        return null;
                    });
                    awaitUninterruptibly(done);
                }
            };
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
