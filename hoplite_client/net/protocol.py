"""asyncio adapter around the sans-I/O frame codec, shared by the client and the daemon.

:class:`FrameProtocol` is a ``BufferedProtocol``: the kernel writes each frame part straight
into the buffer the :class:`~hoplite_client.wire.FrameReader` names (for object streams, the
object's own memory). Request ids live one layer up, in :mod:`.channel`.

A connection is in one :class:`Phase` at a time (a handshake, a request/reply channel, a stream
arriving, idle in a pool...), and the phase decides who takes its frames and where streamed
payloads land. :meth:`FrameProtocol.enter` is the one way to change it: it checks the move
against :data:`MOVES` and installs the phase's frame handler, stream sink and progress callback
together; the scope it returns moves the connection back to the phase before.

Over TLS (:mod:`.tls`) the same holds one step removed: the SSL layer decrypts each record
straight into the buffer ``get_buffer`` names (asyncio's and uvloop's SSL transports both
call it), so object bytes still land in place, decrypted once, with no staging copy.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
import socket
import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, cast

from hoplite_client.net.bulk_io import read_into, write_all
from hoplite_client.net.log_limit import limited
from hoplite_client.wire.errors import (
    ConnectionLostError,
    HopliteTimeoutError,
    LocalProtocolError,
    ProtocolError,
)
from hoplite_client.wire.frames import (
    HANDSHAKE_MAX_HEADER,
    MAX_HEADER,
    READ_AHEAD,
    BadFrame,
    Event,
    Frame,
    FrameReader,
    Payload,
    StreamSink,
    encode,
)
from hoplite_client.wire.messages import Error, WireMessage

log = logging.getLogger("hoplite.protocol")
# A peer can send bad frames, or break the protocol and connect again, in a loop.
_rejected = limited(log, "rejected frame")
_broken = limited(log, "protocol error")

# Bytes queued in the transport before a sender waits: a few socket buffers' worth keeps the
# link busy without holding much memory.
WRITE_HIGH_WATER = 4 * 1024 * 1024
WRITE_LOW_WATER = 1024 * 1024
# Linux's option to acknowledge at once (None elsewhere: nothing to turn off there).
QUICKACK: int | None = getattr(socket, "TCP_QUICKACK", None)

# Over TLS a write is encrypted at once into a buffer that grows to hold it, then copied out:
# an 8 MiB slice encrypted at 0.8 GB/s here, 256 KiB pieces at 2.1 GB/s. So bytes are handed
# to TLS a piece at a time while its buffer stays small: a 1 GiB get runs at 1.1 GB/s this
# way, against 0.5-0.85 GB/s with whole slices (docs/security.md, "Cost").
TLS_WRITE_PIECE = 256 * 1024
TLS_WRITE_HIGH_WATER = 512 * 1024
TLS_WRITE_LOW_WATER = 128 * 1024

# A payload smaller than this goes through the transport even when sent in bulk: handing it
# to a worker thread costs more than the loop's copy (a 1 MiB put takes 0.55-0.65 ms in a
# thread, 0.35-0.4 ms copied by the loop).
BULK_MIN = 4 * 1024 * 1024
# The socket buffer of a connection that sends in bulk: on a Unix socket it bounds the bytes
# the receiver finds queued at each read, so a receiver whose event loop is busy takes a
# large put in fewer reads (about 200 KB each with Linux's default).
BULK_SOCKET_BUFFER = 4 * 1024 * 1024

# Takes every frame of the connection. The frame is typed ``Frame[Any]`` on purpose: whoever
# installs the handler knows which kinds its connection carries (a fetcher's handler takes
# ``Frame[DataStream | Error]``), and a parameter typed ``Frame[WireMessage]`` would refuse it.
FrameHandler = Callable[[Frame[Any]], None]
# Hears how many bytes of the streamed payload arriving now are in, after each read.
Progress = Callable[[int], None]


class Phase(enum.Enum):
    """What a connection is doing now, which decides who takes what arrives on it."""

    HANDSHAKE = "handshake"  # no handler: frames queue up for next_frame
    CHANNEL = "channel"  # requests and replies (:mod:`.channel`)
    CLIENT = "client"  # a daemon's channel to a local client, whose puts stream in
    SERVING = "serving"  # an accepted data connection answering pulls
    RECEIVING = "receiving"  # an object stream lands in its sink
    OPENING = "opening"  # we opened a stream of ours: its answer is read with next_frame
    SENDING = "sending"  # our stream goes out: nothing may arrive
    IDLE = "idle"  # kept in a pool between uses: nothing may arrive


# The moves each phase allows. A dialled data connection goes from its handshake to the pool,
# or to a stream it receives or opens, and back to the pool after; an accepted one serves pulls
# and lends itself to a stream its dialler opens, then serves again. A stream may also end with
# the connection back in its handshake's queueing state, for whoever reads the next frame.
MOVES: dict[Phase, frozenset[Phase]] = {
    Phase.HANDSHAKE: frozenset({Phase.CHANNEL, Phase.SERVING, Phase.RECEIVING, Phase.OPENING,
                                Phase.IDLE}),
    Phase.CHANNEL: frozenset({Phase.CLIENT}),
    Phase.CLIENT: frozenset(),
    Phase.SERVING: frozenset({Phase.RECEIVING}),
    Phase.RECEIVING: frozenset({Phase.HANDSHAKE, Phase.SERVING, Phase.IDLE}),
    Phase.OPENING: frozenset({Phase.SENDING}),
    Phase.SENDING: frozenset({Phase.IDLE}),
    Phase.IDLE: frozenset({Phase.RECEIVING, Phase.OPENING}),
}


def check_move(name: str, current: Phase, new: Phase) -> None:
    """Refuse a phase change :data:`MOVES` does not allow (a bug on this side)."""
    if new not in MOVES[current]:
        allowed = ", ".join(sorted(p.value for p in MOVES[current])) or "none"
        raise LocalProtocolError(f"{name}: a connection in phase {current.value} cannot move "
                                 f"to {new.value} (allowed: {allowed})")


@dataclass(frozen=True, slots=True, eq=False)
class _Hooks:
    """One phase as installed: who takes frames, where streams land, who hears progress."""

    phase: Phase
    handler: FrameHandler | None
    sink: StreamSink | None
    progress: Progress | None
    read_ahead: bool


class PhaseScope:
    """A phase entered with :meth:`FrameProtocol.enter`; leaving it (or the ``with`` block it
    opens) moves the connection back to the phase before, with that phase's hooks."""

    __slots__ = ("_protocol", "_before", "_entered")

    def __init__(self, protocol: FrameProtocol, before: _Hooks, entered: _Hooks) -> None:
        self._protocol = protocol
        self._before = before
        self._entered = entered

    @property
    def current(self) -> bool:
        """Whether the connection is still in this phase (not moved on since)."""
        return self._protocol._hooks is self._entered

    def leave(self) -> None:
        """Back to the phase before; refused once the connection moved on from this one."""
        if not self.current:
            raise LocalProtocolError(
                f"{self._protocol.name}: cannot leave phase {self._entered.phase.value}: the "
                f"connection is in {self._protocol.phase.value} now")
        self._protocol._install(self._before)

    def __enter__(self) -> PhaseScope:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.leave()


class FrameProtocol(asyncio.BufferedProtocol):
    """Delivers decoded frames to its phase's handler; reports streamed progress to its
    phase's progress callback (:meth:`enter`).
    Not ``authenticated`` (a TCP connection in its handshake), headers are capped at
    HANDSHAKE_MAX_HEADER and the first bad frame closes the connection unanswered: a
    stranger gets little for its bytes. Once authenticated, a bad frame is skipped and
    answered with an Error. A broken prelude or a header over the cap is answered with one
    Error either way, and closes the connection."""

    def __init__(self, handler: FrameHandler | None = None, name: str = "conn",
                 authenticated: bool = True) -> None:
        self.name = name
        self.authenticated = authenticated
        self.reader = FrameReader(read_ahead=READ_AHEAD, max_header=(
            MAX_HEADER if authenticated else HANDSHAKE_MAX_HEADER))
        self._hooks = _Hooks(Phase.HANDSHAKE if handler is None else Phase.CHANNEL,
                             handler, None, None, False)
        # the current phase's handler and progress callback, read on every read
        self._handler = handler
        self._progress: Progress | None = None
        self.on_lost: list[Callable[[BaseException | None], None]] = []
        self.transport: asyncio.Transport | None = None
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._can_write = asyncio.Event()  # not paused (and, over TLS, nothing held back)
        self._can_write.set()
        self._paused = False
        self._limits = (WRITE_HIGH_WATER, WRITE_LOW_WATER)
        # Over TLS only: bytes not handed to the transport yet, in order, and whether to close
        # the transport once they are (None: a plain transport, written to directly).
        self._held: deque[memoryview] | None = None
        self._close_when_written = False
        self._inbox: asyncio.Queue[Frame[WireMessage]] = asyncio.Queue()
        self._quick_ack: Any = None  # the TCP socket told to acknowledge at once, after reads
        # While a bulk write runs (send_bulk): done when it ends, and the frames held behind it.
        self._bulk: asyncio.Future[None] | None = None
        self._bulk_reads = False  # large streamed payloads are read by a worker thread
        self._reading_in_bulk = False  # one is, now (reading paused)
        self._stop_reading = threading.Event()  # set when we close: a bulk read gives up
        self._diverted: list[bytes | memoryview] | None = None

    @property
    def phase(self) -> Phase:
        return self._hooks.phase

    @property
    def handler(self) -> FrameHandler | None:
        return self._handler

    def enter(self, phase: Phase, *, handler: FrameHandler | None = None,
              sink: StreamSink | None = None, progress: Progress | None = None,
              read_ahead: bool = False) -> PhaseScope:
        """Move to ``phase`` (checked against :data:`MOVES`) with its hooks, all at once: the
        frame handler (None: frames queue up for :meth:`next_frame`), where streamed payloads
        land (``FrameReader.expect_stream``, with ``read_ahead``), and who hears how much of
        one is in. Frames that arrived before the handler are handed to it first."""
        before = self._hooks
        entered = _Hooks(phase, handler, sink, progress, read_ahead)
        self._install(entered)
        return PhaseScope(self, before, entered)

    def _install(self, hooks: _Hooks) -> None:
        """Move to the phase ``hooks`` describe, checked, and install its hooks."""
        check_move(self.name, self._hooks.phase, hooks.phase)
        self._hooks = hooks
        self.reader.expect_stream(hooks.sink, hooks.read_ahead)
        self._progress = hooks.progress
        handler = self._handler = hooks.handler
        while handler is not None and not self._inbox.empty():
            handler(self._inbox.get_nowait())

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream connection's transport is a read-write one. A cast, not an isinstance check:
        # uvloop's transports do not derive from asyncio.Transport.
        self.transport = cast(asyncio.Transport, transport)
        if transport.get_extra_info("ssl_object") is not None:
            self._held = deque()
            self._limits = (TLS_WRITE_HIGH_WATER, TLS_WRITE_LOW_WATER)
        self.transport.set_write_buffer_limits(*self._limits)

    def ack_quickly(self) -> None:
        """Have the kernel acknowledge what arrives at once, not after its delayed-ACK timer,
        renewed after every read since Linux drops back to delaying on its own. For the side
        that receives object streams: a sender held up for that ACK stalls 20-50 ms in
        about one 1 MiB broadcast in twenty (docs/design.md §3, "Data connections")."""
        if QUICKACK is None or self.transport is None:
            return  # not Linux
        sock = self.transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            self._quick_ack = sock

    @property
    def acks_quickly(self) -> bool:
        """Whether ``ack_quickly`` took effect (a TCP connection, on Linux)."""
        return self._quick_ack is not None

    def authenticate(self) -> None:
        """The handshake succeeded: headers up to MAX_HEADER from the next frame on, and bad
        frames are answered instead of ending the connection."""
        self.authenticated = True
        self.reader.max_header = MAX_HEADER

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.reader.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        if self._quick_ack is not None:
            try:
                self._quick_ack.setsockopt(socket.IPPROTO_TCP, QUICKACK, 1)
            except OSError:  # closing under us: its end is reported through connection_lost
                self._quick_ack = None
        reader = self.reader
        events = self._parsed(lambda: reader.buffer_updated(nbytes))
        while events is not None:
            for event in events:
                if isinstance(event, BadFrame):
                    if not self.authenticated:
                        _rejected("%s: closing at a bad frame before the handshake: %s",
                                  self.name, event.error)
                        reader.drop_pending()
                        self.abort(event.error)
                        return
                    _rejected("%s: rejected a frame: %s", self.name, event.error)
                    self.send(Error(rid=event.rid or 0, code=event.error.code,
                                    message=str(event.error), data={}))
                elif self._handler is not None:
                    self._handler(event)
                else:
                    self._inbox.put_nowait(event)
            if not reader.pending:
                break
            if self.transport is None or self.transport.is_closing():
                reader.drop_pending()  # a connection closed by a handler reads nothing more
                break
            events = self._parsed(reader.resume)
        if self.reader.streaming:
            if self._bulk_reads:
                self._read_in_bulk()
            if self._progress is not None:
                self._progress(self.reader.payload_received)

    def read_in_bulk(self) -> None:
        """Read the rest of every large streamed payload in a worker thread, straight into
        its sink's buffer (:mod:`.bulk_io`), with this connection's reading paused meanwhile:
        for a daemon taking its clients' large puts, whatever else its loop does."""
        self._bulk_reads = True

    def _read_in_bulk(self) -> None:
        """Hand the current stream's missing bytes to a worker thread, if they are many."""
        transport = self.transport
        if (self._reading_in_bulk or transport is None or transport.is_closing()
                or self._held is not None or self.reader.broken is not None
                or self.reader.pending):
            return
        sock = transport.get_extra_info("socket")
        missing = self.reader.get_buffer()
        if sock is None or len(missing) < BULK_MIN:
            return
        loop = asyncio.get_running_loop()
        self._reading_in_bulk = True
        transport.pause_reading()
        fd = os.dup(sock.fileno())
        reading = loop.run_in_executor(None, read_into, fd, missing, self._stop_reading)
        reading.add_done_callback(lambda done: self._read_in_bulk_done(fd, len(missing), done))

    def _read_in_bulk_done(self, fd: int, nbytes: int, done: asyncio.Future[None]) -> None:
        """The worker thread filled the stream's buffer (or failed, which ends us)."""
        os.close(fd)
        self._reading_in_bulk = False
        error = None if done.cancelled() else done.exception()
        if done.cancelled() or error is not None:
            self.abort(error if isinstance(error, ConnectionLostError) else None)
            return
        self.buffer_updated(nbytes)
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def _parsed(self, parse: Callable[[], list[Event]]) -> list[Event] | None:
        """The frames ``parse`` completes; None after a protocol error, which closes us."""
        try:
            return parse()
        except ProtocolError as exc:
            _broken("%s: closing after protocol error: %s", self.name, exc)
            # One answer per connection, even before the handshake: a TLS dialer of a
            # plaintext daemon learns that way that it speaks TLS to one that does not.
            self.send(Error(rid=0, code=exc.code, message=str(exc), data={}))
            self.abort(exc)
            return None

    async def next_frame(self, timeout: float) -> Frame[WireMessage]:
        """The next frame while the phase has no handler (a handshake, an opening); bounded by
        ``timeout``."""
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

    def send(self, msg: WireMessage, payload: Payload | None = None,
             rid: int | None = None) -> None:
        """Queue one frame; the payload is sent from its own memory (vectored write, no join);
        ``rid``: the request id it goes with, in place of the record's own."""
        self._write(encode(msg, payload, rid))

    def write_raw(self, data: memoryview) -> None:
        """Queue raw stream bytes (a streamed payload's next slice)."""
        self._write((data,))

    async def send_bulk(self, msg: WireMessage, payload: Payload, rid: int | None = None) -> None:
        """Send one frame whose large payload a worker thread writes to the socket from its
        own memory (:mod:`.bulk_io`); frames sent meanwhile wait, in order, behind it. Runs
        to its end even if the caller is cancelled: a frame cut short would end the
        connection. Over TLS (never a Unix socket), as :meth:`send`."""
        sock = None if self.transport is None else self.transport.get_extra_info("socket")
        parts = encode(msg, payload, rid)
        if self._held is not None or sock is None or memoryview(parts[-1]).nbytes < BULK_MIN:
            self._write(parts)
            return
        while self._bulk is not None:  # one at a time
            await self._bulk
        loop = asyncio.get_running_loop()
        self._bulk = loop.create_future()
        self._diverted = []
        try:
            await self.flush()  # what was sent before goes first
            with contextlib.suppress(OSError):  # capped by the system: then as it allows
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, BULK_SOCKET_BUFFER)
            fd = os.dup(sock.fileno())
        except BaseException:
            self._end_bulk(None)
            raise
        writing = loop.run_in_executor(None, write_all, fd, parts)
        writing.add_done_callback(lambda done: self._end_bulk(
            fd, cut=done.cancelled() or done.exception() is not None))
        await asyncio.shield(writing)

    def _end_bulk(self, fd: int | None, cut: bool = False) -> None:
        """The bulk write is over (``cut``: it failed part way, which ends the connection):
        frames held meanwhile go, the next bulk write may start."""
        if fd is not None:
            os.close(fd)
        if cut:
            self.abort(ConnectionLostError(f"{self.name}: a bulk write failed part way"))
        diverted, self._diverted = self._diverted, None
        if diverted and self.transport is not None and not self.transport.is_closing():
            self.transport.writelines(diverted)
        done, self._bulk = self._bulk, None
        if done is not None and not done.done():
            done.set_result(None)

    def _write(self, parts: Iterable[bytes | memoryview]) -> None:
        if self.transport is None or self.transport.is_closing() or self._close_when_written:
            raise ConnectionLostError(f"{self.name}: connection is closed")
        if self._diverted is not None:
            self._diverted.extend(parts)
            return
        if self._held is None:
            self.transport.writelines(parts)
            return
        self._held.extend(memoryview(part).cast("B") for part in parts)
        self._feed()

    def _feed(self) -> None:
        """Over TLS: hand held bytes to the transport a piece at a time until it pauses us."""
        held, transport = self._held, self.transport
        assert held is not None and transport is not None
        while held and not self._paused and not transport.is_closing():
            head = held.popleft()
            if len(head) > TLS_WRITE_PIECE:
                held.appendleft(head[TLS_WRITE_PIECE:])
                head = head[:TLS_WRITE_PIECE]
            transport.write(head)  # may call pause_writing at once
        if held:
            self._can_write.clear()
            return
        if self._close_when_written:
            transport.close()
        if not self._paused:
            self._can_write.set()

    async def flush(self) -> None:
        """Wait until every queued byte was handed to the kernel (buffers may then be reused;
        over TLS: encrypted, which copies them)."""
        if self.transport is not None and not self.transport.is_closing():
            if self._held is not None:
                await self.drain()  # held pieces go at the usual limits, not one by one
            # A plain transport pauses when its queue exceeds the high-water mark, an SSL one
            # when it reaches it: given 0 it would pause on an empty queue and never resume.
            self.transport.set_write_buffer_limits(0 if self._held is None else 1, 0)
            await self.drain()
            self.transport.set_write_buffer_limits(*self._limits)

    async def drain(self) -> None:
        """Wait until the transport's queue is below its high-water mark (over TLS: and no
        byte is held back)."""
        if not self._can_write.is_set():
            waiter = asyncio.ensure_future(self._can_write.wait())
            waiters: set[asyncio.Future[Any]] = {waiter, self.closed}
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
        if self.closed.done():
            raise ConnectionLostError(f"{self.name}: connection closed")

    def pause_writing(self) -> None:
        self._paused = True
        self._can_write.clear()

    def resume_writing(self) -> None:
        self._paused = False
        if self._held is None:
            self._can_write.set()
        elif not self.closed.done():
            self._feed()

    def abort(self, exc: BaseException | None = None) -> None:
        """Close now (queued data is dropped): used after an error mid-message."""
        if self.transport is not None:
            self.transport.abort()
        self.connection_lost(exc)

    def close(self) -> None:
        """Close after queued data is flushed."""
        if self._held:
            self._close_when_written = True
        elif self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self.closed.done():
            return
        self._stop_reading.set()
        self.closed.set_result(None)
        if self._held is not None:
            self._held.clear()  # memory the sender may reuse once we are closed
        self._can_write.set()
        for callback in self.on_lost:
            callback(exc)
