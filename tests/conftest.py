"""Fixtures: real hoplited processes on loopback, real clients; everything stopped after."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

import hoplite_client
from hoplite_client.tools.local_cluster import LocalCluster

# Small arenas keep eight daemons cheap; heartbeats fast enough for failure tests, slow
# enough for a loaded 2-core machine.
TEST_CAPACITY = "512MiB"
FAST_HEARTBEAT = ["--heartbeat-interval", "0.5", "--heartbeat-timeout", "4"]

ClusterFactory = Callable[..., Awaitable[LocalCluster]]


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    """Keep each phase's report on the test item, so fixtures can tell a failed test."""
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


@pytest.fixture
async def make_cluster(request: pytest.FixtureRequest) -> AsyncIterator[ClusterFactory]:
    """``await make_cluster(n, daemon_args=[...])`` starts n daemons; all stop at teardown."""
    clusters: list[LocalCluster] = []

    async def make(nodes: int, capacity: str = TEST_CAPACITY, **kwargs: object) -> LocalCluster:
        cluster = LocalCluster(nodes, capacity=capacity, **kwargs)  # type: ignore[arg-type]
        clusters.append(cluster)
        await cluster.start()
        return cluster

    yield make
    report = getattr(request.node, "report_call", None)
    if report is None or report.failed:
        for cluster in clusters:  # shown under "Captured stdout teardown"
            for node in cluster.nodes:
                print(f"--- daemon {node.index} ({node.node_id}) log ---")
                print(cluster.log_tail(node, lines=60))
    for cluster in clusters:
        await cluster.stop()
    alive = [n.pid for c in clusters for n in c.nodes if n.running]
    assert not alive, f"daemons still running after stop: {alive}"


@pytest.fixture
async def connect() -> AsyncIterator[Callable[[str], Awaitable[hoplite_client.Client]]]:
    """``await connect(socket)``: a client closed at teardown."""
    async with contextlib.AsyncExitStack() as stack:

        async def open_client(path: str) -> hoplite_client.Client:
            return await stack.enter_async_context(await hoplite_client.connect(path))

        yield open_client
