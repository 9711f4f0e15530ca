package io.shuffled.client;

import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.nio.ByteBuffer;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.LinkedBlockingQueue;

/**
 * An in-memory connection for the checks and the benchmark: what the client writes goes to
 * {@link #received} (on the client's writing thread), and what the far side answers with {@link #reply} is
 * what the client's reader thread reads, in order, until {@link #close}.
 */
abstract class QueueTransport extends Transport {
    private static final byte[] END = new byte[0];
    private final BlockingQueue<byte[]> replies = new LinkedBlockingQueue<>();

    /** Bytes the client wrote. */
    abstract void received(byte[] b, int off, int len) throws IOException;

    /** Queues bytes for the client to read. */
    final void reply(byte[] bytes) {
        replies.add(bytes);
    }

    @Override
    InputStream input() {
        return new InputStream() {
            private ByteBuffer current = ByteBuffer.allocate(0);

            @Override
            public int read() throws IOException {
                byte[] one = new byte[1];
                return read(one, 0, 1) < 0 ? -1 : one[0] & 0xff;
            }

            @Override
            public int read(byte[] b, int off, int len) throws IOException {
                try {
                    while (!current.hasRemaining()) {
                        byte[] next = replies.take();
                        if (next == END) {
                            replies.add(END); // closed: every later read ends too
                            return -1;
                        }
                        current = ByteBuffer.wrap(next);
                    }
                } catch (InterruptedException e) {
                    throw new IOException(e);
                }
                int n = Math.min(len, current.remaining());
                current.get(b, off, n);
                return n;
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
                received(b, off, len);
            }
        };
    }

    @Override
    public void close() {
        replies.add(END);
    }
}
