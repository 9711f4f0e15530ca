package io.shuffled.spark;

import io.shuffled.client.PartitionReader;
import io.shuffled.client.ShuffleClient;
import io.shuffled.client.wire.ShuffledException;
import io.shuffled.spark.compat.Checksums;
import java.io.IOException;
import java.util.ArrayList;
import java.io.InterruptedIOException;
import java.net.SocketTimeoutException;
import java.util.LinkedHashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.apache.spark.InterruptibleIterator;
import org.apache.spark.ShuffleDependency;
import org.apache.spark.SparkEnv;
import org.apache.spark.TaskContext;
import org.apache.spark.serializer.DeserializationStream;
import org.apache.spark.serializer.SerializerInstance;
import org.apache.spark.serializer.SerializerManager;
import org.apache.spark.shuffle.BaseShuffleHandle;
import org.apache.spark.shuffle.FetchFailedException;
import org.apache.spark.shuffle.ShuffleReadMetricsReporter;
import org.apache.spark.shuffle.ShuffleReader;
import org.apache.spark.shuffle.sort.SortShuffleManager;
import org.apache.spark.storage.BlockId;
import org.apache.spark.storage.BlockManagerId;
import org.apache.spark.storage.ShuffleBlockBatchId;
import org.apache.spark.storage.ShuffleBlockId;
import org.apache.spark.util.collection.ExternalSorter;
import scala.Option;
import scala.Product2;
import scala.Tuple2;
import scala.Tuple3;
import scala.collection.AbstractIterator;
import scala.collection.Iterator;
import scala.collection.Seq;
import scala.math.Ordering;

/**
 * Reads reduce partitions [start, end) of the map outputs [startMap, endMap) through the task's daemon.
 *
 * <p>Which map attempts to read, and where each one's output lives, comes from Spark's
 * {@code MapOutputTracker}, exactly as for the built-in shuffle; a location names a daemon and whether its
 * outputs were compressed ({@link DaemonLocation}, {@link BlockCompression}). One read stream is opened per
 * location, a few ahead of the one being read
 * (so the next daemons already send under their initial credit), and they are consumed one after
 * another. Each (partition, attempt) pair is
 * one block, deserialized as the built-in reader does, or, where Spark's own reader fetches an attempt's
 * consecutive blocks as one batch (a coalesced range of Spark SQL, whose compressed streams and rows
 * concatenate), all of an attempt's pairs are one block, read through one decompressing and one
 * deserializing stream. Spark's {@code Aggregator} and
 * {@link ExternalSorter} then combine and sort the records as the built-in reader does.
 *
 * <p>A read error that means lost shuffle data (the daemon has no such output, it or its peer is down,
 * the connection broke) becomes a {@link FetchFailedException} naming that daemon's location, so Spark
 * forgets the outputs on it and recomputes them; other errors fail the task with the daemon's message.
 */
final class ShuffledReader<K, C> implements ShuffleReader<K, C> {
    private final BaseShuffleHandle<K, ?, C> handle;
    private final int startMap;
    private final int endMap;
    private final int start;
    private final int end;
    private final TaskContext context;
    private final ShuffleReadMetricsReporter metrics;
    private final DaemonClients clients;

    ShuffledReader(BaseShuffleHandle<K, ?, C> handle, int startMap, int endMap, int start, int end,
            TaskContext context, ShuffleReadMetricsReporter metrics, DaemonClients clients) {
        this.handle = handle;
        this.startMap = startMap;
        this.endMap = endMap;
        this.start = start;
        this.end = end;
        this.context = context;
        this.metrics = metrics;
        this.clients = clients;
    }

    /** The map attempts one daemon holds for this read, all written compressed or all not. */
    private record Location(BlockManagerId id, String daemon, Set<Long> attempts, long firstMapId, int firstMapIndex) {}

    @Override
    @SuppressWarnings("unchecked")
    public Iterator<Product2<K, C>> read() {
        ShuffleDependency<K, ?, C> dep = handle.dependency();
        SparkEnv env = SparkEnv.get();
        List<Location> locations = locate(env, dep.shuffleId());
        Records records = new Records(env, dep, locations);
        context.addTaskCompletionListener((org.apache.spark.util.TaskCompletionListener) ctx -> records.close());
        Iterator<Product2<K, Object>> plain = new InterruptibleIterator<>(context, records);
        Iterator<Product2<K, C>> combined;
        if (dep.aggregator().isDefined()) {
            if (dep.mapSideCombine()) {
                combined = (Iterator<Product2<K, C>>) (Iterator<?>) dep.aggregator().get()
                        .combineCombinersByKey((Iterator<Product2<K, C>>) (Iterator<?>) plain, context);
            } else {
                combined = (Iterator<Product2<K, C>>) (Iterator<?>) ((org.apache.spark.Aggregator<K, Object, C>)
                        dep.aggregator().get()).combineValuesByKey(plain, context);
            }
        } else {
            combined = (Iterator<Product2<K, C>>) (Iterator<?>) plain;
        }
        Option<Ordering<K>> ordering = dep.keyOrdering();
        if (ordering.isDefined()) {
            ExternalSorter<K, C, C> sorter = Checksums.sorter(context, Option.empty(), Option.empty(), ordering, dep);
            combined = sorter.insertAllAndUpdateMetrics(combined);
        }
        return combined instanceof InterruptibleIterator ? combined : new InterruptibleIterator<>(context, combined);
    }

    private List<Location> locate(SparkEnv env, int shuffleId) {
        Iterator<Tuple2<BlockManagerId, Seq<Tuple3<BlockId, Object, Object>>>> found =
                env.mapOutputTracker().getMapSizesByExecutorId(shuffleId, startMap, endMap, start, end);
        Map<BlockManagerId, Location> byDaemon = new LinkedHashMap<>();
        while (found.hasNext()) {
            Tuple2<BlockManagerId, Seq<Tuple3<BlockId, Object, Object>>> entry = found.next();
            Iterator<Tuple3<BlockId, Object, Object>> blocks = entry._2().iterator();
            while (blocks.hasNext()) {
                Tuple3<BlockId, Object, Object> block = blocks.next();
                long mapId = mapIdOf(block._1());
                byDaemon.computeIfAbsent(entry._1(), id -> new Location(
                                id, DaemonLocation.daemonOf(id), new LinkedHashSet<>(), mapId, (Integer) block._3()))
                        .attempts()
                        .add(mapId);
            }
        }
        return new ArrayList<>(byDaemon.values());
    }

    private static long mapIdOf(BlockId block) {
        if (block instanceof ShuffleBlockId b) {
            return b.mapId();
        }
        if (block instanceof ShuffleBlockBatchId b) {
            return b.mapId();
        }
        throw new IllegalStateException("shuffled cannot read " + block + " (push-based shuffle must be off)");
    }

    /** The deserialized records of every location, one block after another. */
    private final class Records extends AbstractIterator<Product2<K, Object>> {
        private final SparkEnv env;
        private final ShuffleDependency<K, ?, C> dep;
        private final List<Location> locations;
        private final SerializerInstance serializer;
        private final SerializerManager serializers;
        private final ReadStreams streams;
        /** Whether an attempt's pairs are read as one block (see {@link PairInput}): when Spark's reader would. */
        private final boolean batched;
        private int index = -1;
        private PairInput input;
        private DeserializationStream block;
        private Iterator<Tuple2<Object, Object>> blockRecords;
        private boolean local;
        /** Whether the current location's map outputs went through Spark's codec (see BlockCompression). */
        private boolean compressed;
        private boolean merged;
        private Exception failed;
        private final FetchWait fetchWait = new FetchWait();

        Records(SparkEnv env, ShuffleDependency<K, ?, C> dep, List<Location> locations) {
            this.env = env;
            this.dep = dep;
            this.locations = locations;
            this.serializer = dep.serializer().newInstance();
            this.serializers = env.serializerManager();
            this.streams = new ReadStreams(clients, env.executorId(), context.taskAttemptId(), locations.size(),
                    this::open);
            Counts.READS.incrementAndGet();
            this.batched = SortShuffleManager.canUseBatchFetch(start, end, context)
                    && dep.serializer().supportsRelocationOfSerializedObjects()
                    && ShuffledWriter.Executor.streamsConcatenate(env.conf(), serializers);
        }

        @Override
        public boolean hasNext() {
            if (failed != null) {
                throw sneaky(failed); // asked again after the read failed: the same answer
            }
            try {
                return advance();
            } catch (IOException e) {
                failed = failure(e);
                throw sneaky(failed);
            } catch (RuntimeException e) {
                IOException cause = input != null ? input.failure() : null;
                if (cause == null) {
                    throw e;
                }
                failed = failure(cause); // the stream failed under a serializer that wrapped the error
                throw sneaky(failed);
            }
        }

        @Override
        @SuppressWarnings("unchecked")
        public Product2<K, Object> next() {
            if (!hasNext()) {
                throw new java.util.NoSuchElementException();
            }
            metrics.incRecordsRead(1);
            return (Product2<K, Object>) (Product2<?, ?>) blockRecords.next();
        }

        private boolean advance() throws IOException {
            while (blockRecords == null || !blockRecords.hasNext()) {
                closeBlock();
                if (input == null || !input.nextBlock()) {
                    if (!nextLocation()) {
                        finish();
                        return false;
                    }
                    continue;
                }
                (batched ? Counts.BATCH_BLOCKS : Counts.PAIR_BLOCKS).incrementAndGet();
                if (local) {
                    metrics.incLocalBlocksFetched(1);
                } else {
                    metrics.incRemoteBlocksFetched(1);
                }
                BlockId id = batched
                        ? new ShuffleBlockBatchId(dep.shuffleId(), input.attempt(), input.partition(), end)
                        : new ShuffleBlockId(dep.shuffleId(), input.attempt(), input.partition());
                block = serializer.deserializeStream(BlockCompression.wrap(serializers, id, input, compressed));
                blockRecords = block.asKeyValueIterator();
            }
            return true;
        }

        /** Moves to the next location (see {@link ReadStreams} for how its stream is opened). */
        private boolean nextLocation() throws IOException {
            index++;
            if (index >= locations.size()) {
                return false;
            }
            int at = index;
            input = streams.start(at, batched, (bytes, waitNanos) -> {
                if (isLocal(at)) {
                    metrics.incLocalBytesRead(bytes);
                } else {
                    metrics.incRemoteBytesRead(bytes);
                }
                metrics.incFetchWaitTime(fetchWait.add(waitNanos));
            });
            local = isLocal(at);
            compressed = DaemonLocation.compressed(locations.get(at).id());
            return true;
        }

        /** Whether the location's daemon is the one the task reads through (it may change, see ReadStreams). */
        private boolean isLocal(int location) {
            return locations.get(location).daemon().equals(streams.client().daemonNode());
        }

        private PartitionReader open(ShuffleClient client, int location) throws IOException {
            Location loc = locations.get(location);
            long[] attempts = loc.attempts().stream().mapToLong(Long::longValue).toArray();
            String where = loc.daemon().equals(client.daemonNode()) ? "" : loc.daemon();
            return client.read(
                    env.conf().getAppId(), dep.shuffleId(), start, end, Map.of(where, attempts), floating(client));
        }

        /**
         * Floating buffers per stream: {@code spark.reducer.maxSizeInFlight} (Spark's bound on what one
         * task fetches ahead, 48m by default) shared by the streams a task has open at once, less their
         * exclusive buffers, and at most {@link PartitionReader#FLOATING}. A task's buffered bytes then stay
         * within what Spark's own reader would hold.
         */
        private int floating(ShuffleClient client) {
            long inFlight = env.conf().getSizeAsBytes("spark.reducer.maxSizeInFlight", "48m");
            long streamsAtOnce = 1 + ReadStreams.OPEN_AHEAD;
            long perStream = inFlight / client.segmentSize() / streamsAtOnce - PartitionReader.EXCLUSIVE;
            return (int) Math.max(0, Math.min(PartitionReader.FLOATING, perStream));
        }

        /** At the end: the task's read metrics take this reader's counts (as Spark's own reader does). */
        private void finish() {
            close();
            if (!merged) {
                merged = true;
                context.taskMetrics().mergeShuffleReadMetrics();
            }
        }

        private void closeBlock() {
            if (block != null) {
                block.close();
                block = null;
            }
            blockRecords = null;
        }

        void close() {
            closeBlock();
            streams.close();
            index = locations.size(); // nothing more is opened
        }

        /**
         * What Spark should see for a failed read: a fetch failure if data is lost or its daemon does not
         * answer, else the error itself. The blame goes to the daemon being read, unless the task's own
         * daemon is in doubt: its connection broke, it sent nothing within the timeout (a daemon waiting on
         * a silent peer fails that stream with TIMEOUT after peer-timeout, shorter than the plugin's
         * timeout, so a timeout here means the task's daemon itself), or no daemon could be reached. A
         * healthy remote daemon then keeps its outputs.
         */
        private Exception failure(IOException e) {
            int at = index;
            close();
            boolean timedOut = e instanceof SocketTimeoutException;
            boolean killed = context.isInterrupted() || (e instanceof InterruptedIOException && !timedOut);
            if (killed || (e instanceof ShuffledException s && !s.code().fetchFailure())) {
                return e; // a kill or a bug, not lost data
            }
            BlockManagerId blame;
            long mapId = -1;
            int mapIndex = -1;
            ShuffleClient client = streams.client();
            if (!timedOut && client != null && client.isOpen() && at >= 0 && at < locations.size()) {
                Location loc = locations.get(at);
                blame = loc.id();
                mapId = loc.firstMapId();
                mapIndex = loc.firstMapIndex();
            } else {
                String daemon = client != null
                        ? client.daemonNode()
                        : clients.taskDaemon(env.executorId(), context.taskAttemptId());
                blame = DaemonLocation.of(daemon, env.blockManager().blockManagerId().host());
            }
            return new FetchFailedException(blame, dep.shuffleId(), mapId, mapIndex, start,
                    "shuffled read of partitions [" + start + ", " + end + ") failed: " + e.getMessage(), e);
        }
    }

    /** Throws a checked exception through Scala's iterator methods, as Spark's own readers do. */
    @SuppressWarnings("unchecked")
    private static <E extends Throwable> RuntimeException sneaky(Throwable e) throws E {
        throw (E) e;
    }
}
