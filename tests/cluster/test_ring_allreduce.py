"""Ring allreduce through real daemons and clients (docs/design.md §4, "Ring allreduce"):
numpy's results on every member, the ring chosen only when every input is ready at once (a
node holding several adds them all), a member frozen or killed before anyone held the result
(the allreduce runs again: in stripes with the frozen node's input once it answers, as a ring
over the survivors with the killed node's input put again), deletion mid-ring, and the
caller's death."""

from __future__ import annotations

import asyncio
import signal

import numpy as np
import pytest
from helpers import (
    FAST_HEARTBEAT,
    MiB,
    eventually,
    every_node_stats,
    local_stats,
    wait_declared_dead,
    wait_member_dead,
)

import hoplite_client as hc
from hoplite_client.wire.errors import PeerUnavailableError
from hoplite_client.wire.ids import ObjectID
from hoplited.cluster.membership import rendezvous_owner
from hoplited.tools.failures import put_again
from hoplited.tools.local_cluster import LocalCluster

GET_TIMEOUT = 120.0
# Members frozen for seconds are suspected, never declared dead.
NEVER_DEAD = ["--heartbeat-interval", "0.5", "--heartbeat-timeout", "600",
              "--suspect-after", "1"]
# Staggered inputs come this long apart, on purpose: longer than the ring's wait (0.2 s).
STAGGER = 0.5


def data(i: int, shape: tuple[int, ...] = (2 * MiB,), dtype: type = np.float32) -> np.ndarray:
    count = int(np.prod(shape))
    return (np.arange(count) % 97 + i).astype(dtype).reshape(shape)


async def ring_counts(client: hc.Client, cluster: LocalCluster, index: int) -> tuple[int, int]:
    """(allreduces run as a ring, rings given up) of node ``index``."""
    node = cluster.nodes[index].node_id
    n = (await every_node_stats(client, [node]))[node]
    return n["allreduces_as_ring"], n["rings_given_up"]


async def own_ring_counts(cluster: LocalCluster, index: int) -> tuple[int, int]:
    """``ring_counts`` asked of node ``index`` alone (as a tool): no other member is asked,
    so a frozen one does not hold the answer up."""
    with open(cluster.token_file, "rb") as f:
        n = await local_stats(cluster.nodes[index], f.read().strip())
    return n["allreduces_as_ring"], n["rings_given_up"]


async def ring_started(client: hc.Client, cluster: LocalCluster) -> None:
    """Return as soon as node 0 has started its first ring (polled closely: on loopback a
    ring of 64 MiB inputs lasts a few hundred ms)."""
    while await ring_counts(client, cluster, 0) != (1, 0):
        await asyncio.sleep(0.005)


async def big_ring(make_cluster, connect, daemon_args: list[str]):  # type: ignore[no-untyped-def]
    """Four nodes each put 64 MiB; node 0 starts a striped allreduce, which runs as a ring:
    returned once the ring started, with the cluster, clients, inputs, ids and result."""
    cluster = await make_cluster(4, daemon_args=daemon_args)
    clients = [await connect(s) for s in cluster.sockets]
    arrays = [data(i, (16 * MiB,)) for i in range(4)]
    ids = [await c.put(a) for c, a in zip(clients, arrays)]
    result = await clients[0].allreduce(ids, striped=True, timeout=GET_TIMEOUT)
    await ring_started(clients[0], cluster)
    return cluster, clients, arrays, ids, result


def unowned_id(cluster: LocalCluster, index: int) -> ObjectID:
    """A fresh id whose directory shard is not node ``index``'s: waits on it do not stall
    while that node is frozen."""
    nodes = [n.node_id for n in cluster.nodes]
    while True:
        oid = ObjectID.random()
        if rendezvous_owner(oid, nodes) != nodes[index]:
            return oid


async def idle(client: hc.Client, objects: int) -> bool:
    local = (await client.status())["local"]
    return local["store"]["objects"] == objects and local["allreduces"] == 0


async def no_allreduce(client: hc.Client) -> bool:
    return bool((await client.status())["local"]["allreduces"] == 0)


async def test_a_ring_gives_numpys_result_on_every_member(make_cluster, connect) -> None:
    """Sum, min, max and prod over 4 nodes, odd sizes and 2-D shapes, the caller with and
    without an input: each ran as a ring (every input was ready at once on its own node),
    every member holds numpy's result, the caller's plan ends by itself, and deleting the
    result leaves only the inputs."""
    cluster = await make_cluster(5)
    clients = [await connect(s) for s in cluster.sockets]
    cases = [(np.float32, "sum", (3 * MiB + 5,), 0, [0, 1, 2, 3]),
             (np.int64, "max", (700, 1003), 4, [1, 2, 3, 4]),
             (np.float64, "min", (MiB // 2 + 3,), 2, [0, 2, 4]),
             (np.int32, "prod", (100_003,), 1, [3, 4])]
    ops = {"sum": np.add, "max": np.maximum, "min": np.minimum, "prod": np.multiply}
    for run, (dtype, op, shape, caller, nodes) in enumerate(cases, start=1):
        arrays = [data(i % 3 + 1, shape, dtype) for i in nodes]
        ids = [await clients[i].put(a) for i, a in zip(nodes, arrays)]
        result = await clients[caller].allreduce(ids, op=op, striped=True, timeout=GET_TIMEOUT)
        expected = ops[op].reduce(np.stack(arrays), axis=0)
        for i in nodes:
            got = await clients[i].get(result, timeout=GET_TIMEOUT)
            np.testing.assert_array_equal(got, expected)
            del got
        counts = await ring_counts(clients[0], cluster, caller)
        assert counts == (sum(c[3] == caller for c in cases[:run]), 0)
        # the plan ends once its members are and the result's shard names a copy
        await eventually(lambda c=clients[caller]: no_allreduce(c), what="the plan ended")
        for oid in [*ids, result]:
            await clients[0].delete(oid)
    for c in clients:
        await eventually(lambda c=c: idle(c, 0), what="no object or allreduce left")


async def test_each_link_carries_the_rings_bound_once(make_cluster, connect) -> None:
    """A ring of 4 over 8 MiB inputs: each node sends its successor exactly 2(n-1) chunks of
    the object, 2(n-1)/n of it, and receives as much: nothing more crosses a link."""
    cluster = await make_cluster(4)
    clients = [await connect(s) for s in cluster.sockets]
    arrays = [data(i) for i in range(4)]
    ids = [await c.put(a) for c, a in zip(clients, arrays)]
    result = await clients[1].allreduce(ids, timeout=GET_TIMEOUT)
    for c in clients:
        np.testing.assert_array_equal(await c.get(result, timeout=GET_TIMEOUT), sum(arrays))
    nodes = list((await every_node_stats(clients[0], [n.node_id for n in cluster.nodes])).values())
    size = arrays[0].nbytes  # 8 MiB: four chunks of 2 MiB exactly
    assert [(n["bytes_out"], n["bytes_in"]) for n in nodes] == [(6 * size // 4,) * 2] * 4
    assert await ring_counts(clients[0], cluster, 1) == (1, 0)


async def test_staggered_inputs_go_in_stripes(make_cluster, connect) -> None:
    """Inputs put further apart than the ring's wait are reduced in stripes (the ring is
    never started) with the same result."""
    cluster = await make_cluster(3, daemon_args=["--ring-wait", "0.2"])
    clients = [await connect(s) for s in cluster.sockets]
    ids = [ObjectID.random() for _ in range(3)]
    result = await clients[0].allreduce(ids, striped=True, timeout=GET_TIMEOUT)
    for i in range(3):
        await clients[i].put(data(i), object_id=ids[i])
        await asyncio.sleep(STAGGER)
    expected = sum(data(i) for i in range(3))
    for c in clients:
        np.testing.assert_array_equal(await c.get(result, timeout=GET_TIMEOUT), expected)
    assert await ring_counts(clients[0], cluster, 0) == (0, 0)


async def test_inputs_sharing_a_node_or_listed_twice_run_a_ring(make_cluster, connect) -> None:
    """Two inputs held only by node 1 make a ring of three nodes where node 1 adds both; an
    input listed twice is added twice, as a reduce counts it; inputs all on one node are
    reduced there without a ring."""
    cluster = await make_cluster(3, daemon_args=["--ring-wait", "2"])
    clients = [await connect(s) for s in cluster.sockets]
    shared = [await clients[1].put(data(i)) for i in range(2)] + [await clients[2].put(data(2))]
    result = await clients[0].allreduce(shared, striped=True, timeout=GET_TIMEOUT)
    twice = await clients[0].allreduce([shared[2], shared[0], shared[2]], timeout=GET_TIMEOUT)
    alone = await clients[0].allreduce(shared[:2], timeout=GET_TIMEOUT)
    for c in clients:
        np.testing.assert_array_equal(await c.get(result, timeout=GET_TIMEOUT),
                                      data(0) + data(1) + data(2))
        np.testing.assert_array_equal(await c.get(twice, timeout=GET_TIMEOUT),
                                      data(0) + 2 * data(2))
        np.testing.assert_array_equal(await c.get(alone, timeout=GET_TIMEOUT),
                                      data(0) + data(1))
    assert await ring_counts(clients[0], cluster, 0) == (2, 0)


async def test_a_member_frozen_in_the_ring_is_waited_for_without_the_ring(make_cluster,
                                                                         connect) -> None:
    """Node 2 is frozen (SIGSTOP) as its ring starts (no id's shard is on it, so the
    allreduce sees every input ready at once): no member can finish without its stream, and
    once it is suspected the ring gives way; the allreduce runs again without it, its input
    unused while the node is silent. The node runs again, never declared dead; its input is
    taken, and every node, node 2 included, gets the sum."""
    cluster = await make_cluster(4, daemon_args=NEVER_DEAD)
    clients = [await connect(s) for s in cluster.sockets]
    arrays = [data(i, (16 * MiB,)) for i in range(4)]
    ids = [await c.put(a, object_id=unowned_id(cluster, 2)) for c, a in zip(clients, arrays)]
    cluster.kill(2, signal.SIGSTOP)
    try:
        result = await clients[0].allreduce(ids, striped=True, timeout=GET_TIMEOUT,
                                            object_id=unowned_id(cluster, 2))

        with open(cluster.token_file, "rb") as f:
            token = f.read().strip()

        async def run_again_without_it() -> bool:
            """The ring given up (node 2 suspected after 1 s) and the allreduce placed
            again in stripes, node 0 computing some, while node 2 is still frozen."""
            node0 = await local_stats(cluster.nodes[0], token)
            return ((node0["allreduces_as_ring"], node0["rings_given_up"]) == (1, 1)
                    and bool(node0["reduce_slots"]))

        await eventually(run_again_without_it, what="the allreduce run again without node 2")
    finally:
        cluster.kill(2, signal.SIGCONT)
    expected = sum(arrays)
    for c in clients:
        np.testing.assert_array_equal(await c.get(result, timeout=GET_TIMEOUT), expected)
    assert await ring_counts(clients[0], cluster, 0) == (1, 1)


async def test_a_member_killed_mid_ring_runs_it_again_as_a_ring(make_cluster,
                                                                connect) -> None:
    """Node 2 is SIGKILLed once the ring started (64 MiB each), its input put again on node
    3. Nobody held the result, so the ring is given up and run again over the survivors,
    node 3 adding its input and the lost one: every survivor gets the exact sum."""
    cluster, clients, arrays, ids, result = await big_ring(
        make_cluster, connect, [*FAST_HEARTBEAT, "--ring-wait", "30"])
    victim = cluster.nodes[2].node_id
    cluster.kill(2)
    await wait_member_dead(clients[0], victim)
    await put_again(clients[3], ids[2], arrays[2])
    expected = sum(arrays)
    for i in (0, 1, 3):
        got = await asyncio.wait_for(clients[i].get(result, timeout=GET_TIMEOUT), GET_TIMEOUT)
        np.testing.assert_array_equal(got, expected)
        del got
    assert await ring_counts(clients[0], cluster, 0) == (2, 1)


async def test_deleting_the_result_mid_ring_stops_it(make_cluster, connect) -> None:
    """The result deleted while a frozen member stalls the ring: once the member runs again,
    no ring member, copy or pin is left anywhere, only the inputs."""
    cluster = await make_cluster(3, daemon_args=NEVER_DEAD)
    clients = [await connect(s) for s in cluster.sockets]
    ids = [await c.put(data(i, (16 * MiB,))) for i, c in enumerate(clients)]
    result = await clients[0].allreduce(ids, striped=True, timeout=GET_TIMEOUT)
    await ring_started(clients[0], cluster)
    cluster.kill(1, signal.SIGSTOP)
    try:
        await clients[0].delete(result)
        with open(cluster.token_file, "rb") as f:
            token = f.read().strip()

        async def stopped_beside_it() -> bool:  # the members that run stop their part
            for i in (0, 2):
                if (await local_stats(cluster.nodes[i], token))["allreduces"]:
                    return False
            return True

        await eventually(stopped_beside_it, what="nodes 0 and 2 left the ring")
    finally:
        cluster.kill(1, signal.SIGCONT)
    for c in clients:
        await eventually(lambda c=c: idle(c, 1), what="only the input left")


async def test_the_callers_death_mid_ring_fails_every_get_typed(make_cluster, connect) -> None:
    """Node 0 starts a ring of nodes 1-3 and dies while frozen node 3 stalls it: the members
    record why, so gets of the result on the survivors fail naming node 0."""
    cluster = await make_cluster(4, daemon_args=FAST_HEARTBEAT)
    clients = [await connect(s) for s in cluster.sockets]
    ids = [await clients[i].put(data(i), object_id=unowned_id(cluster, 3)) for i in (1, 2, 3)]
    cluster.kill(3, signal.SIGSTOP)  # no shard of ours on it: the ring starts at once
    result = await clients[0].allreduce(ids, striped=True, timeout=GET_TIMEOUT,
                                        object_id=unowned_id(cluster, 3))

    async def started() -> bool:
        return await own_ring_counts(cluster, 0) == (1, 0)

    await eventually(started, what="the ring started")
    caller = cluster.nodes[0].node_id
    cluster.kill(0)
    await wait_declared_dead(cluster, 1, caller)  # node 1 alone: node 3 is frozen
    cluster.kill(3)
    for c in clients[1:3]:
        with pytest.raises(PeerUnavailableError):
            await asyncio.wait_for(c.get(result, timeout=GET_TIMEOUT), GET_TIMEOUT / 2)
