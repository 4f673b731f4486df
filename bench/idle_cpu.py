"""CPU an idle daemon spends as the cluster grows: what heartbeats alone cost.

Each member pings its watched members every heartbeat interval: every other one up to
``--watchers`` + 1 members, that many above (``hoplited/cluster/watching.py``). This starts
local clusters of each size on loopback, lets them settle, and reads each daemon's CPU from
/proc over a quiet window, for each watcher count asked for; a count above the cluster's size
is the full mesh (docs/design.md §5, "Watchers").

Usage: python bench/idle_cpu.py --nodes 2,8,16,48 --watchers 1024,16 --seconds 20
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import uvloop

from hoplite_client.daemon_process import cpu_seconds
from hoplited.tools.local_cluster import LocalCluster

SETTLE = 5.0  # seconds after start-up before measuring: joins, first dials


async def idle_share(nodes: int, watchers: int, seconds: float) -> list[float]:
    """Each daemon's CPU over ``seconds`` of an idle cluster of ``nodes`` whose members each
    have ``watchers`` watchers, as a share of one core."""
    async with LocalCluster(nodes, capacity="64MiB", log_level="warning",
                            daemon_args=["--watchers", str(watchers)]) as c:
        await asyncio.sleep(SETTLE)
        before = [cpu_seconds(n.pid) for n in c.nodes]
        t0 = time.monotonic()
        await asyncio.sleep(seconds)
        elapsed = time.monotonic() - t0
        return [(cpu_seconds(n.pid) - b) / elapsed for n, b in zip(c.nodes, before)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="2,8,16", help="comma-separated cluster sizes")
    parser.add_argument("--watchers", default="16",
                        help="comma-separated watcher counts (the daemon's --watchers)")
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    print("| nodes | watchers | members each pings | idle CPU per daemon, median (range) |")
    print("| --- | --- | --- | --- |")
    for nodes in (int(n) for n in args.nodes.split(",")):
        for watchers in (int(w) for w in args.watchers.split(",")):
            shares = uvloop.run(idle_share(nodes, watchers, args.seconds))
            median = statistics.median(shares)
            print(f"| {nodes} | {watchers} | {min(watchers, nodes - 1)} | {median * 100:.2f}% "
                  f"of a core ({min(shares) * 100:.2f}–{max(shares) * 100:.2f}%) |", flush=True)


if __name__ == "__main__":
    main()
