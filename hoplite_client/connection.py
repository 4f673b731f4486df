"""asyncio adapter around the sans-I/O frame codec, shared by the client and the daemon.

:class:`FrameProtocol` is a ``BufferedProtocol``: the kernel writes each frame part straight
into the buffer the :class:`~hoplite_client.wire.FrameReader` names (for object streams, the
object's own memory). :class:`Channel` adds request ids: every request gets a future, and all
of them fail with :class:`ConnectionLostError` the moment the connection closes.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Any, Callable, Optional

from .errors import (ConnectionLostError, HopliteError, HopliteTimeoutError, ProtocolError,
                     RemoteProtocolError, error_from_wire)
from .wire import BadFrame, Frame, FrameReader, encode
from .wire.frames import StreamSink
from .wire.messages import Error

log = logging.getLogger("hoplite.connection")

# Bytes queued in the transport before a sender waits: a few socket buffers' worth keeps the
# link busy without holding much memory.
WRITE_HIGH_WATER = 4 * 1024 * 1024
WRITE_LOW_WATER = 1024 * 1024

FrameHandler = Callable[[Frame], None]


class FrameProtocol(asyncio.BufferedProtocol):
    """Delivers decoded frames to ``handler``; reports streamed progress to ``on_stream``."""

    def __init__(self, handler: Optional[FrameHandler] = None, name: str = "conn",
                 on_made: Optional[Callable[["FrameProtocol"], None]] = None) -> None:
        self.name = name
        self._on_made = on_made
        self.reader = FrameReader()
        self._handler = handler
        self.on_stream: Optional[Callable[[int], None]] = None
        self.on_lost: list[Callable[[Optional[BaseException]], None]] = []
        self.transport: Optional[asyncio.BaseTransport] = None
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._can_write = asyncio.Event()
        self._can_write.set()
        self._inbox: asyncio.Queue[Frame] = asyncio.Queue()

    @property
    def handler(self) -> Optional[FrameHandler]:
        return self._handler

    @handler.setter
    def handler(self, handler: Optional[FrameHandler]) -> None:
        """Install the frame handler; frames that arrived before it are handed over first."""
        self._handler = handler
        while handler is not None and not self._inbox.empty():
            handler(self._inbox.get_nowait())

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        transport.set_write_buffer_limits(WRITE_HIGH_WATER, WRITE_LOW_WATER)  # type: ignore[attr-defined]
        if self._on_made is not None:
            self._on_made(self)

    def set_stream_sink(self, sink: Optional[StreamSink]) -> None:
        self.reader._sink = sink

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

    async def next_frame(self, timeout: float) -> Frame:
        """The next frame while no handler is installed (handshakes); bounded by ``timeout``."""
        get = asyncio.ensure_future(self._inbox.get())
        done, _ = await asyncio.wait({get, self.closed}, timeout=timeout,
                                     return_when=asyncio.FIRST_COMPLETED)
        if get in done:
            return get.result()
        get.cancel()
        if self.closed.done():
            raise ConnectionLostError(f"{self.name}: connection closed during handshake")
        raise HopliteTimeoutError(f"{self.name}: no answer within {timeout}s")

    def send(self, msg: Any, payload: Any = None) -> None:
        """Queue one frame; the payload is sent from its own memory (vectored write, no join)."""
        if self.transport is None or self.transport.is_closing():
            raise ConnectionLostError(f"{self.name}: connection is closed")
        self.transport.writelines(encode(msg, payload))  # type: ignore[attr-defined]

    def write_raw(self, data: memoryview) -> None:
        """Queue raw stream bytes (a streamed payload's next slice)."""
        if self.transport is None or self.transport.is_closing():
            raise ConnectionLostError(f"{self.name}: connection is closed")
        self.transport.write(data)  # type: ignore[attr-defined]

    async def flush(self) -> None:
        """Wait until every queued byte was handed to the kernel (buffers may then be reused)."""
        if self.transport is not None and not self.transport.is_closing():
            self.transport.set_write_buffer_limits(0, 0)  # type: ignore[attr-defined]
            await self.drain()
            self.transport.set_write_buffer_limits(WRITE_HIGH_WATER,  # type: ignore[attr-defined]
                                                   WRITE_LOW_WATER)

    async def drain(self) -> None:
        """Wait until the transport's queue is below its high-water mark."""
        if not self._can_write.is_set():
            waiter = asyncio.ensure_future(self._can_write.wait())
            await asyncio.wait({waiter, self.closed}, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
        if self.closed.done():
            raise ConnectionLostError(f"{self.name}: connection closed")

    def pause_writing(self) -> None:
        self._can_write.clear()

    def resume_writing(self) -> None:
        self._can_write.set()

    def abort(self, exc: Optional[BaseException] = None) -> None:
        """Close now (queued data is dropped): used after an error mid-message."""
        if self.transport is not None:
            self.transport.abort()  # type: ignore[attr-defined]
        self.connection_lost(exc)

    def close(self) -> None:
        """Close after queued data is flushed."""
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Optional[BaseException]) -> None:
        if self.closed.done():
            return
        self.closed.set_result(None)
        self._can_write.set()
        for callback in self.on_lost:
            callback(exc)


class Channel:
    """Request/reply over a :class:`FrameProtocol`: replies matched to requests by ``rid``."""

    def __init__(self, protocol: FrameProtocol, reply_kinds: frozenset[type],
                 on_request: Optional[FrameHandler] = None) -> None:
        self.protocol = protocol
        self._reply_kinds = reply_kinds
        self._on_request = on_request
        self._rids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Frame]] = {}
        self._lost: Optional[HopliteError] = None
        protocol.handler = self._dispatch
        protocol.on_lost.append(self._fail_all)

    @property
    def is_open(self) -> bool:
        return self._lost is None

    async def request(self, make: Callable[[int], Any], payload: Any = None,
                      timeout: Optional[float] = None) -> Frame:
        """Send ``make(rid)`` and wait for its reply; an ``Error`` reply raises its typed error."""
        if self._lost is not None:
            raise self._lost
        rid = next(self._rids)
        fut: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        try:
            self.protocol.send(make(rid), payload)
            frame = await asyncio.wait_for(fut, timeout) if timeout is not None else await fut
        except asyncio.TimeoutError:
            raise HopliteTimeoutError(f"{self.protocol.name}: no reply within {timeout}s") from None
        finally:
            self._pending.pop(rid, None)
        if isinstance(frame.msg, Error):
            raise error_from_wire(frame.msg.code, frame.msg.message, frame.msg.data)
        return frame

    def notify(self, msg: Any, payload: Any = None) -> None:
        """Send a one-way message (no reply expected)."""
        if self._lost is not None:
            raise self._lost
        self.protocol.send(msg, payload)

    def _dispatch(self, frame: Frame) -> None:
        msg = frame.msg
        if type(msg) in self._reply_kinds:
            fut = self._pending.get(msg.rid)
            if fut is not None and not fut.done():
                fut.set_result(frame)
            elif isinstance(msg, Error):
                log.warning("%s: peer reported %s: %s", self.protocol.name, msg.code, msg.message)
        elif self._on_request is not None:
            self._on_request(frame)
        else:
            log.warning("%s: unexpected %s", self.protocol.name, type(msg).__name__)
            self.protocol.send(Error(rid=getattr(msg, "rid", 0), code="protocol",
                                     message=f"unexpected {type(msg).__name__}", data={}))

    def _fail_all(self, exc: Optional[BaseException]) -> None:
        self._lost = ConnectionLostError(f"{self.protocol.name}: connection lost"
                                         + (f" ({exc})" if exc else ""))
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(self._lost)
        self._pending.clear()

    def close(self) -> None:
        self.protocol.close()


def remote_error(rid: int, exc: Exception) -> Error:
    """The ``Error`` reply to request ``rid`` for ``exc`` (typed errors keep code and data)."""
    if isinstance(exc, HopliteError):
        data = {k: v for k, v in exc.data.items() if isinstance(v, (str, int, float, bool))}
        code = exc.code if not isinstance(exc, RemoteProtocolError) else "protocol"
        return Error(rid=rid, code=code, message=exc.message or str(exc), data=data)
    return Error(rid=rid, code="internal", message=f"{type(exc).__name__}: {exc}", data={})
