"""FrameProtocol's handshake wait leaves nothing behind; settings refuse meaningless values."""

from __future__ import annotations

import asyncio
import math

import pytest

from hoplite_client.net.protocol import FrameProtocol
from hoplite_client.wire.errors import HopliteTimeoutError, InvalidArgumentError
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
