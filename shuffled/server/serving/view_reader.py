"""A storage view's payloads moved to where they go as room allows (Flink's credit-based view reader, and
its LocalInputChannel's pull): a served read's stream under the reader's credit, or a relayed read's
client stream for a location served from this daemon's own copy.

The reader pulls (`view.take`) what its `room()` allows and hands the payloads to its sink as one batch
(queued and the stream woken once a batch, not once a buffer); when the view waits for a load (or a
frame's memory) it calls back, and when room ran out the reader waits for a batch of it (`LOOKAHEAD`: the
stream it feeds kicks it as credit comes back and frames leave), so it runs once per batch of frames, not
per frame. It never touches what the view holds: how stored data is read is storage's (storage/view.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ...buffers import Chunk
from ...protocol.errors import ShuffledError
from ..storage.view import ReadView

#: frames made beyond the reader's credit (so credit that arrives finds data ready), and how much room a
#: waiting reader needs before it is woken (so it runs once per batch of frames, not per frame)
LOOKAHEAD = 8


class ViewReader:
    """Pulls `view` into `sink` (batches of payloads, with the bytes of their runs) while `room()` is
    positive; then `done()`, or `failed(exc)` (the view is closed then). `start` it; `kick` it when room may
    have grown; `close` it to stop early."""

    __slots__ = ("_ended", "_scheduled", "_waiting", "done", "failed", "room", "sink", "view")

    def __init__(
        self,
        view: ReadView,
        sink: Callable[[list[Chunk], int], None],
        room: Callable[[], int],
        done: Callable[[], None],
        failed: Callable[[ShuffledError], None],
    ) -> None:
        self.view = view
        self.sink = sink
        self.room = room
        self.done = done
        self.failed = failed
        #: room ran out: `kick` pulls again once a batch of it is back
        self._waiting = False
        self._scheduled = False
        #: done or failed: nothing more is pulled
        self._ended = False
        view.listener = self._pull

    @property
    def backlog(self) -> int:
        """Pieces of the view not served yet (what the reader's credit should follow)."""
        return self.view.backlog

    def start(self) -> None:
        """Begin on the next turn of the loop (the read is registered by then, and answers in order)."""
        self._soon()

    def kick(self) -> None:
        """The stream took frames or got credit: pull again if the reader waits and a batch fits now."""
        if self._waiting and self.room() >= LOOKAHEAD:
            self._waiting = False
            self._soon()

    def close(self) -> None:
        self._ended = True
        self.view.close()

    def _soon(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._pull_soon)

    def _pull_soon(self) -> None:
        self._scheduled = False
        self._pull()

    def _pull(self) -> None:
        if self._ended:
            return
        view = self.view
        while True:
            try:
                chunks, data = view.take(self.room())
            except ShuffledError as exc:
                self._ended = True
                self.failed(exc)
                return
            if not chunks:
                break
            self.sink(chunks, data)
            if self._ended:  # the sink closed it (its stream went away)
                return
        if view.finished:
            self._ended = True
            self.done()
        elif not view.busy:
            self._waiting = True
