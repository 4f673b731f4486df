"""Membership converges (docs/design.md §5): a member that missed another's MemberUp learns
of it by comparing live sets with the others (Roster).

Node 2 sits behind a fault-injecting proxy (tests/faultproxy.py). Node 1 is killed, and while
the proxy holds every byte to node 2, it is started again: a new member, joining through
node 0. The proxy then resets every connection, so node 0's MemberUp to node 2 is lost. Before
roster exchanges node 2 never listed the new member (it answered its Pings all the same).
"""

from __future__ import annotations

import signal
from collections.abc import Awaitable, Callable

from faultproxy import FaultProxy
from helpers import IO_TIMEOUT, eventually, wait_member_dead

import hoplite_client
from hoplited.tools.local_cluster import LocalCluster

# A long timeout, so that the held bytes of a loaded machine's daemon start never make node 2
# silent long enough to be declared dead; live sets are compared every timeout.
ARGS = ["--heartbeat-interval", "0.5", "--heartbeat-timeout", "10"]
BEHIND = 2


async def alive_ids(client: hoplite_client.Client) -> set[str]:
    members = (await client.status(timeout=IO_TIMEOUT))["local"]["members"]
    return {m["node_id"] for m in members if m["alive"]}


async def test_a_member_that_missed_a_member_up_learns_of_it(
        make_cluster: Callable[..., Awaitable[LocalCluster]],
        connect: Callable[[str], Awaitable[hoplite_client.Client]]) -> None:
    proxy = await FaultProxy.free_pair()
    try:
        cluster = await make_cluster(3, daemon_args=ARGS, node_args={
            BEHIND: ["--listen", f"{proxy.target_host}:{proxy.port}",
                     "--advertise", proxy.listen_host]})
        first = await connect(cluster.sockets[0])
        behind = await connect(cluster.sockets[BEHIND])
        old = cluster.nodes[1].node_id
        cluster.kill(1, signal.SIGKILL)
        await wait_member_dead(first, old)
        await wait_member_dead(behind, old)
        proxy.stall()
        try:
            await cluster.restart(1)  # joins through node 0, which tells node 2 in vain
        finally:
            await proxy.cut()
            proxy.resume()
        everyone = {node.node_id for node in cluster.nodes}
        assert cluster.nodes[1].node_id != old

        async def agree() -> bool:
            return all([await alive_ids(c) == everyone for c in (first, behind)])

        await eventually(agree, timeout=60, what="node 2 listing the new member")
    finally:
        await proxy.stop()
