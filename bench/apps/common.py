"""What the three apps share: the Ray cluster they run in, their command line, actor placement,
calls in flight whose actor may die, and the throughput report before and after a node death.

A run (:func:`main`) starts a Ray cluster of ``--nodes`` Ray nodes on this machine
(``ray.cluster_utils.Cluster``: a head and ``nodes - 1`` worker nodes, Ray's files in a fresh
``RAY_TMPDIR``), with ``--system hoplite`` a ``hoplited`` on every node
(``hoplite_client.ray.init``), hands the app a :class:`Setup` and prints the app's result as
one JSON line. Node 0 (the head) holds each app's coordinator; ``--kill-node K`` (1 <= K <
nodes) removes Ray node K ``--kill-after`` seconds into the run, without a graceful shutdown,
and the app goes on with the actors left. ``--emulate RATE`` runs the same in the emulated
test bed instead, one Ray node per network namespace (:mod:`bench.apps.emulated`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray
from numpy.typing import NDArray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

import hoplite_client.ray as hray
from bench.apps.transport import (
    POLL,
    PRODUCER_GONE,
    SYSTEMS,
    Handle,
    Transport,
    TransportError,
)
from hoplite_client import ConnectionLostError
from hoplite_client.ray.supervisor import NAMESPACE, daemon_name
from hoplite_client.wire.units import parse_size

MiB = 1 << 20
# The smoke runs: a few seconds each, in a head and two worker nodes with small stores.
SMOKE_NODES = 3
SMOKE_SIZE = MiB
SMOKE_STORE = 100 * MiB
SMOKE_CAPACITY = "256MiB"
# How long a coordinator may take in all, beyond its per-step timeouts: a stuck run fails.
RUN_LIMIT = 600.0
# How long the driver waits for the actors of an app to start (a new process each).
START_TIMEOUT = 180.0
# While waits end short, the actors are pinged this often (see Crew).
STALL = 1.0
# How many times an actor tries a fetch that times out (fetch_retrying).
FETCH_ATTEMPTS = 3


class WrongResultError(AssertionError):
    """A reduce or broadcast delivered something other than the value it must have."""


@dataclass(frozen=True)
class Setup:
    """One run of an app: where (Ray node ids, the coordinator's first), on which system,
    how big, how long; ``kill(i)`` removes Ray node i."""

    system: str
    nodes: list[str]
    size: int
    iterations: int
    timeout: float
    kill_node: int | None = None
    kill_after: float = 0.0
    kill: Callable[[int], None] | None = None

    @property
    def kill_window(self) -> float | None:
        """Seconds the run goes on at least after the kill (None: no kill)."""
        return None if self.kill_node is None else self.kill_after

    def result(self, app: str, metric: str, values: dict[str, Any]) -> dict[str, Any]:
        """The JSON line an app prints."""
        return {"app": app, "system": self.system, "nodes": len(self.nodes), "size": self.size,
                "metric": metric, "values": values}


# --------------------------------------------------------------------------------------------
# checks and data


def digest(array: NDArray[Any]) -> int:
    """A CRC-32 of the array's bytes: readers of a broadcast compare it with the writer's."""
    return zlib.crc32(np.ascontiguousarray(array).data.cast("B"))


def check_digest(array: NDArray[Any], expected: int, what: str) -> None:
    """Fail loudly unless ``array`` is the array whose :func:`digest` is ``expected``."""
    got = digest(array)
    if got != expected:
        raise WrongResultError(f"{what}: CRC-32 {got:#010x}, expected {expected:#010x}")


def check_equal(array: NDArray[Any], expected: NDArray[Any], what: str) -> None:
    """Fail loudly unless ``array`` equals ``expected`` exactly (the apps' sums are of small
    integers held in float32, exact in any order)."""
    if array.shape != expected.shape or not np.array_equal(array, expected):
        bad = np.flatnonzero(array.reshape(-1) != expected.reshape(-1))
        where = f"first at {bad[0]}: {array.reshape(-1)[bad[0]]} != " \
                f"{expected.reshape(-1)[bad[0]]}" if bad.size else f"shape {array.shape}"
        raise WrongResultError(f"{what}: wrong result, {bad.size} elements differ ({where})")


def integers(size: int, seed: int, high: int = 64) -> NDArray[np.float32]:
    """``size // 4`` float32 values, small integers in [-high, high): sums of a few thousand
    of them are exact in float32, whatever the order of the additions."""
    rng = np.random.default_rng(seed)
    return rng.integers(-high, high, size // 4, dtype=np.int32).astype(np.float32)


# --------------------------------------------------------------------------------------------
# actors


class Actor:
    """What every actor of the apps answers: where it runs (its ping)."""

    def ready(self) -> str:
        """The Ray node this actor runs on."""
        return str(ray.get_runtime_context().get_node_id())


class Coordinator(Actor):
    """An app's coordinator (on the head node), with the :class:`Progress` of its loop."""

    progress: Progress

    def killed(self, at: float) -> None:
        """The driver removed a node at ``at`` (``time.time()``)."""
        self.progress.killed(at)


def on_node(node: str, concurrency: int = 2) -> dict[str, Any]:
    """Ray options that pin an actor to Ray node ``node`` (zero CPUs: any number fit; two
    threads: a ping is answered while a long call runs)."""
    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=False),
            "num_cpus": 0, "max_restarts": 0, "max_concurrency": concurrency}


def fetch_retrying(transport: Transport, handle: Handle, timeout: float, readers: int = 0,
                   attempts: int = FETCH_ATTEMPTS) -> NDArray[Any]:
    """``transport.fetch``, tried again after a timeout (a source that died mid-transfer:
    Hoplite resumes from another copy, Ray pulls again) up to ``attempts`` times in all."""
    for _ in range(attempts - 1):
        try:
            return transport.fetch(handle, timeout, readers)
        except TransportError:
            continue
    return transport.fetch(handle, timeout, readers)


@dataclass(eq=False)
class Call:
    """A call to actor ``actor`` in flight, watched through its small ``status`` return:
    ``ok`` is None while it runs, True once it returned, False if its actor or node died."""

    actor: int
    status: ray.ObjectRef[Any]
    ok: bool | None = None


class Crew:
    """An app's actors, one per Ray node, and which of them are alive.

    An actor is dropped when a call to it fails because it or its node died (seen through the
    calls' small status returns; a Hoplite client whose daemon is gone means its node is going
    too), or when it stops answering pings while a wait stalls: a call that ended may leave an
    output only its node held, and Ray tells the owner that the output is lost only once it
    declares the node dead (some 15 s after a crash, by default), while the actor's process
    stops answering within seconds."""

    def __init__(self, actors: list[Any]) -> None:
        self.actors = actors
        self.alive = set(range(len(actors)))
        self._pings: dict[int, ray.ObjectRef[Any]] = {}
        self._last_ping = 0.0

    @classmethod
    def start(cls, actor_cls: Any, nodes: Sequence[str], *args: Any) -> Crew:
        """One actor of ``actor_cls`` (built with ``args``) on each of ``nodes``; returns
        once all of them are up (each answers ``ready()`` with its node)."""
        actors = [actor_cls.options(**on_node(node)).remote(*args) for node in nodes]
        crew = cls(actors)
        try:
            where = ray.get([a.ready.remote() for a in actors], timeout=START_TIMEOUT)
            if list(where) != list(nodes):
                raise RuntimeError(f"actors landed on {where}, not on {list(nodes)}")
        except BaseException:
            crew.stop()
            raise
        return crew

    def __len__(self) -> int:
        return len(self.actors)

    def stop(self) -> None:
        """Kill the actors (those on a dead node are gone already)."""
        for actor in self.actors:
            ray.kill(actor)

    def check(self, calls: Sequence[Call], ping: bool = False) -> None:
        """Settle the calls that ended (a call that raised anything but the death of its
        actor re-raises here: a wrong result seen by an actor fails the run loudly); with
        ``ping``, ping the live actors not pinged yet. Drops the actors found dead."""
        self.alive -= {c.actor for c in _settle(calls) if not c.ok}
        if ping:
            for i in self.alive - set(self._pings):
                self._pings[i] = self.actors[i].ready.remote()
        if self._pings:
            pings = [Call(i, ref) for i, ref in self._pings.items()]
            for call in _settle(pings):
                del self._pings[call.actor]
                if not call.ok:
                    self.alive.discard(call.actor)

    def waiter(self, calls: Sequence[Call], enough: int) -> Callable[[], bool]:
        """A ``give_up`` for a wait on the outputs of ``calls`` (a transport calls it each
        time a poll ends short): true once fewer than ``enough`` of them can still come.
        The live actors are pinged meanwhile, at most every :data:`STALL` s."""
        def give_up() -> bool:
            ping = time.monotonic() - self._last_ping >= STALL
            if ping:
                self._last_ping = time.monotonic()
            self.check(calls, ping=ping)
            return sum(c.ok is not False and c.actor in self.alive for c in calls) < enough
        return give_up

    def census(self, timeout: float) -> int:
        """Ping every live actor and wait for the answers: one that fails or does not answer
        within ``timeout`` s is dropped. How many are alive."""
        calls = [Call(i, self.actors[i].ready.remote()) for i in sorted(self.alive)]
        deadline = time.monotonic() + timeout
        while any(c.ok is None for c in calls) and time.monotonic() < deadline:
            ray.wait([c.status for c in calls if c.ok is None], timeout=POLL)
            _settle(calls)
        self.alive -= {c.actor for c in calls if not c.ok}
        return len(self.alive)

    def wait(self, calls: Sequence[Call], timeout: float) -> None:
        """Wait until every call ended or its actor died; TransportError after ``timeout``."""
        deadline = time.monotonic() + timeout
        give_up = self.waiter(calls, 0)
        while any(c.ok is None and c.actor in self.alive for c in calls):
            if time.monotonic() > deadline:
                raise TransportError(f"actor calls not done in {timeout:.0f} s")
            running = [c.status for c in calls if c.ok is None and c.actor in self.alive]
            ray.wait(running, num_returns=len(running), timeout=POLL)
            give_up()


def _settle(calls: Sequence[Call]) -> list[Call]:
    """Set ``ok`` of the calls that ended by now; returns those."""
    running = [c for c in calls if c.ok is None]
    if not running:
        return []
    ready, _ = ray.wait([c.status for c in running], num_returns=len(running), timeout=0)
    done = set(ready)
    ended = [c for c in running if c.status in done]
    for call in ended:
        try:
            ray.get(call.status)
            call.ok = True
        except (*PRODUCER_GONE, ConnectionLostError):
            call.ok = False
    return ended


# --------------------------------------------------------------------------------------------
# progress and the report


class Progress:
    """The end times (wall clock: one clock for every process of a machine) of a
    coordinator's iterations. Done after ``iterations`` of them or, when a node is to be
    killed ``kill_after`` s into the run, once ``kill_after`` s passed since the kill
    (:meth:`killed`) and ``iterations`` more ended after the stall it caused: the window
    after the kill is no shorter than the one before."""

    def __init__(self, iterations: int, kill_after: float | None,
                 limit: float = RUN_LIMIT) -> None:
        self.iterations, self.kill_after = iterations, kill_after
        self.times: list[float] = []
        self.kill_at: float | None = None
        self.retries = 0
        self._deadline = time.monotonic() + limit

    def killed(self, at: float) -> None:
        """The node was killed at ``at`` (``time.time()``)."""
        self.kill_at = at

    def record(self) -> None:
        """One iteration ended now."""
        self.times.append(time.time())

    def done(self) -> bool:
        """Whether the loop has run enough; raises if it runs past its limit."""
        if time.monotonic() > self._deadline:
            raise RuntimeError(f"not done after {RUN_LIMIT:.0f} s: {len(self.times)} "
                               f"iterations, kill at {self.kill_at}")
        if self.kill_after is None:
            return len(self.times) >= self.iterations
        if self.kill_at is None or time.time() < self.kill_at + self.kill_after:
            return False
        return len(self._stall()[1]) >= self.iterations

    def _stall(self) -> tuple[float | None, list[float]]:
        """The longest gap between iterations from the last one before the kill (or the
        kill) on, and the end times of the iterations after it."""
        assert self.kill_at is not None
        before = [t for t in self.times if t <= self.kill_at]
        after = [t for t in self.times if t > self.kill_at]
        if not after:
            return None, []
        ends = [before[-1] if before else self.kill_at, *after]
        gaps = [b - a for a, b in zip(ends, ends[1:])]
        longest = max(range(len(gaps)), key=gaps.__getitem__)
        return gaps[longest], after[longest:]

    def summary(self) -> dict[str, Any]:
        """Throughput (iterations per second) over all iterations and, with a kill, before
        it and after the stall it caused (the survivors' pace), and that stall: the
        longest gap between iterations from the last one before the kill on."""
        values: dict[str, Any] = {"throughput": rate(self.times), "iterations": len(self.times),
                                  "retries": self.retries}
        if self.kill_at is not None:
            stall, recovered = self._stall()
            values["throughput_before_kill"] = rate([t for t in self.times if t <= self.kill_at])
            values["throughput_after_kill"] = rate(recovered)
            values["stall_s"] = None if stall is None else round(stall, 3)
        return values


def rate(times: Sequence[float]) -> float | None:
    """Iterations per second between the first and the last of ``times`` (None: too few)."""
    if len(times) < 2 or times[-1] <= times[0]:
        return None
    return round((len(times) - 1) / (times[-1] - times[0]), 3)


def latency_stats(latencies: Sequence[float]) -> dict[str, float]:
    """Median, mean and worst of ``latencies`` (seconds), in milliseconds."""
    return {"p50_ms": round(statistics.median(latencies) * 1e3, 2),
            "mean_ms": round(statistics.fmean(latencies) * 1e3, 2),
            "max_ms": round(max(latencies) * 1e3, 2)}


def drive(setup: Setup, coordinator: Any, run: ray.ObjectRef[Any]) -> dict[str, Any]:
    """Wait for a coordinator's ``run`` call, killing node ``setup.kill_node`` meanwhile if
    asked (the coordinator hears when, through its ``killed`` method); its result."""
    if setup.kill_node is not None:
        if setup.kill is None:
            raise ValueError("no way to kill a node in this cluster")
        finished, _ = ray.wait([run], timeout=setup.kill_after)
        if finished:
            ray.get(run)
            raise RuntimeError("the run ended before the node was killed")
        at = time.time()
        setup.kill(setup.kill_node)
        ray.get(coordinator.killed.remote(at))
    result: dict[str, Any] = ray.get(run, timeout=RUN_LIMIT + 60)
    return result


# --------------------------------------------------------------------------------------------
# the cluster


class LocalRayCluster:
    """``nodes`` Ray nodes on this machine (``ray.cluster_utils.Cluster``), the driver
    connected; Ray's session files in a fresh directory removed by :meth:`stop`."""

    def __init__(self, nodes: int, store: int = SMOKE_STORE, cpus: int = 1) -> None:
        if nodes < 2:
            raise ValueError(f"an app needs at least 2 Ray nodes, not {nodes}")
        self.size = nodes
        self._node_args = {"num_cpus": cpus, "object_store_memory": store}
        self._tmp = ""
        self._old_tmpdir: str | None = None
        self._cluster: Any = None
        self._nodes: list[Any] = []
        self._leftovers: list[str] = []  # the directories of killed nodes' hoplited

    def start(self) -> None:
        """Start the head and the worker nodes and connect to them."""
        from ray.cluster_utils import Cluster

        self._tmp = tempfile.mkdtemp(prefix="ray-")  # short: Ray's socket paths must stay short
        self._old_tmpdir = os.environ.get("RAY_TMPDIR")
        os.environ["RAY_TMPDIR"] = self._tmp  # Ray's files, its processes' too, under it
        try:
            self._cluster = Cluster(initialize_head=True, head_node_args={
                **self._node_args, "include_dashboard": False})
            self._nodes = [self._cluster.head_node]
            self.restore()
            ray.init(address=self._cluster.address, logging_level=logging.WARNING,
                     log_to_driver=False)
        except BaseException:
            self.stop()
            raise

    @property
    def node_ids(self) -> list[str]:
        """The Ray node ids of the nodes not killed, the head's first."""
        return [n.node_id for n in self._nodes]

    def restore(self) -> None:
        """Add worker nodes until there are ``size`` nodes again (after kills)."""
        while len(self._nodes) < self.size:
            self._nodes.append(self._cluster.add_node(**self._node_args))
        self._cluster.wait_for_nodes()

    def kill(self, index: int) -> None:
        """Remove Ray node ``index`` (not the head) at once, as a crash would."""
        if not 0 < index < len(self._nodes):
            raise ValueError(f"node {index} is not a worker node (1..{len(self._nodes) - 1})")
        workdir = hoplite_workdir(self._nodes[index].node_id)
        if workdir:
            self._leftovers.append(workdir)
        self._cluster.remove_node(self._nodes.pop(index), allow_graceful=False)

    def stop(self) -> None:
        """Disconnect, stop every node, remove Ray's files."""
        try:
            ray.shutdown()
            if self._cluster is not None:
                self._cluster.shutdown()
        finally:
            self._cluster, self._nodes = None, []
            if self._old_tmpdir is None:
                os.environ.pop("RAY_TMPDIR", None)
            else:
                os.environ["RAY_TMPDIR"] = self._old_tmpdir
            for path in [self._tmp, *self._leftovers]:
                if path:
                    remove_when_quiet(path)
            self._tmp, self._leftovers = "", []


def hoplite_workdir(node: str) -> str | None:
    """The private directory of Ray node ``node``'s ``hoplited`` (its log stays behind when
    the node dies), or None without one."""
    try:
        actor: Any = ray.get_actor(daemon_name(node), namespace=NAMESPACE)
        info: dict[str, Any] = ray.get(actor.info.remote(), timeout=START_TIMEOUT)
    except (ValueError, ray.exceptions.RayError):
        return None
    return os.path.dirname(info["socket"]) if info.get("socket") else None


def remove_when_quiet(path: str, timeout: float = 30.0) -> None:
    """Remove ``path`` for good: Ray's exiting processes may still write a file or two."""
    deadline = time.monotonic() + timeout
    while True:
        shutil.rmtree(path, ignore_errors=True)
        time.sleep(0.5)
        if not os.path.exists(path) or time.monotonic() > deadline:
            return


@contextlib.contextmanager
def hoplite_running(system: str, capacity: str) -> Iterator[None]:
    """A ``hoplited`` on every Ray node while the block runs, if ``system`` is hoplite."""
    if system != "hoplite":
        yield
        return
    hray.init(capacity=capacity, watch_interval=1.0)
    try:
        yield
    finally:
        hray.shutdown()


# --------------------------------------------------------------------------------------------
# the command line

App = Callable[[Setup, argparse.Namespace], dict[str, Any]]


def parser(doc: str, iterations: int, smoke_iterations: int) -> argparse.ArgumentParser:
    """The options every app takes; an app adds its own."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--system", choices=SYSTEMS, required=True)
    p.add_argument("--smoke", action="store_true",
                   help=f"a few seconds: {SMOKE_NODES} nodes, {SMOKE_SIZE >> 20} MiB, "
                        f"{smoke_iterations} iterations (unless given)")
    p.add_argument("--nodes", type=int, default=None, help="Ray nodes, the head included")
    p.add_argument("--size", default=None, help="bytes of the model, e.g. 64MiB")
    p.add_argument("--iterations", type=int, default=None,
                   help=f"(default {iterations}; with --kill-node: this many after the kill)")
    p.add_argument("--kill-node", type=int, default=None, metavar="K",
                   help="remove Ray node K (1..nodes-1) mid-run")
    p.add_argument("--kill-after", type=float, default=2.0, metavar="T",
                   help="seconds into the run to remove it")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds a fetch or a reduce may wait before it is tried again "
                        "(default: 30, more for big models on many nodes)")
    p.add_argument("--capacity", default=None, help="each hoplited's store (default: fits)")
    p.add_argument("--emulate", default=None, metavar="RATE",
                   help="run in the emulated test bed with links of RATE (root), e.g. 1Gbit")
    p.add_argument("--inside", default=None, help=argparse.SUPPRESS)  # see bench.apps.emulated
    p.set_defaults(default_iterations=iterations, smoke_iterations=smoke_iterations)
    return p


def resolve(args: argparse.Namespace) -> argparse.Namespace:
    """Fill in the defaults that depend on ``--smoke`` and check the options."""
    smoke = args.smoke
    args.nodes = args.nodes or (SMOKE_NODES if smoke else 4)
    args.size = parse_size(args.size) if args.size else (SMOKE_SIZE if smoke else 64 * MiB)
    args.iterations = args.iterations or (args.smoke_iterations if smoke
                                          else args.default_iterations)
    # Enough for every node's copy of the model at 10 MB/s, and at least 30 s.
    args.timeout = args.timeout or max(30.0, args.nodes * args.size / 10e6)
    if args.size < 4 or args.size % 4:
        raise SystemExit(f"--size must be a positive multiple of 4 bytes, not {args.size}")
    if args.kill_node is not None and not 0 < args.kill_node < args.nodes:
        raise SystemExit(f"--kill-node must be within 1..{args.nodes - 1} (0 is the head, "
                         f"which holds the coordinator)")
    args.store = SMOKE_STORE if smoke else max(SMOKE_STORE, 8 * args.size + 64 * MiB)
    args.capacity = args.capacity or (SMOKE_CAPACITY if smoke
                                      else f"{max(256, 10 * args.size >> 20)}MiB")
    return args


def setup_of(args: argparse.Namespace, nodes: list[str],
             kill: Callable[[int], None] | None) -> Setup:
    """The :class:`Setup` of a run with ``args`` (resolved) on ``nodes``."""
    return Setup(system=args.system, nodes=nodes, size=args.size, iterations=args.iterations,
                 timeout=args.timeout, kill_node=args.kill_node, kill_after=args.kill_after,
                 kill=kill)


def main(module: str, app: App, args: argparse.Namespace) -> int:
    """Run ``app`` (of module ``module``) once as its command line asks; print its result as
    one JSON line."""
    args = resolve(args)
    if args.emulate:
        from bench.apps.emulated import run_emulated, run_inside

        if args.inside:
            return run_inside(app, args)
        return run_emulated(module, sys.argv[1:], args)
    cluster = LocalRayCluster(args.nodes, store=args.store)
    # Ray prints what its processes report (a raylet's death, say) to the driver's stdout:
    # to stderr with it, so that stdout carries the result line only.
    with contextlib.redirect_stdout(sys.stderr):
        cluster.start()
        try:
            with hoplite_running(args.system, args.capacity):
                result = app(setup_of(args, cluster.node_ids, cluster.kill), args)
        finally:
            cluster.stop()
    print(json.dumps(result), flush=True)
    return 0
