package io.shuffled.spark;

import io.shuffled.client.PemTls;
import io.shuffled.client.wire.Wire;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.GeneralSecurityException;
import java.util.ArrayList;
import java.util.List;
import java.util.Objects;
import java.util.stream.Collectors;
import java.util.stream.Stream;
import javax.net.ssl.SSLContext;
import org.apache.spark.SparkConf;

/**
 * The plugin's settings, read once from the SparkConf. Every key starts with {@code spark.shuffled.} and is
 * declared here, with a Markdown comment (JEP 467) saying what it means and its default: README's "Spark"
 * table is generated from these comments ({@code python -m shuffled.spark_settings}), and a test checks that
 * it is, and that a default the code reads as a literal is the documented one.
 */
final class ShuffledConf {
    /// the executor's daemon: `host:port`, `[ipv6]:port`, `tls:host:port` (the daemon's `--client-tls-port`,
    /// see `spark.shuffled.tls.ca`) or `unix:/path`. A comma-separated list is allowed: an executor takes entry
    /// *executor id mod n* and falls back to the next one if its daemon is unreachable
    ///
    /// Default: `127.0.0.1:7337`
    static final String ADDRESS = "spark.shuffled.address";
    /// `task` picks the daemon per task instead (tests on one machine use it to spread one JVM's tasks over
    /// several daemons)
    ///
    /// Default: `executor`
    static final String DAEMON_CHOICE = "spark.shuffled.daemonChoice";
    /// the daemon the driver sends cleanup to; it passes it on to the daemons in its `--peers`
    ///
    /// Default: first address
    static final String ADMIN_ADDRESS = "spark.shuffled.adminAddress";
    /// bound of every wait for the daemon's answer (connect, handshake, push credit, commit, read data); past
    /// it the task fails instead of hanging (a read that times out is a fetch failure naming the daemon). A
    /// task whose daemons all refuse connections, in an executor that has reached one before, retries them
    /// for this long, so a restarting daemon does not fail its tasks; an executor that never reached a daemon
    /// fails at once (a wrong address). Socket writes themselves are not bounded: a daemon that stops reading
    /// altogether (a stopped process) blocks writers until the kernel gives up on the connection
    ///
    /// Default: `60s`
    static final String TIMEOUT = "spark.shuffled.timeout";
    /// the one buffer in which a map task collects the bytes of all its partitions; when full, and at task
    /// end, it is pushed ordered by partition and packed into 32 KiB segments
    ///
    /// Default: `16m`
    static final String WRITER_BUFFER = "spark.shuffled.writerBufferSize";
    /// how much a map task of a wide shuffle written serialized (SQL rows, Kryo) buffers, records and 12 bytes
    /// a record of index, before it writes them out sorted by partition (its arrays grow by doubling, so they
    /// may hold up to about twice that; a single larger record goes through). The memory is the task's
    /// execution memory, asked of Spark's memory manager as the buffer grows, so a task granted less writes
    /// out sooner. Each write-out gives every partition a (compressed) stream of its own: the fewer, the
    /// smaller and cheaper to write and read
    ///
    /// Default: `128m`
    static final String SORT_BUFFER = "spark.shuffled.sortBufferSize";
    /// whether map outputs go through Spark's shuffle codec (when `spark.shuffle.compress` is on): `on` always,
    /// as Spark's own shuffle does; `off` never; `auto` unless they stay in one host's memory: uncompressed only
    /// under a `local` or `local-cluster` master, without replicas or uploads, while the task's daemon has no
    /// other daemons, no object store and less than half its pool in use (asked at most every 100 ms). Each map
    /// status says which, so any setting reads any output. `auto` pays in sessions whose shuffles fit the pool
    /// and costs in those that outgrow it ([docs/spark.md](docs/spark.md))
    ///
    /// Default: `on`
    static final String COMPRESSION = "spark.shuffled.compression";
    /// the cluster secret, as in the daemons' `--secret-file` ([docs/security.md](docs/security.md)); the
    /// driver checks it with the admin daemon when the application starts, so a wrong one stops the
    /// application at once with the reason
    ///
    /// Default: none
    static final String SECRET = "spark.shuffled.secret";
    /// instead of `spark.shuffled.secret`: a file holding it, read where the driver and each executor run
    ///
    /// Default: none
    static final String SECRET_FILE = "spark.shuffled.secretFile";
    /// the application's own secret: its requests carry a token derived from it, and no other application's
    /// clients can read or remove its data ([docs/security.md](docs/security.md))
    ///
    /// Default: `spark.authenticate.secret` if `spark.authenticate=true`
    static final String APP_SECRET = "spark.shuffled.appSecret";
    /// copies of each map output, 1..4, the one in the task's daemon included: the application's own choice
    /// over the daemons' setting (`replicas` in [docs/configuration.md](docs/configuration.md)). Unset, map
    /// tasks do not say, and each daemon keeps its own setting
    ///
    /// Default: the daemons' `replicas`
    static final String REPLICAS = "spark.shuffled.replicas";
    /// `object-store`: every map output is uploaded to the daemons' object store once committed, so a lost host
    /// costs no recomputation even with one copy ([docs/durability.md](docs/durability.md)); `none`: not even
    /// when the daemons' `durability` setting says so. Unset, each daemon keeps its own setting
    ///
    /// Default: the daemons' `durability`
    static final String DURABILITY = "spark.shuffled.durability";
    /// `commit`: a map task's commit returns only once its output and the record of its commit are fsynced on
    /// its daemon (and on the replicas'), so that a power loss costs no recomputation, whatever the daemons'
    /// `fsync` setting ([docs/durability.md](docs/durability.md)); the daemons need a data dir. Unset, each
    /// daemon keeps its own setting
    ///
    /// Default: the daemons' `fsync`
    static final String FSYNC = "spark.shuffled.fsync";
    /// for `tls:` addresses: a PEM file of the CA certificates a daemon's certificate must chain to (it must
    /// also name the host as the address writes it), read where the driver and each executor run
    /// ([docs/security.md](docs/security.md))
    ///
    /// Default: the JDK's trust store
    static final String TLS_CA = "spark.shuffled.tls.ca";
    /// for `tls:` addresses to daemons that ask for a client certificate (`--client-tls-ca`): a PEM file of
    /// this client's certificate chain, read where the driver and each executor run
    ///
    /// Default: none
    static final String TLS_CERT = "spark.shuffled.tls.cert";
    /// the private key of `spark.shuffled.tls.cert`: a PEM file, unencrypted PKCS#8 (`BEGIN PRIVATE KEY`), RSA
    /// or EC; convert other forms with `openssl pkcs8 -topk8 -nocrypt`
    ///
    /// Default: none
    static final String TLS_KEY = "spark.shuffled.tls.key";

    static final String DEFAULT_ADDRESS = "127.0.0.1:7337";
    private static final String TLS_PREFIX = "tls:";

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
    final BlockCompression.Mode compression;
    final long timeoutMillis;
    final long writerBufferBytes;
    final long sortBufferBytes;
    /** The cluster secret every daemon checks on connect (PROTOCOL.md §6.1); null: none configured. */
    final String secret;
    /** The application's own secret (§6.2): its tokens keep other applications away from its data. */
    final String appSecret;
    /** Copies of each map output the application asks for (§7.8); 0: unset, the daemons' own setting. */
    final int replicas;
    /** Whether map outputs are uploaded to the object store (§12.5); null: unset, the daemons' own setting. */
    final String durability;
    /** Whether a map task's commit waits for the daemons' fsync (§7.8); null: unset, the daemons' own setting. */
    final String fsync;
    /** What {@code tls:} addresses are reached with; null: the JDK's defaults. */
    private final SSLContext tls;

    ShuffledConf(SparkConf conf) {
        refuse(conf, "spark.shuffle.useOldFetchProtocol",
                "map statuses must name map task attempts, so that a retried attempt is a new map output");
        refuse(conf, "spark.shuffle.push.enabled", "push-based shuffle merges blocks in Spark's own shuffle service");
        refuse(conf, "spark.storage.decommission.shuffleBlocks.enabled",
                "map output lives in the daemons, not in the executor's block manager, so there is nothing to migrate "
                        + "(a decommissioned executor's output stays readable)");
        addresses = parseAddresses(conf.get(ADDRESS, DEFAULT_ADDRESS));
        choice = named(conf, DAEMON_CHOICE, "executor", DaemonChoice.class);
        compression = named(conf, COMPRESSION, "on", BlockCompression.Mode.class);
        adminAddress = conf.get(ADMIN_ADDRESS, addresses.get(0)).trim();
        timeoutMillis = conf.getTimeAsMs(TIMEOUT, "60s");
        writerBufferBytes = conf.getSizeAsBytes(WRITER_BUFFER, "16m");
        if (timeoutMillis <= 0) {
            throw new IllegalArgumentException(TIMEOUT + " must be positive");
        }
        sortBufferBytes = conf.getSizeAsBytes(SORT_BUFFER, "128m");
        if (writerBufferBytes <= 0) {
            throw new IllegalArgumentException(WRITER_BUFFER + " must be positive");
        }
        if (sortBufferBytes <= 0) {
            throw new IllegalArgumentException(SORT_BUFFER + " must be positive");
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
        durability = oneOf(conf, DURABILITY, Wire.DURABILITIES);
        fsync = oneOf(conf, FSYNC, Wire.FSYNCS);
        tls = tls(conf, addresses, adminAddress);
    }

    /** The TLS context to connect to {@code address} with: null for the JDK's defaults, or no TLS at all. */
    SSLContext tlsFor(String address) {
        return address.startsWith(TLS_PREFIX) ? tls : null;
    }

    /**
     * The context of {@code spark.shuffled.tls.*}, read here so that a missing or unreadable file stops the
     * application (or the executor) at start with the setting's name, not each task at connect. Settings
     * that no {@code tls:} address uses are refused: whoever wrote them expects the traffic encrypted.
     */
    private static SSLContext tls(SparkConf conf, List<String> addresses, String adminAddress) {
        Path ca = path(conf, TLS_CA);
        Path cert = path(conf, TLS_CERT);
        Path key = path(conf, TLS_KEY);
        if (ca == null && cert == null && key == null) {
            return null;
        }
        if (!adminAddress.startsWith(TLS_PREFIX) && addresses.stream().noneMatch(a -> a.startsWith(TLS_PREFIX))) {
            throw new IllegalArgumentException("spark.shuffled.tls.* need a tls:host:port address in " + ADDRESS
                    + " or " + ADMIN_ADDRESS + ", got " + String.join(",", addresses));
        }
        if ((cert == null) != (key == null)) {
            throw new IllegalArgumentException(cert == null ? TLS_KEY + " needs " + TLS_CERT : TLS_CERT + " needs "
                    + TLS_KEY);
        }
        try {
            return PemTls.context(ca, cert, key);
        } catch (IOException | GeneralSecurityException | IllegalArgumentException e) {
            String files = Stream.of(ca, cert, key).filter(Objects::nonNull).map(Path::toString)
                    .collect(Collectors.joining(", "));
            throw new IllegalArgumentException("spark.shuffled.tls.* (" + files + "): "
                    + (e instanceof IllegalArgumentException ? e.getMessage() : e.toString()), e);
        }
    }

    private static Path path(SparkConf conf, String key) {
        String value = conf.get(key, "").trim();
        return value.isEmpty() ? null : Path.of(value);
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
            String text = Files.readString(Path.of(file));
            if (text.isBlank()) {
                throw new IllegalArgumentException(SECRET_FILE + " " + file + " is empty");
            }
            return text;
        } catch (IOException e) {
            throw new IllegalArgumentException(SECRET_FILE + ": cannot read " + file + ": " + e, e);
        }
    }

    /**
     * A setting passed on to the daemons as a key of OpenMapOutput (§7.8), refused here so that a wrong value
     * stops the application at start, not each map task at the daemon; null when unset.
     */
    private static String oneOf(SparkConf conf, String key, List<String> values) {
        String value = conf.get(key, "").trim();
        if (value.isEmpty()) {
            return null;
        }
        if (!values.contains(value)) {
            throw new IllegalArgumentException(key + " must be one of " + values + ", got '" + value + "'");
        }
        return value;
    }

    /**
     * A setting that names one of an enum's constants, in any case; the error lists them in their declared
     * order, as users write them.
     */
    private static <E extends Enum<E>> E named(SparkConf conf, String key, String fallback, Class<E> type) {
        String name = conf.get(key, fallback).trim();
        try {
            return Enum.valueOf(type, name.toUpperCase(java.util.Locale.ROOT));
        } catch (IllegalArgumentException e) {
            E[] values = type.getEnumConstants();
            StringBuilder allowed = new StringBuilder();
            for (int i = 0; i < values.length; i++) {
                if (i > 0) {
                    allowed.append(i == values.length - 1 ? " or " : ", ");
                }
                allowed.append('\'').append(values[i].name().toLowerCase(java.util.Locale.ROOT)).append('\'');
            }
            throw new IllegalArgumentException(key + " must be " + allowed + ", got '" + name + "'", e);
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
            String hostPort = a.startsWith(TLS_PREFIX) ? a.substring(TLS_PREFIX.length()) : a;
            if (!a.startsWith("unix:") && hostPort.lastIndexOf(':') <= 0) {
                throw new IllegalArgumentException(
                        ADDRESS + ": expected host:port, [ipv6]:port, tls:host:port or unix:/path, got '" + a + "'");
            }
            out.add(a);
        }
        if (out.isEmpty()) {
            throw new IllegalArgumentException(ADDRESS + " names no daemon");
        }
        return List.copyOf(out);
    }
}
