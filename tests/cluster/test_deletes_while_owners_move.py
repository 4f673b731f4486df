"""A delete made while an id's owner is away still removes every trace of the object once
the owner is back (docs/design.md §5, "Deletes and moving owners")."""

from __future__ import annotations

import signal
from collections.abc import Awaitable, Callable

import numpy as np
import pytest
from helpers import IO_TIMEOUT, MiB, eventually, every_node_stats

import hoplite_client
from hoplite_client.tools.local_cluster import LocalCluster
from hoplite_client.wire.ids import ObjectID
from hoplited.cluster.membership import rendezvous_owner

pytestmark = pytest.mark.net

# suspected after 1 s of silence, never declared dead within the test: the frozen owner's ids
# move to a stand-in and come back to it (docs/design.md §5, "Ownership")
SUSPICION = ["--heartbeat-interval", "0.5", "--heartbeat-timeout", "600", "--suspect-after", "1"]


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

    async def suspected(client: hoplite_client.Client) -> bool:
        members = (await client.status())["local"]["members"]
        return any(m["node_id"] == cluster.nodes[2].node_id and m["suspected"]
                   for m in members)

    cluster.kill(2, signal.SIGSTOP)
    try:
        async def suspected_by_the_others() -> bool:
            return all([await suspected(c) for c in clients[:2]])

        await eventually(suspected_by_the_others, what="node 2 suspected by nodes 0 and 1")
        await clients[0].delete(oid)
    finally:
        cluster.kill(2, signal.SIGCONT)

    async def trusted_everywhere() -> bool:
        return not any([await suspected(c) for c in clients])

    await eventually(trusted_everywhere, what="node 2 trusted again")

    async def nothing_left() -> bool:
        stats = await every_node_stats(clients[0], members)
        return all(s["directory"]["entries"] == 0 and s["store"]["objects"] == 0
                   and s["store"]["arena_used"] == 0 for s in stats.values())

    await eventually(nothing_left, what="no entry, copy or byte of the deleted object left")
