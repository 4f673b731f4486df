"""Striped allreduce through real daemons and clients (docs/design.md §4, "Striped allreduce"):
every participant gets numpy's sum, inputs may arrive late, a member may die with its input
put again elsewhere, and nothing of the stripes is left once the result is deleted."""

from __future__ import annotations

import asyncio
import signal

import numpy as np
import pytest
from helpers import FAST_HEARTBEAT, IO_TIMEOUT, MiB, eventually, local_stats, wait_member_dead

import hoplite_client as hc
from hoplite_client.wire.errors import InvalidArgumentError, PeerUnavailableError
from hoplite_client.wire.ids import ObjectID
from hoplited.tools.local_cluster import LocalCluster

GET_TIMEOUT = 120.0
SIZE = 8 * MiB  # four inputs: 2 MiB stripes, above the 1 MiB a stripe needs
ONE_BY_ONE = 0.1  # inputs put after the allreduce come this far apart, on purpose


def data(i: int, size: int = SIZE) -> np.ndarray:
    return np.arange(size // 4, dtype=np.float32) % 97 + i


async def stats_of(cluster: LocalCluster, index: int) -> dict:
    """Node ``index``'s own status record, asked as a tool (no other member is asked)."""
    with open(cluster.token_file, "rb") as f:
        return await local_stats(cluster.nodes[index], f.read().strip())


async def stripes_assigned(cluster: LocalCluster, nodes: list[int]) -> None:
    """Wait until each of ``nodes`` takes part in the allreduce and computes a stripe's slot
    (the stripes are assigned; those missing an input wait for it)."""

    async def assigned() -> bool:
        for i in nodes:
            stats = await stats_of(cluster, i)
            if not (stats["allreduces"] and stats["reduce_slots"]):
                return False
        return True

    await eventually(assigned, what=f"stripes assigned on nodes {nodes}")


async def store_empty(client: hc.Client) -> bool:
    local = (await client.status())["local"]
    return local["store"]["objects"] == 0 and local["directory"]["entries"] == 0


async def test_every_participant_gets_the_sum_and_nothing_is_left(make_cluster,
                                                                  connect) -> None:
    cluster = await make_cluster(4)
    clients = [await connect(s) for s in cluster.sockets]
    for run in range(2):  # a second run into fresh ids reuses nothing of the first
        ids = [await c.put(data(i + run)) for i, c in enumerate(clients)]
        result = await clients[0].allreduce(ids, striped=True, timeout=GET_TIMEOUT)
        got = await asyncio.gather(*(c.get(result, timeout=GET_TIMEOUT) for c in clients))
        expected = sum(data(i + run) for i in range(4))
        for arr in got:
            np.testing.assert_array_equal(arr, expected)
        del got
        for oid in [*ids, result]:
            await clients[0].delete(oid)
    for c in clients:
        await eventually(lambda c=c: store_empty(c), what="no object or entry left")


async def test_inputs_put_after_the_allreduce_started(make_cluster, connect) -> None:
    """The allreduce waits for inputs that arrive one by one; stripes start as they do."""
    cluster = await make_cluster(4)
    clients = [await connect(s) for s in cluster.sockets]
    ids = [ObjectID.random() for _ in clients]
    result = await clients[2].allreduce(ids, striped=True, timeout=GET_TIMEOUT)
    getters = [asyncio.ensure_future(c.get(result, timeout=GET_TIMEOUT)) for c in clients]
    for i in (3, 0, 2, 1):
        await asyncio.sleep(ONE_BY_ONE)
        await clients[i].put(data(i), object_id=ids[i])
    expected = sum(data(i) for i in range(4))
    for arr in await asyncio.gather(*getters):
        np.testing.assert_array_equal(arr, expected)


async def test_inputs_that_disagree_fail_every_get_typed(make_cluster, connect) -> None:
    cluster = await make_cluster(3)
    clients = [await connect(s) for s in cluster.sockets]
    ids = [await clients[0].put(data(0, 6 * MiB)), await clients[1].put(data(1, 6 * MiB)),
           await clients[2].put(data(2, 6 * MiB).astype(np.int32))]
    result = await clients[0].allreduce(ids, striped=True, timeout=GET_TIMEOUT)
    for c in clients:
        with pytest.raises(InvalidArgumentError):
            await asyncio.wait_for(c.get(result, timeout=GET_TIMEOUT), GET_TIMEOUT)


async def test_a_member_killed_mid_allreduce_is_replaced(make_cluster, connect) -> None:
    """Node 2 takes stripe 2, then dies before the last input exists; its input is put again
    on node 3. Its stripe is reduced again elsewhere and every survivor gets the right sum."""
    cluster = await make_cluster(4, daemon_args=FAST_HEARTBEAT)
    clients = [await connect(s) for s in cluster.sockets]
    ids = [await clients[i].put(data(i)) for i in range(3)] + [ObjectID.random()]
    result = await clients[0].allreduce(ids, striped=True, timeout=GET_TIMEOUT)
    await stripes_assigned(cluster, [0, 1, 2])  # every stripe waiting for input 3
    victim = cluster.nodes[2].node_id
    cluster.kill(2)
    await asyncio.wait_for(cluster.nodes[2].process.wait(), IO_TIMEOUT)
    await wait_member_dead(clients[0], victim)
    await clients[3].put(data(2), object_id=ids[2])
    await clients[3].put(data(3), object_id=ids[3])
    expected = sum(data(i) for i in range(4))
    for i in (0, 1, 3):
        arr = await asyncio.wait_for(clients[i].get(result, timeout=GET_TIMEOUT), GET_TIMEOUT)
        np.testing.assert_array_equal(arr, expected)


async def test_the_callers_death_fails_every_get_typed(make_cluster, connect) -> None:
    """Node 3 starts the allreduce and dies while its stripes wait for an input: the members
    stop and record why, so every get of the result fails with a typed error naming the dead
    node long before its own timeout."""
    cluster = await make_cluster(4, daemon_args=FAST_HEARTBEAT)
    clients = [await connect(s) for s in cluster.sockets]
    ids = [await clients[i].put(data(i)) for i in range(4)] + [ObjectID.random()]
    result = await clients[3].allreduce(ids, striped=True, timeout=GET_TIMEOUT)
    await stripes_assigned(cluster, [0, 1, 2])  # every stripe waiting for the last input
    caller = cluster.nodes[3].node_id
    cluster.kill(3)
    await asyncio.wait_for(cluster.nodes[3].process.wait(), IO_TIMEOUT)
    await wait_member_dead(clients[0], caller)
    for c in clients[:3]:
        with pytest.raises(PeerUnavailableError, match=caller):
            await asyncio.wait_for(c.get(result, timeout=GET_TIMEOUT), GET_TIMEOUT / 2)


async def test_a_member_only_suspected_keeps_its_stripes(make_cluster, connect) -> None:
    """Node 2 is frozen (SIGSTOP) mid-allreduce long enough to be suspected, never long
    enough to be declared dead, then runs again: its stripe is not given to another node
    (two reducers of one stripe id would each announce their own version), it finishes it,
    and every node, node 2 included, gets the sum."""
    cluster = await make_cluster(4, daemon_args=[
        "--heartbeat-interval", "0.5", "--heartbeat-timeout", "600", "--suspect-after", "1"])
    clients = [await connect(s) for s in cluster.sockets]
    ids = [await clients[i].put(data(i)) for i in range(3)] + [ObjectID.random()]
    result = await clients[0].allreduce(ids, striped=True, timeout=GET_TIMEOUT)
    await stripes_assigned(cluster, [0, 1, 2])  # every stripe waiting for input 3
    frozen = cluster.nodes[2].node_id
    cluster.kill(2, signal.SIGSTOP)
    try:
        async def suspected_by_all() -> bool:
            for i in (0, 1, 3):
                members = {m["node_id"]: m for m in (await stats_of(cluster, i))["members"]}
                if not (members[frozen]["alive"] and members[frozen]["suspected"]):
                    return False
            return True

        await eventually(suspected_by_all, what="node 2 suspected by every other node")
    finally:
        cluster.kill(2, signal.SIGCONT)
    await clients[3].put(data(3), object_id=ids[3])
    expected = sum(data(i) for i in range(4))
    for c in clients:
        arr = await asyncio.wait_for(c.get(result, timeout=GET_TIMEOUT), GET_TIMEOUT)
        np.testing.assert_array_equal(arr, expected)


async def test_deleting_the_result_mid_allreduce_stops_it(make_cluster, connect) -> None:
    """A result deleted while its stripes wait for an input leaves nothing behind."""
    cluster = await make_cluster(3)
    clients = [await connect(s) for s in cluster.sockets]
    ids = [await clients[i].put(data(i, 6 * MiB)) for i in range(2)] + [ObjectID.random()]
    result = await clients[0].allreduce(ids, striped=True, timeout=GET_TIMEOUT)
    await stripes_assigned(cluster, [0, 1])  # every stripe waiting for the last input
    await clients[0].delete(result)
    for oid in ids[:2]:
        await clients[0].delete(oid)

    async def idle(c: hc.Client) -> bool:
        local = (await c.status())["local"]
        return await store_empty(c) and local["allreduces"] == 0

    for c in clients:
        await eventually(lambda c=c: idle(c), what="no object, entry or allreduce left")
