"""The daemon's services as the objects that serve one stream see them.

Push sessions, read gates and plan feeds are given this view of the daemon when
they are made, rather than reaching through their connection for it: they then depend
on the store, the pool and the spiller, not on the connection or the daemon, and the
modules stay free of import cycles (a test checks). `Daemon` satisfies it as it is.
"""

from __future__ import annotations

from typing import Protocol

from ..buffers import GlobalPool
from ..config import DaemonConfig
from ..ops.metrics import DaemonMetrics
from .counters import Counters
from .disk import Disk
from .membership import Membership
from .shares import PushShares
from .spill import Spiller
from .store import Store


class Services(Protocol):
    @property
    def config(self) -> DaemonConfig: ...

    @property
    def pool(self) -> GlobalPool: ...

    @property
    def store(self) -> Store: ...

    @property
    def spiller(self) -> Spiller: ...

    @property
    def disk(self) -> Disk | None: ...

    @property
    def shares(self) -> PushShares: ...

    @property
    def counters(self) -> Counters: ...

    @property
    def metrics(self) -> DaemonMetrics: ...

    @property
    def membership(self) -> Membership: ...
