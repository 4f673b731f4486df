"""The receiving side of an object stream on a data connection.

A :class:`PullStream` holds its connection in the ``RECEIVING`` phase
(:meth:`FrameProtocol.enter`) from the moment it is made: each streamed payload lands straight
in the view its ``place`` names (the kernel writes it there), its progress is heard after every
read, and every frame goes to its ``on_frame``, which says whether the stream ended with it.
``result`` then holds that frame (None if the stream was stopped early), or the error the frame
meant. A fetcher's pull is one ``DataStream`` into an object's memory from an offset
(:meth:`PullStream.into`); a ring's inbound stream is a run of segments, each in its own view
of the result. Closing the stream moves the connection back to the phase it was in before; a
connection given back to the pool moves on from it instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from hoplite_client.net.protocol import FrameProtocol, Phase, Progress
from hoplite_client.wire.errors import (
    ConnectionLostError,
    HopliteError,
    HopliteTimeoutError,
    RemoteProtocolError,
)
from hoplite_client.wire.frames import Frame, StreamSink
from hoplite_client.wire.messages import DataStream, Error

# Takes each frame of the stream; True when the stream ended with it.
OnFrame = Callable[[Frame[Any]], bool]
# Vets a streamed payload's header (its message and length) before its bytes land; raises
# RemoteProtocolError to refuse it, which ends the connection.
Check = Callable[[Any, int], None]


class PullStream:
    """An object stream arriving on ``protocol``, which is in ``RECEIVING`` meanwhile."""

    def __init__(self, protocol: FrameProtocol, place: StreamSink, on_frame: OnFrame, *,
                 on_progress: Progress | None = None, offset: int = 0, size: int = 0) -> None:
        self.protocol = protocol
        self.offset = offset  # where the first payload's bytes go in the object (messages)
        self.size = size  # the object's size (messages)
        self.answered = False  # the other side sent something: a header or a frame
        self.received = 0  # bytes of the payload arriving now that are in
        self.result: asyncio.Future[Frame[Any] | None] = (
            asyncio.get_running_loop().create_future())
        self._place = place
        self._on_frame = on_frame
        self._on_progress = on_progress
        self._scope = protocol.enter(Phase.RECEIVING, handler=self._frame, sink=self._sink,
                                     progress=self._progress)

    @classmethod
    def into(cls, protocol: FrameProtocol, buffer: memoryview, offset: int, peer: str, *,
             check: Check | None = None, on_progress: Progress | None = None,
             on_landed: Callable[[], None] | None = None) -> PullStream:
        """A Pull's answer: one ``DataStream`` of bytes ``offset..`` of the object whose memory
        is ``buffer``, straight into ``buffer[offset:]`` (``check`` vets its header first), or
        an ``Error``; either is the result. ``on_landed`` runs when the last byte is in, before
        the result is set. Any other frame from ``peer`` fails the pull."""

        def place(msg: Any, length: int) -> memoryview:
            if check is not None:
                check(msg, length)
            return buffer[offset:]

        def on_frame(frame: Frame[Any]) -> bool:
            if isinstance(frame.msg, DataStream):
                if on_landed is not None:
                    on_landed()
            elif not isinstance(frame.msg, Error):  # a Pull is answered by a stream or an Error
                raise RemoteProtocolError(
                    f"source {peer} answered a Pull with {type(frame.msg).__name__}")
            return True

        return cls(protocol, place, on_frame, on_progress=on_progress, offset=offset,
                   size=len(buffer))

    def _sink(self, msg: Any, length: int) -> memoryview:
        self.answered = True
        self.received = 0
        return self._place(msg, length)

    def _progress(self, got: int) -> None:
        self.received = got
        if self._on_progress is not None:
            self._on_progress(got)

    def _frame(self, frame: Frame[Any]) -> None:
        self.answered = True
        if self.result.done():
            return
        try:
            ended = self._on_frame(frame)
        except HopliteError as exc:
            self.result.set_exception(exc)
            return
        if ended and not self.result.done():
            self.result.set_result(frame)

    def stop(self) -> None:
        """End the result early, with None; bytes go on landing until the connection closes
        or moves on."""
        if not self.result.done():
            self.result.set_result(None)

    def settle(self) -> None:
        """Nobody reads the result any more: cancel it, or mark the error it ended with read."""
        if not self.result.cancel() and not self.result.cancelled():
            self.result.exception()

    def close(self) -> None:
        """The stream is over: the connection goes back to the phase it was in before."""
        self.settle()
        self._scope.leave()

    async def wait(self, stall: float, cap: float,
                   trusted: Callable[[], bool]) -> Frame[Any] | None:
        """The result, once there. A silent source (no byte for ``stall`` s) fails, unless
        ``trusted()`` still holds: then it waits on, and fails only after ``cap`` s of
        silence. A connection that closes first fails the pull."""
        protocol = self.protocol
        seen = self.received
        silent = 0.0
        while True:
            waiters: set[asyncio.Future[Any]] = {self.result, protocol.closed}
            finished, _ = await asyncio.wait(waiters, timeout=stall,
                                             return_when=asyncio.FIRST_COMPLETED)
            if self.result in finished:
                return self.result.result()
            if protocol.closed in finished:
                raise ConnectionLostError(f"source closed the stream at "
                                          f"{self.offset + self.received}/{self.size} bytes")
            silent = silent + stall if self.received == seen else 0.0
            if silent and (silent >= cap or not trusted()):
                raise HopliteTimeoutError(f"source sent nothing for {silent:g}s")
            seen = self.received
