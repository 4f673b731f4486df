"""A wait its sender gives up on is stopped at the other side (``Cancel``, docs/protocol.md §5):
a real channel and a real dispatcher, over a socket pair."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from hoplite_client.net.channel import Channel
from hoplite_client.net.protocol import FrameProtocol
from hoplite_client.wire.errors import HopliteTimeoutError
from hoplite_client.wire.frames import Frame
from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.messages import (
    PEER,
    Cancel,
    ObjectInfo,
    Stats,
    StatusReply,
    WaitObject,
    kinds_for,
)
from hoplited.dispatch import Dispatcher
from hoplited.tasks import Tasks

OID = ObjectID(bytes(20))
WAIT = 10.0  # bounds a bug only: every step here takes milliseconds


@dataclass
class Shard:
    """Handlers that wait until ``release`` is set, and record how each wait ended."""

    release: asyncio.Event = field(default_factory=asyncio.Event)
    ended: list[str] = field(default_factory=list)
    started: asyncio.Event = field(default_factory=asyncio.Event)

    async def _wait(self, kind: str) -> None:
        self.started.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.ended.append(f"{kind} cancelled")
            raise
        self.ended.append(f"{kind} answered")

    async def wait_object(self, origin: str, msg: WaitObject, payload: Any) -> ObjectInfo:
        await self._wait("wait")
        return ObjectInfo(holders=[], size=0, dtype="|u1", shape=[0], version=b"")

    async def stats(self, origin: str, msg: Stats, payload: Any) -> StatusReply:
        await self._wait("stats")
        return StatusReply(info={})


@pytest.fixture
async def link() -> AsyncIterator[tuple[Channel, Shard, Tasks]]:
    """A peer's channel to a shard's dispatcher, like a control link's two ends."""
    ours, theirs = socket.socketpair()
    loop = asyncio.get_running_loop()
    _, mine = await loop.create_connection(lambda: FrameProtocol(name="peer"), sock=ours)
    _, remote = await loop.create_connection(lambda: FrameProtocol(name="shard"), sock=theirs)
    shard, tasks = Shard(), Tasks()
    table: dict[type, Any] = {cls: (lambda o, m, p: None) for cls in kinds_for(PEER)}
    table |= {WaitObject: shard.wait_object, Stats: shard.stats}
    dispatcher = Dispatcher(PEER, table, tasks)

    def respond(reply: Any, payload: Any, rid: int) -> None:
        remote.send(reply, payload, rid)

    Channel(remote, on_request=lambda frame: dispatcher.deliver("peer", frame, respond))
    try:
        yield Channel(mine), shard, tasks
    finally:
        await tasks.cancel_all()
        mine.abort()
        remote.abort()


async def until(check: Any) -> None:
    async with asyncio.timeout(WAIT):
        while not check():
            await asyncio.sleep(0.01)


async def test_a_wait_that_times_out_is_stopped_at_the_shard(
        link: tuple[Channel, Shard, Tasks]) -> None:
    channel, shard, tasks = link
    with pytest.raises(HopliteTimeoutError):
        await channel.request(WaitObject(oid=OID, timeout=None), timeout=0.2)
    await until(lambda: shard.ended)
    assert shard.ended == ["wait cancelled"]
    await until(lambda: not len(tasks))


async def test_a_wait_whose_caller_is_cancelled_is_stopped_at_the_shard(
        link: tuple[Channel, Shard, Tasks]) -> None:
    channel, shard, tasks = link
    request = asyncio.ensure_future(channel.request(WaitObject(oid=OID, timeout=None)))
    await asyncio.wait_for(shard.started.wait(), WAIT)
    request.cancel()
    await until(lambda: shard.ended)
    assert shard.ended == ["wait cancelled"]


async def test_a_request_that_is_not_a_wait_runs_to_its_end(
        link: tuple[Channel, Shard, Tasks]) -> None:
    """Only kinds registered cancellable are stopped: any other handler may be halfway
    through changing something."""
    channel, shard, tasks = link
    with pytest.raises(HopliteTimeoutError):
        await channel.request(Stats(), timeout=0.2)
    await asyncio.sleep(0.2)  # an observation window: nothing may stop the handler meanwhile
    assert shard.ended == []
    shard.release.set()
    await until(lambda: shard.ended)
    assert shard.ended == ["stats answered"]  # its late reply is dropped by the channel


async def test_an_answered_wait_sends_no_cancel(link: tuple[Channel, Shard, Tasks]) -> None:
    channel, shard, tasks = link
    shard.release.set()
    await channel.request(WaitObject(oid=OID, timeout=None), timeout=WAIT)
    assert shard.ended == ["wait answered"]


async def test_a_cancel_reaches_only_the_wait_of_its_own_connection() -> None:
    """Request ids are per connection: the same id from another connection is another
    request, and an unknown id is ignored."""
    shard, tasks = Shard(), Tasks()
    table: dict[type, Any] = {cls: (lambda o, m, p: None) for cls in kinds_for(PEER)}
    table[WaitObject] = shard.wait_object
    dispatcher = Dispatcher(PEER, table, tasks)
    sent: dict[str, list[Any]] = {"a": [], "b": []}

    def a(reply: Any, payload: Any, rid: int) -> None:
        sent["a"].append(dataclasses.replace(reply, rid=rid))

    def b(reply: Any, payload: Any, rid: int) -> None:
        sent["b"].append(dataclasses.replace(reply, rid=rid))

    for respond in (a, b):
        dispatcher.deliver("peer", Frame(WaitObject(rid=5, oid=OID, timeout=None)), respond)
    await asyncio.sleep(0.01)
    dispatcher.deliver("peer", Frame(Cancel(request=6)), a)  # unknown: ignored
    dispatcher.deliver("peer", Frame(Cancel(request=5)), a)
    await until(lambda: shard.ended)
    assert shard.ended == ["wait cancelled"] and len(tasks) == 1
    shard.release.set()
    await until(lambda: not len(tasks))
    assert sent["a"] == [] and [type(r) for r in sent["b"]] == [ObjectInfo]
