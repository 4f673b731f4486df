"""One large get through two daemons on loopback, next to raw TCP measured in the same run.

Raw TCP: a sender process ``sendall``s the same bytes to a receiver that ``recv_into``s a
pre-faulted buffer: the ceiling for any Python data path on this machine. Hoplite: node 0
holds the object, node 1's client gets it (daemon → daemon stream into node 1's arena).
With ``--tls-cert F --tls-key F --tls-ca F`` both daemons run over mutual TLS
(docs/security.md): the price of TLS on the data path.
Usage: python bench/loopback_throughput.py --size 1GiB --repeat 3
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import socket
import statistics
import time

import numpy as np
import uvloop

import hoplite_client
from hoplite_client.net.tls import TlsFiles, tls_files
from hoplite_client.wire.units import parse_size
from hoplited.tools.local_cluster import LocalCluster

CHUNK = 16 * 1024 * 1024


def _raw_receiver(port_queue: mp.Queue[int], size: int, result: mp.Queue[float]) -> None:
    buf = bytearray(size)
    view = memoryview(buf)
    view[::4096] = b"\0" * len(view[::4096])  # fault the pages in before timing
    srv = socket.create_server(("127.0.0.1", 0))
    port_queue.put(srv.getsockname()[1])
    conn, _ = srv.accept()
    conn.recv_into(view[:1], 1)
    t0 = time.perf_counter()
    got = 1
    while got < size:
        got += conn.recv_into(view[got:], min(CHUNK, size - got))
    result.put(time.perf_counter() - t0)
    conn.close()


def raw_tcp(size: int) -> float:
    """Seconds to move ``size`` bytes over one loopback TCP stream between two processes."""
    ports: mp.Queue[int] = mp.Queue()
    result: mp.Queue[float] = mp.Queue()
    receiver = mp.Process(target=_raw_receiver, args=(ports, size, result))
    receiver.start()
    data = memoryview(np.random.default_rng(0).bytes(size))
    with socket.create_connection(("127.0.0.1", ports.get(timeout=60))) as s:
        s.sendall(data)
    elapsed = result.get(timeout=600)
    receiver.join()
    return elapsed


async def hoplite_get(size: int, repeat: int, tls: TlsFiles | None = None) -> list[float]:
    """Seconds for node 1 to get a ``size``-byte object held by node 0, per run."""
    times = []
    async with LocalCluster(2, capacity=str(2 * size + (64 << 20)), log_level="warning",
                            tls=tls) as c:
        a = await hoplite_client.connect(c.sockets[0])
        b = await hoplite_client.connect(c.sockets[1])
        data = np.frombuffer(np.random.default_rng(1).bytes(size), dtype=np.uint8)
        for _ in range(repeat + 1):  # the first run also faults in the arenas' pages
            oid = await a.put(data)
            t0 = time.perf_counter()
            got = await b.get(oid, timeout=600)
            times.append(time.perf_counter() - t0)
            assert np.array_equal(got, data)
            del got
            await a.delete(oid)
        await a.close()
        await b.close()
    return times[1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="1GiB")
    parser.add_argument("--repeat", type=int, default=3)
    for flag in ("--tls-cert", "--tls-key", "--tls-ca"):
        parser.add_argument(flag, default=None, metavar="FILE", help="all three or none")
    args = parser.parse_args()
    size = parse_size(args.size)
    tls = tls_files(args.tls_cert, args.tls_key, args.tls_ca)
    raw = statistics.median(raw_tcp(size) for _ in range(args.repeat))
    ours = statistics.median(uvloop.run(hoplite_get(size, args.repeat, tls)))
    print(f"raw TCP, one stream:      {size / raw / 1e9:.2f} GB/s ({raw:.3f} s)")
    print(f"hoplite get via daemons{' (TLS)' if tls else ''}:  {size / ours / 1e9:.2f} GB/s "
          f"({ours:.3f} s), {raw / ours * 100:.0f}% of raw")


if __name__ == "__main__":
    main()
