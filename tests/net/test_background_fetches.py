"""Fetches that go on in the background (their first getter gave up) and end badly: the object
never comes, or it is deleted while it is being received. Every get ends with a typed error,
and afterwards every daemon still serves puts and gets correctly, with its store's accounting
intact (no copy left pinned, no extent freed twice).

Node 0 holds the objects behind a rate-limited proxy (tests/faultproxy.py), so a delete lands
while the copies are still arriving.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import numpy as np
import pytest
from faultproxy import FaultProxy
from helpers import IO_TIMEOUT, MiB, eventually, put_get_roundtrip

import hoplite_client as hc
from hoplite_client.wire.ids import ObjectID
from hoplited.tools.local_cluster import LocalCluster

RATE = 8 * MiB  # bytes/s out of node 0: BIG takes about 2 s to arrive anywhere
BIG = np.arange(16 * MiB // 4, dtype=np.float32)
SHORT_GET = 0.05  # gives up at once, leaving the fetch to the long get
LONG_GET = 120.0  # must end with the delete, not with this timeout
ROUNDS = 3

Cluster = tuple[LocalCluster, FaultProxy, list[hc.Client]]


@pytest.fixture
async def slow_holder(make_cluster: Callable[..., Awaitable[LocalCluster]],
                      connect: Callable[[str], Awaitable[hc.Client]]) -> AsyncIterator[Cluster]:
    """Three daemons; every peer connection to node 0 passes through a rate-limited proxy."""
    proxy = await FaultProxy.free_pair(rate=RATE)
    try:
        cluster = await make_cluster(3, node_args={
            0: ["--listen", f"{proxy.target_host}:{proxy.port}",
                "--advertise", proxy.listen_host]})
        yield cluster, proxy, [await connect(s) for s in cluster.sockets]
    finally:
        await proxy.stop()


async def objects(client: hc.Client) -> int:
    return int((await client.status())["local"]["store"]["objects"])


async def settled(clients: list[hc.Client]) -> bool:
    """Every store empty: no object, nothing deleted but still pinned, no arena byte in use."""
    for client in clients:
        store = (await client.status())["local"]["store"]
        if (store["objects"], store["pinned_deleted"], store["arena_used"]) != (0, 0, 0):
            return False
    return True


async def test_fetches_that_time_out_or_lose_their_object_leave_the_daemons_serving(
        slow_holder: Cluster) -> None:
    cluster, _, clients = slow_holder
    holder, *getters = clients
    # Nothing is ever put: the gets give up, and so do their fetches, on their own deadlines.
    never = ObjectID.random()
    for client in getters:
        with pytest.raises(hc.HopliteTimeoutError):
            await client.get(never, timeout=0.2)
    for _ in range(ROUNDS):
        oid = await holder.put(BIG)
        short = [asyncio.ensure_future(c.get(oid, timeout=SHORT_GET)) for c in getters]
        for get in short:  # each leaves its fetch running in the background
            with pytest.raises(hc.HopliteTimeoutError):
                await get
        long = [asyncio.ensure_future(c.get(oid, timeout=LONG_GET)) for c in getters]
        for client in getters:  # the copies are arriving
            await eventually(lambda c=client: objects(c), what="a copy being received")
        await holder.delete(oid)
        for get in long:
            with pytest.raises(hc.ObjectNotFoundError):  # deleted: not its 120 s timeout
                await asyncio.wait_for(get, IO_TIMEOUT)
    await eventually(lambda: settled(clients), what="every store empty and unpinned")
    for put_node, get_node in [(0, 1), (1, 2), (2, 0)]:
        await put_get_roundtrip(cluster.sockets[put_node], cluster.sockets[get_node])
    oid = await holder.put(BIG)
    for client in getters:
        got = await client.get(oid, timeout=IO_TIMEOUT)
        assert np.array_equal(got, BIG)
        del got


async def test_a_copy_deleted_while_its_fetch_asks_for_another_source_ends_the_get(
        slow_holder: Cluster) -> None:
    """The pull breaks (the proxy resets it), so the fetch asks the owner for another source;
    the object is deleted meanwhile. The get ends with that, not with its own timeout (the
    shard has nothing to offer until a put that may never come), and its partial copy goes."""
    cluster, proxy, clients = slow_holder
    holder, getter, _ = clients
    oid = await holder.put(BIG)
    get = asyncio.ensure_future(getter.get(oid, timeout=LONG_GET))
    await eventually(lambda: objects(getter), what="a copy being received")
    await proxy.cut()  # the only source is avoided for a moment: the fetch asks again
    await holder.delete(oid)
    with pytest.raises(hc.ObjectNotFoundError):
        await asyncio.wait_for(get, IO_TIMEOUT)
    await eventually(lambda: settled(clients), what="every store empty and unpinned")
    await put_get_roundtrip(cluster.sockets[0], cluster.sockets[1])
