"""Control links are dialled when members join, not at the first request: a get right after a
cluster starts must not wait for a handshake queued behind object bytes (docs/design.md §5,
"Links dialled at a join"). The heartbeat here is slow enough that no Ping dials first."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from helpers import IO_TIMEOUT, eventually, local_stats

from hoplited.tools.local_cluster import LocalCluster

# The first Ping goes out an interval after a link starts: far beyond this test's waits.
SLOW_HEARTBEAT = ["--heartbeat-interval", "120", "--heartbeat-timeout", "600"]


async def test_every_member_dials_every_other_when_it_joins(
        make_cluster: Callable[..., Awaitable[LocalCluster]]) -> None:
    cluster = await make_cluster(3, daemon_args=SLOW_HEARTBEAT)
    with open(cluster.token_file, "rb") as f:
        token = f.read().strip()

    async def all_linked() -> list[int] | None:
        links = [int((await local_stats(n, token))["control_links"]) for n in cluster.nodes]
        return links if links == [2, 2, 2] else None

    await eventually(all_linked, timeout=IO_TIMEOUT, what="a control link to every member")
