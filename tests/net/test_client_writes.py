"""Clients cannot write what the daemon stores: they get a read-only descriptor of a memfd
sealed against writes, and a large put's bytes travel in its Seal frame, into the extent its
Create reserved. Real daemons, real clients, and a hand-driven client for what a hostile one
would try."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import mmap
import os

import numpy as np
import pytest
from helpers import RawConn, eventually, recv_until_close

from hoplite_client.wire.frames import SUPPORTED_VERSIONS, encode_header
from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.messages import ClientHello, Create, Found, Get, Ok, Seal

MiB = 1024 * 1024


def writable_mappings(node_id: str) -> list[str]:
    """This process's mappings of the daemon's arena that may write."""
    with open("/proc/self/maps") as f:
        return [line for line in f if f"memfd:hoplite-{node_id}" in line
                and line.split()[1][1] == "w"]


def refused(call: object) -> int:
    """The errno ``call()`` fails with (the test fails if it succeeds)."""
    try:
        call()  # type: ignore[operator]
    except OSError as exc:
        return exc.errno or 0
    pytest.fail("a write path to the daemon's arena was open")


async def test_the_arena_descriptor_cannot_write_even_reopened(make_cluster):
    """Regression: every client mapped the whole arena read-write, so one that learnt an
    object's offset overwrote it, and copies pulled afterwards carried its bytes."""
    cluster = await make_cluster(2)
    raw = RawConn.unix(cluster.nodes[0].socket)
    try:
        welcome = await asyncio.to_thread(raw.client_handshake, True)
        fd = raw.arena_fd
        assert fd is not None
        size = welcome.arena_size
        assert refused(lambda: mmap.mmap(fd, size)) == errno.EACCES
        reopened = os.open(f"/proc/self/fd/{fd}", os.O_RDWR)  # the memfd's mode lets us...
        try:  # ...but the seal refuses every write and writable mapping through it
            assert refused(lambda: mmap.mmap(reopened, size)) == errno.EPERM
            assert refused(lambda: os.pwrite(reopened, b"x", 0)) == errno.EPERM
            assert refused(lambda: os.ftruncate(reopened, 0)) == errno.EPERM
        finally:
            os.close(reopened)
    finally:
        if raw.arena_fd is not None:
            os.close(raw.arena_fd)
        raw.close()


async def test_a_client_that_knows_an_offset_cannot_change_the_object(make_cluster, connect):
    """The offset a get reports maps read-only; a private writable mapping changes nothing
    the daemon holds, and another node pulls the bytes that were put."""
    cluster = await make_cluster(2)
    owner = await connect(cluster.nodes[0].socket)
    data = np.arange(4 * MiB, dtype=np.uint8)
    oid = await owner.put(data)
    raw = RawConn.unix(cluster.nodes[0].socket)
    try:
        await asyncio.to_thread(raw.client_handshake, True)
        fd = raw.arena_fd
        assert fd is not None
        raw.send(encode_header(Get(rid=1, oid=oid, timeout=10.0)))
        found = (await asyncio.to_thread(raw.next_frame)).msg
        assert isinstance(found, Found) and found.offset is not None
        offset = found.offset
        assert refused(lambda: mmap.mmap(fd, data.nbytes, offset=offset)) == errno.EACCES
        private = mmap.mmap(fd, data.nbytes, flags=mmap.MAP_PRIVATE,
                            prot=mmap.PROT_READ | mmap.PROT_WRITE, offset=offset)
        private[:4] = b"evil"  # copy-on-write: this process's own pages
        private.close()
    finally:
        if raw.arena_fd is not None:
            os.close(raw.arena_fd)
        raw.close()
    here = await owner.get(oid)
    assert np.array_equal(here, data)
    with pytest.raises(ValueError):
        here[0] = 1  # the view is read-only
    elsewhere = await connect(cluster.nodes[1].socket)
    assert np.array_equal(await elsewhere.get(oid, timeout=30), data)


async def test_a_seal_sent_with_the_hello_meets_the_sessions_sink(make_cluster, connect):
    """Regression: the session (and its Seal sink) was made only after the connection began
    reading, so a Seal that came with the hello could be read as an ordinary payload and
    answered, leaving the connection open; it must break the connection like any Seal for
    what the client is not creating."""
    cluster = await make_cluster(1)
    raw = RawConn.unix(cluster.nodes[0].socket)
    try:
        size = 1024 * 1024  # small enough to be read into memory without the sink
        hello = encode_header(ClientHello(versions=SUPPORTED_VERSIONS, pid=os.getpid()))
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # closed at the header
            raw.send(hello + encode_header(Seal(rid=1, oid=ObjectID.random()), size)
                     + bytes(size))
        _, closed = await asyncio.to_thread(recv_until_close, raw.sock)
        assert closed
    finally:
        raw.close()
    client = await connect(cluster.nodes[0].socket)
    data = np.arange(3 * MiB, dtype=np.uint8)
    assert np.array_equal(await client.get(await client.put(data)), data)


async def test_after_a_put_the_client_holds_no_writable_mapping(make_cluster, connect):
    """A large put streams its bytes to the daemon: the client never maps the arena
    writable, during the put or after it, and its gets map read-only."""
    cluster = await make_cluster(1)
    client = await connect(cluster.nodes[0].socket)
    data = np.random.default_rng(7).random(8 * MiB // 8)
    put = asyncio.ensure_future(client.put(data))
    while not put.done():  # sampled while the bytes are on their way too
        assert writable_mappings(client.node_id) == []
        await asyncio.sleep(0)
    oid = await put
    view = await client.get(oid)
    assert np.array_equal(view, data)
    assert writable_mappings(client.node_id) == []


async def test_small_requests_during_a_large_put_keep_their_order(make_cluster, connect):
    """Frames sent while a large put's bytes go from a worker thread wait behind them, in
    order: every small put and get meanwhile answers with the right bytes."""
    cluster = await make_cluster(1)
    client = await connect(cluster.nodes[0].socket)
    big = np.random.default_rng(1).integers(0, 255, 64 * MiB, dtype=np.uint8)
    small = [np.full(1000 + i, i, dtype=np.int32) for i in range(40)]
    big_put = asyncio.ensure_future(client.put(big))
    ids = await asyncio.gather(*(client.put(a) for a in small))
    got = await asyncio.gather(*(client.get(oid, timeout=30) for oid in ids))
    assert all(np.array_equal(a, b) for a, b in zip(small, got))
    assert np.array_equal(await client.get(await big_put, timeout=30), big)


@pytest.mark.parametrize("case", ["never created", "wrong size"])
async def test_a_seal_for_what_the_client_is_not_creating_ends_its_connection(
        make_cluster, connect, case):
    """A Seal whose bytes could go nowhere breaks that connection only; the store gets
    nothing from it, and the daemon goes on serving."""
    cluster = await make_cluster(1)
    path = cluster.nodes[0].socket
    client = await connect(path)
    before = (await client.status())["local"]["store"]
    raw = RawConn.unix(path)
    try:
        await asyncio.to_thread(raw.client_handshake)
        oid, size = ObjectID.random(), 2 * MiB
        if case == "wrong size":
            raw.send(encode_header(Create(rid=1, oid=oid, size=size, dtype="|u1", shape=[size],
                                          timeout=None)))
            assert isinstance((await asyncio.to_thread(raw.next_frame)).msg, Ok)
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # closed at the header
            raw.send(encode_header(Seal(rid=2, oid=oid), size // 2) + bytes(size // 2))
        _, closed = await asyncio.to_thread(recv_until_close, raw.sock)
        assert closed
    finally:
        raw.close()

    async def restored() -> bool:
        store = (await client.status())["local"]["store"]
        return store["objects"] == before["objects"] and store["arena_used"] == \
            before["arena_used"]

    await eventually(restored, what="the store as before the hostile client")
    data = np.arange(3 * MiB, dtype=np.uint8)
    assert np.array_equal(await client.get(await client.put(data)), data)
