"""Dask distributed: broadcast, reduce, allreduce and gather the way Dask users write them.

The cluster lives in the emulated test bed (docs/design.md §7): ``dask scheduler`` in host 0's
namespace, one ``dask worker`` per host (``--nthreads 1 --nworkers 1 --no-nanny``, listening
on the host's IP), and the client (the driver) in host 0's namespace. Every task is pinned to
its participant's worker with ``workers=[address]``; rank i's input is
:func:`bench.baselines.common.float32_data` ``(size, i)``, made by a task on worker i (a new
key every run, so no replica of an earlier run can serve a later one).

The collectives, written as task graphs (the standard idiom of a task-based program):

- broadcast (default, ``idiom="tasks"``): the input is a future on worker 0 and every other
  worker runs one task that depends on it, so each fetches it from worker 0. The alternative
  ``idiom="scatter"`` is ``client.scatter(data, broadcast=True)`` from the client in host 0
  (Dask then replicates through the workers two at a time, a tree), for data that starts in
  the client rather than in a task's result. ``idiom="hoplite"`` is the same Dask cluster
  with :class:`hoplite_client.dask.HopliteWorkerPlugin` registered: a task on worker 0 puts
  the input into hoplite and every other worker runs one task that gets its id (Dask + Hoplite,
  docs/quickstart.md; the only idiom whose tasks import hoplite_client);
- reduce: one task on worker 0 depending on every input, summing them;
- allreduce: that reduce, then one task per other worker depending on the sum;
- gather: one task on worker 0 depending on every input (the root fetches them all).

A run (docs/design.md §7): the client waits until every input exists (a barrier), the clock
starts (``time.monotonic``, one clock for every process of this machine) as the client
submits the collective's tasks; each task stamps the moment it runs, which is when its worker
holds its dependencies (and, for the root of a reduce, when the sum is done); the run ends at
the latest stamp (for ``scatter``: when it returns, every worker then holding the data).
Stamps are collected, and after the last run every holder checks its result (broadcast and
gather exactly, sums within float32 rounding), by further untimed tasks.

Usage (root):  python -m bench.baselines.dask_baseline --nodes 8 --rate 1Gbit --op broadcast \\
                   --size 32MiB --repeat 5
From Python:   latencies = await run(testbed, "broadcast", size, repeat)
               async with DaskCluster(testbed) as dask_cluster:          # several ops, one
                   latencies = await dask_cluster.run("reduce", size, repeat)  # cluster start
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from bench.baselines.common import (
    OPS,
    REPO_ROOT,
    BaselineUnavailable,
    expected_sum,
    float32_data,
    module_command,
    sum_matches,
)
from bench.baselines.procs import alive, process_tree, signal_procs, tail

INSTALL_HINT = ("the Dask baseline needs Dask distributed: "
                "pip install 'dask[distributed]==2026.8.0'")
IDIOMS = ("tasks", "scatter", "hoplite")
SCHEDULER_PORT = 8786  # Dask's default; every host namespace has its own port space
START_TIMEOUT = 120.0  # scheduler and workers up, on a loaded 2-core machine
MIN_RATE_FOR_TIMEOUT = 10e6  # bytes/s: run timeouts assume at least this per object copy
KILL_GRACE = 10.0
RESULT_TAG = "DASK-RESULT "


# --------------------------------------------------------------------------------------------
# tasks (pickled by value from the driver, run on the workers)


def _make_input(size: int, rank: int) -> Any:
    return float32_data(size, rank)


def _hold(value: Any) -> tuple[float, Any]:
    """A receiver: its worker holds ``value`` (an array, or a stamped sum) when this runs."""
    if isinstance(value, tuple):
        value = value[1]
    return time.monotonic(), value


def _sum(*arrays: Any) -> tuple[float, Any]:
    total = arrays[0].copy()
    for arr in arrays[1:]:
        total += arr
    return time.monotonic(), total


def _gather(*arrays: Any) -> tuple[float, list[Any]]:
    return time.monotonic(), list(arrays)


def _stamp(stamped: tuple[float, Any]) -> float:
    return stamped[0]


def _hoplite_put(size: int, rank: int) -> Any:
    """Rank ``rank``'s input, put into this host's hoplite daemon: its id."""
    import hoplite_client.dask as hdask

    client = hdask.client_sync()
    try:
        return client.put(float32_data(size, rank))
    finally:
        client.close()


def _hoplite_hold(oid: Any, receivers: int, size: int) -> tuple[float, bool]:
    """A hoplite receiver: the moment its get returned, and whether the data is right
    (checked after the stamp)."""
    import numpy as np

    import hoplite_client.dask as hdask

    client = hdask.client_sync()
    try:
        value = client.get(oid, timeout=START_TIMEOUT, receivers=receivers)
        stamp = time.monotonic()
        return stamp, bool(np.array_equal(value, float32_data(size, 0)))
    finally:
        client.close()


def _hoplite_delete(oid: Any) -> None:
    import hoplite_client.dask as hdask

    client = hdask.client_sync()
    try:
        client.delete(oid)
    finally:
        client.close()


def _check(value: Any, op: str, size: int, nodes: int) -> bool:
    """Is what a participant holds after ``op`` right?"""
    import numpy as np

    if isinstance(value, tuple):
        value = value[1]
    if op == "broadcast":
        return bool(np.array_equal(value, float32_data(size, 0)))
    if op in ("reduce", "allreduce"):
        return sum_matches(np.asarray(value), expected_sum(size, nodes), nodes)
    return len(value) == nodes and all(
        np.array_equal(a, float32_data(size, r)) for r, a in enumerate(value))


# --------------------------------------------------------------------------------------------
# the driver (the client, inside host 0's namespace)


def driver(address: str, ips: Sequence[str], op: str, size: int, runs: int, idiom: str,
           workdir: str) -> int:
    """Connect, time ``runs`` ``op``s, print one RESULT_TAG line."""
    from distributed import Client, wait

    nodes = len(ips)
    errors: list[str] = []
    with Client(address, timeout=f"{START_TIMEOUT}s") as client:
        client.wait_for_workers(nodes, timeout=START_TIMEOUT)
        if idiom == "hoplite":
            from hoplite_client.dask import HopliteWorkerPlugin

            client.register_plugin(HopliteWorkerPlugin(capacity=str(max(4 * size, 256 << 20)),
                                                       workdir=workdir))
        by_ip = {}
        for addr in client.scheduler_info(n_workers=-1)["workers"]:
            by_ip[addr.split("://", 1)[-1].rsplit(":", 1)[0]] = addr
        workers = [by_ip[ip] for ip in ips]  # participant i's worker, in host i

        def on(rank: int, fn: Any, *args: Any) -> Any:
            return client.submit(fn, *args, workers=[workers[rank]], pure=False)

        def one_run() -> tuple[float, list[tuple[int, Any]]]:
            """Time one ``op``; (latency, (rank, future of what rank holds) per holder)."""
            if op == "broadcast" and idiom == "scatter":
                data = float32_data(size, 0)  # the input exists in the client, in host 0
                t0 = time.monotonic()
                future = client.scatter(data, broadcast=True, hash=False)
                return time.monotonic() - t0, [(r, future) for r in range(nodes)]
            if op == "broadcast" and idiom == "hoplite":
                oid = on(0, _hoplite_put, size, 0).result()  # the barrier: the input exists
                t0 = time.monotonic()
                got = client.gather([on(r, _hoplite_hold, oid, nodes - 1, size)
                                     for r in range(1, nodes)])
                on(0, _hoplite_delete, oid).result()  # untimed: room for the next run
                if not all(ok for _, ok in got):
                    raise RuntimeError("a hoplite receiver got wrong data")
                return max(stamp for stamp, _ in got) - t0, []
            ranks = [0] if op == "broadcast" else list(range(nodes))
            inputs = [on(r, _make_input, size, r) for r in ranks]
            wait(inputs)  # the barrier: every input exists
            t0 = time.monotonic()
            if op == "broadcast":
                timed = [(r, on(r, _hold, inputs[0])) for r in range(1, nodes)]
            elif op == "gather":
                timed = [(0, on(0, _gather, *inputs))]
            else:
                total = on(0, _sum, *inputs)
                timed = [(0, total)]
                if op == "allreduce":
                    timed += [(r, on(r, _hold, total)) for r in range(1, nodes)]
            wait([f for _, f in timed])
            ends = client.gather([on(r, _stamp, f) for r, f in timed])  # untimed
            return max(ends) - t0, timed

        latencies: list[float] = []
        for k in range(runs):
            latency, held = one_run()
            latencies.append(latency)
            if k == runs - 1:
                checks = client.gather([on(r, _check, f, op, size, nodes) for r, f in held])
                errors = [f"rank {r}: wrong {op} result"
                          for (r, _), good in zip(held, checks, strict=True) if not good]
            del held  # release this run's keys before the next
    print(RESULT_TAG + json.dumps({"latencies": latencies, "errors": errors}), flush=True)
    return 0


# --------------------------------------------------------------------------------------------
# processes (outside Dask): start the scheduler and workers, stop them by PID


def available() -> None:
    """Raise :class:`BaselineUnavailable` unless dask.distributed can be imported."""
    if importlib.util.find_spec("distributed") is None or importlib.util.find_spec("dask") is None:
        raise BaselineUnavailable(INSTALL_HINT)


class DaskCluster:
    """``async with DaskCluster(testbed) as dc: await dc.run(op, size, repeat)``.

    A scheduler in host 0 and a worker in every host; everything it started is stopped by
    PID when the block ends.
    """

    def __init__(self, testbed: Any) -> None:
        available()
        if testbed.size < 2:
            raise ValueError("a Dask collective needs at least 2 hosts")
        self.testbed = testbed
        self.nodes = testbed.size
        self.tmp = ""
        self.processes: list[asyncio.subprocess.Process] = []
        self.address = f"tcp://{testbed.hosts[0].ip}:{SCHEDULER_PORT}"

    def env(self) -> dict[str, str]:
        """The environment of every process this cluster starts (its own temp dir, one
        OpenMP/BLAS thread)."""
        return dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
                    OPENBLAS_NUM_THREADS="1", DASK_TEMPORARY_DIRECTORY=self.tmp)

    async def _spawn(self, rank: int, argv: list[str], log: str) -> asyncio.subprocess.Process:
        """``python ARGV`` in host ``rank``, from the repository root: ``python -m`` puts it
        on sys.path, so a worker can import ``bench`` when it unpickles a task."""
        with open(log, "wb") as out:
            process = await asyncio.create_subprocess_exec(
                *self.testbed.exec_prefix(rank), sys.executable, *argv, env=self.env(),
                cwd=REPO_ROOT, stdin=asyncio.subprocess.DEVNULL, stdout=out,
                stderr=asyncio.subprocess.STDOUT, start_new_session=True)
        self.processes.append(process)
        return process

    async def __aenter__(self) -> DaskCluster:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def stop(self) -> None:
        """Stop everything this cluster started (see :meth:`kill`) and reap it."""
        try:
            await asyncio.to_thread(self.kill)
        finally:
            for process in self.processes:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(process.wait(), KILL_GRACE)
            self.processes = []
            if self.tmp:
                shutil.rmtree(self.tmp, ignore_errors=True)
                self.tmp = ""

    async def start(self) -> None:
        """Start the scheduler, then (once it listens) every worker."""
        self.tmp = tempfile.mkdtemp(prefix="hpl-dask-")
        try:
            ip0 = self.testbed.hosts[0].ip
            info = os.path.join(self.tmp, "scheduler.json")
            log = os.path.join(self.tmp, "scheduler.log")
            scheduler = await self._spawn(0, [
                "-m", "distributed.cli.dask_scheduler", "--host", ip0,
                "--port", str(SCHEDULER_PORT), "--no-dashboard", "--scheduler-file", info], log)
            deadline = time.monotonic() + START_TIMEOUT
            while not os.path.exists(info):
                if scheduler.returncode is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"dask scheduler failed (exit {scheduler.returncode}):\n"
                                       f"{tail(log)}")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(scheduler.wait(), 0.2)
            for h in self.testbed.hosts:
                await self._spawn(h.index, [
                    "-m", "distributed.cli.dask_worker", self.address, "--host", h.ip,
                    "--nthreads", "1", "--nworkers", "1", "--no-nanny", "--no-dashboard",
                    "--name", f"h{h.index}", "--resources", f"host{h.index}=1",
                    "--local-directory", os.path.join(self.tmp, f"h{h.index}"),
                    "--death-timeout", str(int(START_TIMEOUT))],
                    os.path.join(self.tmp, f"worker-h{h.index}.log"))
        except BaseException:
            await self.stop()
            raise

    def kill(self) -> None:
        """SIGTERM the workers, then the scheduler (a worker that loses its scheduler first
        may linger trying to reconnect), by PID; SIGKILL what is left after a grace period."""
        procs = process_tree([p.pid for p in self.processes])
        first = self.processes[0].pid if self.processes else None  # the scheduler
        scheduler = {p: t for p, t in procs.items() if p == first}
        rest = {p: t for p, t in procs.items() if p not in scheduler}
        for group in (rest, scheduler):
            signal_procs(group, signal.SIGTERM)
            deadline = time.monotonic() + KILL_GRACE
            while alive(group) and time.monotonic() < deadline:
                time.sleep(0.05)
        signal_procs(procs, signal.SIGKILL)

    def _logs(self) -> str:
        names = sorted(n for n in os.listdir(self.tmp) if n.endswith(".log")) if self.tmp else []
        return "".join(f"\n--- {n} ---\n{tail(os.path.join(self.tmp, n), 10)}" for n in names)

    async def run(self, op: str, size: int, repeat: int, warmup: int = 1,
                  idiom: str = "tasks") -> list[float]:
        """Latency in seconds of each of ``repeat`` ``op``s (after ``warmup`` ones);
        ``idiom`` (broadcast only): "tasks", "scatter" or "hoplite" (the module's doc)."""
        if op not in OPS:
            raise ValueError(f"op must be one of {OPS}, not {op!r}")
        if idiom not in IDIOMS:
            raise ValueError(f"idiom must be one of {IDIOMS}, not {idiom!r}")
        if idiom != "tasks" and op != "broadcast":
            raise ValueError(f"the {idiom} idiom is a broadcast's, not a {op}'s")
        if size < 4 or repeat < 1 or warmup < 0:
            raise ValueError("need size >= 4, repeat >= 1 and warmup >= 0")
        runs = warmup + repeat
        copies = self.nodes if op in ("reduce", "gather") else 2 * self.nodes
        timeout = START_TIMEOUT + runs * copies * size / MIN_RATE_FOR_TIMEOUT
        log = os.path.join(self.tmp, f"driver-{op}-{time.monotonic_ns()}.out")
        argv = self.testbed.exec_prefix(0) + [
            *module_command("bench.baselines.dask_baseline"), "--driver",
            "--address", self.address,
            "--op", op, "--size", str(size), "--runs", str(runs),
            "--idiom", idiom, "--ips", ",".join(h.ip for h in self.testbed.hosts),
            "--workdir", self.tmp]
        with open(log, "wb") as err:
            process = await asyncio.create_subprocess_exec(
                *argv, env=self.env(), cwd=REPO_ROOT, stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=err, start_new_session=True)
        try:
            out, _ = await asyncio.wait_for(process.communicate(), timeout)
        except BaseException as exc:
            signal_procs(process_tree([process.pid]), signal.SIGKILL)
            await process.wait()
            if isinstance(exc, TimeoutError):
                raise RuntimeError(f"Dask {op}: no result within {timeout:.0f} s:\n"
                                   f"{tail(log)}{self._logs()}") from None
            raise
        results = [json.loads(line[len(RESULT_TAG):])
                   for line in out.decode(errors="replace").splitlines()
                   if line.startswith(RESULT_TAG)]
        if process.returncode != 0 or not results:
            raise RuntimeError(f"Dask {op} driver failed (exit {process.returncode}):\n"
                               f"{tail(log)}{self._logs()}")
        if results[-1]["errors"]:
            raise RuntimeError(f"Dask {op}: {'; '.join(results[-1]['errors'])}")
        return [float(t) for t in results[-1]["latencies"][warmup:]]


async def run(testbed: Any, op: str, size: int, repeat: int, warmup: int = 1) -> list[float]:
    """Latency in seconds of each of ``repeat`` Dask ``op``s of ``size`` bytes of float32
    (after ``warmup`` ones), participant i in host i of ``testbed``, root host 0: starts a
    Dask cluster for this call and stops it after. Broadcast uses the "tasks" idiom.

    Raises :class:`BaselineUnavailable` without dask.distributed, ``RuntimeError`` if a
    process fails or a result is wrong.
    """
    if op not in OPS:
        raise ValueError(f"op must be one of {OPS}, not {op!r}")
    available()
    async with DaskCluster(testbed) as cluster:
        return await cluster.run(op, size, repeat, warmup)


# --------------------------------------------------------------------------------------------
# command line


async def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Build a test bed and one Dask cluster, run each of ``args.op``, print the results."""
    # the command line's side only: the driver and the tasks never import hoplite_client
    from hoplite_client.wire.units import parse_size
    from hoplited.tools.scenarios import optimum
    from hoplited.tools.testbed import Testbed, parse_rate

    rate = parse_rate(args.rate)
    size = parse_size(args.size)
    ops = args.op.split(",")
    for op in ops:
        if op not in OPS:
            raise SystemExit(f"--op: {op!r} is not one of {', '.join(OPS)}")
    report = []
    async with Testbed(args.nodes, rate, mtu=args.mtu) as tb:
        if args.check:
            for m in await tb.check_links():
                print(f"link h{m.src} → h{m.dst}: {m.bps / 1e6:.0f} Mbit/s")
        async with DaskCluster(tb) as cluster:
            for op in ops:
                latencies = await cluster.run(op, size, args.repeat, args.warmup, args.idiom)
                median = statistics.median(latencies)
                best = optimum(op, size, args.nodes, rate)
                how = f" ({args.idiom})" if op == "broadcast" else ""
                print(f"dask {op}{how} of {size / 2**20:.1f} MiB, {args.nodes} nodes, "
                      f"{args.rate} links: median {median:.3f} s = {median / best:.2f} × "
                      f"optimum ({best:.3f} s) "
                      f"(runs: {', '.join(f'{t:.3f}' for t in latencies)})", flush=True)
                report.append({"op": op, "system": "dask", "nodes": args.nodes, "size": size,
                               "rate_bps": rate, "runs": latencies, "median_s": median,
                               "ratio_to_optimum": median / best,
                               **({"idiom": args.idiom} if op == "broadcast" else {})})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return report


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: measure in a fresh test bed, or (``--driver``) be the client."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--driver"]:  # internal: the client, inside host 0's namespace
        p = argparse.ArgumentParser()
        p.add_argument("--address", required=True)
        p.add_argument("--op", choices=OPS, required=True)
        p.add_argument("--idiom", choices=IDIOMS, default="tasks")
        p.add_argument("--ips", required=True)
        p.add_argument("--workdir", required=True)
        for name in ("--size", "--runs"):
            p.add_argument(name, type=int, required=True)
        a = p.parse_args(argv[1:])
        return driver(a.address, a.ips.split(","), a.op, a.size, a.runs, a.idiom, a.workdir)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--rate", default="1Gbit")
    parser.add_argument("--mtu", type=int, default=65000)
    parser.add_argument("--op", default="broadcast",
                        help=f"one of {', '.join(OPS)}, or several separated by commas "
                             "(one Dask cluster for all)")
    parser.add_argument("--size", default="32MiB")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--idiom", choices=IDIOMS, default="tasks",
                        help="broadcast: tasks depending on worker 0's future (default), "
                             "client.scatter(broadcast=True), or hoplite gets in tasks (the "
                             "worker plugin of hoplite_client.dask)")
    parser.add_argument("--check", action="store_true", help="measure the links first")
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args(argv)
    try:
        asyncio.run(measure(args))
    except BaselineUnavailable as exc:
        print(f"unavailable: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
