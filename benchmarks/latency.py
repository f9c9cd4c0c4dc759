"""A TCP relay that adds a round-trip time, to time SSH tools as over a real network: this
machine's kernel has no netem, so `tc` cannot delay loopback traffic.

Each direction hands every chunk on half the round trip after it arrived, in order, so every
request/reply exchange pays the full round trip, as on a link with that latency. Connecting to
the relay itself is not delayed (a real TCP handshake would add one round trip per connection).
"""

from __future__ import annotations

import asyncio
import threading


class DelayedRelay:
    """Listens on 127.0.0.1 (`port` once started) and relays each connection to `target`."""

    def __init__(self, target: tuple[str, int], rtt_s: float):
        self.target, self.one_way_s = target, rtt_s / 2
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped: asyncio.Event | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> DelayedRelay:
        ready = threading.Event()
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._serve(ready)), daemon=True, name="delayed-relay"
        )
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the delaying relay did not start")
        return self

    def stop(self) -> None:
        """Close the listener and every relayed connection; again is a no-op."""
        if self._thread and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stopped.set)
            self._thread.join(10)

    async def _serve(self, ready: threading.Event) -> None:
        self._loop, self._stopped = asyncio.get_running_loop(), asyncio.Event()
        connections: set[asyncio.Task] = (
            set()
        )  # asyncio's stream server drops a connection's task once its client closes

        async def relay(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            connections.add(task)
            try:
                await self._relay(client_reader, client_writer)
            except asyncio.CancelledError:
                pass  # the relay is stopping
            finally:
                connections.discard(task)

        server = await asyncio.start_server(relay, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        ready.set()
        async with server:
            await self._stopped.wait()
            for task in connections:
                task.cancel()
            await asyncio.gather(*connections, return_exceptions=True)

    async def _relay(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        writers = [client_writer]
        try:
            server_reader, server_writer = await asyncio.open_connection(*self.target)
            writers.append(server_writer)
            await asyncio.gather(
                self._pump(client_reader, server_writer),
                self._pump(server_reader, client_writer),
                return_exceptions=True,
            )
        finally:
            for writer in writers:
                writer.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Copy one direction, each chunk `one_way_s` late; pass the end of the stream on too."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()

        async def deliver() -> None:
            while (item := await queue.get()) is not None:
                due, data = item
                await asyncio.sleep(due - loop.time())
                writer.write(data)
                await writer.drain()
            writer.write_eof()

        delivery = asyncio.create_task(deliver())
        try:
            while data := await reader.read(65536):
                queue.put_nowait((loop.time() + self.one_way_s, data))
            queue.put_nowait(None)
            await delivery
        finally:
            delivery.cancel()  # when the connection broke or the relay stops
