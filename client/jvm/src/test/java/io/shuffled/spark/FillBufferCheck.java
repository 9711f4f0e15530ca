package io.shuffled.spark;

import io.shuffled.client.Checks;
import java.io.ByteArrayOutputStream;
import java.util.Arrays;
import java.util.Random;
import org.apache.spark.SparkConf;
import org.apache.spark.memory.TaskMemoryManager;
import org.apache.spark.memory.UnifiedMemoryManager;

/**
 * {@link FillBuffer} under Spark's own memory manager (a {@link UnifiedMemoryManager} of a chosen size, one
 * task), driven as {@link SerializedSortWriter} drives it: records written in chunks, a fill written out
 * partition by partition through the sorted order whenever it has no room. Checks that every partition gets
 * exactly its records' bytes in arrival order, that fills are as few as the bound and the memory allow, that
 * the bytes array is back within the bound after every fill (a record larger than the bound grows it for its
 * own fill only), and that no memory is left held. Prints {@link Checks}' lines.
 */
public final class FillBufferCheck {
    /** What a run did: fills written out, the largest bytes array after one, memory held at the end. */
    private record Run(int fills, int largestAfterFill, long leftHeld, long leftAtTaskEnd) {}

    public static void main(String[] args) {
        Checks c = new Checks();
        c.check("a map output within the bound and the memory is one fill", () -> {
            Run run = drive(64L << 20, 16L << 20, 1_000, cases(new Random(1), 20_000, 200, 0));
            Checks.require(run.fills == 1, run.fills + " fills");
            idle(run);
        });
        c.check("little memory makes many fills, however large the bound", () -> {
            Run run = drive(1L << 20, 128L << 20, 1_000, cases(new Random(2), 40_000, 200, 0));
            Checks.require(run.fills > 4, run.fills + " fills of 4 MiB in 1 MiB");
            idle(run);
        });
        c.check("records larger than the bound go through, each growing the array for its own fill", () -> {
            Run run = drive(1L << 20, 256 << 10, 50, cases(new Random(3), 200, 200, 1 << 20));
            Checks.require(run.largestAfterFill <= 256 << 10, "array of " + run.largestAfterFill + " after a fill");
            idle(run);
        });
        c.check("random bounds, memory, partitions and records: exact bytes, arrays within the bound", () -> {
            Random random = new Random(4);
            for (int i = 0; i < 300; i++) {
                long pool = (256L << 10) << random.nextInt(8);
                long bound = (16L << 10) << random.nextInt(10);
                int partitions = 1 + random.nextInt(3_000);
                int huge = random.nextInt(4) == 0 ? 3 * (int) Math.min(bound, 256 << 10) : 0;
                Run run = drive(pool, bound, partitions, cases(random, random.nextInt(5_000), 1 + random.nextInt(400), huge));
                Checks.require(run.largestAfterFill <= Math.max(FillBuffer.FIRST_BYTES, bound),
                        "case " + i + ": array of " + run.largestAfterFill + " after a fill, bound " + bound);
                idle(run);
            }
        });
        c.exit();
    }

    /** Records: sizes up to {@code small} bytes (zero too), one in a hundred up to {@code huge} if positive. */
    private static byte[][] cases(Random random, int count, int small, int huge) {
        byte[][] records = new byte[count][];
        for (int i = 0; i < count; i++) {
            int size = huge > 0 && random.nextInt(100) == 0 ? random.nextInt(huge) : random.nextInt(small + 1);
            records[i] = new byte[size];
            random.nextBytes(records[i]);
        }
        return records;
    }

    private static void idle(Run run) {
        Checks.require(run.leftHeld == 0 && run.leftAtTaskEnd == 0,
                "held " + run.leftHeld + " after release, " + run.leftAtTaskEnd + " at task end");
    }

    /** Writes {@code records}, record i to partition i * 7919 mod partitions, and checks what comes out. */
    private static Run drive(long pool, long bound, int partitions, byte[][] records) throws Exception {
        TaskMemoryManager task = new TaskMemoryManager(new UnifiedMemoryManager(new SparkConf(false), pool, pool / 2, 1), 0);
        TaskMemory memory = new TaskMemory(task);
        FillBuffer fill = new FillBuffer(memory, bound, partitions);
        ByteArrayOutputStream[] got = new ByteArrayOutputStream[partitions];
        ByteArrayOutputStream[] want = new ByteArrayOutputStream[partitions];
        for (int p = 0; p < partitions; p++) {
            got[p] = new ByteArrayOutputStream();
            want[p] = new ByteArrayOutputStream();
        }
        Random chunks = new Random(records.length);
        int fills = 0;
        int largest = 0;
        for (int i = 0; i < records.length; i++) {
            int partition = (int) ((long) i * 7919 % partitions);
            byte[] record = records[i];
            want[partition].write(record);
            fill.startRecord(partition);
            for (int off = 0; off < record.length; ) {
                int n = Math.min(record.length - off, 1 + chunks.nextInt(8192));
                fill.write(record, off, n);
                off += n;
            }
            if (!fill.roomForNext()) {
                fills += writeOut(fill, got);
                largest = Math.max(largest, fill.buf.length);
            }
        }
        fills += writeOut(fill, got);
        largest = Math.max(largest, fill.buf.length);
        fill.release();
        for (int p = 0; p < partitions; p++) {
            Checks.require(Arrays.equals(got[p].toByteArray(), want[p].toByteArray()),
                    "partition " + p + ": " + got[p].size() + " bytes out, " + want[p].size() + " in");
        }
        return new Run(fills, largest, memory.getUsed(), task.cleanUpAllAllocatedMemory());
    }

    /** As SerializedSortWriter.writeOut: partitions ascending, each one's records in arrival order. */
    private static int writeOut(FillBuffer fill, ByteArrayOutputStream[] got) {
        int records = fill.records;
        fill.sortByPartition();
        int last = -1;
        for (int i = 0; i < records; ) {
            int partition = fill.parts[fill.order[i]];
            Checks.require(partition > last, "partition " + partition + " after " + last);
            int previous = -1;
            for (int end = fill.ends[partition]; i < end; i++) {
                int r = fill.order[i];
                Checks.require(fill.parts[r] == partition && r > previous, "record " + r + " out of order");
                got[partition].write(fill.buf, fill.starts[r], fill.starts[r + 1] - fill.starts[r]);
                previous = r;
            }
            last = partition;
        }
        fill.clear();
        return records > 0 ? 1 : 0;
    }
}
