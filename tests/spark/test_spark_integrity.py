"""A Spark job with authentication on, whose stored shuffle data is spilled and then corrupted between two
jobs (a byte of every piece in the shuffle's data file): the reduce tasks get CORRUPT_DATA, Spark treats it
as a fetch failure, reruns the map stage, and the result is still exact (never wrong rows)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shuffled.server.storage.disk import DATA, JOURNAL, LoadedAttempt, decode_records
from shuffled_client import Client
from tests import spark_jobs
from tests.cluster import DaemonProcess, free_port, secret_flags, start_daemon
from tests.spark_support import needs_spark, plugin_conf, stage_data

pytestmark = [needs_spark, pytest.mark.timeout(600)]

SECRET = "spark-integrity-cluster-secret"
APP_SECRET = "spark-integrity-app-secret"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("spark-integrity")


@pytest.fixture(scope="module")
def daemon(data_dir: Path) -> Iterator[DaemonProcess]:
    flags = ["--data-dir", str(data_dir / "data"), *secret_flags(data_dir, SECRET)]
    d = start_daemon("127.0.0.1", free_port(["127.0.0.1"]), "128M", flags)
    yield d
    d.stop()


def spilled_pieces(journal: Path) -> list[tuple[int, int]]:
    """(offset, length) in the shuffle's data file of every piece its journal records (shuffled/server/storage/
    disk.py: one record per spill write, its pieces back to back from the record's offset)."""
    records, _ = decode_records(journal.read_bytes())
    found: list[tuple[int, int]] = []
    for record in records:
        if record.get("k") == "pieces":
            at = int(record["o"])
            for _attempt, _serial, rows in record["a"]:
                written = LoadedAttempt(0, 0, 0)
                at = written.add(at, bytes(rows))
                found += zip(written.offsets, written.sizes, strict=True)
    return found


def test_corrupted_shuffle_data_is_recomputed_not_read(
    builtin: dict[str, Any], plugin_jar: Path, daemon: DaemonProcess, data_dir: Path
) -> None:
    conf = {
        **plugin_conf(plugin_jar, [daemon], "executor"),
        "spark.shuffled.secret": SECRET,
        "spark.shuffled.appSecret": APP_SECRET,
    }
    spark = spark_jobs.session("local[2,4]", conf)
    try:
        data = spark.sparkContext.parallelize([(i % 53, i) for i in range(20_000)], 4)
        summed = data.reduceByKey(lambda a, b: a + b)
        assert sorted(summed.collect()) == builtin["rdd_reduce_by_key"]
        app = spark.sparkContext.applicationId
        with Client(daemon.addr, secret=SECRET, app_secret=APP_SECRET, timeout=30) as client:
            assert client.flush(app)["flushed_bytes"] > 0  # the map output now lives in spill files
        journals = sorted((data_dir / "data").rglob(JOURNAL))
        assert journals
        for journal in journals:  # one flipped byte in every spilled piece: its last, a byte of its last run
            spill = journal.parent / DATA
            blob = bytearray(spill.read_bytes())
            pieces = spilled_pieces(journal)
            assert pieces and sum(length for _, length in pieces) == len(blob)
            for offset, length in pieces:
                blob[offset + length - 1] ^= 0x01
            spill.write_bytes(bytes(blob))
        attempts_before = {(s.stageId(), s.attemptId()) for s in stage_data(spark)}
        assert sorted(summed.collect()) == builtin["rdd_reduce_by_key"]
        retried = [s for s in stage_data(spark) if (s.stageId(), s.attemptId()) not in attempts_before]
        assert any(s.attemptId() > 0 for s in retried), "no stage was resubmitted after CORRUPT_DATA"
        assert any("CRC32C" in line for line in daemon.log) or any("CORRUPT" in line for line in daemon.log)
    finally:
        spark.stop()
