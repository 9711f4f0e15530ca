package io.shuffled.spark.compat;

import org.apache.spark.shuffle.BlockingShuffleManager;

/**
 * Spark 4.3 splits shuffle managers into blocking ones, whose map output is complete before reducers
 * read it and which name a block resolver, and pipelined ones; shuffled's map output is complete at
 * commit, so it is a blocking one.
 */
public interface LineShuffleManager extends BlockingShuffleManager {}
