"""``hoplite bench``: measure collectives on a local cluster it starts (or an existing one).

The click commands only: options, the one-line description, the summary and the JSON record.
The scenarios themselves (what is timed, how results are checked) are
:mod:`hoplite_client.tools.scenarios`, shared with ``bench/compare.py``.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

import click
import uvloop

from hoplite_client.tools.scenarios import (
    SCENARIOS,
    BenchContext,
    Progress,
    bench_clients,
    optimum,
    run_scenario,
)
from hoplite_client.tools.testbed import format_rate, parse_rate
from hoplite_client.wire.errors import HopliteError
from hoplite_client.wire.units import parse_size

F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class BenchResult:
    """One ``hoplite bench`` run as ``--json`` writes it: the settings and every latency."""

    op: str
    nodes: int
    size: int
    cluster: str
    rate_bps: int | None = None
    arrival_interval: float = 0.0
    runs: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        """Median latency in seconds of the measured runs."""
        return statistics.median(self.runs)

    @property
    def optimum(self) -> float | None:
        """The links' lower bound in seconds (emulated links only; None on loopback)."""
        return None if self.rate_bps is None else optimum(self.op, self.size, self.nodes,
                                                          self.rate_bps)

    def as_dict(self) -> dict[str, Any]:
        """The JSON record: the fields plus median, optimum and their ratio."""
        ratio = None if self.optimum is None else self.median / self.optimum
        return {**asdict(self), "median_s": self.median, "optimum_s": self.optimum,
                "ratio_to_optimum": ratio}


def common_options(fn: F) -> F:
    """The options every ``hoplite bench`` command takes (where, how big, how often)."""
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
    """``hoplite bench OP``: run scenario ``op``, print the median, optionally write JSON."""
    @common_options
    @click.option("--arrival-interval", default=0.0, show_default=True, type=float,
                  help="Seconds between participants' puts (latency then counts from the "
                       "last one).")
    def command(nodes: int, size: str | None, repeat: int, warmup: int,
                json_path: str | None, join: str | None, token_file: str | None,
                capacity: str, emulate: str | None, arrival_interval: float) -> None:
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
        except HopliteError as exc:  # BenchError too: a wrong result, too few daemons
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
