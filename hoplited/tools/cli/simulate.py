"""``hoplite simulate``: a collective on a simulated cluster of up to thousands of nodes.

The decisions are the daemon's own pure cores, the network is modelled
(:mod:`hoplited.sim`, docs/simulation.md). Prints the simulated latency next to S/RATE and
the optimum of ``hoplite bench`` (:func:`~hoplited.tools.scenarios.optimum`).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict
from typing import Any

import click

from hoplite_client.client import GATHER_CONCURRENCY
from hoplite_client.wire.errors import HopliteError
from hoplite_client.wire.units import parse_size
from hoplited.cluster.link_model import DEFAULT_LATENCY
from hoplited.collectives.tree import TWO_TREE_MODES
from hoplited.config import DaemonConfig
from hoplited.sim import scenarios as sim
from hoplited.sim.errors import SimulationError
from hoplited.sim.network import MAX_MIN_NODES, SEGMENT, SHARING
from hoplited.tools.scenarios import optimum
from hoplited.tools.testbed import DEFAULT_RATE_BPS, format_rate, parse_rate

# The depth column for an allreduce run by combiners, by how many (docs/design.md §4).
COMBINERS = {2: "pair", 3: "trio"}


def _node_counts(ctx: click.Context, param: click.Parameter, text: str) -> list[int]:
    """'8' or '8,16,64,256,1000' → the node counts to simulate, each at least 2."""
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        raise click.BadParameter(f"not a node count or a list of them: {text!r}") from None
    if not counts or min(counts) < 2:
        raise click.BadParameter("every node count must be at least 2")
    return counts


def _seconds(t: float) -> str:
    """A duration with three decimals, in ms below a second."""
    return f"{t:.3f} s" if t >= 1 else f"{t * 1e3:.3f} ms"


def _record(result: sim.SimResult, wall: float) -> dict[str, Any]:
    """The JSON record of one run: its fields, S/RATE, the optimum and both ratios."""
    best = optimum(result.op, result.size, result.nodes, result.rate_bps)
    return {**asdict(result), "s_over_rate": result.s_over_rate, "ratio": result.ratio,
            "optimum": best,
            "ratio_to_optimum": None if result.seconds is None else result.seconds / best,
            "wall_seconds": wall}


@click.command()
@click.argument("op", type=click.Choice(sim.OPS))
@click.option("--nodes", default="8", show_default=True, callback=_node_counts,
              help="Node count, or a comma-separated sweep (8,16,64,256,1000).")
@click.option("--size", default="256MiB", show_default=True, help="Object size.")
@click.option("--rate", default=None,
              help=f"Every node's uplink and downlink, e.g. 500Mbit [default: the test bed's "
                   f"{format_rate(DEFAULT_RATE_BPS)}].")
@click.option("--latency", default=DEFAULT_LATENCY, show_default=True,
              type=click.FloatRange(min=0), help="Seconds per hop, data and messages alike.")
@click.option("--segment", default=None,
              help=f"Unit of cut-through forwarding [default: {SEGMENT // 1024} KiB, the test "
                   f"bed's GSO packet].")
@click.option("--fanout", default=DaemonConfig.fanout, show_default=True,
              type=click.IntRange(1), help="Transfers a holder serves at once (hoplited's).")
@click.option("--two-trees", default="auto", show_default=True,
              type=click.Choice(TWO_TREE_MODES),
              help="When the reduce runs, or a broadcast is taken, as two trees of halves, as "
                   "hoplited's --two-trees (docs/simulation.md §6); a depth of 'halves' in the "
                   "table says it did.")
@click.option("--arrival-interval", "interval", default=0.0, show_default=True,
              type=click.FloatRange(min=0, max=60),
              help="reduce, allreduce: put the inputs this many seconds apart, as `hoplite "
                   "bench --arrival-interval` does; the latency then runs from the last put.")
@click.option("--pair/--no-pair", default=DaemonConfig.pair, show_default=True,
              help="allreduce: let the plan hold late inputs for a pair or trio of "
                   "combiners, as hoplited's --pair (docs/design.md §4, 'A pair for the last "
                   "two inputs'); a depth of 'pair' or 'trio' in the table says which ran.")
@click.option("--sharing", default="fair", show_default=True, type=click.Choice(SHARING),
              help="How a link is shared among the pulls on it: the smaller of each pull's "
                   "two fair shares, or max-min fair shares of the pulls sending, as TCP "
                   "flows settle, for tens of nodes (docs/simulation.md §7).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON record per run.")
def simulate(op: str, nodes: list[int], size: str, rate: str | None, latency: float,
             segment: str | None, fanout: int, two_trees: str, interval: float, pair: bool,
             sharing: str, as_json: bool) -> None:
    """Simulate OP (broadcast, reduce, allreduce, gather as ``hoplite bench`` runs them) on
    NODES nodes: the real directory, fetch, reduce and allreduce plans over modelled links.
    The depth column gives the reduce tree's depth (0: a chain), or 'halves', 'ring',
    'pair' or 'trio'."""
    try:
        nbytes = parse_size(size)
        bps = DEFAULT_RATE_BPS if rate is None else parse_rate(rate)
        seg = SEGMENT if segment is None else parse_size(segment)
    except HopliteError as exc:
        raise click.UsageError(str(exc)) from exc
    if two_trees == "always" and op not in ("reduce", "broadcast"):
        raise click.UsageError("--two-trees always is a shape of the reduce and the broadcast")
    if not math.isfinite(interval):
        raise click.UsageError("--arrival-interval must be a number of seconds")
    if interval and op not in ("reduce", "allreduce"):
        raise click.UsageError("--arrival-interval staggers a reduce's or an allreduce's inputs")
    if sharing == "maxmin" and max(nodes) > MAX_MIN_NODES:
        raise click.UsageError(f"--sharing maxmin recomputes every share at every change: at "
                               f"most {MAX_MIN_NODES} nodes")
    if not as_json:
        click.echo(f"{op} of {nbytes} bytes ({nbytes / 2**20:.3g} MiB), simulated "
                   f"{format_rate(bps)} links, "
                   f"{latency * 1e3:.3g} ms per hop, {seg // 1024} KiB segments, "
                   f"fan-out {fanout}, two trees of halves: {two_trees}, {sharing} sharing"
                   + (f", inputs {interval:g} s apart (latency from the last put)"
                      if interval else ""))
        click.echo(f"{'N':>6}{'simulated':>13}{'S/RATE':>13}{'x S/RATE':>10}"
                   f"{'x optimum':>11}{'depth':>7}{'events':>10}{'wall':>8}")
    for n in nodes:
        t0 = time.perf_counter()
        try:
            result = sim.simulate(op, n, nbytes, bps, latency=latency, segment=seg,
                                  fanout=fanout, concurrency=GATHER_CONCURRENCY,
                                  two_trees=two_trees, interval=interval, pair=pair,
                                  sharing=sharing)
        except SimulationError as exc:
            raise click.ClickException(str(exc)) from exc
        record = _record(result, time.perf_counter() - t0)
        if as_json:
            click.echo(json.dumps(record))
        elif result.seconds is None:
            click.echo(f"{n:>6}  failed: {result.error}")
        else:
            depth = "halves" if result.two_trees else "ring" if result.ring else (
                COMBINERS.get(result.combiners, "") if result.combiners
                else "" if result.depth is None else str(result.depth))
            click.echo(f"{n:>6}{_seconds(result.seconds):>13}{_seconds(result.s_over_rate):>13}"
                       f"{record['ratio']:>10.3f}{record['ratio_to_optimum']:>11.3f}"
                       f"{depth:>7}{result.events:>10}{record['wall_seconds']:>6.1f} s")
