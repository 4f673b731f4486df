"""A trio's first combiner sends its early chain ahead of the other two stripes' (docs/design.md
§4, "The first combiner's chain goes first"), on links slow enough that the chain is still
running when the first late input is put."""

from __future__ import annotations

import asyncio
import os
import shutil

import numpy as np
import pytest
from helpers import MiB, every_node_stats

import hoplite_client as hc
from hoplite_client.wire.ids import ObjectID
from hoplited.tools.testbed import emulated_cluster

# A third of SIZE crosses a link in about 0.35 s alone, about a second while the three
# stripes' chains share node 0's uplink: the first late put comes well inside that.
RATE = 200_000_000
SIZE = 24 * MiB + 12  # thirds of whole float32 elements, not of equal bytes
APART = 0.15
TIMEOUT = 120.0

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None,
                                reason="the emulated cluster needs root and iproute2")


async def test_the_first_late_put_sends_its_stripe_s_chain_ahead() -> None:
    """Nodes 0 and 1 put, node 0 calls the allreduce: nodes 2, 3, 4 are guessed to put the
    last three and combine a third each, over a chain in which one of nodes 0 and 1 pulls the
    other's three thirds (in the order the caller heard them ready). Node 2 puts first: that
    node stops pulling the other two thirds until node 2's is in, then resumes them from
    where they stopped. Every node gets numpy's sum."""
    async with emulated_cluster(5, RATE, capacity="1GiB") as cluster:
        clients = [await hc.connect(s) for s in cluster.sockets]
        try:
            rng = np.random.default_rng(11)
            arrays = [rng.standard_normal(SIZE // 4, dtype=np.float32) for _ in range(5)]
            ids = [ObjectID.random() for _ in range(5)]
            for i in (0, 1):
                await clients[i].put(arrays[i], object_id=ids[i])
            result = await clients[0].allreduce(ids, timeout=TIMEOUT)
            for i in (2, 3, 4):
                await asyncio.sleep(APART)
                await clients[i].put(arrays[i], object_id=ids[i])
            expected = np.add.reduce(np.stack(arrays), axis=0)
            for c in clients:
                got = await asyncio.wait_for(c.get(result, timeout=TIMEOUT), TIMEOUT)
                np.testing.assert_array_equal(got, expected)
                del got
            nodes = [n.node_id for n in cluster.nodes]
            stats = await every_node_stats(clients[0], nodes)
            assert stats[nodes[0]]["allreduces_as_trio"] == 1
            paused = [stats[n]["reduce_pulls_paused"] for n in nodes]
            assert sorted(paused[:2]) == [0, 2] and paused[2:] == [0, 0, 0]
        finally:
            for c in clients:
                await c.close()
