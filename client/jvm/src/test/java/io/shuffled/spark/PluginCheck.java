package io.shuffled.spark;

import java.util.ArrayList;
import java.util.List;
import org.apache.spark.SparkConf;

/**
 * Checks of the plugin's small rules that a Spark job shows only by chance: fetch wait that is made of
 * sub-millisecond waits, and the Spark settings the plugin refuses at start. Prints one line per check,
 * then {@code N passed, M failed}; exits non-zero on any failure.
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
}
