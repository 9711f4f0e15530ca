package io.shuffled.client;

import io.shuffled.client.wire.Frame;
import io.shuffled.client.wire.FrameEncoder;
import io.shuffled.client.wire.Role;
import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;
import java.lang.reflect.Method;
import java.nio.ByteBuffer;
import java.util.Arrays;
import java.util.Map;
import java.util.Random;

/**
 * How fast a {@link MapOutputWriter} turns records into PushData frames, in this JVM, with no daemon: the
 * client talks to a counting sink that grants unlimited push credit, reads nothing but frame headers and
 * acknowledges the commit. Every run writes the same bytes per map output, as records of one size, to
 * reduce partitions in order (Spark's sorted path) or at random (its bypass path).
 *
 * <pre>
 * WriterBench [--mib 64] [--record 100] [--runs 5] [--buffer-mib 16] [--partitions 200,2000,10000]
 * </pre>
 *
 * Prints one line per (partitions, order): the median of the runs in MB/s (10^6 bytes of records per
 * second) and records/s, the same per CPU second of the writing thread (steadier than wall time on a busy
 * machine), and the PushData frames and wire bytes per map output. The sink is the same for any
 * version of the client, so the program compiles and runs against an older jar for a same-run baseline (a
 * writer with {@code flush(int)} gets it called after each partition in order, as the sorted path did).
 */
public final class WriterBench {
    private static final int SEGMENT = 32 << 10;
    private static final ThreadMXBean CPU = ManagementFactory.getThreadMXBean();

    public static void main(String[] args) throws Exception {
        Map<String, String> opts = new java.util.HashMap<>();
        for (int i = 0; i + 1 < args.length; i += 2) {
            opts.put(args[i].replaceFirst("^--", ""), args[i + 1]);
        }
        long bytes = Long.parseLong(opts.getOrDefault("mib", "64")) << 20;
        int record = Integer.parseInt(opts.getOrDefault("record", "100"));
        int runs = Integer.parseInt(opts.getOrDefault("runs", "5"));
        long buffer = Long.parseLong(opts.getOrDefault("buffer-mib", "16")) << 20;
        int[] widths = Arrays.stream(opts.getOrDefault("partitions", "200,2000,10000").split(","))
                .mapToInt(Integer::parseInt).toArray();
        Method flush = flushMethod();
        CountingSink sink = new CountingSink();
        try (ShuffleClient client = ShuffleClient.handshake(
                sink, "sink", "writer-bench", 60_000, buffer, null, null, String.format("%032x", 1))) {
            byte[] data = new byte[1 << 20];
            new Random(1).nextBytes(data);
            long attempt = 0;
            for (int partitions : widths) {
                for (boolean inOrder : new boolean[] {true, false}) {
                    int[] targets = targets(partitions, (int) (bytes / record), inOrder);
                    double[] seconds = new double[runs];
                    double[] cpuSeconds = new double[runs];
                    for (int run = -1; run < runs; run++) { // run -1 warms the JIT up
                        long pushes = sink.pushes;
                        long wire = sink.wireBytes;
                        long started = System.nanoTime();
                        long cpuStarted = CPU.getCurrentThreadCpuTime();
                        MapOutputWriter w = client.openWriter("bench", 1, 0, ++attempt, partitions);
                        sink.partitions = partitions;
                        for (int i = 0; i < targets.length; i++) {
                            w.write(targets[i], data, (i * 61) & ((1 << 19) - 1), record);
                            boolean partitionDone = i + 1 == targets.length || targets[i + 1] != targets[i];
                            if (flush != null && inOrder && partitionDone) {
                                flush.invoke(w, targets[i]);
                            }
                        }
                        w.commit();
                        if (run >= 0) {
                            seconds[run] = (System.nanoTime() - started) / 1e9;
                            cpuSeconds[run] = (CPU.getCurrentThreadCpuTime() - cpuStarted) / 1e9;
                        }
                        sink.lastPushes = sink.pushes - pushes;
                        sink.lastWire = sink.wireBytes - wire;
                    }
                    Arrays.sort(seconds);
                    Arrays.sort(cpuSeconds);
                    double median = seconds[runs / 2];
                    double cpu = cpuSeconds[runs / 2];
                    double total = (double) targets.length * record;
                    String line = "partitions %6d  %-8s  %8.1f MB/s  %10.0f records/s  %8.1f MB/cpu-s"
                            + "  %10.0f records/cpu-s  %7d pushes  %.4f wire/data%n";
                    System.out.printf(line, partitions, inOrder ? "in-order" : "random", total / median / 1e6,
                            targets.length / median, total / cpu / 1e6, targets.length / cpu, sink.lastPushes,
                            sink.lastWire / total);
                }
            }
        }
    }

    /** The writer's {@code flush(int)}, which clients before protocol 3 had; null if this one has none. */
    private static Method flushMethod() {
        try {
            return MapOutputWriter.class.getMethod("flush", int.class);
        } catch (NoSuchMethodException e) {
            return null;
        }
    }

    /** The partition of each record: ascending runs of equal size, or uniformly at random. */
    private static int[] targets(int partitions, int records, boolean inOrder) {
        int[] out = new int[records];
        Random random = new Random(partitions);
        for (int i = 0; i < records; i++) {
            out[i] = inOrder ? (int) ((long) i * partitions / records) : random.nextInt(partitions);
        }
        return out;
    }

    /**
     * The daemon's side of the connection, reduced to counting: frames are split by their headers, bodies
     * skipped; Hello, OpenMapOutput and CommitMapOutput get HelloAck, unlimited PushCredit and a CommitAck.
     */
    private static final class CountingSink extends QueueTransport {
        private static final int HEADER = 12;
        private final byte[] header = new byte[HEADER];
        private int headerFill;
        private long skip;
        volatile int partitions;
        long pushes;
        long wireBytes;
        long lastPushes;
        long lastWire;

        @Override
        void received(byte[] b, int off, int len) {
            wireBytes += len;
            while (len > 0) {
                if (skip > 0) {
                    int n = (int) Math.min(skip, len);
                    skip -= n;
                    off += n;
                    len -= n;
                    continue;
                }
                int n = Math.min(HEADER - headerFill, len);
                System.arraycopy(b, off, header, headerFill, n);
                headerFill += n;
                off += n;
                len -= n;
                if (headerFill == HEADER) {
                    headerFill = 0;
                    frame();
                }
            }
        }

        private void frame() {
            ByteBuffer h = ByteBuffer.wrap(header);
            skip = Integer.toUnsignedLong(h.getInt(0));
            int type = h.get(4) & 0xff;
            long stream = Integer.toUnsignedLong(h.getInt(8));
            Frame reply = switch (type) {
                case 0x01 -> new Frame.HelloAck(Role.DAEMON, Map.of("node", "sink:1", "segment_size", (long) SEGMENT));
                case 0x20 -> new Frame.PushCredit(stream, 0xFFFF_FFFFL);
                case 0x23 -> new Frame.CommitAck(stream, new long[partitions]);
                default -> null;
            };
            if (type == 0x22) {
                pushes++;
            }
            if (reply != null) {
                reply(FrameEncoder.encode(reply));
            }
        }
    }
}
