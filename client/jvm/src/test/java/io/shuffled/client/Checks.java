package io.shuffled.client;

/**
 * What the check programs share: one line per check, {@code ok} or {@code FAIL} with the reason, then
 * {@code N passed, M failed} (the line tests/integration reads), and an exit status that is 0 only when
 * every check passed.
 */
public final class Checks {
    public interface Body {
        void run() throws Exception;
    }

    private int passed;
    private int failed;

    public void check(String name, Body body) {
        try {
            body.run();
            passed++;
            System.out.println("ok   " + name);
        } catch (Throwable e) {
            failed++;
            System.out.println("FAIL " + name + ": " + (e instanceof AssertionError ? e.getMessage() : e.toString()));
        }
    }

    public static void require(boolean condition, String message) {
        if (!condition) {
            throw new AssertionError(message);
        }
    }

    /** Prints the summary and ends the program. */
    public void exit() {
        System.out.println(passed + " passed, " + failed + " failed");
        System.exit(failed == 0 ? 0 : 1);
    }
}
