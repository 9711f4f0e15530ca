package io.shuffled.client;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.concurrent.Callable;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.atomic.AtomicLong;
import java.util.stream.LongStream;

/**
 * The JVM client's side of the {@code wide} benchmark ({@code benchmarks/wide.py}): map outputs pushed with
 * {@link MapOutputWriter} and read back with {@link PartitionReader} against a running daemon, at whatever
 * partition count the benchmark asks for, timed here so the benchmark can set them against the daemon's CPU.
 *
 * <pre>
 * WideBench ADDRESS APP MAPS MAP_BYTES WRITERS
 * </pre>
 *
 * Prints {@code ready} once connected, then takes one command per line on stdin and answers each with one
 * line on stdout:
 *
 * <pre>
 * push SHUFFLE PARTITIONS          -> pushed BYTES SECONDS
 * read SHUFFLE PARTITIONS RANGES   -> read BYTES RUNS SECONDS
 * </pre>
 *
 * A push writes MAPS map outputs (attempts 1..MAPS, WRITERS at once), each MAP_BYTES / PARTITIONS bytes to
 * every partition, a partition at a time (the plugin's sorted path), and commits them; the commit's lengths
 * must be what was written. A read starts RANGES readers at once, each a contiguous range of equal width of
 * the partitions from every attempt (as AQE's coalesced reads are), consuming every run; the bytes must add
 * up to what was pushed. Any failure ends the program with a stack trace and exit status 1.
 */
public final class WideBench {
    private final ShuffleClient client;
    private final String app;
    private final int maps;
    private final long mapBytes;
    private final int writers;
    private final byte[] pattern;

    private WideBench(ShuffleClient client, String app, int maps, long mapBytes, int writers) {
        this.client = client;
        this.app = app;
        this.maps = maps;
        this.mapBytes = mapBytes;
        this.writers = writers;
        this.pattern = new byte[(int) mapBytes];
        new Random(25).nextBytes(pattern);
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 5) {
            System.err.println("usage: WideBench ADDRESS APP MAPS MAP_BYTES WRITERS");
            System.exit(2);
        }
        try (ShuffleClient client = ShuffleClient.connect(args[0])) {
            WideBench bench = new WideBench(
                    client, args[1], Integer.parseInt(args[2]), Long.parseLong(args[3]), Integer.parseInt(args[4]));
            System.out.println("ready");
            BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.US_ASCII));
            for (String line = in.readLine(); line != null; line = in.readLine()) {
                String[] cmd = line.trim().split(" ");
                long shuffle = Long.parseLong(cmd[1]);
                int partitions = Integer.parseInt(cmd[2]);
                String answer = switch (cmd[0]) {
                    case "push" -> bench.push(shuffle, partitions);
                    case "read" -> bench.read(shuffle, partitions, Integer.parseInt(cmd[3]));
                    default -> throw new IllegalArgumentException("unknown command " + line);
                };
                System.out.println(answer);
            }
        } catch (Exception e) {
            e.printStackTrace();
            System.exit(1);
        }
    }

    private String push(long shuffle, int partitions) throws Exception {
        int share = (int) (mapBytes / partitions);
        AtomicLong next = new AtomicLong(1);
        long started = System.nanoTime();
        List<Long> written = inParallel(writers, () -> {
            long bytes = 0;
            for (long attempt = next.getAndIncrement(); attempt <= maps; attempt = next.getAndIncrement()) {
                MapOutputWriter w = client.openWriter(app, shuffle, attempt - 1, attempt, partitions);
                for (int p = 0; p < partitions; p++) {
                    w.write(p, pattern, p * share, share);
                }
                long[] lengths = w.commit();
                for (long length : lengths) {
                    if (length != share) {
                        throw new IllegalStateException("attempt " + attempt + " committed " + length + " bytes");
                    }
                    bytes += length;
                }
            }
            return bytes;
        });
        double seconds = (System.nanoTime() - started) / 1e9;
        long bytes = written.stream().mapToLong(Long::longValue).sum();
        expect(bytes, (long) share * partitions * maps, "pushed");
        return "pushed " + bytes + " " + seconds;
    }

    private String read(long shuffle, int partitions, int ranges) throws Exception {
        long[] attempts = LongStream.rangeClosed(1, maps).toArray();
        int step = (partitions + ranges - 1) / ranges;
        AtomicLong runs = new AtomicLong();
        AtomicLong next = new AtomicLong(0);
        long started = System.nanoTime();
        List<Long> got = inParallel((partitions + step - 1) / step, () -> {
            int lo = (int) next.getAndIncrement() * step;
            long bytes = 0;
            long n = 0;
            try (PartitionReader r =
                    client.read(app, shuffle, lo, Math.min(partitions, lo + step), Map.of("", attempts))) {
                for (PartitionReader.Chunk c = r.next(); c != null; c = r.next()) {
                    bytes += c.data().remaining();
                    n++;
                }
            }
            runs.addAndGet(n);
            return bytes;
        });
        double seconds = (System.nanoTime() - started) / 1e9;
        long bytes = got.stream().mapToLong(Long::longValue).sum();
        expect(bytes, mapBytes / partitions * partitions * maps, "read");
        return "read " + bytes + " " + runs.get() + " " + seconds;
    }

    /** Runs {@code task} on {@code threads} threads at once; their results, or the first failure. */
    private static List<Long> inParallel(int threads, Callable<Long> task) throws Exception {
        ExecutorService pool = Executors.newFixedThreadPool(threads);
        try {
            List<Future<Long>> futures = new ArrayList<>();
            for (int i = 0; i < threads; i++) {
                futures.add(pool.submit(task));
            }
            List<Long> out = new ArrayList<>();
            for (Future<Long> f : futures) {
                out.add(f.get());
            }
            return out;
        } finally {
            pool.shutdownNow();
        }
    }

    private static void expect(long got, long want, String what) {
        if (got != want) {
            throw new IllegalStateException(what + " " + got + " bytes, expected " + want);
        }
    }
}
