"""A delete made while an id's owner is away still removes every trace of the object once
the owner is back (docs/design.md §5, "Deletes and moving owners"); a put whose publish waits
on that owner completes though its client leaves (docs/design.md §2.2, "A put outlives its
client")."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable

import numpy as np
import pytest
from helpers import IO_TIMEOUT, MiB, eventually, every_node_stats, local_stats, own_record

import hoplite_client
from hoplite_client.wire.ids import ObjectID
from hoplited.cluster.membership import rendezvous_owner
from hoplited.tools.local_cluster import LocalCluster

pytestmark = pytest.mark.net

# suspected after 1 s of silence, never declared dead within the test: the frozen owner's ids
# move to a stand-in and come back to it (docs/design.md §5, "Ownership")
SUSPICION = ["--heartbeat-interval", "0.5", "--heartbeat-timeout", "600", "--suspect-after", "1"]


async def suspected(cluster: LocalCluster, by: int, index: int) -> bool:
    """Whether node ``by`` suspects node ``index`` (asked of node ``by`` alone: a client's
    status would wait on the frozen node for its status timeout)."""
    members = (await own_record(cluster, by))["members"]
    return any(m["node_id"] == cluster.nodes[index].node_id and m["suspected"]
               for m in members)


async def freeze_until_suspected(cluster: LocalCluster, clients: list[hoplite_client.Client],
                                 index: int) -> None:
    """SIGSTOP node ``index`` and return once every other node suspects it."""
    cluster.kill(index, signal.SIGSTOP)

    async def suspected_by_the_others() -> bool:
        return all([await suspected(cluster, i, index)
                    for i in range(len(clients)) if i != index])

    await eventually(suspected_by_the_others, what=f"node {index} suspected by the others")


async def resume_until_trusted(cluster: LocalCluster, clients: list[hoplite_client.Client],
                               index: int) -> None:
    """SIGCONT node ``index`` and return once no node suspects it any more."""
    cluster.kill(index, signal.SIGCONT)

    async def trusted_everywhere() -> bool:
        return not any([await suspected(cluster, i, index) for i in range(len(clients))])

    await eventually(trusted_everywhere, what=f"node {index} trusted again")


async def nothing_left(client: hoplite_client.Client, members: list[str]) -> None:
    """Return once no node keeps an entry, an object or an arena byte."""
    async def empty() -> bool:
        stats = await every_node_stats(client, members)
        return all(s["directory"]["entries"] == 0 and s["store"]["objects"] == 0
                   and s["store"]["arena_used"] == 0 for s in stats.values())

    await eventually(empty, what="no entry, copy or byte of the deleted object left")


async def test_a_delete_at_the_stand_in_reaches_the_owner_back_from_a_freeze(
        make_cluster: Callable[..., Awaitable[LocalCluster]],
        connect: Callable[[str], Awaitable[hoplite_client.Client]]) -> None:
    """Node 2 owns the id; node 1 put the object and node 0 got a copy. Node 2 is frozen, the
    others suspect it, and node 0 deletes the object at the stand-in. When node 2 runs again
    it takes the id back with its entry from before the freeze: the deleter sends its delete
    again there, and no node keeps an entry, a copy or a byte of it."""
    cluster = await make_cluster(3, daemon_args=SUSPICION)
    clients = [await connect(s) for s in cluster.sockets]
    members = [n.node_id for n in cluster.nodes]
    oid = ObjectID.random()
    while rendezvous_owner(oid, members) != members[2]:
        oid = ObjectID.random()
    value = np.arange(MiB // 8, dtype=np.int64)
    await clients[1].put(value, object_id=oid)
    np.testing.assert_array_equal(await clients[0].get(oid, timeout=IO_TIMEOUT), value)

    try:
        await freeze_until_suspected(cluster, clients, 2)
        await clients[0].delete(oid)
    finally:
        await resume_until_trusted(cluster, clients, 2)
    await nothing_left(clients[0], members)


async def put_again(client: hoplite_client.Client, oid: ObjectID, value: np.ndarray) -> None:
    """Put ``oid`` again, as a task restarted elsewhere would: refused while the directory
    still counts the silent node's copy as live, so asked again until accepted."""
    async def accepted() -> bool:
        try:
            await client.put(value, object_id=oid)
        except hoplite_client.ObjectExistsError:
            return False
        return True

    await eventually(accepted, what=f"{oid.short()} put again")


@pytest.mark.parametrize("holder_owns", [False, True], ids=["owner-elsewhere", "holder-owns"])
async def test_a_copy_on_a_node_that_was_silent_goes_with_its_delete(
        holder_owns: bool, make_cluster: Callable[..., Awaitable[LocalCluster]],
        connect: Callable[[str], Awaitable[hoplite_client.Client]]) -> None:
    """Node 2 holds an object and is frozen; once the others suspect it, node 1 puts the same
    id again (a restarted task), and node 2 runs again, never declared dead. Two versions of
    the id now exist. Whichever the directory keeps, the other is a copy nobody would find or
    delete: if node 2's shard owns the id, it takes the id back with node 2's version and node
    1's copy, announced again, goes; if another shard owns it, the put again replaced node 2's
    version there and node 2's copy goes. After the delete no node keeps anything of it."""
    cluster = await make_cluster(3, daemon_args=SUSPICION)
    clients = [await connect(s) for s in cluster.sockets]
    members = [n.node_id for n in cluster.nodes]
    owner = members[2] if holder_owns else members[0]
    oid = ObjectID.random()
    while rendezvous_owner(oid, members) != owner:
        oid = ObjectID.random()
    value = np.arange(MiB // 8, dtype=np.int64)
    await clients[2].put(value, object_id=oid)

    try:
        await freeze_until_suspected(cluster, clients, 2)
        await put_again(clients[1], oid, value)
    finally:
        await resume_until_trusted(cluster, clients, 2)
    np.testing.assert_array_equal(await clients[0].get(oid, timeout=IO_TIMEOUT), value)
    await clients[0].delete(oid)
    await nothing_left(clients[0], members)


async def test_a_put_whose_client_leaves_while_its_owner_is_silent_still_completes(
        make_cluster: Callable[..., Awaitable[LocalCluster]],
        connect: Callable[[str], Awaitable[hoplite_client.Client]]) -> None:
    """Node 2 owns two ids and is frozen. A client of node 0 puts both, a small object (sent
    whole) and a large one (written, then sealed); their publishes wait on node 2, and the
    client leaves. Once the others suspect node 2 the puts complete at its stand-in: node 1
    gets both. After the deletes, and node 2 back, no node keeps anything of them."""
    cluster = await make_cluster(3, daemon_args=SUSPICION)
    clients = [await connect(s) for s in cluster.sockets]
    members = [n.node_id for n in cluster.nodes]
    oids = []
    while len(oids) < 2:
        oid = ObjectID.random()
        if rendezvous_owner(oid, members) == members[2]:
            oids.append(oid)
    values = [np.arange(1024, dtype=np.int32), np.arange(MiB // 8, dtype=np.int64)]

    leaving = await hoplite_client.connect(cluster.sockets[0])
    cluster.kill(2, signal.SIGSTOP)
    try:
        puts = [asyncio.ensure_future(leaving.put(v, object_id=oid))
                for v, oid in zip(values, oids)]

        with open(cluster.token_file, "rb") as f:
            token = f.read().strip()

        async def both_stored() -> bool:  # asked of node 0 alone: node 2 would not answer
            stats = await local_stats(cluster.nodes[0], token)
            return bool(stats["store"]["complete_objects"] == 2)

        await eventually(both_stored, what="both objects stored on node 0")
        await leaving.close()
        for put in puts:
            with contextlib.suppress(hoplite_client.HopliteError):
                await put
        for value, oid in zip(values, oids):
            np.testing.assert_array_equal(await clients[1].get(oid, timeout=IO_TIMEOUT), value)
    finally:
        await resume_until_trusted(cluster, clients, 2)
    for oid in oids:
        await clients[1].delete(oid)
    await nothing_left(clients[0], members)
