package io.shuffled.spark;

import org.apache.spark.memory.MemoryConsumer;
import org.apache.spark.memory.MemoryMode;
import org.apache.spark.memory.TaskMemoryManager;

/**
 * Heap a map task's writer holds as the task's execution memory, so that Spark's memory manager counts it
 * beside the task's other operators and bounds it: the writer asks before it grows and, when refused, writes
 * out what it holds instead. It never frees memory when another consumer asks (as Spark's own shuffle sorter
 * does not): the only way would be a write-out in the middle of a record, and what it holds is bounded anyway.
 */
final class TaskMemory extends MemoryConsumer {
    TaskMemory(TaskMemoryManager manager) {
        super(manager, MemoryMode.ON_HEAP);
    }

    /** Holds at least {@code total} bytes in all; false, holding no more than before, when Spark grants less. */
    boolean hold(long total) {
        long more = total - getUsed();
        if (more <= 0) {
            return true;
        }
        long granted = acquireMemory(more);
        if (granted >= more) {
            return true;
        }
        freeMemory(granted);
        return false;
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
