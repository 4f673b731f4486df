"""Tiers and fixtures: real hoplited processes on loopback, real clients; everything stopped after.

Tests live in one directory per tier and are marked by it: ``unit`` (pure cores and codecs, no
I/O), ``net`` (real daemons on loopback), ``cluster`` (several daemons, processes killed or
stopped), ``emulated`` (network namespaces: each module skips itself, saying why, without
root, iproute2 or the baseline's packages), ``integrations`` (hoplite inside real local Ray
and Dask clusters of several processes). Minutes-long runs are marked ``soak`` and left out
unless asked for (``make soak``).

Hypothesis runs derandomized by default (profile ``ci``): every run draws the same examples, and
no example database is written. ``HYPOTHESIS_PROFILE=explore`` draws new ones each run and keeps
the failing ones in ``.hypothesis/``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from helpers import TEST_CAPACITY
from hypothesis import settings

import hoplite_client
from hoplited.tools.local_cluster import LocalCluster

ClusterFactory = Callable[..., Awaitable[LocalCluster]]


TIERS = ("unit", "net", "cluster", "emulated", "integrations")

settings.register_profile("ci", derandomize=True, database=None, deadline=None)
settings.register_profile("explore", deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


# Tiers whose tests run one at a time even under ``pytest -n``: each builds a test bed of
# network namespaces or a local Ray or Dask cluster, which want the machine's cores to
# themselves (and Ray's local clusters share well-known ports).
SERIAL_TIERS = ("emulated", "integrations")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test with its tier, the directory it lives in (``pytest -m unit`` etc.); with
    pytest-xdist (``--dist loadgroup``), the serial tiers share one worker."""
    for item in items:
        tier = Path(str(item.fspath)).parent.name
        if tier in TIERS:
            item.add_marker(getattr(pytest.mark, tier))
        if tier in SERIAL_TIERS:
            item.add_marker(pytest.mark.xdist_group("serial"))


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
