"""A fetch that joins, in the same step, a fetch ended by its local copy's withdrawal
starts anew instead of spinning.

``bench/chaos.py`` seed 42, trial 19: a ring member's node had a fetch of the
result waiting on the member's own copy (the shard named this node as its source). The caller
withdrew that copy, and in the same step this node began fetching the result from the others.
The first fetch ended with ``CopyWithdrawn``, but its done-callbacks had not run yet, so the
new caller joined it, got ``CopyWithdrawn`` at once, asked again and joined it again, for ever
and without a pause: the daemon answered no ping and was declared dead. The fetcher here is
real, with a real store; the shard is a stand-in that names this node as the source (the
requester holds it) and fails every later ask.

A reduce's result started again is such a withdrawn copy too, on the node that produces it:
a get there waiting on the old version fetches again and ends with the new one, even while
that one does not exist yet (it waits for room). So is a ring copy that completes in the step
that gives it up.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest

from hoplite_client.net.handshake import Identity
from hoplite_client.wire.errors import ObjectNotFoundError
from hoplite_client.wire.frames import Frame
from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.messages import Located, MemberInfo
from hoplited.cluster.link_model import LinkModel
from hoplited.cluster.membership import Membership
from hoplited.collectives.coordinator import withdraw_result
from hoplited.memory.arena import Arena
from hoplited.memory.space import Space
from hoplited.memory.store import VERSION_SIZE, CopyWithdrawn, ObjectStore, StoredObject
from hoplited.tasks import Tasks
from hoplited.transfer.data_connections import DataConnections
from hoplited.transfer.fetcher import Fetcher
from hoplited.transfer.traffic import Traffic

SIZE = 4096
GONE = ObjectNotFoundError("no such object")
WAIT = 10.0  # the longest a step below may take, on a loaded machine


class Asked:
    """How often a stand-in shard was asked to locate, and a wait for the n-th ask."""

    def __init__(self) -> None:
        self.asked = 0
        self._changed = asyncio.Event()

    def note_ask(self) -> None:
        self.asked += 1
        self._changed.set()
        self._changed = asyncio.Event()

    async def asked_times(self, n: int) -> None:
        async with asyncio.timeout(WAIT):
            while self.asked < n:
                await self._changed.wait()


def waited_on(obj: StoredObject) -> asyncio.Event:
    """Set once something waits for ``obj``'s bytes (its ``watermark``, which ``wait_for``
    calls too), while they are still to come."""
    waiting = asyncio.Event()
    watermark = obj.watermark

    def traced(threshold: int) -> asyncio.Future[int]:
        fut = watermark(threshold)
        if not fut.done():
            waiting.set()
        return fut

    obj.watermark = traced  # type: ignore[method-assign]
    return waiting


async def until_set(event: asyncio.Event) -> None:
    async with asyncio.timeout(WAIT):
        await event.wait()


class Shard(Asked):
    """Answers the first locate, once ``here`` is set, with this node as the source (a
    ring member's copy, published as it completes), and fails every later one."""

    def __init__(self) -> None:
        super().__init__()
        self.here = asyncio.Event()

    async def locate(self, oid: ObjectID, *args: Any) -> Frame[Located]:
        self.note_ask()
        if self.asked > 1:
            raise GONE
        await self.here.wait()
        return Frame(Located(source="me", size=SIZE, dtype="|u1", shape=[SIZE],
                             version=bytes(VERSION_SIZE)))


def make_fetcher(shard: object, store: ObjectStore, tasks: Tasks) -> Fetcher:
    """The real fetcher of node ``me``, asking ``shard``."""
    membership = Membership(MemberInfo(node_id="me", host="127.0.0.1", port=1, socket="",
                                       host_id="h"))
    identity = Identity("me", b"token")

    async def may_drop(obj: StoredObject) -> bool:
        return False

    return Fetcher(identity, store, store.arena, cast(Any, shard), membership, LinkModel(),
                   Traffic(), tasks, stall_timeout=30.0, refused=lambda node: None,
                   space=Space(store, may_drop, tasks),
                   connections=DataConnections(identity, tasks, membership.is_alive))


@pytest.fixture
async def node() -> AsyncIterator[tuple[ObjectStore, Tasks]]:
    """A real store and the daemon's task owner, ended after the test."""
    tasks = Tasks()
    arena = Arena(1 << 20)
    try:
        yield ObjectStore(arena), tasks
    finally:
        await tasks.cancel_all()
        arena.close()


@pytest.mark.timeout(60)  # a spin blocks the loop: only the plugin's alarm would end it
async def test_a_fetch_joining_one_ended_by_a_withdrawn_copy_starts_anew(
        node: tuple[ObjectStore, Tasks]) -> None:
    store, tasks = node
    shard = Shard()
    fetcher = make_fetcher(shard, store, tasks)
    oid = ObjectID.random()
    first = asyncio.ensure_future(fetcher.fetch(oid, timeout=30.0))
    await shard.asked_times(1)  # its fetch asks the shard, which holds the answer
    assert shard.asked == 1 and not first.done()
    # a ring member's copy, being written here: the fetch is told to wait on it
    copy = store.create(oid, SIZE, "|u1", [SIZE], bytes(VERSION_SIZE), temporary=True)
    waiting = waited_on(copy)
    shard.here.set()
    await until_set(waiting)
    assert not first.done()
    store.remove(oid, CopyWithdrawn("the ring was given up"))  # as a withdraw does,
    second = asyncio.ensure_future(fetcher.fetch(oid, timeout=30.0))  # then fetches
    async with asyncio.timeout(10.0):
        for fetch in (first, second):
            with pytest.raises(ObjectNotFoundError):
                await fetch
    assert 2 <= shard.asked <= 3  # asked once more, by one new fetch per caller at most


class ResultShard(Asked):
    """The shard of a reduce's result after its owner moved: it first names another node,
    a receiver it learnt of before the producer (the fetch then finds the copy being
    produced here and waits on it); later asks wait until the copy here is complete, which
    it names then (the requester holds it)."""

    def __init__(self) -> None:
        super().__init__()
        self.named = asyncio.Event()
        self.complete = asyncio.Event()

    async def locate(self, oid: ObjectID, *args: Any) -> Frame[Located]:
        self.note_ask()
        first = self.asked == 1
        await (self.named if first else self.complete).wait()
        return Frame(Located(source="other" if first else "me", size=SIZE, dtype="|u1",
                             shape=[SIZE], version=bytes(VERSION_SIZE)))


@pytest.mark.timeout(60)
async def test_a_get_where_the_result_is_produced_outlasts_its_restart(
        node: tuple[ObjectStore, Tasks]) -> None:
    """A get on the coordinator's node, sent before the result opened, fetches; after the
    result's owner moved, the new shard names a receiver, so the fetch waits on the copy being
    produced here. The restart takes that version away before the new one has room: the get
    ends with the new version, where it failed with "not found"."""
    store, tasks = node
    shard = ResultShard()
    fetcher = make_fetcher(shard, store, tasks)
    oid = ObjectID.random()
    get = asyncio.ensure_future(fetcher.fetch(oid, timeout=30.0))
    await shard.asked_times(1)  # before the result opened here: a fetch asks the shard
    old = store.create(oid, SIZE, "|u1", [SIZE])
    old.producing = True
    store.pin(old)  # the coordinator's pin
    waiting = waited_on(old)
    shard.named.set()
    await until_set(waiting)
    assert shard.asked == 1 and not get.done()  # waiting on the copy being produced
    withdraw_result(store, old)
    store.unpin(old)
    await shard.asked_times(2)  # fetching again; the new version waits for room meanwhile
    assert not get.done()
    new = store.create(oid, SIZE, "|u1", [SIZE])
    new.advance(SIZE)
    shard.complete.set()
    async with asyncio.timeout(10.0):
        assert await get is new


class NewCopyShard(Asked):
    """Names this node as the source once the new copy here is complete."""

    def __init__(self) -> None:
        super().__init__()
        self.complete = asyncio.Event()

    async def locate(self, oid: ObjectID, *args: Any) -> Frame[Located]:
        self.note_ask()
        await self.complete.wait()
        return Frame(Located(source="me", size=SIZE, dtype="|u1", shape=[SIZE],
                             version=bytes(VERSION_SIZE)))


@pytest.mark.timeout(60)
async def test_a_get_whose_ring_copy_is_withdrawn_as_it_completes_fetches_again(
        node: tuple[ObjectStore, Tasks]) -> None:
    """A get waits on this node's ring copy. The copy completes, and the ring gives way in the
    same step (another member died before the commit), withdrawing it before the get runs
    again: the get fetches the result of the ring run again, where it failed with the
    withdrawal's error ("the ring ... was given up", ``bench.chaos --beside --per-node 2
    --restart``, seed 76, trial 23)."""
    store, tasks = node
    shard = NewCopyShard()
    fetcher = make_fetcher(shard, store, tasks)
    oid = ObjectID.random()
    ring_copy = store.create(oid, SIZE, "|u1", [SIZE], bytes(VERSION_SIZE), temporary=True)
    waiting = waited_on(ring_copy)
    get = asyncio.ensure_future(fetcher.fetch(oid, timeout=30.0))
    await until_set(waiting)
    assert not get.done() and shard.asked == 0  # waiting on the copy being made here
    ring_copy.advance(SIZE)
    store.remove(oid, CopyWithdrawn("the ring was given up"))
    await shard.asked_times(1)
    assert not get.done()  # asking for the result of the ring run again
    new = store.create(oid, SIZE, "|u1", [SIZE])
    new.advance(SIZE)
    shard.complete.set()
    async with asyncio.timeout(10.0):
        assert await get is new
