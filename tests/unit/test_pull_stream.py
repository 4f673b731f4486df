"""PullStream over a real connection (a socket pair): where bytes land, what progress is heard,
and how a pull ends: answered, refused, cut off, silent, or stopped early."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

from hoplite_client.net.protocol import FrameProtocol, Phase
from hoplite_client.wire.errors import (
    ConnectionLostError,
    HopliteTimeoutError,
    RemoteProtocolError,
)
from hoplite_client.wire.frames import Frame, encode_header
from hoplite_client.wire.messages import DataStream, Error, Ok, RingSegment
from hoplited.transfer.pull_stream import PullStream

SIZE = 4 << 20
OFFSET = 1 << 20
WAIT = 10.0  # bounds a bug only


class Pair:
    """Two connected protocols: ``src`` sends, ``dst`` receives (in its handshake phase)."""

    def __init__(self) -> None:
        self.sockets = socket.socketpair()
        self.src: FrameProtocol
        self.dst: FrameProtocol

    async def open(self) -> None:
        loop = asyncio.get_running_loop()
        _, self.src = await loop.create_connection(lambda: FrameProtocol(name="src"),
                                                   sock=self.sockets[0])
        _, self.dst = await loop.create_connection(lambda: FrameProtocol(name="dst"),
                                                   sock=self.sockets[1])

    async def stream(self, msg: Any, data: memoryview, length: int | None = None) -> None:
        """Send a streamed frame's header (for ``length`` bytes, by default ``data``'s) and
        ``data``."""
        n = len(data) if length is None else length
        self.src.write_raw(memoryview(encode_header(msg, n)))
        self.src.write_raw(data)
        await self.src.flush()

    def close(self) -> None:
        self.src.abort()
        self.dst.abort()
        for sock in self.sockets:
            sock.close()


@pytest.fixture
async def pair() -> AsyncIterator[Pair]:
    p = Pair()
    await p.open()
    try:
        yield p
    finally:
        p.close()


def _object() -> tuple[bytearray, np.ndarray]:
    """An object's memory (its first OFFSET bytes already here) and the bytes it should end
    with."""
    want = np.random.default_rng(7).integers(0, 256, SIZE, dtype=np.uint8)
    memory = bytearray(SIZE)
    memory[:OFFSET] = want[:OFFSET].tobytes()
    return memory, want


async def _until(predicate: Any) -> None:
    async with asyncio.timeout(WAIT):
        while not predicate():
            await asyncio.sleep(0.001)


async def test_bytes_land_at_the_offset_with_progress_and_the_stream_answers(
        pair: Pair) -> None:
    memory, want = _object()
    progress: list[int] = []
    landed: list[bool] = []
    stream = PullStream.into(pair.dst, memoryview(memory), OFFSET, "src",
                             on_progress=progress.append, on_landed=lambda: landed.append(True))
    assert pair.dst.phase is Phase.RECEIVING
    rest = memoryview(want.tobytes())[OFFSET:]
    half = len(rest) // 2
    header = DataStream(rid=1, offset=OFFSET, size=SIZE)
    pair.src.write_raw(memoryview(encode_header(header, len(rest))))
    pair.src.write_raw(rest[:half])
    await _until(lambda: progress and progress[-1] == half)
    assert stream.answered and not stream.result.done() and not landed
    pair.src.write_raw(rest[half:])
    frame = await stream.wait(WAIT, WAIT, lambda: True)
    assert frame is not None and frame.msg == header and landed == [True]
    assert bytes(memory) == want.tobytes()
    assert progress == sorted(progress) and 0 < progress[-1] < len(rest)
    stream.close()
    assert pair.dst.phase is Phase.HANDSHAKE  # back where it was


async def test_an_error_answer_is_the_result(pair: Pair) -> None:
    memory, _ = _object()
    stream = PullStream.into(pair.dst, memoryview(memory), OFFSET, "src")
    pair.src.send(Error(rid=1, code="not_found", message="no copy", data={}))
    frame = await stream.wait(WAIT, WAIT, lambda: True)
    assert frame is not None and isinstance(frame.msg, Error) and stream.answered


async def test_a_close_before_the_end_fails_the_pull(pair: Pair) -> None:
    memory, want = _object()
    stream = PullStream.into(pair.dst, memoryview(memory), OFFSET, "src")
    part = memoryview(want.tobytes())[OFFSET:OFFSET + 1000]
    await pair.stream(DataStream(rid=1, offset=OFFSET, size=SIZE), part, SIZE - OFFSET)
    await _until(lambda: stream.received == len(part))
    pair.src.close()
    with pytest.raises(ConnectionLostError,
                       match=f"closed the stream at {OFFSET + len(part)}/{SIZE} bytes"):
        await stream.wait(WAIT, WAIT, lambda: True)
    assert stream.answered


async def test_a_close_before_any_answer_leaves_the_pull_unanswered(pair: Pair) -> None:
    memory, _ = _object()
    stream = PullStream.into(pair.dst, memoryview(memory), OFFSET, "src")
    pair.src.close()
    with pytest.raises(ConnectionLostError):
        await stream.wait(WAIT, WAIT, lambda: True)
    assert not stream.answered


async def test_a_frame_of_another_kind_fails_the_pull(pair: Pair) -> None:
    memory, _ = _object()
    stream = PullStream.into(pair.dst, memoryview(memory), OFFSET, "src")
    pair.src.send(Ok(rid=1))
    with pytest.raises(RemoteProtocolError, match="source src answered a Pull with Ok"):
        await stream.wait(WAIT, WAIT, lambda: True)


async def test_a_header_the_check_refuses_ends_the_connection(pair: Pair) -> None:
    memory, _ = _object()

    def check(msg: DataStream, length: int) -> None:
        if msg.offset != OFFSET:
            raise RemoteProtocolError(f"stream from {msg.offset}")

    stream = PullStream.into(pair.dst, memoryview(memory), OFFSET, "src", check=check)
    await pair.stream(DataStream(rid=1, offset=0, size=SIZE), memoryview(b"x" * 10), SIZE)
    with pytest.raises(ConnectionLostError):
        await stream.wait(WAIT, WAIT, lambda: True)
    assert stream.answered and bytes(memory[OFFSET:]) == bytes(SIZE - OFFSET)


async def test_a_silent_source_fails_at_once_unless_trusted_then_at_the_cap(
        pair: Pair) -> None:
    memory, _ = _object()
    stream = PullStream.into(pair.dst, memoryview(memory), OFFSET, "src")
    with pytest.raises(HopliteTimeoutError, match="sent nothing for 0.05s"):
        await stream.wait(0.05, 10.0, lambda: False)
    with pytest.raises(HopliteTimeoutError, match="sent nothing for 0.15s"):
        await stream.wait(0.05, 0.15, lambda: True)


async def test_a_stopped_stream_ends_with_no_frame(pair: Pair) -> None:
    memory, want = _object()
    stream: PullStream

    def on_progress(got: int) -> None:
        if got >= 1000:
            stream.stop()

    stream = PullStream.into(pair.dst, memoryview(memory), OFFSET, "src",
                             on_progress=on_progress)
    await pair.stream(DataStream(rid=1, offset=OFFSET, size=SIZE),
                      memoryview(want.tobytes())[OFFSET:OFFSET + 1000], SIZE - OFFSET)
    assert await stream.wait(WAIT, WAIT, lambda: True) is None


async def test_segments_land_in_their_own_views_and_the_connection_serves_again(
        pair: Pair) -> None:
    """A ring's inbound stream: each segment in the view its index names; after the last,
    the connection is back with whoever served it before."""
    memory = bytearray(12)
    views = {0: memoryview(memory)[8:], 1: memoryview(memory)[:8]}
    served: list[Any] = []
    pair.dst.enter(Phase.SERVING, handler=lambda frame: served.append(frame.msg))
    segments: list[int] = []

    def on_frame(frame: Frame[Any]) -> bool:
        segments.append(frame.msg.index)
        if len(segments) == 2:
            stream.close()
            return True
        return False

    stream = PullStream(pair.dst, lambda msg, n: views[msg.index], on_frame)
    await pair.stream(RingSegment(index=0), memoryview(b"CCCC"))
    await pair.stream(RingSegment(index=1), memoryview(b"AAAABBBB"))
    pair.src.send(Ok(rid=3))
    await _until(lambda: served)
    assert segments == [0, 1] and bytes(memory) == b"AAAABBBBCCCC"
    assert served == [Ok(rid=3)] and pair.dst.phase is Phase.SERVING
