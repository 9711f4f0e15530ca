package io.shuffled.client.wire;

import java.nio.charset.StandardCharsets;
import java.security.GeneralSecurityException;
import java.security.MessageDigest;
import java.security.SecureRandom;
import java.util.HexFormat;
import javax.crypto.Mac;
import javax.crypto.spec.SecretKeySpec;

/**
 * The handshake's challenge–response and the application tokens (PROTOCOL.md §6.1, §6.2).
 *
 * <p>Each side proves it knows the shared secret with an HMAC-SHA256 over both nonces under its own
 * label, so a proof can be neither replayed (fresh nonces) nor reflected (different labels), and the
 * secret never travels. An application token is an HMAC of the application id under the application's
 * secret; the daemon keeps only a digest of it.
 */
public final class Auth {
    private Auth() {}

    private static final HexFormat HEX = HexFormat.of();
    private static final SecureRandom RANDOM = new SecureRandom();
    private static final String DIALER = "shuffled-v2 dialer\n";
    private static final String ACCEPTOR = "shuffled-v2 acceptor\n";
    private static final String APP = "shuffled-v2 app\n";
    /** Hex characters of a nonce (16 random bytes); shorter ones are refused (§6.1). */
    public static final int NONCE_HEX = 32;

    /** 16 random bytes as 32 lowercase hex characters. */
    public static String newNonce() {
        byte[] b = new byte[NONCE_HEX / 2];
        RANDOM.nextBytes(b);
        return HEX.formatHex(b);
    }

    /** A secret as configured: UTF-8, trailing whitespace and newlines do not count (§6.1). */
    public static byte[] secretBytes(String secret) {
        String trimmed = secret.stripTrailing();
        if (trimmed.isEmpty()) {
            throw new IllegalArgumentException("the secret is empty");
        }
        return trimmed.getBytes(StandardCharsets.UTF_8);
    }

    public static String dialerProof(byte[] secret, String dialerNonce, String acceptorNonce) {
        return hmac(secret, DIALER + dialerNonce + "\n" + acceptorNonce);
    }

    public static String acceptorProof(byte[] secret, String dialerNonce, String acceptorNonce) {
        return hmac(secret, ACCEPTOR + dialerNonce + "\n" + acceptorNonce);
    }

    /** What requests about {@code app} carry as {@code token} (§6.2): never the secret itself. */
    public static String appToken(byte[] appSecret, String app) {
        return hmac(appSecret, APP + app);
    }

    /** Constant-time comparison of two proofs. */
    public static boolean proofMatches(String expected, String got) {
        return MessageDigest.isEqual(
                expected.getBytes(StandardCharsets.UTF_8), got.getBytes(StandardCharsets.UTF_8));
    }

    private static String hmac(byte[] key, String message) {
        try {
            Mac mac = Mac.getInstance("HmacSHA256");
            mac.init(new SecretKeySpec(key, "HmacSHA256"));
            return HEX.formatHex(mac.doFinal(message.getBytes(StandardCharsets.UTF_8)));
        } catch (GeneralSecurityException e) {
            throw new IllegalStateException("HmacSHA256 is part of every Java runtime", e);
        }
    }
}
