"""Authenticated data connections to other daemons: dialled, or reused from the idle pool.

The asyncio side of :mod:`.idle_pool`: it dials, closes what the pool hands back, and keeps one
timer armed at the pool's next expiry (a timer, not a task: nothing to own). A member that
joins gets one standing connection at once (``warm``): measured on emulated 1 Gbit/s links, a
handshake dialled while the source is already receiving waits behind that traffic in its
link's queue, and a 1 MiB broadcast chain stalls up to 8 ms on one such dial. A connection given
back enters its IDLE phase, whose handlers refuse anything its source sends unasked, and leaves
the pool the moment it closes, so a pull takes a closed one only in the instant before the loop
hears of it; the fetcher then dials afresh rather than blaming the source (docs/design.md §3,
"Data connections").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from hoplite_client.net.handshake import Identity, dial, refused
from hoplite_client.net.protocol import FrameProtocol, Phase
from hoplite_client.wire.errors import HopliteError, RemoteProtocolError
from hoplite_client.wire.frames import Frame
from hoplite_client.wire.messages import DataStream
from hoplited.tasks import Tasks
from hoplited.transfer.idle_pool import IdlePool

log = logging.getLogger("hoplited.transfer")

# Idle connections kept per member: as many as pulls from one source overlap, so a burst does
# not dial again. A trio's member pulls up to six at once from its chains' predecessor (three
# thirds of the early partial sum, three of the result); with four kept, each allreduce dials
# again, 56 of 504 pulls in ten runs (docs/design.md §3, "Data connections").
IDLE_PER_SOURCE = 8
# Closed after this long unused: a member pulled from once in a while keeps nothing open.
IDLE_TIMEOUT = 30.0
# Standing connections per member, never closed for idleness (only at its death).
STANDING = 1
# Idle connections kept ready per member pulled from: a take that leaves fewer dials one more
# in the background, so that the next pull that overlaps does not dial on its critical path.
SPARE = 1


class DataConnections:
    """Data connections to members, kept idle between pulls."""

    def __init__(self, identity: Identity, tasks: Tasks, is_alive: Callable[[str], bool],
                 per_source: int = IDLE_PER_SOURCE, idle_timeout: float = IDLE_TIMEOUT,
                 standing: int = STANDING, spare: int = SPARE) -> None:
        self._identity = identity
        self._tasks = tasks
        self._is_alive = is_alive  # a connection dialled ahead too late is not kept
        self._pool: IdlePool[FrameProtocol] = IdlePool(per_source, idle_timeout, standing,
                                                       max(spare, standing))
        self._sweep: asyncio.TimerHandle | None = None
        self._closed = False
        # what each idle connection runs when it closes: leave the pool
        self._on_lost: dict[FrameProtocol, Callable[[BaseException | None], None]] = {}
        self._addresses: dict[str, tuple[str, int]] = {}  # each member dialled: host, port

    def __len__(self) -> int:
        """How many idle connections are kept (``hoplite status``, tests)."""
        return len(self._pool)

    def take(self, node: str, host: str, port: int) -> FrameProtocol | None:
        """An open idle connection to the member ``node`` at ``host:port``, now the caller's
        (None: dial one). If that leaves it too few, one more is dialled in the background."""
        loop = asyncio.get_running_loop()
        conn, stale = self._pool.take(node, loop.time(), _open)
        self._close(stale)
        self._arm(loop)
        if conn is not None:
            conn.on_lost.remove(self._on_lost.pop(conn))
        self.warm(node, host, port)
        return conn

    async def dial(self, host: str, port: int) -> FrameProtocol:
        """A new authenticated data connection to the member at ``host:port``."""
        protocol, _ = await dial(host, port, "data", self._identity)
        protocol.ack_quickly()  # the dialling side is the one that receives object streams
        return protocol

    def warm(self, node: str, host: str, port: int) -> None:
        """Dial one more connection to ``node`` in the background if it has fewer idle than
        the pool keeps spare (also when it joins: its standing connection). If the dial
        fails, the next pull from it dials, as without one."""
        self._addresses[node] = (host, port)
        if self._closed or not self._pool.refill(node):
            return

        async def dial_spare() -> None:
            try:
                protocol = await self.dial(host, port)
            finally:
                self._pool.dialled(node)
            if self._is_alive(node):
                self.give_back(node, protocol)
            else:
                protocol.close()

        def failed(exc: BaseException) -> None:
            if isinstance(exc, HopliteError):
                log.info("no spare data connection to %s: %s", node, exc)
            else:
                log.error("dialling a spare data connection to %s crashed", node,
                          exc_info=exc)

        self._tasks.spawn(dial_spare(), name=f"warm-{node}", on_error=failed)

    def probe(self, node: str, host: str, port: int, refused_by: Callable[[str], None]) -> None:
        """A stream from ``node`` broke off: dial it once in the background. Refused means
        its process is gone, and ``refused_by(node)`` lets its liveness declare it dead at
        once, as a pull's refused dial does, instead of after the heartbeat timeout; an
        answer gives the pool a fresh connection."""
        if self._closed:
            return

        async def dial_once() -> None:
            try:
                protocol = await self.dial(host, port)
            except HopliteError as exc:
                if refused(exc):
                    refused_by(node)
                return
            if self._is_alive(node):
                self.give_back(node, protocol)
            else:
                protocol.close()

        self._tasks.spawn(dial_once(), name=f"probe-{node}")

    def give_back(self, node: str, protocol: FrameProtocol) -> None:
        """``protocol``'s stream ended cleanly (nothing more will arrive): keep it idle."""
        if self._closed or not _open(protocol):
            protocol.close()
            return
        loop = asyncio.get_running_loop()

        def unasked(frame: Frame[Any]) -> None:
            protocol.abort(RemoteProtocolError(
                f"{node} sent {type(frame.msg).__name__} on an idle data connection"))

        def unasked_stream(msg: DataStream, length: int) -> memoryview:
            raise RemoteProtocolError(f"{node} streamed {length} bytes on an idle data "
                                      f"connection")

        protocol.enter(Phase.IDLE, handler=unasked, sink=unasked_stream)

        def lost(_: BaseException | None) -> None:
            self._on_lost.pop(protocol, None)
            # a kept connection cut under a live member is dialled again: the next pull may
            # have counted on it when it left no spare
            address = self._addresses.get(node)
            if self._pool.forget(node, protocol) and address and self._is_alive(node):
                self.warm(node, *address)

        self._on_lost[protocol] = lost
        protocol.on_lost.append(lost)
        self._close(self._pool.put(node, protocol, loop.time()))
        self._arm(loop)

    def drop(self, node: str) -> None:
        """``node`` died or fell silent: close its idle connections."""
        self._close(self._pool.drop(node))
        self._addresses.pop(node, None)

    def close(self) -> None:
        """At shutdown: close every idle connection and keep none from now on."""
        self._closed = True
        if self._sweep is not None:
            self._sweep.cancel()
        self._close(self._pool.drop_all())

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        """Keep the sweep timer at the pool's next expiry."""
        when = self._pool.next_expiry()
        if self._sweep is not None:
            if when is not None and self._sweep.when() == when:
                return
            self._sweep.cancel()
            self._sweep = None
        if when is not None:
            self._sweep = loop.call_at(when, self._expire)

    def _expire(self) -> None:
        loop = asyncio.get_running_loop()
        self._sweep = None
        self._close(self._pool.expire(loop.time()))
        self._arm(loop)

    def _close(self, protocols: list[FrameProtocol]) -> None:
        """Close connections the pool let go of (their close callbacks go with them)."""
        for protocol in protocols:
            lost = self._on_lost.pop(protocol, None)
            if lost is not None:
                protocol.on_lost.remove(lost)
            protocol.close()


def _open(protocol: FrameProtocol) -> bool:
    return not protocol.closed.done() and (protocol.transport is None
                                           or not protocol.transport.is_closing())
