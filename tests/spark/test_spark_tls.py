"""A Spark job through a daemon's client TLS port: the executors push and read over TLS
(`spark.shuffled.address=tls:host:port`, the daemon's certificate checked against `spark.shuffled.tls.ca`),
and the driver's cleanup reaches the daemon the same way; the daemon refuses plain TCP clients, so the job
could not have gone around it."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

from shuffled import spark_jar
from tests import spark_jobs
from tests.cluster import free_port, poll_until, start_daemon
from tests.integration.test_client_tls import client_tls_flags, needs_openssl
from tests.integration.test_peer_tls import make_pki
from tests.spark_support import PLUGIN_TIMEOUT, daemon_stats, needs_spark, store_emptied

pytestmark = [needs_spark, needs_openssl, pytest.mark.timeout(300)]

HOST = "127.0.0.1"


def test_a_job_shuffles_through_the_client_tls_port(plugin_jar: Path, tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki", "spark-tls")
    socket = tmp_path / "shuffled.sock"  # plain, for this test's own look at the daemon
    tls_port = free_port([HOST])
    d = start_daemon(HOST, free_port([HOST]), "128M", [*client_tls_flags(pki, tls_port), "--unix-socket", str(socket)])
    local = SimpleNamespace(addr=f"unix:{socket}")
    try:
        conf = {
            **spark_jar.spark_conf(plugin_jar, [f"tls:{HOST}:{tls_port}"]),
            "spark.shuffled.timeout": PLUGIN_TIMEOUT,
            "spark.shuffled.tls.ca": str(pki["ca"]),
        }
        spark = spark_jobs.session("local[2]", conf)
        try:
            pairs = [(i % 53, i) for i in range(20_000)]
            summed = spark.sparkContext.parallelize(pairs, 4).reduceByKey(lambda a, b: a + b).collect()
            expected: Counter[int] = Counter()
            for key, value in pairs:
                expected[key] += value
            assert sorted(summed) == sorted(expected.items())
            store = daemon_stats(local)["store"]
            assert store["commits"] >= 4 and store["applications"] == 1, store  # each map task's, over TLS
        finally:
            spark.stop()  # the driver removes its application over TLS
        poll_until(store_emptied(local, "applications"), 20, "the driver's cleanup reached the daemon over TLS")
    finally:
        d.stop()


def test_a_daemon_certificate_the_application_cannot_trust_stops_it_at_start(plugin_jar: Path, tmp_path: Path) -> None:
    """As with a wrong secret, a session whose spark.shuffled.tls.ca is not the CA of the daemon's certificate
    stops at start with the reason and the setting to check, instead of failing every task later."""
    from py4j.protocol import Py4JJavaError

    pki, rogue = make_pki(tmp_path / "pki", "spark-tls"), make_pki(tmp_path / "rogue", "rogue")
    tls_port = free_port([HOST])
    d = start_daemon(HOST, free_port([HOST]), "64M", client_tls_flags(pki, tls_port))
    try:
        conf = {
            **spark_jar.spark_conf(plugin_jar, [f"tls:{HOST}:{tls_port}"]),
            "spark.shuffled.timeout": "30s",
            "spark.shuffled.tls.ca": str(rogue["ca"]),
        }
        with pytest.raises(Py4JJavaError, match=r"shuffled: TLS with .* failed: .*PKIX.*spark\.shuffled\.tls\.ca"):
            spark_jobs.session("local[2]", conf)
    finally:
        d.stop()
