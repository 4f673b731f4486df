"""``make demo``: the point of hoplite in a minute.

As root (network namespaces and rate-limited links are available): the same 64 MiB broadcast
from one node to 7 others over emulated 1 Gbit/s links, with hoplite and with a naive star
(the root sends every receiver its own copy, as a task system's object store does), side by
side, with the speed-up: the star's root pushes 7 copies through one link, hoplite's
receivers pass blocks on to each other. Without root it runs hoplite's broadcast on loopback,
and says why it compares nothing there: loopback has no link to spare.
Usage: python -m bench.demo [--nodes 8] [--size 64MiB] [--rate 1Gbit] [--repeat 3]
"""

from __future__ import annotations

import argparse
import subprocess
import sys

import uvloop

from bench.compare import measure
from hoplite_client.wire.units import parse_size
from hoplited.tools.testbed import TestbedError, format_rate, parse_rate, require_root


def emulated(nodes: int, size: int, rate: int, repeat: int) -> None:
    """Hoplite and the star in one emulated test bed; their medians and the speed-up."""
    print(f"Broadcast of {size >> 20} MiB from node 0 to {nodes - 1} nodes, every link "
          f"{format_rate(rate)} (network namespaces, tc tbf); {repeat} runs each after a "
          f"warm-up. Starting the test bed and {nodes} daemons...", flush=True)
    rows = uvloop.run(measure(nodes, rate, repeat, [("broadcast", size, 0.0)], ["star"]))
    best = size * 8 / rate
    print(f"\n{'system':<12} {'median':>9} {'x S/RATE':>9}")
    medians = {}
    for row in rows:
        if row.median is None:
            print(f"{row.system:<12} {'failed':>9}  {row.note}")
            continue
        medians[row.system] = row.median
        print(f"{row.system:<12} {row.median:>8.2f}s {row.median / best:>8.2f}x")
    if len(medians) == 2:
        star, hoplite = medians["naive star"], medians["hoplite"]
        print(f"\nhoplite is {star / hoplite:.1f}x faster than the star: the star's root sends "
              f"{nodes - 1} copies through its one link ({nodes - 1}x S/RATE at best), while "
              f"hoplite's receivers forward blocks to each other as they arrive (1x S/RATE "
              f"at best, S/RATE = {best:.2f}s).")


def loopback(nodes: int, size: str, repeat: int, why: str) -> None:
    """Hoplite's broadcast on loopback, after saying why there is no comparison."""
    print(f"No emulated links here ({why}). On loopback every copy is a memory copy on this "
          f"machine's cores, with no link to spare, so a star and hoplite cannot be told "
          f"apart by what they save; as root, make demo compares them over emulated 1 Gbit/s "
          f"links. Hoplite's broadcast on loopback, every copy checked:\n", flush=True)
    subprocess.run([sys.executable, "-m", "hoplited.tools.cli.main", "bench",
                    "broadcast", "--nodes", str(nodes), "--size", size, "--repeat",
                    str(repeat)], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--size", default="64MiB")
    parser.add_argument("--rate", default="1Gbit")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    size = parse_size(args.size)
    try:
        require_root()
    except TestbedError as exc:
        loopback(min(args.nodes, 4), args.size, args.repeat, str(exc))
        return
    emulated(args.nodes, size, parse_rate(args.rate), args.repeat)


if __name__ == "__main__":
    main()
