"""Space, allocation in a bounded store: eviction the shard agreed to, waiting for room.

A real arena and store; the owner shard's verdict is a plain function standing in for the
``EvictCopy`` round trip (the shard's rule itself: tests/unit/test_directory_may_drop.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from hoplite_client.wire.errors import CapacityError, InvalidArgumentError
from hoplite_client.wire.ids import ObjectID
from hoplited.memory.arena import PAGE, Arena
from hoplited.memory.space import Space
from hoplited.memory.store import ObjectStore, StoredObject
from hoplited.tasks import Tasks

SLOT = 16 * PAGE  # every object here is this big; the store holds four
WAIT = 30.0  # a wait that must end by an event, long before this


class Shard:
    """The verdicts a shard would give: ``allow`` lists the ids it lets go; asks are logged."""

    def __init__(self) -> None:
        self.allow: set[ObjectID] = set()
        self.asked: list[ObjectID] = []
        self.gate: asyncio.Event | None = None  # when set: answers wait for it

    async def may_drop(self, obj: StoredObject) -> bool:
        self.asked.append(obj.oid)
        if self.gate is not None:
            await self.gate.wait()
        return obj.oid in self.allow


@pytest.fixture
async def world() -> AsyncIterator[tuple[ObjectStore, Space, Shard]]:
    arena = Arena(4 * SLOT)
    store = ObjectStore(arena)
    shard = Shard()
    tasks = Tasks()
    yield store, Space(store, shard.may_drop, tasks), shard
    await tasks.cancel_all()
    arena.close()


async def fill(store: ObjectStore, space: Space, n: int = 4) -> list[ObjectID]:
    """``n`` complete objects, oldest first."""
    oids = []
    for _ in range(n):
        obj = await space.create(ObjectID.random(), SLOT, "|u1", [SLOT])
        obj.advance(obj.size)
        oids.append(obj.oid)
    return oids


async def test_full_store_evicts_the_least_recently_used_copy(world) -> None:
    store, space, shard = world
    oids = await fill(store, space)
    store.touch(store.objects[oids[0]])  # a get: now the newest
    shard.allow = set(oids)
    new = await space.create(ObjectID.random(), SLOT, "|u1", [SLOT])
    assert shard.asked == [oids[1]]
    assert oids[1] not in store.objects and new.oid in store.objects
    assert (store.evictions, store.evicted_bytes) == (1, SLOT)


async def test_refused_copies_are_kept_and_not_asked_again_at_once(world) -> None:
    store, space, shard = world
    oids = await fill(store, space)
    shard.allow = {oids[3]}
    with pytest.raises(CapacityError):  # shard refuses 0-2, agrees to 3: two slots short
        await space.create(ObjectID.random(), 2 * SLOT, "|u1", [2 * SLOT], wait=0)
    assert shard.asked[-1] == oids[3] and sorted(shard.asked) == sorted(oids)
    assert set(store.objects) == set(oids[:3])
    shard.asked.clear()
    with pytest.raises(CapacityError) as info:
        await space.create(ObjectID.random(), 2 * SLOT, "|u1", [2 * SLOT], wait=0)
    assert shard.asked == []  # refused a moment ago, unused since
    assert info.value.data == {"requested": 2 * SLOT, "free": SLOT}


async def test_pinned_and_incomplete_objects_are_never_asked_about(world) -> None:
    store, space, shard = world
    oids = await fill(store, space, 2)
    store.pin(store.objects[oids[0]])
    await space.create(ObjectID.random(), SLOT, "|u1", [SLOT])  # incomplete
    await fill(store, space, 1)
    shard.allow = set(store.objects)
    await space.create(ObjectID.random(), SLOT, "|u1", [SLOT])
    assert shard.asked == [oids[1]]


async def test_waiting_put_succeeds_when_an_object_is_deleted(world) -> None:
    store, space, shard = world
    oids = await fill(store, space)
    put = asyncio.create_task(space.create(ObjectID.random(), SLOT, "|u1", [SLOT], wait=WAIT))
    while store.stats()["waiting_for_space"] == 0:
        await asyncio.sleep(0)
    store.remove(oids[2])
    obj = await put
    assert obj.oid in store.objects and store.stats()["waiting_for_space"] == 0


async def test_waiting_put_retries_eviction_when_a_pin_goes(world) -> None:
    """A pinned copy becomes evictable when unpinned: the waiting put wakes and evicts it."""
    store, space, shard = world
    oids = await fill(store, space)
    for oid in oids:
        store.pin(store.objects[oid])
    shard.allow = {oids[1]}
    put = asyncio.create_task(space.create(ObjectID.random(), SLOT, "|u1", [SLOT], wait=WAIT))
    while store.stats()["waiting_for_space"] == 0:
        await asyncio.sleep(0)
    store.unpin(store.objects[oids[1]])
    await put
    assert oids[1] not in store.objects and store.evictions == 1


async def test_wait_ends_with_capacity_error(world) -> None:
    store, space, shard = world
    await fill(store, space)
    with pytest.raises(CapacityError) as info:
        await space.create(ObjectID.random(), SLOT, "|u1", [SLOT], wait=0.05)
    assert info.value.data == {"requested": SLOT, "free": 0}


async def test_larger_than_the_store_or_bad_metadata_fails_at_once(world) -> None:
    store, space, shard = world
    await fill(store, space)
    with pytest.raises(CapacityError):
        await space.create(ObjectID.random(), 5 * SLOT, "|u1", [5 * SLOT], wait=None)
    with pytest.raises(InvalidArgumentError):
        await space.create(ObjectID.random(), 1 << 62, "|u1", [1], wait=None)
    assert shard.asked == []


async def test_a_get_during_the_shards_verdict_waits_for_it(world) -> None:
    """While the shard is asked, ``settled`` holds a get back: None if the copy went, the
    copy itself if the shard refused."""
    store, space, shard = world
    oids = await fill(store, space)
    shard.allow = {oids[0]}
    shard.gate = asyncio.Event()
    put = asyncio.create_task(space.create(ObjectID.random(), SLOT, "|u1", [SLOT]))
    while not shard.asked:
        await asyncio.sleep(0)
    going = asyncio.create_task(space.settled(store.objects[oids[0]]))
    await asyncio.sleep(0)
    assert not going.done()
    shard.gate.set()
    assert await going is None
    await put
    kept = store.objects[oids[1]]
    assert await space.settled(kept) is kept


async def test_a_sender_waiting_for_an_enrolled_copy_gets_it_once_created() -> None:
    """A Pull may reach a node before its own fetch created the copy (transfer/sender.py):
    ``wait_created`` hands over the copy once it exists, or None after the wait, leaving no
    waiter behind either way."""
    arena = Arena(4 * SLOT)
    store = ObjectStore(arena)
    oid, absent = ObjectID.random(), ObjectID.random()
    waiting = asyncio.ensure_future(store.wait_created(oid, 30.0))
    await asyncio.sleep(0)
    assert not waiting.done()
    obj = store.create(oid, SLOT, "uint8", [SLOT])
    assert await waiting is obj
    assert await store.wait_created(oid, 0.0) is obj  # already there: at once
    assert await store.wait_created(absent, 0.01) is None
    assert not len(store._arrivals)
    store.remove(oid)
    arena.close()


async def test_a_combiner_waits_for_whichever_input_is_created_first() -> None:
    """``wait_any_created``: the first of several ids created here, at once if one exists,
    or None after the wait, leaving no waiter behind (allreduce.py, ``Member._until_put``)."""
    arena = Arena(4 * SLOT)
    store = ObjectStore(arena)
    oids = [ObjectID.random() for _ in range(3)]
    assert await store.wait_any_created(oids, 0.01) is None
    waiting = asyncio.ensure_future(store.wait_any_created(oids, 30.0))
    await asyncio.sleep(0)
    assert not waiting.done()
    obj = store.create(oids[1], SLOT, "uint8", [SLOT])
    assert await waiting is obj
    assert await store.wait_any_created(oids, 0.0) is obj
    assert not len(store._arrivals)
    store.remove(oids[1])
    arena.close()


def test_a_copy_pinned_after_it_was_freed_is_not_freed_twice() -> None:
    """A task that kept a copy from before its delete pins and unpins it: the extent, given
    to a new object since, stays that object's."""
    arena = Arena(4 * SLOT)
    store = ObjectStore(arena)
    try:
        old = store.create(ObjectID.random(), SLOT, "uint8", [SLOT])
        store.remove(old.oid)
        new = store.create(ObjectID.random(), SLOT, "uint8", [SLOT])
        assert new.offset == old.offset  # the freed extent, reused
        used = arena.used
        store.pin(old)
        store.unpin(old)
        assert arena.used == used
        other = store.create(ObjectID.random(), SLOT, "uint8", [SLOT])
        assert other.offset != new.offset
    finally:
        arena.close()
