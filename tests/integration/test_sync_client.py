"""The blocking client over the daemon's Unix socket (the executor-local path)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shuffled_client import Client, MapOutputStateError, PartitionNotFound
from tests.cluster import free_port, payload, start_daemon


def test_blocking_client_over_unix_socket(tmp_path: Path) -> None:
    sock = tmp_path / "shuffled.sock"
    d = start_daemon("127.0.0.1", free_port(["127.0.0.1"]), "32M", ["--unix-socket", str(sock)])
    try:
        with Client(f"unix:{sock}", timeout=10) as c:
            w = c.open_writer("sync-app", 4, 0, 11, 3)
            for p in range(3):
                w.write(p, payload(11, p, 50_000 * (p + 1)))
            assert w.commit() == [50_000, 100_000, 150_000]
            with pytest.raises(MapOutputStateError):
                w.write(0, b"after commit")

            with c.read("sync-app", 4, 1, 3, {"": [11]}) as reader:
                seen: dict[int, bytearray] = {}
                for chunk in reader:
                    assert chunk.attempt == 11
                    seen.setdefault(chunk.partition, bytearray()).extend(chunk.data)
            assert seen == {1: payload(11, 1, 100_000), 2: payload(11, 2, 150_000)}

            with pytest.raises(PartitionNotFound), c.read("sync-app", 4, 0, 1, {"": [12]}) as reader:
                reader.read_all()

            aborted = c.open_writer("sync-app", 4, 1, 12, 3)
            aborted.write(0, b"gone")
            aborted.abort()
            assert c.stats()["store"]["open_map_outputs"] == 0
            assert (
                c.unregister_shuffle("sync-app", 4, propagate=False)["freed_segments"] == 2 + 4 + 5
            )  # ceil(size / 32 KiB) per partition
            assert c.stats()["pool"]["used"] == 0
    finally:
        d.stop()
    assert not sock.exists(), "the daemon removes its socket file on stop"
