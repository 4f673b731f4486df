"""A reduce whose inputs sit several to a node, on emulated links (root only).

Each of ``--nodes`` daemons puts ``--per-node`` float32 inputs of ``--size``, one per node in
turn (``--grouped``: each node's inputs listed together), and node 0 reduces them all and gets
the sum, checked. Prints the median time over ``--repeat`` runs after a warm-up, its ratio to
S/RATE and how many inputs were merged into another's slot per run: a node's link should
carry its partial sum once, whatever its number of inputs (docs/design.md §4, "Several inputs
on one node"). ``--compare`` runs the same reduces again on daemons started ``--no-merge``.

Usage: python bench/colocated_reduce.py --nodes 4 --per-node 4 --size 32MiB --rate 1Gbit
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import numpy as np
import uvloop

import hoplite_client
from hoplite_client.wire.units import parse_size
from hoplited.tools.testbed import emulated_cluster, parse_rate


async def measure(nodes: int, per_node: int, size: int, rate_bps: int, repeat: int,
                  grouped: bool, merge: bool) -> list[tuple[float, int]]:
    """Seconds of each timed reduce (put excluded, get of the result included), and the
    inputs it merged."""
    n = nodes * per_node
    arrays = [np.full(size // 4, i + 1, dtype=np.float32) for i in range(n)]
    runs: list[tuple[float, int]] = []
    merged = 0
    async with emulated_cluster(nodes, rate_bps, capacity=f"{3 * per_node * size + (1 << 28)}",
                                log_level="warning",
                                daemon_args=[] if merge else ["--no-merge"]) as cluster:
        clients = [await hoplite_client.connect(s) for s in cluster.sockets]
        try:
            for run in range(repeat + 1):
                ids = [await clients[j].put(arrays[r * nodes + j])
                       for r in range(per_node) for j in range(nodes)]
                if grouped:
                    ids = [ids[r * nodes + j] for j in range(nodes) for r in range(per_node)]
                t0 = time.perf_counter()
                result = await clients[0].reduce(ids, "sum")
                got = await clients[0].get(result, timeout=120)
                seconds = time.perf_counter() - t0
                if float(got[0]) != n * (n + 1) / 2 or float(got[-1]) != n * (n + 1) / 2:
                    raise SystemExit(f"wrong sum: {got[0]}")
                del got
                for oid in [*ids, result]:
                    await clients[0].delete(oid)
                status = await clients[0].status()
                before, merged = merged, sum(n.get("reduce_merges", 0) for n in status["nodes"])
                if run:  # the first warms connections and memory up
                    runs.append((seconds, merged - before))
                await asyncio.sleep(0.3)
        finally:
            for client in clients:
                await client.close()
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--per-node", type=int, default=4)
    parser.add_argument("--size", default="32MiB")
    parser.add_argument("--rate", default="1Gbit")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--grouped", action="store_true",
                        help="list each node's inputs together")
    parser.add_argument("--compare", action="store_true",
                        help="run the reduces again on daemons that merge no inputs")
    args = parser.parse_args()
    size, rate = parse_size(args.size), parse_rate(args.rate)
    for merge in (True, False) if args.compare else (True,):
        runs = uvloop.run(measure(args.nodes, args.per_node, size, rate, args.repeat,
                                  args.grouped, merge))
        median = statistics.median(t for t, _ in runs)
        print(f"{args.nodes} nodes x {args.per_node} inputs of {args.size} at {args.rate}"
              f"{' (grouped)' if args.grouped else ''}{'' if merge else ', --no-merge'}: "
              f"median {median:.3f} s, {median / (size * 8 / rate):.2f}x S/RATE; runs "
              + ", ".join(f"{t:.3f} ({m} merged)" for t, m in runs))

if __name__ == "__main__":
    main()
