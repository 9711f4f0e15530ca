"""Build the JVM client (client/jvm) with the JDK's own tools: no Maven, no Gradle, no network.

Sources in ``client/jvm/src/main/java`` are compiled with ``javac --release 17`` against the jars of a
Spark (by default the installed pyspark wheel's ``<pyspark>/jars``; or ``--spark-home DIR``, a Spark
distribution, whose ``jars/`` are used), together with the version layer of that Spark's line
(``client/jvm/src/compat/<part>/java``: what differs between Spark 3.5, 4.0, 4.1, 4.2 and 4.3, see
`LINES`), and packaged with ``jar`` into ``client/jvm/build/shuffled-spark-<line>_<scala>.jar``, with
the line written into the jar (the plugin refuses to start in another Spark). The checks in
``client/jvm/src/test/java`` (``VectorCheck``, ``CodecSelfTest``, ``PluginCheck``, ...) are compiled
against that jar into a separate ``shuffled-spark-tests-<line>_<scala>.jar``, so they never ship with
the plugin.

Both builds are skipped while their jar is newer than every input (source files and the folders
holding them, so deleted files count too; the test jar also depends on the main jar), unless
``force`` is given. A jar is written under a temporary name and renamed into place, so concurrent
builds and readers never see half a jar.

Run ``python -m shuffled.spark_jar [--force] [--tests]`` to build from the command line.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from . import __version__

#: the Java sources: client/jvm/src in a source checkout (shuffled/jvm links there), package data once
#: installed from a wheel
JVM_SOURCES = Path(__file__).resolve().parent / "jvm"
MAIN_SOURCES = JVM_SOURCES / "main" / "java"
TEST_SOURCES = JVM_SOURCES / "test" / "java"
COMPAT_SOURCES = JVM_SOURCES / "compat"


def _build_dir() -> Path:
    """client/jvm/build in a source checkout; else the user's cache (site-packages may not be writable)."""
    if JVM_SOURCES.is_symlink():
        return JVM_SOURCES.resolve().parent / "build"
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "shuffled" / "jars"


BUILD_DIR = _build_dir()
#: the version layer each supported Spark line compiles with: one folder per difference
LINES: dict[str, tuple[str, ...]] = {
    "3.5": ("checksums-none",),
    "4.0": ("checksums-none",),
    "4.1": ("checksums-rows",),  # row-based shuffle checksums
    "4.2": ("checksums-rows",),
    "4.3": ("checksums-rows",),
}
#: where the build writes the Spark line (and the sources' digest) into the jar; SparkLine.java reads it
LINE_RESOURCE = "io/shuffled/spark/line.properties"


def has_row_checksums(line: str) -> bool:
    """Whether the plugin for this Spark line feeds Spark 4.1's row-based shuffle checksums."""
    return "checksums-rows" in LINES[line]


#: Lines that create the shuffle manager before the user's jars (spark.jars) are loaded: Spark 3.5 creates
#: it with the SparkEnv, Spark 4 only once spark.jars are on the class path (SPARK-45762). There the jar
#: must also be on the driver's and the executors' own class path (extraClassPath, a path on every host).
CLASS_PATH_LINES = frozenset({"3.5"})
JAVA_RELEASE = 17
JDK_HINT = "install openjdk-17-jdk-headless (or point JAVA_HOME at a JDK 17 or newer)"

#: -proc:none: log4j-core on the pyspark classpath registers an annotation processor; we want none.
#: -Xlint:-path: some pyspark jars name missing jars in their manifest Class-Path.
_JAVAC_FLAGS = ("--release", str(JAVA_RELEASE), "-proc:none", "-encoding", "UTF-8", "-Xlint:all,-path", "-Werror")
_COMPILE_TIMEOUT = 300


class JvmBuildError(RuntimeError):
    """The JVM client cannot be built (no JDK, no pyspark, compile errors)."""


def find_tool(name: str) -> str:
    """Path of a JDK tool (``javac``, ``jar``, ``java``): ``$JAVA_HOME/bin`` first, then ``PATH``."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = Path(java_home) / "bin" / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which(name)
    if found is None:
        raise JvmBuildError(f"`{name}` not found: {JDK_HINT}")
    return found


@dataclass(frozen=True)
class Spark:
    """A Spark to compile against: its jars, its version and its Scala binary version."""

    jars: Path
    version: str
    scala: str

    @property
    def line(self) -> str:
        return ".".join(self.version.split(".")[:2])

    @property
    def tag(self) -> str:
        return f"{self.line}_{self.scala}"


_SPARK_CORE = re.compile(r"spark-core_(\d+\.\d+)-(\d+\.\d+\.\d+[^/]*)\.jar")


def find_spark(spark_home: Path | None = None) -> Spark:
    """The Spark at ``spark_home`` (a distribution: its ``jars/``), else the installed pyspark's; refused
    with the supported lines if it is none of them."""
    if spark_home is None:
        jars = pyspark_jars_dir()
    else:
        jars = spark_home / "jars"
        if not jars.is_dir():
            raise JvmBuildError(f"{spark_home} is not a Spark distribution: it has no jars/ directory")
    found = [m for m in (_SPARK_CORE.fullmatch(p.name) for p in jars.glob("spark-core_*.jar")) if m]
    if len(found) != 1:
        raise JvmBuildError(f"cannot tell the Spark version of {jars}: expected one spark-core_<scala>-<version>.jar")
    spark = Spark(jars, found[0].group(2), found[0].group(1))
    if spark.line not in LINES:
        raise JvmBuildError(f"Spark {spark.version} is not supported; the plugin builds for Spark {', '.join(LINES)}")
    return spark


def jar_name(spark: Spark) -> str:
    return f"shuffled-spark-{spark.tag}.jar"


_JAR_LINE = re.compile(r"shuffled-spark-(\d+\.\d+)_\d+\.\d+\.jar")


def pyspark_jars_dir() -> Path:
    """The jars of the installed pyspark wheel, which the JVM client compiles and runs against."""
    try:
        import pyspark
    except ImportError as exc:
        raise JvmBuildError(
            "pyspark is not installed (pip install 'shuffled[spark]'); the JVM client compiles against its jars"
        ) from exc
    jars = Path(pyspark.__file__).resolve().parent / "jars"
    if not jars.is_dir():
        raise JvmBuildError(f"pyspark has no jars directory at {jars}")
    return jars


def classpath(*entries: Path, spark: Spark | None = None) -> str:
    """A ``-cp`` value: ``entries`` followed by every jar of the Spark (``<jars>/*``, expanded by the JVM)."""
    jars = spark.jars if spark is not None else pyspark_jars_dir()
    return os.pathsep.join([*(str(e) for e in entries), str(jars / "*")])


def _sources(root: Path) -> list[Path]:
    if not root.is_dir():
        raise JvmBuildError(f"no Java sources at {root}: this installation of shuffled lacks its JVM sources")
    sources = sorted(root.rglob("*.java"))
    if not sources:
        raise JvmBuildError(f"no .java files under {root}")
    return sources


def _newest_mtime(paths: Iterable[Path]) -> int:
    return max(p.stat().st_mtime_ns for p in paths)


def _inputs(root: Path) -> list[Path]:
    """Every source file and every folder under ``root`` (a folder's mtime changes when a file goes)."""
    return [root, *root.rglob("*")]


def _up_to_date(target: Path, inputs: list[Path]) -> bool:
    return target.is_file() and target.stat().st_mtime_ns > _newest_mtime(inputs)


def _check_javac(javac: str) -> None:
    proc = subprocess.run([javac, "-version"], capture_output=True, text=True, timeout=60)
    text = (proc.stdout + proc.stderr).strip()
    match = re.search(r"javac (\d+)(?:\.(\d+))?", text)
    if match is None:
        raise JvmBuildError(f"cannot tell the version of {javac} ({text!r}): {JDK_HINT}")
    major = int(match.group(1))
    if major == 1 and match.group(2):  # "javac 1.8.0_x"
        major = int(match.group(2))
    if major < JAVA_RELEASE:
        raise JvmBuildError(f"{javac} is JDK {major}; Java {JAVA_RELEASE} is needed: {JDK_HINT}")


def _compile_and_package(sources: list[Path], cp: str, jar_path: Path, resources: dict[str, str] | None = None) -> None:
    javac = find_tool("javac")
    jar_tool = find_tool("jar")
    _check_javac(javac)
    jar_path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="shuffled-jvm-classes-") as classes:
        cmd = [javac, *_JAVAC_FLAGS, "-d", classes, "-cp", cp, *(str(s) for s in sources)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=_COMPILE_TIMEOUT)
        if proc.returncode != 0:
            raise JvmBuildError(f"javac failed (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}")
        for name, text in (resources or {}).items():
            target = Path(classes) / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{jar_path.name}.", suffix=".tmp", dir=jar_path.parent)
        os.close(fd)
        tmp = Path(tmp_name)
        try:
            tmp.unlink()  # `jar --create` wants to create the file itself
            proc = subprocess.run(
                [jar_tool, "--create", "--file", str(tmp), "-C", classes, "."],
                capture_output=True,
                text=True,
                timeout=_COMPILE_TIMEOUT,
            )
            if proc.returncode != 0:
                raise JvmBuildError(f"jar failed (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}")
            os.replace(tmp, jar_path)
        finally:
            tmp.unlink(missing_ok=True)


def _main_inputs(spark: Spark) -> list[Path]:
    return [MAIN_SOURCES, *(COMPAT_SOURCES / part / "java" for part in LINES[spark.line])]


def build_jar(out_dir: Path | None = None, force: bool = False, spark_home: Path | None = None) -> Path:
    """Compile the plugin for a Spark (``spark_home``, else the installed pyspark) and package
    ``<out_dir>/shuffled-spark-<line>_<scala>.jar``; return its path.

    ``out_dir`` defaults to ``client/jvm/build``. The build is skipped when the jar is newer than every
    source and was built from these very sources (unless ``force``). Raises :class:`JvmBuildError` if
    javac/jar are missing (install openjdk-17-jdk-headless), there is no Spark or it is of an unsupported
    line, or compilation fails.
    """
    spark = find_spark(spark_home)
    jar_path = (out_dir if out_dir is not None else BUILD_DIR) / jar_name(spark)
    roots = _main_inputs(spark)
    inputs = [p for root in roots for p in _inputs(root)]
    sources = [src for root in roots for src in _sources(root)]
    digest = _digest(spark, sources)
    if not force and _up_to_date(jar_path, inputs) and _built_from(jar_path) == digest:
        return jar_path
    line = f"spark.line={spark.line}\nscala.binary={spark.scala}\nbuilt.against={spark.version}\nsources={digest}\n"
    _compile_and_package(sources, classpath(spark=spark), jar_path, {LINE_RESOURCE: line})
    return jar_path


def _digest(spark: Spark, sources: list[Path]) -> str:
    """What a plugin jar is built from: every source's path and bytes, the Spark and this package's version.

    Jars of installed packages share the user's cache across environments and versions of shuffled, so a jar
    newer than the sources may still be another installation's: it is reused only if built from these.
    """
    h = hashlib.sha256(f"{__version__} {spark.version} {spark.scala}".encode())
    for src in sources:
        h.update(str(src.relative_to(JVM_SOURCES)).encode() + b"\0" + src.read_bytes())
    return h.hexdigest()


def _built_from(jar: Path) -> str | None:
    """The source digest written into ``jar`` (None: no jar, or not one of ours)."""
    try:
        with zipfile.ZipFile(jar) as z:
            text = z.read(LINE_RESOURCE).decode()
    except (OSError, KeyError, zipfile.BadZipFile):
        return None
    found = re.search(r"^sources=(\w+)$", text, re.MULTILINE)
    return found.group(1) if found else None


def build_test_classes(out_dir: Path | None = None, force: bool = False, spark_home: Path | None = None) -> Path:
    """Compile ``client/jvm/src/test/java`` against the main jar; return
    ``<out_dir>/shuffled-spark-tests-<line>_<scala>.jar``.

    The test classes are packaged as a jar of their own (not a classes folder, so a rebuild replaces them
    atomically, and not inside the plugin jar, which Spark loads). Run them with
    ``java -cp <main jar>:<test jar>:<pyspark jars>/* io.shuffled.client.wire.VectorCheck
    proto/vectors/frames.json`` (see :func:`classpath`); they need Jackson, which pyspark ships.
    The main jar is built first if it is stale; ``force`` rebuilds the test jar only.
    """
    spark = find_spark(spark_home)
    main_jar = build_jar(out_dir, spark_home=spark_home)
    jar_path = main_jar.parent / f"shuffled-spark-tests-{spark.tag}.jar"
    sources = _sources(TEST_SOURCES)
    if not force and _up_to_date(jar_path, [main_jar, *_inputs(TEST_SOURCES)]):
        return jar_path
    _compile_and_package(sources, classpath(main_jar, spark=spark), jar_path)
    return jar_path


#: What switches Spark to shuffled: the shuffle manager (map and reduce side) and the ShuffleDataIO plugin
#: whose driver components free daemon data and tell Spark that map output outlives executors.
PLUGIN_CLASSES = {
    "spark.shuffle.manager": "io.shuffled.spark.ShuffledShuffleManager",
    "spark.shuffle.sort.io.plugin.class": "io.shuffled.spark.ShuffledDataIO",
}


def spark_conf(jar: Path, addresses: list[str], daemon_choice: str = "executor") -> dict[str, str]:
    """The Spark settings that run a job through shuffled (README "Spark" explains each one).

    ``addresses`` are the daemons an executor may use (normally one: its host's daemon, as
    ``host:port`` or ``unix:/path``); ``daemon_choice`` ``task`` spreads one JVM's tasks over them (tests).
    """
    conf = {
        "spark.jars": str(jar),
        **PLUGIN_CLASSES,
        "spark.shuffled.address": ",".join(addresses),
    }
    built_for = _JAR_LINE.fullmatch(jar.name)
    if built_for is not None and built_for.group(1) in CLASS_PATH_LINES:
        conf["spark.driver.extraClassPath"] = conf["spark.executor.extraClassPath"] = str(jar)
    if daemon_choice != "executor":
        conf["spark.shuffled.daemonChoice"] = daemon_choice
    return conf


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shuffled.spark_jar", description="Build the JVM client jar.")
    parser.add_argument("--out-dir", type=Path, default=None, help=f"where the jars go (default {BUILD_DIR})")
    parser.add_argument("--force", action="store_true", help="rebuild even if the jars are up to date")
    parser.add_argument("--tests", action="store_true", help="also build the test jar (VectorCheck and friends)")
    parser.add_argument("--spark-home", type=Path, default=None, help="a Spark distribution to build for")
    args = parser.parse_args(argv)
    try:
        print(build_jar(args.out_dir, force=args.force, spark_home=args.spark_home))
        if args.tests:
            print(build_test_classes(args.out_dir, force=args.force, spark_home=args.spark_home))
    except JvmBuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
