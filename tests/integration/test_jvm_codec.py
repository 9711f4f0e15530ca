"""The JVM wire codec (client/jvm) against the golden vectors, its own checks and the Python constants.

Builds the plugin jar and the test jar with shuffled.spark_jar (javac --release 17 against the pyspark
jars), then runs the Java check programs. Skipped only when no JDK is installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import pytest

from shuffled import spark_jar
from shuffled.protocol import frames as F
from shuffled.protocol.errors import ErrorCode
from tests.jvm import SUMMARY, needs_jdk

ROOT = Path(__file__).parents[2]
VECTORS_FILE = ROOT / "proto" / "vectors" / "frames.json"
CONVERSATIONS_FILE = ROOT / "proto" / "vectors" / "conversations.json"
#: a check takes seconds alone; a 2-core machine busy with Spark sessions has made one take over a minute
JAVA_TIMEOUT = 240


@pytest.fixture(scope="module")
def jars() -> tuple[Path, Path]:
    """(plugin jar, test jar), built unless up to date."""
    return spark_jar.build_jar(), spark_jar.build_test_classes()


def _run(main_class: str, jars: tuple[Path, Path], *args: str) -> subprocess.CompletedProcess[str]:
    qualified = main_class if "." in main_class else f"io.shuffled.client.wire.{main_class}"
    cmd = [spark_jar.find_tool("java"), "-cp", spark_jar.classpath(*jars), qualified]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=JAVA_TIMEOUT, cwd=ROOT)


def _summary(proc: subprocess.CompletedProcess[str]) -> tuple[int, int]:
    lines = proc.stdout.strip().splitlines()
    assert lines, f"no output; stderr:\n{proc.stderr}"
    m = SUMMARY.fullmatch(lines[-1])
    assert m, f"last line is not a summary: {lines[-1]!r}"
    return int(m.group(1)), int(m.group(2))


def _failures(proc: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in proc.stdout.splitlines() if line.startswith("FAIL")] + proc.stderr.splitlines()


def _vectors() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(VECTORS_FILE.read_text(encoding="utf-8"))
    return data


def _entry_names(data: dict[str, Any]) -> list[str]:
    return [e["name"] for key in ("vectors", "decode_only", "invalid") for e in data[key]]


@needs_jdk
def test_vector_check_passes_every_entry(jars: tuple[Path, Path]) -> None:
    names = _entry_names(_vectors())
    proc = _run("VectorCheck", jars, str(VECTORS_FILE))
    assert proc.returncode == 0, _failures(proc)
    assert _summary(proc) == (len(names), 0)
    passed = {line[5:] for line in proc.stdout.splitlines() if line.startswith("ok   ")}
    assert set(names) <= passed


@needs_jdk
def test_vector_check_reports_a_wrong_vector(jars: tuple[Path, Path], tmp_path: Path) -> None:
    """The check is live: a vector whose bytes or expected code are wrong fails, with a non-zero exit."""
    data = _vectors()
    add_credit = next(v for v in data["vectors"] if v["frame"]["type"] == "ADD_CREDIT")
    add_credit["frame"]["credit"] += 1
    version = next(v for v in data["invalid"] if v["code"] == ErrorCode.UNSUPPORTED_VERSION)
    version["code"] = int(ErrorCode.PROTOCOL)
    bad = tmp_path / "frames.json"
    bad.write_text(json.dumps(data), encoding="utf-8")
    proc = _run("VectorCheck", jars, str(bad))
    assert proc.returncode != 0
    # The AddCredit bytes also appear in the file-wide back-to-back check, which fails too.
    assert _summary(proc) == (len(_entry_names(data)) - 2, 3), proc.stdout
    failed = [line for line in proc.stdout.splitlines() if line.startswith("FAIL")]
    assert any(add_credit["name"] in line for line in failed)
    assert any(version["name"] in line for line in failed)


@needs_jdk
def test_vector_check_holds_the_jvm_to_the_replicas_key(jars: tuple[Path, Path], tmp_path: Path) -> None:
    """`spark.shuffled.replicas` reaches the wire as the OpenMapOutput vectors say, byte for byte (§7.8, §16)."""
    data = _vectors()
    asking = [v for v in data["vectors"] if v["frame"]["type"] == "OPEN_MAP_OUTPUT" and "replicas" in v["frame"]]
    assert asking, "frames.json has an OpenMapOutput with replicas"
    for v in asking:
        v["frame"]["replicas"] = 5 - v["frame"]["replicas"]
    bad = tmp_path / "frames.json"
    bad.write_text(json.dumps(data), encoding="utf-8")
    proc = _run("VectorCheck", jars, str(bad))
    failed = [line for line in proc.stdout.splitlines() if line.startswith("FAIL ")]
    assert {line.split(":")[0][5:] for line in failed if "[file]" not in line} == {v["name"] for v in asking}


@needs_jdk
def test_the_jvm_client_replays_the_recorded_conversations(jars: tuple[Path, Path]) -> None:
    """Every conversation through the JVM codec and authentication; those a client dials (the handshakes,
    admin calls, a committed push) through a real ShuffleClient, which must send the recorded bytes."""
    conversations = json.loads(CONVERSATIONS_FILE.read_text(encoding="utf-8"))["conversations"]
    proc = _run("io.shuffled.client.ConversationCheck", jars, str(CONVERSATIONS_FILE))
    assert proc.returncode == 0, _failures(proc)
    passed = {line[5:] for line in proc.stdout.splitlines() if line.startswith("ok   ")}
    assert {f"{c['name']} [codec]" for c in conversations} <= passed
    clients = {"handshake-plain", "handshake-secret", "handshake-wrong-secret", "admin-calls", "push-committed"}
    assert {f"{name} [client]" for name in clients} <= passed
    assert _summary(proc) == (len(conversations) + len(clients), 0)


@needs_jdk
def test_the_conversation_check_fails_a_client_that_says_something_else(
    jars: tuple[Path, Path], tmp_path: Path
) -> None:
    data = json.loads(CONVERSATIONS_FILE.read_text(encoding="utf-8"))
    by_name = {c["name"]: c for c in data["conversations"]}
    push = next(s for s in by_name["push-committed"]["steps"] if "PushDataArrived(1)" in s["events"])
    push["hex"] = push["hex"][:-2] + ("00" if push["hex"][-2:] != "00" else "01")  # the commit's push count
    bad = tmp_path / "conversations.json"
    bad.write_text(json.dumps(data), encoding="utf-8")
    proc = _run("io.shuffled.client.ConversationCheck", jars, str(bad))
    assert proc.returncode != 0
    failed = [line for line in proc.stdout.splitlines() if line.startswith("FAIL")]
    assert failed == ["FAIL push-committed [client]" + failed[0].split("[client]", 1)[1]], failed


@needs_jdk
def test_codec_self_test(jars: tuple[Path, Path]) -> None:
    proc = _run("CodecSelfTest", jars)
    assert proc.returncode == 0, _failures(proc)
    passed, failed = _summary(proc)
    assert failed == 0 and passed > 0


@needs_jdk
def test_packing_reads_back_whatever_the_split(jars: tuple[Path, Path]) -> None:
    """PackingCheck: the writer's one buffer packs any writes into groups that read back byte-exact per partition
    (every buffer size, segment size and width), full groups, one ascending sequence for writes in partition
    order; malformed payloads refused with PROTOCOL; and the `packed` golden vectors a client checks (the push
    payloads it must pack byte for byte, the read payloads it must unpack or refuse)."""
    packed = _vectors()["packed"]
    names = [v["name"] for v in packed["valid"]]
    names += [v["name"] for v in packed["invalid"] if v["detected_by"] == "reader"]
    proc = _run("io.shuffled.client.PackingCheck", jars, str(VECTORS_FILE))
    assert proc.returncode == 0, _failures(proc)
    passed = {line[5:] for line in proc.stdout.splitlines() if line.startswith("ok   ")}
    assert {f"packed: {name}" for name in names} <= passed
    assert _summary(proc) == (9 + len(names), 0)


@needs_jdk
def test_push_and_read_streams_against_a_scripted_daemon(jars: tuple[Path, Path]) -> None:
    """StreamsCheck: PushData framing and commit counts, one chunk per run with credit per buffer, the reads a
    malformed or corrupt buffer fails (a scripted daemon sends them; a real one never does), and a writer whose
    push timed out refusing to go on."""
    proc = _run("io.shuffled.client.StreamsCheck", jars)
    assert proc.returncode == 0, _failures(proc)
    assert _summary(proc) == (6, 0)


@needs_jdk
def test_constants_match_the_python_codec(jars: tuple[Path, Path]) -> None:
    proc = _run("PrintConstants", jars)
    assert proc.returncode == 0, proc.stderr
    got: dict[str, dict[str, int]] = {}
    for line in proc.stdout.splitlines():
        kind, name, value = line.split()
        got.setdefault(kind, {})[name] = int(value)
    assert got["error"] == {c.name: c.value for c in ErrorCode}
    assert got["frame"] == {t.name: t.value for t in F.FrameType}
    assert got["role"] == {r.name: r.value for r in F.Role}
    assert got["kind"] == {k.name: k.value for k in F.BufferKind}
    assert got["const"] == {
        "VERSION": F.VERSION,
        "HEADER_SIZE": F.HEADER_SIZE,
        "HELLO_FIXED": F.HELLO_FIXED.size,
        "BUFFER_RESPONSE_FIXED": F.BUFFER_RESPONSE_FIXED.size,
        "PUSH_DATA_FIXED": F.PUSH_DATA_FIXED.size,
        "MAX_CONTROL_BODY": F.MAX_CONTROL_BODY,
        "DEFAULT_MAX_PAYLOAD": F.DEFAULT_MAX_PAYLOAD,
        "MAX_STREAMS_PER_CONNECTION": F.MAX_STREAMS_PER_CONNECTION,
        "MAX_REPLICAS": F.MAX_REPLICAS,
        "MAGIC": int.from_bytes(F.MAGIC, "big"),
    }


@needs_jdk
def test_build_skips_up_to_date_jars_and_rebuilds_stale_or_forced(tmp_path: Path) -> None:
    jar = spark_jar.build_jar(tmp_path)
    spark = spark_jar.find_spark()
    assert jar == tmp_path / f"shuffled-spark-{spark.line}_{spark.scala}.jar"
    with zipfile.ZipFile(jar) as z:
        names = set(z.namelist())
        line = z.read(spark_jar.LINE_RESOURCE).decode()
    assert {"io/shuffled/client/wire/FrameDecoder.class", "io/shuffled/client/wire/MsgPack$Reader.class"} <= names
    assert "io/shuffled/spark/compat/Checksums.class" in names
    assert f"spark.line={spark.line}\nscala.binary={spark.scala}\n" in line
    assert not any("VectorCheck" in n for n in names), "test classes must not ship in the plugin jar"
    assert [p.name for p in tmp_path.iterdir()] == [jar.name], "temporary files left behind"

    built = jar.stat().st_mtime_ns
    assert spark_jar.build_jar(tmp_path) == jar
    assert jar.stat().st_mtime_ns == built, "an up-to-date jar was rebuilt"

    os.utime(jar, ns=(0, 0))  # older than the sources: stale
    spark_jar.build_jar(tmp_path)
    rebuilt = jar.stat().st_mtime_ns
    assert rebuilt > built

    spark_jar.build_jar(tmp_path, force=True)
    assert jar.stat().st_mtime_ns > rebuilt

    # Another installation's jar in the shared cache: newer than these sources, built from others.
    with zipfile.ZipFile(jar, "w") as z:
        z.writestr(spark_jar.LINE_RESOURCE, line.replace("sources=", "sources=0"))
    assert spark_jar.build_jar(tmp_path) == jar
    with zipfile.ZipFile(jar) as z:  # rebuilt: the plugin's classes are back
        assert "io/shuffled/client/wire/FrameDecoder.class" in z.namelist()


def test_missing_jdk_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(spark_jar.JvmBuildError, match="openjdk-17-jdk-headless"):
        spark_jar.build_jar(tmp_path, force=True)
