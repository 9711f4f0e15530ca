package io.shuffled.spark;

import io.shuffled.client.ClientCheck;
import io.shuffled.client.MapOutputWriter;
import io.shuffled.client.PartitionReader;
import io.shuffled.client.PemTls;
import io.shuffled.client.ShuffleClient;
import io.shuffled.client.wire.ShuffledException;
import java.nio.file.Path;
import java.util.Arrays;
import java.util.Map;
import org.apache.spark.SparkConf;

/**
 * A JVM client of a daemon's client TLS port (tests/integration/test_jvm_tls.py), the way the plugin
 * connects (its settings, through {@link ShuffledConf} and {@link DaemonClients}) or through the client's
 * own API. Connects, pushes one map output across many segments and reads it back, and prints one line:
 * {@code identical N bytes}, {@code differs in partition P}, or {@code error KIND: MESSAGE} for whatever
 * was thrown on the way (KIND: the wire code of a {@link ShuffledException}, else the exception's class),
 * for the test to judge.
 *
 * <pre>
 * TlsCheck spark ADDRESS [SETTING=VALUE...]   spark.shuffled.address=ADDRESS and the settings given
 * TlsCheck client ADDRESS CA [CERT KEY]        ShuffleClient.connect with PemTls.context(CA, CERT, KEY)
 * </pre>
 */
public final class TlsCheck {
    private static final int PARTITIONS = 4;
    private static final long TIMEOUT_MILLIS = 20_000;

    public static void main(String[] args) {
        try {
            if (args[0].equals("spark")) {
                SparkConf spark = new SparkConf(false).set(ShuffledConf.ADDRESS, args[1])
                        .set(ShuffledConf.TIMEOUT, TIMEOUT_MILLIS + "ms");
                for (String setting : Arrays.copyOfRange(args, 2, args.length)) {
                    String[] pair = setting.split("=", 2);
                    spark.set(pair[0], pair[1]);
                }
                try (DaemonClients clients = new DaemonClients(new ShuffledConf(spark), "tls-check")) {
                    System.out.println(roundTrip(clients.client(args[1])));
                }
            } else {
                Path cert = args.length > 3 ? Path.of(args[3]) : null;
                Path key = args.length > 4 ? Path.of(args[4]) : null;
                try (ShuffleClient client = ShuffleClient.connect(args[1], "tls-check", TIMEOUT_MILLIS,
                        ShuffleClient.DEFAULT_WRITER_BUFFER_BYTES, null, null, PemTls.context(Path.of(args[2]), cert,
                        key))) {
                    System.out.println(roundTrip(client));
                }
            }
        } catch (Exception e) {
            String kind = e instanceof ShuffledException refused ? refused.code().name() : e.getClass().getSimpleName();
            System.out.println("error " + kind + ": " + e.getMessage());
        }
    }

    /** ClientCheck's pattern, from an empty partition to one of about a hundred segments, there and back. */
    private static String roundTrip(ShuffleClient client) throws Exception {
        String app = "tls-check-" + ProcessHandle.current().pid();
        long attempt = 1;
        long bytes = 0;
        try (MapOutputWriter writer = client.openWriter(app, 1, 0, attempt, PARTITIONS)) {
            for (int p = 0; p < PARTITIONS; p++) {
                writer.write(p, ClientCheck.pattern(attempt, p, ClientCheck.size(0, p)));
            }
            writer.commit();
        }
        for (int p = 0; p < PARTITIONS; p++) {
            byte[] got;
            try (PartitionReader reader = client.read(app, 1, p, p + 1, Map.of("", new long[] {attempt}))) {
                got = reader.readAll();
            }
            if (!Arrays.equals(got, ClientCheck.pattern(attempt, p, ClientCheck.size(0, p)))) {
                return "differs in partition " + p;
            }
            bytes += got.length;
        }
        client.removeApplication(app);
        return "identical " + bytes + " bytes";
    }
}
