"""An allreduce that ends as a pair, through real daemons and clients (docs/design.md §4, "A
pair for the last two inputs"): inputs put further apart than the ring's wait are held until
two are missing, and the two nodes holding none reduce a half each as combiners (three and a
third each, "Three combiners", where three are missing and the inputs came close). The first
inputs are put at once, then the last two APART s apart: on loopback an object crosses in
milliseconds, and inputs further apart than that would go the plain way. numpy's
result on every node, whoever puts the last two; a combiner killed before it puts has its
half reduced again by a survivor."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import numpy as np
from helpers import FAST_HEARTBEAT, MiB, eventually, every_node_stats, wait_member_dead

import hoplite_client as hc
from hoplite_client.wire.ids import ObjectID
from hoplited.tools.local_cluster import LocalCluster
from hoplited.transfer.sender import AHEAD_WAIT

GET_TIMEOUT = 120.0
APART = 0.5  # before each of the last two puts, on purpose: far more than the ring's wait
# on loopback
# Objects cross loopback in milliseconds, below the least transfer a pair is taken for.
ANY_SIZE = ["--pair-min-transfer", "0"]


def data(i: int, shape: tuple[int, ...] = (2 * MiB,), dtype: type = np.float32) -> np.ndarray:
    count = int(np.prod(shape))
    return (np.arange(count) % 89 + i).astype(dtype).reshape(shape)


async def counts(client: hc.Client, cluster: LocalCluster, index: int) -> tuple[int, int]:
    """(allreduces that ended as a pair, as a ring) coordinated on node ``index``."""
    node = cluster.nodes[index].node_id
    n = (await every_node_stats(client, [node]))[node]
    return n["allreduces_as_pair"], n["allreduces_as_ring"]


async def idle(client: hc.Client, objects: int) -> bool:
    local = (await client.status())["local"]
    return local["store"]["objects"] == objects and local["allreduces"] == 0


async def test_the_last_two_nodes_reduce_a_half_each(make_cluster, connect) -> None:
    """Four nodes put one input each, the last two APART s apart, after node 0 called the
    allreduce: nodes 2 and 3, the two without an input once two are missing, combine the
    halves, and every node gets numpy's sum (an odd size, and a 2-D int64 max). Deleting
    the results leaves only the inputs."""
    cluster = await make_cluster(4, daemon_args=ANY_SIZE)
    clients = [await connect(s) for s in cluster.sockets]
    cases = [(np.float32, "sum", (3 * MiB + 5,)), (np.int64, "max", (1000, 1031))]
    ops = {"sum": np.add, "max": np.maximum}
    for run, (dtype, op, shape) in enumerate(cases, start=1):
        arrays = [data(i, shape, dtype) for i in range(4)]
        ids = [ObjectID.random() for _ in range(4)]
        result = await clients[0].allreduce(ids, op=op, timeout=GET_TIMEOUT)
        for i, (c, a, oid) in enumerate(zip(clients, arrays, ids)):
            if i >= 2:
                await asyncio.sleep(APART)
            await c.put(a, object_id=oid)
        expected = ops[op].reduce(np.stack(arrays), axis=0)
        for c in clients:
            got = await c.get(result, timeout=GET_TIMEOUT)
            np.testing.assert_array_equal(got, expected)
            del got
        assert await counts(clients[0], cluster, 0) == (run, 0)
        await clients[0].delete(result)
    for c in clients:
        await eventually(lambda c=c: idle(c, 2), what="only the inputs left")


@dataclass
class Trio:
    """Five nodes, their inputs and the allreduce's result id."""

    cluster: LocalCluster
    clients: list[hc.Client]
    arrays: list[np.ndarray]
    ids: list[ObjectID]
    result: ObjectID


async def trio_called(make_cluster, connect, daemon_args: list[str]) -> Trio:
    """Five nodes; nodes 0 and 1 put before node 0 calls the allreduce, so they are heard
    together, far closer than TRIO_GAP transfers apart: once three inputs are missing, the
    three nodes without one are guessed to put them (docs/design.md §4, "Three
    combiners")."""
    cluster = await make_cluster(5, daemon_args=daemon_args)
    clients = [await connect(s) for s in cluster.sockets]
    arrays = [data(i, (6 * MiB + 7,)) for i in range(5)]
    ids = [ObjectID.random() for _ in range(5)]
    for i in (0, 1):
        await clients[i].put(arrays[i], object_id=ids[i])
    result = await clients[0].allreduce(ids, timeout=GET_TIMEOUT)
    return Trio(cluster, clients, arrays, ids, result)


async def node0_stats(trio: Trio) -> dict[str, int]:
    node = trio.cluster.nodes[0].node_id
    return (await every_node_stats(trio.clients[0], [node]))[node]


async def every_get_is_the_sum(trio: Trio, clients: list[hc.Client]) -> None:
    expected = np.add.reduce(np.stack(trio.arrays), axis=0)
    for c in clients:
        got = await asyncio.wait_for(c.get(trio.result, timeout=GET_TIMEOUT), GET_TIMEOUT)
        np.testing.assert_array_equal(got, expected)
        del got


async def test_the_last_three_nodes_reduce_a_third_each(make_cluster, connect) -> None:
    """Nodes 2, 3 and 4 then put APART s apart: the three combine a third each, and every
    node gets numpy's sum (an odd size). Node 4's combiner held node 3's input until its own
    was put (docs/design.md §4, "Who pulls a late input first"), the others held nothing.
    Deleting the result leaves only the inputs."""
    trio = await trio_called(make_cluster, connect, ANY_SIZE)
    for i in (2, 3, 4):
        await asyncio.sleep(APART)
        await trio.clients[i].put(trio.arrays[i], object_id=trio.ids[i])
    await every_get_is_the_sum(trio, trio.clients)
    stats = await node0_stats(trio)
    assert (stats["allreduces_as_trio"], stats["allreduces_as_pair"]) == (1, 0)
    late = [n.node_id for n in trio.cluster.nodes[2:5]]
    held = await every_node_stats(trio.clients[0], late)
    assert [held[n]["late_inputs_held"] for n in late] == [0, 0, 1]
    # node 4's input's leaves waited on node 4 before its put (docs/design.md §4, "The last
    # input's leaf placed ahead")
    assert [held[n]["late_leaves_ahead"] for n in late] == [1, 1, 0]
    await trio.clients[0].delete(trio.result)
    for c in trio.clients:
        await eventually(lambda c=c: idle(c, 1), what="only the input left")


async def test_a_trio_that_puts_nothing_still_fetches_every_third(make_cluster,
                                                                   connect) -> None:
    """Nodes 0 and 1 put all five inputs: the three combiners never put, so each fetches the
    other thirds once its own has a first element (``Member._until_put``), and every node
    gets the sum."""
    trio = await trio_called(make_cluster, connect, ANY_SIZE)
    for i in (2, 3, 4):
        await asyncio.sleep(APART)
        await trio.clients[i % 2].put(trio.arrays[i], object_id=trio.ids[i])
    await every_get_is_the_sum(trio, trio.clients)
    assert (await node0_stats(trio))["allreduces_as_trio"] == 1


async def test_a_wrong_guess_costs_no_correctness(make_cluster, connect) -> None:
    """Nodes 0 and 1 put all four inputs: the pair's combiners, nodes 2 and 3, hold none and
    pull every leaf from elsewhere; every node gets the sum."""
    cluster = await make_cluster(4, daemon_args=ANY_SIZE)
    clients = [await connect(s) for s in cluster.sockets]
    arrays = [data(i) for i in range(4)]
    ids = [ObjectID.random() for _ in range(4)]
    result = await clients[0].allreduce(ids, timeout=GET_TIMEOUT)
    for i, (a, oid) in enumerate(zip(arrays, ids)):
        if i >= 2:
            await asyncio.sleep(APART)
        await clients[i % 2].put(a, object_id=oid)
    for c in clients:
        np.testing.assert_array_equal(await c.get(result, timeout=GET_TIMEOUT), sum(arrays))
    assert await counts(clients[0], cluster, 0) == (1, 0)


async def leaves_placed_ahead(trio: Trio) -> None:
    """Wait until nodes 2 and 3, having put, placed the last input's leaves ahead on node 4."""
    late = [n.node_id for n in trio.cluster.nodes[2:4]]

    async def ahead() -> bool:
        stats = await every_node_stats(trio.clients[0], late)
        return [stats[n]["late_leaves_ahead"] for n in late] == [1, 1]

    await eventually(ahead, what="the last input's leaves placed ahead on node 4")


async def test_a_last_input_put_where_it_was_not_guessed_moves_its_leaves(
        make_cluster, connect) -> None:
    """Nodes 2 and 3 put, so nodes 2 and 3 place the last input's leaves ahead on node 4;
    the last input is put on node 0 instead: the leaves move there, and every node gets the
    sum."""
    trio = await trio_called(make_cluster, connect, ANY_SIZE)
    for i in (2, 3):
        await asyncio.sleep(APART)
        await trio.clients[i].put(trio.arrays[i], object_id=trio.ids[i])
    await leaves_placed_ahead(trio)
    await trio.clients[0].put(trio.arrays[4], object_id=trio.ids[4])
    await every_get_is_the_sum(trio, trio.clients)


async def test_a_leaf_placed_ahead_whose_input_is_late_waits_for_it(make_cluster,
                                                                     connect) -> None:
    """Node 4 puts the last input after its source's wait for it ran out (``AHEAD_WAIT``):
    the leaves placed ahead there were given up, and placed again once it was put."""
    trio = await trio_called(make_cluster, connect, ANY_SIZE)
    for i in (2, 3):
        await asyncio.sleep(APART)
        await trio.clients[i].put(trio.arrays[i], object_id=trio.ids[i])
    await leaves_placed_ahead(trio)
    # the point of the test: the input comes after the wait for it ran out, on purpose
    await asyncio.sleep(AHEAD_WAIT + 0.5)
    await trio.clients[4].put(trio.arrays[4], object_id=trio.ids[4])
    await every_get_is_the_sum(trio, trio.clients)


async def test_a_combiner_killed_before_it_puts_leaves_its_half_to_a_survivor(
        make_cluster, connect) -> None:
    """Nodes 0 and 1 put; nodes 2 and 3 combine the halves. Node 3 is SIGKILLed before it
    puts, and its input is put on node 1 instead: its half is reduced again by a survivor,
    and every survivor gets the exact sum."""
    cluster = await make_cluster(4, daemon_args=FAST_HEARTBEAT + ANY_SIZE)
    clients = [await connect(s) for s in cluster.sockets]
    arrays = [data(i) for i in range(4)]
    ids = [ObjectID.random() for _ in range(4)]
    result = await clients[0].allreduce(ids, timeout=GET_TIMEOUT)
    for i in (0, 1):
        await clients[i].put(arrays[i], object_id=ids[i])
    async def paired() -> bool:
        return await counts(clients[0], cluster, 0) == (1, 0)
    await eventually(paired, what="the pair")
    victim = cluster.nodes[3].node_id
    cluster.kill(3)
    await wait_member_dead(clients[0], victim)
    await clients[2].put(arrays[2], object_id=ids[2])
    await clients[1].put(arrays[3], object_id=ids[3])
    for c in clients[:3]:
        got = await asyncio.wait_for(c.get(result, timeout=GET_TIMEOUT), GET_TIMEOUT)
        np.testing.assert_array_equal(got, sum(arrays))
        del got


async def test_a_trio_combiner_killed_before_it_puts_leaves_its_third_to_a_survivor(
        make_cluster, connect) -> None:
    """Nodes 2, 3 and 4 combine a third each. Node 4 is SIGKILLed before it puts, and its
    input is put on node 1 instead: its third is reduced again by a survivor, and every
    survivor gets the exact sum."""
    trio = await trio_called(make_cluster, connect, FAST_HEARTBEAT + ANY_SIZE)

    async def guessed() -> bool:
        return (await node0_stats(trio))["allreduces_as_trio"] == 1

    await eventually(guessed, what="the trio")
    victim = trio.cluster.nodes[4].node_id
    trio.cluster.kill(4)
    await wait_member_dead(trio.clients[0], victim)
    for node, i in ((2, 2), (3, 3), (1, 4)):
        await trio.clients[node].put(trio.arrays[i], object_id=trio.ids[i])
    await every_get_is_the_sum(trio, trio.clients[:4])


async def test_a_trio_combiner_killed_after_its_put_is_replaced_by_a_survivor(
        make_cluster, connect) -> None:
    """Nodes 2 and 3 put, node 4's combiner holding node 3's input until its own (docs/design.md
    §4, "Who pulls a late input first"); node 3 is then SIGKILLed with its input and its
    third. Its input is put again on node 1, node 4 puts, and every survivor gets the exact
    sum."""
    trio = await trio_called(make_cluster, connect, FAST_HEARTBEAT + ANY_SIZE)
    for i in (2, 3):
        await asyncio.sleep(APART)
        await trio.clients[i].put(trio.arrays[i], object_id=trio.ids[i])
    victim = trio.cluster.nodes[3].node_id
    trio.cluster.kill(3)
    await wait_member_dead(trio.clients[0], victim)
    await trio.clients[1].put(trio.arrays[3], object_id=trio.ids[3])
    await trio.clients[4].put(trio.arrays[4], object_id=trio.ids[4])
    await every_get_is_the_sum(trio, [trio.clients[i] for i in (0, 1, 2, 4)])
    assert (await node0_stats(trio))["allreduces_as_trio"] == 1
