package io.shuffled.spark;

import io.shuffled.client.ShuffleClient;
import io.shuffled.client.wire.ErrorCode;
import io.shuffled.client.wire.ShuffledException;
import java.io.IOException;
import java.security.cert.CertificateException;
import java.util.Map;
import org.apache.spark.SparkEnv;
import org.apache.spark.shuffle.api.ShuffleDriverComponents;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The driver's part: frees shuffle data in the daemons when Spark drops a shuffle (the ContextCleaner,
 * after the shuffle's RDD is garbage) and when the application stops. Requests go to
 * {@code spark.shuffled.adminAddress} (default: the first daemon address), which passes them on to every
 * daemon it knows. Spark's own cleanup (map output tracker, block manager) still runs: Spark calls this
 * in addition to it.
 *
 * <p>{@link #supportsReliableStorage} is true: map output lives in the daemons, not in executors, so Spark
 * keeps it when an executor goes away and allows dynamic allocation without its external shuffle
 * service.
 */
final class ShuffledDriverComponents implements ShuffleDriverComponents {
    private static final Logger LOG = LoggerFactory.getLogger(ShuffledDriverComponents.class);

    /** Bound of the start-up credentials check: an unreachable daemon must not hold up the application. */
    private static final long PROBE_TIMEOUT_MILLIS = 5_000;

    private final ShuffledConf conf;

    ShuffledDriverComponents(ShuffledConf conf) {
        this.conf = conf;
    }

    /**
     * Checks the credentials with the admin daemon once, so that a wrong {@code spark.shuffled.secret}
     * stops the application at start with the daemon's reason instead of failing every task later. A
     * daemon that cannot be reached is only logged: tasks report it if it stays away.
     */
    @Override
    public Map<String, String> initializeApplication() {
        long timeout = Math.min(conf.timeoutMillis, PROBE_TIMEOUT_MILLIS);
        try (ShuffleClient client = connect(timeout)) {
            LOG.info("shuffled: {} ({}) accepted this application's credentials", conf.adminAddress,
                    client.daemonNode());
        } catch (ShuffledException e) {
            if (e.code() == ErrorCode.AUTH_FAILED) {
                throw new IllegalStateException("shuffled: authentication with " + conf.adminAddress + " failed: "
                        + e.getMessage() + " (check " + ShuffledConf.SECRET + " against the daemons' secret-file)", e);
            }
            if (certificateRefused(e)) {
                throw new IllegalStateException("shuffled: TLS with " + conf.adminAddress + " failed: "
                        + e.getMessage() + " (check " + ShuffledConf.TLS_CA + " against the CA of the daemons'"
                        + " --client-tls-cert, and that the address names the host that certificate is for)", e);
            }
            LOG.warn("shuffled: could not reach {} at start: {}", conf.adminAddress, e.toString());
        } catch (IOException | RuntimeException e) {
            LOG.warn("shuffled: could not reach {} at start: {}", conf.adminAddress, e.toString());
        }
        return Map.of();
    }

    /**
     * Whether this application's side refused the daemon's certificate (not trusted, or for another name):
     * like a wrong secret, every task would fail the same way, so the application stops at start. A
     * connection that merely ended during the handshake (a daemon restarting, or one that wants a client
     * certificate it was not shown) is only logged.
     */
    private static boolean certificateRefused(Throwable e) {
        for (Throwable cause = e; cause != null; cause = cause.getCause()) {
            if (cause instanceof CertificateException) {
                return true;
            }
        }
        return false;
    }

    @Override
    public void cleanupApplication() {
        String app = appId();
        if (app != null) {
            admin("remove application " + app, c -> c.removeApplication(app));
        }
    }

    @Override
    public void removeShuffle(int shuffleId, boolean blocking) {
        String app = appId();
        if (app != null) {
            admin("unregister shuffle " + app + "/" + shuffleId, c -> c.unregisterShuffle(app, shuffleId));
        }
    }

    @Override
    public boolean supportsReliableStorage() {
        return true;
    }

    private interface AdminCall {
        Map<String, Object> apply(ShuffleClient client) throws IOException;
    }

    /** Cleanup must never fail the application: a daemon that cannot be reached is logged. */
    private void admin(String what, AdminCall call) {
        try (ShuffleClient client = connect(conf.timeoutMillis)) {
            Map<String, Object> result = call.apply(client);
            LOG.info("shuffled: {} at {}: {}", what, conf.adminAddress, result);
        } catch (IOException | RuntimeException e) {
            LOG.warn("shuffled: could not {} at {}: {}", what, conf.adminAddress, e.toString());
        }
    }

    private ShuffleClient connect(long timeoutMillis) throws IOException {
        return ShuffleClient.connect(conf.adminAddress, "spark-driver", timeoutMillis,
                ShuffleClient.DEFAULT_WRITER_BUFFER_BYTES, conf.secret, conf.appSecret,
                conf.tlsFor(conf.adminAddress));
    }

    private static String appId() {
        SparkEnv env = SparkEnv.get();
        return env == null ? null : env.conf().getOption("spark.app.id").getOrElse(() -> null);
    }
}
