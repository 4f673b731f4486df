"""Benchmark scenarios: one collective on a list of clients, timed the paper's way, checked.

Latency follows the paper: from the moment every input exists until the last participant
holds its result. :func:`run_scenario` runs ``warmup`` unmeasured runs, then ``repeat``
measured ones, and returns their latencies; every result is checked against the data that
was put (a wrong result raises :class:`BenchError`). :func:`optimum` is the yardstick: the
least time the links allow (docs/design.md §7).

Two front ends share this module: the ``hoplite bench`` commands
(:mod:`hoplited.tools.cli.bench`) and ``bench/compare.py``, which measures hoplite and
the baselines in the same emulated test bed; the baselines' command lines use :func:`optimum`
too, so every system is held to the same bound. Nothing here knows about click.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

import hoplite_client
from hoplite_client.net.channel import Channel
from hoplite_client.net.endpoints import host_id, parse_address, tool_token
from hoplite_client.net.handshake import Identity, dial
from hoplite_client.net.tls import TlsContexts, TlsFiles, load
from hoplite_client.wire.errors import HopliteError
from hoplite_client.wire.messages import Stats
from hoplited.tools.local_cluster import LocalCluster
from hoplited.tools.testbed import DEFAULT_MTU, emulated_cluster

GET_TIMEOUT = 600.0  # per get; a 256 MiB broadcast on a loaded machine takes seconds
STATS_TIMEOUT = 10.0  # one Stats request to an existing cluster's seed



class BenchError(HopliteError):
    """A benchmark could not run (too few daemons) or a collective returned wrong data."""

    code = "bench"


def optimum(op: str, size: int, nodes: int, rate_bps: float) -> float:
    """The least time in seconds the links allow for ``op`` of ``size`` bytes on ``nodes``
    hosts with ``rate_bps`` links (docs/design.md §7); results are reported as ratios to it."""
    # how often the busiest link carries the object: every link once for broadcast and
    # reduce, about twice for allreduce, the root's downlink N−1 times for gather
    copies = {"broadcast": 1, "reduce": 1, "allreduce": 2, "gather": nodes - 1, "roundtrip": 1}
    return copies[op] * size * 8 / rate_bps


# --------------------------------------------------------------------------------------------
# clients to measure with


async def members_on_this_host(seed: str, token: bytes,
                               tls: TlsContexts | None = None) -> list[str]:
    """Unix sockets of an existing cluster's live members that run on this machine (a client
    can only reach its own host's daemon); ``tls`` if the cluster uses TLS."""
    host, port = parse_address(seed)
    protocol, _ = await dial(host, port, "tool", Identity("bench-tool", token, tls))
    try:
        frame = await Channel(protocol).request(Stats(), timeout=STATS_TIMEOUT)
    finally:
        protocol.close()
    here = host_id()
    return [str(m["socket"]) for m in frame.msg.info["members"]
            if m["alive"] and m["host_id"] == here]


@contextlib.asynccontextmanager
async def bench_clients(nodes: int, join: str | None, token_file: str | None,
                        capacity: str, emulate: int | None = None, tls: TlsFiles | None = None,
                        daemon_args: Sequence[str] = (), mtu: int = DEFAULT_MTU,
                        ) -> AsyncIterator[tuple[list[hoplite_client.Client], LocalCluster | None]]:
    """Clients of ``nodes`` daemons: a fresh local cluster (in an emulated test bed with
    ``emulate`` bit/s links of ``mtu`` if given), or members of ``join``'s cluster; closed on
    exit. The cluster comes along when we started it (failure runs signal its daemons).
    ``token_file``: ``join``'s token (None: the default token file, a bare daemon's).
    ``tls``: the started cluster's daemons use these files, or ``join``'s cluster is dialled
    with them; ``daemon_args``: more options for the daemons we start."""
    async with contextlib.AsyncExitStack() as stack:
        cluster: LocalCluster | None = None
        if emulate is not None:
            cluster = await stack.enter_async_context(
                emulated_cluster(nodes, emulate, capacity=capacity, mtu=mtu, check=True,
                                 log_level="warning", tls=tls, daemon_args=daemon_args))
            sockets = cluster.sockets
        elif join is None:
            cluster = await stack.enter_async_context(
                LocalCluster(nodes, capacity=capacity, log_level="warning", tls=tls,
                             daemon_args=daemon_args))
            sockets = cluster.sockets
        else:
            contexts = None if tls is None else load(tls)
            sockets = (await members_on_this_host(join, tool_token(token_file),
                                                  contexts))[:nodes]
            if len(sockets) < 2:
                raise BenchError(f"the cluster at {join} has {len(sockets)} member(s) "
                                 f"on this host; a benchmark needs at least 2")
        clients = [await stack.enter_async_context(await hoplite_client.connect(s))
                   for s in sockets]
        yield clients, cluster


# --------------------------------------------------------------------------------------------
# data, progress and the context a scenario runs in


class Progress:
    """One status line, rewritten in place on a terminal (stderr); one line per finished run
    on stdout, so a log of the benchmark shows every run."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()

    def update(self, text: str) -> None:
        """Replace the status line (nothing unless stderr is a terminal)."""
        if self.tty:
            sys.stderr.write(f"\r\033[K{text}")
            sys.stderr.flush()

    def done(self, text: str) -> None:
        """Clear the status line and print ``text`` for good."""
        if self.tty:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()
        print(text, flush=True)


def make_data(size: int, seed: int = 0) -> NDArray[Any]:
    """``size`` bytes of random float32 (the paper's payload), or uint8 if 4 does not divide
    it; the same for the same (size, seed)."""
    rng = np.random.default_rng(seed)
    if size % 4 == 0:
        return rng.random(size // 4, dtype=np.float32)
    return np.frombuffer(rng.bytes(size), dtype=np.uint8)


def same_bytes(a: NDArray[Any], b: NDArray[Any]) -> bool:
    """Bit-exact equality (NaN payloads included), whatever the dtypes: a copy must be exact."""
    return a.nbytes == b.nbytes and bool(np.array_equal(a.reshape(-1).view(np.uint8),
                                                        b.reshape(-1).view(np.uint8)))


@dataclass
class BenchContext:
    """What every scenario run needs: clients (node 0 first), per-node data, the settings."""

    clients: list[hoplite_client.Client]
    size: int
    interval: float
    progress: Progress
    label: str = ""
    striped: bool = False  # allreduce: in stripes (Client.allreduce)
    # allreduce: a reduce every node gets, as an allreduce of k of the inputs must be (the
    # failure runs with a backup input): the failure-free runs then time the same thing
    as_reduce: bool = False
    # wall-clock times (time.time) at which each put returned, every run's in turn: what
    # bench/link_trace.py sets the links' byte counters against
    put_times: list[float] = field(default_factory=list)
    _data: dict[int, NDArray[Any]] = field(default_factory=dict)
    _expected: dict[str, NDArray[Any]] = field(default_factory=dict)

    def data(self, node: int) -> NDArray[Any]:
        """Node ``node``'s input (generated once, different on every node)."""
        if node not in self._data:
            self._data[node] = make_data(self.size, seed=node)
        return self._data[node]

    def expected_sum(self, inputs: tuple[int, ...] | None = None) -> NDArray[Any]:
        """The sum of the inputs ``data(i)`` for i in ``inputs`` (default: every node's),
        accumulated in float64, in the inputs' dtype."""
        which = tuple(range(len(self.clients))) if inputs is None else inputs
        key = f"sum{which}"
        if key not in self._expected:
            total: NDArray[np.float64] = np.sum(
                [self.data(i).astype(np.float64) for i in which], axis=0)
            self._expected[key] = total.astype(self.data(0).dtype)
        return self._expected[key]

    def check(self, ok: bool, what: str) -> None:
        """Raise :class:`BenchError` (naming the run) unless ``ok``."""
        if not ok:
            raise BenchError(f"{self.label}: {what}")


Scenario = Callable[[BenchContext, int], Awaitable[float]]


# --------------------------------------------------------------------------------------------
# the scenarios


async def put_all(ctx: BenchContext, ids: list[hoplite_client.ObjectID],
                  then: Callable[[int], None] | None = None) -> float:
    """Every node puts its input under ``ids[i]``, at once or starting ``interval`` apart;
    returns the time the last put completed (the moment every input exists). ``then(i)`` runs
    once node i's put is done (``interval`` > 0 only): a participant that waits for the result
    once it has contributed. The inputs are made first, so that making them (0.1 s for 32 MiB)
    does not stretch the intervals of a first run."""
    inputs = [ctx.data(i) for i in range(len(ctx.clients))]
    if ctx.interval <= 0:
        await asyncio.gather(*(c.put(inputs[i], object_id=ids[i])
                               for i, c in enumerate(ctx.clients)))
        ctx.put_times.append(time.time())
        return time.perf_counter()
    t0 = time.perf_counter()
    for i, c in enumerate(ctx.clients):
        await asyncio.sleep(max(0.0, t0 + i * ctx.interval - time.perf_counter()))
        await c.put(inputs[i], object_id=ids[i])
        ctx.put_times.append(time.time())
        if then is not None:
            then(i)
        ctx.progress.update(f"{ctx.label}: input {i + 1}/{len(ctx.clients)} put")
    return time.perf_counter()


def reduced_ok(ctx: BenchContext, result: NDArray[Any],
               inputs: tuple[int, ...] | None = None) -> bool:
    """The result has the inputs' shape and equals numpy's sum of ``data(i)`` for i in
    ``inputs`` (default: every node's)."""
    return result.shape == ctx.data(0).shape and bool(
        np.allclose(result, ctx.expected_sum(inputs), rtol=1e-4, atol=1e-3))


async def run_broadcast(ctx: BenchContext, run: int) -> float:
    """Put on node 0, get everywhere else at once, each get saying how many there are (so
    the shard can take a tree where a chain would cost more, docs/design.md §3)."""
    data, receivers = ctx.data(0), ctx.clients[1:]
    oid = await ctx.clients[0].put(data)
    ctx.put_times.append(time.time())
    done = 0
    t0 = time.perf_counter()

    async def one(client: hoplite_client.Client) -> NDArray[Any]:
        nonlocal done
        arr = await client.get(oid, timeout=GET_TIMEOUT, receivers=len(receivers))
        done += 1
        ctx.progress.update(f"{ctx.label}: {done}/{len(receivers)} receivers done, "
                            f"{time.perf_counter() - t0:.2f} s")
        return arr

    results = await asyncio.gather(*(one(c) for c in receivers))
    elapsed = time.perf_counter() - t0
    bad = [k + 1 for k, r in enumerate(results) if not same_bytes(r, data)]
    del results
    await ctx.clients[0].delete(oid)
    ctx.check(not bad, f"nodes {bad} received wrong bytes")
    return elapsed


async def _reduce(ctx: BenchContext, everyone_gets: bool) -> float:
    ids = [hoplite_client.ObjectID.random() for _ in ctx.clients]
    root = ctx.clients[0]
    def start_reduce(ids: list[hoplite_client.ObjectID], op: str,
                     timeout: float) -> Awaitable[hoplite_client.ObjectID]:
        if everyone_gets and not ctx.as_reduce:
            return root.allreduce(ids, op, timeout=timeout, striped=ctx.striped)
        return root.reduce(ids, op, timeout=timeout)

    if ctx.interval > 0:  # asynchrony: the reduce waits for inputs that arrive one by one,
        # and each participant asks for the result once it has put its input (as a task does)
        result = await start_reduce(ids, "sum", timeout=GET_TIMEOUT)
        getters: list[asyncio.Future[NDArray[Any]]] = []

        def wait_result(i: int) -> None:
            if everyone_gets or i == 0:
                getters.append(asyncio.ensure_future(
                    ctx.clients[i].get(result, timeout=GET_TIMEOUT)))
        start = await put_all(ctx, ids, wait_result)
    else:
        start = await put_all(ctx, ids)
        result = await start_reduce(ids, "sum", timeout=GET_TIMEOUT)
        getters = [asyncio.ensure_future(c.get(result, timeout=GET_TIMEOUT))
                   for c in (ctx.clients if everyone_gets else [root])]
    arrays = await asyncio.gather(*getters)
    elapsed = time.perf_counter() - start
    ctx.check(all(reduced_ok(ctx, a) for a in arrays), "the result differs from numpy's sum")
    del arrays
    for oid in [*ids, result]:
        await root.delete(oid)
    return elapsed


async def run_reduce(ctx: BenchContext, run: int) -> float:
    """Every node puts an input; node 0 reduces (sum) them and gets the result."""
    return await _reduce(ctx, everyone_gets=False)


async def run_allreduce(ctx: BenchContext, run: int) -> float:
    """Every node puts an input; node 0 starts an allreduce (striped, or a reduce, if the
    context says); every node gets the result."""
    return await _reduce(ctx, everyone_gets=True)


async def run_gather(ctx: BenchContext, run: int) -> float:
    """Every node puts an object; node 0 gets them all."""
    ids = [hoplite_client.ObjectID.random() for _ in ctx.clients]
    start = await put_all(ctx, ids)
    arrays = await ctx.clients[0].gather(ids, timeout=GET_TIMEOUT)
    elapsed = time.perf_counter() - start
    ctx.check(all(same_bytes(a, ctx.data(i)) for i, a in enumerate(arrays)),
              "gathered bytes differ")
    del arrays
    for oid in ids:
        await ctx.clients[0].delete(oid)
    return elapsed


async def run_roundtrip(ctx: BenchContext, run: int) -> float:
    """Put on node 0, then get on node 1: the whole round trip."""
    t0 = time.perf_counter()
    oid = await ctx.clients[0].put(ctx.data(0))
    got = await ctx.clients[1].get(oid, timeout=GET_TIMEOUT)
    elapsed = time.perf_counter() - t0
    ctx.check(same_bytes(got, ctx.data(0)), "node 1 received wrong bytes")
    del got
    await ctx.clients[0].delete(oid)
    return elapsed


SCENARIOS: dict[str, Scenario] = {"broadcast": run_broadcast, "reduce": run_reduce,
                                  "allreduce": run_allreduce, "gather": run_gather,
                                  "roundtrip": run_roundtrip}


async def run_scenario(op: str, ctx: BenchContext, warmup: int, repeat: int) -> list[float]:
    """Warm-up runs, then ``repeat`` measured runs of scenario ``op``, printing each; returns
    the measured latencies in seconds."""
    latencies = []
    for i in range(warmup + repeat):
        measured = i >= warmup
        ctx.label = f"run {i - warmup + 1}/{repeat}" if measured else f"warm-up {i + 1}/{warmup}"
        elapsed = await SCENARIOS[op](ctx, i)
        if measured:
            latencies.append(elapsed)
        ctx.progress.done(f"{ctx.label}: {elapsed * 1e3:.1f} ms")
    return latencies
