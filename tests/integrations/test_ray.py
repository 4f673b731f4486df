"""hoplite_client.ray in a real Ray cluster of several nodes (raylets) on this machine: one
daemon per Ray node, tasks on each node reaching theirs, ids passed through Ray calls, a node
that joins or dies, bad set-ups refused typed with nothing left behind (docs/quickstart.md)."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from helpers import MiB, process_gone, until

ray = pytest.importorskip("ray", reason="hoplite[ray] is not installed")
from ray.cluster_utils import Cluster  # noqa: E402
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: E402
from ray_daemons import daemon_pids, hoplite_actors  # noqa: E402

import hoplite_client.ray as hray  # noqa: E402
from bench.apps.common import remove_when_quiet  # noqa: E402
from hoplite_client.wire.errors import InvalidArgumentError  # noqa: E402
from hoplite_client.wire.ids import ObjectID  # noqa: E402

pytestmark = [pytest.mark.timeout(600),
              pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::ResourceWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning")]

NODE = {"num_cpus": 1, "object_store_memory": 100 * MiB}
CAPACITY = "256MiB"


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Cluster]:
    """A Ray cluster of a head and two worker nodes, the driver connected to it; Ray's
    session files in a directory of ours, removed afterwards."""
    temp = tempfile.mkdtemp(prefix="ray-")  # short: Ray's socket paths must stay short
    before = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = temp  # Ray's files, its processes' too, under it
    cluster = Cluster(initialize_head=True,
                      head_node_args={**NODE, "include_dashboard": False})
    try:
        for _ in range(2):
            cluster.add_node(**NODE)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, logging_level="warning")
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
        remove_when_quiet(temp)
        if before is None:
            del os.environ["RAY_TMPDIR"]
        else:
            os.environ["RAY_TMPDIR"] = before


@pytest.fixture
def hoplite(ray_cluster: Cluster) -> Iterator[Cluster]:
    """Hoplite on every node of the cluster; stopped afterwards, checked gone."""
    hray.init(capacity=CAPACITY, watch_interval=1.0)
    try:
        yield ray_cluster
    finally:
        pids = daemon_pids()
        hray.shutdown()
        assert not hoplite_actors()
        assert not [pid for pid in pids if not process_gone(pid)]


def alive_nodes() -> list[str]:
    return [n["NodeID"] for n in ray.nodes() if n["Alive"]]


def on(node: str) -> dict[str, Any]:
    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=False),
            "num_cpus": 0}


@ray.remote
def put_here(i: int) -> tuple[ObjectID, str]:
    """Put node-specific data through this node's daemon; its id and the node it ran on."""
    client = hray.client_sync()
    try:
        oid = client.put(np.full(MiB, i, dtype=np.float32))
    finally:
        client.close()
    return oid, ray.get_runtime_context().get_node_id()


@ray.remote
def sum_of(oids: list[ObjectID]) -> float:
    """Start a reduce of ``oids`` here and return the result's first element."""
    async def run() -> float:
        client = await hray.client()
        try:
            result = await client.reduce(oids, "sum", timeout=60)
            return float((await client.get(result, timeout=60))[0])
        finally:
            await client.close()
    return asyncio.run(run())


@ray.remote
def get_later(oid: ObjectID) -> float:
    """Get ``oid``, which may not exist yet, through this node's daemon."""
    async def run() -> float:
        client = await hray.client()
        try:
            return float((await client.get(oid, timeout=60))[-1])
        finally:
            await client.close()
    return asyncio.run(run())


@ray.remote
def put_as(oid: ObjectID, value: float) -> None:
    async def run() -> None:
        client = await hray.client()
        try:
            await client.put(np.full(MiB, value, dtype=np.float32), object_id=oid)
        finally:
            await client.close()
    asyncio.run(run())


def test_client_outside_ray_is_refused_typed() -> None:
    assert not ray.is_initialized()  # the first test here: no Ray in this process yet
    with pytest.raises(hray.RaySetupError, match="not in a Ray worker or driver"):
        hray.client_sync()


def test_one_daemon_per_node_in_one_cluster_and_init_is_idempotent(hoplite: Cluster) -> None:
    nodes = hray.nodes()
    assert sorted(nodes) == sorted(alive_nodes()) and len(set(nodes.values())) == 3
    hray.init(capacity=CAPACITY)  # already running: nothing more starts
    assert hray.nodes() == nodes
    assert len(daemon_pids()) == 3
    hray.shutdown()  # and at once again: the actors' names are free
    assert not hoplite_actors()
    hray.init(capacity=CAPACITY, watch_interval=1.0)
    assert sorted(hray.nodes()) == sorted(nodes)

    async def members() -> int:
        client = await hray.client()
        try:
            return len((await client.status())["nodes"])
        finally:
            await client.close()
    assert asyncio.run(members()) == 3  # the daemons joined one cluster


def test_tasks_on_every_node_pass_ids_through_ray_and_reduce(hoplite: Cluster) -> None:
    """Each node puts through its own daemon; the ids travel as Ray values; a task on each
    node reduces them all; a get issued before its object exists is answered once a task on
    another node puts it."""
    nodes = alive_nodes()
    placed = ray.get([put_here.options(**on(node)).remote(i + 1) for i, node in
                      enumerate(nodes)])
    assert [node for _, node in placed] == nodes
    oids = [oid for oid, _ in placed]
    sums = ray.get([sum_of.options(**on(node)).remote(oids) for node in nodes])
    assert sums == [float(sum(range(1, len(nodes) + 1)))] * len(nodes)
    later = ObjectID.random()
    waiting = [get_later.options(**on(node)).remote(later) for node in nodes[1:]]
    ray.get(put_as.options(**on(nodes[0])).remote(later, 7.0))
    assert ray.get(waiting) == [7.0] * (len(nodes) - 1)


def test_a_node_that_joins_gets_a_daemon_and_one_that_dies_takes_it_along(
        hoplite: Cluster) -> None:
    extra = hoplite.add_node(**NODE)
    hoplite.wait_for_nodes()
    new = extra.node_id
    until(lambda: new in hray.nodes(), timeout=60)
    info = ray.get(ray.get_actor(f"hoplited:{new}", namespace="hoplite").info.remote())
    pid, workdir = info["pid"], os.path.dirname(info["socket"])
    oid, where = ray.get(put_here.options(**on(new)).remote(3))
    assert where == new
    hoplite.remove_node(extra, allow_graceful=False)
    until(lambda: process_gone(pid), timeout=30)  # --exit-with-parent
    shutil.rmtree(workdir)  # the dead node's daemon log, which nobody else removes
    until(lambda: new not in hray.nodes(), timeout=60)
    # the survivors carry on without it
    nodes = alive_nodes()
    oids = [oid for oid, _ in ray.get([put_here.options(**on(n)).remote(1) for n in nodes])]
    assert ray.get(sum_of.options(**on(nodes[0])).remote(oids)) == float(len(nodes))


def test_client_before_init_is_refused_typed(ray_cluster: Cluster) -> None:
    with pytest.raises(hray.RaySetupError, match="init"):
        hray.client_sync()
    with pytest.raises(hray.RaySetupError, match="not running"):
        hray.nodes()

    @ray.remote
    def in_a_task() -> str:
        try:
            hray.client_sync()
        except hray.RaySetupError as exc:
            return f"{type(exc).__name__}: {exc}"
        return "connected"
    assert ray.get(in_a_task.remote()).startswith("RaySetupError: no hoplite daemon on Ray node")


def test_a_port_taken_on_some_nodes_fails_init_and_stops_the_daemons_that_started(
        ray_cluster: Cluster) -> None:
    """Every node of this cluster shares 127.0.0.1: with a fixed peer port the seed starts
    and the others find the port taken; init names a node and the cause, and stops the seed's
    daemon again."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    before = hoplited_processes()
    with pytest.raises(hray.RaySetupError, match="in use") as caught:
        hray.init(capacity=CAPACITY, port=port)
    assert caught.value.data["node"] in alive_nodes()
    assert not hoplite_actors()
    until(lambda: hoplited_processes() == before, timeout=30)


def hoplited_processes() -> set[int]:
    """PIDs of the hoplited processes Ray's daemon actors run (their sockets are under a
    hoplite-ray- directory)."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmd = f.read()
            except OSError:
                continue
            if b"hoplited" in cmd and b"hoplite-ray-" in cmd and not process_gone(int(entry)):
                found.add(int(entry))
    return found


def test_a_daemon_that_cannot_start_fails_init_typed_leaving_nothing(
        ray_cluster: Cluster) -> None:
    with pytest.raises(hray.RaySetupError, match="capacity") as caught:
        hray.init(capacity="1000TiB")
    assert caught.value.data["node"] in alive_nodes()
    assert not hoplite_actors()
    hray.shutdown()  # nothing to stop
    for bad in ({"watch_interval": float("nan")}, {"watch_interval": -1.0}, {"port": 70000}):
        with pytest.raises(InvalidArgumentError):
            hray.init(**bad)  # type: ignore[arg-type]
    assert not hoplite_actors()
