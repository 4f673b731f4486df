"""``hoplite status`` shows what is moving: a transfer under way, with its source and progress
(node 0 serves through a rate-limited proxy, so the transfer lasts seconds)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import numpy as np
import pytest
from faultproxy import FaultProxy
from helpers import CLI, MiB

import hoplite_client as hc
from hoplited.tools.local_cluster import LocalCluster

RATE = 4 * MiB  # bytes/s out of node 0: DATA takes about 4 s to arrive
DATA = np.arange(16 * MiB // 4, dtype=np.float32)


@pytest.fixture
async def slow_holder(make_cluster: Callable[..., Awaitable[LocalCluster]]
                      ) -> AsyncIterator[tuple[LocalCluster, FaultProxy]]:
    proxy = await FaultProxy.free_pair(rate=RATE)
    try:
        cluster = await make_cluster(2, node_args={
            0: ["--listen", f"{proxy.target_host}:{proxy.port}",
                "--advertise", proxy.listen_host]})
        yield cluster, proxy
    finally:
        await proxy.stop()


async def test_a_transfer_under_way_is_in_the_status(
        slow_holder: tuple[LocalCluster, FaultProxy],
        connect: Callable[[str], Awaitable[hc.Client]]) -> None:
    cluster, _ = slow_holder
    holder, getter = [await connect(s) for s in cluster.sockets]
    oid = await holder.put(DATA)
    get = asyncio.ensure_future(getter.get(oid, timeout=120))
    seen: list[dict[str, object]] = []
    for _ in range(200):  # until the fetch has started and received some bytes
        await asyncio.sleep(0.05)
        transfers = (await getter.status())["local"]["transfers"]
        if transfers and transfers[0]["received"]:
            seen = transfers
            break
    assert seen, "no transfer seen under way"
    assert seen[0]["object"] == oid.hex() and seen[0]["source"] == cluster.nodes[0].node_id
    assert 0 < int(seen[0]["received"]) < DATA.nbytes  # type: ignore[call-overload]
    assert seen[0]["size"] == DATA.nbytes
    proc = await asyncio.create_subprocess_exec(
        *CLI, "status", "--socket", cluster.sockets[1], stdout=asyncio.subprocess.PIPE)
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0 and not get.done()
    text = out.decode()
    assert "transfers" in text and oid.hex()[:16] in text
    assert np.array_equal(await get, DATA)
    assert (await getter.status())["local"]["transfers"] == []
