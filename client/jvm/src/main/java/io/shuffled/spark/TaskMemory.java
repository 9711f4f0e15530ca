package io.shuffled.spark;

import org.apache.spark.memory.MemoryConsumer;
import org.apache.spark.memory.MemoryMode;
import org.apache.spark.memory.TaskMemoryManager;

/**
 * Heap a map task's writer holds as the task's execution memory, so that Spark's memory manager counts it
 * beside the task's other operators and bounds it: the writer asks before it grows and, when refused, writes
 * out what it holds instead. It never frees memory when another consumer asks (nor does Spark's own shuffle
 * sorter): such a request may come from another thread (a Python UDF's feeder pulls rows through the task's
 * operators) while a record is being written, and what the writer holds is bounded anyway.
 */
final class TaskMemory extends MemoryConsumer {
    /** The most it held at once: the task's "peak execution memory", which Spark's own writers report too. */
    private long peak;

    TaskMemory(TaskMemoryManager manager) {
        super(manager, MemoryMode.ON_HEAP);
    }

    /** Holds up to {@code total} bytes in all, as much of it as Spark grants; returns how much it holds. */
    long hold(long total) {
        long more = total - getUsed();
        if (more > 0) {
            acquireMemory(more);
        }
        peak = Math.max(peak, getUsed());
        return getUsed();
    }

    long peak() {
        return peak;
    }

    /** Gives back whatever it holds above {@code total} bytes. */
    void keep(long total) {
        long less = getUsed() - total;
        if (less > 0) {
            freeMemory(less);
        }
    }

    @Override
    public long spill(long size, MemoryConsumer trigger) {
        return 0;
    }
}
