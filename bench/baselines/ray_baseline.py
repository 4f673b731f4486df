"""Ray: broadcast, reduce, allreduce and gather the way Ray users write them (ray.put/ray.get).

The Ray cluster lives in the emulated test bed (docs/design.md §7): the head node in host 0's
namespace, one worker node in each other host's namespace, started one at a time with
``ray start --block --node-ip-address <host IP>``, one CPU and a custom resource ``host<i>``
per node, a small object store (and a private ``--temp-dir``: ports are per namespace anyway).
A driver in host 0's namespace creates one actor per host, pinned by that resource; actor i
holds rank i's input (:func:`bench.baselines.common.float32_data`).

The collectives, as the Hoplite paper's Ray baselines (and Ray users) do them:

- broadcast: actor 0 ``ray.put``s its array; every other actor ``ray.get``s the reference;
- reduce: every other actor ``ray.put``s its array; actor 0 ``ray.get``s them all and adds
  them to its own;
- allreduce: that reduce, then actor 0 ``ray.put``s the sum and every other actor gets it;
- gather: every other actor ``ray.put``s its array; actor 0 ``ray.get``s them all.

References travel through the driver (a list holding an ``ObjectRef`` is passed unresolved).
A run (docs/design.md §7): every actor drops the previous run's objects and has its input (a
barrier: the driver waits for all of them); the clock starts (``time.monotonic``, one clock
for every process of this machine) as the driver issues the first call; the run ends at the
latest moment a participant holds its result, as that participant stamps it. After the last
run each participant checks what it holds (broadcast and gather exactly, sums within float32
rounding), untimed.

Usage (root):  python -m bench.baselines.ray_baseline --nodes 8 --rate 1Gbit --op broadcast \\
                   --size 32MiB --repeat 5
From Python:   latencies = await run(testbed, "broadcast", size, repeat)
               async with RayCluster(testbed, max_size) as ray_cluster:   # several ops, one
                   latencies = await ray_cluster.run("reduce", size, repeat)  # cluster start
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

INSTALL_HINT = ("the Ray baseline needs Ray: pip install 'ray==2.60.0' "
                "(or 'ray[default]'; any Ray 2.x for Python 3.11)")
GCS_PORT = 6379  # Ray's default; every host namespace has its own port space
NODE_START_TIMEOUT = 120.0  # one `ray start` on a loaded 2-core machine
DRIVER_START_TIMEOUT = 180.0  # ray.init plus N actors (a new worker process each)
MIN_RATE_FOR_TIMEOUT = 10e6  # bytes/s: run timeouts assume at least this per object copy
KILL_GRACE = 10.0  # SIGTERM to SIGKILL; `ray start --block` stops its daemons on SIGTERM
MIN_STORE = 80 << 20  # Ray refuses an object store under 75 MiB
STORE_SLACK = 64 << 20
STARTED = "Ray runtime started"
RESULT_TAG = "RAY-RESULT "
# `ray` with this interpreter (its raylets then start workers with it too)
RAY_CLI = "import sys; from ray.scripts.scripts import main; sys.argv[0] = 'ray'; sys.exit(main())"


# --------------------------------------------------------------------------------------------
# inside Ray: the participants (actors) and the driver, run in host 0's namespace


class Participant:
    """Rank ``rank``'s actor; pinned to its host by the custom resource ``host<rank>``."""

    def __init__(self, rank: int, nodes: int, size: int) -> None:
        import numpy as np

        self.rank, self.nodes, self.size = rank, nodes, size
        self.input = float32_data(size, rank)
        self.input.setflags(write=False)
        self.np = np
        self.held: Any = None  # what this rank received / computed in the current run

    def ready(self) -> str:
        """The id of the Ray node this actor runs on (the driver checks the placement)."""
        import ray

        return str(ray.get_runtime_context().get_node_id())

    def reset(self) -> bool:
        """Drop the previous run's objects (the barrier before a run)."""
        self.held = None
        return True

    def put(self) -> list[Any]:
        """``ray.put`` this rank's input; the reference goes back wrapped (unresolved)."""
        import ray

        return [ray.put(self.input)]

    def fetch(self, wrapped: list[Any]) -> float:
        """``ray.get`` one object (a broadcast); returns when this rank holds it."""
        import ray

        self.held = ray.get(wrapped[0])
        return time.monotonic()

    def _get_all(self, wrapped_refs: list[Any]) -> list[Any]:
        import ray

        refs = [w[0] for w in ray.get(wrapped_refs)]  # the puts' results: [ref] each
        return list(ray.get(refs))

    def reduce(self, wrapped_refs: list[Any], share: bool) -> tuple[float, list[Any]]:
        """Root: get every other rank's array, sum with its own; ``share``: put the sum."""
        import ray

        total = self.input.copy()
        for arr in self._get_all(wrapped_refs):
            total += arr
        self.held = total
        done = time.monotonic()
        return done, ([ray.put(total)] if share else [])

    def gather(self, wrapped_refs: list[Any]) -> float:
        """Root: get every other rank's array."""
        self.held = [self.input] + list(self._get_all(wrapped_refs))
        return time.monotonic()

    def check(self, op: str) -> str | None:
        """None if what this rank holds after ``op`` is right, else what is wrong."""
        np = self.np
        if op == "broadcast" and self.rank:
            good = self.held is not None and np.array_equal(self.held, float32_data(self.size, 0))
        elif op == "reduce" and self.rank == 0 or op == "allreduce":
            good = self.held is not None and sum_matches(
                np.asarray(self.held), expected_sum(self.size, self.nodes), self.nodes)
        elif op == "gather" and self.rank == 0:
            good = self.held is not None and len(self.held) == self.nodes and all(
                np.array_equal(a, float32_data(self.size, r)) for r, a in enumerate(self.held))
        else:
            return None  # nothing to hold: the root of a broadcast, a non-root of reduce/gather
        return None if good else f"rank {self.rank}: wrong {op} result"


def driver(address: str, node_ip: str, nodes: int, op: str, size: int, runs: int) -> int:
    """Connect to the cluster, time ``runs`` ``op``s, print one RESULT_TAG line."""
    import ray

    ray.init(address=address, _node_ip_address=node_ip, log_to_driver=False,
             logging_level="WARNING")
    actor_cls = ray.remote(num_cpus=0, max_restarts=0)(Participant)
    actors = [actor_cls.options(resources={f"host{r}": 1}).remote(r, nodes, size)
              for r in range(nodes)]
    node_ids = ray.get([a.ready.remote() for a in actors], timeout=DRIVER_START_TIMEOUT)
    if len(set(node_ids)) != nodes:
        raise RuntimeError(f"actors not on {nodes} distinct nodes: {node_ids}")
    root, others = actors[0], actors[1:]

    def one_run() -> float:
        """Time one ``op`` (its references are dropped when this returns)."""
        ray.get([a.reset.remote() for a in actors])  # barrier: inputs exist, nothing held
        t0 = time.monotonic()
        if op == "broadcast":
            wrapped = ray.get(root.put.remote())
            ends = ray.get([a.fetch.remote(wrapped) for a in others])
        elif op in ("reduce", "allreduce"):
            puts = [a.put.remote() for a in others]
            end, shared = ray.get(root.reduce.remote(puts, op == "allreduce"))
            ends = [end] + (ray.get([a.fetch.remote(shared) for a in others]) if shared else [])
        else:
            ends = [ray.get(root.gather.remote([a.put.remote() for a in others]))]
        return float(max(ends) - t0)

    latencies = [one_run() for _ in range(runs)]
    errors = [e for e in ray.get([a.check.remote(op) for a in actors]) if e]
    print(RESULT_TAG + json.dumps({"latencies": latencies, "errors": errors}), flush=True)
    for a in actors:
        ray.kill(a)
    ray.shutdown()
    return 0


# --------------------------------------------------------------------------------------------
# processes (outside Ray): start nodes one at a time, stop them by PID


def available() -> None:
    """Raise :class:`BaselineUnavailable` unless Ray can be imported."""
    if importlib.util.find_spec("ray") is None:
        raise BaselineUnavailable(INSTALL_HINT)


class RayCluster:
    """``async with RayCluster(testbed, max_size) as rc: await rc.run(op, size, repeat)``.

    Starts a Ray head in host 0 and a worker node in every other host, one at a time; the
    object stores fit the collectives of up to ``max_size`` bytes. Everything it started is
    stopped by PID when the block ends.
    """

    def __init__(self, testbed: Any, max_size: int) -> None:
        available()
        if testbed.size < 2:
            raise ValueError("a Ray collective needs at least 2 hosts")
        self.testbed = testbed
        self.nodes = testbed.size
        self.max_size = max_size
        self.tmp = ""
        self.starters: list[asyncio.subprocess.Process] = []
        self.logs: list[str] = []
        self.address = f"{testbed.hosts[0].ip}:{GCS_PORT}"

    def store_bytes(self, rank: int) -> int:
        """Object store of host ``rank``: the root holds everyone's array, its own put, the
        sum and its put; another host its own put and a copy of the result; plus slack."""
        copies = self.nodes + 3 if rank == 0 else 4
        return max(MIN_STORE, copies * self.max_size + STORE_SLACK)

    def env(self) -> dict[str, str]:
        """The environment of every process this cluster starts (its own temp dir, no usage
        stats, one OpenMP thread)."""
        return dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_TMPDIR=self.tmp,
                    PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")

    def _start_argv(self, rank: int) -> list[str]:
        host = self.testbed.hosts[rank]
        argv: list[str] = self.testbed.exec_prefix(rank) + [
            sys.executable, "-c", RAY_CLI, "start", "--block",
            "--node-ip-address", host.ip, "--num-cpus", "1", "--num-gpus", "0",
            "--resources", json.dumps({f"host{rank}": 1}),
            "--object-store-memory", str(self.store_bytes(rank)),
            "--object-spilling-directory", os.path.join(self.tmp, "spill"),
            "--disable-usage-stats", "--include-log-monitor", "false"]
        if rank == 0:
            argv += ["--head", "--port", str(GCS_PORT), "--include-dashboard", "false",
                     "--temp-dir", self.tmp]
        else:
            argv += ["--address", self.address]
        return argv

    async def __aenter__(self) -> RayCluster:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def stop(self) -> None:
        """Stop everything this cluster started (see :meth:`kill`) and reap it."""
        try:
            await asyncio.to_thread(self.kill)
        finally:
            for process in self.starters:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(process.wait(), KILL_GRACE)
            self.starters = []
            if self.tmp:
                shutil.rmtree(self.tmp, ignore_errors=True)
                self.tmp = ""

    async def start(self) -> None:
        """Start the head, then each worker node once the previous one is up."""
        self.tmp = tempfile.mkdtemp(prefix="hpl-ray-")  # short: Ray puts sockets in it
        os.makedirs(os.path.join(self.tmp, "spill"))
        try:
            for rank in range(self.nodes):
                await self._start_node(rank)
        except BaseException:
            await self.stop()
            raise

    async def _start_node(self, rank: int) -> None:
        log = os.path.join(self.tmp, f"start-h{rank}.log")
        self.logs.append(log)
        with open(log, "wb") as out:
            process = await asyncio.create_subprocess_exec(
                *self._start_argv(rank), env=self.env(), cwd=REPO_ROOT,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out, stderr=asyncio.subprocess.STDOUT, start_new_session=True)
        self.starters.append(process)
        deadline = time.monotonic() + NODE_START_TIMEOUT
        while STARTED not in tail(log, 200):
            if process.returncode is not None or time.monotonic() > deadline:
                raise RuntimeError(f"ray start in host {rank} failed (exit {process.returncode})"
                                   f":\n{tail(log)}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(process.wait(), 0.2)

    def kill(self) -> None:
        """Stop every process we started (the `ray start` processes, their daemons and the
        workers of those), by PID: SIGTERM, then SIGKILL after a grace period."""
        roots = [p.pid for p in self.starters]
        namespaces = [h.netns for h in self.testbed.hosts]
        procs = process_tree(roots, namespaces, self.tmp) if self.tmp else {}
        # `ray start --block` stops its daemons on SIGTERM; workers end with their raylet
        signal_procs({pid: t for pid, t in procs.items() if pid in roots}, signal.SIGTERM)
        deadline = time.monotonic() + KILL_GRACE
        while alive(procs) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = alive(procs)
        if self.tmp:  # anything spawned meanwhile
            left.update(alive(process_tree(list(left), namespaces, self.tmp)))
        signal_procs(left, signal.SIGTERM)
        time.sleep(0.5 if left else 0)
        signal_procs(alive(left), signal.SIGKILL)

    async def run(self, op: str, size: int, repeat: int, warmup: int = 1) -> list[float]:
        """Latency in seconds of each of ``repeat`` ``op``s (after ``warmup`` ones)."""
        if op not in OPS:
            raise ValueError(f"op must be one of {OPS}, not {op!r}")
        if size < 4 or repeat < 1 or warmup < 0:
            raise ValueError("need size >= 4, repeat >= 1 and warmup >= 0")
        if size > self.max_size:
            raise ValueError(f"this cluster's object stores fit {self.max_size} bytes, "
                             f"not {size}")
        runs = warmup + repeat
        copies = self.nodes if op in ("reduce", "gather") else 2 * self.nodes
        timeout = DRIVER_START_TIMEOUT + runs * copies * size / MIN_RATE_FOR_TIMEOUT
        log = os.path.join(self.tmp, f"driver-{op}-{time.monotonic_ns()}.log")
        argv = self.testbed.exec_prefix(0) + [
            *module_command("bench.baselines.ray_baseline"), "--driver", "--address", self.address,
            "--node-ip", self.testbed.hosts[0].ip, "--nodes", str(self.nodes), "--op", op,
            "--size", str(size), "--runs", str(runs)]
        with open(log, "wb") as err:
            # the driver's working directory is on its workers' sys.path (Ray adds it)
            process = await asyncio.create_subprocess_exec(
                *argv, env=self.env(), cwd=REPO_ROOT, stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=err, start_new_session=True)
        try:
            out, _ = await asyncio.wait_for(process.communicate(), timeout)
        except BaseException:
            driver_procs = process_tree([process.pid], [], "")
            signal_procs(driver_procs, signal.SIGKILL)
            await process.wait()
            if sys.exc_info()[0] is TimeoutError:
                raise RuntimeError(f"Ray {op}: no result within {timeout:.0f} s:\n"
                                   f"{tail(log)}") from None
            raise
        results = [json.loads(line[len(RESULT_TAG):])
                   for line in out.decode(errors="replace").splitlines()
                   if line.startswith(RESULT_TAG)]
        if process.returncode != 0 or not results:
            raise RuntimeError(f"Ray {op} driver failed (exit {process.returncode}):\n"
                               f"{tail(log)}")
        if results[-1]["errors"]:
            raise RuntimeError(f"Ray {op}: {'; '.join(results[-1]['errors'])}")
        return [float(t) for t in results[-1]["latencies"][warmup:]]


async def run(testbed: Any, op: str, size: int, repeat: int, warmup: int = 1) -> list[float]:
    """Latency in seconds of each of ``repeat`` Ray ``op``s of ``size`` bytes of float32
    (after ``warmup`` ones), participant i in host i of ``testbed``, root host 0: starts a
    Ray cluster for this call and stops it after.

    Raises :class:`BaselineUnavailable` without Ray, ``RuntimeError`` if a process fails or a
    result is wrong.
    """
    if op not in OPS:
        raise ValueError(f"op must be one of {OPS}, not {op!r}")
    available()
    async with RayCluster(testbed, size) as cluster:
        return await cluster.run(op, size, repeat, warmup)


# --------------------------------------------------------------------------------------------
# command line


async def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Build a test bed and one Ray cluster, run each of ``args.op``, print the results."""
    # the command line's side only: the driver and the actors never import hoplite_client
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
        async with RayCluster(tb, size) as cluster:
            for op in ops:
                latencies = await cluster.run(op, size, args.repeat, args.warmup)
                median = statistics.median(latencies)
                best = optimum(op, size, args.nodes, rate)
                print(f"ray {op} of {size / 2**20:.1f} MiB, {args.nodes} nodes, {args.rate} "
                      f"links: median {median:.3f} s = {median / best:.2f} × optimum "
                      f"({best:.3f} s) (runs: {', '.join(f'{t:.3f}' for t in latencies)})",
                      flush=True)
                report.append({"op": op, "system": "ray", "nodes": args.nodes, "size": size,
                               "rate_bps": rate, "runs": latencies, "median_s": median,
                               "ratio_to_optimum": median / best})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return report


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: measure in a fresh test bed, or (``--driver``) be the driver."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--driver"]:  # internal: the driver, inside host 0's namespace
        p = argparse.ArgumentParser()
        p.add_argument("--address", required=True)
        p.add_argument("--node-ip", required=True)
        p.add_argument("--op", choices=OPS, required=True)
        for name in ("--nodes", "--size", "--runs"):
            p.add_argument(name, type=int, required=True)
        a = p.parse_args(argv[1:])
        return driver(a.address, a.node_ip, a.nodes, a.op, a.size, a.runs)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--rate", default="1Gbit")
    parser.add_argument("--mtu", type=int, default=65000)
    parser.add_argument("--op", default="broadcast",
                        help=f"one of {', '.join(OPS)}, or several separated by commas "
                             "(one Ray cluster for all)")
    parser.add_argument("--size", default="32MiB")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
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
