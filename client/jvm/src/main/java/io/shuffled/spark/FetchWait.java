package io.shuffled.spark;

/**
 * A reader's fetch wait, kept in nanoseconds. Spark counts fetch wait in whole milliseconds, and one
 * chunk's wait is mostly far below one, so waits are summed here and handed over a millisecond at a
 * time: a task that waited a thousand times half a millisecond reports half a second, not nothing.
 */
final class FetchWait {
    private long unreportedNanos;

    /** Adds one wait; returns the whole milliseconds that are now due to Spark's metrics. */
    long add(long waitNanos) {
        unreportedNanos += waitNanos;
        long millis = unreportedNanos / 1_000_000;
        unreportedNanos -= millis * 1_000_000;
        return millis;
    }
}
