"""Hoplite against every baseline, in the same emulated cluster, in one run.

For each node count: one test bed (network namespaces, RATE links), hoplite's daemons in it,
then each baseline in the same namespaces; every op at every size; medians and ratios to the
optimum (docs/design.md §7). Writes JSON, the results section of docs/benchmarks.md and a plot.
Usage (from the repository root, as root):
    python -m bench.compare --nodes 4 8 --rate 1Gbit --repeat 5 [--warmup 1] \
        [--plot docs/compare.png]
Every system gets the same number of warm-up runs per case (``--warmup``). A case
``OP:SIZE@D`` puts its inputs D seconds apart, node (rank) i's at i·D, and times it from the
last one, for hoplite (``hoplite bench --arrival-interval``) and the baselines that stagger
their ranks (gloo and OpenMPI: ``STAGGERED`` in bench/baselines/common.py).
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import platform
import statistics
import sys
import traceback
from dataclasses import asdict, dataclass
from typing import Any

import uvloop

import hoplite_client
from bench.baselines.common import MAX_INTERVAL
from hoplite_client.wire.units import parse_size
from hoplited.tools.scenarios import BenchContext, Progress, optimum, run_scenario
from hoplited.tools.testbed import emulated_cluster, format_rate, parse_rate

# (op, size) pairs measured by default: the cases of the targets in docs/design.md §8, and a
# gather; a size may say how far apart the inputs come (``@D``).
CASES = [("broadcast", "32MiB"), ("broadcast", "256MiB"), ("reduce", "32MiB"),
         ("allreduce", "32MiB"), ("allreduce", "32MiB@0.1"), ("gather", "32MiB"),
         ("broadcast", "1MiB"), ("reduce", "1MiB"), ("allreduce", "1MiB")]
BASELINES = ["star", "gloo", "mpi", "ray_baseline", "dask_baseline"]
NAMES = {"star": "naive star", "gloo": "gloo (torch)", "mpi": "OpenMPI (mpi4py)",
         "ray_baseline": "Ray", "dask_baseline": "Dask"}
SECTION_START = "<!-- compare:start -->"
SECTION_END = "<!-- compare:end -->"


@dataclass
class Row:
    """One system's runs of one (op, size) at one node count: a line of the table."""

    system: str
    op: str
    size: int
    nodes: int
    runs: list[float]
    optimum: float
    rate: int
    note: str = ""
    interval: float = 0.0  # inputs put this far apart, timed from the last one

    @property
    def case(self) -> str:
        """The op, and how far apart its inputs came if they did."""
        return f"{self.op}, inputs {self.interval:g} s apart" if self.interval else self.op

    @property
    def median(self) -> float | None:
        """Median latency in seconds (None if the system did not run: see ``note``)."""
        return statistics.median(self.runs) if self.runs else None


async def run_baseline(name: str, testbed: Any, op: str, size: int, repeat: int,
                       warmup: int = 1, interval: float = 0.0) -> list[float]:
    """Latencies of baseline ``name`` (a module of bench.baselines) for ``op``, after ``warmup``
    runs, its ranks ``interval`` apart; LookupError if it does not implement that."""
    if name == "star":
        if op != "broadcast" or interval:
            raise LookupError("broadcast only, every input at once")
        module = importlib.import_module("bench.baselines.star")
        latencies: list[float] = await module.run_star(testbed, size, repeat, warmup)
    else:
        module = importlib.import_module(f"bench.baselines.{name}")
        if not interval:
            latencies = await module.run(testbed, op, size, repeat, warmup)
        elif getattr(module, "STAGGERED", False):
            latencies = await module.run(testbed, op, size, repeat, warmup, interval=interval)
        else:
            raise LookupError("no staggered inputs")
    return latencies


async def measure(nodes: int, rate: int, repeat: int, cases: list[tuple[str, int, float]],
                  baselines: list[str], warmup: int = 1) -> list[Row]:
    """Every case on hoplite, then on each baseline, in one emulated cluster of ``nodes``;
    each system runs ``warmup`` unmeasured times per case first."""
    rows: list[Row] = []
    capacity = str(max(s for _, s, _ in cases) * 4 + (256 << 20))
    async with emulated_cluster(nodes, rate, capacity=capacity, check=True,
                                log_level="warning") as cluster:
        clients = [await hoplite_client.connect(s) for s in cluster.sockets]
        for op, size, interval in cases:
            ctx = BenchContext(clients, size, interval, Progress())
            print(f"hoplite {op} {size >> 20} MiB on {nodes} nodes", flush=True)
            runs = await run_scenario(op, ctx, warmup, repeat)
            rows.append(Row("hoplite", op, size, nodes, runs, optimum(op, size, nodes, rate),
                            rate, interval=interval))
        for client in clients:
            await client.close()
        for name in baselines:
            for op, size, interval in cases:
                print(f"{NAMES[name]} {op} {size >> 20} MiB on {nodes} nodes", flush=True)
                row = Row(NAMES[name], op, size, nodes, [], optimum(op, size, nodes, rate), rate,
                          interval=interval)
                try:
                    row.runs = await run_baseline(name, cluster.testbed, op, size, repeat,
                                                  warmup, interval)
                except LookupError:
                    continue
                except Exception as exc:  # a baseline's failure is a result, not a crash
                    row.note = f"{type(exc).__name__}: {exc}".splitlines()[0][:160]
                    traceback.print_exc()
                rows.append(row)
    return rows


def parse_case(text: str) -> tuple[str, int, float]:
    """``OP:SIZE`` or ``OP:SIZE@D`` as (op, bytes, seconds between inputs)."""
    op, _, rest = text.partition(":")
    size, _, apart = rest.partition("@")
    interval = float(apart) if apart else 0.0
    if not 0 <= interval <= MAX_INTERVAL or interval and op not in ("reduce", "allreduce"):
        raise ValueError(f"case {text!r}: the inputs of a reduce or an allreduce may come "
                         f"0..{MAX_INTERVAL} s apart")
    return op, parse_size(size), interval


def table(rows: list[Row]) -> str:
    """The results as a Markdown table (hoplite's ratios in bold)."""
    lines = ["| op | size | N | system | median (s) | × optimum | × S/RATE |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        med = "—" if r.median is None else f"{r.median:.3f}"
        ratio = "—" if r.median is None else f"{r.median / r.optimum:.2f}"
        per_s = "—" if r.median is None else f"{r.median / (r.size * 8 / r.rate):.2f}"
        if r.system == "hoplite" and r.median is not None:
            ratio = f"**{ratio}**"
        note = f" ({r.note})" if r.note else ""
        lines.append(f"| {r.case} | {r.size >> 20} MiB | {r.nodes} | {r.system}{note} | {med} "
                     f"| {ratio} | {per_s} |")
    return "\n".join(lines)


def plot(rows: list[Row], path: str) -> None:
    """Latency / optimum against node count, one panel per case (needs matplotlib)."""
    import matplotlib  # optional extra: pip install '.[plot]'
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = sorted({(r.case, r.size) for r in rows})
    systems = list(dict.fromkeys(r.system for r in rows))
    colours = {name: plt.get_cmap("tab10")(i) for i, name in enumerate(systems)}
    fig, axes = plt.subplots(1, len(cases), figsize=(4 * len(cases), 3.8), squeeze=False)
    for ax, (op, size) in zip(axes[0], cases):
        for system in systems:
            pts = sorted((r.nodes, r.median / r.optimum) for r in rows
                         if r.system == system and (r.case, r.size) == (op, size) and r.median)
            if pts:
                ax.plot(*zip(*pts), marker="o", label=system, color=colours[system],
                        linewidth=2.5 if system == "hoplite" else 1)
        ax.set_title(f"{op}, {size >> 20} MiB")
        ax.set_xlabel("nodes")
        ax.set_ylabel("latency / optimum")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    handles = [plt.Line2D([], [], color=colours[n], marker="o", label=n) for n in systems]
    fig.legend(handles=handles, loc="lower center", ncol=len(systems), fontsize=8)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(path, dpi=110)


def replace_section(path: str, start: str, end: str, lines: list[str]) -> None:
    """Put ``lines`` between the markers ``start`` and ``end`` of the Markdown page ``path``
    (replacing what was there; appended, with the markers, if they are missing)."""
    body = "\n".join([start, *lines, end])
    text = "# Benchmarks\n"
    if os.path.exists(path):
        with open(path) as f:
            text = f.read()
    if start in text:
        head, rest = text.split(start, 1)
        text = head + body + rest.split(end, 1)[1]
    else:
        text = text.rstrip() + "\n\n" + body + "\n"
    with open(path, "w") as f:
        f.write(text)


def write_docs(rows: list[Row], path: str, command: str, rate: int,
               plot_path: str | None, warmup: int = 1) -> None:
    """Replace (or append) the emulated-cluster section of the benchmarks page."""
    body = [f"## Emulated cluster ({datetime.date.today()})", "",
            f"Every link {format_rate(rate)} both ways (tbf), MTU 65000, one network namespace "
            f"per node; hoplite and each baseline measured in the same test bed, one after the "
            f"other. Median of the runs after {warmup} warm-up run{'s' if warmup != 1 else ''} "
            f"of each system. Optimum as docs/design.md §7: "
            f"S/RATE for broadcast and reduce, 2·S/RATE for allreduce (a ring needs only "
            f"2(N−1)/N·S/RATE, so it can beat it), (N−1)·S/RATE for gather; docs/design.md §8 "
            f"quotes ratios to S/RATE (last column). Machine: "
            f"{os.cpu_count()} vCPU, {platform.python_implementation()} "
            f"{platform.python_version()}, Linux {platform.release()}.", "",
            f"Command: `{command}`", "", table(rows), ""]
    if plot_path:
        rel = os.path.relpath(plot_path, os.path.dirname(path))
        body += [f"![latency / optimum against node count]({rel})", ""]
    replace_section(path, SECTION_START, SECTION_END, body)


# The standard set's outputs: the table at the end of this file and its plot.
DOCS = "docs/benchmarks.md"
PLOT = "docs/compare.png"


def main() -> None:
    """Measure (or reload a run's JSON), then write the JSON, the docs section and the plot."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--rate", default="1Gbit")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1,
                        help="unmeasured runs per case, the same for every system")
    parser.add_argument("--case", action="append", metavar="OP:SIZE[@D]",
                        help="e.g. broadcast:32MiB, or allreduce:32MiB@0.1 for inputs 0.1 s "
                             "apart (repeatable; default: the standard set)")
    parser.add_argument("--baselines", nargs="*", default=BASELINES, choices=BASELINES)
    parser.add_argument("--json", default="bench-results/compare.json")
    parser.add_argument("--docs", default=None,
                        help=f"the docs file whose table to rewrite (default: {DOCS} for the "
                             f"standard set, none for chosen cases)")
    parser.add_argument("--plot", default=None,
                        help=f"the plot to write (default: {PLOT} for the standard set, none "
                             f"for chosen cases)")
    parser.add_argument("--from-json", metavar="FILE",
                        help="Measure nothing: redo the table and plot from a run's JSON.")
    args = parser.parse_args()
    if args.from_json:
        with open(args.from_json) as f:
            saved = json.load(f)
        rows = [Row(**{k: v for k, v in r.items() if k != "median"}) for r in saved["rows"]]
        rate, command, warmup = saved["rate"], saved["command"], saved.get("warmup", 1)
    else:
        rate, warmup = parse_rate(args.rate), args.warmup
        command = " ".join(["python -m bench.compare", *sys.argv[1:]])
        cases = [parse_case(c) for c in (args.case or [f"{o}:{s}" for o, s in CASES])]
        rows = []
        for n in args.nodes:
            rows += uvloop.run(measure(n, rate, args.repeat, cases, args.baselines,
                                       args.warmup))
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"command": command, "rate": rate, "warmup": warmup,
                       "rows": [{**asdict(r), "median": r.median} for r in rows]}, f, indent=2)
    docs_path, plot_target = outputs(bool(args.case) and not args.from_json, args.docs,
                                     args.plot)
    plot_path = None
    if plot_target:
        try:
            plot(rows, plot_target)
            plot_path = plot_target
        except ImportError:
            print("matplotlib missing (pip install '.[plot]'): no plot", file=sys.stderr)
    if docs_path:
        write_docs(rows, docs_path, command, rate, plot_path, warmup)
    print(table(rows))


def outputs(chosen: bool, docs: str | None, plot_path: str | None) -> tuple[str | None,
                                                                              str | None]:
    """Where to write the docs table and the plot: where asked, else the standard ones for
    the standard set, and nowhere for a run of chosen cases (it would replace the standard
    table with a few rows)."""
    if chosen:
        return docs, plot_path
    return docs or DOCS, plot_path or PLOT


if __name__ == "__main__":
    main()
