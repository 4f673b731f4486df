"""Daemon memory during a broadcast: peak resident memory of every daemon, sampled.

RssShmem is the arena (the objects themselves, one copy per node); RssAnon is the daemon's
own heap, which should stay a small constant whatever the object size.
Usage: python bench/broadcast_memory.py --nodes 8 --size 1GiB
"""

from __future__ import annotations

import argparse
import asyncio
import time

import numpy as np
import uvloop

import hoplite_client
from hoplite_client.wire.units import parse_size
from hoplited.tools.local_cluster import LocalCluster


def rss(pid: int) -> dict[str, int]:
    """VmRSS, RssAnon and RssShmem of a process, in bytes."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssShmem"):
                out[key] = int(value.split()[0]) * 1024
    return out


async def measure(nodes: int, size: int) -> None:
    async with LocalCluster(nodes, capacity=str(size + (256 << 20)), log_level="warning") as c:
        clients = [await hoplite_client.connect(s) for s in c.sockets]
        pids = [n.pid for n in c.nodes]
        idle = {pid: rss(pid) for pid in pids}
        data = np.random.default_rng(0).random(size // 4, dtype=np.float32)
        oid = await clients[0].put(data)
        peak = {pid: dict(idle[pid]) for pid in pids}
        stop = asyncio.Event()

        async def sample() -> None:
            while not stop.is_set():
                for pid in pids:
                    for key, value in rss(pid).items():
                        peak[pid][key] = max(peak[pid][key], value)
                await asyncio.sleep(0.02)

        sampler = asyncio.create_task(sample())
        t0 = time.perf_counter()
        results = await asyncio.gather(*(cl.get(oid, timeout=600) for cl in clients[1:]))
        elapsed = time.perf_counter() - t0
        stop.set()
        await sampler
        assert all(np.array_equal(r, data) for r in results)
        del results
        print(f"broadcast of {size / 2**20:.0f} MiB to {nodes - 1} receivers: {elapsed:.2f} s")
        print(f"{'node':<6}{'idle RSS':>12}{'peak RSS':>12}{'peak anon':>12}{'peak shmem':>12}")
        for i, pid in enumerate(pids):
            print(f"{i:<6}{idle[pid]['VmRSS'] / 2**20:>10.0f}Mi{peak[pid]['VmRSS'] / 2**20:>10.0f}"
                  f"Mi{peak[pid]['RssAnon'] / 2**20:>10.0f}Mi"
                  f"{peak[pid]['RssShmem'] / 2**20:>10.0f}Mi")
        for cl in clients:
            await cl.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--size", default="1GiB")
    args = parser.parse_args()
    uvloop.run(measure(args.nodes, parse_size(args.size)))


if __name__ == "__main__":
    main()
