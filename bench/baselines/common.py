"""What every collective baseline (gloo, MPI, Ray, Dask) shares: keep this small and stable.

Interface of a baseline module ``bench/baselines/<name>.py``::

    async def run(testbed, op, size, repeat, warmup=1) -> list[float]

``op`` is one of :data:`OPS`; ``size`` is bytes of float32 data (``size // 4`` elements), rank
``i`` (host ``i``) contributing :func:`float32_data` ``(size, i)``; root = rank 0. It returns
the latency in seconds of each measured run and raises :class:`BaselineUnavailable` when the
system it needs is not installed.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from typing import Any, Awaitable, Callable

import numpy as np

OPS = ("broadcast", "reduce", "allreduce", "gather")


class BaselineUnavailable(Exception):
    """The baseline's package or tool is missing; the message says how to install it."""


def float32_data(size: int, seed: int) -> np.ndarray:
    """``size // 4`` float32 values in [0, 1), the same for the same (size, seed).

    Rank ``i`` of a baseline uses ``seed = i``, so every rank's input differs.
    """
    if size < 4:
        raise ValueError(f"size must be at least 4 bytes (one float32), not {size}")
    return np.random.default_rng(seed).random(size // 4, dtype=np.float32)


def expected_sum(size: int, nodes: int) -> np.ndarray:
    """The sum over ranks of their :func:`float32_data` (accumulated in float64)."""
    total = np.zeros(size // 4, dtype=np.float64)
    for rank in range(nodes):
        total += float32_data(size, rank)
    return total


def sum_matches(result: np.ndarray, expected: np.ndarray, nodes: int) -> bool:
    """Does a float32 reduce result match :func:`expected_sum` up to rounding (any order)?"""
    # n float32 values in [0, 1): each addition rounds by at most ulp(n)/2 ~ n * 2**-24.
    tolerance = nodes * nodes * 2.0**-23 + 1e-6
    return result.shape == expected.shape and bool(
        np.all(np.abs(result.astype(np.float64) - expected) <= tolerance))


def optimum_seconds(op: str, size: int, nodes: int, rate_bps: float) -> float:
    """DESIGN.md §7's lower bound: S/RATE (broadcast, reduce), 2·S/RATE (allreduce),
    (N−1)·S/RATE (gather, the root's downlink)."""
    factor = {"broadcast": 1, "reduce": 1, "allreduce": 2, "gather": nodes - 1}[op]
    return factor * size * 8 / rate_bps


def parse_size(text: str) -> int:
    """'32MiB' → 33554432, '2MB' → 2000000, '4096' → 4096."""
    units = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 1 << 10, "m": 10**6, "mb": 10**6,
             "mib": 1 << 20, "g": 10**9, "gb": 10**9, "gib": 1 << 30}
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in units:
        raise ValueError(f"not a size: {text!r} (try 32MiB, 2MB, 4096)")
    return int(float(m.group(1)) * units[m.group(2).lower()])


# ------------------------------------------------------------------------------------------
# command line of a baseline module (its __main__)


async def measure(system: str, run_fn: Callable[..., Awaitable[list[float]]],
                  args: argparse.Namespace) -> list[dict[str, Any]]:
    """Build a test bed, run each of ``args.op`` (comma-separated) and print the results."""
    from hoplite_client.tools.testbed import Testbed, parse_rate

    rate = parse_rate(args.rate)
    size = parse_size(args.size)
    report = []
    async with Testbed(args.nodes, rate, mtu=args.mtu) as tb:
        if args.check:
            for m in await tb.check_links():
                print(f"link h{m.src} → h{m.dst}: {m.bps / 1e6:.0f} Mbit/s")
        for op in args.op.split(","):
            latencies = await run_fn(tb, op, size, args.repeat, args.warmup)
            median = statistics.median(latencies)
            optimum = optimum_seconds(op, size, args.nodes, rate)
            print(f"{system} {op} of {size / 2**20:.1f} MiB, {args.nodes} nodes, {args.rate} "
                  f"links: median {median:.3f} s = {median / optimum:.2f} × optimum "
                  f"({optimum:.3f} s) (runs: {', '.join(f'{t:.3f}' for t in latencies)})",
                  flush=True)
            report.append({"op": op, "system": system, "nodes": args.nodes, "size": size,
                           "rate_bps": rate, "runs": latencies, "median_s": median,
                           "ratio_to_optimum": median / optimum})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return report


def cli_parser(description: str) -> argparse.ArgumentParser:
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
    parser.add_argument("--json", default=None, help="write the results here")
    return parser
