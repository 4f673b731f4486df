"""A member declared dead that runs again: fenced by the others, it comes back as a new member.

A SIGSTOP longer than the heartbeat timeout makes the others declare the frozen member dead;
SIGCONT then lets it run again. Unfenced, it would keep its own view (everyone alive) while
the others refused to list it, for good: its objects unreachable, its puts unseen. So the
first member it talks to answers that it declared it dead, and the daemon runs again, in the
same process, as a new member (docs/design.md §5, "Declared dead, then running again").
"""

from __future__ import annotations

import signal
import socket
from typing import Any

import numpy as np
import pytest
from helpers import FAST_HEARTBEAT, IO_TIMEOUT, MiB, eventually, wait_declared_dead

import hoplite_client
from hoplite_client.wire.errors import ConnectionLostError, HopliteError

N = 4
FROZEN = 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def members_seen(client: hoplite_client.Client) -> dict[str, bool]:
    """The members ``client``'s daemon knows, and whether it holds each alive."""
    local = (await client.status(timeout=IO_TIMEOUT))["local"]
    return {m["node_id"]: m["alive"] for m in local["members"]}


@pytest.mark.parametrize("port", ["any", "fixed"])
async def test_a_member_declared_dead_runs_again_as_a_new_member(make_cluster, connect,
                                                                 port: str) -> None:
    """Node 2 is frozen past the heartbeat timeout and declared dead, then continued. Its
    daemon (the same pid, the same socket path; on a fixed --listen port, that port too)
    comes back under a new node id, its old clients get ConnectionLostError, every member
    agrees on the new membership, and objects and reduces cross it both ways."""
    node_args = {FROZEN: ["--listen", f"127.0.0.1:{free_port()}"]} if port == "fixed" else {}
    cluster = await make_cluster(N, daemon_args=FAST_HEARTBEAT, node_args=node_args)
    clients = [await connect(s) for s in cluster.sockets]
    kept = np.arange(2 * MiB, dtype=np.int32)
    kept_id = await clients[1].put(kept)
    old_id, pid = cluster.nodes[FROZEN].node_id, cluster.nodes[FROZEN].pid
    address = cluster.nodes[FROZEN].listen
    cluster.kill(FROZEN, signal.SIGSTOP)
    try:
        await wait_declared_dead(cluster, 0, old_id)
    finally:
        cluster.kill(FROZEN, signal.SIGCONT)

    async def old_client_cut() -> bool:
        try:
            await clients[FROZEN].status(timeout=IO_TIMEOUT)
        except ConnectionLostError:
            return True
        return False

    await eventually(old_client_cut, what="the old clients of the fenced daemon cut off")

    async def new_member() -> dict[str, Any] | None:
        try:
            client = await hoplite_client.connect(cluster.sockets[FROZEN])
        except HopliteError:
            return None
        try:
            local: dict[str, Any] = (await client.status(timeout=IO_TIMEOUT))["local"]
        finally:
            await client.close()
        return local if local["node_id"] != old_id else None

    local = await eventually(new_member, what="the daemon serving again as a new member")
    new_id = local["node_id"]
    assert local["pid"] == pid and cluster.nodes[FROZEN].running
    if port == "fixed":
        assert local["address"] == address
    clients[FROZEN] = await connect(cluster.sockets[FROZEN])

    async def views_agree() -> bool:
        views = [await members_seen(c) for c in clients]
        others_ok = all(v.get(new_id) is True and v.get(old_id) is False
                        for i, v in enumerate(views) if i != FROZEN)
        own = views[FROZEN]
        return others_ok and old_id not in own and sum(own.values()) == N
    await eventually(views_agree, what="every member lists the new id alive, the old dead")

    got = await clients[FROZEN].get(kept_id, timeout=IO_TIMEOUT)
    assert np.array_equal(got, kept)
    made = np.full(MiB, 7, dtype=np.int64)
    made_id = await clients[FROZEN].put(made)
    assert np.array_equal(await clients[0].get(made_id, timeout=IO_TIMEOUT), made)
    inputs = [await c.put(np.full(MiB, i + 1, dtype=np.float32)) for i, c in enumerate(clients)]
    total = sum(range(1, N + 1))
    for reducer in (FROZEN, 0):
        result = await clients[reducer].reduce(inputs, timeout=IO_TIMEOUT)
        summed = await clients[reducer].get(result, timeout=IO_TIMEOUT)
        assert np.array_equal(summed, np.full(MiB, total, dtype=np.float32))
