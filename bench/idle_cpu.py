"""CPU an idle daemon spends as the cluster grows: what heartbeats alone cost.

Every member pings every other one each heartbeat interval (``hoplited/cluster/links.py``),
so an idle daemon's CPU grows with the number of its peers. This starts local clusters of
each size on loopback, lets them settle, and reads each daemon's CPU from /proc over a
quiet window (docs/design.md §5, "Heartbeats at scale (not solved)").

Usage: python bench/idle_cpu.py --nodes 2,8,16 --seconds 20
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import uvloop

from hoplite_client.daemon_process import cpu_seconds
from hoplite_client.tools.local_cluster import LocalCluster

SETTLE = 5.0  # seconds after start-up before measuring: joins, first dials


async def idle_share(nodes: int, seconds: float) -> list[float]:
    """Each daemon's CPU over ``seconds`` of an idle cluster of ``nodes``, as a share of one
    core."""
    async with LocalCluster(nodes, capacity="64MiB", log_level="warning") as c:
        await asyncio.sleep(SETTLE)
        before = [cpu_seconds(n.pid) for n in c.nodes]
        t0 = time.monotonic()
        await asyncio.sleep(seconds)
        elapsed = time.monotonic() - t0
        return [(cpu_seconds(n.pid) - b) / elapsed for n, b in zip(c.nodes, before)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="2,8,16", help="comma-separated cluster sizes")
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    print("| nodes | idle CPU per daemon, median (range) | per peer |")
    print("| --- | --- | --- |")
    for nodes in (int(n) for n in args.nodes.split(",")):
        shares = uvloop.run(idle_share(nodes, args.seconds))
        median = statistics.median(shares)
        print(f"| {nodes} | {median * 100:.2f}% of a core ({min(shares) * 100:.2f}–"
              f"{max(shares) * 100:.2f}%) | {median / (nodes - 1) * 100:.3f}% |", flush=True)


if __name__ == "__main__":
    main()
