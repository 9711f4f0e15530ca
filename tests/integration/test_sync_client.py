"""The blocking client over the daemon's Unix socket (the executor-local path)."""

from __future__ import annotations

import socket
import threading
from array import array
from pathlib import Path

import pytest

from shuffled.protocol.auth import app_token
from shuffled.protocol.codec import decode_all, encode
from shuffled.protocol.errors import ErrorCode
from shuffled.protocol.frames import HEADER, ErrorResponse, Hello, HelloAck, OpenMapOutput, Role
from shuffled_client import Client, InvalidRequest, MapOutputStateError, PartitionNotFound, ShuttingDown
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
            store = c.stats()["store"]
            assert store["open_map_outputs"] == 0
            held = store["stored_segments"]
            assert held == -(-300_000 // (32 << 10))  # the writes packed into full segments, all partitions together
            assert c.unregister_shuffle("sync-app", 4, propagate=False)["freed_segments"] == held
            assert c.stats()["pool"]["used"] == 0
    finally:
        d.stop()
    assert not sock.exists(), "the daemon removes its socket file on stop"


def test_write_takes_any_buffer_as_its_bytes_and_refuses_a_partition_outside_the_output() -> None:
    d = start_daemon("127.0.0.1", free_port(["127.0.0.1"]), "32M")
    try:
        with Client(d.addr, timeout=10) as c:
            w = c.open_writer("buffers-app", 1, 0, 5, 2)
            w.write(0, b"ab")
            w.write(0, bytearray(b"cd"))
            w.write(1, memoryview(array("I", [1, 2])))  # its 8 bytes, not its 2 items
            w.write(1, memoryview(b"xyz")[1:])
            for partition in (2, -1):
                with pytest.raises(InvalidRequest, match="outside"):
                    w.write(partition, b"no such partition")
            assert w.commit() == [4, 10]
            with pytest.raises(MapOutputStateError):
                w.write(0, b"late")
            assert c.read("buffers-app", 1, 1, 2, {"": [5]}).read_all() == array("I", [1, 2]).tobytes() + b"yz"
            c.unregister_shuffle("buffers-app", 1)
    finally:
        d.stop()


def _frame(conn: socket.socket) -> bytes:
    """One whole frame off a blocking socket."""
    data = b""
    while len(data) < HEADER.size or len(data) < HEADER.size + int.from_bytes(data[:4], "big"):
        chunk = conn.recv(65536)
        assert chunk, "the client closed the connection"
        data += chunk
    return data


def test_replicas_reach_the_daemon_in_the_open_and_bad_values_never_leave() -> None:
    """`replicas=` is OpenMapOutput's `replicas` key, after the token (PROTOCOL.md §7.8); a value the daemon
    would find malformed (fatal for the connection) is refused before anything is sent. Against a daemon that
    answers the open with SHUTTING_DOWN, as a draining daemon does, so the bytes are the client's own."""
    opened: list[bytes] = []
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(10)
        node = f"127.0.0.1:{server.getsockname()[1]}"

        def serve() -> None:
            conn, _ = server.accept()
            with conn:
                conn.settimeout(10)
                assert isinstance(decode_all(_frame(conn))[0], Hello)
                conn.sendall(encode(HelloAck(Role.DAEMON, info={"node": node, "segment_size": 32768})))
                raw = _frame(conn)
                opened.append(raw)
                (request,) = decode_all(raw)
                assert isinstance(request, OpenMapOutput)
                conn.sendall(encode(ErrorResponse(request.writer, ErrorCode.SHUTTING_DOWN, "draining")))
                conn.recv(1)  # until the client closes

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        with Client(node, timeout=10, app_secret="s") as c:
            for bad in (0, 5, True, 2.0):
                with pytest.raises(ValueError, match="replicas"):
                    c.open_writer("r-app", 1, 0, 7, 3, replicas=bad)  # type: ignore[arg-type]
            with pytest.raises(ShuttingDown, match="draining") as refused:
                c.open_writer("r-app", 1, 0, 7, 3, replicas=2)
            assert refused.value.retryable
        thread.join(10)
    (frame,) = decode_all(opened[0])
    assert isinstance(frame, OpenMapOutput) and (frame.replicas, frame.replica_of, frame.app_key) == (2, None, None)
    token = app_token(b"s", "r-app")  # what a client with app secret "s" sends about "r-app"
    assert opened[0] == encode(OpenMapOutput(frame.writer, "r-app", 1, 0, 7, 3, token=token, replicas=2))
    assert opened[0].index(b"token") < opened[0].index(b"replicas")


def test_a_daemon_takes_a_push_that_asks_for_copies() -> None:
    """A lone daemon has nowhere to copy to: the push asking for two copies still commits and reads back."""
    d = start_daemon("127.0.0.1", free_port(["127.0.0.1"]), "32M", [])
    try:
        with Client(d.addr, timeout=10) as c:
            w = c.open_writer("r-app", 2, 0, 8, 2, replicas=2)
            w.write(1, payload(8, 1, 70_000))
            assert w.commit() == [0, 70_000]
            with c.read("r-app", 2, 0, 2, {"": [8]}) as reader:
                assert bytes(reader.read_all()) == payload(8, 1, 70_000)
            c.unregister_shuffle("r-app", 2, propagate=False)
    finally:
        d.stop()
