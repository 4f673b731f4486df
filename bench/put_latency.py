"""How long a put takes on an idle daemon: one client, one daemon on loopback, ids the client
draws at random, each put deleted before the next (so every put reuses warm extents, as an
application's steady state does).

Usage: python bench/put_latency.py --size 256MiB --size 8MiB --size 1MiB --repeat 10
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import numpy as np

import hoplite_client
from hoplite_client.wire.units import parse_size
from hoplited.tools.local_cluster import LocalCluster

WARMUP = 2  # puts left out of the figures: the first backs the extent's pages


async def measure(sizes: list[int], repeat: int, capacity: str) -> None:
    """Print the median, min and max put time of each size."""
    async with LocalCluster(1, capacity=capacity) as cluster, \
            await hoplite_client.connect(cluster.nodes[0].socket) as client:
        for size in sizes:
            data = np.random.default_rng(size).integers(0, 255, size, dtype=np.uint8)
            times = []
            for i in range(WARMUP + repeat):
                start = time.perf_counter()
                oid = await client.put(data)
                times.append(time.perf_counter() - start)
                if i == 0:
                    assert np.array_equal(await client.get(oid), data)
                await client.delete(oid)
            ms = [1e3 * t for t in times[WARMUP:]]
            print(f"put {size / 2**20:g} MiB: median {statistics.median(ms):.2f} ms "
                  f"(min {min(ms):.2f}, max {max(ms):.2f}, {repeat} puts)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", action="append", type=parse_size,
                        help="object size, e.g. 256MiB (repeatable; default 256MiB)")
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--capacity", default="2GiB")
    args = parser.parse_args()
    asyncio.run(measure(args.size or [parse_size("256MiB")], args.repeat, args.capacity))


if __name__ == "__main__":
    main()
