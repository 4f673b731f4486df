"""``hoplite bench``: measure collectives on a local cluster it starts (or an existing one).

The click commands only: options, the one-line description, the summary and the JSON record.
The scenarios themselves (what is timed, how results are checked) are
:mod:`hoplited.tools.scenarios`, shared with ``bench/compare.py``.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

import click
import uvloop

from hoplite_client.wire.errors import HopliteError
from hoplite_client.wire.units import parse_size
from hoplited.collectives.tree import TWO_TREE_MODES
from hoplited.tools.cli.options import tls_from, tls_options
from hoplited.tools.failures import (
    REPUTS,
    SIGNALS,
    FailureRun,
    check_victim,
    folds_by_node,
    run_with_failure,
)
from hoplited.tools.local_cluster import LocalCluster
from hoplited.tools.scenarios import (
    SCENARIOS,
    BenchContext,
    BenchError,
    Progress,
    bench_clients,
    optimum,
    run_scenario,
)
from hoplited.tools.testbed import format_rate, parse_rate

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
    failure: FailureRun | None = None

    @property
    def median(self) -> float:
        """Median latency in seconds of the measured runs."""
        return statistics.median(self.runs)

    @property
    def quartiles(self) -> tuple[float, float]:
        """The 25th and 75th percentiles of the measured runs, in seconds: how far a median
        of few runs on a loaded machine may be trusted."""
        if len(self.runs) < 2:
            return self.median, self.median
        q1, _, q3 = statistics.quantiles(self.runs, n=4, method="inclusive")
        return q1, q3

    @property
    def optimum(self) -> float | None:
        """The links' lower bound in seconds (emulated links only; None on loopback)."""
        return None if self.rate_bps is None else optimum(self.op, self.size, self.nodes,
                                                          self.rate_bps)

    @property
    def s_over_rate(self) -> float | None:
        """One object's time on one link, S/RATE: what the targets of docs/design.md §8 are
        ratios to (for an allreduce with staggered inputs, the least time after the last
        arrival)."""
        return None if self.rate_bps is None else self.size * 8 / self.rate_bps

    def as_dict(self) -> dict[str, Any]:
        """The JSON record: the fields plus median, quartiles, optimum, S/RATE and the
        ratios."""
        ratio = None if self.optimum is None else self.median / self.optimum
        per_link = None if self.s_over_rate is None else self.median / self.s_over_rate
        return {**asdict(self), "median_s": self.median, "quartiles_s": list(self.quartiles),
                "optimum_s": self.optimum, "ratio_to_optimum": ratio,
                "ratio_to_s_over_rate": per_link}


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
        click.option("--token-file", default=None,
                     help="The existing cluster's token [default: the default token file of "
                          "hoplited, $HOPLITE_TOKEN_FILE or token in $XDG_RUNTIME_DIR/hoplite "
                          "or /tmp/hoplite-UID]."),
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


def _print_failure(run: FailureRun) -> None:
    """The failure run next to the failure-free median, and every survivor's outcome."""
    free = statistics.median(run.failure_free)
    then = ("a backup input put" if run.backup else "its input put again "
            + ("once an application could know" if run.reput == "noticed" else
               "at the signal"))
    click.echo(f"failure run: SIG{run.signal} to node {run.victim} at {run.kill_after:.2f} s"
               f"{'' if run.op == 'broadcast' else f', {then}'}")
    if run.op == "broadcast" and run.victim == 0:
        click.echo("  node 0 is the original holder; node 1 got a whole copy before the clock, "
                   "in the failure-free runs of this case too")
    if run.victim_owns:
        click.echo(f"  node {run.victim}'s directory shard owns "
                   f"{'the object' if run.op == 'broadcast' else 'its input'}")
    for o in run.outcomes:
        at = "" if o.seconds is None else f" at {o.seconds * 1e3:.1f} ms"
        what = f"ok{at}" if o.error is None else f"FAILED{at}: {o.error}"
        click.echo(f"  node {o.node}: {what}")
    for node, folds in sorted(run.folds.items()):
        click.echo(f"  repair: node {node} added {folds} lost input(s) into its own slot")
    if run.last is None:
        last = run.last_error
        click.echo(f"failure-free {free * 1e3:.1f} ms; with the failure: not every survivor "
                   f"got its result (the last error "
                   f"{'?' if last is None else f'{last * 1e3:.1f} ms'} after the start)")
    else:
        click.echo(f"failure-free {free * 1e3:.1f} ms; with the failure {run.last * 1e3:.1f} ms "
                   f"(last survivor): {run.ratio:.2f}x")


async def _shaped_run(ctx: BenchContext, cluster: LocalCluster, i: int, repeat: int) -> float:
    """One failure-free broadcast shaped like the original holder's failure run (node 1 holds
    a copy first): the last receiver's time."""
    ctx.progress.update(f"failure-free runs of that shape: {i + 1}/{repeat}")
    outcomes = await run_with_failure("broadcast", ctx, cluster, 0, 0.0, None)
    if not all(o.error is None and o.seconds is not None for o in outcomes):
        raise BenchError(f"a failure-free run failed: {outcomes}")
    return max(o.seconds for o in outcomes if o.seconds is not None)


def _make_command(op: str) -> click.Command:
    """``hoplite bench OP``: run scenario ``op``, print the median, optionally write JSON."""
    @common_options
    @tls_options
    @click.option("--arrival-interval", default=0.0, show_default=True, type=float,
                  help="Seconds between participants' puts (latency then counts from the "
                       "last one).")
    @click.option("--kill-node", default=None, type=int, metavar="I",
                  help="After the failure-free runs, run once more and signal node I's daemon "
                       "(1..N-1; broadcast: also 0, its original holder, once node 1 has a "
                       "copy) mid-run; print both times, the ratio and every survivor.")
    @click.option("--kill-after", default=1.0, show_default=True, type=click.FloatRange(0),
                  help="Seconds into the failure run at which the signal is sent.")
    @click.option("--signal", "sig", default="KILL", show_default=True,
                  type=click.Choice(sorted(SIGNALS)), help="KILL: the node dies; STOP: it "
                  "falls silent with its sockets open.")
    @click.option("--backup", is_flag=True,
                  help="reduce, allreduce: the failure run's reduce has one backup input "
                       "beyond the first N, of another value, put right after the signal "
                       "(instead of the victim's input put again); an allreduce's "
                       "failure-free runs then time a reduce every node gets too.")
    @click.option("--striped", is_flag=True,
                  help="allreduce: in stripes, one per input, where no ring runs "
                       "(docs/design.md §4).")
    @click.option("--two-trees", default=None, type=click.Choice(TWO_TREE_MODES),
                  help="The started daemons' --two-trees: when a reduce of every input, or "
                       "a broadcast, runs as two trees of halves (docs/design.md §3, §4) "
                       "[default: theirs, auto].")
    @click.option("--ring-wait", default=None, type=click.FloatRange(0, 60),
                  help="The started daemons' --ring-wait: how long an allreduce waits for "
                       "every input to run them as a ring; 0: never (docs/design.md §4) "
                       "[default: theirs, 0.1].")
    @click.option("--pair/--no-pair", default=None,
                  help="The started daemons' --pair: whether an allreduce whose inputs come "
                       "further apart than the ring's wait may end as a pair of combiners "
                       "(docs/design.md §4) [default: theirs, on].")
    @click.option("--reput", default="noticed", show_default=True, type=click.Choice(REPUTS),
                  help="When a killed victim's input is put again on the next survivor: once "
                       "an application could know of the death (its node's client sees the "
                       "connection close), or at the signal itself. A stopped victim's is "
                       "tried from the signal on, refused while the cluster trusts it.")
    @click.option("--victim-owns", is_flag=True,
                  help="Pick the ids so that node I's directory shard owns the broadcast "
                       "object, or node I's input: the hardest placement.")
    def command(nodes: int, size: str | None, repeat: int, warmup: int,
                json_path: str | None, join: str | None, token_file: str | None,
                capacity: str, emulate: str | None, tls_cert: str | None, tls_key: str | None,
                tls_ca: str | None, arrival_interval: float, kill_node: int | None,
                kill_after: float, sig: str, backup: bool, striped: bool,
                two_trees: str | None, ring_wait: float | None, pair: bool | None,
                victim_owns: bool, reput: str) -> None:
        tls = tls_from(tls_cert, tls_key, tls_ca)
        nbytes = parse_size(size or ("1KB" if op == "roundtrip" else "64MiB"))
        if emulate is not None and join is not None:
            raise click.UsageError("--emulate starts its own cluster; it excludes --join")
        rate = parse_rate(emulate) if emulate is not None else None
        if (two_trees is not None or ring_wait is not None or pair is not None) and (
                join is not None):
            raise click.UsageError("--two-trees, --ring-wait and --pair set the daemons a run "
                                   "starts; not with --join")
        if (backup or victim_owns) and kill_node is None:
            raise click.UsageError("--backup and --victim-owns go with --kill-node")
        if kill_node is not None:
            if join is not None:
                raise click.UsageError("--kill-node signals daemons it started; not with --join")
            if arrival_interval > 0:
                raise click.UsageError("--kill-node times its runs from the first put, "
                                       "--arrival-interval from the last: run inputs that "
                                       "arrive one by one under failures with "
                                       "`python -m bench.chaos --stagger`")
            try:
                check_victim(op, kill_node, nodes, backup)
            except HopliteError as exc:
                raise click.UsageError(str(exc)) from exc
        where = (f"emulated {format_rate(rate)} links" if rate is not None else
                 "local cluster" if join is None else join)

        async def main() -> BenchResult:
            progress = Progress()
            progress.update(f"starting {nodes} daemons ({where})...")
            daemon_args = (() if two_trees is None else ("--two-trees", two_trees)) + (
                () if ring_wait is None else ("--ring-wait", str(ring_wait))) + (
                () if pair is None else ("--pair" if pair else "--no-pair",))
            async with bench_clients(nodes, join, token_file, capacity, rate, tls,
                                     daemon_args) as (clients, cluster):
                n = len(clients)
                what = DESCRIPTIONS[op].format(size=f"{nbytes / 2**20:.2f} MiB", n=n, n1=n - 1)
                click.echo(f"{op} {what} ({where}, {n} daemons)")
                ctx = BenchContext(clients, nbytes, arrival_interval, progress,
                                   striped=striped, as_reduce=backup)
                result = BenchResult(op, n, nbytes, "emulated" if rate else
                                     "local" if join is None else join, rate, arrival_interval)
                result.runs = await run_scenario(op, ctx, warmup, repeat)
                if kill_node is not None and cluster is not None:
                    free = result.runs
                    if kill_node == 0:  # another shape: node 1 holds a copy before the clock
                        free = [await _shaped_run(ctx, cluster, i, repeat) for i in range(repeat)]
                    progress.update(f"failure run: {sig} node {kill_node} at {kill_after}s...")
                    result.failure = FailureRun(op, kill_node, sig, kill_after, free,
                                                backup=backup, victim_owns=victim_owns,
                                                reput=reput)
                    result.failure.outcomes = await run_with_failure(
                        op, ctx, cluster, kill_node, kill_after, sig, backup, victim_owns,
                        reput=reput)
                    result.failure.folds = await folds_by_node(
                        clients[1 if kill_node == 0 else 0], cluster)  # a survivor
                return result

        try:
            result = uvloop.run(main())
        except HopliteError as exc:  # BenchError too: a wrong result, too few daemons
            raise click.ClickException(str(exc)) from exc
        ratio = "" if result.optimum is None else (
            f", {result.median / result.optimum:.2f}x the optimum {result.optimum * 1e3:.1f} ms")
        if result.s_over_rate is not None and result.s_over_rate != result.optimum:
            ratio += f", {result.median / result.s_over_rate:.2f}x S/RATE"
        click.echo(f"median {result.median * 1e3:.1f} ms over {len(result.runs)} runs "
                   f"({nbytes / result.median / 1e6:.1f} MB/s{ratio}); every result checked")
        if len(result.runs) > 1:
            q1, q3 = result.quartiles
            link = result.s_over_rate  # None exactly when the optimum is (no emulated links)
            spread = "" if link is None else f" ({q1 / link:.2f}-{q3 / link:.2f}x S/RATE)"
            click.echo(f"middle half of the runs {q1 * 1e3:.1f}-{q3 * 1e3:.1f} ms{spread}; "
                       f"fastest {min(result.runs) * 1e3:.1f} ms, slowest "
                       f"{max(result.runs) * 1e3:.1f} ms")
        if result.failure is not None:
            _print_failure(result.failure)
        if json_path:
            with open(json_path, "w") as f:
                json.dump(result.as_dict(), f, indent=2)

    command.__doc__ = f"Measure {op}: {SCENARIOS[op].__doc__}"
    return click.command(op)(command)


for _op in SCENARIOS:
    bench.add_command(_make_command(_op))
