"""Encryption at rest (`--at-rest-key-file`): every piece written to a spill file or an object is sealed with
AES-256-GCM.

Sealing keeps a piece's length, so the data file's and objects' layouts (offsets, runs, holes) are the same
with and without it: what grows is the metadata, 28 bytes a piece (a random 96-bit nonce and the 128-bit
tag), kept with the piece in memory, in its journal record and in its object's footer. A piece's associated
data names its application, shuffle, attempt, serial and index, so a piece moved to another attempt's or
position's place fails its tag like a flipped bit: `CORRUPT_DATA`, never wrong bytes.

Keys: each line of the key file is a key (at least 32 bytes of secret); the first seals, all open. A
shuffle's journal header names the key its pieces were sealed with (`kid`, a digest of it), and each
application gets its own key derived from it (HKDF-SHA256 with the application id), so the data of one
application never shares a key with another's. Rotation: put the new key first, keep the old one below it
until the shuffles sealed with it are gone (docs/security.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import threading
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import TypeVar

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from ...protocol.errors import CorruptData

T = TypeVar("T")

#: a sealed piece's metadata: its nonce, then its tag
NONCE, TAG = 12, 16
SEAL = NONCE + TAG
#: bytes of secret a key line must hold at least
MIN_KEY = 32

#: (attempt, serial, index) of each piece a write or read covers, in order
Pieces = Sequence[tuple[int, int, int]]
#: seals `views` on the writer thread: the ciphertexts to write, and their seals back to back
Sealer = Callable[[Sequence[memoryview]], tuple[list[memoryview], bytes]]
#: fills memory with the ciphertexts (a read of a file, into memory of the opener's)
Reader = Callable[[Sequence[memoryview]], None]
#: opens pieces into `views` on a reader thread: the ciphertexts read by the `Reader` given, else already in
#: `views`; raises CorruptData for a piece that fails
Opener = Callable[[Sequence[memoryview], Reader | None], None]


class AtRestKeys:
    """The keys of the key file (see the module)."""

    def __init__(self, keys: Sequence[bytes]) -> None:
        if not keys:
            raise ValueError("the key file holds no key")
        short = [i + 1 for i, k in enumerate(keys) if len(k) < MIN_KEY]
        if short:
            raise ValueError(f"key line(s) {short} hold fewer than {MIN_KEY} bytes")
        self._keys = {key_id(k): k for k in keys}
        #: the key new shuffles are sealed with
        self.current = key_id(keys[0])

    @classmethod
    def load(cls, path: str) -> AtRestKeys:
        """Raises OSError (unreadable) or ValueError (no key, a short one)."""
        with open(path, "rb") as f:
            lines = [line.strip() for line in f.read().splitlines()]
        return cls([line for line in lines if line])

    def knows(self, kid: str) -> bool:
        return kid in self._keys

    def _aead(self, kid: str, app: str) -> AESGCM:
        return _derived(self._keys[kid], app)

    def sealer(self, kid: str, app: str, shuffle: int, pieces: Pieces, fresh: bool = False) -> Sealer:
        """Seals the pieces into memory of the thread's own, reused by its next call (`fresh`: memory of
        their own, for ciphertexts that outlive the call, such as an object's upload)."""
        aead = self._aead(kid, app)

        def seal(views: Sequence[memoryview]) -> tuple[list[memoryview], bytes]:
            out: list[memoryview] = []
            seals = bytearray()
            size = sum(len(v) for v in views) + TAG * len(views)
            at, scratch = 0, memoryview(bytearray(size)) if fresh else _scratch(size)
            nonces = os.urandom(NONCE * len(views))  # one system call a write, not a piece
            for k, (view, piece) in enumerate(zip(views, pieces, strict=True)):
                nonce = nonces[k * NONCE : (k + 1) * NONCE]
                end = at + len(view)
                aead.encrypt_into(nonce, view, _aad(app, shuffle, piece), scratch[at : end + TAG])
                out.append(scratch[at:end])
                seals += nonce
                seals += scratch[end : end + TAG]
                at = end + TAG
            return out, bytes(seals)

        return seal

    def opener(self, kid: str, app: str, shuffle: int, pieces: Pieces, seals: Sequence[bytes]) -> Opener:
        aead = self._aead(kid, app)

        def open_(views: Sequence[memoryview], read: Reader | None = None) -> None:
            room, sealed, at = _scratch(sum(len(v) for v in views) + TAG * len(views)), [], 0
            for view in views:  # each ciphertext with room for its tag behind it
                sealed.append(room[at : at + len(view) + TAG])
                at += len(view) + TAG
            if read is not None:
                read([s[:-TAG] for s in sealed])
            else:
                for s, view in zip(sealed, views, strict=True):
                    s[:-TAG] = view
            for view, piece, seal, s in zip(views, pieces, seals, sealed, strict=True):
                s[-TAG:] = seal[NONCE:]
                try:
                    aead.decrypt_into(seal[:NONCE], s, _aad(app, shuffle, piece), view)
                except InvalidTag:
                    raise CorruptData(
                        f"stored piece {piece[2]} of map attempt {piece[0]} of {app}/{shuffle} failed its "
                        "authentication tag check (changed on disk, or sealed for another place)"
                    ) from None

        return open_


async def off_loop(work: Callable[[], T]) -> T:
    """`work()` on a thread of the default executor; a cancelled caller still waits for the thread to end,
    since the thread reads or writes memory (pool segments) the caller gives back once it returns."""
    running = asyncio.get_running_loop().run_in_executor(None, work)
    try:
        return await asyncio.shield(running)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await running
        raise


_THREAD = threading.local()


def _scratch(size: int) -> memoryview:
    """Memory of this thread's own, reused from one write or read to the next (the writer thread and each
    reader thread seal or open one batch at a time): fresh memory for every piece costs more than AES-NI."""
    buf: memoryview | None = getattr(_THREAD, "scratch", None)
    if buf is None or len(buf) < size:
        buf = _THREAD.scratch = memoryview(bytearray(size))
    return buf


@lru_cache(maxsize=1024)
def _derived(key: bytes, app: str) -> AESGCM:
    """The application's own key: HKDF-SHA256 of the daemon's key, with the application id as its info."""
    info = b"shuffled at-rest v1\0" + app.encode()
    return AESGCM(HKDF(hashes.SHA256(), 32, salt=None, info=info).derive(key))


def set_seal(seals: list[bytes], index: int, seal: bytes) -> None:
    """Piece `index`'s seal in a list of them, one a piece (b"": a piece not sealed where it is)."""
    if len(seals) <= index:
        seals.extend([b""] * (index + 1 - len(seals)))
    seals[index] = seal


def split_seals(seals: bytes) -> list[bytes]:
    """Seals back to back (a write's, a journal record's) as one a piece."""
    return [seals[i : i + SEAL] for i in range(0, len(seals), SEAL)]


def key_id(key: bytes) -> str:
    """What a journal header names a key by: a digest that does not give the key away."""
    return hashlib.sha256(b"shuffled at-rest key id\0" + key).hexdigest()[:16]


def _aad(app: str, shuffle: int, piece: tuple[int, int, int]) -> bytes:
    attempt, serial, index = piece
    return f"{app}\0{shuffle}\0{attempt}\0{serial}\0{index}".encode()
