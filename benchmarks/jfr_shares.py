"""Where a Spark session's JVM spends its CPU, from a Java Flight Recorder file of it: the share of the
built-in shuffle's own work, and so about the best a shuffle that cost nothing could do against it.

`shapes` asks for a session at most 0.8 of the built-in shuffle's time. On one host the session is bound by
the JVM's CPU (both cores busy), so a shuffle can save at most about what the built-in one costs the JVM.
The recording says roughly what that is: each execution sample is put under the map side's writer (the
part of its stack inside the writer's `write` is the writer's own work, unless it reads a shuffle or pulls
rows and partition ids from the query, which every shuffle does), the reduce side's fetch and
deserialization, or the rest of the query.

An estimate, not a bound: the samples are of threads running Java code, a fraction of the JVM's CPU (`cpu`
says how much: the JIT compiler's threads, the collector and native code such as LZ4's are not in them),
and a session also has stretches where one core waits for the last task of a stage.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections import Counter
from pathlib import Path

#: the built-in shuffle's writers (sort, serialized sort, bypass merge): a sample under one is map output
WRITERS = ("UnsafeShuffleWriter.write", "BypassMergeSortShuffleWriter.write", "SortShuffleWriter.write")
#: inside a writer, frames of the query itself: rows pulled through it and their partition ids
UPSTREAM = ("GeneratedClass", "BufferedRowIterator", "WholeStageCodegen", "prepareShuffleDependency")
#: the reduce side: fetching, decompressing and deserializing shuffle blocks (a stage may read one shuffle
#: and write the next, so these count first)
READER = (
    "ShuffleBlockFetcherIterator",
    "BlockStoreShuffleReader",
    "UnsafeRowSerializerInstance$$anon$2",
    "LZ4BlockInputStream",
    "BufferReleasingInputStream",
)
OWN_WRITE, UPSTREAM_ROWS, READ, OTHER = "the writer's own", "rows pulled through the writer", "read", "other"
#: the JVM option a recording needs for whole stacks (the default keeps 64 frames, cutting off the writer)
STACK_DEPTH_OPTION = "-XX:FlightRecorderOptions=stackdepth=512"
#: seconds between execution samples of a thread in the JDK's "profile" settings
SAMPLE_PERIOD = 0.010


def _jfr_tool() -> str:
    """The `jfr` of the JDK whose `java` Spark runs (JAVA_HOME's, else the one on the PATH)."""
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if java is None:
        raise RuntimeError("no java on the PATH and no JAVA_HOME: cannot read a flight recording")
    return os.path.join(os.path.dirname(os.path.realpath(java)), "jfr")


def _part(frames: list[str]) -> str:
    """Which part a sample's stack (the innermost frame first) belongs to."""
    writer = next((i for i, name in enumerate(frames) if name.endswith(WRITERS)), len(frames))
    inner = frames[:writer]
    if any(part in name for name in inner for part in READER):
        return READ
    if writer == len(frames):
        return OTHER
    return UPSTREAM_ROWS if any(part in name for name in inner for part in UPSTREAM) else OWN_WRITE


def shares(recording: Path) -> dict[str, float]:
    """Each part's share of the recording's execution samples (OWN_WRITE, UPSTREAM_ROWS, READ, OTHER);
    "samples", how many there were, and "cpu", the JVM's CPU seconds they are taken from."""
    printer = subprocess.Popen(
        [_jfr_tool(), "print", "--stack-depth", "1024", "--events", "jdk.ExecutionSample,jdk.CPULoad", str(recording)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert printer.stdout is not None
    counts: Counter[str] = Counter()
    frames: list[str] | None = None
    load = 0.0  # the JVM's share of the machine, summed over the once-a-second CPULoad events
    for line in printer.stdout:
        text = line.strip()
        if text == "stackTrace = [":
            frames = []
        elif frames is not None and text == "]":
            counts[_part(frames)] += 1
            frames = None
        elif frames is not None:
            frames.append(text.split("(", 1)[0])  # "package.Class.method(arguments) line: n"
        elif text.startswith(("jvmUser = ", "jvmSystem = ")):
            load += float(text.split("= ", 1)[1].rstrip("%").replace(",", ".")) / 100
    if printer.wait():
        raise RuntimeError(f"jfr could not print {recording} (exit {printer.returncode})")
    total = sum(counts.values())
    if not total:
        raise RuntimeError(f"{recording} holds no execution samples")
    out = {part: counts[part] / total for part in (OWN_WRITE, UPSTREAM_ROWS, READ, OTHER)}
    out["samples"] = float(total)
    out["cpu"] = load * (os.cpu_count() or 1)
    return out
