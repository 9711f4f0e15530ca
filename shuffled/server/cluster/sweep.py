"""The sweep: objects that no daemon will delete are found and deleted (architecture.md, "Cleanup").

A daemon deletes the objects of a shuffle or an application when it is told to drop it (by the owner's
token) or when the application expires on it; what is left after that was written by daemons that
crashed or were lost, for applications whose driver never cleaned up. Every `object-store-sweep` each
daemon lists the whole prefix and deletes such objects, but only what is positively dead:

- the object is older than `app-ttl`, and this daemon does not hold its application;
- every other daemon it knows was asked (admin `applications`) and either answered without that
  application, or is *gone*: neither its lease nor any object it wrote is younger than
  `object-store-lease` (storage/lease.py). A daemon that did not answer and is not gone (stopped,
  slow, partitioned, mid-restart) may hold it: its objects stay. Age alone is not death;
- and the daemon that wrote the object answered so (it is one of those asked, or this daemon), or is gone.

Every deletion is logged and counted with its reason; what was kept for want of an answer is counted too.
Probe objects older than `app-ttl` (a probe cut short by a crash) go, and leases of daemons gone with
nothing left of them. Sweeps of several daemons may meet: deleting is idempotent.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ...config import DaemonConfig
from ...logs import event
from ...protocol.errors import ShuffledError, StorageError
from ..storage.disk import app_dir_name
from ..storage.lease import Silence, lease_node, silences
from ..storage.manager import StorageManager
from ..storage.object_format import node_dir, parse_key
from ..storage.objects import PROBE_DIR, ObjectInfo
from .membership import Membership
from .replication import Connect

log = logging.getLogger(__name__)

#: what an asked daemon said: the application directories it holds, or None (no answer)
Answers = Mapping[str, frozenset[str] | None]


@dataclass(frozen=True, slots=True)
class Verdict:
    """Why a group of objects may go (`kind`: released or expired), or why it stays (`kind` None)."""

    kind: str | None
    reason: str


def verdict(
    app_dir: str, writer: str, me: str, answers: Answers, silent: Mapping[str, Silence], lease: float
) -> Verdict:
    """Whether the objects of `app_dir` that node directory `writer` wrote are positively dead (see the
    module): `me` is this daemon's node directory (its answer is "not held": the caller checked),
    `answers` every other known daemon's, `silent` each node's `Silence` in the store, `lease` this
    daemon's lease period (a node is gone only past its own period and this one)."""

    def gone(node: str) -> bool:
        silence = silent.get(node)
        return silence is not None and silence.gone(lease)

    for node, held in answers.items():
        if held is not None and app_dir in held:
            return Verdict(None, f"daemon {node} holds it")
    unsure = sorted(node for node, held in answers.items() if held is None and not gone(node))
    if unsure:
        return Verdict(None, f"no answer from {', '.join(unsure)}, whose lease is still good")
    if writer == me or answers.get(writer) is not None:
        return Verdict("released", "no daemon holds it: its writer and every other daemon said so")
    if gone(writer):
        seconds = silent[writer].seconds
        return Verdict(
            "expired", f"its writer has been silent {seconds:.0f} s, past its lease; no daemon that answered holds it"
        )
    return Verdict(None, "its writer is no daemon known here, and its lease is still good")


class Sweeper:
    """The daemon's sweep: `start` it once the daemon listens (with an object store), `stop` at shutdown."""

    def __init__(
        self,
        config: DaemonConfig,
        storage: StorageManager,
        membership: Membership,
        connect: Connect,
        active: Callable[[], bool] = lambda: True,
    ) -> None:
        self.config = config
        self.storage = storage
        self.membership = membership
        self.connect = connect
        self.active = active
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        cfg = self.config
        if cfg.object_store_sweep > 0 and cfg.app_ttl > 0:
            self._task = asyncio.create_task(self._loop(cfg.object_store_sweep))

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _loop(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)  # the sweep's period, not a wait for an event
            if not self.active():
                continue
            try:
                await self.sweep()
            except StorageError as exc:
                event(log, "object store sweep failed", logging.WARNING, reason=exc.message)
            except Exception:  # a bug must not stop sweeping for good
                event(log, "object store sweep failed", logging.ERROR, exc_info=True)

    async def sweep(self) -> int:
        """One sweep (see the module); the objects deleted. Raises StorageError when listing fails."""
        cfg = self.config
        if self.storage.restoring:  # what it holds is not known yet: it would take its own objects for garbage
            return 0
        listed = await self.storage.listing()
        held = {app_dir_name(app) for app in self.storage.held.applications()}
        writers: dict[str, str] = {}
        stale: dict[tuple[str, str], list[ObjectInfo]] = {}
        probes: list[ObjectInfo] = []
        for info in listed:
            parts = parse_key(info.key)
            if parts is not None:
                writers[info.key] = parts.node_dir
                if info.age > cfg.app_ttl and parts.app_dir not in held:
                    stale.setdefault((parts.app_dir, parts.node_dir), []).append(info)
            elif info.key.startswith(f"{PROBE_DIR}/") and info.age > cfg.app_ttl:
                probes.append(info)
        silent = silences(listed, writers)
        doomed = await self._doomed(stale, silent)
        if probes:
            doomed.append(("probe", "a probe cut short", probes))
        for kind, reason, infos in doomed:
            await self.storage.swept(kind, [i.key for i in infos])
            event(log, "object store swept", objects=len(infos), bytes=sum(i.size for i in infos), reason=reason)
        deleted = {i.key for _, _, infos in doomed for i in infos}
        await self._forget_gone(listed, silent, writers, deleted)
        return len(deleted)

    async def _doomed(
        self, stale: dict[tuple[str, str], list[ObjectInfo]], silent: Mapping[str, Silence]
    ) -> list[tuple[str, str, list[ObjectInfo]]]:
        """The groups of stale objects that may go, with why; the others are counted as kept."""
        if not stale:
            return []
        answers = await self._ask()
        me, lease = node_dir(self.membership.node), self.config.object_store_lease
        doomed = []
        for (app_dir, writer), infos in stale.items():
            found = verdict(app_dir, writer, me, answers, silent, lease)
            if found.kind is None:
                self.storage.sweep_kept(len(infos))
                event(
                    log,
                    "object store sweep kept",
                    app_dir=app_dir,
                    writer=writer,
                    objects=len(infos),
                    reason=found.reason,
                )
                continue
            doomed.append((found.kind, f"{app_dir} written by {writer}: {found.reason}", infos))
        return doomed

    async def _ask(self) -> dict[str, frozenset[str] | None]:
        """Every other daemon's answer to `applications` (by node directory): the application directories
        it holds, or None when it did not answer within `admin-timeout`."""
        timeout = self.config.admin_timeout

        async def ask(addr: str) -> frozenset[str] | None:
            try:
                conn = await self.connect(addr)
                answer = await conn.admin_call("applications", {}, timeout)
            except (ShuffledError, TimeoutError, ConnectionError) as exc:
                event(log, "applications not answered", peer=addr, reason=str(exc) or "timed out")
                return None
            apps = answer.get("apps") if isinstance(answer, dict) else None
            if not isinstance(apps, list) or not all(isinstance(a, str) for a in apps):
                event(log, "applications not answered", logging.WARNING, peer=addr, reason="not a list of names")
                return None
            if answer.get("restoring"):  # it cannot say yet what it does not hold
                event(log, "applications not answered", peer=addr, reason="still restoring its objects")
                return None
            return frozenset(app_dir_name(a) for a in apps)

        others = self.membership.others()
        answers = await asyncio.gather(*(ask(a) for a in others))
        return {node_dir(addr): held for addr, held in zip(others, answers, strict=True)}

    async def _forget_gone(
        self, listed: list[ObjectInfo], silent: Mapping[str, Silence], writers: dict[str, str], deleted: set[str]
    ) -> None:
        """Delete the leases of daemons gone with no object of theirs left: a daemon that comes back
        writes a new one."""
        left = {writers[i.key] for i in listed if i.key in writers and i.key not in deleted}
        lease = self.config.object_store_lease
        old = [
            i.key
            for i in listed
            if (node := lease_node(i.key)) is not None and node not in left and silent[node].gone(lease)
        ]
        await self.storage.swept("lease", old)
