"""The Ray and Dask baselines (bench/baselines/ray_baseline.py, dask_baseline.py).

In a 3-host emulated test bed at 500 Mbit/s with 2 MiB objects, every collective returns one
positive latency per measured run and its result is checked by the baseline itself. One Ray
cluster (slow to start) and one Dask cluster serve all four collectives; the module-level
``run`` of each, which starts and stops a cluster of its own, runs once.

Skipped, with the install hint, without root (the test bed) or without ray / distributed.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from bench.baselines import dask_baseline, ray_baseline
from bench.baselines.common import OPS, BaselineUnavailable

NODES = 3
RATE_BPS = 500_000_000
SIZE = 2 << 20
REPEAT = 2

pytestmark = pytest.mark.asyncio(loop_scope="module")


def _need(module: str, hint: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("the emulated test bed needs root (network namespaces, tc)")
    if importlib.util.find_spec(module) is None:
        pytest.skip(hint)


def _left_in(testbed: object) -> list[int]:
    """PIDs still running inside the test bed's host namespaces."""
    from hoplited.tools.testbed import netns_pids

    return [pid for h in testbed.hosts for pid in netns_pids(h.netns)]  # type: ignore[attr-defined]


@pytest_asyncio.fixture(scope="class", loop_scope="module")
async def ray_cluster() -> AsyncIterator[ray_baseline.RayCluster]:
    _need("ray", ray_baseline.INSTALL_HINT)
    from hoplited.tools.testbed import Testbed

    async with Testbed(NODES, RATE_BPS) as tb:
        async with ray_baseline.RayCluster(tb, SIZE) as cluster:
            yield cluster
        assert not _left_in(tb), "Ray processes left after stop"


@pytest_asyncio.fixture(scope="class", loop_scope="module")
async def dask_cluster() -> AsyncIterator[dask_baseline.DaskCluster]:
    _need("distributed", dask_baseline.INSTALL_HINT)
    from hoplited.tools.testbed import Testbed

    async with Testbed(NODES, RATE_BPS) as tb:
        async with dask_baseline.DaskCluster(tb) as cluster:
            yield cluster
        assert not _left_in(tb), "Dask processes left after stop"


def _check_latencies(latencies: list[float]) -> None:
    assert len(latencies) == REPEAT
    # positive, and no faster than the links allow (no tight upper bound: a loaded machine)
    assert all(t > SIZE * 8 / RATE_BPS * 0.9 for t in latencies), latencies


class TestRay:
    @pytest.mark.parametrize("op", OPS)
    async def test_collective(self, ray_cluster: ray_baseline.RayCluster, op: str) -> None:
        _check_latencies(await ray_cluster.run(op, SIZE, REPEAT, warmup=1))

    async def test_rejects_bad_arguments(self, ray_cluster: ray_baseline.RayCluster) -> None:
        with pytest.raises(ValueError):
            await ray_cluster.run("scan", SIZE, REPEAT)
        with pytest.raises(ValueError):
            await ray_cluster.run("broadcast", 2 * SIZE, REPEAT)  # over the object stores


class TestDask:
    @pytest.mark.parametrize("op", OPS)
    async def test_collective(self, dask_cluster: dask_baseline.DaskCluster, op: str) -> None:
        _check_latencies(await dask_cluster.run(op, SIZE, REPEAT, warmup=1))

    async def test_scatter_broadcast(self, dask_cluster: dask_baseline.DaskCluster) -> None:
        _check_latencies(await dask_cluster.run("broadcast", SIZE, REPEAT, idiom="scatter"))

    async def test_hoplite_broadcast_through_the_worker_plugin(
            self, dask_cluster: dask_baseline.DaskCluster) -> None:
        """Dask + Hoplite in the namespaces: each worker's host gets its daemon, the gets in
        tasks return the right data (checked by the driver, which fails otherwise)."""
        _check_latencies(await dask_cluster.run("broadcast", SIZE, REPEAT, idiom="hoplite"))
        with pytest.raises(ValueError, match="broadcast"):
            await dask_cluster.run("reduce", SIZE, REPEAT, idiom="hoplite")


@pytest.mark.parametrize("module,package", [(ray_baseline, "ray"),
                                            (dask_baseline, "distributed")])
async def test_run_starts_and_stops_its_own_cluster(module: object, package: str) -> None:
    _need(package, module.INSTALL_HINT)  # type: ignore[attr-defined]
    from hoplited.tools.testbed import Testbed

    async with Testbed(NODES, RATE_BPS) as tb:
        latencies = await module.run(tb, "allreduce", SIZE, REPEAT, 1)  # type: ignore[attr-defined]
        assert len(latencies) == REPEAT and all(t > 0 for t in latencies)
        assert not _left_in(tb)


@pytest.mark.parametrize("module,package", [(ray_baseline, "ray"),
                                            (dask_baseline, "distributed")])
async def test_unavailable_says_how_to_install(module: object, package: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == package else real(name, *a))
    with pytest.raises(BaselineUnavailable, match="pip install"):
        await module.run(object(), "broadcast", SIZE, 1)  # type: ignore[attr-defined]
