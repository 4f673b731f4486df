"""Broadcasts taken as two trees of halves (docs/design.md §3, "Two trees of halves for a
broadcast"), through real daemons and clients: the bytes every receiver gets, a receiver that
is inner in a tree killed while it forwards, counts that do not match the gets, deletion.

``--two-trees always`` forces the shape: on loopback the rule never takes it (hops cost
nothing next to S/B), as on the emulated links below N = 256.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from faultproxy import FaultProxy
from helpers import FAST_HEARTBEAT, eventually, local_stats
from test_reduce import node_stats, wait_settled

import hoplite_client as hc
from hoplited.cluster.membership import rendezvous_owner
from hoplited.tools.local_cluster import LocalCluster

ALWAYS = ["--two-trees", "always"]
GET_TIMEOUT = 120
MiB = 1024 * 1024


async def halved(client: hc.Client, cluster: LocalCluster) -> dict[int, int]:
    """How many objects each node received as two halves."""
    return {i: s["gets_in_halves"] for i, s in (await node_stats(client, cluster)).items()}


async def survivors_hold_nothing(client: hc.Client, cluster: LocalCluster) -> bool:
    """Every node that answers holds no object and keeps no deleted-but-pinned memory."""
    stats = await node_stats(client, cluster)
    return all(s["store"]["objects"] == 0 and s["store"]["pinned_deleted"] == 0
               for s in stats.values() if s.get("store") is not None)


async def fetching(cluster: LocalCluster, index: int, oid: hc.ObjectID) -> None:
    """Wait until node ``index`` has a fetch of ``oid`` under way (its get has begun)."""
    with open(cluster.token_file, "rb") as f:
        token = f.read().strip()

    async def under_way() -> bool:
        transfers = (await local_stats(cluster.nodes[index], token))["transfers"]
        return any(t["object"] == oid.hex() for t in transfers)

    await eventually(under_way, what=f"node {index} fetching {oid.hex()}")


def payload(shape: tuple[int, ...], dtype: type, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 1 << 30, size=shape).astype(dtype)


async def test_every_receiver_gets_the_bytes_of_both_halves(make_cluster, connect) -> None:
    """Six nodes; node 0 puts, five get at once saying they are five: each gets the object
    as two halves and holds exactly the put's bytes, dtype and shape; sizes that are no
    multiple of a page or of the halves' alignment, 1-D and 2-D. Afterwards each node holds
    one object per broadcast (the halves' views are gone) and nothing stays pinned; deleted,
    they are gone everywhere."""
    cluster = await make_cluster(6, daemon_args=ALWAYS)
    clients = [await connect(s) for s in cluster.sockets]
    cases = [((3 * MiB // 8 + 7,), np.float64), ((301, 1001), np.int32),
             ((5 * MiB + 13,), np.uint8)]
    oids = []
    for seed, (shape, dtype) in enumerate(cases):
        data = payload(shape, dtype, seed)
        oid = await clients[0].put(data)
        oids.append(oid)
        got = await asyncio.gather(*(c.get(oid, timeout=GET_TIMEOUT, receivers=5)
                                     for c in clients[1:]))
        for i, array in enumerate(got, start=1):
            assert array.dtype == data.dtype and array.shape == data.shape, (i, shape)
            assert np.array_equal(array, data), (i, shape)
    assert await halved(clients[0], cluster) == {0: 0, **{i: len(cases) for i in range(1, 6)}}
    await wait_settled(clients[0], cluster, {i: len(cases) for i in range(6)})
    del got, array  # the clients' views pin their copies
    for oid in oids:
        await clients[0].delete(oid)
    await wait_settled(clients[0], cluster, {i: 0 for i in range(6)})


async def test_receivers_that_do_not_match_the_count_still_get_it(make_cluster,
                                                                   connect) -> None:
    """Gets that say 4 receivers when 2 come (their parents in tree 1 never ask: they wait a
    moment, then take another source), and 2 receivers when 4 come (those past the count have
    no place in the trees and take the usual choice): every get ends with the bytes."""
    cluster = await make_cluster(5, daemon_args=ALWAYS)
    clients = [await connect(s) for s in cluster.sockets]
    for seed, (said, getters) in enumerate([(4, clients[1:3]), (2, clients[1:5])]):
        data = payload((MiB,), np.float32, seed)
        oid = await clients[0].put(data)
        got = await asyncio.gather(*(c.get(oid, timeout=GET_TIMEOUT, receivers=said)
                                     for c in getters))
        assert all(np.array_equal(a, data) for a in got), (said, len(getters))


async def test_deleting_the_object_ends_the_gets_in_halves(make_cluster, connect) -> None:
    """An object deleted while receivers take it in halves (one receiver's parent never
    asks, so it waits): the waiting get fails with the typed error, and no receiver keeps a
    copy, a view or a pin."""
    cluster = await make_cluster(4, daemon_args=ALWAYS)
    clients = [await connect(s) for s in cluster.sockets]
    oid = await clients[0].put(payload((4 * MiB,), np.float32, 3))
    waiting = asyncio.ensure_future(clients[1].get(oid, timeout=GET_TIMEOUT, receivers=3))
    await fetching(cluster, 1, oid)  # receiver 0 waits for receiver 1, its parent in tree 1
    await clients[0].delete(oid)
    with pytest.raises((hc.ObjectDeletedError, hc.ObjectNotFoundError)):
        await waiting
    await wait_settled(clients[0], cluster, {i: 0 for i in range(4)})


@pytest.mark.parametrize("victim_owns", [False, True],
                         ids=["shard-elsewhere", "the-victim-is-the-shard"])
async def test_a_receiver_killed_while_it_forwards_a_half(make_cluster, connect,
                                                          victim_owns: bool) -> None:
    """Node 3 asks first, so it is the top of tree 0 and forwards half 0 to two receivers,
    through a rate-limited proxy; it is SIGKILLed mid-stream. Its children take half 0 from
    another source and every surviving receiver gets the put's bytes; their copies are then
    known to the directory (a get uses them, a delete removes them). When node 3 was also
    the object's shard, the stand-in shard's entry is rebuilt from announcements, with no
    trees: it learns them again from what each receiver says when it locates a half."""
    rate = 16 * MiB
    proxy = await FaultProxy.free_pair(rate=rate)
    try:
        cluster = await make_cluster(6, daemon_args=[*ALWAYS, *FAST_HEARTBEAT], node_args={
            3: ["--listen", f"{proxy.target_host}:{proxy.port}",
                "--advertise", proxy.listen_host]})
        clients = [await connect(s) for s in cluster.sockets]
        nodes = [n.node_id for n in cluster.nodes]
        oid = hc.ObjectID.random()
        while (rendezvous_owner(oid, nodes) == nodes[3]) != victim_owns:
            oid = hc.ObjectID.random()
        data = payload((4 * MiB,), np.float32, 4)  # 16 MiB: half 0 to two children takes ~1 s
        await clients[0].put(data, object_id=oid)
        first = asyncio.ensure_future(clients[3].get(oid, timeout=GET_TIMEOUT, receivers=5))
        await fetching(cluster, 3, oid)  # node 3 is receiver 0: inner in tree 0
        start = proxy.bytes_forwarded
        others = [asyncio.ensure_future(c.get(oid, timeout=GET_TIMEOUT, receivers=5))
                  for i, c in enumerate(clients) if i not in (0, 3)]
        await proxy.forwarded(start + data.nbytes // 8)  # a quarter of half 0 to each child
        cluster.kill(3)
        got = await asyncio.gather(*others)
        assert all(np.array_equal(a, data) for a in got)
        assert proxy.bytes_forwarded < data.nbytes, "node 3 forwarded half 0 to both children"
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)
        stats = await node_stats(clients[0], cluster)
        assert {i: stats[i]["gets_in_halves"] for i in (0, 1, 2, 4, 5)} == {
            0: 0, 1: 1, 2: 1, 4: 1, 5: 1}
        again = await clients[1].get(oid, timeout=GET_TIMEOUT)  # its copy is known
        assert np.array_equal(again, data)
        del got, again, others  # the clients' views (the futures' results) pin the copies
        await clients[0].delete(oid)  # and every survivor's copy goes with the entry
        await eventually(lambda: survivors_hold_nothing(clients[0], cluster),
                         what="every survivor's copy, view and pin gone")
    finally:
        await proxy.stop()
