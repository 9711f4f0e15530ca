"""Build the JVM client (client/jvm) with the JDK's own tools: no Maven, no Gradle, no network.

Sources in ``client/jvm/src/main/java`` are compiled with ``javac --release 17`` against the jars of
the installed pyspark wheel (``<pyspark>/jars/*``, the Spark the plugin runs in) and packaged with
``jar`` into ``client/jvm/build/shuffled-spark.jar``. The checks in ``client/jvm/src/test/java``
(``VectorCheck``, ``CodecSelfTest``, ``PrintConstants``) are compiled against that jar into a
separate ``shuffled-spark-tests.jar``, so they never ship with the plugin.

Both builds are skipped while their jar is newer than every input (source files and the folders
holding them, so deleted files count too; the test jar also depends on the main jar), unless
``force`` is given. A jar is written under a temporary name and renamed into place, so concurrent
builds and readers never see half a jar.

Run ``python -m shuffled.spark_jar [--force] [--tests]`` to build from the command line.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
JVM_DIR = REPO / "client" / "jvm"
MAIN_SOURCES = JVM_DIR / "src" / "main" / "java"
TEST_SOURCES = JVM_DIR / "src" / "test" / "java"
BUILD_DIR = JVM_DIR / "build"
JAR_NAME = "shuffled-spark.jar"
TEST_JAR_NAME = "shuffled-spark-tests.jar"
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


def classpath(*entries: Path) -> str:
    """A ``-cp`` value: ``entries`` followed by every pyspark jar (``<jars>/*``, expanded by the JVM)."""
    return os.pathsep.join([*(str(e) for e in entries), str(pyspark_jars_dir() / "*")])


def _sources(root: Path) -> list[Path]:
    if not root.is_dir():
        raise JvmBuildError(f"no Java sources at {root} (the JVM client builds from a source checkout)")
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


def _compile_and_package(sources: list[Path], cp: str, jar_path: Path) -> None:
    javac = find_tool("javac")
    jar_tool = find_tool("jar")
    _check_javac(javac)
    jar_path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="shuffled-jvm-classes-") as classes:
        cmd = [javac, *_JAVAC_FLAGS, "-d", classes, "-cp", cp, *(str(s) for s in sources)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=_COMPILE_TIMEOUT)
        if proc.returncode != 0:
            raise JvmBuildError(f"javac failed (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}")
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


def build_jar(out_dir: Path | None = None, force: bool = False) -> Path:
    """Compile ``client/jvm/src/main/java`` and package ``<out_dir>/shuffled-spark.jar``; return its path.

    ``out_dir`` defaults to ``client/jvm/build``. The build is skipped when the jar is newer than every
    source (unless ``force``). Raises :class:`JvmBuildError` if javac/jar are missing (install
    openjdk-17-jdk-headless), pyspark is not installed, or compilation fails.
    """
    jar_path = (out_dir if out_dir is not None else BUILD_DIR) / JAR_NAME
    sources = _sources(MAIN_SOURCES)
    if not force and _up_to_date(jar_path, _inputs(MAIN_SOURCES)):
        return jar_path
    _compile_and_package(sources, classpath(), jar_path)
    return jar_path


def build_test_classes(out_dir: Path | None = None, force: bool = False) -> Path:
    """Compile ``client/jvm/src/test/java`` against the main jar; return ``<out_dir>/shuffled-spark-tests.jar``.

    The test classes are packaged as a jar of their own (not a classes folder, so a rebuild replaces them
    atomically, and not inside the plugin jar, which Spark loads). Run them with
    ``java -cp <main jar>:<test jar>:<pyspark jars>/* io.shuffled.client.wire.VectorCheck
    proto/vectors/frames.json`` (see :func:`classpath`); they need Jackson, which pyspark ships.
    The main jar is built first if it is stale; ``force`` rebuilds the test jar only.
    """
    main_jar = build_jar(out_dir)
    jar_path = main_jar.parent / TEST_JAR_NAME
    sources = _sources(TEST_SOURCES)
    if not force and _up_to_date(jar_path, [main_jar, *_inputs(TEST_SOURCES)]):
        return jar_path
    _compile_and_package(sources, classpath(main_jar), jar_path)
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
    if daemon_choice != "executor":
        conf["spark.shuffled.daemonChoice"] = daemon_choice
    return conf


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shuffled.spark_jar", description="Build the JVM client jar.")
    parser.add_argument("--out-dir", type=Path, default=None, help=f"where the jars go (default {BUILD_DIR})")
    parser.add_argument("--force", action="store_true", help="rebuild even if the jars are up to date")
    parser.add_argument("--tests", action="store_true", help="also build the test jar (VectorCheck and friends)")
    args = parser.parse_args(argv)
    try:
        print(build_jar(args.out_dir, force=args.force))
        if args.tests:
            print(build_test_classes(args.out_dir, force=args.force))
    except JvmBuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
