"""A large put while its daemon streams a collective, against the same put on an idle cluster.

An application that lost an input puts it again while the collective that needs it runs: on
a node whose daemon is forwarding and adding the collective's streams. This bench starts an
emulated cluster (root: network namespaces, ``--rate`` links), times ``--repeat`` puts of
``--size`` on node ``--node`` with nothing else running (idle), then runs the collective
(every node puts its own input under a random id, node 0 starts ``--op`` over them all) and,
``--after`` seconds after the collective starts, times the same put on the same node (busy).
Each put is a plain client's, under a random id; the collective's result is checked.

Usage: python -m bench.busy_put --nodes 8 --size 256MiB --rate 1Gbit --op reduce --repeat 5
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import numpy as np
from numpy.typing import NDArray

import hoplite_client
from hoplite_client.tools.scenarios import make_data
from hoplite_client.tools.testbed import emulated_cluster, parse_rate
from hoplite_client.wire.units import parse_size

RESULT_TIMEOUT = 300.0


async def timed_put(client: hoplite_client.Client,
                    data: NDArray[Any]) -> tuple[float, hoplite_client.ObjectID]:
    """Seconds one put of ``data`` takes, and its id."""
    start = time.perf_counter()
    oid = await client.put(data)
    return time.perf_counter() - start, oid


async def run(nodes: int, size: int, rate: int, op: str, node: int, after: float,
              repeat: int) -> None:
    """Print the idle and busy put times and the collective's times."""
    async with emulated_cluster(nodes, rate, capacity=f"{max(2, 4 * size // 2**30 + 1)}GiB",
                                check=True) as cluster:
        clients = [await hoplite_client.connect(n.socket) for n in cluster.nodes]
        try:
            extra = make_data(size, seed=nodes)
            inputs = [make_data(size, seed=i) for i in range(nodes)]
            expected = np.sum(np.stack(inputs), axis=0, dtype=np.float64).astype(inputs[0].dtype)
            idle, busy, collective = [], [], []
            for _ in range(repeat):
                seconds, oid = await timed_put(clients[node], extra)
                idle.append(seconds)
                await clients[node].delete(oid)
            for _ in range(repeat):
                ids = await asyncio.gather(*(c.put(d) for c, d in zip(clients, inputs)))
                start = time.perf_counter()
                if op == "reduce":
                    result = await clients[0].reduce(ids, op="sum")
                    getters = [clients[0]]
                else:
                    result = await clients[0].allreduce(ids, op="sum")
                    getters = clients
                gets = [asyncio.ensure_future(c.get(result, timeout=RESULT_TIMEOUT))
                        for c in getters]
                await asyncio.sleep(max(0.0, start + after - time.perf_counter()))
                seconds, oid = await timed_put(clients[node], extra)
                busy.append(seconds)
                got = await asyncio.gather(*gets)
                collective.append(time.perf_counter() - start)
                assert all(np.allclose(g, expected, rtol=1e-4) for g in got), "wrong result"
                del got
                await asyncio.gather(*(clients[0].delete(i) for i in (*ids, result, oid)))
        finally:
            for c in clients:
                await c.close()
    ratio = statistics.median(busy) / statistics.median(idle)
    print(f"{op}, N={nodes}, {size / 2**20:g} MiB, put on node {node} {after} s in:")
    print(f"  idle put   {ms(idle)}")
    print(f"  busy put   {ms(busy)}  = {ratio:.1f}x idle")
    print(f"  {op}   {ms(collective)} (the put's included)")


def ms(seconds: list[float]) -> str:
    """Median (min-max) in milliseconds."""
    return (f"{1e3 * statistics.median(seconds):.0f} ms ({1e3 * min(seconds):.0f}-"
            f"{1e3 * max(seconds):.0f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--size", type=parse_size, default=parse_size("256MiB"))
    parser.add_argument("--rate", type=parse_rate, default=parse_rate("1Gbit"))
    parser.add_argument("--op", choices=("reduce", "allreduce"), default="reduce")
    parser.add_argument("--node", type=int, default=4)
    parser.add_argument("--after", type=float, default=1.0)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(run(args.nodes, args.size, args.rate, args.op, args.node, args.after,
                    args.repeat))


if __name__ == "__main__":
    main()
