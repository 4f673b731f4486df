"""Reduces run as two trees of halves (docs/design.md §4), through real daemons and clients:
results against numpy, a killed input holder, deletion, bad inputs and timeouts."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import numpy as np
import pytest
from faultproxy import FaultProxy
from helpers import FAST_HEARTBEAT, eventually
from test_reduce import check_result, make_inputs, node_stats, put_spaced, wait_settled
from test_repair import NODES, RATE, VICTIM, check, mid_stream, value

import hoplite_client as hc
from hoplited.tools.failures import put_again
from hoplited.tools.local_cluster import LocalCluster

ALWAYS = ["--two-trees", "always"]
GET_TIMEOUT = 120
KiB, MiB = 1024, 1024 * 1024


async def halved(client: hc.Client, cluster: LocalCluster) -> dict[int, int]:
    """How many reduces each node coordinated as two trees of halves."""
    return {i: s["reduces_in_halves"] for i, s in (await node_stats(client, cluster)).items()}


async def test_two_trees_of_halves_match_numpy(make_cluster, connect) -> None:
    """Sums, minima, maxima and products of every input on 5 nodes, as two trees of halves:
    sizes that are no multiple of a page, 2-D shapes, a caller with and without an input,
    inputs put before and after the reduce; each result is numpy's, and only the inputs and
    results remain in the stores."""
    cluster = await make_cluster(5, daemon_args=ALWAYS)
    clients = [await connect(s) for s in cluster.sockets]
    rng = np.random.default_rng(7)
    cases = [  # (dtype, op, shape, caller, input nodes, issued before the puts)
        (np.float64, "sum", (3 * MiB // 8 + 7,), 0, [0, 1, 2, 3, 4], False),
        (np.int32, "max", (300, 1001), 1, [2, 3, 4, 0], False),
        (np.uint8, "min", (200 * KiB + 13,), 2, [4, 0, 1], True),
        (np.float32, "prod", (150 * KiB // 4 + 1,), 3, [3, 4, 0, 1, 2], True),
        (np.int64, "sum", (5 * MiB // 8,), 4, [0, 1, 2, 3], True),
    ]
    objects = {i: 0 for i in range(5)}
    for dtype, op, shape, caller, nodes, early in cases:
        what = f"{op} {np.dtype(dtype)}{shape} on {nodes}"
        arrays = make_inputs(rng, dtype, op, len(nodes), shape)
        if early:
            ids = [hc.ObjectID.random() for _ in nodes]
            result = await clients[caller].reduce(ids, op=op)
            await put_spaced(clients, arrays, nodes, ids, list(range(len(nodes))),
                             [0.05] * len(nodes))
        else:
            ids = [await clients[nd].put(a) for nd, a in zip(nodes, arrays)]
            result = await clients[caller].reduce(ids, op=op)
        check_result(await clients[caller].get(result, timeout=GET_TIMEOUT), op, arrays, what)
        elsewhere = (caller + 1) % 5
        check_result(await clients[elsewhere].get(result, timeout=GET_TIMEOUT), op, arrays,
                     f"{what}, got on node {elsewhere}")
        used = await clients[caller].reduced_inputs(result, timeout=GET_TIMEOUT)
        assert sorted(used) == sorted(ids), what
        for nd in nodes:
            objects[nd] += 1
        objects[caller] += 1
        objects[elsewhere] += 1
    assert await halved(clients[0], cluster) == {i: 1 for i in range(5)}
    await wait_settled(clients[0], cluster, objects)


async def test_a_reduce_on_loopback_keeps_one_tree_by_default(make_cluster, connect) -> None:
    """With the default rule, hops on loopback cost nothing next to S/B: one tree."""
    cluster = await make_cluster(4)
    clients = [await connect(s) for s in cluster.sockets]
    arrays = [np.full(MiB, i, dtype=np.float32) for i in range(4)]
    ids = [await c.put(a) for c, a in zip(clients, arrays)]
    result = await clients[0].reduce(ids)
    check_result(await clients[0].get(result, timeout=GET_TIMEOUT), "sum", arrays, "auto")
    assert await halved(clients[0], cluster) == {i: 0 for i in range(4)}


async def test_a_deleted_result_stops_both_halves(make_cluster, connect) -> None:
    """A reduce waiting for its last input is deleted: the gets of its result fail with
    ObjectDeletedError, and no half, slot output or partial result stays anywhere."""
    cluster = await make_cluster(4, daemon_args=ALWAYS)
    clients = [await connect(s) for s in cluster.sockets]
    ids = [hc.ObjectID.random() for _ in range(4)]
    result = await clients[0].reduce(ids, timeout=GET_TIMEOUT)
    for i in range(3):
        await clients[i].put(np.full(MiB, i, dtype=np.float32), object_id=ids[i])
    gets = [asyncio.ensure_future(c.get(result, timeout=GET_TIMEOUT)) for c in clients[:2]]

    async def in_halves() -> bool:
        return await halved(clients[0], cluster) == {0: 1, 1: 0, 2: 0, 3: 0}

    await eventually(in_halves, what="the reduce coordinated in halves on node 0")
    assert not any(g.done() for g in gets)
    await clients[0].delete(result)
    for g in gets:
        with pytest.raises(hc.ObjectDeletedError):
            await g
    await wait_settled(clients[0], cluster, {0: 1, 1: 1, 2: 1, 3: 0})


async def test_a_mismatched_input_fails_the_reduce_typed(make_cluster, connect) -> None:
    """An input of another shape fails both halves' plans: the caller's and another node's
    gets raise InvalidArgumentError, and the stores keep only the inputs."""
    cluster = await make_cluster(4, daemon_args=ALWAYS)
    clients = [await connect(s) for s in cluster.sockets]
    ids = [await clients[i].put(np.ones(MiB, dtype=np.float32)) for i in range(3)]
    ids.append(await clients[3].put(np.ones(MiB + 1, dtype=np.float32)))
    result = await clients[0].reduce(ids)
    for c in (clients[0], clients[2]):
        with pytest.raises(hc.InvalidArgumentError):
            await c.get(result, timeout=GET_TIMEOUT)
    await wait_settled(clients[0], cluster, {i: 1 for i in range(4)})


async def test_an_input_that_never_comes_times_the_reduce_out(make_cluster, connect) -> None:
    """The reduce's own timeout holds with two trees: the caller's get raises
    HopliteTimeoutError once it passes, and the partial result is dropped."""
    cluster = await make_cluster(3, daemon_args=ALWAYS)
    clients = [await connect(s) for s in cluster.sockets]
    ids = [await clients[i].put(np.ones(MiB, dtype=np.float32)) for i in range(2)]
    ids.append(hc.ObjectID.random())
    result = await clients[0].reduce(ids, timeout=3.0)
    with pytest.raises(hc.HopliteTimeoutError):
        await clients[0].get(result, timeout=GET_TIMEOUT)
    await wait_settled(clients[0], cluster, {0: 1, 1: 1, 2: 0})


# --- a killed input holder (the failure of test_repair.py, in halves) ---
@pytest.fixture
async def proxied(make_cluster: Callable[..., Awaitable[LocalCluster]],
                  connect: Callable[[str], Awaitable[hc.Client]]
                  ) -> AsyncIterator[tuple[LocalCluster, FaultProxy, list[hc.Client]]]:
    """Four daemons reducing in halves; peer connections to node 3 pass a slow proxy (16 MiB
    inputs, 8 MiB halves, ~1 s to stream)."""
    proxy = await FaultProxy.free_pair(rate=RATE)
    try:
        cluster = await make_cluster(NODES, daemon_args=[*FAST_HEARTBEAT, *ALWAYS], node_args={
            VICTIM: ["--listen", f"{proxy.target_host}:{proxy.port}",
                     "--advertise", proxy.listen_host]})
        yield cluster, proxy, [await connect(s) for s in cluster.sockets]
    finally:
        await proxy.stop()


async def test_both_halves_survive_a_killed_input_holder(proxied) -> None:
    """Node 3 is SIGKILLed while its halves stream; its input is put again on node 1, each
    half places its lost slot anew, and every survivor gets the exact sum."""
    cluster, proxy, clients = proxied
    ids = [await c.put(value(i)) for i, c in enumerate(clients)]
    start = proxy.bytes_forwarded
    result = await clients[0].reduce(ids)
    gets = [asyncio.ensure_future(c.get(result, timeout=GET_TIMEOUT)) for c in clients[:VICTIM]]
    await mid_stream(proxy, start)
    cluster.kill(VICTIM)
    await put_again(clients[1], ids[VICTIM], value(VICTIM))
    check(list(await asyncio.gather(*gets)), range(NODES))
    assert proxy.bytes_forwarded < value(VICTIM).nbytes, "node 3's halves were all sent"
    status = {n["node_id"]: n for n in (await clients[0].status())["nodes"]}
    assert status[cluster.nodes[0].node_id]["reduces_in_halves"] == 1
