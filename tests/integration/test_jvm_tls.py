"""The JVM client on a daemon's client TLS port (client/jvm, io.shuffled.spark.TlsCheck): through the Spark
plugin's settings (`spark.shuffled.address=tls:host:port`, `spark.shuffled.tls.*`) and through the client's
own API, a map output goes there and back byte-exact; a daemon certificate of another CA or for another
name, a client without the certificate a daemon asks for, the plain port, and settings the plugin cannot
use are each refused with a message that says why."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from shuffled import spark_jar
from tests.cluster import DaemonProcess, free_port, start_daemon
from tests.integration.test_client_tls import client_tls_flags, needs_openssl
from tests.integration.test_peer_tls import make_pki, openssl
from tests.jvm import needs_jdk

pytestmark = [needs_jdk, needs_openssl]

HOST = "127.0.0.1"
JAVA_TIMEOUT = 60
#: what TlsCheck pushes and reads back: ClientCheck.size(0, p) over its four partitions
ROUND_TRIP = "identical " + str(0 + 100 + 40_000 + (3 << 20)) + " bytes"


@pytest.fixture(scope="module")
def jars() -> tuple[Path, Path]:
    return spark_jar.build_jar(), spark_jar.build_test_classes()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The cluster's CA, the daemons' certificate, and client certificates it signed: the RSA one of
    make_pki, an EC one, and the RSA key again in the traditional form the JDK cannot read."""
    where = tmp_path_factory.mktemp("jvm-pki")
    pki = make_pki(where, "clients")
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-subj", "/CN=ec-client",
            "-keyout", "ec.key", "-out", "ec.csr", cwd=where)  # fmt: skip
    openssl("x509", "-req", "-in", "ec.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-days", "2",
            "-out", "ec.pem", cwd=where)  # fmt: skip
    openssl("rsa", "-in", "peer.key", "-traditional", "-out", "traditional.key", cwd=where)
    made = {"ec_cert": "ec.pem", "ec_key": "ec.key", "traditional_key": "traditional.key"}
    return {**pki, **{name: where / file for name, file in made.items()}}


@pytest.fixture(scope="module")
def rogue(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_pki(tmp_path_factory.mktemp("jvm-rogue"), "rogue")


def _tls_daemon(pki: dict[str, Path], mutual: bool) -> Iterator[tuple[DaemonProcess, int]]:
    tls_port = free_port([HOST])
    d = start_daemon(HOST, free_port([HOST]), "64M", client_tls_flags(pki, tls_port, mutual))
    try:
        yield d, tls_port
    finally:
        d.stop()


@pytest.fixture(scope="module")
def tls_daemon(pki: dict[str, Path]) -> Iterator[tuple[DaemonProcess, int]]:
    yield from _tls_daemon(pki, mutual=False)


@pytest.fixture(scope="module")
def mutual_daemon(pki: dict[str, Path]) -> Iterator[tuple[DaemonProcess, int]]:
    yield from _tls_daemon(pki, mutual=True)


def tls_check(jars: tuple[Path, Path], *args: str | Path) -> str:
    """TlsCheck's one line: `identical N bytes`, `differs ...` or `error KIND: message`."""
    cmd = [spark_jar.find_tool("java"), "-cp", spark_jar.classpath(*jars), "io.shuffled.spark.TlsCheck"]
    proc = subprocess.run([*cmd, *map(str, args)], capture_output=True, text=True, timeout=JAVA_TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, proc.stdout + proc.stderr
    return lines[0]


def settings(**paths: Path) -> list[str]:
    """`spark.shuffled.tls.ca=...` and friends for TlsCheck's spark mode."""
    return [f"spark.shuffled.tls.{name}={path}" for name, path in paths.items()]


def test_a_map_output_goes_there_and_back_over_tls(
    jars: tuple[Path, Path], tls_daemon: tuple[DaemonProcess, int], pki: dict[str, Path]
) -> None:
    address = f"tls:{HOST}:{tls_daemon[1]}"
    assert tls_check(jars, "spark", address, *settings(ca=pki["ca"])) == ROUND_TRIP
    assert tls_check(jars, "client", address, pki["ca"]) == ROUND_TRIP


def test_the_plain_port_refuses_a_jvm_client(jars: tuple[Path, Path], tls_daemon: tuple[DaemonProcess, int]) -> None:
    d, tls_port = tls_daemon
    line = tls_check(jars, "spark", d.addr)
    assert line.startswith(f"error AUTH_FAILED: clients must connect on port {tls_port} with TLS"), line


@pytest.mark.parametrize(
    ("host", "says"),
    [
        (HOST, "PKIX path building failed"),  # the CA is not the daemon's
        ("localhost", "No name matching localhost found"),  # the name is not its
    ],
)
def test_a_daemon_certificate_the_client_cannot_trust_is_refused(
    jars: tuple[Path, Path],
    tls_daemon: tuple[DaemonProcess, int],
    pki: dict[str, Path],
    rogue: dict[str, Path],
    host: str,
    says: str,
) -> None:
    address = f"tls:{host}:{tls_daemon[1]}"
    ca = rogue["ca"] if host == HOST else pki["ca"]
    line = tls_check(jars, "spark", address, *settings(ca=ca))
    assert line.startswith(f"error CONNECTION_LOST: cannot connect to shuffled at {address}: TLS handshake failed:")
    assert says in line and "--client-tls-ca" not in line, line  # the client refused it: no hint about its own


def test_with_a_client_ca_only_jvm_clients_with_its_certificates_get_in(
    jars: tuple[Path, Path], mutual_daemon: tuple[DaemonProcess, int], pki: dict[str, Path], rogue: dict[str, Path]
) -> None:
    address = f"tls:{HOST}:{mutual_daemon[1]}"
    for refused in (settings(ca=pki["ca"]), settings(ca=pki["ca"], cert=rogue["cert"], key=rogue["key"])):
        line = tls_check(jars, "spark", address, *refused)
        assert line.startswith("error CONNECTION_LOST: ") and address in line, line
        assert "asks for client certificates (--client-tls-ca)" in line, line  # the likely cause, as it says none
    assert tls_check(jars, "spark", address, *settings(ca=pki["ca"], cert=pki["cert"], key=pki["key"])) == ROUND_TRIP
    ec = settings(ca=pki["ca"], cert=pki["ec_cert"], key=pki["ec_key"])
    assert tls_check(jars, "spark", address, *ec) == ROUND_TRIP
    assert tls_check(jars, "client", address, pki["ca"], pki["ec_cert"], pki["ec_key"]) == ROUND_TRIP
    assert mutual_daemon[0].proc.poll() is None


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["client", "127.0.0.1:1", "{ca}"], "error IllegalArgumentException: a TLS context needs a tls:host:port"),
        (["spark", "127.0.0.1:1", "spark.shuffled.tls.ca={ca}"], "need a tls:host:port address in"),
        (["spark", "tls:127.0.0.1:1", "spark.shuffled.tls.key={key}"], "spark.shuffled.tls.key needs spark.shuffled"),
        (["spark", "tls:127.0.0.1:1", "spark.shuffled.tls.cert={cert}"], "spark.shuffled.tls.cert needs spark.shuff"),
        (
            ["spark", "tls:127.0.0.1:1", "spark.shuffled.tls.cert={cert}", "spark.shuffled.tls.key={traditional_key}"],
            '"RSA PRIVATE KEY", not an unencrypted PKCS#8 "PRIVATE KEY": convert it with openssl pkcs8 -topk8 -nocrypt',
        ),
        (["spark", "tls:127.0.0.1:1", "spark.shuffled.tls.ca={cert}.missing"], "NoSuchFileException"),
    ],
)
def test_tls_settings_the_client_cannot_use_are_refused_before_connecting(
    jars: tuple[Path, Path], pki: dict[str, Path], args: list[str], says: str
) -> None:
    line = tls_check(jars, *(arg.format(**pki) for arg in args))
    assert line.startswith("error IllegalArgumentException: ") and says in line, line
