"""A reduce whose inputs sit several to a node, on emulated links (root only).

Each of ``--nodes`` daemons puts ``--per-node`` float32 inputs of ``--size``, one per node in
turn (``--grouped``: each node's inputs listed together), and node 0 reduces them all and gets
the sum, checked. Prints the median time over ``--repeat`` runs after a warm-up and its ratio
to S/RATE: a node's link should carry its partial sum once, whatever its number of inputs
(docs/design.md §4, "Several inputs on one node").

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
from hoplite_client.tools.testbed import emulated_cluster, parse_rate
from hoplite_client.wire.units import parse_size


async def measure(nodes: int, per_node: int, size: int, rate_bps: int, repeat: int,
                  grouped: bool) -> list[float]:
    """Seconds of each timed reduce (put excluded, get of the result included)."""
    n = nodes * per_node
    arrays = [np.full(size // 4, i + 1, dtype=np.float32) for i in range(n)]
    times: list[float] = []
    async with emulated_cluster(nodes, rate_bps, capacity=f"{3 * per_node * size + (1 << 28)}",
                                log_level="warning") as cluster:
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
                if run:  # the first warms connections and memory up
                    times.append(seconds)
                await asyncio.sleep(0.3)
        finally:
            for client in clients:
                await client.close()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--per-node", type=int, default=4)
    parser.add_argument("--size", default="32MiB")
    parser.add_argument("--rate", default="1Gbit")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--grouped", action="store_true",
                        help="list each node's inputs together")
    args = parser.parse_args()
    size, rate = parse_size(args.size), parse_rate(args.rate)
    times = uvloop.run(measure(args.nodes, args.per_node, size, rate, args.repeat,
                               args.grouped))
    median = statistics.median(times)
    print(f"{args.nodes} nodes x {args.per_node} inputs of {args.size} at {args.rate}"
          f"{' (grouped)' if args.grouped else ''}: median {median:.3f} s, "
          f"{median / (size * 8 / rate):.2f}x S/RATE; runs "
          + ", ".join(f"{t:.3f}" for t in times))


if __name__ == "__main__":
    main()
