"""The shuffle environment: the daemon's parts as its connections see them (Flink's ShuffleEnvironment).

The daemon builds its parts (daemon.py) and hands each connection this one bundle of them; a connection
then gives each of its services, sessions, gates and admin operations the parts it uses, and nothing
reaches through a connection or the daemon for more. Generic in the connection type, so that this module
(and everything a connection imports) never imports the connection itself: the daemon's is a
`ShuffleEnvironment[DaemonConnection]`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ...buffers import GlobalPool
from ...buffers.shm import RegionDirectory
from ...config import DaemonConfig
from ...ops.metrics import DaemonMetrics
from ...ops.stats import DaemonStats
from ..accounting.counters import Counters
from ..accounting.shares import PushShares
from ..cluster.drain import Drain
from ..cluster.membership import Membership
from ..cluster.peers import PeerManager
from ..storage.manager import StorageManager
from .backlog import UnsentBudget
from .link import DaemonLink
from .trust import Trust

C = TypeVar("C", bound=DaemonLink)


@dataclass(frozen=True, slots=True, eq=False)
class ShuffleEnvironment(Generic[C]):
    """The daemon's parts (see the module)."""

    config: DaemonConfig
    #: the one buffer pool
    pool: GlobalPool
    #: everything stored (storage/manager.py)
    storage: StorageManager
    #: push memory's fair shares (accounting/shares.py)
    shares: PushShares
    counters: Counters
    metrics: DaemonMetrics
    #: every daemon this one knows of, itself included, and its own name (`node`, once it listens)
    membership: Membership
    #: one connection to each other daemon (cluster/peers.py), and every connection open
    peers: PeerManager[C]
    connections: set[C]
    #: how the daemon stops (cluster/drain.py)
    drain: Drain
    #: whom it trusts and how each side proves itself (trust.py)
    trust: Trust
    #: the bound on answers queued unsent (backlog.py)
    unsent: UnsentBudget
    #: tasks that answer admin requests, which the daemon lets finish when it stops
    background: set[asyncio.Task[Any]]
    #: when the daemon started (wall clock), and the snapshot of everything it counts
    started: float
    stats: Callable[[], DaemonStats]
    #: where local clients' regions of shared memory are made (buffers/shm.py)
    shm: RegionDirectory

    @property
    def node(self) -> str:
        """This daemon's advertised address: its name on the placement ring and in Spark's MapStatus."""
        return self.membership.node
