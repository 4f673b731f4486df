"""Repair on real daemons (docs/design.md §5): a node holding a reduce slot, or the only copy
of an object being received, dies, is frozen or loses its connections mid-stream, and the
survivors still get the right bytes.

Node 3 sits behind a fault-injecting proxy (tests/faultproxy.py) that carries every peer
connection to it at a known rate and counts the bytes: a kill, freeze or cut comes once a
quarter of node 3's output has passed, so it lands while the rest is still streaming, without
root or tc, however loaded the machine. A restarted task is modelled as the application
putting the lost input again, under the same id, on another node. Results are checked element
by element; failures by their typed errors.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import numpy as np
import pytest
from faultproxy import FaultProxy
from helpers import FAST_HEARTBEAT, eventually, every_node_stats, own_record

import hoplite_client
from hoplite_client import ObjectID
from hoplited.cluster.membership import rendezvous_owner
from hoplited.tools.failures import put_again
from hoplited.tools.local_cluster import LocalCluster

NODES = 4
VICTIM = 3
ELEMENTS = 4 << 20  # float32: 16 MiB per input
RATE = 16 << 20  # bytes/s through the victim's proxy: its output takes ~1 s to stream
MID_STREAM = ELEMENTS  # bytes of node 3's output (a quarter) passed when the fault comes
GET_TIMEOUT = 120.0
# The backup put after the kill comes this long after it, on purpose: once the coordinator
# has had its moment to see the slot lost.
BACKUP_LATER = 0.3


def value(i: int) -> np.ndarray:
    """Input ``i``: distinct small integers, so a float32 sum is exact in any order."""
    return (np.arange(ELEMENTS, dtype=np.float32) % 97) + i


def expected(nodes: range) -> np.ndarray:
    return sum((value(i) for i in nodes), np.zeros(ELEMENTS, dtype=np.float32))


Cluster = tuple[LocalCluster, FaultProxy, list[hoplite_client.Client]]


@pytest.fixture
async def proxied(make_cluster: Callable[..., Awaitable[LocalCluster]],
                  connect: Callable[[str], Awaitable[hoplite_client.Client]]
                  ) -> AsyncIterator[Cluster]:
    """Four daemons; every peer connection to node 3 passes through a rate-limited proxy."""
    proxy = await FaultProxy.free_pair(rate=RATE)
    try:
        # in the merged-host test node 1 holds its input, both inputs put again and the slot
        # adding them, beside the old placements a restart still pins for a moment, which
        # new buffers wait for (docs/architecture.md §6); 768 MiB leaves that room
        victim_args = ["--listen", f"{proxy.target_host}:{proxy.port}",
                       "--advertise", proxy.listen_host]
        cluster = await make_cluster(NODES, capacity="768MiB", daemon_args=FAST_HEARTBEAT,
                                     node_args={VICTIM: victim_args})
        clients = [await connect(s) for s in cluster.sockets]
        yield cluster, proxy, clients
    finally:
        await proxy.stop()


async def mid_stream(proxy: FaultProxy, start: int) -> None:
    """Return once a quarter of an input has passed node 3's proxy since ``start`` (its count
    before the transfer began): node 3's output is streaming, three quarters still to come."""
    await proxy.forwarded(start + MID_STREAM)


async def waits_at_shards(client: hoplite_client.Client, waiting: int) -> None:
    """Wait until the reduce's waits for inputs at their shards number ``waiting``: each shard
    has answered the coordinator for the inputs put so far (so it hears of them in the order
    they were put), or the wait for a backup was cancelled once the inputs were chosen."""

    async def answered() -> bool:
        nodes = (await client.status())["nodes"]
        return sum(n["directory"]["waiting_gets"] for n in nodes) == waiting

    await eventually(answered, what=f"{waiting} waits for inputs left at their shards")


def check(results: list[np.ndarray], nodes: range) -> None:
    want = expected(nodes)
    for got in results:
        assert got.dtype == np.float32 and got.shape == want.shape
        assert np.array_equal(got, want)


async def test_allreduce_survives_a_killed_input_holder_whose_input_is_put_again(
        proxied: Cluster) -> None:
    """k = n: node 3 is SIGKILLed while its slot's output streams; its input is put again on
    node 1 and every survivor gets the full sum, the lost slot resumed where its consumer
    stopped."""
    cluster, proxy, clients = proxied
    ids = [await c.put(value(i)) for i, c in enumerate(clients)]
    start = proxy.bytes_forwarded
    result = await clients[0].reduce(ids)
    gets = [asyncio.ensure_future(c.get(result, timeout=GET_TIMEOUT)) for c in clients[:VICTIM]]
    await mid_stream(proxy, start)
    cluster.kill(VICTIM)
    await put_again(clients[1], ids[VICTIM], value(VICTIM))
    check(list(await asyncio.gather(*gets)), range(NODES))
    assert proxy.bytes_forwarded < value(VICTIM).nbytes, "node 3's output was never all sent"


@pytest.mark.parametrize(("again_on", "into"), [
    (0, "the consumer"), (2, "the child"), (1, "the lost slot, placed where the leaf runs")],
    ids=["into-the-consumer", "into-the-child", "taking-the-leaf-over"])
async def test_a_lost_input_put_again_where_a_slot_runs_is_folded_into_it(
        proxied: Cluster, again_on: int, into: str) -> None:
    """Inputs ready in the order 0 (local: the root, on node 0), 1, 2, 3 make the chain
    node 1 → node 2 → node 3 → root. Node 3 dies while its output streams; its input is put
    again on a node that computes a slot already, and is added into that slot instead of
    streamed on its own (docs/design.md §5, "Folding a lost input"): into the root, which had
    not combined past the lost bytes, or into node 2's slot, which had combined everything
    (the root then pulls the input itself for those bytes). Put again on node 1, where only
    the leaf runs, the lost slot is placed there and adds the leaf's input from where node 2
    stopped adding it. Every getter gets the exact sum."""
    cluster, proxy, clients = proxied
    ids = [ObjectID.random() for _ in clients]
    start = proxy.bytes_forwarded
    result = await clients[0].reduce(ids)
    for i, c in enumerate(clients):
        await c.put(value(i), object_id=ids[i])
        await waits_at_shards(clients[0], NODES - 1 - i)  # ready in this order: slots follow
    gets = [asyncio.ensure_future(c.get(result, timeout=GET_TIMEOUT)) for c in clients[:VICTIM]]
    await mid_stream(proxy, start)
    cluster.kill(VICTIM)
    await put_again(clients[again_on], ids[VICTIM], value(VICTIM))
    check(list(await asyncio.gather(*gets)), range(NODES))
    assert proxy.bytes_forwarded < value(VICTIM).nbytes, "node 3's output was never all sent"
    names = {n.node_id: i for i, n in enumerate(cluster.nodes[:VICTIM])}
    folds = {names[node]: n["reduce_folds"]
             for node, n in (await every_node_stats(clients[0], names)).items()}
    assert folds == {i: int(again_on == i) for i in range(VICTIM)}, into


async def test_a_killed_node_holding_merged_inputs_loses_them_all_and_the_sum_is_right(
        proxied: Cluster) -> None:
    """Node 3 holds two inputs, which one slot there adds (docs/design.md §4, "Several inputs
    on one node"): it is SIGKILLed while that slot's output streams. Both inputs are put
    again on node 1 and every survivor gets the exact sum of all five."""
    cluster, proxy, clients = proxied
    homes = [0, 1, 2, VICTIM, VICTIM]
    ids = [await clients[node].put(value(i)) for i, node in enumerate(homes)]
    start = proxy.bytes_forwarded
    result = await clients[0].reduce(ids)
    gets = [asyncio.ensure_future(c.get(result, timeout=GET_TIMEOUT)) for c in clients[:VICTIM]]
    await mid_stream(proxy, start)
    node0 = cluster.nodes[0].node_id
    merged = (await every_node_stats(clients[0], [node0]))[node0]["reduce_merges"]
    assert merged == 1, "node 3's second input took a slot of its own"
    cluster.kill(VICTIM)
    for i, node in enumerate(homes):
        if node == VICTIM:
            await put_again(clients[1], ids[i], value(i))
    check(list(await asyncio.gather(*gets)), range(len(homes)))
    assert proxy.bytes_forwarded < value(VICTIM).nbytes, "node 3's output was never all sent"
    again = (await every_node_stats(clients[0], [node0]))[node0]["reduce_merges"] - merged
    assert again >= 1, "the inputs put again on node 1 each took a slot of their own"


async def test_root_slot_on_a_killed_node_is_placed_again(proxied: Cluster) -> None:
    """The coordinator holds no input, so the last input to be ready (node 3's) takes the
    root and node 0 pulls the root's output into the result; node 3 dies mid-stream and the
    root is placed again where its input is put again (node 0 itself: computed in place)."""
    cluster, proxy, clients = proxied
    ids = [await clients[i].put(value(i)) for i in (1, 2)]
    late = ObjectID.random()
    start = proxy.bytes_forwarded
    result = await clients[0].reduce([*ids, late])
    await waits_at_shards(clients[0], 1)  # slots 0 and 1 placed; the root waits for the late input
    await clients[VICTIM].put(value(VICTIM), object_id=late)
    gets = [asyncio.ensure_future(c.get(result, timeout=GET_TIMEOUT)) for c in clients[:VICTIM]]
    await mid_stream(proxy, start)
    cluster.kill(VICTIM)
    await put_again(clients[0], late, value(VICTIM))
    check(list(await asyncio.gather(*gets)), range(1, NODES))


@pytest.mark.parametrize("backup_first", [True, False], ids=["backup-ready", "backup-later"])
async def test_a_backup_input_takes_a_killed_slot_and_the_result_restarts(
        proxied: Cluster, backup_first: bool) -> None:
    """k = 3 of 4: node 3's input is chosen and streaming when node 3 is SIGKILLed; the backup
    (put on node 0 after the choice, before or after the kill) takes its slot. Its consumer had
    bytes of the lost value, so the path to the result and the result start again: every
    getter, including those with partial copies, gets exactly the sum of the inputs used."""
    cluster, proxy, clients = proxied
    ids = [await clients[i].put(value(i)) for i in (1, 2, VICTIM)]
    backup = ObjectID.random()
    start = proxy.bytes_forwarded
    result = await clients[0].reduce([*ids, backup], num_objects=3)
    await waits_at_shards(clients[0], 0)  # the three inputs are chosen; the backup's wait cancelled
    if backup_first:
        await clients[0].put(value(0), object_id=backup)
    gets = [asyncio.ensure_future(c.get(result, timeout=GET_TIMEOUT)) for c in clients[:VICTIM]]
    await mid_stream(proxy, start)
    cluster.kill(VICTIM)
    if not backup_first:
        await asyncio.sleep(BACKUP_LATER)
        await clients[0].put(value(0), object_id=backup)
    check(list(await asyncio.gather(*gets)), range(VICTIM))
    assert sorted(await clients[0].reduced_inputs(result, timeout=GET_TIMEOUT)) == sorted(
        [ids[0], ids[1], backup])
    assert proxy.bytes_forwarded < value(VICTIM).nbytes, "node 3's output was never all sent"


async def test_cut_connections_are_resumed_without_a_repair(proxied: Cluster) -> None:
    """Every connection to node 3 is reset mid-stream while node 3 lives on: the broken pulls
    are reconnected and resume at their offsets; nothing is put again."""
    cluster, proxy, clients = proxied
    ids = [await c.put(value(i)) for i, c in enumerate(clients)]
    start = proxy.bytes_forwarded
    result = await clients[0].reduce(ids)
    gets = [asyncio.ensure_future(c.get(result, timeout=GET_TIMEOUT)) for c in clients]
    for quarter in (1, 2, 3):  # cut a quarter, a half and three quarters into node 3's output
        await proxy.forwarded(start + quarter * MID_STREAM)
        await proxy.cut()
    check(list(await asyncio.gather(*gets)), range(NODES))


async def test_a_frozen_input_holder_is_repaired_once_declared_dead(proxied: Cluster) -> None:
    """SIGSTOP: node 3's sockets stay open and nothing flows. Once the membership declares it
    dead (heartbeat timeout), its slot is placed again on the copy put again on node 2."""
    cluster, proxy, clients = proxied
    ids = [await c.put(value(i)) for i, c in enumerate(clients)]
    start = proxy.bytes_forwarded
    result = await clients[0].reduce(ids)
    gets = [asyncio.ensure_future(c.get(result, timeout=GET_TIMEOUT)) for c in clients[:VICTIM]]
    await mid_stream(proxy, start)
    cluster.kill(VICTIM, signal.SIGSTOP)
    try:
        await put_again(clients[2], ids[VICTIM], value(VICTIM))
        check(list(await asyncio.gather(*gets)), range(NODES))
    finally:
        cluster.kill(VICTIM, signal.SIGCONT)


async def test_a_lost_input_that_never_comes_back_fails_every_waiter_at_once(
        proxied: Cluster) -> None:
    """Nobody puts node 3's input again: when the reduce's own timeout runs out, every
    survivor's get fails together with a typed error naming node 3."""
    cluster, proxy, clients = proxied
    ids = [await c.put(value(i)) for i, c in enumerate(clients)]
    # 4 s: the reduce's verdict must come well before a getter chained behind the stalled
    # result gives up on its own (no sooner than the heartbeat timeout + 2 intervals after
    # its first fruitless pull, docs/design.md §5); with 8 s the two raced on a loaded machine
    start = proxy.bytes_forwarded
    result = await clients[0].reduce(ids, timeout=4)
    gets = [asyncio.ensure_future(c.get(result, timeout=GET_TIMEOUT)) for c in clients[:VICTIM]]
    await mid_stream(proxy, start)
    cluster.kill(VICTIM)
    ended = []
    for get in gets:
        with pytest.raises(hoplite_client.PeerUnavailableError) as info:
            await get
        ended.append(time.monotonic())
        assert cluster.nodes[VICTIM].node_id in str(info.value)
    assert max(ended) - min(ended) < 4, ended


async def test_a_get_whose_only_source_dies_completes_from_the_id_put_again(
        proxied: Cluster) -> None:
    """Node 0 is receiving node 3's object when node 3 is SIGKILLed; the same id is put again
    on node 2 (another put: another version). The get drops its partial copy, never splicing
    the two puts, and completes from node 2."""
    cluster, proxy, clients = proxied
    data = value(VICTIM)
    oid = await clients[VICTIM].put(data)
    start = proxy.bytes_forwarded
    get = asyncio.ensure_future(clients[0].get(oid, timeout=GET_TIMEOUT))
    await mid_stream(proxy, start)
    cluster.kill(VICTIM)
    await put_again(clients[2], oid, data)
    got = await get
    assert got.dtype == data.dtype and np.array_equal(got, data)
    assert proxy.bytes_forwarded < data.nbytes, "node 3's copy was never all sent"


async def _copied_then_pulled_from_node_3(cluster: LocalCluster, proxy: FaultProxy,
                                          clients: list[hoplite_client.Client]
                                          ) -> tuple[np.ndarray, asyncio.Future[Any], int]:
    """An 8 MiB object put on node 3 and copied whole to node 1; node 0's get of it then
    pulls from node 3 (the earliest complete holder; a get that took node 1's copy instead
    ends, and a new object is tried, five at most) through the slow proxy, and has received
    a quarter of it. Returns the data, the get and the proxy's count from before it."""
    data = value(VICTIM)[: 2 << 20]
    node3 = cluster.nodes[VICTIM].node_id
    for _ in range(5):
        oid = await clients[VICTIM].put(data)
        await clients[1].get(oid, timeout=GET_TIMEOUT)
        start = proxy.bytes_forwarded
        get = asyncio.ensure_future(clients[0].get(oid, timeout=GET_TIMEOUT))

        async def source(get: asyncio.Future[Any] = get, oid: ObjectID = oid) -> str | None:
            if get.done():
                return "done"
            transfers = (await clients[0].status())["local"]["transfers"]
            return next((str(t["source"]) for t in transfers
                         if t["object"] == oid.hex() and t["source"]), None)

        if await eventually(source, what="node 0's source") == node3:
            await proxy.forwarded(start + data.nbytes // 4)
            return data, get, start
        assert np.array_equal(await get, data)
    raise AssertionError("five gets on node 0 took node 1's copy, none node 3's")


async def test_broadcast_survives_the_original_holder_killed_after_a_copy(
        proxied: Cluster) -> None:
    """Node 3 (the put's node) dies while node 0 receives from it: node 0 keeps its bytes and
    resumes from node 1's copy."""
    cluster, proxy, clients = proxied
    data, get, start = await _copied_then_pulled_from_node_3(cluster, proxy, clients)
    cluster.kill(VICTIM)
    assert np.array_equal(await get, data)
    assert proxy.bytes_forwarded < start + data.nbytes, "node 3 sent node 0 all of it"


async def test_broadcast_leaves_a_silent_source(proxied: Cluster) -> None:
    """Node 3's links go silent (the proxy stops every byte, sockets open) while node 0
    receives from it: node 0 resumes from node 1's copy after a stall window (on loopback
    about a second, before the heartbeat's verdict; either way it never waits on node 3)."""
    cluster, proxy, clients = proxied
    data, get, start = await _copied_then_pulled_from_node_3(cluster, proxy, clients)
    proxy.stall()
    try:
        assert np.array_equal(await get, data)
    finally:
        proxy.resume()


def ids_owned(nodes: list[str], owners: list[str | None]) -> list[ObjectID]:
    """One id per entry of ``owners``: owned by that node (None: by any node but node 3)."""
    def fits(oid: ObjectID, owner: str | None) -> bool:
        got = rendezvous_owner(oid, nodes)
        return got == owner if owner is not None else got != nodes[VICTIM]
    ids = []
    for owner in owners:
        oid = ObjectID.random()
        while not fits(oid, owner):
            oid = ObjectID.random()
        ids.append(oid)
    return ids


# which ids node 3's shard owns: none; the lost input's (put again while node 3 is silent, the
# put and the reduce's wait for it go to a stand-in shard); the result's (its getters locate it
# at the stand-in) -- docs/design.md §5, "Ownership"
FROZEN_OWNS = {"nothing": (), "the lost input": (VICTIM,), "the result": (NODES,)}


@pytest.mark.parametrize("owns", FROZEN_OWNS, ids=list(FROZEN_OWNS))
async def test_a_frozen_input_holder_is_repaired_around_before_any_verdict(
        owns: str, make_cluster: Callable[..., Awaitable[LocalCluster]],
        connect: Callable[[str], Awaitable[hoplite_client.Client]]) -> None:
    """SIGSTOP with a heartbeat timeout far beyond the test: node 3 is only *suspected* (its
    Ping unanswered for 1 s), yet its slot is repaired on the copy put again on node 2, every
    survivor gets the full sum, and node 3 is still a member throughout, whichever ids its
    shard owns. Once it runs again it is trusted again (docs/design.md §5, "Suspicion")."""
    proxy = await FaultProxy.free_pair(rate=RATE)
    try:
        cluster = await make_cluster(NODES, daemon_args=[
            "--heartbeat-interval", "0.5", "--heartbeat-timeout", "600", "--suspect-after", "1"],
            node_args={VICTIM: ["--listen", f"{proxy.target_host}:{proxy.port}",
                                "--advertise", proxy.listen_host]})
        clients = [await connect(s) for s in cluster.sockets]
        nodes = [n.node_id for n in cluster.nodes]
        own = ids_owned(nodes, [nodes[VICTIM] if i in FROZEN_OWNS[owns] else None
                                for i in range(NODES + 1)])
        ids = [await c.put(value(i), object_id=own[i]) for i, c in enumerate(clients)]
        start = proxy.bytes_forwarded
        result = await clients[0].reduce(ids, object_id=own[NODES])
        gets = [asyncio.ensure_future(c.get(result, timeout=GET_TIMEOUT))
                for c in clients[:VICTIM]]
        await mid_stream(proxy, start)
        cluster.kill(VICTIM, signal.SIGSTOP)
        try:
            await put_again(clients[2], ids[VICTIM], value(VICTIM))
            check(list(await asyncio.gather(*gets)), range(NODES))
            # node 0's own view (a client's status would wait on frozen node 3 for seconds)
            members = {m["node_id"]: m for m in (await own_record(cluster, 0))["members"]}
            victim = members[cluster.nodes[VICTIM].node_id]
            assert victim["alive"] and victim["suspected"], victim
        finally:
            cluster.kill(VICTIM, signal.SIGCONT)

        async def trusted_again() -> bool:
            members = (await clients[0].status())["local"]["members"]
            return all(m["alive"] and not m["suspected"] for m in members)

        await eventually(trusted_again, what="node 3 trusted again after SIGCONT")
        # its objects are back at its shard, found from every node, node 3 included
        for c in clients:
            check([await c.get(result, timeout=GET_TIMEOUT)], range(NODES))
            assert np.array_equal(await c.get(ids[VICTIM], timeout=GET_TIMEOUT), value(VICTIM))
    finally:
        await proxy.stop()
