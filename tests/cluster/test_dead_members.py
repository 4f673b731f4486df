"""Killed and frozen daemons: shared memory, ownership moves and death detection."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import numpy as np
import pytest
from helpers import (
    FAST_HEARTBEAT,
    IO_TIMEOUT,
    MiB,
    eventually,
    memfd_holders,
    put_get_roundtrip,
    shm_files,
    wait_declared_dead,
)

import hoplite_client
from hoplite_client.wire.errors import HopliteError
from hoplite_client.wire.ids import ObjectID
from hoplited.cluster.membership import rendezvous_owner


# --- 5. SIGKILL and restart ------------------------------------------------------------------
async def test_sigkill_leaves_no_shared_memory_and_restart_works(make_cluster):
    """A SIGKILLed daemon's arena is gone once its clients are; restart on the same socket works."""
    cluster = await make_cluster(2)
    victim = cluster.nodes[1]
    arena_name = f"hoplite-{victim.node_id}"
    shm_before = shm_files()
    client = await hoplite_client.connect(victim.socket)
    try:
        big = np.arange(32 * MiB // 8, dtype=np.int64)
        oid = await client.put(big)
        view = await client.get(oid)
        assert view[-1] == big[-1]
        del view
        holders = await asyncio.to_thread(memfd_holders, arena_name)
        assert {victim.pid, os.getpid()} <= holders, holders  # the scan sees what it should
        cluster.kill(1)
        await asyncio.wait_for(victim.process.wait(), IO_TIMEOUT)
    finally:
        await client.close()
    del client

    async def arena_gone() -> bool:
        return not await asyncio.to_thread(memfd_holders, arena_name)

    await eventually(arena_gone, what=f"no process holding memfd:{arena_name}")
    assert shm_files() - shm_before == set()

    node = await cluster.restart(1)
    assert node.socket == victim.socket and node.pid != victim.pid
    await put_get_roundtrip(node.socket, cluster.nodes[0].socket)
    await put_get_roundtrip(cluster.nodes[0].socket, node.socket)


async def test_put_whose_owner_just_died_succeeds(make_cluster, connect):
    """A put whose directory owner was just SIGKILLed is not failed back to the client."""
    cluster = await make_cluster(2)
    c0 = await connect(cluster.nodes[0].socket)
    ids = [n.node_id for n in cluster.nodes]
    oid = next(o for o in iter(ObjectID.random, None) if rendezvous_owner(o, ids) == ids[1])
    cluster.kill(1)
    await asyncio.wait_for(cluster.nodes[1].process.wait(), IO_TIMEOUT)
    data = np.arange(1000, dtype=np.int64)
    await asyncio.wait_for(c0.put(data, object_id=oid), 60.0)
    np.testing.assert_array_equal(await c0.get(oid, timeout=IO_TIMEOUT), data)


# --- 6. a frozen member ----------------------------------------------------------------------
async def test_stopped_member_is_declared_dead(make_cluster, connect):
    """A SIGSTOPped member is declared dead; a get of its object fails instead of hanging."""
    cluster = await make_cluster(3, daemon_args=FAST_HEARTBEAT)
    c0 = await connect(cluster.nodes[0].socket)
    c2 = await connect(cluster.nodes[2].socket)
    oid = await c2.put(np.ones(MiB, dtype=np.uint8))  # large: its bytes live on node 2 only
    frozen = cluster.nodes[2].node_id
    cluster.kill(2, signal.SIGSTOP)
    try:
        await wait_declared_dead(cluster, 0, frozen)
        with pytest.raises(HopliteError):
            await asyncio.wait_for(c0.get(oid, timeout=3.0), 60.0)
    finally:
        cluster.kill(2, signal.SIGCONT)



@pytest.mark.parametrize("shape", [[], ["--two-trees", "always"]], ids=["one-tree", "halves"])
async def test_getters_of_a_result_fail_when_its_coordinator_dies(make_cluster, connect,
                                                                  shape: list[str]) -> None:
    """A reduce's result is being produced on node 0 when node 0 is SIGKILLed: the other
    nodes' gets of it raise a typed error naming node 0 instead of waiting out their timeout,
    whether the result is one tree's or a composite of two halves (docs/design.md §4). (The
    result id is chosen so that its owner shard survives; when the owner dies with the
    producer, the record of the producer dies too: docs/design.md §5.)"""
    cluster = await make_cluster(4, daemon_args=shape)
    clients = [await connect(s) for s in cluster.sockets]
    members = [n.node_id for n in cluster.nodes]
    result = ObjectID.random()
    while rendezvous_owner(result, members) == members[0]:
        result = ObjectID.random()
    x = np.ones(1 << 20, dtype=np.float32)
    ids = [await c.put(x) for c in clients] + [ObjectID.random()]  # one input never comes
    await clients[0].reduce(ids, object_id=result)
    gets = [asyncio.ensure_future(c.get(result, timeout=120)) for c in clients[1:]]

    async def pulled() -> bool:  # the result is announced: every getter pulls it (a chain)
        stats = (await clients[1].status())["nodes"]
        return all(any(t["object"] == result.hex() and t["phase"] == "pulling"
                       for t in n["transfers"]) for n in stats if n["node_id"] != members[0])

    await eventually(pulled, what="every getter pulling the result")
    assert not any(g.done() for g in gets)
    cluster.kill(0)
    started = time.monotonic()
    for get in gets:
        with pytest.raises(hoplite_client.PeerUnavailableError) as info:
            await get
        assert members[0] in str(info.value)
    assert time.monotonic() - started < 60  # not the gets' own 120 s


async def test_gets_survive_the_death_of_the_objects_owner_shard(make_cluster, connect) -> None:
    """The shard owning an object is SIGKILLed just after the put: its entry is soft state,
    rebuilt at the new owner from the holder's announcement (asked again if the new owner has
    not yet heard of the death), and every get completes with the right bytes."""
    cluster = await make_cluster(4)
    clients = [await connect(s) for s in cluster.sockets]
    members = [n.node_id for n in cluster.nodes]
    oid = ObjectID.random()
    while rendezvous_owner(oid, members) != members[2]:
        oid = ObjectID.random()
    data = np.arange(4 * MiB, dtype=np.uint8)
    await clients[0].put(data, object_id=oid)
    cluster.kill(2)
    got = await asyncio.gather(*(c.get(oid, timeout=60) for c in (clients[1], clients[3])))
    assert all(np.array_equal(g, data) for g in got)


async def test_a_send_to_a_receiver_declared_dead_ends_and_lets_go_of_the_object(
        make_cluster, connect) -> None:
    """Node 1 pulls a large object from node 0 and freezes mid-transfer: node 0's stream to it
    waits on write pressure (a frozen receiver reads nothing, and its kernel keeps the
    connection open). Once node 1 is declared dead the stream ends, so the object, deleted
    meanwhile, is freed at once, not when node 1 resumes or its connection times out
    (docs/design.md §5, "Sends to the dead")."""
    cluster = await make_cluster(3, capacity="1GiB", daemon_args=FAST_HEARTBEAT)
    sender, receiver = await connect(cluster.sockets[0]), await connect(cluster.sockets[1])
    data = np.ones(384 * MiB // 8)

    async def caught_mid_transfer() -> tuple[ObjectID, asyncio.Future[Any]] | None:
        """A get of a new object, once node 1 holds part of it; None if it ended first (on
        a quiet machine loopback moves 384 MiB between two polls of a slower loop)."""
        oid = await sender.put(data)
        pulling = asyncio.ensure_future(receiver.get(oid, timeout=IO_TIMEOUT))
        while not pulling.done():
            transfers = (await receiver.status())["local"]["transfers"]
            if any(t["received"] > 0 for t in transfers):
                return oid, pulling
        await pulling
        await sender.delete(oid)
        return None

    caught = None
    for _ in range(5):
        caught = await caught_mid_transfer()
        if caught is not None:
            break
    assert caught is not None, "five gets of 384 MiB ended before node 1 was seen receiving"
    oid, pulling = caught
    try:
        cluster.kill(1, signal.SIGSTOP)
        await wait_declared_dead(cluster, 0, cluster.nodes[1].node_id)
        await sender.delete(oid)

        async def freed() -> bool:
            store = (await sender.status())["local"]["store"]
            return store["arena_used"] == 0 and store["pinned_deleted"] == 0

        await eventually(freed, what="the object freed on node 0")
    finally:
        pulling.cancel()
        cluster.kill(1, signal.SIGKILL)
