"""Data connections are kept: each member gets a standing one when it joins, and a pull that
takes the last idle one has a spare dialled in the background, so no pull dials; a kept
connection that was cut, or whose source died, never costs a get (docs/design.md §3, "Data
connections"). Node 0 serves through a proxy that counts the connections made to it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import numpy as np
import pytest
from faultproxy import FaultProxy
from helpers import FAST_HEARTBEAT, eventually

import hoplite_client as hc
from hoplited.tools.local_cluster import LocalCluster

SIZE = 256 * 1024  # above the inline limit: every get pulls over a data connection


@pytest.fixture
async def proxied_holder(make_cluster: Callable[..., Awaitable[LocalCluster]]
                         ) -> AsyncIterator[tuple[LocalCluster, FaultProxy]]:
    proxy = await FaultProxy.free_pair()
    try:
        cluster = await make_cluster(2, daemon_args=FAST_HEARTBEAT, node_args={
            0: ["--listen", f"{proxy.target_host}:{proxy.port}",
                "--advertise", proxy.listen_host]})
        yield cluster, proxy
    finally:
        await proxy.stop()


def data(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).random(SIZE // 8)


async def idle_connections(client: hc.Client) -> int:
    return int((await client.status())["local"]["idle_data_connections"])


async def kept(client: hc.Client, count: int) -> None:
    """Wait until ``client``'s daemon keeps ``count`` idle data connections."""

    async def reached() -> bool:
        return await idle_connections(client) == count

    await eventually(reached, what=f"{count} idle data connections kept")


async def test_pulls_use_kept_connections_and_dial_one_spare(
        proxied_holder: tuple[LocalCluster, FaultProxy],
        connect: Callable[[str], Awaitable[hc.Client]]) -> None:
    cluster, proxy = proxied_holder
    holder, getter = [await connect(s) for s in cluster.sockets]
    arrays = [data(seed) for seed in range(4)]
    oids = [await holder.put(a) for a in arrays]
    await kept(getter, 1)  # dialled when node 0 joined
    dialled = proxy.connections
    assert np.array_equal(await getter.get(oids[0], timeout=60), arrays[0])
    await kept(getter, 2)  # the standing one back, and the spare its take asked for
    assert proxy.connections == dialled + 1
    for oid, array in zip(oids[1:], arrays[1:]):
        assert np.array_equal(await getter.get(oid, timeout=60), array)
    assert proxy.connections == dialled + 1, "a pull dialled though a kept connection was idle"
    assert await idle_connections(getter) == 2


async def test_a_kept_connection_that_was_cut_is_replaced_not_blamed(
        proxied_holder: tuple[LocalCluster, FaultProxy],
        connect: Callable[[str], Awaitable[hc.Client]]) -> None:
    cluster, proxy = proxied_holder
    holder, getter = [await connect(s) for s in cluster.sockets]
    first, second = data(1), data(2)
    oids = [await holder.put(first), await holder.put(second)]
    assert np.array_equal(await getter.get(oids[0], timeout=60), first)
    await proxy.cut()  # every connection to node 0 reset: the kept one too
    assert np.array_equal(await getter.get(oids[1], timeout=60), second)
    await kept(getter, 2)  # the pull's fresh connection and a spare


async def test_kept_connections_to_a_dead_source_are_closed(
        make_cluster: Callable[..., Awaitable[LocalCluster]],
        connect: Callable[[str], Awaitable[hc.Client]]) -> None:
    cluster = await make_cluster(3, daemon_args=FAST_HEARTBEAT)
    holder, getter, other = [await connect(s) for s in cluster.sockets]
    array = data(3)
    oid = await holder.put(array)
    await kept(getter, 2)  # one standing connection to each other member
    assert np.array_equal(await getter.get(oid, timeout=60), array)
    cluster.kill(0)
    await kept(getter, 1)  # the dead source's is closed, node 2's stays
    # the copy on node 1 still serves node 2
    assert np.array_equal(await other.get(oid, timeout=60), array)
    await kept(other, 2)  # node 1's standing connection and a spare
