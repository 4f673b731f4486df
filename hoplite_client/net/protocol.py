"""asyncio adapter around the sans-I/O frame codec, shared by the client and the daemon.

:class:`FrameProtocol` is a ``BufferedProtocol``: the kernel writes each frame part straight
into the buffer the :class:`~hoplite_client.wire.FrameReader` names (for object streams, the
object's own memory). Request ids live one layer up, in :mod:`.channel`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, cast

from hoplite_client.wire.errors import ConnectionLostError, HopliteTimeoutError, ProtocolError
from hoplite_client.wire.frames import BadFrame, Frame, FrameReader, Payload, StreamSink, encode
from hoplite_client.wire.messages import Error, WireMessage

log = logging.getLogger("hoplite.protocol")

# Bytes queued in the transport before a sender waits: a few socket buffers' worth keeps the
# link busy without holding much memory.
WRITE_HIGH_WATER = 4 * 1024 * 1024
WRITE_LOW_WATER = 1024 * 1024

# Takes every frame of the connection. The frame is typed ``Frame[Any]`` on purpose: whoever
# installs the handler knows which kinds its connection carries (a fetcher's handler takes
# ``Frame[DataStream | Error]``), and a parameter typed ``Frame[WireMessage]`` would refuse it.
FrameHandler = Callable[[Frame[Any]], None]


class FrameProtocol(asyncio.BufferedProtocol):
    """Delivers decoded frames to ``handler``; reports streamed progress to ``on_stream``."""

    def __init__(self, handler: FrameHandler | None = None, name: str = "conn",
                 on_made: Callable[[FrameProtocol], None] | None = None) -> None:
        self.name = name
        self._on_made = on_made
        self.reader = FrameReader()
        self._handler = handler
        self.on_stream: Callable[[int], None] | None = None
        self.on_lost: list[Callable[[BaseException | None], None]] = []
        self.transport: asyncio.Transport | None = None
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._can_write = asyncio.Event()
        self._can_write.set()
        self._inbox: asyncio.Queue[Frame[WireMessage]] = asyncio.Queue()

    @property
    def handler(self) -> FrameHandler | None:
        return self._handler

    @handler.setter
    def handler(self, handler: FrameHandler | None) -> None:
        """Install the frame handler; frames that arrived before it are handed over first."""
        self._handler = handler
        while handler is not None and not self._inbox.empty():
            handler(self._inbox.get_nowait())

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream connection's transport is a read-write one. A cast, not an isinstance check:
        # uvloop's transports do not derive from asyncio.Transport.
        self.transport = cast(asyncio.Transport, transport)
        self.transport.set_write_buffer_limits(WRITE_HIGH_WATER, WRITE_LOW_WATER)
        if self._on_made is not None:
            self._on_made(self)

    def set_stream_sink(self, sink: StreamSink | None) -> None:
        self.reader.expect_stream(sink)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.reader.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        try:
            events = self.reader.buffer_updated(nbytes)
        except ProtocolError as exc:
            log.warning("%s: closing after protocol error: %s", self.name, exc)
            self.send(Error(rid=0, code=exc.code, message=str(exc), data={}))
            self.abort(exc)
            return
        for event in events:
            if isinstance(event, BadFrame):
                log.warning("%s: rejected a frame: %s", self.name, event.error)
                self.send(Error(rid=event.rid or 0, code=event.error.code,
                                message=str(event.error), data={}))
            elif self._handler is not None:
                self._handler(event)
            else:
                self._inbox.put_nowait(event)
        if self.reader.streaming and self.on_stream is not None:
            self.on_stream(self.reader.payload_received)

    async def next_frame(self, timeout: float) -> Frame[WireMessage]:
        """The next frame while no handler is installed (handshakes); bounded by ``timeout``."""
        get = asyncio.ensure_future(self._inbox.get())
        waiters: set[asyncio.Future[Any]] = {get, self.closed}
        try:
            done, _ = await asyncio.wait(waiters, timeout=timeout,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not get.done():  # timed out, closed, or our caller was cancelled mid-handshake
                get.cancel()
        if get in done:
            return get.result()
        if self.closed.done():
            raise ConnectionLostError(f"{self.name}: connection closed during handshake")
        raise HopliteTimeoutError(f"{self.name}: no answer within {timeout}s")

    def send(self, msg: WireMessage, payload: Payload | None = None) -> None:
        """Queue one frame; the payload is sent from its own memory (vectored write, no join)."""
        if self.transport is None or self.transport.is_closing():
            raise ConnectionLostError(f"{self.name}: connection is closed")
        self.transport.writelines(encode(msg, payload))

    def write_raw(self, data: memoryview) -> None:
        """Queue raw stream bytes (a streamed payload's next slice)."""
        if self.transport is None or self.transport.is_closing():
            raise ConnectionLostError(f"{self.name}: connection is closed")
        self.transport.write(data)

    async def flush(self) -> None:
        """Wait until every queued byte was handed to the kernel (buffers may then be reused)."""
        if self.transport is not None and not self.transport.is_closing():
            self.transport.set_write_buffer_limits(0, 0)
            await self.drain()
            self.transport.set_write_buffer_limits(WRITE_HIGH_WATER, WRITE_LOW_WATER)

    async def drain(self) -> None:
        """Wait until the transport's queue is below its high-water mark."""
        if not self._can_write.is_set():
            waiter = asyncio.ensure_future(self._can_write.wait())
            waiters: set[asyncio.Future[Any]] = {waiter, self.closed}
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
        if self.closed.done():
            raise ConnectionLostError(f"{self.name}: connection closed")

    def pause_writing(self) -> None:
        self._can_write.clear()

    def resume_writing(self) -> None:
        self._can_write.set()

    def abort(self, exc: BaseException | None = None) -> None:
        """Close now (queued data is dropped): used after an error mid-message."""
        if self.transport is not None:
            self.transport.abort()
        self.connection_lost(exc)

    def close(self) -> None:
        """Close after queued data is flushed."""
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self.closed.done():
            return
        self.closed.set_result(None)
        self._can_write.set()
        for callback in self.on_lost:
            callback(exc)
