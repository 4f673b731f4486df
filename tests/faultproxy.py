"""A fault-injecting TCP proxy for cluster tests: slow, freeze or cut a node's links without root.

A daemon listens on 127.0.0.1:P and advertises 127.0.0.2 to its peers, so every peer connection
to it goes through a proxy listening on 127.0.0.2:P (Linux routes all of 127.0.0.0/8 to loopback).
The proxy can then limit the link to a known rate (so a kill lands mid-transfer), stall it (bytes
stop, sockets stay open, like a SIGSTOPped peer) or cut every connection mid-stream (a reset).
It counts the bytes it passes on, and ``forwarded(n)`` returns once n have passed: the trigger
a test kills, stalls or cuts on, at a known point of a transfer, however loaded the machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import time
from types import TracebackType

CHUNK = 64 * 1024  # the largest read: small enough that rate limiting stays smooth
# Kernel buffer of each proxied socket: bytes the proxy has not passed on must stay few, or a
# killed node's last megabytes would still trickle out of loopback buffers after its death.
SOCKET_BUFFER = 64 * 1024
PROXY_PORTS_FROM = 20000  # free_pair's ports: from here to the start of the ephemeral range


def _ephemeral_low() -> int:
    """The first port the kernel hands out by itself (ip_local_port_range)."""
    with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as ports:
        return int(ports.read().split()[0])


def _small_buffers(sock: socket.socket) -> None:
    """Bound the bytes the kernel holds for ``sock`` in either direction."""
    for option in (socket.SO_RCVBUF, socket.SO_SNDBUF):
        sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER)


class _Bucket:
    """Token bucket shared by every connection's pump in one direction: the link's bandwidth.

    Each pump reserves its bytes in arrival order (``granted``) and waits until the credit accrued
    at ``rate`` (``earned``) covers them, so concurrent connections share the rate fairly.
    """

    def __init__(self, rate: float | None) -> None:
        self.rate = rate
        self._granted = 0.0
        self._earned = 0.0
        self._stamp = time.monotonic()
        self._changed = asyncio.Event()

    def chunk(self) -> int:
        """Bytes to read at once: about 1/50 s of traffic, between 1 KiB and 64 KiB."""
        return CHUNK if self.rate is None else min(CHUNK, max(1024, int(self.rate / 50)))

    def _accrue(self) -> None:
        """Add the credit earned at the current rate since the last call."""
        now = time.monotonic()
        if self.rate is not None:  # an idle link banks at most one chunk of credit
            earned = self._earned + (now - self._stamp) * self.rate
            self._earned = min(earned, self._granted + self.chunk())
        self._stamp = now

    def set_rate(self, rate: float | None) -> None:
        """Change the rate (None: unlimited); waiting pumps recompute their wait at once."""
        if rate is not None and rate <= 0:
            raise ValueError(f"rate must be positive or None, not {rate}")
        self._accrue()
        if self.rate is None:
            self._earned = self._granted  # bytes sent while unlimited are paid for
        self.rate = rate
        self._changed.set()
        self._changed = asyncio.Event()

    async def take(self, n: int) -> None:
        """Wait until ``n`` more bytes may pass, behind every reservation made before."""
        self._accrue()
        self._granted += n
        target = self._granted
        while self.rate is not None and self._earned < target:
            changed = self._changed
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout((target - self._earned) / self.rate):
                    await changed.wait()
            self._accrue()


class FaultProxy:
    """Forwards listen_host:port to target_host:port, with runtime rate limit, stall and cut."""

    def __init__(self, listen_host: str, target_host: str, port: int = 0,
                 rate: float | None = None) -> None:
        self.listen_host = listen_host
        self.target_host = target_host
        self.port = port
        self.bytes_forwarded = 0  # both directions, every connection
        self.connections = 0  # accepted so far
        self._triggers: list[tuple[int, asyncio.Future[None]]] = []  # forwarded() waiting
        self._up = _Bucket(None)  # client -> target
        self._down = _Bucket(None)  # target -> client
        self.set_rate(rate)
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server: asyncio.Server | None = None
        self._conns: dict[asyncio.Task[None], list[asyncio.StreamWriter]] = {}

    @classmethod
    async def free_pair(cls, listen_host: str = "127.0.0.2", target_host: str = "127.0.0.1",
                        rate: float | None = None, attempts: int = 50) -> FaultProxy:
        """A started proxy on a port of listen_host whose twin on target_host is free.

        The port lies below the kernel's ephemeral range, so no other socket (a daemon's listener
        on port 0, an outgoing connection) can take the twin between this probe and the daemon's
        bind. Start the daemon with ``--listen {target_host}:{proxy.port} --advertise
        {listen_host}``.
        """
        low = _ephemeral_low()
        for port in random.sample(range(PROXY_PORTS_FROM, low), attempts):
            with socket.socket() as probe:
                try:
                    probe.bind((target_host, port))
                except OSError:
                    continue
            proxy = cls(listen_host, target_host, port, rate)
            try:
                await proxy.start()
            except OSError:
                continue
            return proxy
        raise OSError(f"no port below {low} free on both {listen_host} and {target_host}")

    async def start(self) -> None:
        """Listen; if port was 0, ``.port`` becomes the one the system chose."""
        listener = socket.create_server((self.listen_host, self.port))
        _small_buffers(listener)  # accepted sockets inherit them
        self._server = await asyncio.start_server(self._accept, sock=listener, limit=CHUNK)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Close the listener and every connection; return once every task has ended."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        await self.cut()
        if server is not None:  # from Python 3.12 this waits for every connection to close
            await server.wait_closed()

    async def __aenter__(self) -> FaultProxy:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()

    async def forwarded(self, count: int, timeout: float = 120.0) -> int:
        """Wait until ``bytes_forwarded`` reaches ``count``; return it then. The proxy runs in
        the caller's event loop, so it passes at most a chunk or two more before the caller
        goes on: what the caller does next lands at that point of the transfer. An
        AssertionError after ``timeout`` s."""
        if self.bytes_forwarded < count:
            fut = asyncio.get_running_loop().create_future()
            self._triggers.append((count, fut))
            try:
                async with asyncio.timeout(timeout):
                    await fut
            except TimeoutError:
                raise AssertionError(f"{self.bytes_forwarded} of {count} bytes forwarded "
                                     f"within {timeout} s") from None
            finally:
                self._triggers = [(n, f) for n, f in self._triggers if f is not fut]
        return self.bytes_forwarded

    def _count(self, n: int) -> None:
        """``n`` more bytes passed on: wake the triggers they reach."""
        self.bytes_forwarded += n
        for at, fut in self._triggers:
            if at <= self.bytes_forwarded and not fut.done():
                fut.set_result(None)

    def set_rate(self, rate: float | None) -> None:
        """Limit each direction, shared by all connections, to ``rate`` bytes/s (None: no limit)."""
        self._up.set_rate(rate)
        self._down.set_rate(rate)

    def stall(self) -> None:
        """Stop forwarding in both directions on every connection, old and new; sockets stay open."""
        self._flowing.clear()

    def resume(self) -> None:
        """Undo stall(): bytes flow again."""
        self._flowing.set()

    async def cut(self) -> None:
        """Abort every current connection on both sides (peers see a reset); keep listening."""
        tasks = list(self._conns)
        for task, writers in self._conns.items():
            for writer in writers:
                writer.transport.abort()
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Count the connection and serve it in a task that cut() and stop() can reach."""
        if self._server is None:  # accepted just before stop() closed the listener
            writer.transport.abort()
            return
        self.connections += 1
        writers = [writer]
        task = asyncio.create_task(self._serve(reader, writers))
        self._conns[task] = writers
        task.add_done_callback(self._conns.pop)

    async def _serve(self, client: asyncio.StreamReader,
                     writers: list[asyncio.StreamWriter]) -> None:
        """Connect to the target, pump both ways until both EOF (close) or an error (abort both)."""
        clean = False
        try:
            sock = socket.socket()
            _small_buffers(sock)  # before connecting, so the window never grows past them
            sock.setblocking(False)
            try:
                await asyncio.get_running_loop().sock_connect(sock, (self.target_host, self.port))
                target, target_writer = await asyncio.open_connection(sock=sock, limit=CHUNK)
            except BaseException:  # refused, or cancelled by cut() or stop(), either step
                sock.close()
                raise
            writers.append(target_writer)
            async with asyncio.TaskGroup() as group:
                group.create_task(self._pump(client, target_writer, self._up))
                group.create_task(self._pump(target, writers[0], self._down))
            clean = True
        except* OSError:
            pass  # refused, or a reset on either side
        finally:
            for writer in writers:
                if clean:
                    writer.close()
                else:
                    writer.transport.abort()
            for writer in writers:
                with contextlib.suppress(OSError):
                    await writer.wait_closed()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    bucket: _Bucket) -> None:
        """Copy one direction, paced by bucket and held while stalled; pass EOF on."""
        while True:
            await self._flowing.wait()
            data = await reader.read(bucket.chunk())
            if not data:
                writer.write_eof()
                return
            await bucket.take(len(data))
            await self._flowing.wait()
            writer.write(data)
            self._count(len(data))
            await writer.drain()
