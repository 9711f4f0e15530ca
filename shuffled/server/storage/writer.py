"""One push's door into storage (Flink's ResultPartitionWriter, Celeborn's PartitionDataWriter): what a
push session does to its map output, from its first pushed group to its commit or abort, and the memory
its pushes may take. `StorageManager.open` makes one; its map output is storage's own and never leaves it.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable

from ...buffers import Buffer
from ...protocol.errors import MapOutputStateError, ShuffledError, StorageError
from ...protocol.packed import PushedGroup
from .lifecycle import Lifecycle
from .shuffles import MapOutput, MapState
from .spill import Spiller, push_memory_error


class MapOutputWriter:
    """A map output being pushed (see the module)."""

    __slots__ = ("_lifecycle", "_out", "_spiller", "app", "attempt", "partitions")

    def __init__(self, out: MapOutput, spiller: Spiller, lifecycle: Lifecycle) -> None:
        self._out = out
        self._spiller = spiller
        self._lifecycle = lifecycle
        data = out.shuffle
        #: whose map output it is (the application's memory and quotas), its attempt id and partition count
        self.app = data.app
        self.attempt = out.attempt
        self.partitions = data.partitions

    def add_all(self, pieces: list[tuple[Buffer, int, PushedGroup]]) -> None:
        """Take a frame's pushed packed groups, in order, each with its checked CRC32C and directory
        (`packed.check_push`): their buffer references move to storage (one refused is released, and those
        after it); then spill if the pool or the application's quota asks for it."""
        store, taken = self._spiller.store, 0
        try:
            for buffer, crc, group in pieces:
                taken += 1
                store.add(self._out, buffer, crc, group)
        except ShuffledError:
            for buffer, _, _ in pieces[taken:]:
                buffer.release()
            raise
        finally:
            self._spiller.check(self.app)

    @property
    def on_failure(self) -> Callable[[ShuffledError], None] | None:
        """How storage fails the push (a spill of its data failed while it was open)."""
        return self._out.on_failure

    @on_failure.setter
    def on_failure(self, fail: Callable[[ShuffledError], None] | None) -> None:
        self._out.on_failure = fail

    @property
    def writable(self) -> bool:
        """Still open: not committed, aborted, or dropped with its shuffle."""
        return self._out.state is MapState.OPEN

    def pushed(self) -> list[int]:
        """Its bytes per partition so far (what its replicas must have committed)."""
        runs = self._out.runs
        if runs is None:
            raise MapOutputStateError(f"map output is {self._out.state.value}")
        return runs.lengths(self.partitions).tolist()

    def commit(self, copies: tuple[str, ...] = ()) -> array[int]:
        """Make it readable (lifecycle.py; `copies`: the daemons that committed its replicas first); its
        bytes per partition. Raises MapOutputStateError when it is no longer open."""
        return self._lifecycle.commit(self._out, copies)

    @property
    def syncs_commits(self) -> bool:
        """A commit is acknowledged only once synced (`--fsync commit`): `commit_synced`, not `commit`."""
        return self._lifecycle.syncs_commit(self._out)

    async def commit_synced(self, copies: tuple[str, ...] = ()) -> array[int]:
        """`commit`; with `syncs_commits`, once the data is on the device, and answering once its record is
        (lifecycle.py). Raises StorageError when writing or syncing failed, MapOutputStateError when it is no
        longer open."""
        return await self._lifecycle.commit_synced(self._out, copies)

    def abort(self) -> None:
        """Drop what was pushed (a no-op once it is no longer open)."""
        self._lifecycle.store.abort(self._out)

    # -- memory for its pushes (spill.py)

    def holding(self) -> bool:
        """Its application's pushes get no new memory now (spilling catches up, or its quota is spilled)."""
        return self._spiller.holding(self.app)

    async def admitted(self) -> None:
        """Returns when its application's pushes may take memory again."""
        await self._spiller.admitted(self.app)

    def memory_error(self, need: int) -> StorageError | None:
        """Why waiting for `need` more segments would wait for good (None: memory will come)."""
        return push_memory_error(self._spiller, need, self.app)
