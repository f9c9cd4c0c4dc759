"""The benchmarks' own machinery (the benchmarks themselves run on demand, not here)."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from benchmarks.latency import DelayedRelay


def _echo_server() -> socket.socket:
    """Echoes each connection until the client ends its side, then ends its own."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:  # closed
                return
            with client:
                while data := client.recv(65536):
                    client.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    return server


def test_the_relay_adds_the_round_trip_time_and_passes_the_end_of_the_stream():
    with _echo_server() as server:
        relay = DelayedRelay(server.getsockname(), rtt_s=0.2).start()
        try:
            with socket.create_connection(("127.0.0.1", relay.port)) as client:
                for size in (1, 300_000):  # one packet, then many: every chunk waits the same
                    started = time.monotonic()
                    client.sendall(b"x" * size)
                    received = b""
                    while len(received) < size:
                        received += client.recv(1 << 20)
                    assert received == b"x" * size and time.monotonic() - started >= 0.2
                client.shutdown(socket.SHUT_WR)
                assert client.recv(10) == b""  # the server saw the end, and its own end came back
            with socket.create_connection(("127.0.0.1", relay.port)) as idle:
                idle.sendall(b"still open when the relay stops")
                time.sleep(0.05)
                relay.stop()
                assert idle.recv(100) == b""  # closed by the relay
            with pytest.raises(ConnectionRefusedError):  # no longer listening
                socket.create_connection(("127.0.0.1", relay.port), timeout=5)
        finally:
            relay.stop()
