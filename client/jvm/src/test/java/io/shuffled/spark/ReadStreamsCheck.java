package io.shuffled.spark;

import io.shuffled.client.PartitionReader;
import io.shuffled.client.wire.ShuffledException;
import java.util.Arrays;
import java.util.Map;
import java.util.zip.CRC32;
import org.apache.spark.SparkConf;

/**
 * A reduce task's reads through {@link ReadStreams} and {@link DaemonClients}, as {@link ShuffledReader}
 * does them, against daemons the Python test started (tests/integration/test_jvm_client.py), without a
 * Spark job: the task's daemon is the first address ({@code daemonChoice=task}, task attempt 0).
 *
 * <pre>
 * ReadStreamsCheck ADDRESSES TIMEOUT_MS APP SHUFFLE PARTITIONS NODE ATTEMPT...
 * </pre>
 *
 * Reads partitions [0, PARTITIONS) of each attempt as one location naming {@code NODE}, and prints a line
 * {@code pair PARTITION ATTEMPT BYTES CRC32} per pair, then {@code via NODE} (the daemon the reads went
 * through), or {@code error CODE message after N bytes} when the read failed after taking N bytes.
 */
public final class ReadStreamsCheck {
    public static void main(String[] args) throws Exception {
        SparkConf spark = new SparkConf(false)
                .set(ShuffledConf.ADDRESS, args[0])
                .set(ShuffledConf.DAEMON_CHOICE, "task")
                .set(ShuffledConf.TIMEOUT, args[1] + "ms");
        String app = args[2];
        long shuffle = Long.parseLong(args[3]);
        int partitions = Integer.parseInt(args[4]);
        String node = args[5];
        long[] attempts = Arrays.stream(args, 6, args.length).mapToLong(Long::parseLong).toArray();
        long[] taken = {0};
        try (DaemonClients clients = new DaemonClients(new ShuffledConf(spark), "read-streams-check");
                ReadStreams streams = new ReadStreams(clients, "0", 0, attempts.length, (client, location) -> {
                    String where = node.equals(client.daemonNode()) ? "" : node;
                    return client.read(app, shuffle, 0, partitions, Map.of(where, new long[] {attempts[location]}),
                            PartitionReader.FLOATING);
                })) {
            byte[] buf = new byte[65536];
            for (int i = 0; i < attempts.length; i++) {
                PairInput input = streams.start(i, false, (bytes, waitNanos) -> taken[0] += bytes);
                while (input.nextBlock()) {
                    CRC32 crc = new CRC32();
                    long total = 0;
                    for (int n = input.read(buf, 0, buf.length); n > 0; n = input.read(buf, 0, buf.length)) {
                        crc.update(buf, 0, n);
                        total += n;
                    }
                    System.out.println("pair " + input.partition() + " " + input.attempt() + " " + total + " "
                            + crc.getValue());
                }
            }
            System.out.println("via " + streams.client().daemonNode());
        } catch (ShuffledException e) {
            System.out.println("error " + e.code() + " " + e.getMessage() + " after " + taken[0] + " bytes");
        }
    }
}
