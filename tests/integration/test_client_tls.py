"""TLS for clients over TCP: pushes and reads work on the client TLS port, the bytes on the wire are not the
data (a recorder between client and daemon looks for a canary, and finds it on a plain link), and a client
on the plain port, with a certificate of another CA, or without its own certificate where the daemon asks
for one, gets nothing."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from shuffled.config import DaemonConfig
from shuffled.net.ports import Port
from shuffled.protocol.errors import AuthFailed
from shuffled.protocol.frames import Role
from shuffled.server.serving.admission import check_port
from shuffled_client import AsyncClient, ConnectionLost, InvalidRequest, tls_context
from tests.aio import within
from tests.cluster import DaemonProcess, free_port, start_daemon
from tests.integration.test_peer_tls import make_pki

needs_openssl = pytest.mark.skipif(
    shutil.which("openssl") is None, reason="needs the openssl command to make certificates"
)

HOST = "127.0.0.1"
CANARY = b"client-tls-canary-7c1e9d" * 40


def client_tls_flags(pki: dict[str, Path], port: int, mutual: bool = False) -> list[str]:
    flags = ["--client-tls-port", str(port), "--client-tls-cert", str(pki["cert"]), "--client-tls-key", str(pki["key"])]
    return [*flags, "--client-tls-ca", str(pki["ca"])] if mutual else flags


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_pki(tmp_path_factory.mktemp("client-pki"), "clients")


@pytest.fixture(scope="module")
def tls_daemon(pki: dict[str, Path]) -> Iterator[tuple[DaemonProcess, str]]:
    tls_port = free_port([HOST])
    d = start_daemon(HOST, free_port([HOST]), "16M", client_tls_flags(pki, tls_port))
    try:
        yield d, f"{HOST}:{tls_port}"
    finally:
        d.stop()


@asynccontextmanager
async def recorder(target: str) -> AsyncIterator[tuple[str, bytearray]]:
    """A relay on loopback that passes bytes on both ways and keeps what the client sent; its links end
    with it, so that the daemon is not left with a connection."""
    seen = bytearray()
    links: list[asyncio.StreamWriter] = []
    host, _, port = target.rpartition(":")

    async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, keep: bool) -> None:
        try:
            while data := await src.read(1 << 16):
                if keep:
                    seen.extend(data)
                dst.write(data)
                await dst.drain()
        except ConnectionError:
            pass
        finally:
            dst.close()

    async def relay(cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        dr, dw = await asyncio.open_connection(host, int(port))
        links.extend((cw, dw))
        await asyncio.gather(pipe(cr, dw, True), pipe(dr, cw, False))

    server = await asyncio.start_server(relay, HOST, 0)
    try:
        yield f"{HOST}:{server.sockets[0].getsockname()[1]}", seen
    finally:
        server.close()
        for link in links:
            link.close()
        await asyncio.gather(*(link.wait_closed() for link in links), return_exceptions=True)


async def push_canary(client: AsyncClient, app: str) -> None:
    w = await client.open_writer(app, 1, 0, 1, 1)
    await w.write(0, CANARY)
    assert await w.commit() == [len(CANARY)]
    async with client.read(app, 1, 0, 1, {client.daemon_node: [1]}) as reader:
        assert await reader.read_all() == CANARY


@needs_openssl
@within(60)
async def test_data_over_the_client_tls_port_is_not_on_the_wire(
    tls_daemon: tuple[DaemonProcess, str], pki: dict[str, Path]
) -> None:
    _, tls_addr = tls_daemon
    async with recorder(tls_addr) as (via, seen):
        # the recorder's address is not in the certificate: check the daemon's name as the certificate says
        context = tls_context(str(pki["ca"]))
        context.check_hostname = False
        c = await AsyncClient.connect(f"tls:{via}", tls=context)
        await push_canary(c, "tls-canary")
        await c.close()
    assert len(seen) > len(CANARY) and CANARY[:24] not in seen


@within(60)
async def test_the_recorder_sees_the_canary_on_a_plain_link() -> None:
    """The check above can fail: the same push over the plain port shows the canary to the recorder."""
    d = start_daemon(HOST, free_port([HOST]), "16M")
    try:
        async with recorder(d.addr) as (via, seen):
            c = await AsyncClient.connect(via)
            await push_canary(c, "plain-canary")
            await c.close()
        assert CANARY[:24] in seen
    finally:
        d.stop()


@needs_openssl
@within(60)
async def test_a_tcp_client_on_the_plain_port_is_refused(tls_daemon: tuple[DaemonProcess, str]) -> None:
    d, tls_addr = tls_daemon
    with pytest.raises(AuthFailed, match=f"clients must connect on port {tls_addr.rpartition(':')[2]} with TLS"):
        await AsyncClient.connect(d.addr)


@needs_openssl
@within(60)
async def test_a_daemon_certificate_from_another_ca_is_refused(
    tls_daemon: tuple[DaemonProcess, str], tmp_path: Path
) -> None:
    rogue = make_pki(tmp_path / "rogue", "rogue")
    with pytest.raises(ConnectionLost, match="CERTIFICATE_VERIFY_FAILED"):
        await AsyncClient.connect(f"tls:{tls_daemon[1]}", tls=tls_context(str(rogue["ca"])))


@needs_openssl
@within(60)
async def test_with_a_client_ca_only_clients_with_its_certificates_get_in(pki: dict[str, Path], tmp_path: Path) -> None:
    tls_port = free_port([HOST])
    d = start_daemon(HOST, free_port([HOST]), "16M", client_tls_flags(pki, tls_port, mutual=True))
    try:
        address = f"tls:{HOST}:{tls_port}"
        rogue = make_pki(tmp_path / "rogue", "rogue")
        for refused in (
            tls_context(str(pki["ca"])),
            tls_context(str(pki["ca"]), str(rogue["cert"]), str(rogue["key"])),
        ):
            with pytest.raises(ConnectionLost):
                await AsyncClient.connect(address, tls=refused, timeout=10)
        c = await AsyncClient.connect(address, tls=tls_context(str(pki["ca"]), str(pki["cert"]), str(pki["key"])))
        await push_canary(c, "mutual")
        await c.close()
        assert d.proc.poll() is None
    finally:
        d.stop()


@within(10)
async def test_a_tls_context_needs_a_tls_address() -> None:
    with pytest.raises(InvalidRequest, match="needs a tls:host:port address"):
        await AsyncClient.connect("127.0.0.1:1", tls=tls_context())


@pytest.mark.parametrize(
    ("settings", "role", "arrived", "allowed"),
    [
        ({}, Role.CLIENT, Port.TCP, True),
        ({}, Role.DAEMON, Port.TCP, True),
        ({"client_tls_port": 7340}, Role.CLIENT, Port.TCP, False),
        ({"client_tls_port": 7340}, Role.CLIENT, Port.CLIENT_TLS, True),
        ({"client_tls_port": 7340}, Role.CLIENT, Port.UNIX, True),
        ({"client_tls_port": 7340}, Role.DAEMON, Port.CLIENT_TLS, False),
        ({"client_tls_port": 7340}, Role.DAEMON, Port.TCP, True),
        ({"peer_tls_port": 7341}, Role.DAEMON, Port.TCP, False),
        ({"peer_tls_port": 7341}, Role.CLIENT, Port.PEER_TLS, False),
        ({"peer_tls_port": 7341}, Role.DAEMON, Port.PEER_TLS, True),
        ({"peer_tls_port": 7341, "client_tls_port": 7340}, Role.DAEMON, Port.CLIENT_TLS, False),
        ({"peer_tls_port": 7341, "client_tls_port": 7340}, Role.CLIENT, Port.PEER_TLS, False),
    ],
)
def test_who_may_arrive_where(settings: dict[str, int], role: Role, arrived: Port, allowed: bool) -> None:
    cfg = DaemonConfig(**settings)  # type: ignore[arg-type]
    if allowed:
        check_port(cfg, arrived, role)
    else:
        with pytest.raises(AuthFailed, match="must connect on"):
            check_port(cfg, arrived, role)
