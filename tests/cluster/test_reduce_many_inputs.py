"""A reduce over as many inputs as a frame may list (MAX_IDS_PER_FRAME, 10,000), the way a
parameter server sums many workers, on three real daemons; one more input is a typed error."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import hoplite_client as hc
from hoplite_client.wire.frames import MAX_IDS_PER_FRAME

GET_TIMEOUT = 120.0
NODES = 3


def worker_value(i: int) -> np.ndarray:
    """Input ``i``: tiny (inline), distinct, and exact to sum in int64."""
    return np.array([i, 1, i % 7], dtype=np.int64)


async def test_reduce_over_ten_thousand_inputs_on_three_nodes(make_cluster, connect) -> None:
    """10,000 tiny inputs spread over three nodes: the Reduce request and the InputList reply
    each list them all; every node gets the exact sum; one input more is refused at once."""
    cluster = await make_cluster(NODES)
    clients = [await connect(s) for s in cluster.sockets]
    n = MAX_IDS_PER_FRAME

    async def put_share(node: int) -> list[tuple[int, hc.ObjectID]]:
        return [(i, await clients[node].put(worker_value(i))) for i in range(node, n, NODES)]

    shares = await asyncio.gather(*(put_share(node) for node in range(NODES)))
    ids = [oid for _, oid in sorted(pair for share in shares for pair in share)]
    assert len(set(ids)) == n

    result = await clients[0].reduce(ids, op="sum", timeout=GET_TIMEOUT)
    want = np.sum([worker_value(i) for i in range(n)], axis=0, dtype=np.int64)
    for client in clients:
        got = await client.get(result, timeout=GET_TIMEOUT)
        assert got.dtype == want.dtype and np.array_equal(got, want), (got, want)
    used = await clients[0].reduced_inputs(result, timeout=GET_TIMEOUT)
    assert len(used) == n and set(used) == set(ids)

    with pytest.raises(hc.InvalidArgumentError, match=str(MAX_IDS_PER_FRAME)):
        await clients[1].reduce([*ids, hc.ObjectID.random()])
    with pytest.raises(hc.InvalidArgumentError):
        await clients[1].reduce(ids, num_objects=n + 1)
