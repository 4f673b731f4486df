"""Releasing many views at once, and timeouts the protocol does not allow, against a real
daemon: from the client API and as raw frames from a hostile client on the Unix socket."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
import os
import resource
import signal
from collections.abc import Iterator
from typing import Any

import msgpack
import numpy as np
import pytest
from helpers import IO_TIMEOUT, RawConn, eventually, put_get_roundtrip, raw_frame

import hoplite_client as hc
from hoplite_client.wire.frames import INLINE_MAX, MAX_IDS_PER_FRAME, encode_header
from hoplite_client.wire.messages import (
    Error,
    Found,
    Get,
    Reduce,
    ReducedInputs,
    Status,
    StatusReply,
    WireMessage,
)
from hoplite_client.wire.receivers import MAX_RECEIVERS

NAN, INF = math.nan, math.inf
# More views than one Release notice may list, and than a single notice could carry at all
# (MAX_HEADER holds 11,914 ids): the client must send several. Each view holds a descriptor.
VIEWS = 12_500
BAD_TIMEOUTS: list[Any] = [NAN, -1, -0.5, -INF, True, "1"]


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@contextlib.contextmanager
def open_files_limit(limit: int) -> Iterator[None]:
    """The soft RLIMIT_NOFILE at ``limit`` for the block (skips if the hard limit is lower)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < limit:
        pytest.skip(f"needs {limit} open files, the hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def test_more_views_than_one_release_holds_are_all_released(make_cluster,
                                                                  connect) -> None:
    """12,500 views (of two objects just over the inline size, so each view pins) dropped at
    once: once the objects are deleted, the arena returns to its size before them."""
    cluster = await make_cluster(1)
    client = await connect(cluster.sockets[0])

    async def store() -> dict[str, int]:
        return (await client.status())["local"]["store"]

    base = (await store())["arena_used"]
    elems = INLINE_MAX // 8 + 1
    objects = [await client.put(np.full(elems, i, dtype=np.int64)) for i in range(2)]
    with open_files_limit(max(resource.getrlimit(resource.RLIMIT_NOFILE)[0],
                              open_fds() + VIEWS + 256)):
        views = await client.gather([objects[i % 2] for i in range(VIEWS)],
                                    timeout=IO_TIMEOUT, concurrency=64)
        assert [int(v[-1]) for v in views[:4]] == [0, 1, 0, 1] and len(views) == VIEWS
        for oid in objects:
            await client.delete(oid)
        held = await store()
        assert held["pinned_deleted"] == 2 and held["arena_used"] > base, held
        del views
        gc.collect()

    async def released() -> Any:
        st = await store()
        return st["arena_used"] == base and st["pinned_deleted"] == 0 and st["objects"] == 0

    await eventually(released, timeout=60, what="every view released and the arena freed")
    await put_get_roundtrip(cluster.sockets[0], cluster.sockets[0])


async def test_a_view_past_the_descriptor_limit_is_a_typed_error_and_leaks_no_pin(
        make_cluster, connect) -> None:
    """Out of file descriptors, get raises CapacityError and releases the daemon's pin at
    once; the object is freed when deleted although its view never existed."""
    cluster = await make_cluster(1)
    client = await connect(cluster.sockets[0])

    async def store() -> dict[str, int]:
        return (await client.status())["local"]["store"]

    base = (await store())["arena_used"]
    oid = await client.put(np.ones(INLINE_MAX, dtype=np.int32))
    views = []
    with open_files_limit(open_fds() + 8), pytest.raises(hc.CapacityError):
        for _ in range(16):
            views.append(await client.get(oid, timeout=IO_TIMEOUT))
    assert views, "not even one view fitted under the raised limit"
    await client.delete(oid)
    del views
    gc.collect()

    async def released() -> Any:
        st = await store()
        return st["arena_used"] == base and st["pinned_deleted"] == 0 and st["objects"] == 0

    await eventually(released, timeout=60, what="the failed view's pin released")


async def test_client_refuses_bad_timeouts_and_honours_zero_and_inf(make_cluster,
                                                                   connect) -> None:
    """NaN, negative, -inf and non-numbers raise InvalidArgumentError before anything is sent;
    inf waits forever; 0 polls: a complete local copy is returned, a missing one times out."""
    cluster = await make_cluster(1)
    path = cluster.sockets[0]
    client = await connect(path)
    small = np.arange(5, dtype=np.int32)
    large = np.arange(INLINE_MAX, dtype=np.int32)
    small_id, large_id = await client.put(small), await client.put(large)
    missing = hc.ObjectID.random()

    for bad in BAD_TIMEOUTS:
        with pytest.raises(hc.InvalidArgumentError):
            await hc.connect(path, timeout=bad)
        with pytest.raises(hc.InvalidArgumentError):
            await client.get(small_id, timeout=bad)
        with pytest.raises(hc.InvalidArgumentError):
            await client.gather([small_id], timeout=bad)
        with pytest.raises(hc.InvalidArgumentError):
            await client.reduce([small_id], timeout=bad)
        with pytest.raises(hc.InvalidArgumentError):
            await client.reduced_inputs(missing, timeout=bad)
        with pytest.raises(hc.InvalidArgumentError):
            await client.put(small, timeout=bad)
        with pytest.raises(hc.InvalidArgumentError):
            await client.delete(missing, timeout=bad)
        with pytest.raises(hc.InvalidArgumentError):
            await client.status(timeout=bad)
    for concurrency in (0, -1, True):
        with pytest.raises(hc.InvalidArgumentError):
            await client.gather([small_id], concurrency=concurrency)
    with pytest.raises(hc.InvalidArgumentError, match=str(MAX_IDS_PER_FRAME)):
        await client.reduce([small_id] * (MAX_IDS_PER_FRAME + 1))
    for receivers in (-1, MAX_RECEIVERS + 1, True, 1.5, "8"):
        with pytest.raises(hc.InvalidArgumentError, match="receivers"):
            await client.get(small_id, receivers=receivers)  # type: ignore[arg-type]

    for wait in (0, 0.0, INF, None):
        assert np.array_equal(await client.get(small_id, timeout=wait), small)
        assert np.array_equal(await client.get(large_id, timeout=wait), large)
    with pytest.raises(hc.HopliteTimeoutError):
        await client.get(missing, timeout=0)
    [got] = await client.gather([large_id], timeout=INF)
    assert np.array_equal(got, large)
    del got
    result = await client.reduce([small_id, small_id], timeout=INF)
    assert np.array_equal(await client.get(result, timeout=INF), small * 2)
    assert await client.reduced_inputs(result, timeout=INF) == [small_id, small_id]
    for wait in (0, INF, None):  # room is there: no wait at all
        put = await client.put(large, timeout=wait)
        assert np.array_equal(await client.get(put, timeout=0), large)
    for wait in (INF, None):
        other = await hc.connect(path, timeout=wait)
        await other.close()
    with pytest.raises(hc.HopliteTimeoutError):  # a welcome needs the daemon's answer
        await hc.connect(path, timeout=0)
    for wait in (INF, None):
        assert (await client.status(timeout=wait))["local"]["store"]["objects"]
        await client.delete(await client.put(small), timeout=wait)


async def test_a_stopped_daemon_fails_each_request_within_the_callers_timeout(
        make_cluster, connect) -> None:
    """SIGSTOP: the daemon holds the socket open and answers nothing. A delete or a status,
    which it would answer at once, ends in a HopliteTimeoutError within the caller's timeout;
    once the daemon runs again, it carries the requests out, their late answers are dropped and
    the connection serves on."""
    cluster = await make_cluster(1)
    client = await connect(cluster.sockets[0])
    kept, deleted = await client.put(np.arange(5, dtype=np.int32)), await client.put(b"gone")
    cluster.kill(0, signal.SIGSTOP)
    try:
        with pytest.raises(hc.HopliteTimeoutError):
            await client.status(timeout=0.5)
        with pytest.raises(hc.HopliteTimeoutError):
            await client.delete(deleted, timeout=0.5)
    finally:
        cluster.kill(0, signal.SIGCONT)
    assert np.array_equal(await client.get(kept, timeout=IO_TIMEOUT), np.arange(5))

    async def only_kept() -> bool:  # the delete that timed out was still carried out
        return bool((await client.status(timeout=IO_TIMEOUT))["local"]["store"]["objects"] == 1)

    await eventually(only_kept, timeout=IO_TIMEOUT, what="the late delete carried out")


async def test_hostile_timeouts_on_the_unix_socket_get_typed_errors(make_cluster,
                                                                    connect) -> None:
    """Well-framed requests with NaN, negative or -inf timeouts (and a Reduce over too many
    inputs, a Get with a negative or huge receivers count) get ``invalid`` Errors with their
    request ids, a bool timeout fails the header's type check; inf and 0 are served; the
    daemon keeps serving everyone."""
    cluster = await make_cluster(1)
    path = cluster.sockets[0]
    client = await connect(path)
    small = np.arange(5, dtype=np.int32)
    oid = await client.put(small)
    fresh = hc.ObjectID.random

    requests: dict[int, tuple[bytes, str]] = {
        1: (encode_header(Get(rid=1, oid=oid, timeout=NAN)), "invalid"),
        2: (encode_header(Get(rid=2, oid=fresh(), timeout=-1.0)), "invalid"),
        3: (encode_header(Get(rid=3, oid=oid, timeout=-INF)), "invalid"),
        4: (encode_header(Reduce(rid=4, result=fresh(), inputs=[oid], op="sum", num_objects=1,
                                 timeout=NAN)), "invalid"),
        5: (encode_header(ReducedInputs(rid=5, result=fresh(), timeout=-INF)), "invalid"),
        6: (encode_header(Reduce(rid=6, result=fresh(), inputs=[oid] * (MAX_IDS_PER_FRAME + 1),
                                 op="sum", num_objects=1, timeout=None)), "invalid"),
        7: (raw_frame(Get.KIND, msgpack.packb([7, oid.binary(), True])), "protocol"),
        8: (encode_header(Get(rid=8, oid=oid, timeout=INF)), "Found"),
        9: (encode_header(Get(rid=9, oid=oid, timeout=0.0)), "Found"),
        10: (encode_header(Status(rid=10)), "StatusReply"),
        11: (encode_header(Get(rid=11, oid=oid, timeout=None, receivers=-1)), "invalid"),
        12: (encode_header(Get(rid=12, oid=fresh(), timeout=None,
                               receivers=MAX_RECEIVERS + 1)), "invalid"),
        13: (encode_header(Get(rid=13, oid=oid, timeout=None, receivers=7)), "Found"),
    }

    def exchange() -> dict[int, tuple[WireMessage, Any]]:
        conn = RawConn.unix(path)
        try:
            conn.client_handshake()
            for data, _ in requests.values():
                conn.send(data)
            frames = [conn.next_frame() for _ in requests]
            return {f.msg.rid: (f.msg, f.payload) for f in frames}
        finally:
            conn.close()

    replies = await asyncio.to_thread(exchange)
    assert sorted(replies) == sorted(requests)
    for rid, (_, want) in requests.items():
        msg, payload = replies[rid]
        if isinstance(msg, Error):
            assert msg.code == want, (rid, msg)
        else:
            assert type(msg).__name__ == want, (rid, msg)
            if isinstance(msg, Found):
                assert np.array_equal(np.frombuffer(bytes(payload), dtype=np.int32), small)
            elif isinstance(msg, StatusReply):
                assert msg.info["local"]["node_id"] == cluster.nodes[0].node_id

    assert cluster.nodes[0].running
    assert np.array_equal(await client.get(oid, timeout=IO_TIMEOUT), small)
    await put_get_roundtrip(path, path)
