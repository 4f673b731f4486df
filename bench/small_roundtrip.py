"""Latency of a small object: put on node 0, then get on node 1 (one round trip each).

Also reports the CPU each daemon spends per round trip, from /proc: on a shared machine
the latency drifts from day to day, the CPU much less.

Usage: python bench/small_roundtrip.py --size 1KB --count 1000
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import uvloop

import hoplite_client
from hoplite_client.daemon_process import cpu_seconds
from hoplite_client.wire.units import parse_size
from hoplited.tools.local_cluster import LocalCluster


async def measure(size: int, count: int) -> tuple[list[float], list[float], list[float]]:
    """Put and round-trip times of ``count`` objects after a warm-up, and each daemon's CPU
    seconds over them."""
    puts, roundtrips = [], []
    async with LocalCluster(2, capacity="256MiB", log_level="warning") as c:
        a = await hoplite_client.connect(c.sockets[0])
        b = await hoplite_client.connect(c.sockets[1])
        data = np.frombuffer(np.random.default_rng(0).bytes(size), dtype=np.uint8)
        cpu: list[float] = []
        for i in range(count + 50):
            if i == 50:
                cpu = [cpu_seconds(n.pid) for n in c.nodes]
            t0 = time.perf_counter()
            oid = await a.put(data)
            t1 = time.perf_counter()
            got = await b.get(oid, timeout=30)
            t2 = time.perf_counter()
            assert got.tobytes() == data.tobytes()
            if i >= 50:  # warm-up: connections, code paths
                puts.append(t1 - t0)
                roundtrips.append(t2 - t0)
        cpu = [cpu_seconds(n.pid) - before for n, before in zip(c.nodes, cpu)]
        await a.close()
        await b.close()
    return puts, roundtrips, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="1KB")
    parser.add_argument("--count", type=int, default=1000)
    args = parser.parse_args()
    puts, rts, cpu = uvloop.run(measure(parse_size(args.size), args.count))
    q = statistics.quantiles(rts, n=100)
    print(f"{args.size} put: median {statistics.median(puts) * 1e3:.3f} ms")
    print(f"{args.size} put -> remote get: median {statistics.median(rts) * 1e3:.3f} ms, "
          f"p99 {q[98] * 1e3:.3f} ms over {len(rts)} objects")
    print("daemon CPU per round trip: " + ", ".join(
        f"node {i} {seconds / len(rts) * 1e6:.0f} us" for i, seconds in enumerate(cpu)))


if __name__ == "__main__":
    main()
