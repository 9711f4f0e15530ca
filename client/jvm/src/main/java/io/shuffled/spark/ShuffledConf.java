package io.shuffled.spark;

import io.shuffled.client.wire.Wire;
import java.util.ArrayList;
import java.util.List;
import org.apache.spark.SparkConf;

/**
 * The plugin's settings, read once from the SparkConf. Every key starts with {@code spark.shuffled.};
 * README's "Spark" section lists them with defaults.
 */
final class ShuffledConf {
    static final String ADDRESS = "spark.shuffled.address";
    static final String DAEMON_CHOICE = "spark.shuffled.daemonChoice";
    static final String ADMIN_ADDRESS = "spark.shuffled.adminAddress";
    static final String TIMEOUT = "spark.shuffled.timeout";
    static final String WRITER_BUFFER = "spark.shuffled.writerBufferSize";
    static final String SECRET = "spark.shuffled.secret";
    static final String SECRET_FILE = "spark.shuffled.secretFile";
    static final String APP_SECRET = "spark.shuffled.appSecret";
    static final String REPLICAS = "spark.shuffled.replicas";

    static final String DEFAULT_ADDRESS = "127.0.0.1:7337";

    /** How a task picks its daemon among {@link #addresses}. */
    enum DaemonChoice {
        /** By executor id: every task of an executor uses the same daemon (production: one address). */
        EXECUTOR,
        /** By task attempt id: spreads one JVM's tasks over several daemons (tests on one machine). */
        TASK
    }

    final List<String> addresses;
    final DaemonChoice choice;
    final String adminAddress;
    final long timeoutMillis;
    final long writerBufferBytes;
    /** The cluster secret every daemon checks on connect (PROTOCOL.md §6.1); null: none configured. */
    final String secret;
    /** The application's own secret (§6.2): its tokens keep other applications away from its data. */
    final String appSecret;
    /** Copies of each map output the application asks for (§7.8); 0: unset, the daemons' own setting. */
    final int replicas;

    ShuffledConf(SparkConf conf) {
        refuse(conf, "spark.shuffle.useOldFetchProtocol",
                "map statuses must name map task attempts, so that a retried attempt is a new map output");
        refuse(conf, "spark.shuffle.push.enabled", "push-based shuffle merges blocks in Spark's own shuffle service");
        refuse(conf, "spark.storage.decommission.shuffleBlocks.enabled",
                "map output lives in the daemons, not in the executor's block manager, so there is nothing to migrate "
                        + "(a decommissioned executor's output stays readable)");
        addresses = parseAddresses(conf.get(ADDRESS, DEFAULT_ADDRESS));
        String choiceName = conf.get(DAEMON_CHOICE, "executor").trim();
        try {
            choice = DaemonChoice.valueOf(choiceName.toUpperCase(java.util.Locale.ROOT));
        } catch (IllegalArgumentException e) {
            throw new IllegalArgumentException(
                    DAEMON_CHOICE + " must be 'executor' or 'task', got '" + choiceName + "'", e);
        }
        adminAddress = conf.get(ADMIN_ADDRESS, addresses.get(0)).trim();
        timeoutMillis = conf.getTimeAsMs(TIMEOUT, "60s");
        writerBufferBytes = conf.getSizeAsBytes(WRITER_BUFFER, "16m");
        if (timeoutMillis <= 0) {
            throw new IllegalArgumentException(TIMEOUT + " must be positive");
        }
        if (writerBufferBytes <= 0) {
            throw new IllegalArgumentException(WRITER_BUFFER + " must be positive");
        }
        secret = secret(conf);
        String app = conf.get(APP_SECRET, "");
        if (app.isBlank() && conf.getBoolean("spark.authenticate", false)) {
            app = conf.get("spark.authenticate.secret", "");
        }
        appSecret = app.isBlank() ? null : app;
        replicas = conf.getInt(REPLICAS, 0);
        if (conf.contains(REPLICAS) && (replicas < 1 || replicas > Wire.MAX_REPLICAS)) {
            throw new IllegalArgumentException(REPLICAS + " must be in 1.." + Wire.MAX_REPLICAS + ", got " + replicas);
        }
    }

    /** {@code spark.shuffled.secret}, else the content of {@code spark.shuffled.secretFile} (read where it runs). */
    private static String secret(SparkConf conf) {
        String value = conf.get(SECRET, "");
        if (!value.isBlank()) {
            return value;
        }
        String file = conf.get(SECRET_FILE, "").trim();
        if (file.isEmpty()) {
            return null;
        }
        try {
            String text = java.nio.file.Files.readString(java.nio.file.Path.of(file));
            if (text.isBlank()) {
                throw new IllegalArgumentException(SECRET_FILE + " " + file + " is empty");
            }
            return text;
        } catch (java.io.IOException e) {
            throw new IllegalArgumentException(SECRET_FILE + ": cannot read " + file + ": " + e, e);
        }
    }

    /** Spark settings shuffled cannot work with: refused at start rather than failing jobs later. */
    private static void refuse(SparkConf conf, String key, String why) {
        if (conf.getBoolean(key, false)) {
            throw new IllegalArgumentException("shuffled needs " + key + "=false: " + why);
        }
    }

    private static List<String> parseAddresses(String value) {
        List<String> out = new ArrayList<>();
        for (String part : value.split(",")) {
            String a = part.trim();
            if (a.isEmpty()) {
                continue;
            }
            if (!a.startsWith("unix:") && a.lastIndexOf(':') <= 0) {
                throw new IllegalArgumentException(
                        ADDRESS + ": expected host:port, [ipv6]:port or unix:/path, got '" + a + "'");
            }
            out.add(a);
        }
        if (out.isEmpty()) {
            throw new IllegalArgumentException(ADDRESS + " names no daemon");
        }
        return List.copyOf(out);
    }
}
