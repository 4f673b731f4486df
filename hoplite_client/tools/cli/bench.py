"""``hoplite bench``: measure collectives on a local cluster it starts (or an existing one).

Latency follows the paper: from the moment every input exists until the last participant
holds its result; the median of ``--repeat`` runs after ``--warmup`` runs. Every result is
checked against the data that was put.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable, Optional

import click
import numpy as np
import uvloop

import hoplite_client
from hoplite_client.net.channel import Channel
from hoplite_client.net.endpoints import host_id, parse_address
from hoplite_client.net.handshake import Identity, dial
from hoplite_client.tools.local_cluster import LocalCluster
from hoplite_client.tools.testbed import emulated_cluster, format_rate, parse_rate
from hoplite_client.wire.errors import HopliteError
from hoplite_client.wire.messages import Stats
from hoplite_client.wire.units import parse_size

GET_TIMEOUT = 600.0  # per get; a 256 MiB broadcast on a loaded machine takes seconds


def optimum(op: str, size: int, nodes: int, rate_bps: int) -> float:
    """The least time the links allow (DESIGN §7): every link carries the object once for
    broadcast and reduce, about twice for allreduce; the root's downlink N−1 times for gather."""
    copies = {"broadcast": 1, "reduce": 1, "allreduce": 2, "gather": nodes - 1, "roundtrip": 1}
    return copies[op] * size * 8 / rate_bps


@dataclass
class BenchResult:
    op: str
    nodes: int
    size: int
    cluster: str
    rate_bps: Optional[int] = None
    arrival_interval: float = 0.0
    runs: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.runs)

    @property
    def optimum(self) -> Optional[float]:
        return None if self.rate_bps is None else optimum(self.op, self.size, self.nodes,
                                                          self.rate_bps)

    def as_dict(self) -> dict[str, Any]:
        ratio = None if self.optimum is None else self.median / self.optimum
        return {**asdict(self), "median_s": self.median, "optimum_s": self.optimum,
                "ratio_to_optimum": ratio}


async def members_on_this_host(seed: str, token: bytes) -> list[str]:
    """Unix sockets of an existing cluster's members that run on this machine."""
    host, port = parse_address(seed)
    protocol, _ = await dial(host, port, "tool", Identity("bench-tool", token))
    try:
        frame = await Channel(protocol).request(Stats(), timeout=10)
    finally:
        protocol.close()
    here = host_id()
    return [m["socket"] for m in frame.msg.info["members"]
            if m["alive"] and m["host_id"] == here]


@contextlib.asynccontextmanager
async def bench_clients(nodes: int, join: Optional[str], token_file: Optional[str],
                        capacity: str, emulate: Optional[int] = None,
                        ) -> AsyncIterator[list[hoplite_client.Client]]:
    """Clients of ``nodes`` daemons: a fresh local cluster (in an emulated test bed with
    ``emulate`` bit/s links if given), or members of ``join``'s cluster."""
    async with contextlib.AsyncExitStack() as stack:
        if emulate is not None:
            cluster = await stack.enter_async_context(
                emulated_cluster(nodes, emulate, capacity=capacity, check=True,
                                 log_level="warning"))
            sockets = cluster.sockets
        elif join is None:
            cluster = await stack.enter_async_context(
                LocalCluster(nodes, capacity=capacity, log_level="warning"))
            sockets = cluster.sockets
        else:
            token = b""
            if token_file:
                with open(token_file, "rb") as f:
                    token = f.read().strip()
            sockets = (await members_on_this_host(join, token))[:nodes]
            if len(sockets) < 2:
                raise click.ClickException(f"the cluster at {join} has {len(sockets)} member(s) "
                                           f"on this host; a benchmark needs at least 2")
        clients = [await stack.enter_async_context(await hoplite_client.connect(s))
                   for s in sockets]
        yield clients


class Progress:
    """One status line, rewritten in place on a terminal, printed once per run otherwise."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()

    def update(self, text: str) -> None:
        if self.tty:
            click.echo(f"\r\033[K{text}", nl=False, err=True)

    def done(self, text: str) -> None:
        if self.tty:
            click.echo("\r\033[K", nl=False, err=True)
        click.echo(text)


def make_data(size: int, seed: int = 0) -> np.ndarray:
    """``size`` bytes of random float32 (the paper's payload), or uint8 if 4 does not divide it."""
    rng = np.random.default_rng(seed)
    if size % 4 == 0:
        return rng.random(size // 4, dtype=np.float32)
    return np.frombuffer(rng.bytes(size), dtype=np.uint8)


def same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit-exact equality (NaN payloads included), whatever the dtypes."""
    return a.nbytes == b.nbytes and bool(np.array_equal(a.reshape(-1).view(np.uint8),
                                                        b.reshape(-1).view(np.uint8)))


Scenario = Callable[["BenchContext", int], Awaitable[float]]


@dataclass
class BenchContext:
    """What every scenario run needs: clients (node 0 first), per-node data, the settings."""

    clients: list[hoplite_client.Client]
    size: int
    interval: float
    progress: "Progress"
    label: str = ""
    _data: dict[int, np.ndarray] = field(default_factory=dict)
    _expected: dict[str, np.ndarray] = field(default_factory=dict)

    def data(self, node: int) -> np.ndarray:
        """Node ``node``'s input (generated once, different on every node)."""
        if node not in self._data:
            self._data[node] = make_data(self.size, seed=node)
        return self._data[node]

    def expected_sum(self) -> np.ndarray:
        if "sum" not in self._expected:
            total = np.sum([self.data(i).astype(np.float64) for i in range(len(self.clients))],
                           axis=0)
            self._expected["sum"] = total.astype(self.data(0).dtype)
        return self._expected["sum"]

    def check(self, ok: bool, what: str) -> None:
        if not ok:
            raise click.ClickException(f"{self.label}: {what}")


async def _put_all(ctx: BenchContext, ids: list[hoplite_client.ObjectID]) -> float:
    """Every node puts its input under ``ids[i]``, at once or ``interval`` apart; returns the
    time the last put completed (the moment every input exists)."""
    if ctx.interval <= 0:
        await asyncio.gather(*(c.put(ctx.data(i), object_id=ids[i])
                               for i, c in enumerate(ctx.clients)))
        return time.perf_counter()
    for i, c in enumerate(ctx.clients):
        if i:
            await asyncio.sleep(ctx.interval)
        await c.put(ctx.data(i), object_id=ids[i])
        ctx.progress.update(f"{ctx.label}: input {i + 1}/{len(ctx.clients)} put")
    return time.perf_counter()


def _reduced_ok(ctx: BenchContext, result: np.ndarray) -> bool:
    return result.shape == ctx.data(0).shape and bool(
        np.allclose(result, ctx.expected_sum(), rtol=1e-4, atol=1e-3))


async def run_broadcast(ctx: BenchContext, run: int) -> float:
    """Put on node 0, get everywhere else at once."""
    data, receivers = ctx.data(0), ctx.clients[1:]
    oid = await ctx.clients[0].put(data)
    done = 0
    t0 = time.perf_counter()

    async def one(client: hoplite_client.Client) -> np.ndarray:
        nonlocal done
        arr = await client.get(oid, timeout=GET_TIMEOUT)
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
    if ctx.interval > 0:  # asynchrony: the reduce waits for inputs that arrive one by one
        result = await root.reduce(ids, "sum", timeout=GET_TIMEOUT)
        getters = [asyncio.ensure_future(c.get(result, timeout=GET_TIMEOUT))
                   for c in (ctx.clients if everyone_gets else [root])]
        start = await _put_all(ctx, ids)
    else:
        start = await _put_all(ctx, ids)
        result = await root.reduce(ids, "sum", timeout=GET_TIMEOUT)
        getters = [asyncio.ensure_future(c.get(result, timeout=GET_TIMEOUT))
                   for c in (ctx.clients if everyone_gets else [root])]
    arrays = await asyncio.gather(*getters)
    elapsed = time.perf_counter() - start
    ctx.check(all(_reduced_ok(ctx, a) for a in arrays), "the result differs from numpy's sum")
    del arrays
    for oid in [*ids, result]:
        await root.delete(oid)
    return elapsed


async def run_reduce(ctx: BenchContext, run: int) -> float:
    """Every node puts an input; node 0 reduces (sum) them and gets the result."""
    return await _reduce(ctx, everyone_gets=False)


async def run_allreduce(ctx: BenchContext, run: int) -> float:
    """Every node puts an input; node 0 reduces; every node gets the result."""
    return await _reduce(ctx, everyone_gets=True)


async def run_gather(ctx: BenchContext, run: int) -> float:
    """Every node puts an object; node 0 gets them all."""
    ids = [hoplite_client.ObjectID.random() for _ in ctx.clients]
    start = await _put_all(ctx, ids)
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
    """Warm-up runs, then ``repeat`` measured runs of scenario ``op``, printing each."""
    latencies = []
    for i in range(warmup + repeat):
        measured = i >= warmup
        ctx.label = f"run {i - warmup + 1}/{repeat}" if measured else f"warm-up {i + 1}/{warmup}"
        elapsed = await SCENARIOS[op](ctx, i)
        if measured:
            latencies.append(elapsed)
        ctx.progress.done(f"{ctx.label}: {elapsed * 1e3:.1f} ms")
    return latencies


def common_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed([
        click.option("--nodes", default=4, show_default=True, type=click.IntRange(2, 64)),
        click.option("--size", default=None, help="Object size [default: 64MiB; roundtrip 1KB]."),
        click.option("--repeat", default=5, show_default=True, type=click.IntRange(1)),
        click.option("--warmup", default=1, show_default=True, type=click.IntRange(0)),
        click.option("--json", "json_path", default=None, help="Write results to this file."),
        click.option("--join", default=None, metavar="HOST:PORT",
                     help="Use an existing cluster's members on this host instead."),
        click.option("--token-file", default=None, help="The existing cluster's token."),
        click.option("--capacity", default="4GiB", show_default=True,
                     help="Per daemon of the local cluster."),
        click.option("--emulate", default=None, metavar="RATE",
                     help="Run each daemon in its own network namespace with RATE links "
                          "(e.g. 1Gbit; needs root) and report ratios to the optimum."),
    ]):
        fn = option(fn)
    return fn


@click.group()
def bench() -> None:
    """Measure collectives; by default on a local cluster started for the run."""


DESCRIPTIONS = {
    "broadcast": "of {size} from node 0 to {n1} receivers",
    "reduce": "(sum) of {n} inputs of {size} into node 0",
    "allreduce": "(sum) of {n} inputs of {size}; every node gets the result",
    "gather": "of {n} objects of {size} into node 0",
    "roundtrip": "of {size}: put on node 0, get on node 1",
}


def _make_command(op: str) -> click.Command:
    @common_options
    @click.option("--arrival-interval", default=0.0, show_default=True, type=float,
                  help="Seconds between participants' puts (latency then counts from the "
                       "last one).")
    def command(nodes: int, size: Optional[str], repeat: int, warmup: int,
                json_path: Optional[str], join: Optional[str], token_file: Optional[str],
                capacity: str, emulate: Optional[str], arrival_interval: float) -> None:
        nbytes = parse_size(size or ("1KB" if op == "roundtrip" else "64MiB"))
        if emulate is not None and join is not None:
            raise click.UsageError("--emulate starts its own cluster; it excludes --join")
        rate = parse_rate(emulate) if emulate is not None else None
        where = (f"emulated {format_rate(rate)} links" if rate is not None else
                 "local cluster" if join is None else join)

        async def main() -> BenchResult:
            progress = Progress()
            progress.update(f"starting {nodes} daemons ({where})...")
            async with bench_clients(nodes, join, token_file, capacity, rate) as clients:
                n = len(clients)
                what = DESCRIPTIONS[op].format(size=f"{nbytes / 2**20:.2f} MiB", n=n, n1=n - 1)
                click.echo(f"{op} {what} ({where}, {n} daemons)")
                ctx = BenchContext(clients, nbytes, arrival_interval, progress)
                result = BenchResult(op, n, nbytes, "emulated" if rate else
                                     "local" if join is None else join, rate, arrival_interval)
                result.runs = await run_scenario(op, ctx, warmup, repeat)
                return result

        try:
            result = uvloop.run(main())
        except HopliteError as exc:
            raise click.ClickException(str(exc)) from exc
        ratio = "" if result.optimum is None else (
            f", {result.median / result.optimum:.2f}x the optimum {result.optimum * 1e3:.1f} ms")
        click.echo(f"median {result.median * 1e3:.1f} ms over {len(result.runs)} runs "
                   f"({nbytes / result.median / 1e6:.1f} MB/s{ratio}); every result checked")
        if json_path:
            with open(json_path, "w") as f:
                json.dump(result.as_dict(), f, indent=2)

    command.__doc__ = f"Measure {op}: {SCENARIOS[op].__doc__}"
    return click.command(op)(command)


for _op in SCENARIOS:
    bench.add_command(_make_command(_op))
