"""Naive star broadcast: the root sends the whole object to every receiver, over plain TCP.

The baseline every broadcast must beat (7.0 × S/RATE at N = 8 in docs/benchmarks.md). One
process per host, each in its own namespace of the emulated test bed: the root (host 0) and N-1
receivers, which receive into a buffer allocated (and faulted in) before the runs, and report
completion with one byte back over the same connection. A run's latency goes from the root
starting to send until the last receiver's report; the next run starts after it. After the last
run every receiver returns the CRC-32 of what it got, checked against the root's.

Usage (root):  python -m bench.baselines.star run --nodes 8 --rate 1Gbit --size 32MiB
From Python:   latencies = await run_star(testbed, size, repeat)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import statistics
import struct
import time
import zlib
from collections.abc import Sequence
from typing import Any

from bench.baselines.common import REPO_ROOT, module_command
from hoplited.tools.testbed import helper_process

HEADER = struct.Struct("!Q")  # per run: the object size; 0 asks for the CRC and ends
CRC = struct.Struct("!I")
DONE = b"\x01"
PAGE = 4096
START_TIMEOUT = 60.0  # root and receivers up and connected, on a loaded 2-core VM
MIN_RATE_FOR_TIMEOUT = 10e6  # bytes/s: the run timeout assumes at least this per receiver

# (command prefix, IP) per host, as hoplited.tools.local_cluster.LocalCluster's placement
Hosts = Sequence[tuple[Sequence[str], str]]


# --------------------------------------------------------------------------------------------
# the two ends (run as separate processes)


async def recv_exact(loop: asyncio.AbstractEventLoop, sock: socket.socket,
                     view: memoryview) -> None:
    """Fill ``view`` from ``sock``; EOF first is an error."""
    got = 0
    while got < len(view):
        n = await loop.sock_recv_into(sock, view[got:])
        if not n:
            raise ConnectionError("peer closed mid-message")
        got += n


async def root(listen: str, receivers: int, size: int, runs: int) -> dict[str, Any]:
    """Accept ``receivers`` connections, send the object to all of them ``runs`` times."""
    loop = asyncio.get_running_loop()
    data = memoryview(os.urandom(size))  # randbytes overflows past 2**31 bits
    server = socket.create_server((listen, 0), backlog=receivers)
    server.setblocking(False)
    print(json.dumps({"port": server.getsockname()[1]}), flush=True)
    conns = []
    for _ in range(receivers):
        conn, _ = await loop.sock_accept(server)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conns.append(conn)
    server.close()

    async def send_one(conn: socket.socket) -> None:
        await loop.sock_sendall(conn, HEADER.pack(size))
        await loop.sock_sendall(conn, data)
        await recv_exact(loop, conn, memoryview(bytearray(1)))

    latencies = []
    for _ in range(runs):
        t0 = time.perf_counter()
        await asyncio.gather(*(send_one(c) for c in conns))
        latencies.append(time.perf_counter() - t0)
    crcs = []
    for conn in conns:
        await loop.sock_sendall(conn, HEADER.pack(0))
        reply = bytearray(CRC.size)
        await recv_exact(loop, conn, memoryview(reply))
        crcs.append(CRC.unpack(reply)[0])
        conn.close()
    return {"latencies": latencies, "crc_ok": all(c == zlib.crc32(data) for c in crcs)}


def preallocate(size: int) -> bytearray:
    """A receive buffer with every page already faulted in (first-touch costs excluded)."""
    buf = bytearray(size)
    view = memoryview(buf)
    for offset in range(0, size, PAGE):
        view[offset] = 1
    return buf


async def receive(connect: str, size: int) -> None:
    """Connect to the root; receive each run into one preallocated buffer; report each."""
    loop = asyncio.get_running_loop()
    buf = preallocate(size)
    view = memoryview(buf)
    host, _, port = connect.rpartition(":")
    conn = socket.create_connection((host, int(port)), timeout=START_TIMEOUT)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conn.setblocking(False)
    header = bytearray(HEADER.size)
    while True:
        await recv_exact(loop, conn, memoryview(header))
        (n,) = HEADER.unpack(header)
        if n == 0:
            await loop.sock_sendall(conn, CRC.pack(zlib.crc32(view[:size])))
            break
        if n > size:
            raise ValueError(f"root sent {n} bytes, buffer holds {size}")
        await recv_exact(loop, conn, view[:n])
        await loop.sock_sendall(conn, DONE)
    conn.close()


# --------------------------------------------------------------------------------------------
# driver


def _placement(hosts: Any) -> list[tuple[list[str], str]]:
    if hasattr(hosts, "placement"):  # a hoplited.tools.testbed.Testbed
        hosts = hosts.placement()
    return [(list(prefix), ip) for prefix, ip in hosts]


async def run_star(testbed_or_hosts: Any | Hosts, size: int, repeat: int = 5,
                   warmup: int = 1) -> list[float]:
    """Latency in seconds of each of ``repeat`` star broadcasts of ``size`` bytes (after
    ``warmup`` ones) from host 0 to every other host.

    ``testbed_or_hosts``: a :class:`hoplited.tools.testbed.Testbed`, or (command prefix,
    IP) per host — ``[([], "127.0.0.1")] * 4`` runs it on loopback. Raises ``RuntimeError`` if a
    process fails or a receiver got wrong bytes.
    """
    hosts = _placement(testbed_or_hosts)
    if len(hosts) < 2 or size < 1 or repeat < 1:
        raise ValueError("a star needs at least 2 hosts, size >= 1 and repeat >= 1")
    me = module_command("bench.baselines.star")
    runs = warmup + repeat
    timeout = START_TIMEOUT + runs * (len(hosts) - 1) * size / MIN_RATE_FOR_TIMEOUT
    async with contextlib.AsyncExitStack() as stack:
        (prefix, ip), receivers = hosts[0], hosts[1:]
        server = await stack.enter_async_context(helper_process(
            prefix + me + ["root", "--listen", ip, "--receivers", str(len(receivers)),
                           "--size", str(size), "--runs", str(runs)], cwd=REPO_ROOT))
        assert server.stdout is not None
        line = await asyncio.wait_for(server.stdout.readline(), START_TIMEOUT)
        if not line:
            raise RuntimeError(f"star root failed to start (exit {await server.wait()})")
        port = json.loads(line)["port"]
        clients = [await stack.enter_async_context(helper_process(
            p + me + ["receive", "--connect", f"{ip}:{port}", "--size", str(size)],
            cwd=REPO_ROOT))
            for p, _ in receivers]
        out, _ = await asyncio.wait_for(server.communicate(), timeout)
        codes = [await asyncio.wait_for(c.wait(), START_TIMEOUT) for c in clients]
    if server.returncode != 0 or any(codes):
        raise RuntimeError(f"star failed: root exit {server.returncode}, receivers {codes}")
    result = json.loads(out)
    if not result["crc_ok"]:
        raise RuntimeError("star: a receiver got wrong bytes")
    return [float(t) for t in result["latencies"][warmup:]]


# --------------------------------------------------------------------------------------------
# command line


async def _run_emulated(args: argparse.Namespace) -> list[float]:
    # the command line's side only: the root and the receivers never import hoplite_client
    from hoplite_client.wire.units import parse_size
    from hoplited.tools.scenarios import optimum
    from hoplited.tools.testbed import Testbed, parse_rate

    rate = parse_rate(args.rate)
    size = parse_size(args.size)
    async with Testbed(args.nodes, rate, mtu=args.mtu) as tb:
        if args.check:
            for m in await tb.check_links():
                print(f"link h{m.src} → h{m.dst}: {m.bps / 1e6:.0f} Mbit/s")
        latencies = await run_star(tb, size, args.repeat, args.warmup)
    best = optimum("broadcast", size, args.nodes, rate)  # S/RATE
    median = statistics.median(latencies)
    print(f"star broadcast of {size / 2**20:.1f} MiB to {args.nodes - 1} receivers over "
          f"{args.rate} links: median {median:.3f} s = {median / best:.2f} × S/RATE "
          f"(runs: {', '.join(f'{t:.3f}' for t in latencies)})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"op": "broadcast", "system": "star", "nodes": args.nodes,
                       "size": size, "rate_bps": rate, "runs": latencies,
                       "median_s": median, "ratio_to_optimum": median / best}, f, indent=2)
    return latencies


def main(argv: Sequence[str] | None = None) -> None:
    """The command line: ``run`` measures in a fresh test bed; ``root`` and ``receive`` are
    the two ends it starts."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="build an emulated test bed and measure (root only)")
    run.add_argument("--nodes", type=int, default=8)
    run.add_argument("--rate", default="1Gbit")
    run.add_argument("--mtu", type=int, default=65000)
    run.add_argument("--size", default="32MiB", help="e.g. 32MiB, 2MB, 4096")
    run.add_argument("--repeat", type=int, default=5)
    run.add_argument("--warmup", type=int, default=1)
    run.add_argument("--check", action="store_true", help="measure the links first")
    run.add_argument("--json", default=None, help="write the result here")
    r = sub.add_parser("root", help="(internal) the sending end")
    r.add_argument("--listen", required=True)
    r.add_argument("--receivers", type=int, required=True)
    r.add_argument("--size", type=int, required=True)
    r.add_argument("--runs", type=int, required=True)
    c = sub.add_parser("receive", help="(internal) a receiving end")
    c.add_argument("--connect", required=True)
    c.add_argument("--size", type=int, required=True)
    args = parser.parse_args(argv)
    if args.cmd == "root":
        print(json.dumps(asyncio.run(root(args.listen, args.receivers, args.size, args.runs))),
              flush=True)
    elif args.cmd == "receive":
        asyncio.run(receive(args.connect, args.size))
    else:
        asyncio.run(_run_emulated(args))


if __name__ == "__main__":
    main()
