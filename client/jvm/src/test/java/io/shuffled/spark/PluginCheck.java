package io.shuffled.spark;

import java.util.ArrayList;
import java.util.List;
import java.util.function.Function;
import org.apache.spark.SparkConf;

/**
 * Checks of the plugin's small rules that a Spark job shows only by chance: fetch wait that is made of
 * sub-millisecond waits, the Spark settings the plugin refuses at start, the values of spark.shuffled.replicas,
 * durability, fsync, compression and daemonChoice (and what makes {@code auto} compress; the enum settings' errors
 * word for word), the mark of an uncompressed map output in its map status, the Spark line it was built for, and a
 * writer stopped before it committed. Prints one line per check, then {@code N passed, M failed}; exits non-zero on
 * any failure.
 */
public final class PluginCheck {
    private final List<String> failures = new ArrayList<>();
    private int passed;

    public static void main(String[] args) {
        PluginCheck c = new PluginCheck();
        c.fetchWaitAddsUpShortWaits();
        c.fetchWaitReportsEachMillisecondOnce();
        for (String key : new String[] {
            "spark.shuffle.useOldFetchProtocol",
            "spark.shuffle.push.enabled",
            "spark.storage.decommission.shuffleBlocks.enabled"}) {
            c.refused(key);
        }
        c.replicas(null, 0);
        c.replicas("2", 2);
        c.replicas("0", -1);
        c.replicas("5", -1);
        c.oneOf(ShuffledConf.DURABILITY, conf -> conf.durability, null, null);
        c.oneOf(ShuffledConf.DURABILITY, conf -> conf.durability, "object-store", "object-store");
        c.oneOf(ShuffledConf.DURABILITY, conf -> conf.durability, "none", "none");
        c.oneOf(ShuffledConf.DURABILITY, conf -> conf.durability, "s3", "refused");
        c.oneOf(ShuffledConf.FSYNC, conf -> conf.fsync, null, null);
        c.oneOf(ShuffledConf.FSYNC, conf -> conf.fsync, "commit", "commit");
        c.oneOf(ShuffledConf.FSYNC, conf -> conf.fsync, "always", "refused");
        c.oneOf(ShuffledConf.COMPRESSION, conf -> conf.compression.name(), null, "ON");
        c.oneOf(ShuffledConf.COMPRESSION, conf -> conf.compression.name(), "on", "ON");
        c.oneOf(ShuffledConf.COMPRESSION, conf -> conf.compression.name(), " Off ", "OFF");
        c.oneOf(ShuffledConf.COMPRESSION, conf -> conf.compression.name(), "lz4", "refused");
        c.oneOf(ShuffledConf.DAEMON_CHOICE, conf -> conf.choice.name(), " Task", "TASK");
        c.refusedWith(ShuffledConf.COMPRESSION, "lz4",
                "spark.shuffled.compression must be 'auto', 'on' or 'off', got 'lz4'");
        c.refusedWith(ShuffledConf.DAEMON_CHOICE, "host",
                "spark.shuffled.daemonChoice must be 'executor' or 'task', got 'host'");
        c.compressionFollowsSpark();
        c.pressure();
        c.uncompressedMarkSurvivesTheMapStatus(7);
        c.uncompressedMarkSurvivesTheMapStatus(5000);
        c.sparkLineOfThisJar();
        c.otherSparkLineRefused();
        c.writerStoppedBeforeCommit();
        System.out.println(c.passed + " passed, " + c.failures.size() + " failed");
        System.exit(c.failures.isEmpty() ? 0 : 1);
    }

    private void verdict(String name, String failure) {
        if (failure == null) {
            passed++;
            System.out.println("ok   " + name);
        } else {
            failures.add(name);
            System.out.println("FAIL " + name + ": " + failure);
        }
    }

    private void fetchWaitAddsUpShortWaits() {
        FetchWait wait = new FetchWait();
        long reported = 0;
        for (int i = 0; i < 1000; i++) {
            reported += wait.add(500_000); // half a millisecond each
        }
        verdict("fetch wait: 1000 waits of 0.5 ms report 500 ms",
                reported == 500 ? null : "reported " + reported + " ms");
    }

    private void fetchWaitReportsEachMillisecondOnce() {
        FetchWait wait = new FetchWait();
        long first = wait.add(2_700_000);
        long second = wait.add(300_000);
        verdict("fetch wait: 2.7 ms then 0.3 ms report 2 then 1",
                first == 2 && second == 1 ? null : "reported " + first + " then " + second);
    }

    private void refused(String key) {
        SparkConf conf = new SparkConf(false).set(key, "true");
        String failure;
        try {
            new ShuffledConf(conf);
            failure = "accepted";
        } catch (IllegalArgumentException e) {
            failure = e.getMessage().contains(key) ? null : "message does not name the setting: " + e.getMessage();
        }
        verdict("refuses " + key + "=true", failure);
    }

    /** spark.shuffled.replicas: unset is 0 (not sent), 1..4 is taken, anything else refused at start (-1). */
    private void replicas(String value, int expected) {
        SparkConf conf = new SparkConf(false);
        if (value != null) {
            conf.set(ShuffledConf.REPLICAS, value);
        }
        String failure;
        try {
            int got = new ShuffledConf(conf).replicas;
            failure = got == expected ? null : "got " + got;
        } catch (IllegalArgumentException e) {
            failure = expected == -1 && e.getMessage().contains(ShuffledConf.REPLICAS) ? null : e.getMessage();
        }
        verdict(ShuffledConf.REPLICAS + "=" + value + (expected == -1 ? " refused" : " is " + expected), failure);
    }

    /**
     * A setting the writers pass on as an OpenMapOutput key (durability, fsync): unset is null (not sent), the
     * protocol's values are taken, anything else is refused at start with the key named.
     */
    private void oneOf(String key, Function<ShuffledConf, String> field, String value, String expected) {
        SparkConf conf = new SparkConf(false);
        if (value != null) {
            conf.set(key, value);
        }
        String failure;
        try {
            String got = field.apply(new ShuffledConf(conf));
            failure = java.util.Objects.equals(got, expected) ? null : "got " + got;
        } catch (IllegalArgumentException e) {
            failure = "refused".equals(expected) && e.getMessage().contains(key) ? null : e.getMessage();
        }
        verdict(key + "=" + value + " is " + expected, failure);
    }

    /** An enum setting's error names every value it takes, as a user writes them. */
    private void refusedWith(String key, String value, String expected) {
        String failure;
        try {
            new ShuffledConf(new SparkConf(false).set(key, value));
            failure = "accepted";
        } catch (IllegalArgumentException e) {
            failure = expected.equals(e.getMessage()) ? null : "said: " + e.getMessage();
        }
        verdict(key + "=" + value + " refused with the values named", failure);
    }

    /** {@code spark.shuffle.compress=false} wins over {@code spark.shuffled.compression=on}; no daemon is asked. */
    private void compressionFollowsSpark() {
        SparkConf conf = new SparkConf(false).set(ShuffledConf.COMPRESSION, "on");
        String failure;
        try {
            boolean on = BlockCompression.of(new ShuffledConf(conf), conf).compress(null);
            boolean off = BlockCompression.of(new ShuffledConf(conf), conf.clone().set("spark.shuffle.compress", "false"))
                    .compress(null);
            failure = on && !off ? null : "on: " + on + ", with spark.shuffle.compress=false: " + off;
        } catch (java.io.IOException | RuntimeException e) {
            failure = e.toString();
        }
        verdict("compression on compresses unless spark.shuffle.compress=false", failure);
        String leaving = null;
        for (String[] kv : new String[][] {{ShuffledConf.REPLICAS, "2"}, {ShuffledConf.DURABILITY, "object-store"},
            {"spark.master", "spark://master:7077"}, {"spark.master", "k8s://https://kubernetes:443"}}) {
            SparkConf asked = new SparkConf(false).set("spark.master", "local[2]").set(ShuffledConf.COMPRESSION, "auto")
                    .set(kv[0], kv[1]);
            try {
                if (!BlockCompression.of(new ShuffledConf(asked), asked).compress(null)) {
                    leaving = kv[0] + "=" + kv[1] + " left auto uncompressed";
                }
            } catch (java.io.IOException | RuntimeException e) {
                leaving = kv[0] + "=" + kv[1] + ": " + e;
            }
        }
        verdict("auto compresses on clusters of several hosts and what the application sends off the host "
                + "(replicas, uploads)", leaving);
    }

    /** What in a daemon's answer to `pool` makes {@code auto} compress: half the pool in use, peers, an object store. */
    private void pressure() {
        String failure = null;
        long[][] cases = {{10, 100, 0, 0, 0}, {49, 100, 0, 0, 0}, {50, 100, 0, 0, 1}, {100, 100, 0, 0, 1},
            {0, 100, 1, 0, 1}, {0, 100, 0, 1, 1}};
        for (long[] c : cases) {
            java.util.Map<String, Object> pool = java.util.Map.of(
                    "used", c[0], "total", c[1], "peers", c[2], "object_store", c[3] == 1);
            if (BlockCompression.pressed(pool) != (c[4] == 1)) {
                failure = "used " + c[0] + " of " + c[1] + ", " + c[2] + " peers, object store " + (c[3] == 1) + ": "
                        + BlockCompression.pressed(pool);
            }
        }
        if (!BlockCompression.pressed(java.util.Map.of("used", 0L, "total", 100L))) {
            failure = "an answer without peers and object store does not count as pressed";
        }
        verdict("auto compresses from half the pool in use, with peers or an object store, or without an answer",
                failure);
    }

    /**
     * The mark of an uncompressed map output is in its map status's location, which Spark sends to reducers
     * serialized (a compressed map status below 2,000 partitions, a highly compressed one above).
     */
    private void uncompressedMarkSurvivesTheMapStatus(int partitions) {
        String failure;
        try {
            String[] found = new String[2];
            for (int i = 0; i < 2; i++) {
                org.apache.spark.storage.BlockManagerId at = DaemonLocation.of("127.0.0.9:7337", "host", i == 0);
                long[] lengths = new long[partitions];
                java.util.Arrays.fill(lengths, 100);
                java.io.ByteArrayOutputStream bytes = new java.io.ByteArrayOutputStream();
                try (java.io.ObjectOutputStream out = new java.io.ObjectOutputStream(bytes)) {
                    out.writeObject(mapStatus(at, lengths));
                }
                try (java.io.ObjectInputStream in =
                        new java.io.ObjectInputStream(new java.io.ByteArrayInputStream(bytes.toByteArray()))) {
                    org.apache.spark.storage.BlockManagerId back =
                            ((org.apache.spark.scheduler.MapStatus) in.readObject()).location();
                    found[i] = (DaemonLocation.compressed(back) ? "compressed" : "uncompressed") + " at "
                            + DaemonLocation.daemonOf(back);
                }
            }
            String[] expected = {"compressed at 127.0.0.9:7337", "uncompressed at 127.0.0.9:7337"};
            failure = java.util.Arrays.equals(found, expected) ? null : "read back " + java.util.Arrays.toString(found);
        } catch (java.io.IOException | ReflectiveOperationException e) {
            failure = e.toString();
        }
        verdict("a map status of " + partitions + " partitions keeps whether its output is compressed", failure);
    }

    /** {@code MapStatus.apply} of this Spark line: Spark 4.1 and later take a checksum too (0: none). */
    private static Object mapStatus(org.apache.spark.storage.BlockManagerId at, long[] lengths)
            throws ReflectiveOperationException {
        for (java.lang.reflect.Method m : org.apache.spark.scheduler.MapStatus$.class.getMethods()) {
            if (m.getName().equals("apply") && m.getParameterCount() >= 3) {
                Object[] args = m.getParameterCount() == 3 ? new Object[] {at, lengths, 3L}
                        : new Object[] {at, lengths, 3L, 0L};
                return m.invoke(org.apache.spark.scheduler.MapStatus$.MODULE$, args);
            }
        }
        throw new NoSuchMethodException("MapStatus.apply");
    }

    private void sparkLineOfThisJar() {
        SparkLine jar = SparkLine.ofJar();
        String failure;
        try {
            jar.check(org.apache.spark.package$.MODULE$.SPARK_VERSION(),
                    scala.util.Properties$.MODULE$.versionNumberString());
            failure = null;
        } catch (IllegalStateException e) {
            failure = e.getMessage();
        }
        verdict("the jar is for the Spark it was built against (" + jar.line + ", Scala " + jar.scala + ")", failure);
    }

    /** Spark stops a writer as a success only after write() returned: without a map status that is a bug. */
    private void writerStoppedBeforeCommit() {
        String failure;
        try {
            new ShuffledWriter<>(null, 5, null, null, null, null).stop(true);
            failure = "stop(true) returned";
        } catch (IllegalStateException e) {
            failure = e.getMessage().contains("never committed") ? null : "message: " + e.getMessage();
        }
        verdict("stop(true) of a writer that never committed throws", failure);
        Object stopped = new ShuffledWriter<>(null, 6, null, null, null, null).stop(false);
        verdict("stop(false) of a writer that never wrote is empty",
                stopped.equals(scala.Option.empty()) ? null : "returned " + stopped);
    }

    private void otherSparkLineRefused() {
        String failure;
        try {
            new SparkLine("4.0", "2.13").check("4.1.0", "2.13.16");
            failure = "accepted";
        } catch (IllegalStateException e) {
            failure = e.getMessage().contains("built for Spark 4.0 (Scala 2.13), but this is Spark 4.1.0")
                    ? null : "message: " + e.getMessage();
        }
        verdict("a 4.0 jar refuses Spark 4.1", failure);
    }
}
