"""Hoplite and the baselines under the same failure, in the same emulated cluster, in one run.

For each op and signal: one test bed (network namespaces, RATE links) and each system in it
in turn (``--systems``): a baseline's failure-free runs, then a run whose rank VICTIM is
signalled AFTER seconds in (bench/baselines/failure.py); hoplite's daemons, their
failure-free runs and the failure run of ``hoplite bench OP --kill-node``
(hoplited/tools/failures.py, where the victim's input is put again on the next node, as
a restarted task would). Every
survivor's outcome is recorded: its checked result and when, the error it got, the end its
launcher gave it, or nothing within PATIENCE seconds of the signal. Writes JSON and the
failures section of docs/benchmarks.md. Usage (from the repository root, as root):
    python -m bench.failures --nodes 8 --size 256MiB --rate 1Gbit --victim 3 --after 1
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import re
import statistics
import sys
import traceback
from dataclasses import asdict, dataclass, field

import uvloop

import hoplite_client
from bench.baselines.failure import SIGNALS, Failure, RankOutcome
from bench.compare import NAMES, replace_section, run_baseline
from hoplite_client.wire.units import parse_size
from hoplited.tools.failures import Outcome, run_with_failure
from hoplited.tools.scenarios import BenchContext, Progress, run_scenario
from hoplited.tools.testbed import EmulatedCluster, Testbed, format_rate, parse_rate

OPS = ["broadcast", "reduce", "allreduce"]
SYSTEMS = ["hoplite", "gloo", "mpi"]
SECTION_START = "<!-- failures:start -->"
SECTION_END = "<!-- failures:end -->"


@dataclass
class FailureRow:
    """One system, one op, one signal: failure-free runs and the survivors' outcomes."""

    system: str
    op: str
    signal: str
    after: float  # when the signal was sent, seconds into the run
    failure_free: list[float] = field(default_factory=list)
    outcomes: list[RankOutcome] = field(default_factory=list)
    note: str = ""  # why the system could not be measured

    def summary(self) -> str:
        """What the survivors got, in a phrase: all correct and when, or each kind of end."""
        if self.note:
            return f"not measured ({self.note})"
        if not self.outcomes:
            return "no survivor outcome"
        if all(o.what in ("correct", "returned") for o in self.outcomes):
            last = max(o.seconds or 0.0 for o in self.outcomes)
            early = " (done before the signal: no failure seen)" if last < self.after else ""
            kinds = " or ".join(sorted({o.what for o in self.outcomes}))
            if len(self.outcomes) == 1:
                return f"{kinds} at {last:.2f} s{early}"
            return f"all {len(self.outcomes)} {kinds}, the last at {last:.2f} s{early}"
        parts = []
        for what in ("correct", "returned", "wrong", "error", "exited", "hung"):
            got = [o for o in self.outcomes if o.what == what]
            if not got:
                continue
            times = [o.seconds for o in got if o.seconds is not None]
            when = "" if not times else (f" at {min(times):.2f} s" if len(times) == 1 else
                                         f" at {min(times):.2f}–{max(times):.2f} s")
            detail = next((o.detail for o in got if o.detail), "")
            detail = re.sub(r"\[/[^\]]*\] ", "", detail)[:100]  # gloo's source path
            parts.append(f"{len(got)} {what}{when}" + (f" ({detail})" if detail else ""))
        return "; ".join(parts)

    @property
    def ratio(self) -> float | None:
        """The last survivor's time over the failure-free median, if every survivor was right."""
        if (self.note or not self.failure_free or not self.outcomes
                or any(o.what not in ("correct", "returned") for o in self.outcomes)):
            return None
        return max(o.seconds or 0.0 for o in self.outcomes) / statistics.median(self.failure_free)


def from_hoplite(outcomes: list[Outcome]) -> list[RankOutcome]:
    """Hoplite's survivor outcomes in the baselines' terms."""
    return [RankOutcome(o.node, "correct" if o.error is None else
                        "wrong" if o.error == "wrong result" else "error", o.seconds,
                        o.error or "") for o in outcomes]


async def measure_hoplite(testbed: Testbed, op: str, size: int, repeat: int, failure: Failure,
                          capacity: str) -> FailureRow:
    """Hoplite's daemons in ``testbed``: failure-free runs, then the failure run."""
    row = FailureRow("hoplite", op, failure.signal, failure.after)
    async with EmulatedCluster(testbed, capacity=capacity, log_level="warning") as cluster:
        clients = [await hoplite_client.connect(s) for s in cluster.sockets]
        try:
            ctx = BenchContext(clients, size, 0.0, Progress())
            row.failure_free = await run_scenario(op, ctx, 1, repeat)
            row.outcomes = from_hoplite(await run_with_failure(
                op, ctx, cluster, failure.victim, failure.after, failure.signal))
        finally:
            for client in clients:
                await client.close()
    return row


async def measure_baseline(name: str, testbed: Testbed, op: str, size: int, repeat: int,
                           failure: Failure, failure_free: list[float] | None) -> FailureRow:
    """Baseline ``name`` in ``testbed``: failure-free runs (unless given), then the failure
    run. A system that cannot run says why in the row's note."""
    module = importlib.import_module(f"bench.baselines.{name}")
    row = FailureRow(NAMES[name], op, failure.signal, failure.after)
    try:
        row.failure_free = (failure_free if failure_free is not None else
                            await run_baseline(name, testbed, op, size, repeat))
        row.outcomes = await module.run_failure(testbed, op, size, failure)
    except Exception as exc:  # a baseline's failure to run is a result, not a crash
        row.note = f"{type(exc).__name__}: {exc}".splitlines()[0][:160]
        traceback.print_exc()
    return row


async def measure(nodes: int, rate: int, size: int, repeat: int, ops: list[str],
                  signals: list[str], systems: list[str], victim: int, after: float,
                  patience: float) -> list[FailureRow]:
    """Every (op, signal) in its own test bed, each system in turn."""
    rows: list[FailureRow] = []
    capacity = str(max(2 << 30, 8 * size))  # as make bench-failures: a repair needs room
    for op in ops:
        free: dict[str, list[float]] = {}  # a baseline's failure-free runs, once per op
        for sig in signals:
            failure = Failure(victim, after, sig, patience)
            async with Testbed(nodes, rate) as testbed:
                for name in systems:
                    print(f"{name} {op}, SIG{sig} to rank {victim} at {after} s", flush=True)
                    if name == "hoplite":
                        row = await measure_hoplite(testbed, op, size, repeat, failure,
                                                    capacity)
                    else:
                        row = await measure_baseline(name, testbed, op, size, repeat,
                                                     failure, free.get(name))
                        if row.failure_free:
                            free[name] = row.failure_free
                    print(f"  {row.summary()}", flush=True)
                    rows.append(row)
    return rows


def table(rows: list[FailureRow]) -> str:
    """The results as a Markdown table (hoplite's ratios in bold)."""
    lines = ["| op | signal | system | failure-free (s) | with the failure: every survivor "
             "| × failure-free |", "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        free = "—" if not r.failure_free else f"{statistics.median(r.failure_free):.3f}"
        ratio = "—" if r.ratio is None else f"{r.ratio:.2f}"
        if r.system == "hoplite" and r.ratio is not None:
            ratio = f"**{ratio}**"
        lines.append(f"| {r.op} | {r.signal} | {r.system} | {free} | {r.summary()} | {ratio} |")
    return "\n".join(lines)


def write_docs(rows: list[FailureRow], path: str, command: str, args: argparse.Namespace
               ) -> None:
    """Replace (or append) the failures section of the benchmarks page."""
    replace_section(path, SECTION_START, SECTION_END, [
        f"## Failures, hoplite and the baselines in one run ({datetime.date.today()})", "",
        f"{args.nodes} hosts, every link {format_rate(parse_rate(args.rate))} both ways (tbf), "
        f"{args.size} of float32. Per op and signal, one test bed: each system runs the op "
        f"failure-free ({args.repeat} run{'s' if args.repeat > 1 else ''} after a warm-up, "
        f"median shown), then once more "
        f"while rank {args.victim}'s process (hoplite: its daemon) gets the signal "
        f"{args.after} s after the start. A survivor's time is its own, from its barrier exit "
        f"(hoplite: from the start of the run) to its checked result or its error; *exited* "
        f"means its launcher ended it with no outcome (the driver's clock), *hung* that it "
        f"had nothing {args.patience:.0f} s after the signal. Hoplite's failure run puts the "
        f"victim's input again on the next node, as a restarted task would "
        f"(`hoplite bench OP --kill-node`, docs/design.md §5); gloo and MPI have no such "
        f"notion: their collective's membership is fixed.", "",
        f"Command: `{command}`", "", table(rows), ""])


def main() -> None:
    """Measure (or reload a run's JSON), then write the JSON and the docs section."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--rate", default="1Gbit")
    parser.add_argument("--size", default="256MiB")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--op", nargs="+", default=OPS, choices=OPS)
    parser.add_argument("--signal", nargs="+", default=sorted(SIGNALS), choices=sorted(SIGNALS))
    parser.add_argument("--systems", nargs="+", default=SYSTEMS,
                        choices=["hoplite", "gloo", "mpi"])
    parser.add_argument("--victim", type=int, default=3)
    parser.add_argument("--after", type=float, default=1.0)
    parser.add_argument("--patience", type=float, default=60.0,
                        help="seconds after the signal before a silent survivor counts as hung")
    parser.add_argument("--json", default="bench-results/failures.json")
    parser.add_argument("--docs", default="docs/benchmarks.md")
    parser.add_argument("--from-json", metavar="FILE",
                        help="Measure nothing: redo the table from a run's JSON.")
    args = parser.parse_args()
    if args.from_json:
        with open(args.from_json) as f:
            saved = json.load(f)
        rows = [FailureRow(**{**r, "outcomes": [RankOutcome(**o) for o in r["outcomes"]]})
                for r in saved["rows"]]
        command = saved["command"]
        args = argparse.Namespace(**{**vars(args), **saved["args"]})
    else:
        if not 0 < args.victim < args.nodes:
            parser.error(f"--victim must be between 1 and {args.nodes - 1}")
        command = " ".join(["python -m bench.failures", *sys.argv[1:]])
        rows = uvloop.run(measure(args.nodes, parse_rate(args.rate), parse_size(args.size),
                                  args.repeat, args.op, args.signal, args.systems,
                                  args.victim, args.after, args.patience))
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        kept = {k: getattr(args, k) for k in ("nodes", "rate", "size", "repeat", "victim",
                                               "after", "patience")}
        with open(args.json, "w") as f:
            json.dump({"command": command, "args": kept,
                       "rows": [asdict(r) for r in rows]}, f, indent=2)
    write_docs(rows, args.docs, command, args)
    print(table(rows))


if __name__ == "__main__":
    main()
