"""Where the daemon listens: its port for clients and peers (bound early when the data dir is named after
it), its peer TLS port when peers speak TLS, its client TLS port when TCP clients do, and its Unix socket for
executors on the same host. Admission checks who may arrive where (serving/admission.py)."""

from __future__ import annotations

import asyncio
import functools
import os
import socket
import ssl
from collections.abc import Callable

from ..config import DATA_DIR_AUTO, DaemonConfig
from ..net.ports import Port


def auto_listener(config: DaemonConfig) -> socket.socket | None:
    """With data-dir auto, port 0 and no advertised address, a socket bound now to a port the kernel picks,
    for `create_server(sock=...)`: the data dir is named after the address listened on, so the port must
    be known before the directory is."""
    if config.data_dir != DATA_DIR_AUTO or config.port != 0 or config.advertise:
        return None
    family, kind, proto, _, addr = socket.getaddrinfo(config.host, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[
        0
    ]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
    except OSError:
        sock.close()
        raise
    return sock


class Listeners:
    def __init__(
        self, config: DaemonConfig, peer_tls: ssl.SSLContext | None, client_tls: ssl.SSLContext | None
    ) -> None:
        self.config = config
        self.peer_tls = peer_tls
        self.client_tls = client_tls
        #: the port bound before the daemon starts (data-dir auto with port 0), else None
        self.early = auto_listener(config)
        self._servers: list[asyncio.AbstractServer] = []

    @property
    def early_port(self) -> int | None:
        return self.early.getsockname()[1] if self.early is not None else None

    async def open(self, connection: Callable[[Port], asyncio.BaseProtocol]) -> int:
        """Listen everywhere the settings say, each accepted connection made by `connection(port)`; the port
        clients and peers dial."""
        loop = asyncio.get_running_loop()
        cfg = self.config
        if self.early is not None:
            server = await loop.create_server(lambda: connection(Port.TCP), sock=self.early)
        else:
            server = await loop.create_server(lambda: connection(Port.TCP), cfg.host, cfg.port, reuse_address=True)
        self._servers.append(server)
        for kind, number, tls in (
            (Port.PEER_TLS, cfg.peer_tls_port, self.peer_tls),
            (Port.CLIENT_TLS, cfg.client_tls_port, self.client_tls),
        ):
            if tls is not None:
                made = functools.partial(connection, kind)
                self._servers.append(await loop.create_server(made, cfg.host, number, ssl=tls, reuse_address=True))
        if cfg.unix_socket:
            if os.path.exists(cfg.unix_socket):
                os.unlink(cfg.unix_socket)
            self._servers.append(await loop.create_unix_server(lambda: connection(Port.UNIX), cfg.unix_socket))
            os.chmod(cfg.unix_socket, cfg.unix_socket_mode)
        port: int = server.sockets[0].getsockname()[1]
        return port

    def close(self) -> None:
        """Accept nothing more (the early socket too, had the daemon never started)."""
        for server in self._servers:
            server.close()
        if not self._servers and self.early is not None:
            self.early.close()

    async def closed(self) -> None:
        for server in self._servers:
            await server.wait_closed()
        if self.config.unix_socket and os.path.exists(self.config.unix_socket):
            os.unlink(self.config.unix_socket)
