"""A bounded wait that is cancelled in the loop iteration its awaited thing completes ends
cancelled, never with the result (docs/architecture.md §3, "Bounded waits").

On Python 3.11 ``asyncio.wait_for`` returns the result in that case and drops the cancel
(python/cpython#86296). A fetch that an allreduce member aborted, to reduce the stripe itself,
was waiting at its own shard when a membership change woke that shard's waiters: the fetch
went on for ever, and the member waited for it to end, so nobody produced the stripe. Each case
here arranges exactly that coincidence.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from hoplite_client.net.channel import Channel
from hoplite_client.net.protocol import FrameProtocol
from hoplite_client.wire.frames import Frame
from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.messages import Ok, Ping
from hoplited.directory.shard import DirectoryShard
from hoplited.memory.arena import Arena
from hoplited.memory.store import ObjectStore
from hoplited.waiters import KeyedWaiters

LONG = 60.0  # seconds: a bound that must not be what ends the wait


async def settle() -> None:
    """Let every task started so far run until it waits."""
    for _ in range(5):
        await asyncio.sleep(0)


async def cancelled_as_completed(wait: Awaitable[Any], complete: Callable[[], None]) -> bool:
    """Run ``wait`` until it waits, then complete what it waits for and cancel it in the same
    step. Whether it ended cancelled."""
    task = asyncio.ensure_future(wait)
    await settle()
    assert not task.done()
    complete()
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        return True
    return False


async def test_keyed_waiter_woken_as_it_is_cancelled() -> None:
    waiters: KeyedWaiters[str] = KeyedWaiters()
    assert await cancelled_as_completed(waiters.wait("k", LONG), lambda: waiters.wake("k"))
    assert len(waiters) == 0


async def test_keyed_waiter_of_several_keys_woken_as_it_is_cancelled() -> None:
    waiters: KeyedWaiters[str] = KeyedWaiters()
    assert await cancelled_as_completed(waiters.wait_any(("a", "b"), LONG),
                                        lambda: waiters.wake("b"))
    assert len(waiters) == 0 and not list(waiters.waited())


@pytest.mark.parametrize("timeout", [None, LONG])
async def test_locate_at_this_shard_woken_as_it_is_cancelled(timeout: float | None) -> None:
    """The fetch's own ask: the shard wakes its waiters (a death, an announce) as the ask's
    task is cancelled; it must not ask again."""
    shard = DirectoryShard(1, lambda n: True, lambda oid: "me", "me")
    oid = ObjectID.random()
    assert await cancelled_as_completed(shard.locate(oid, "me", timeout, [], 0),
                                        lambda: shard.membership_changed())
    assert shard.stats()["waiting_gets"] == 0


async def test_space_waiter_woken_as_it_is_cancelled() -> None:
    arena = Arena(1 << 20)
    try:
        store = ObjectStore(arena)
        obj = store.create(ObjectID.random(), 4096, "|u1", [4096])
        store.pin(obj)
        assert await cancelled_as_completed(store.wait_space(LONG), lambda: store.unpin(obj))
    finally:
        arena.close()


async def test_request_answered_as_it_is_cancelled() -> None:
    """A request to a peer whose reply lands as its caller is cancelled."""
    ours, theirs = socket.socketpair()
    loop = asyncio.get_running_loop()
    _, protocol = await loop.create_connection(lambda: FrameProtocol(name="t"), sock=ours)
    try:
        channel = Channel(protocol)
        assert protocol.handler is not None
        handler = protocol.handler
        assert await cancelled_as_completed(channel.request(Ping(), timeout=LONG),
                                            lambda: handler(Frame(Ok(rid=1), None)))
    finally:
        protocol.abort()
        theirs.close()
