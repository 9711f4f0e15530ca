"""Which daemons this one knows of: the one peer list placement, propagation and the dial check use.

The list is the `peers` setting plus, with `peers-dns`, every address a DNS name resolves to (a
Kubernetes headless Service lists each daemon of a DaemonSet, which cannot name its peers in a
static file). The name is resolved at start and again on every housekeeping tick, on the event
loop's resolver (a thread, never blocking the loop); at most one lookup runs at a time, so a slow
DNS server delays the next answer, not the daemon. A failed lookup keeps the last good list:
daemons that vanish from DNS for a moment must not move every replica's placement.

Daemons whose lists differ for a moment (one has seen a new pod, another not yet) place replicas
differently until their next lookups agree; a read failing over tries several candidates
(`replica-search`), which covers the usual case of one daemon more or less.
"""

from __future__ import annotations

import asyncio
import logging
import socket

from ...config import DaemonConfig
from ...logs import event
from .replica_ring import candidates

log = logging.getLogger(__name__)


async def resolve(name: str, port: int) -> list[str]:
    """Every address `name` resolves to (A and AAAA), as sorted, distinct daemon names `IP:PORT` (IPv6 in
    brackets, as a daemon listening on an IPv6 address advertises itself); OSError if it resolves to none."""
    infos = await asyncio.get_running_loop().getaddrinfo(name, port, type=socket.SOCK_STREAM)
    found = {f"[{sa[0]}]:{port}" if family == socket.AF_INET6 else f"{sa[0]}:{port}" for family, *_, sa in infos}
    if not found:
        raise OSError(f"{name} has no addresses")
    return sorted(found)


class Membership:
    """The daemons this one knows of, itself included (`ring`): the placement ring and whom to tell."""

    def __init__(self, config: DaemonConfig, node: str = "") -> None:
        self.config = config
        #: this daemon's advertised address (set once it listens)
        self.node = node
        self._listed = config.peer_addresses()
        #: what `peers-dns` resolved to last time it answered
        self.resolved: list[str] = []
        #: the last lookup problem logged, so a failing name is logged once per change, not every tick
        self._problem: str | None = None
        self._lookup: asyncio.Task[None] | None = None

    def others(self) -> list[str]:
        """Every other daemon: `peers` first, then what `peers-dns` added."""
        return [addr for addr in dict.fromkeys([*self._listed, *self.resolved]) if addr != self.node]

    def ring(self) -> list[str]:
        """Every daemon, this one included: what placement spreads replicas over."""
        return [*self.others(), self.node] if self.node else self.others()

    def knows(self, addr: str) -> bool:
        return addr in self.others()

    def candidates(self, primary: str, app: str, shuffle: int) -> list[str]:
        """The daemons a replica push, a read failover and a drain try for `primary`'s data of a shuffle,
        in order (the first `replica-search` of replica_ring.candidates)."""
        cfg = self.config
        return candidates(self.ring(), cfg.zones(self.node), primary, app, shuffle)[: cfg.replica_search]

    def refresh_soon(self) -> None:
        """Start a lookup unless one is still running (the housekeeping tick calls this)."""
        if self.config.peers_dns is not None and (self._lookup is None or self._lookup.done()):
            self._lookup = asyncio.create_task(self.refresh())

    async def refresh(self) -> None:
        """Resolve `peers-dns` once; on failure keep the last list (bounded by the connect timeout)."""
        target = self.config.peers_dns
        if target is None:
            return
        name, _, port = target.rpartition(":")
        try:
            found = await asyncio.wait_for(resolve(name, int(port)), self.config.connect_timeout)
        except (OSError, TimeoutError) as exc:
            problem = str(exc) or "timed out"
            if problem != self._problem:
                self._problem = problem
                event(
                    log, "peers-dns lookup failed", logging.WARNING, name=name, error=problem, kept=len(self.resolved)
                )
            return
        if self._problem is not None:
            self._problem = None
            event(log, "peers-dns lookup works again", name=name)
        if found != self.resolved:
            added, gone = sorted(set(found) - set(self.resolved)), sorted(set(self.resolved) - set(found))
            self.resolved = found
            event(log, "peers changed", name=name, peers=len(self.others()), added=added, gone=gone)
            if self.node and self.node not in found:
                event(
                    log,
                    "peers-dns does not list this daemon",
                    logging.WARNING,
                    node=self.node,
                    name=name,
                    reason="advertise differs from the address DNS gives for this daemon: it would be on the "
                    "ring twice and might be chosen as its own replica",
                )

    def stop(self) -> None:
        if self._lookup is not None:
            self._lookup.cancel()
