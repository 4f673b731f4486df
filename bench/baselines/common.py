"""What every collective baseline (gloo, MPI, Ray, Dask) shares: keep this small and stable.

Interface of a baseline module ``bench/baselines/<name>.py``::

    async def run(testbed, op, size, repeat, warmup=1) -> list[float]

``op`` is one of :data:`OPS`; ``size`` is bytes of float32 data (``size // 4`` elements), rank
``i`` (host ``i``) contributing :func:`float32_data` ``(size, i)``; root = rank 0. It returns
the latency in seconds of each measured run and raises :class:`BaselineUnavailable` when the
system it needs is not installed. Its command line runs from the repository root as
``python -m bench.baselines.<name>``, and so does every process it starts (see below).

A baseline that can also stagger its inputs sets ``STAGGERED = True`` and takes ``interval``:
rank ``i`` calls the collective ``i · interval`` after the barrier (:func:`wait_turn`), as
``hoplite bench --arrival-interval`` puts the inputs, and a run's latency then runs from the
last rank's call to the last rank's end (:func:`from_last_call`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

# How a baseline's processes import this package, without editing sys.path or PYTHONPATH.
# ``bench`` is not installed (only ``hoplited`` and ``hoplite_client`` are), so it is found the
# standard way for a checkout: every process a baseline starts -- a gloo rank, an MPI rank, a
# Ray or Dask driver, a star end -- runs ``python -m bench.baselines.<name>`` (see
# :func:`module_command`) with the repository root as its working directory, and ``python -m``
# puts the working directory first on sys.path. What those processes start in turn finds
# ``bench`` the same way when it unpickles a task that refers to this module: orted runs MPI
# ranks in the root (``mpirun --wdir``); the Dask scheduler and workers start in it
# (``python -m distributed.cli...``); Ray adds its driver's working directory to every
# worker's sys.path. The alternative, moving these helpers into the installed package,
# would ship baseline code (process trees, rank checks) inside hoplite itself.
#
# The baselines stay independent of the system under test where it matters: a rank, actor or
# task imports numpy and this module only. The command-line side (:func:`measure`) imports
# the installed tools -- the test bed, ``parse_size`` and the optimum every system is held to
# (``hoplited.tools.scenarios.optimum``) -- so that hoplite and the baselines share one
# definition of each.
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def module_command(module: str) -> list[str]:
    """``[python, -m, module]`` with this interpreter: start it with ``cwd=REPO_ROOT`` so that
    ``bench`` is importable (see the comment above)."""
    return [sys.executable, "-m", module]


OPS = ("broadcast", "reduce", "allreduce", "gather")
MAX_INTERVAL = 10.0  # seconds between two ranks' calls of a staggered run, at most


class BaselineUnavailable(Exception):
    """The baseline's package or tool is missing; the message says how to install it."""


def float32_data(size: int, seed: int) -> NDArray[np.float32]:
    """``size // 4`` float32 values in [0, 1), the same for the same (size, seed).

    Rank ``i`` of a baseline uses ``seed = i``, so every rank's input differs.
    """
    if size < 4:
        raise ValueError(f"size must be at least 4 bytes (one float32), not {size}")
    return np.random.default_rng(seed).random(size // 4, dtype=np.float32)


def expected_sum(size: int, nodes: int) -> NDArray[np.float64]:
    """The sum over ranks of their :func:`float32_data` (accumulated in float64)."""
    total = np.zeros(size // 4, dtype=np.float64)
    for rank in range(nodes):
        total += float32_data(size, rank)
    return total


def sum_matches(result: NDArray[Any], expected: NDArray[np.float64], nodes: int) -> bool:
    """Does a float32 reduce result match :func:`expected_sum` up to rounding (any order)?"""
    # n float32 values in [0, 1): each addition rounds by at most ulp(n)/2 ~ n * 2**-24.
    tolerance = nodes * nodes * 2.0**-23 + 1e-6
    return result.shape == expected.shape and bool(
        np.all(np.abs(result.astype(np.float64) - expected) <= tolerance))


def wait_turn(rank: int, interval: float) -> None:
    """Rank ``rank`` of a staggered run waits ``rank · interval`` before calling the
    collective, so the inputs arrive one by one in rank order."""
    if interval > 0:
        time.sleep(rank * interval)


def from_last_call(starts: NDArray[np.float64], ends: NDArray[np.float64]) -> list[float]:
    """A staggered run's latency: from the last rank's call to the last rank's end, given
    each run's latest call and latest end over the ranks. ``time.perf_counter`` is one clock
    for every rank: they all run on this machine (CLOCK_MONOTONIC, whatever the namespace)."""
    return [float(end - start) for start, end in zip(starts, ends, strict=True)]


# ------------------------------------------------------------------------------------------
# command line of a baseline module (its __main__)


async def measure(system: str, run_fn: Callable[..., Awaitable[list[float]]],
                  args: argparse.Namespace) -> list[dict[str, Any]]:
    """Build a test bed, run each of ``args.op`` (comma-separated) and print the results."""
    # the command line's side only: a rank never imports hoplite_client
    from hoplite_client.wire.units import parse_size
    from hoplited.tools.scenarios import optimum
    from hoplited.tools.testbed import Testbed, parse_rate

    rate = parse_rate(args.rate)
    size = parse_size(args.size)
    report = []
    async with Testbed(args.nodes, rate, mtu=args.mtu) as tb:
        if args.check:
            for m in await tb.check_links():
                print(f"link h{m.src} → h{m.dst}: {m.bps / 1e6:.0f} Mbit/s")
        stagger = {"interval": args.arrival_interval} if args.arrival_interval else {}
        for op in args.op.split(","):
            latencies = await run_fn(tb, op, size, args.repeat, args.warmup, **stagger)
            median = statistics.median(latencies)
            best = optimum(op, size, args.nodes, rate)
            print(f"{system} {op} of {size / 2**20:.1f} MiB, {args.nodes} nodes, {args.rate} "
                  f"links: median {median:.3f} s = {median / best:.2f} × optimum "
                  f"({best:.3f} s) (runs: {', '.join(f'{t:.3f}' for t in latencies)})",
                  flush=True)
            report.append({"op": op, "system": system, "nodes": args.nodes, "size": size,
                           "rate_bps": rate, "runs": latencies, "median_s": median,
                           "ratio_to_optimum": median / best})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return report


def cli_parser(description: str) -> argparse.ArgumentParser:
    """The options of a baseline's command line (what :func:`measure` reads)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--rate", default="1Gbit")
    parser.add_argument("--mtu", type=int, default=65000)
    parser.add_argument("--op", default="broadcast",
                        help=f"one of {', '.join(OPS)}, or several separated by commas")
    parser.add_argument("--size", default="32MiB")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--check", action="store_true", help="measure the links first")
    parser.add_argument("--arrival-interval", type=float, default=0.0,
                        help="rank i calls the collective i times this many seconds after "
                             "the others (baselines with STAGGERED only)")
    parser.add_argument("--json", default=None, help="write the results here")
    return parser
