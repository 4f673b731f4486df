"""Reduces whose inputs sit several to a node, on real daemons (docs/design.md §4, "Several
inputs on one node"): one slot per node adds them all and the sum is exact on every node (a
node holding several inputs that dies mid-stream: tests/cluster/test_repair.py).

Results are checked element by element; inputs are distinct small integers, so a float32 sum
is exact in any order and an input counted twice, or missed, in any element shows.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import numpy as np
import pytest
from helpers import every_node_stats

import hoplite_client
from hoplited.tools.local_cluster import LocalCluster

NODES = 4
PER_NODE = 3
GET_TIMEOUT = 120.0


def value(i: int, elements: int) -> np.ndarray:
    """Input ``i``: 2**i in every element but a ramp of small integers, so that any input
    counted twice, or left out, changes the sum of every element it touches."""
    return (np.arange(elements, dtype=np.float32) % 5) + np.float32(1 << i)


def expected(inputs: range, elements: int) -> np.ndarray:
    return sum((value(i, elements) for i in inputs), np.zeros(elements, dtype=np.float32))


async def merges(client: hoplite_client.Client, node: str) -> int:
    """Inputs the reduces coordinated on ``node`` merged into another input's slot."""
    return int((await every_node_stats(client, [node]))[node]["reduce_merges"])


@pytest.mark.parametrize("put_first", [True, False], ids=["inputs-first", "reduce-first"])
async def test_several_inputs_on_each_node_sum_exactly(
        make_cluster: Callable[..., Awaitable[LocalCluster]],
        connect: Callable[[str], Awaitable[hoplite_client.Client]], put_first: bool) -> None:
    """Three inputs on each of four nodes, put one per node in turn, before the reduce or
    after it started: every node gets the exact sum of all twelve, four times over. With the
    inputs there first, the coordinator merges some of them into a slot of their node."""
    elements = 1 << 20  # 4 MiB per input: many chunks, far above the inline limit
    cluster = await make_cluster(NODES)
    clients = [await connect(s) for s in cluster.sockets]
    n = NODES * PER_NODE
    node0 = cluster.nodes[0].node_id
    for _ in range(4):
        ids = [hoplite_client.ObjectID.random() for _ in range(n)]
        reduce = None if put_first else asyncio.ensure_future(clients[0].reduce(ids))
        for i, oid in enumerate(ids):  # input i on node i % NODES
            await clients[i % NODES].put(value(i, elements), object_id=oid)
        result = await (clients[0].reduce(ids) if reduce is None else reduce)
        got = await asyncio.gather(*(c.get(result, timeout=GET_TIMEOUT) for c in clients))
        want = expected(range(n), elements)
        for array in got:
            assert array.dtype == np.float32 and np.array_equal(array, want)
        del got
        for oid in [*ids, result]:
            await clients[0].delete(oid)
    if put_first:
        assert await merges(clients[0], node0) > 0
