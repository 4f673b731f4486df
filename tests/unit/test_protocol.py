"""FrameProtocol's handshake wait leaves nothing behind; settings refuse meaningless values."""

from __future__ import annotations

import asyncio
import math
import socket
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from hoplite_client.net.protocol import FrameProtocol
from hoplite_client.wire.errors import HopliteTimeoutError, InvalidArgumentError
from hoplite_client.wire.frames import encode
from hoplite_client.wire.messages import Ping
from hoplited.config import DaemonConfig


def _others() -> set[asyncio.Task[object]]:
    return {t for t in asyncio.all_tasks() if t is not asyncio.current_task()}


async def test_a_cancelled_handshake_wait_leaves_no_task() -> None:
    """A dial cut short (a ping budget, a close) cancels next_frame: its inbox wait goes too."""
    wait = asyncio.ensure_future(FrameProtocol(name="t").next_frame(10))
    await asyncio.sleep(0.01)
    wait.cancel()
    with pytest.raises(asyncio.CancelledError):
        await wait
    await asyncio.sleep(0)
    assert not _others()


async def test_a_timed_out_handshake_wait_leaves_no_task() -> None:
    with pytest.raises(HopliteTimeoutError):
        await FrameProtocol(name="t").next_frame(0.01)
    await asyncio.sleep(0)
    assert not _others()


@pytest.mark.parametrize("interval,timeout", [(0.0, 5.0), (-1.0, 5.0), (math.nan, 5.0),
                                              (1.0, 1.0), (2.0, 1.0)])
def test_heartbeat_settings_are_checked_at_start(interval: float, timeout: float) -> None:
    config = DaemonConfig(heartbeat_interval=interval, heartbeat_timeout=timeout)
    with pytest.raises(InvalidArgumentError):
        config.check()


@pytest.mark.parametrize("seconds", [-0.1, math.nan, math.inf, 61.0])
def test_a_pairs_least_transfer_is_checked_at_start(seconds: float) -> None:
    with pytest.raises(InvalidArgumentError):
        DaemonConfig(pair_min_transfer=seconds).check()


@pytest.mark.parametrize("name", ["x" * 16, "cu bic", "cubic\0", "../bbr", "bbré"])
def test_a_congestion_control_name_no_kernel_knows_is_refused_at_start(name: str) -> None:
    with pytest.raises(InvalidArgumentError):
        DaemonConfig(congestion=name).check()



async def _three_pings_to(connect: Callable[[Callable[[], FrameProtocol]], Awaitable[Any]]
                          ) -> tuple[FrameProtocol, list[int]]:
    """Connect a FrameProtocol told to ack quickly with ``connect``; the request ids of the
    frames it then reads (the other end sends three Pings)."""
    got: list[int] = []
    _, protocol = await connect(lambda: FrameProtocol(lambda f: got.append(f.msg.rid),
                                                      name="t"))
    protocol.ack_quickly()
    for _ in range(500):
        if len(got) == 3:
            break
        await asyncio.sleep(0.01)
    protocol.close()
    await protocol.closed
    return protocol, got


async def _serve_three_pings(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    for rid in (1, 2, 3):
        writer.writelines(encode(Ping(rid=rid)))
    await writer.drain()
    await reader.read()  # until the other end closes
    writer.close()
    await writer.wait_closed()


@pytest.mark.skipif(not hasattr(socket, "TCP_QUICKACK"), reason="Linux only")
async def test_a_tcp_connection_acks_quickly_and_still_reads_every_frame() -> None:
    loop = asyncio.get_running_loop()
    async with await asyncio.start_server(_serve_three_pings, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        protocol, got = await _three_pings_to(
            lambda factory: loop.create_connection(factory, "127.0.0.1", port))
    assert protocol.acks_quickly
    assert got == [1, 2, 3]


async def test_a_unix_connection_has_no_delayed_acks_to_turn_off() -> None:
    loop = asyncio.get_running_loop()
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "s")
        async with await asyncio.start_unix_server(_serve_three_pings, path):
            protocol, got = await _three_pings_to(
                lambda factory: loop.create_unix_connection(factory, path))
    assert not protocol.acks_quickly
    assert got == [1, 2, 3]


async def test_frames_read_ahead_after_a_handler_closes_the_connection_are_not_handled() -> None:
    """Three frames in one read: the handler of the first closes the connection, and the two
    read ahead behind it reach no handler, as frames never read did before reading ahead."""
    ours, theirs = socket.socketpair()
    loop = asyncio.get_running_loop()
    got: list[int] = []
    protocol: FrameProtocol | None = None

    def handle(frame: Any) -> None:
        got.append(frame.msg.rid)
        assert protocol is not None
        protocol.close()

    theirs.sendall(b"".join(bytes(b) for rid in (1, 2, 3) for b in encode(Ping(rid=rid))))
    _, protocol = await loop.create_connection(lambda: FrameProtocol(handle, name="t"),
                                               sock=ours)
    await asyncio.wait_for(protocol.closed, 30)
    theirs.close()
    assert got == [1] and not protocol.reader.pending
