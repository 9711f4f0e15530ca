"""The shuffle environment: the daemon's parts as the objects that serve one stream see them.

As Flink's ShuffleEnvironment gives a task its buffer pools, partitions and gates, push
sessions, input gates and plan feeds are given this view of the daemon when
they are made, rather than reaching through their connection for it: they then depend
on the store, the pool and the spiller, not on the connection or the daemon, and the
modules stay free of import cycles (a test checks). `Daemon` satisfies it as it is.
"""

from __future__ import annotations

from typing import Protocol

from ...buffers import GlobalPool
from ...config import DaemonConfig
from ...ops.metrics import DaemonMetrics
from ..accounting.counters import Counters
from ..accounting.shares import PushShares
from ..cluster.membership import Membership
from ..storage.disk import Disk
from ..storage.objects import ObjectStore
from ..storage.spill import Spiller
from ..storage.store import Store
from ..storage.tier import ObjectTier


class ShuffleEnvironment(Protocol):
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
    def objects(self) -> ObjectStore | None: ...

    @property
    def tier(self) -> ObjectTier | None: ...

    @property
    def shares(self) -> PushShares: ...

    @property
    def counters(self) -> Counters: ...

    @property
    def metrics(self) -> DaemonMetrics: ...

    @property
    def membership(self) -> Membership: ...
