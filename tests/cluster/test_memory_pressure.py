"""Bounded memory on real daemons: LRU eviction of copies held elsewhere, puts that wait for
room, and copies that must stay (sole copies, pinned ones). docs/architecture.md §6."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
from helpers import eventually, every_node_stats

import hoplite_client as hc
from hoplite_client.client import PUT_TIMEOUT

MiB = 1 << 20
CAPACITY = "16MiB"
OBJ = 4 * MiB  # four fill a store
SLOTS = 4
VERDICT = PUT_TIMEOUT + 60.0  # generous: the put's own wait plus a loaded machine
# A put that must wait for room in vain waits this long (its own timeout, not the default
# PUT_TIMEOUT): the same wait and the same failure, sooner.
SHORT_PUT = 3.0


def value(i: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
    return np.full(OBJ, i, dtype=np.uint8)


async def store_of(client: hc.Client) -> dict[str, int]:
    return dict((await client.status())["local"]["store"])


async def views_released() -> None:
    """Let the client send the ``Release`` of the views just dropped (it is scheduled on the
    loop), so it reaches the daemon before the next request."""
    await asyncio.sleep(0)


async def until_waiting(watcher: hc.Client, put: asyncio.Task[Any]) -> None:
    """Return once the daemon reports ``put`` (or a get) waiting for room (it must not end
    first)."""
    async def waiting() -> bool:
        assert not put.done(), put
        return (await store_of(watcher))["waiting_for_space"] == 1

    await eventually(waiting, what="the put waiting for room")


async def fill(client: hc.Client, first: int = 0) -> list[hc.ObjectID]:
    return [await client.put(value(first + i)) for i in range(SLOTS)]


async def test_full_store_evicts_copies_held_elsewhere(make_cluster, connect) -> None:
    """A's objects, all also on B: more puts on A evict the least recently used, and a get of
    an evicted one on A fetches it back from B, with the right bytes."""
    cluster = await make_cluster(2, capacity=CAPACITY)
    a, b = [await connect(s) for s in cluster.sockets]
    oids = await fill(a)
    for i, oid in enumerate(oids):
        got = await b.get(oid, timeout=60)
        assert got[0] == i and got[-1] == i
        del got
    extra = [await a.put(value(10 + i)) for i in range(2)]
    st = await store_of(a)
    assert st["evictions"] == 2 and st["evicted_bytes"] == 2 * OBJ, st
    assert st["objects"] == SLOTS, st
    for i, oid in enumerate(oids[2:], 2):  # the two oldest went, the others are here
        assert np.array_equal(await a.get(oid, timeout=0), value(i))
        await views_released()
    again = await a.get(oids[0], timeout=60)  # evicts the oldest copy held on B: oids[2]
    assert np.array_equal(again, value(0))
    del again
    assert np.array_equal(await a.get(extra[0], timeout=60), value(10))
    assert (await store_of(a))["evictions"] == 3
    cluster_view = await a.status()
    assert any(n.get("store", {}).get("evictions") == 3 for n in cluster_view["nodes"])


async def test_sole_copies_stay_and_the_put_fails_after_waiting(make_cluster, connect) -> None:
    """Objects whose only copy is here are never evicted: a put into the full store waits,
    then fails with a CapacityError saying what it asked for."""
    cluster = await make_cluster(2, capacity=CAPACITY)
    a, watcher = [await connect(cluster.sockets[0]) for _ in range(2)]
    oids = await fill(a)
    put = asyncio.create_task(a.put(value(9), timeout=SHORT_PUT))
    await until_waiting(watcher, put)
    with pytest.raises(hc.CapacityError) as info:
        await asyncio.wait_for(put, VERDICT)
    assert info.value.data["requested"] == OBJ and info.value.data["free"] < OBJ
    for i, oid in enumerate(oids):
        assert np.array_equal(await a.get(oid, timeout=0), value(i))
    assert (await store_of(a))["evictions"] == 0
    with pytest.raises(hc.CapacityError):  # timeout 0: no wait at all
        await asyncio.wait_for(a.put(value(9), timeout=0), VERDICT)


async def test_waiting_put_succeeds_once_another_client_deletes(make_cluster, connect) -> None:
    cluster = await make_cluster(1, capacity=CAPACITY)
    writer, deleter = [await connect(cluster.sockets[0]) for _ in range(2)]
    oids = await fill(writer)
    put = asyncio.create_task(writer.put(value(7)))
    await until_waiting(deleter, put)
    await deleter.delete(oids[1])
    new = await asyncio.wait_for(put, VERDICT)
    assert np.array_equal(await deleter.get(new, timeout=0), value(7))
    assert (await store_of(deleter))["evictions"] == 0


async def test_a_pinned_copy_is_never_evicted(make_cluster, connect) -> None:
    """A client's view pins its copy on A: even as the least recently used copy held
    elsewhere too, another one is evicted in its place."""
    cluster = await make_cluster(2, capacity=CAPACITY)
    a, b = [await connect(s) for s in cluster.sockets]
    oids = await fill(a)
    for oid in oids:
        del_me = await b.get(oid, timeout=60)
        del del_me
    view = await a.get(oids[0], timeout=0)  # pinned while ``view`` lives
    for oid in oids[1:]:  # newer uses than the pinned one's
        other = await a.get(oid, timeout=0)
        del other
        await views_released()
    for i in range(SLOTS - 1):
        await asyncio.wait_for(a.put(value(20 + i)), VERDICT)
    assert np.array_equal(view, value(0))
    assert np.array_equal(await a.get(oids[0], timeout=0), value(0))  # still here
    st = await store_of(a)
    assert st["evictions"] == SLOTS - 1, st
    with pytest.raises(hc.CapacityError):  # only the pinned copy is held elsewhere now
        await asyncio.wait_for(a.put(value(30), timeout=SHORT_PUT), VERDICT)
    assert np.array_equal(view, value(0))
    del view


def floats(i: int) -> np.ndarray[Any, np.dtype[np.float32]]:
    return np.full(OBJ // 4, i, dtype=np.float32)


async def test_a_reduce_buffer_waits_for_room_instead_of_failing(make_cluster, connect) -> None:
    """A reduce into A, whose store the result fills: the buffer A's slot pulls B's input into
    waits for room (docs/architecture.md §6) and the reduce completes once a sole copy there is
    deleted. A restart after a failure needs that: its old placements give memory back only as
    their readers let go."""
    cluster = await make_cluster(2, capacity=CAPACITY)
    a, b = [await connect(s) for s in cluster.sockets]
    fillers = [await a.put(value(i)) for i in range(2)]
    ids = [await a.put(floats(1)), await b.put(floats(2))]
    result = await a.reduce(ids)
    got = asyncio.create_task(a.get(result, timeout=VERDICT))
    await until_waiting(a, got)
    await a.delete(fillers[1])
    assert np.array_equal(await got, floats(3))
    assert (await store_of(a))["evictions"] == 0


async def test_a_reduce_buffer_evicts_a_copy_held_elsewhere(make_cluster, connect) -> None:
    """The same reduce, with one of A's other objects also held on B: the buffer evicts it
    rather than failing the reduce."""
    cluster = await make_cluster(2, capacity=CAPACITY)
    a, b = [await connect(s) for s in cluster.sockets]
    fillers = [await a.put(value(i)) for i in range(2)]
    copy = await b.get(fillers[0], timeout=60)
    del copy
    ids = [await a.put(floats(1)), await b.put(floats(2))]
    result = await a.reduce(ids)
    assert np.array_equal(await a.get(result, timeout=VERDICT), floats(3))
    assert (await store_of(a))["evictions"] == 1


async def test_a_get_waits_for_room_within_its_timeout(make_cluster, connect) -> None:
    """A get into a store of sole copies waits for room rather than failing at once, and
    completes once one of them is deleted (docs/architecture.md §6)."""
    cluster = await make_cluster(2, capacity=CAPACITY)
    a, b = [await connect(s) for s in cluster.sockets]
    oids = await fill(a)
    remote = await b.put(value(9))
    get = asyncio.create_task(a.get(remote, timeout=VERDICT))
    await until_waiting(a, get)
    await a.delete(oids[0])
    assert np.array_equal(await get, value(9))


async def test_a_reduce_result_evicts_copies_held_elsewhere(make_cluster, connect) -> None:
    """A reduce into a store full of copies also held on B: the result and the buffer it
    pulls B's input into evict two of them."""
    cluster = await make_cluster(2, capacity=CAPACITY)
    a, b = [await connect(s) for s in cluster.sockets]
    fillers = [await a.put(value(i)) for i in range(SLOTS - 1)]
    for oid in fillers:
        copy = await b.get(oid, timeout=60)
        del copy
    ids = [await a.put(floats(1)), await b.put(floats(2))]
    result = await a.reduce(ids)
    assert np.array_equal(await a.get(result, timeout=VERDICT), floats(3))
    assert (await store_of(a))["evictions"] == 2


async def test_a_reduce_of_inline_inputs_evicts_for_its_result(make_cluster, connect) -> None:
    """Inputs small enough to come with their shard's answer are combined on the caller's
    node: a store full of copies also held on B evicts one for the result instead of
    failing the reduce."""
    cluster = await make_cluster(2, capacity=CAPACITY)
    a, b = [await connect(s) for s in cluster.sockets]
    for oid in await fill(a):
        copy = await b.get(oid, timeout=60)
        del copy
    small = [np.full(4096, i, dtype=np.float32) for i in (1, 2)]
    ids = [await b.put(x) for x in small]
    result = await a.reduce(ids)
    assert np.array_equal(await a.get(result, timeout=VERDICT), small[0] + small[1])
    assert (await store_of(a))["evictions"] == 1


async def test_a_reduce_with_no_room_for_its_result_fails_and_leaves_nothing(
        make_cluster, connect) -> None:
    """A's store holds only sole copies: the result waits for room until the reduce's timeout,
    then the reduce fails with a CapacityError, and every buffer and pin it took is gone."""
    cluster = await make_cluster(2, capacity=CAPACITY)
    a, b = [await connect(s) for s in cluster.sockets]
    for i in range(SLOTS - 1):
        await a.put(value(i))
    ids = [await a.put(floats(1)), await b.put(floats(2))]
    before = await store_of(a)
    result = await a.reduce(ids, timeout=1.0)
    with pytest.raises(hc.CapacityError):
        await a.reduced_inputs(result, timeout=VERDICT)
    with pytest.raises(hc.CapacityError):
        await a.get(result, timeout=VERDICT)

    async def released() -> bool:
        st = await store_of(a)
        return all(st[k] == before[k] for k in ("objects", "arena_used", "pinned_deleted"))
    await eventually(released, what="the reduce's memory given back")


@pytest.mark.parametrize("shape", ["ring", "stripes"])
async def test_an_allreduce_evicts_copies_held_elsewhere(make_cluster, connect,
                                                         shape: str) -> None:
    """Both stores are full of copies the other node holds too: each member's result, in a
    ring or in stripes, evicts what it needs instead of failing the allreduce. A ring needs
    the result's room; stripes also a stripe's partial sum and its child's buffer, so they
    get one copy fewer to evict from (two nodes cannot both evict the same one)."""
    args = ["--ring-wait", "5" if shape == "ring" else "0"]
    cluster = await make_cluster(2, capacity=CAPACITY, daemon_args=args)
    a, b = [await connect(s) for s in cluster.sockets]
    fillers = SLOTS - 1 if shape == "ring" else SLOTS - 2
    shared = [await a.put(value(i)) for i in range(fillers)]
    for oid in shared:
        copy = await b.get(oid, timeout=60)
        del copy
    ids = [await a.put(floats(1)), await b.put(floats(2))]
    result = await a.allreduce(ids, striped=True)
    for client in (a, b):
        assert np.array_equal(await client.get(result, timeout=VERDICT), floats(3))
        assert (await store_of(client))["evictions"] >= 1
    node = cluster.nodes[0].node_id
    rings = (await every_node_stats(a, [node]))[node]["allreduces_as_ring"]
    assert rings == (shape == "ring")
