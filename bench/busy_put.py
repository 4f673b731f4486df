"""A large put while its daemon streams a collective, against the same put on an idle cluster.

An application that lost an input puts it again while the collective that needs it runs: on
a node whose daemon is forwarding and adding the collective's streams. This bench starts an
emulated cluster (root: network namespaces, ``--rate`` links), times three puts of
``--size`` on node ``--node`` with nothing else running (idle), then runs the collective
(every node puts its own input under a random id, node 0 starts ``--op`` over them all) and,
``--after`` seconds after the collective starts, times the same put on the same node (busy).
Each of ``--repeat`` rounds is a fresh cluster that first runs the collective once alone:
the busy put is then the first time that node holds that much, as a lost input put again
beside the node's own is in an application.
Each put is a plain client's, under a random id; the collective's result is checked.

The machine's share of the cost is measured in the same run: the same bytes copied through a
bare Unix socket pair (two threads of this process, no daemon) with nothing running, and right
before or after the busy put (alternating) while the collective runs. A busy put near the busy
copy is as fast as the cores it is given allow.

Usage: python -m bench.busy_put --nodes 8 --size 256MiB --rate 1Gbit --op reduce --repeat 5
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

import hoplite_client
from hoplite_client.wire.units import parse_size
from hoplited.tools.scenarios import make_data
from hoplited.tools.testbed import emulated_cluster, parse_rate

RESULT_TIMEOUT = 300.0
# Puts timed on the idle cluster, after its first collective.
IDLE_PUTS = 3
# The socket buffers of a put's bulk stream (hoplite_client.net.bulk_io).
COPY_BUFFER = 4 << 20


async def timed_put(client: hoplite_client.Client,
                    data: NDArray[Any]) -> tuple[float, hoplite_client.ObjectID]:
    """Seconds one put of ``data`` takes, and its id."""
    start = time.perf_counter()
    oid = await client.put(data)
    return time.perf_counter() - start, oid


def bare_copy(data: NDArray[Any], into: NDArray[Any]) -> float:
    """Seconds to copy ``data`` into ``into`` through a Unix socket pair, sent and received
    by two threads with the buffers a put uses."""
    a, b = socket.socketpair()
    with a, b:
        for s in (a, b):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, COPY_BUFFER)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, COPY_BUFFER)
        src, dst = memoryview(data).cast("B"), memoryview(into).cast("B")
        start = time.perf_counter()
        sender = threading.Thread(target=a.sendall, args=(src,))
        sender.start()
        pos = 0
        while pos < len(dst):
            pos += b.recv_into(dst[pos:])
        sender.join()
        return time.perf_counter() - start


async def collective(clients: list[hoplite_client.Client], inputs: list[NDArray[Any]],
                     expected: NDArray[Any], op: str,
                     put: Callable[[], Awaitable[None]] | None = None) -> float:
    """Run ``op`` over every node's input (random ids), ``put`` meanwhile if given; check
    the result, delete what it made, and return its seconds."""
    ids = await asyncio.gather(*(c.put(d) for c, d in zip(clients, inputs)))
    start = time.perf_counter()
    if op == "reduce":
        result, getters = await clients[0].reduce(ids, op="sum"), [clients[0]]
    else:
        result, getters = await clients[0].allreduce(ids, op="sum"), clients
    gets = [asyncio.ensure_future(c.get(result, timeout=RESULT_TIMEOUT)) for c in getters]
    if put is not None:
        await put()
    got = await asyncio.gather(*gets)
    seconds = time.perf_counter() - start
    assert all(np.allclose(g, expected, rtol=1e-4) for g in got), "wrong result"
    del got
    await asyncio.gather(*(clients[0].delete(i) for i in (*ids, result)))
    return seconds


async def one_cluster(nodes: int, size: int, rate: int, op: str, node: int, after: float,
                      times: dict[str, list[float]]) -> None:
    """On a fresh cluster: a collective, idle puts, then the collective with the busy put;
    the times go into ``times``."""
    async with emulated_cluster(nodes, rate, capacity=f"{max(2, 4 * size // 2**30 + 1)}GiB",
                                check=True) as cluster:
        clients = [await hoplite_client.connect(n.socket) for n in cluster.nodes]
        try:
            extra = make_data(size, seed=nodes)
            into = np.empty_like(extra)
            into.fill(0)  # backed, as the arena's warm pages are
            inputs = [make_data(size, seed=i) for i in range(nodes)]
            expected = np.sum(np.stack(inputs), axis=0, dtype=np.float64).astype(inputs[0].dtype)
            times["free"].append(await collective(clients, inputs, expected, op))
            for _ in range(IDLE_PUTS):
                seconds, oid = await timed_put(clients[node], extra)
                times["idle"].append(seconds)
                await clients[node].delete(oid)
                times["idle copy"].append(await asyncio.to_thread(bare_copy, extra, into))
            copy_first = len(times["busy"]) % 2 == 1

            async def busy_put() -> None:
                await asyncio.sleep(after)
                if copy_first:
                    times["busy copy"].append(await asyncio.to_thread(bare_copy, extra, into))
                seconds, oid = await timed_put(clients[node], extra)
                times["busy"].append(seconds)
                if not copy_first:
                    times["busy copy"].append(await asyncio.to_thread(bare_copy, extra, into))
                await clients[node].delete(oid)

            times[op].append(await collective(clients, inputs, expected, op, busy_put))
        finally:
            for c in clients:
                await c.close()


async def run(nodes: int, size: int, rate: int, op: str, node: int, after: float,
              repeat: int) -> None:
    """Print the idle and busy put times and the collective's times, over ``repeat``
    fresh clusters."""
    times: dict[str, list[float]] = {"free": [], "idle": [], "busy": [], "idle copy": [],
                                     "busy copy": [], op: []}
    for _ in range(repeat):
        await one_cluster(nodes, size, rate, op, node, after, times)
    median = {k: statistics.median(v) for k, v in times.items()}
    ratio = median["busy"] / median["idle"]
    copy_ratio = median["busy copy"] / median["idle copy"]
    print(f"{op}, N={nodes}, {size / 2**20:g} MiB, put on node {node} {after} s in, "
          f"{repeat} fresh clusters:")
    print(f"  idle put          {ms(times['idle'])}")
    print(f"  busy put          {ms(times['busy'])}  = {ratio:.1f}x idle")
    print(f"  bare copy, idle   {ms(times['idle copy'])}")
    print(f"  bare copy, busy   {ms(times['busy copy'])}  = {copy_ratio:.1f}x idle; the busy "
          f"put is {median['busy'] / median['busy copy']:.2f}x the busy copy")
    print(f"  {op} alone     {ms(times['free'])}")
    print(f"  {op} with put  {ms(times[op])}")


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
