"""A delete reaches every copy of an object, however it got there."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import IO_TIMEOUT, eventually

import hoplite_client
from hoplite_client.tools.local_cluster import LocalCluster

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
