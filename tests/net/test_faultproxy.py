"""The fault-injecting proxy of the cluster tests, against a plain asyncio echo server as target."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import time
from collections.abc import AsyncIterator

import pytest
from faultproxy import FaultProxy

MiB = 1024 * 1024


class Echo:
    """The target: echoes every byte back, counts them, and answers EOF with EOF."""

    def __init__(self) -> None:
        self.received = 0
        self._writers: list[asyncio.StreamWriter] = []
        self._done: list[asyncio.Future[None]] = []
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> None:
        """Listen on host:port."""
        self._server = await asyncio.start_server(self._handle, host, port)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Echo one connection until EOF or an error; stop() waits for it to end."""
        done = asyncio.get_running_loop().create_future()
        self._writers.append(writer)
        self._done.append(done)
        try:
            while data := await reader.read(64 * 1024):
                self.received += len(data)
                writer.write(data)
                await writer.drain()
            writer.write_eof()
        except OSError:
            pass
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            done.set_result(None)

    async def stop(self) -> None:
        """Close the listener and abort every connection; wait for their handlers to end."""
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()
        for writer in self._writers:
            writer.transport.abort()
        await asyncio.gather(*self._done)


@pytest.fixture
async def proxy() -> AsyncIterator[FaultProxy]:
    """A started proxy 127.0.0.2:P -> 127.0.0.1:P, stopped at teardown (stop() is idempotent)."""
    proxy = await FaultProxy.free_pair()
    yield proxy
    await proxy.stop()


@pytest.fixture
async def echo(proxy: FaultProxy) -> AsyncIterator[Echo]:
    """The echo target behind the proxy, on 127.0.0.1 at the proxy's port."""
    echo = Echo()
    await echo.start(proxy.target_host, proxy.port)
    yield echo
    await echo.stop()


async def open_client(proxy: FaultProxy) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to the proxy's listening side, as a peer daemon would open it."""
    return await asyncio.open_connection(proxy.listen_host, proxy.port)


async def round_trip(proxy: FaultProxy, payload: bytes) -> bytes:
    """Send payload then EOF through the proxy; return all that comes back before EOF."""
    reader, writer = await open_client(proxy)

    async def send() -> None:
        writer.write(payload)
        await writer.drain()
        writer.write_eof()

    try:
        _, back = await asyncio.gather(send(), reader.read())
    finally:
        writer.close()
        await writer.wait_closed()
    return back


async def closed_by_peer(reader: asyncio.StreamReader) -> bool:
    """True once the peer closed the connection (EOF or reset), within a generous bound."""
    try:
        async with asyncio.timeout(5):
            while await reader.read(64 * 1024):
                pass
    except ConnectionError:
        pass
    return True


async def test_bytes_pass_unchanged_both_ways(proxy: FaultProxy, echo: Echo) -> None:
    """A few MiB and a half-close go out and come back intact; the counters see them."""
    payload = os.urandom(5 * MiB + 123)
    back = await round_trip(proxy, payload)
    assert hashlib.sha256(back).digest() == hashlib.sha256(payload).digest()
    assert echo.received == len(payload)
    assert proxy.bytes_forwarded == 2 * len(payload)
    assert proxy.connections == 1


async def test_rate_limit_slows_a_transfer(proxy: FaultProxy, echo: Echo) -> None:
    """2 MiB each way at 4 MiB/s per direction cannot take much less than half a second."""
    proxy.set_rate(4 * MiB)
    started = time.monotonic()
    back = await round_trip(proxy, bytes(2 * MiB))
    elapsed = time.monotonic() - started
    assert len(back) == 2 * MiB
    assert elapsed >= 0.35, elapsed


async def test_lifting_the_rate_wakes_waiting_transfers(proxy: FaultProxy, echo: Echo) -> None:
    """A transfer that would take a minute at the old rate finishes soon after set_rate(None)."""
    proxy.set_rate(16 * 1024)
    transfer = asyncio.create_task(round_trip(proxy, bytes(MiB)))
    await proxy.forwarded(16 * 1024)  # under way: a minute to go
    assert not transfer.done()
    proxy.set_rate(None)
    async with asyncio.timeout(10):
        assert len(await transfer) == MiB


async def test_stall_holds_bytes_and_resume_releases_them(proxy: FaultProxy, echo: Echo) -> None:
    """While stalled nothing reaches the target, on old or new connections, and nothing closes."""
    old_reader, old_writer = await open_client(proxy)
    old_writer.write(b"warm")
    assert await old_reader.readexactly(4) == b"warm"
    proxy.stall()
    new_reader, new_writer = await open_client(proxy)
    for writer in (old_writer, new_writer):
        writer.write(b"ping")
        await writer.drain()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.5):
            await old_reader.read(1)
    assert echo.received == 4
    assert not old_reader.at_eof() and not new_reader.at_eof()
    assert not old_writer.is_closing() and not new_writer.is_closing()
    proxy.resume()
    async with asyncio.timeout(5):
        assert await old_reader.readexactly(4) == b"ping"
        assert await new_reader.readexactly(4) == b"ping"
    for writer in (old_writer, new_writer):
        writer.close()
        await writer.wait_closed()


async def test_forwarded_returns_once_that_many_bytes_have_passed(proxy: FaultProxy,
                                                                  echo: Echo) -> None:
    """A trigger at 1 MiB of a 2 MiB echo at 4 MiB/s a direction returns with the count
    reached and the transfer still under way; a trigger nothing reaches fails, saying so."""
    proxy.set_rate(4 * MiB)
    transfer = asyncio.create_task(round_trip(proxy, bytes(2 * MiB)))
    reached = await proxy.forwarded(MiB)
    assert MiB <= reached == proxy.bytes_forwarded < 2 * MiB + 256 * 1024
    assert not transfer.done()
    assert await proxy.forwarded(MiB) == proxy.bytes_forwarded  # reached already: at once
    async with asyncio.timeout(10):
        assert len(await transfer) == 2 * MiB
    with pytest.raises(AssertionError, match="bytes forwarded within"):
        await proxy.forwarded(5 * MiB, timeout=0.2)


async def test_cut_drops_connections_but_keeps_listening(proxy: FaultProxy, echo: Echo) -> None:
    """Clients see their connection closed at once; a new connection works as before."""
    reader, writer = await open_client(proxy)
    writer.write(b"hello")
    assert await reader.readexactly(5) == b"hello"
    await proxy.cut()
    assert await closed_by_peer(reader)
    writer.close()
    with contextlib.suppress(ConnectionError):
        await writer.wait_closed()
    assert await round_trip(proxy, b"again") == b"again"
    assert proxy.connections == 2


async def test_refused_target_closes_the_client(proxy: FaultProxy) -> None:
    """With nothing listening on the target port, the accepted client is closed, not left hanging."""
    reader, writer = await open_client(proxy)
    assert await closed_by_peer(reader)
    writer.close()
    with contextlib.suppress(ConnectionError):
        await writer.wait_closed()


async def test_stop_closes_everything_and_leaves_no_task(proxy: FaultProxy, echo: Echo) -> None:
    """stop() with a busy and a stalled connection: clients closed, no proxy task, no listener."""
    proxy.set_rate(64 * 1024)
    busy = asyncio.create_task(round_trip(proxy, bytes(4 * MiB)))
    await proxy.forwarded(16 * 1024)  # under way: a minute to go
    proxy.stall()
    reader, writer = await open_client(proxy)
    writer.write(b"x")
    await proxy.stop()
    assert await closed_by_peer(reader)
    async with asyncio.timeout(5):
        with contextlib.suppress(ConnectionError):
            await busy
    assert echo.received < 4 * MiB
    ours = [t for t in asyncio.all_tasks() if "FaultProxy" in t.get_coro().__qualname__]
    assert not ours
    with pytest.raises(ConnectionRefusedError):
        await open_client(proxy)
    writer.close()
    with contextlib.suppress(ConnectionError):
        await writer.wait_closed()
