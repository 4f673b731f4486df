"""hoplite_client.dask in a real Dask cluster of several worker processes on this machine:
workers on three loopback addresses stand for three hosts (two workers share one), each host
gets one daemon, all in one hoplite cluster; tasks pass ids and reduce; a host that joins
later gets a daemon and one whose worker dies loses it; bad set-ups are refused typed with
nothing left behind (docs/quickstart.md)."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import MiB, process_gone, until

distributed = pytest.importorskip("distributed", reason="hoplite[dask] is not installed")
import dask  # noqa: E402
from distributed import Client, Nanny, Scheduler, SpecCluster  # noqa: E402

import hoplite_client.dask as hdask  # noqa: E402
from hoplite_client.dask.rendezvous import STOPPED, host_of  # noqa: E402
from hoplite_client.wire.errors import InvalidArgumentError  # noqa: E402
from hoplite_client.wire.ids import ObjectID  # noqa: E402
from hoplited.config import host_memory  # noqa: E402

pytestmark = [pytest.mark.timeout(600),
              pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::ResourceWarning"),
              pytest.mark.filterwarnings("ignore::UserWarning")]

HOSTS = ["127.0.0.2", "127.0.0.2", "127.0.0.3", "127.0.0.4"]  # two workers share a host
LATE_HOST = "127.0.0.5"
CAPACITY = "256MiB"


@pytest.fixture(scope="module")
def scratch() -> Iterator[str]:
    """The workers' scratch space, ours alone and removed afterwards."""
    path = tempfile.mkdtemp(prefix="dask-")
    try:
        with dask.config.set({"temporary-directory": path}):
            yield path
    finally:
        shutil.rmtree(path)


@pytest.fixture(scope="module")
def dask_client(scratch: str) -> Iterator[Client]:
    """A scheduler and four worker processes (each under a nanny) on three hosts."""
    workers = {f"w{i}": {"cls": Nanny, "options": {"host": host, "nthreads": 2,
                                                    "memory_limit": "1GiB"}}
               for i, host in enumerate(HOSTS)}
    scheduler = {"cls": Scheduler, "options": {"host": "127.0.0.1", "dashboard": False}}
    with SpecCluster(workers=workers, scheduler=scheduler) as cluster, \
            Client(cluster) as client:
        client.wait_for_workers(len(HOSTS), timeout=120)
        yield client


@pytest.fixture
def workdir() -> Iterator[Path]:
    """Where the hosts keep their daemons' files: short, as a Unix socket's path must be."""
    path = tempfile.mkdtemp(prefix="hd-")
    try:
        yield Path(path)
    finally:
        shutil.rmtree(path)


@pytest.fixture
def hoplite(dask_client: Client, workdir: Path) -> Iterator[Client]:
    """The plugin registered on every worker; unregistered afterwards, every daemon checked
    gone and its files removed."""
    plugin = hdask.HopliteWorkerPlugin(capacity=CAPACITY, workdir=str(workdir))
    dask_client.register_plugin(plugin)
    try:
        yield dask_client
    finally:
        pids = daemon_pids(workdir)
        dask_client.unregister_worker_plugin(hdask.HopliteWorkerPlugin.name)
        until(lambda: all(process_gone(pid) for pid in pids), 30)
        # each host's last worker removed its directory (a host whose workers died keeps
        # its daemon's log, as Ray keeps a dead node's)
        assert not [p for p in workdir.iterdir() if LATE_HOST not in p.name]
        entries = dask_client.get_metadata(["hoplite", plugin.cluster, "hosts"])
        assert {entries[k] for k in entries if host_of(k) in HOSTS} == {STOPPED}, entries


def daemon_pids(workdir: Path) -> list[int]:
    """The PIDs of the daemons running from ``workdir`` (from /proc: any process of ours)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"hoplited" in cmdline and any(str(workdir).encode() in a for a in cmdline):
                pids.append(int(entry.name))
    return [pid for pid in pids if not process_gone(pid)]


def where(client: Client) -> dict[str, str]:
    """Every worker's address by the host it runs on (the first one of each host)."""
    found: dict[str, str] = {}
    for address, info in client.scheduler_info()["workers"].items():
        found.setdefault(info["host"], address)
    return found


def daemon_of_task() -> dict[str, Any]:
    """In a task: the daemon this worker reaches, and the members its cluster has."""
    async def run() -> dict[str, Any]:
        client = await hdask.client()
        try:
            local = (await client.status())["local"]
            return {"node_id": local["node_id"], "pid": local["pid"],
                    "members": len([m for m in local["members"] if m["alive"]]),
                    "socket": distributed.get_worker().plugins["hoplite"].socket}
        finally:
            await client.close()
    return asyncio.run(run())


def put_here(value: float) -> ObjectID:
    client = hdask.client_sync()
    try:
        return client.put(np.full(MiB, value, dtype=np.float32))
    finally:
        client.close()


def sum_of(oids: list[ObjectID]) -> float:
    async def run() -> float:
        client = await hdask.client()
        try:
            result = await client.reduce(oids, "sum", timeout=60)
            return float((await client.get(result, timeout=60))[-1])
        finally:
            await client.close()
    return asyncio.run(run())


def get_later(oid: ObjectID) -> float:
    client = hdask.client_sync()
    try:
        return float(client.get(oid, timeout=60)[0])
    finally:
        client.close()


def put_as(oid: ObjectID, value: float) -> None:
    client = hdask.client_sync()
    try:
        client.put(np.full(MiB, value, dtype=np.float32), object_id=oid)
    finally:
        client.close()


def test_client_outside_a_worker_is_refused_typed() -> None:
    with pytest.raises(hdask.DaskSetupError, match="not in a Dask worker"):
        hdask.client_sync()


def test_bad_options_fail_on_the_client() -> None:
    for bad in ({"port": -1}, {"start_timeout": float("nan")}, {"capacity": "lots"}):
        with pytest.raises(InvalidArgumentError):
            hdask.HopliteWorkerPlugin(**bad)


def test_a_task_before_the_plugin_is_refused_typed(dask_client: Client) -> None:
    with pytest.raises(hdask.DaskSetupError, match="register"):
        dask_client.submit(hdask.client_sync, pure=False).result(timeout=60)


def test_one_daemon_per_host_all_in_one_cluster(hoplite: Client) -> None:
    hosts = hoplite.scheduler_info()["workers"]
    seen = {address: hoplite.submit(daemon_of_task, workers=[address], pure=False).result(60)
            for address in hosts}
    by_host: dict[str, set[str]] = {}
    for address, info in seen.items():
        by_host.setdefault(hosts[address]["host"], set()).add(info["node_id"])
        assert info["members"] == 3, info
    assert sorted(by_host) == sorted(set(HOSTS))
    assert all(len(ids) == 1 for ids in by_host.values()), by_host  # shared on 127.0.0.2
    assert len(set().union(*by_host.values())) == 3


def test_tasks_pass_ids_through_dask_and_reduce(hoplite: Client) -> None:
    """Each host puts through its own daemon; the ids travel as Dask values; a task on each
    host reduces them all; a get issued before its object exists is answered once a task on
    another host puts it."""
    hosts = where(hoplite)
    oids = [hoplite.submit(put_here, float(i + 1), workers=[w], pure=False).result(timeout=60)
            for i, w in enumerate(hosts.values())]
    expected = float(sum(range(1, len(hosts) + 1)))
    sums = [hoplite.submit(sum_of, oids, workers=[w], pure=False) for w in hosts.values()]
    assert [s.result(timeout=120) for s in sums] == [expected] * len(hosts)

    first, *others = list(hosts.values())
    later = ObjectID.random()
    pending = [hoplite.submit(get_later, later, workers=[w], pure=False) for w in others]
    # the put comes a second after the gets, on purpose: they wait on an id nobody has put
    time.sleep(1.0)
    hoplite.submit(put_as, later, 7.0, workers=[first], pure=False).result(timeout=60)
    assert [p.result(timeout=120) for p in pending] == [7.0] * len(others)


def test_a_host_that_joins_gets_a_daemon_and_one_that_dies_loses_it(
        hoplite: Client, workdir: Path, scratch: str) -> None:
    """A worker started later on a new host gets a daemon in the same cluster; SIGKILLed,
    it takes its daemon with it, the others drop that member, and reduces go on."""
    before = set(daemon_pids(workdir))
    late = subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_worker", hoplite.scheduler.address,
         "--host", LATE_HOST, "--nthreads", "1", "--no-nanny", "--memory-limit", "1GiB",
         "--local-directory", scratch],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(  # to unpickle this module's tasks
            [str(Path(__file__).parent), str(Path(__file__).parent.parent)])})
    try:
        until(lambda: LATE_HOST in where(hoplite), 120)
        address = where(hoplite)[LATE_HOST]
        joined = hoplite.submit(daemon_of_task, workers=[address], pure=False).result(60)
        assert joined["members"] == 4
        late_daemon = set(daemon_pids(workdir)) - before
        assert len(late_daemon) == 1
        late.send_signal(signal.SIGKILL)
        late.wait(60)
        until(lambda: all(process_gone(pid) for pid in late_daemon), 30)

        survivors = [w for h, w in where(hoplite).items() if h != LATE_HOST]

        def members() -> int:
            return int(hoplite.submit(daemon_of_task, workers=[survivors[0]],
                                      pure=False).result(60)["members"])
        until(lambda: members() == 3, 60)
        oids = [hoplite.submit(put_here, 2.0, workers=[w], pure=False).result(60)
                for w in survivors]
        assert hoplite.submit(sum_of, oids, workers=[survivors[-1]],
                              pure=False).result(120) == 2.0 * len(survivors)
    finally:
        if late.poll() is None:
            late.kill()
            late.wait()


def test_after_a_restart_the_new_workers_form_one_cluster_again(hoplite: Client) -> None:
    """``Client.restart`` replaces every worker process: the new workers find or start their
    hosts' daemons, still one per host and all in one cluster, and collectives work."""
    hoplite.restart(timeout=120)
    hoplite.wait_for_workers(len(HOSTS), timeout=120)
    hosts = where(hoplite)
    seen = [hoplite.submit(daemon_of_task, workers=[w], pure=False).result(60)
            for w in hosts.values()]
    assert len({info["node_id"] for info in seen}) == len(hosts)
    until(lambda: all(hoplite.submit(daemon_of_task, workers=[w], pure=False).result(60)
                      ["members"] == len(hosts) for w in hosts.values()), 60)
    oids = [hoplite.submit(put_here, 1.0, workers=[w], pure=False).result(60)
            for w in hosts.values()]
    assert hoplite.submit(sum_of, oids, pure=False).result(120) == float(len(hosts))


def test_a_daemon_that_cannot_start_fails_the_registration_typed(
        dask_client: Client, workdir: Path) -> None:
    """A store larger than the host: every worker's setup fails, naming its host and the
    cause; no daemon is left running, and unregistering leaves nothing behind."""
    plugin = hdask.HopliteWorkerPlugin(capacity=str(host_memory() + (1 << 30)),
                                       workdir=str(workdir))
    try:
        with pytest.raises(hdask.DaskSetupError, match="no hoplite daemon on host 127.0.0") as exc:
            dask_client.register_plugin(plugin)
        assert "memory" in str(exc.value)
        assert not daemon_pids(workdir)
        with pytest.raises(hdask.DaskSetupError, match="register"):
            dask_client.submit(hdask.client_sync, pure=False).result(timeout=60)
    finally:
        dask_client.unregister_worker_plugin(hdask.HopliteWorkerPlugin.name)
    assert not daemon_pids(workdir) and not list(workdir.glob("*/hoplited.sock"))


def test_a_workdir_that_cannot_be_made_fails_the_registration_typed(
        dask_client: Client, workdir: Path) -> None:
    not_a_directory = workdir / "file"
    not_a_directory.write_text("")
    plugin = hdask.HopliteWorkerPlugin(capacity=CAPACITY, workdir=str(not_a_directory))
    try:
        with pytest.raises(hdask.DaskSetupError, match="no hoplite daemon on host 127.0.0"):
            dask_client.register_plugin(plugin)
        assert not daemon_pids(workdir)
    finally:
        dask_client.unregister_worker_plugin(hdask.HopliteWorkerPlugin.name)
