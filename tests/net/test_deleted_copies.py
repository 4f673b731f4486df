"""A delete reaches every copy of an object, however it got there."""

from __future__ import annotations

import os

import numpy as np
import pytest
from helpers import IO_TIMEOUT, dial_as_peer, eventually

import hoplite_client
from hoplite_client.wire.errors import ObjectDeletedError, ObjectNotFoundError
from hoplite_client.wire.frames import INLINE_MAX
from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.messages import Announce, Holding, Publish
from hoplited.memory.store import VERSION_SIZE
from hoplited.tools.local_cluster import LocalCluster

pytestmark = pytest.mark.net


@pytest.mark.parametrize("elements", [1000, 200_000], ids=["inline", "shared-memory"])
async def test_delete_frees_copies_made_by_gets_on_other_nodes(elements: int) -> None:
    """Small objects travel inline in the directory's answer: the copy a get keeps on
    another node must be dropped by a delete too (the soak found them left behind)."""
    async with LocalCluster(3, capacity="64MiB") as cluster, \
            await hoplite_client.connect(cluster.sockets[0]) as a, \
            await hoplite_client.connect(cluster.sockets[1]) as b, \
            await hoplite_client.connect(cluster.sockets[2]) as c:
        value = np.arange(elements, dtype=np.float32)
        oid = await a.put(value)
        for client in (b, c):
            got = await client.get(oid, timeout=IO_TIMEOUT)
            np.testing.assert_array_equal(got, value)
            del got
        await c.delete(oid)

        async def all_empty() -> bool:
            nodes = (await a.status())["nodes"]
            return all(n["store"]["objects"] == 0 and n["store"]["arena_used"] == 0
                       for n in nodes)

        await eventually(all_empty, what="every copy dropped")


async def test_delete_stops_a_reduce_still_waiting_for_its_inputs() -> None:
    """A reduce into an id, over inputs never put and with no timeout, waits for ever by
    design; deleting the id stops it: no wait stays registered at any shard (the 100k-request
    client fuzzer found them left behind) and the id can be used again."""
    async with LocalCluster(3, capacity="64MiB") as cluster, \
            await hoplite_client.connect(cluster.sockets[0]) as a:
        missing = [hoplite_client.ObjectID.random() for _ in range(4)]
        result = await a.reduce(missing, "sum")

        async def waiting() -> int:
            nodes = (await a.status())["nodes"]
            return sum(n["directory"]["waiting_gets"] for n in nodes)

        await eventually(waiting, what="the reduce's input waits registered")
        await a.delete(result)

        async def none_waiting() -> bool:
            return await waiting() == 0

        await eventually(none_waiting, what="every input wait gone")
        value = np.arange(10, dtype=np.float32)
        await a.put(value, object_id=result)  # the id names nothing any more
        np.testing.assert_array_equal(await a.get(result, timeout=IO_TIMEOUT), value)


@pytest.mark.parametrize("kind", ["announced", "published small"])
async def test_a_copy_moved_after_a_delete_that_found_no_entry_is_refused(  # type: ignore[no-untyped-def]
        kind: str, make_cluster, connect) -> None:
    """A delete can reach an id's new owner before any holder has re-announced its copy there
    (docs/design.md §5, "Deletes and moving owners"): the owner has no entry and answers "not
    found", but the copies re-announced after the move must not make the object an entry
    again (chaos seed 6 kept 16 KiB and 32 MiB so). A new put of the id still goes through."""
    cluster = await make_cluster(1)  # one shard: it owns every id
    protocol, channel = await dial_as_peer(cluster, "holder")
    client = await connect(cluster.sockets[0])
    oid = ObjectID.random()
    size = INLINE_MAX + 1 if kind == "announced" else 100

    async def tell(moved: bool) -> None:
        version = os.urandom(VERSION_SIZE)
        if kind == "announced":
            await channel.request(Announce(holdings=[Holding(
                oid=oid, size=size, dtype="|u1", shape=[size], version=version, received=size,
                producing=False, source=None, serving=0, receivers=0)], moved=moved),
                timeout=IO_TIMEOUT)
        else:
            await channel.request(Publish(oid=oid, size=size, dtype="|u1", shape=[size],
                                          version=version, moved=moved), bytes(size),
                                  timeout=IO_TIMEOUT)

    async def entries() -> int:
        return int((await client.status())["local"]["directory"]["entries"])

    try:
        with pytest.raises(ObjectNotFoundError):
            await client.delete(oid)
        if kind == "announced":
            await tell(moved=True)
        else:
            with pytest.raises(ObjectDeletedError):
                await tell(moved=True)
        assert await entries() == 0
        await tell(moved=False)  # a put of the id after its delete: a new object
        assert await entries() == 1
    finally:
        protocol.abort()
