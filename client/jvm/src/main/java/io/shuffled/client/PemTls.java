package io.shuffled.client;

import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.GeneralSecurityException;
import java.security.KeyFactory;
import java.security.KeyStore;
import java.security.PrivateKey;
import java.security.cert.Certificate;
import java.security.cert.CertificateFactory;
import java.security.spec.InvalidKeySpecException;
import java.security.spec.PKCS8EncodedKeySpec;
import java.util.Base64;
import java.util.List;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import javax.net.ssl.KeyManager;
import javax.net.ssl.KeyManagerFactory;
import javax.net.ssl.SSLContext;
import javax.net.ssl.TrustManager;
import javax.net.ssl.TrustManagerFactory;

/**
 * The {@link SSLContext} of a {@code tls:host:port} connection, from the PEM files the daemon's own
 * {@code --client-tls-*} flags take and openssl writes. The JDK alone reads them, so that a Spark job needs
 * neither a keystore converted for Java nor another jar on its classpath; the one PEM form it cannot read
 * unaided, a traditional ("BEGIN RSA PRIVATE KEY") key, is refused with the command that converts it.
 */
public final class PemTls {
    private static final Pattern PKCS8 =
            Pattern.compile("-----BEGIN PRIVATE KEY-----([A-Za-z0-9+/=\\s]+)-----END PRIVATE KEY-----");
    private static final Pattern ANY_BLOCK = Pattern.compile("-----BEGIN ([A-Z0-9 ]+)-----");
    /** A key store entry lives only in memory, for the factory's sake: its password protects nothing. */
    private static final char[] NO_PASSWORD = new char[0];

    private PemTls() {}

    /**
     * @param ca the certificates the daemon's must chain to; null: the JDK's default trust store
     * @param cert the client's certificate chain, shown to a daemon that asks for one ({@code --client-tls-ca});
     *     null: none
     * @param key the private key of {@code cert}, unencrypted PKCS#8 ("BEGIN PRIVATE KEY"), RSA or EC; given
     *     exactly when {@code cert} is
     */
    public static SSLContext context(Path ca, Path cert, Path key) throws IOException, GeneralSecurityException {
        if ((cert == null) != (key == null)) {
            throw new IllegalArgumentException(
                    cert == null ? "a TLS client key needs its certificate" : "a TLS client certificate needs its key");
        }
        SSLContext context = SSLContext.getInstance("TLS");
        context.init(cert == null ? null : keyManagers(cert, key), trustManagers(ca), null);
        return context;
    }

    private static TrustManager[] trustManagers(Path ca) throws IOException, GeneralSecurityException {
        TrustManagerFactory factory = TrustManagerFactory.getInstance(TrustManagerFactory.getDefaultAlgorithm());
        if (ca == null) {
            factory.init((KeyStore) null);
            return factory.getTrustManagers();
        }
        KeyStore store = emptyStore();
        List<Certificate> certificates = certificates(ca);
        for (int i = 0; i < certificates.size(); i++) {
            store.setCertificateEntry("ca-" + i, certificates.get(i));
        }
        factory.init(store);
        return factory.getTrustManagers();
    }

    private static KeyManager[] keyManagers(Path cert, Path key) throws IOException, GeneralSecurityException {
        KeyStore store = emptyStore();
        store.setKeyEntry("client", privateKey(key), NO_PASSWORD, certificates(cert).toArray(new Certificate[0]));
        KeyManagerFactory factory = KeyManagerFactory.getInstance(KeyManagerFactory.getDefaultAlgorithm());
        factory.init(store, NO_PASSWORD);
        return factory.getKeyManagers();
    }

    private static KeyStore emptyStore() throws IOException, GeneralSecurityException {
        KeyStore store = KeyStore.getInstance(KeyStore.getDefaultType());
        store.load(null, null);
        return store;
    }

    private static List<Certificate> certificates(Path pem) throws IOException, GeneralSecurityException {
        try (InputStream in = Files.newInputStream(pem)) {
            List<Certificate> certificates =
                    List.copyOf(CertificateFactory.getInstance("X.509").generateCertificates(in));
            if (certificates.isEmpty()) {
                throw new IllegalArgumentException(pem + " holds no certificate");
            }
            return certificates;
        }
    }

    private static PrivateKey privateKey(Path pem) throws IOException, GeneralSecurityException {
        String text = Files.readString(pem, StandardCharsets.US_ASCII);
        Matcher pkcs8 = PKCS8.matcher(text);
        if (!pkcs8.find()) {
            Matcher block = ANY_BLOCK.matcher(text);
            throw new IllegalArgumentException(pem + " holds " + (block.find() ? "a \"" + block.group(1) + "\"" : "no PEM")
                    + ", not an unencrypted PKCS#8 \"PRIVATE KEY\": convert it with "
                    + "openssl pkcs8 -topk8 -nocrypt -in " + pem + " -out KEY.pem");
        }
        PKCS8EncodedKeySpec spec = new PKCS8EncodedKeySpec(Base64.getMimeDecoder().decode(pkcs8.group(1)));
        // PKCS#8 names its algorithm inside the DER; asking each factory is simpler than parsing it
        for (String algorithm : new String[] {"RSA", "EC"}) {
            try {
                return KeyFactory.getInstance(algorithm).generatePrivate(spec);
            } catch (InvalidKeySpecException notThisOne) {
                // the next algorithm
            }
        }
        throw new IllegalArgumentException(pem + " holds a PKCS#8 key that is neither RSA nor EC");
    }
}
