"""Latency of a small object: put on node 0, then get on node 1 (one round trip each).

Usage: python bench/small_roundtrip.py --size 1KB --count 1000
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import uvloop

import hoplite_client
from hoplite_client.tools.local_cluster import LocalCluster
from hoplite_client.wire.units import parse_size


async def measure(size: int, count: int) -> tuple[list[float], list[float]]:
    puts, roundtrips = [], []
    async with LocalCluster(2, capacity="256MiB", log_level="warning") as c:
        a = await hoplite_client.connect(c.sockets[0])
        b = await hoplite_client.connect(c.sockets[1])
        data = np.frombuffer(np.random.default_rng(0).bytes(size), dtype=np.uint8)
        for i in range(count + 50):
            t0 = time.perf_counter()
            oid = await a.put(data)
            t1 = time.perf_counter()
            got = await b.get(oid, timeout=30)
            t2 = time.perf_counter()
            assert got.tobytes() == data.tobytes()
            if i >= 50:  # warm-up: connections, code paths
                puts.append(t1 - t0)
                roundtrips.append(t2 - t0)
        await a.close()
        await b.close()
    return puts, roundtrips


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="1KB")
    parser.add_argument("--count", type=int, default=1000)
    args = parser.parse_args()
    puts, rts = uvloop.run(measure(parse_size(args.size), args.count))
    q = statistics.quantiles(rts, n=100)
    print(f"{args.size} put: median {statistics.median(puts) * 1e3:.3f} ms")
    print(f"{args.size} put -> remote get: median {statistics.median(rts) * 1e3:.3f} ms, "
          f"p99 {q[98] * 1e3:.3f} ms over {len(rts)} objects")


if __name__ == "__main__":
    main()
