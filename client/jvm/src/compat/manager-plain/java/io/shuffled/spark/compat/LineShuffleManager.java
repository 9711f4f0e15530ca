package io.shuffled.spark.compat;

import org.apache.spark.shuffle.ShuffleManager;

/** Up to Spark 4.2 a shuffle manager declares its block resolver itself ({@code manager-blocking}: 4.3 on). */
public interface LineShuffleManager extends ShuffleManager {}
