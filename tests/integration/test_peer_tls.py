"""TLS between daemons: relayed reads work over mutually authenticated TLS on the peer port; a daemon
arriving on the plain port, or with a certificate from another CA, gets nothing."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from shuffled.protocol import codec
from shuffled.protocol.auth import drain_proof, new_nonce
from shuffled.protocol.errors import AuthFailed, ErrorCode, PeerUnavailable
from shuffled.protocol.frames import ErrorResponse, Hello, Role
from shuffled_client import AsyncClient
from tests.aio import within
from tests.cluster import Cluster, DaemonProcess, free_port, payload, start_daemon
from tests.integration.test_bad_input import Raw

pytestmark = pytest.mark.skipif(
    shutil.which("openssl") is None, reason="needs the openssl command to make certificates"
)

HOSTS = ["127.0.0.1", "127.0.0.2"]


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_pki(where: Path, name: str) -> dict[str, Path]:
    """A CA and one certificate for every test host (IP names), signed by it."""
    where.mkdir(parents=True, exist_ok=True)
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={name}-ca",
             "-keyout", "ca.key", "-out", "ca.pem", cwd=where)  # fmt: skip
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", "peer.key",
             "-out", "peer.csr", cwd=where)  # fmt: skip
    (where / "ext").write_text("subjectAltName=" + ",".join(f"IP:{h}" for h in [*HOSTS, "127.0.0.3"]) + "\n")
    openssl("x509", "-req", "-in", "peer.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-days", "2", "-extfile", "ext", "-out", "peer.pem", cwd=where)  # fmt: skip
    return {"cert": where / "peer.pem", "key": where / "peer.key", "ca": where / "ca.pem"}


def tls_flags(pki: dict[str, Path], port: int) -> list[str]:
    return ["--peer-tls-port", str(port), "--peer-tls-cert", str(pki["cert"]), "--peer-tls-key", str(pki["key"]),
            "--peer-tls-ca", str(pki["ca"])]  # fmt: skip


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_pki(tmp_path_factory.mktemp("pki"), "cluster")


@pytest.fixture(scope="module")
def tls_pair(pki: dict[str, Path]) -> Iterator[list[DaemonProcess]]:
    with Cluster(HOSTS, "16M", tls_flags(pki, free_port(HOSTS))) as cluster:
        yield cluster.daemons


@within(60)
async def test_relayed_read_over_tls(tls_pair: list[DaemonProcess]) -> None:
    a, b = tls_pair
    ca, cb = await AsyncClient.connect(a.addr), await AsyncClient.connect(b.addr)
    w = await cb.open_writer("tls-app", 1, 0, 1, 2)
    await w.write(0, payload(1, 0, 1000))
    await w.write(1, payload(1, 1, 90_000))
    assert await w.commit() == [1000, 90_000]
    async with ca.read("tls-app", 1, 0, 2, {b.addr: [1]}) as reader:
        assert await reader.read_all() == payload(1, 0, 1000) + payload(1, 1, 90_000)
    assert (await ca.stats())["connections"]["peers"] == 1
    result = await ca.remove_application("tls-app")
    assert result["peers"] == {b.addr: "ok"}
    for c in (ca, cb):
        await c.close()


@within(60)
async def test_a_daemon_on_the_plain_port_is_refused(tls_pair: list[DaemonProcess]) -> None:
    raw = await Raw.open(tls_pair[0].addr)
    info = {"node": "127.0.0.9:1", "segment_size": 32 << 10, "nonce": "e" * 32}
    await raw.send(codec.encode(Hello(Role.DAEMON, info=info)))
    err = await raw.frame()
    assert isinstance(err, ErrorResponse) and err.code == ErrorCode.AUTH_FAILED
    assert "must connect on port" in err.message


@within(60)
async def test_a_daemon_with_another_ca_cannot_connect(tls_pair: list[DaemonProcess], tmp_path: Path) -> None:
    b = tls_pair[1]
    rogue_pki = make_pki(tmp_path / "rogue", "rogue")
    tls_port = int(next(f for f in tls_pair[0].log if "peer_tls_port=" in f).split("peer_tls_port=")[1].split()[0])
    rogue = start_daemon("127.0.0.3", free_port(["127.0.0.3"]), "16M", tls_flags(rogue_pki, tls_port))
    try:
        c = await AsyncClient.connect(rogue.addr)
        with pytest.raises(PeerUnavailable, match="cannot reach daemon"):
            async with c.read("tls-app", 1, 0, 1, {b.addr: [1]}) as reader:
                await reader.read_all()
        await c.close()
    finally:
        rogue.stop()


@within(60)
async def test_without_a_peer_secret_of_its_own_a_daemon_cannot_be_drained(
    pki: dict[str, Path], tmp_path: Path
) -> None:
    """Peer TLS stands in for the peer secret, so the cluster secret proves a peer: it must not stop one."""

    (tmp_path / "secret").write_text("tls-secret\n")
    host = HOSTS[0]
    flags = ["--secret-file", str(tmp_path / "secret"), *tls_flags(pki, free_port([host]))]
    d = start_daemon(host, free_port([host]), "16M", flags)
    try:
        c = await AsyncClient.connect(d.addr, secret="tls-secret")
        with pytest.raises(AuthFailed, match="none of its own"):
            await c.drain_challenge(new_nonce())
        proof = drain_proof(b"tls-secret", new_nonce(), new_nonce(), True, None)
        with pytest.raises(AuthFailed, match="none of its own"):
            await c.drain(proof=proof)
        assert (await c.stats())["drain"]["state"] == "serving"
        await c.close()
    finally:
        d.stop()
