"""Little for the unauthenticated, against real daemons: a stranger's connections cost the
daemon a few KiB each, bad frames before the handshake end the connection at the first with
at most a log line, connections beyond the cap of those in their handshake are closed at
once, and strangers holding every TCP descriptor they can do not lock local clients out."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time

import msgpack
import numpy as np
import pytest
from helpers import (
    IO_TIMEOUT,
    MiB,
    address,
    dial_as_peer,
    eventually,
    raw_frame,
    recv_until_close,
)

import hoplite_client
from hoplite_client.net.handshake import HANDSHAKE_TIMEOUT, Identity, dial, refused
from hoplite_client.wire.errors import ConnectionLostError
from hoplite_client.wire.frames import (
    HANDSHAKE_MAX_HEADER,
    MAGIC,
    MAX_HEADER,
    PRELUDE,
    PROTOCOL_VERSION,
)
from hoplite_client.wire.messages import Hello, Ok, Ping
from hoplited.rpc import FD_RESERVE, MAX_HANDSHAKES
from hoplited.tools.local_cluster import LocalCluster

STRANGERS = 600
RSS_BUDGET = 40 * MiB
LOG_BUDGET = 200_000  # bytes of daemon log a flood may cost
BAD_FRAMES = 20_000


def rss(pid: int) -> int:
    """Resident memory of process ``pid`` in bytes (/proc/PID/status VmRSS)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def open_fds(pid: int) -> int:
    """How many descriptors process ``pid`` holds open (/proc/PID/fd)."""
    return len(os.listdir(f"/proc/{pid}/fd"))


async def holding(pid: int, fds: int) -> None:
    """Wait until process ``pid`` holds at least ``fds`` descriptors (its accepted sockets)."""

    async def enough() -> bool:
        return open_fds(pid) >= fds

    await eventually(enough, what=f"{fds} descriptors open in process {pid}")


def connect_all(listen: str, n: int, first_bytes: bytes) -> list[socket.socket]:
    """``n`` TCP connections to ``listen``, each having sent ``first_bytes`` (the daemon may
    close them at once: a send into a reset connection is not this helper's failure)."""
    socks = []
    for _ in range(n):
        sock = socket.create_connection(address(listen), timeout=IO_TIMEOUT)
        socks.append(sock)
        try:
            sock.sendall(first_bytes)
        except OSError:
            pass
    return socks


async def round_trip(path: str, timeout: float = IO_TIMEOUT) -> None:
    """A local client connects (within ``timeout``), puts a small and a 1 MiB object and gets
    both back."""
    async with await hoplite_client.connect(path, timeout=timeout) as client:
        for value in (np.arange(100, dtype=np.int32), np.arange(MiB // 8, dtype=np.float64)):
            oid = await client.put(value)
            got = await client.get(oid, timeout=IO_TIMEOUT)
            np.testing.assert_array_equal(got, value)
            del got


def all_closed(socks: list[socket.socket]) -> bool:
    """Whether the other end closed every one of ``socks`` (what it sent first is read and
    dropped; an EOF or a reset is waiting)."""
    for sock in socks:
        try:
            while sock.recv(65536, socket.MSG_DONTWAIT):
                pass
        except BlockingIOError:
            return False
        except OSError:
            pass  # reset
    return True


async def strangers_cost(cluster, header_len: int, held: bool) -> int:
    """Bytes of RSS the daemon of ``cluster`` gains from STRANGERS connections that each send
    a prelude announcing a ``header_len``-byte header and nothing more, once it has read
    every prelude (``held``: it keeps the connections open in their handshake; or it closes
    each); a local client's round trip still works meanwhile."""
    node = cluster.nodes[0]
    await round_trip(node.socket)  # the daemon's steady state, before the strangers
    before, fds = rss(node.pid), open_fds(node.pid)
    prelude = PRELUDE.pack(MAGIC, PROTOCOL_VERSION, Hello.KIND, header_len, 0)
    socks = await asyncio.to_thread(connect_all, node.listen, STRANGERS, prelude)
    try:
        if held:  # every stranger accepted (fewer than the cap; the baseline may still
            # count the round trip's connection, closing), then its prelude read
            await holding(node.pid, fds + STRANGERS - 4)
        else:  # every prelude read, and its connection closed

            async def closed() -> bool:
                return all_closed(socks)

            await eventually(closed, what="every stranger's connection closed")
        await round_trip(node.socket)
        return rss(node.pid) - before
    finally:
        for sock in socks:
            sock.close()


async def test_strangers_announcing_maximal_headers_cost_little_memory(make_cluster) -> None:
    """600 connections, each a 16-byte prelude announcing a MAX_HEADER header and nothing
    more: under 40 MiB of the daemon's RSS, and a local client's put and get still work."""
    grown = await strangers_cost(await make_cluster(1), MAX_HEADER, held=False)
    print(f"{STRANGERS} strangers announcing {MAX_HEADER}-byte headers: RSS +{grown / MiB:.1f} "
          f"MiB")
    assert grown < RSS_BUDGET, f"RSS grew by {grown / MiB:.1f} MiB"


async def test_strangers_holding_their_handshake_open_cost_little_memory(make_cluster) -> None:
    """The costliest a stranger may hold: a prelude announcing the largest header still
    accepted before the handshake, the header never sent, until the handshake times out."""
    largest = HANDSHAKE_MAX_HEADER
    grown = await strangers_cost(await make_cluster(1), largest, held=True)
    print(f"{STRANGERS} strangers holding {largest}-byte headers open: RSS "
          f"+{grown / MiB:.1f} MiB")
    assert grown < RSS_BUDGET, f"RSS grew by {grown / MiB:.1f} MiB"


async def test_bad_frames_before_the_handshake_close_at_once_and_cost_little_log(
        make_cluster) -> None:
    """20,000 unknown-kind frames on one connection before its Hello: it is closed at the
    first, unanswered; then 300 connections with one bad frame each. The daemon's log grows
    by under 200 KB, and an authenticated peer's Pings are answered meanwhile."""
    cluster = await make_cluster(1)
    node = cluster.nodes[0]
    protocol, channel = await dial_as_peer(cluster, "pinger")
    log_before = os.path.getsize(node.log_path)
    flood = raw_frame(250, msgpack.packb([7])) * BAD_FRAMES  # 17 bytes each

    def flooder() -> list[tuple[bytes, bool]]:
        """What the daemon answered on each connection, and whether it closed it: first
        the 20,000 frames on one, then one bad frame on each of 300 more at once."""
        sock = socket.create_connection(address(node.listen), timeout=IO_TIMEOUT)
        try:
            try:
                sock.sendall(flood)
            except OSError:  # reset: the daemon closed it part way, as it should
                pass
            outcomes = [recv_until_close(sock)]
        finally:
            sock.close()
        socks = connect_all(node.listen, 300, raw_frame(250, msgpack.packb([7])))
        try:
            outcomes += [recv_until_close(sock) for sock in socks]
        finally:
            for sock in socks:
                sock.close()
        return outcomes

    flooding = asyncio.ensure_future(asyncio.to_thread(flooder))
    latencies = []
    try:
        while not flooding.done():
            start = time.monotonic()
            reply = await channel.request(Ping(), timeout=IO_TIMEOUT)
            latencies.append(time.monotonic() - start)
            assert isinstance(reply.msg, Ok)
            await asyncio.sleep(0.05)
        outcomes = await flooding  # every connection closed: the daemon logged first
    finally:
        protocol.close()
    grown = os.path.getsize(node.log_path) - log_before
    print(f"bad-frame flood: log +{grown} bytes; Ping max {max(latencies) * 1000:.0f} ms "
          f"over {len(latencies)}")
    answered = [(len(answer), closed) for answer, closed in outcomes if answer or not closed]
    assert not answered, f"(bytes answered, closed) of {len(answered)} connections: {answered[:5]}"
    assert grown < LOG_BUDGET, f"the flood wrote {grown} bytes of log"
    assert node.running


def flood_idle(listen: str, keep: int, stop: threading.Event) -> int:
    """Keep ``keep`` idle TCP connections open to ``listen`` until ``stop``: one the daemon
    closes is opened again (every 50 ms). Returns how many it opened."""
    socks: list[socket.socket] = []
    opened = 0
    try:
        while not stop.is_set():
            alive = []
            for sock in socks:
                try:
                    sock.setblocking(False)
                    if sock.recv(1) == b"":
                        sock.close()
                        continue
                except BlockingIOError:
                    pass
                except OSError:
                    sock.close()
                    continue
                alive.append(sock)
            socks = alive
            while len(socks) < keep and not stop.is_set():
                try:
                    socks.append(socket.create_connection(address(listen), timeout=1.0))
                    opened += 1
                except OSError:
                    break
            time.sleep(0.05)
    finally:
        for sock in socks:
            sock.close()
    return opened


async def test_local_clients_are_served_when_strangers_hold_every_tcp_descriptor() -> None:
    """A daemon allowed 256 open files, flooded with idle unauthenticated TCP connections
    (more than it can hold, reopened as it drops them): a local client still connects, puts
    and gets."""
    cluster = LocalCluster(1, capacity="256MiB",
                           placement=[(["prlimit", "--nofile=256:256", "--"], "127.0.0.1")])
    await cluster.start()
    stop = threading.Event()
    flooding = asyncio.ensure_future(asyncio.to_thread(flood_idle, cluster.seed, 400, stop))
    try:
        # the daemon's descriptors are taken: all it lets strangers have (FD_RESERVE kept)
        await holding(cluster.nodes[0].pid, 256 - FD_RESERVE - 8)
        assert not flooding.done()
        # Connecting within 5 s, before the first strangers' handshakes time out (10 s after
        # they came) and give their descriptors back for a while.
        for _ in range(3):
            await round_trip(cluster.sockets[0], timeout=5.0)
        assert cluster.nodes[0].running
    finally:
        stop.set()
        opened = await flooding
        await cluster.stop()
    print(f"idle flood: {opened} connections opened")


async def test_connections_beyond_the_handshake_cap_are_closed_at_once(make_cluster) -> None:
    """A burst of 300 members' dials all get in. With MAX_HANDSHAKES strangers sitting in
    their handshake, one more connection is closed at once (not after the handshake
    timeout), and a dialer sees a hang-up, not a refusal (which would count its member
    dead); once the strangers go, dials get in again."""
    cluster = await make_cluster(1)
    node = cluster.nodes[0]
    with open(cluster.token_file, "rb") as f:
        me = Identity("burst", f.read().strip())
    host, port = address(node.listen)

    async def dial_once() -> None:
        protocol, _ = await dial(host, port, "tool", me)
        protocol.close()

    await asyncio.gather(*(dial_once() for _ in range(300)))
    strangers = await asyncio.to_thread(connect_all, node.listen, MAX_HANDSHAKES, b"")
    try:
        # accepted, most of them (the rest wait in the kernel's queue, and it hands them out
        # in order: the connections below come after every stranger)
        await holding(node.pid, MAX_HANDSHAKES)
        start = time.monotonic()
        extra = await asyncio.to_thread(connect_all, node.listen, 20, b"")
        try:
            outcomes = [await asyncio.to_thread(recv_until_close, sock, 5.0) for sock in extra]
        finally:
            for sock in extra:
                sock.close()
        assert all(closed and not answer for answer, closed in outcomes), outcomes
        with pytest.raises(ConnectionLostError) as hung_up:
            await dial_once()
        assert not refused(hung_up.value)
        assert time.monotonic() - start < HANDSHAKE_TIMEOUT
    finally:
        for sock in strangers:
            sock.close()

    async def dials_again() -> bool:
        try:
            await dial_once()
        except ConnectionLostError:
            return False
        return True

    await eventually(dials_again, what="a dial let in once the strangers left")
