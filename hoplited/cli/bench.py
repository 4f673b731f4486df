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
from typing import Any, AsyncIterator, Callable, Optional

import click
import numpy as np
import uvloop

import hoplite_client
from hoplite_client.connection import Channel
from hoplite_client.errors import HopliteError
from hoplite_client.wire.messages import REPLY_KINDS, Stats

from ..cluster import LocalCluster
from ..config import parse_address, parse_size
from ..daemon import host_id
from ..handshake import Identity, dial

GET_TIMEOUT = 600.0  # per get; a 256 MiB broadcast on a loaded machine takes seconds


@dataclass
class BenchResult:
    op: str
    nodes: int
    size: int
    cluster: str
    runs: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.runs)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "median_s": self.median,
                "receiver_throughput_Bps": self.size / self.median}


async def members_on_this_host(seed: str, token: bytes) -> list[str]:
    """Unix sockets of an existing cluster's members that run on this machine."""
    host, port = parse_address(seed)
    protocol, _ = await dial(host, port, "tool", Identity("bench-tool", token))
    try:
        frame = await Channel(protocol, REPLY_KINDS).request(lambda rid: Stats(rid=rid),
                                                             timeout=10)
    finally:
        protocol.close()
    here = host_id()
    return [m["socket"] for m in frame.msg.info["members"]
            if m["alive"] and m["host_id"] == here]


@contextlib.asynccontextmanager
async def bench_clients(nodes: int, join: Optional[str], token_file: Optional[str],
                        capacity: str) -> AsyncIterator[list[hoplite_client.Client]]:
    """Clients of ``nodes`` daemons: a fresh local cluster, or members of ``join``'s cluster."""
    async with contextlib.AsyncExitStack() as stack:
        if join is None:
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


async def run_broadcast(clients: list[hoplite_client.Client], data: np.ndarray, runs: int,
                        progress: Progress, label: Callable[[int], str]) -> list[float]:
    """Put on node 0, get everywhere else at once; returns each run's latency."""
    latencies = []
    receivers = clients[1:]
    for i in range(runs):
        oid = await clients[0].put(data)
        done = 0
        t0 = time.perf_counter()

        async def one(client: hoplite_client.Client) -> np.ndarray:
            nonlocal done
            arr = await client.get(oid, timeout=GET_TIMEOUT)
            done += 1
            progress.update(f"{label(i)}: {done}/{len(receivers)} receivers done, "
                            f"{time.perf_counter() - t0:.2f} s")
            return arr

        results = await asyncio.gather(*(one(c) for c in receivers))
        elapsed = time.perf_counter() - t0
        bad = [k + 1 for k, r in enumerate(results) if not same_bytes(r, data)]
        del results
        await clients[0].delete(oid)
        if bad:
            raise click.ClickException(f"{label(i)}: nodes {bad} received wrong bytes")
        latencies.append(elapsed)
        progress.done(f"{label(i)}: {elapsed:.3f} s  ({data.nbytes / elapsed / 1e6:.1f} MB/s "
                      f"per receiver)")
    return latencies


def common_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed([
        click.option("--nodes", default=4, show_default=True, type=click.IntRange(2, 64)),
        click.option("--size", default="64MiB", show_default=True, help="Object size."),
        click.option("--repeat", default=5, show_default=True, type=click.IntRange(1)),
        click.option("--warmup", default=1, show_default=True, type=click.IntRange(0)),
        click.option("--json", "json_path", default=None, help="Write results to this file."),
        click.option("--join", default=None, metavar="HOST:PORT",
                     help="Use an existing cluster's members on this host instead."),
        click.option("--token-file", default=None, help="The existing cluster's token."),
        click.option("--capacity", default="4GiB", show_default=True,
                     help="Per daemon of the local cluster."),
    ]):
        fn = option(fn)
    return fn


@click.group()
def bench() -> None:
    """Measure collectives; by default on a local cluster started for the run."""


@bench.command()
@common_options
def broadcast(nodes: int, size: str, repeat: int, warmup: int, json_path: Optional[str],
              join: Optional[str], token_file: Optional[str], capacity: str) -> None:
    """One object put on node 0, fetched by every other node at the same time."""
    nbytes = parse_size(size)

    async def main() -> BenchResult:
        progress = Progress()
        progress.update(f"starting {nodes} daemons...")
        async with bench_clients(nodes, join, token_file, capacity) as clients:
            data = make_data(nbytes)
            n = len(clients)
            click.echo(f"broadcast of {nbytes / 2**20:.1f} MiB from node 0 to {n - 1} receivers "
                       f"({'local cluster' if join is None else join}, {n} daemons)")
            result = BenchResult("broadcast", n, nbytes, "local" if join is None else join)
            await run_broadcast(clients, data, warmup, progress,
                                lambda i: f"warm-up {i + 1}/{warmup}")
            result.runs = await run_broadcast(clients, data, repeat, progress,
                                              lambda i: f"run {i + 1}/{repeat}")
            return result

    try:
        result = uvloop.run(main())
    except HopliteError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"median {result.median:.3f} s over {len(result.runs)} runs: "
               f"{nbytes / result.median / 1e6:.1f} MB/s per receiver, "
               f"{nbytes * (result.nodes - 1) / result.median / 1e9:.2f} GB/s delivered in all; "
               f"every copy bit-exact")
    if json_path:
        with open(json_path, "w") as f:
            json.dump(result.as_dict(), f, indent=2)
