"""Watchers: above ``--watchers`` + 1 members each member pings only its watched ones, and
every member still learns of a killed, frozen or resumed member (docs/design.md §5,
"Watchers"). Eight real daemons with four watchers each: three members do not watch a given
member, so they hear of its silence only through alarms, each from three of its four
watchers (the watchers share them out)."""

from __future__ import annotations

import asyncio
import signal
from typing import Any

import numpy as np
import pytest
from helpers import FAST_HEARTBEAT, IO_TIMEOUT, MiB, eventually, own_record

from hoplited.cluster.watching import to_alarm, watchers_of
from hoplited.tools.local_cluster import LocalCluster

K = 4
WATCHERS = ["--watchers", str(K)]
N = 8


async def member_states(cluster: LocalCluster, index: int) -> dict[str, dict[str, Any]]:
    """The members as node ``index`` sees them, by node id (asked of it alone)."""
    return {m["node_id"]: m for m in (await own_record(cluster, index))["members"]}


async def everyone_sees(cluster: LocalCluster, node: str, alive: bool, suspected: bool,
                        what: str) -> None:
    """Wait until every node of ``cluster`` but ``node`` lists ``node`` so."""
    others = [i for i, n in enumerate(cluster.nodes) if n.node_id != node]

    async def seen() -> bool:
        for i in others:
            state = (await member_states(cluster, i))[node]
            if (state["alive"], state["suspected"]) != (alive, suspected):
                return False
        return True

    await eventually(seen, timeout=60.0, what=what)


async def test_each_member_pings_only_the_members_it_watches(make_cluster, connect) -> None:
    cluster = await make_cluster(N, daemon_args=WATCHERS)
    clients = [await connect(n.socket) for n in cluster.nodes]

    async def watching() -> list[int]:
        return [int((await c.status())["local"]["watching"]) for c in clients]

    assert await eventually(lambda: _all_equal(watching, K), what="K watched each") == [K] * N
    data = np.arange(MiB, dtype=np.uint8)
    oid = await clients[0].put(data)
    for client in clients[1:]:
        np.testing.assert_array_equal(await client.get(oid, timeout=IO_TIMEOUT), data)


async def _all_equal(measure: Any, value: int) -> list[int] | None:
    got = await measure()
    return got if all(v == value for v in got) else None


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "frozen"])
async def test_every_member_declares_a_silent_member_dead(make_cluster, connect, sig) -> None:
    cluster = await make_cluster(N, daemon_args=[*WATCHERS, *FAST_HEARTBEAT])
    clients = [await connect(n.socket) for n in cluster.nodes[:-1]]
    ids = [n.node_id for n in cluster.nodes]
    victim = ids[-1]
    unwatching = set(ids) - watchers_of(victim, ids, K) - {victim}
    assert len(unwatching) == 3  # they learn of it through alarms only
    shares = [to_alarm(w, victim, ids, K) for w in watchers_of(victim, ids, K)]
    assert any(len(share) < 3 for share in shares)  # each from three of the four watchers
    data = np.arange(MiB, dtype=np.uint8)
    oid = await clients[0].put(data)
    cluster.kill(N - 1, sig)
    try:
        await everyone_sees(cluster, victim, alive=False, suspected=False,
                            what=f"{victim} dead everywhere")
        for client in clients[1:]:
            np.testing.assert_array_equal(await client.get(oid, timeout=IO_TIMEOUT), data)
    finally:
        if sig == signal.SIGSTOP:
            cluster.kill(N - 1, signal.SIGCONT)


async def test_a_member_frozen_for_a_moment_is_suspected_then_trusted_everywhere(
        make_cluster, connect) -> None:
    """Frozen for less than the heartbeat timeout: every member suspects it, none declares it
    dead, and each trusts it again by its own Pings once it answers."""
    args = [*WATCHERS, "--heartbeat-interval", "0.5", "--heartbeat-timeout", "30"]
    cluster = await make_cluster(N, daemon_args=args)
    clients = [await connect(n.socket) for n in cluster.nodes[:-1]]
    victim = cluster.nodes[-1].node_id
    cluster.kill(N - 1, signal.SIGSTOP)
    try:
        await everyone_sees(cluster, victim, alive=True, suspected=True,
                            what=f"{victim} suspected everywhere")
    finally:
        cluster.kill(N - 1, signal.SIGCONT)
    await everyone_sees(cluster, victim, alive=True, suspected=False,
                        what=f"{victim} trusted again everywhere")
    resumed = await connect(cluster.nodes[-1].socket)
    data = np.arange(1000, dtype=np.int64)
    oid = await resumed.put(data)
    np.testing.assert_array_equal(await asyncio.wait_for(
        clients[0].get(oid, timeout=IO_TIMEOUT), IO_TIMEOUT + 5), data)
