package io.shuffled.spark;

import java.io.IOException;
import java.io.InputStream;
import java.util.Properties;

/**
 * The Spark line (and Scala version) this plugin jar was compiled for, written into the jar by the build
 * ({@code shuffled spark-jar}). Spark's internal classes change between lines, so a jar loaded into
 * another Spark would fail later with a {@code NoSuchMethodError} in the middle of a job; the shuffle
 * manager refuses it at start instead, saying which jar to build.
 */
final class SparkLine {
    static final String RESOURCE = "/io/shuffled/spark/line.properties";

    final String line;
    final String scala;

    SparkLine(String line, String scala) {
        this.line = line;
        this.scala = scala;
    }

    /** What the build wrote into this jar. */
    static SparkLine ofJar() {
        Properties p = new Properties();
        try (InputStream in = SparkLine.class.getResourceAsStream(RESOURCE)) {
            if (in == null) {
                throw new IllegalStateException("shuffled: the plugin jar has no " + RESOURCE
                        + "; build it with `shuffled spark-jar`");
            }
            p.load(in);
        } catch (IOException e) {
            throw new IllegalStateException("shuffled: cannot read " + RESOURCE + " from the plugin jar", e);
        }
        return new SparkLine(p.getProperty("spark.line", "?"), p.getProperty("scala.binary", "?"));
    }

    /** The line of a Spark version ("4.0.5" is line 4.0). */
    static String lineOf(String sparkVersion) {
        String[] parts = sparkVersion.split("[.-]");
        return parts.length >= 2 ? parts[0] + "." + parts[1] : sparkVersion;
    }

    /** Throws unless this jar was built for {@code sparkVersion} running on Scala {@code scalaVersion}. */
    void check(String sparkVersion, String scalaVersion) {
        String scalaBinary = lineOf(scalaVersion);
        if (!line.equals(lineOf(sparkVersion)) || !scala.equals(scalaBinary)) {
            throw new IllegalStateException("shuffled: this plugin jar was built for Spark " + line + " (Scala "
                    + scala + "), but this is Spark " + sparkVersion + " (Scala " + scalaBinary + "): build the "
                    + "jar for this Spark with `shuffled spark-jar --spark-home <its directory>` (or in a Python "
                    + "environment with pyspark " + lineOf(sparkVersion) + ") and put that one in spark.jars");
        }
    }
}
