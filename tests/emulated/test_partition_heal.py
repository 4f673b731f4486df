"""A network partition longer than the heartbeat timeout, then healed: the two groups declared
each other dead, and the smaller one comes back as new members (docs/design.md §5,
"Partitions heal"). Before probing, each group ran on alone for good.

The partition is made of blackhole routes between the groups' hosts, in their network
namespaces: packets between the groups are dropped, everything else flows.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

import numpy as np
import pytest
from helpers import FAST_HEARTBEAT, IO_TIMEOUT, MiB, eventually

import hoplite_client as hc
from hoplited.tools.testbed import emulated_cluster

RATE = 1_000_000_000
N = 4

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None,
                                reason="the emulated cluster needs root and iproute2")


async def view(socket: str) -> tuple[str, set[str]] | None:
    """A node's own id and the members it lists alive (None while it is between lives)."""
    try:
        client = await hc.connect(socket)
    except hc.HopliteError:
        return None
    try:
        local: dict[str, Any] = (await client.status(timeout=IO_TIMEOUT))["local"]
    except hc.HopliteError:
        return None
    finally:
        await client.close()
    return local["node_id"], {m["node_id"] for m in local["members"] if m["alive"]}


@pytest.mark.parametrize("groups", [[[0, 1, 2], [3]], [[0, 1], [2, 3]]],
                         ids=["one-cut-off", "two-and-two"])
async def test_the_smaller_side_of_a_healed_partition_joins_the_larger(
        groups: list[list[int]]) -> None:
    """Cut the cluster into ``groups`` until each group has declared the other dead, heal it:
    the smaller group (of two equal ones, the one without the smallest node id) comes back
    under new ids, the other keeps its ids, every member lists the same four alive, and
    objects and a reduce cross the old cut."""
    async with emulated_cluster(N, RATE, capacity="512MiB", daemon_args=FAST_HEARTBEAT,
                                log_level="info") as cluster:
        ids = [node.node_id for node in cluster.nodes]
        winner = (max(groups, key=len) if len(groups[0]) != len(groups[1])
                  else next(g for g in groups if min(ids) in {ids[i] for i in g}))
        loser = next(g for g in groups if g is not winner)
        kept = np.arange(MiB, dtype=np.int32)
        client = await hc.connect(cluster.sockets[winner[0]])
        try:
            kept_id = await client.put(kept)
        finally:
            await client.close()
        await cluster.testbed.partition(groups)
        try:
            async def split() -> bool:
                for group in groups:
                    for i in group:
                        seen = await view(cluster.sockets[i])
                        if seen is None or seen[1] != {ids[j] for j in group}:
                            return False
                return True

            await eventually(split, timeout=60, what="each group declaring the other dead")
        finally:
            await cluster.testbed.partition(groups, heal=True)

        async def healed() -> list[str] | None:
            views = [await view(s) for s in cluster.sockets]
            if any(v is None for v in views):
                return None
            now = [v[0] for v in views if v is not None]
            if all(v is not None and v[1] == set(now) for v in views):
                return now
            return None

        now = await eventually(healed, timeout=60, what="one membership of four again")
        assert [now[i] == ids[i] for i in range(N)] == [i in winner for i in range(N)]
        clients = [await hc.connect(s) for s in cluster.sockets]
        try:
            there = clients[loser[0]]
            assert np.array_equal(await there.get(kept_id, timeout=IO_TIMEOUT), kept)
            made = np.full(MiB, 3, dtype=np.int64)
            made_id = await there.put(made)
            assert np.array_equal(await clients[winner[0]].get(made_id, timeout=IO_TIMEOUT),
                                  made)
            inputs = [await c.put(np.full(MiB, i + 1, dtype=np.float32))
                      for i, c in enumerate(clients)]
            result = await there.reduce(inputs, timeout=IO_TIMEOUT)
            summed = await there.get(result, timeout=IO_TIMEOUT)
            assert np.array_equal(summed, np.full(MiB, sum(range(1, N + 1)), np.float32))
        finally:
            for c in clients:
                await c.close()
