"""Bounded per-client state, against a real daemon: the status record stays within its frame
however many gets wait, a client's waits beyond the cap get a typed error at once while those
within complete, and releases of ids not held cost a log line, not one per id."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import numpy as np
import pytest
from helpers import IO_TIMEOUT, RawConn, eventually

import hoplite_client
from hoplite_client.wire.errors import CapacityError
from hoplite_client.wire.frames import encode_header
from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.messages import Release, Status, StatusReply
from hoplited.tools.cli.main import _status_lines

PENDING = 2_000
CAP = 1_024  # hoplited.dispatch.MAX_CLIENT_WAITS
SAMPLE = 32  # hoplited.status.STATUS_SAMPLE


async def _waiting(client: hoplite_client.Client, n: int) -> list[asyncio.Task[object]]:
    """``n`` gets of ids nobody puts, left waiting (timeout: none)."""
    return [asyncio.ensure_future(client.get(ObjectID.random())) for _ in range(n)]


async def _cancel(tasks: list[asyncio.Task[object]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_status_answers_with_counts_and_a_sample_under_2000_waiting_gets(
        make_cluster) -> None:
    cluster = await make_cluster(1)
    path = cluster.sockets[0]
    async with await hoplite_client.connect(path) as a, \
            await hoplite_client.connect(path) as b:
        gets = await _waiting(a, PENDING // 2) + await _waiting(b, PENDING // 2)
        try:
            async def all_waiting() -> dict[str, Any] | None:
                info = await a.status(timeout=IO_TIMEOUT)
                return info if info["local"].get("transfers_count") == PENDING else None

            info = await eventually(all_waiting, what=f"{PENDING} gets waiting")
            local = info["local"]
            assert len(local["transfers"]) == SAMPLE
            assert all(t["phase"] and "object" in t for t in local["transfers"])
            assert local["reduce_slots_count"] == 0 and local["reduce_slots"] == []
            assert not any(g.done() for g in gets)
            # ``hoplite status`` shows the sample and says how many it left out
            lines = _status_lines(info)
            assert f"  ... and {PENDING - SAMPLE} more on {local['node_id']}" in lines
        finally:
            await _cancel(gets)


async def test_waits_beyond_the_cap_get_a_typed_error_and_those_within_complete(
        make_cluster) -> None:
    cluster = await make_cluster(1)
    path = cluster.sockets[0]
    async with await hoplite_client.connect(path) as client, \
            await hoplite_client.connect(path) as putter:
        ids = [ObjectID.random() for _ in range(CAP)]
        within = [asyncio.ensure_future(client.get(oid, timeout=IO_TIMEOUT * 4)) for oid in ids]
        try:
            async def all_waiting() -> bool:
                local = (await putter.status(timeout=IO_TIMEOUT))["local"]
                return local.get("transfers_count") == CAP

            await eventually(all_waiting, what=f"{CAP} gets waiting")
            with pytest.raises(CapacityError) as refused:
                await client.get(ObjectID.random(), timeout=IO_TIMEOUT)
            assert refused.value.data == {"limit": CAP}
            with pytest.raises(CapacityError):
                await client.reduced_inputs(ObjectID.random(), timeout=IO_TIMEOUT)
            # another connection has waits of its own
            other = asyncio.ensure_future(putter.get(ids[0], timeout=IO_TIMEOUT))
            for i, oid in enumerate(ids[:5]):
                await putter.put(np.full(10, i, dtype=np.int64), object_id=oid)
            for i, get in enumerate(within[:5]):
                np.testing.assert_array_equal(await get, np.full(10, i, dtype=np.int64))
            np.testing.assert_array_equal(await other, np.zeros(10, dtype=np.int64))
            # five finished: five more may wait again
            extra = ObjectID.random()
            late = asyncio.ensure_future(client.get(extra, timeout=IO_TIMEOUT))
            await putter.put(np.arange(3), object_id=extra)
            np.testing.assert_array_equal(await late, np.arange(3))
            assert not any(g.done() for g in within[5:])
        finally:
            await _cancel(within)


async def test_a_release_of_ids_not_held_costs_a_line_of_log(make_cluster) -> None:
    """Two Release notices of 10,000 ids the client never got: at most a line or two of log
    (one per notice at most, rate-limited), and the connection still answers."""
    cluster = await make_cluster(1)
    node = cluster.nodes[0]
    conn = RawConn.unix(node.socket)
    try:
        await asyncio.to_thread(conn.client_handshake)
        # a first request answered: the daemon has written its lines about the new client
        # (it logs as it handles each message, before it answers the next)
        conn.send(encode_header(Status(rid=1)))
        assert (await asyncio.to_thread(conn.next_frame)).msg.rid == 1
        before = os.path.getsize(node.log_path)
        for rid in (2, 3):
            conn.send(encode_header(Release(oids=[ObjectID.random() for _ in range(10_000)])))
            conn.send(encode_header(Status(rid=rid)))  # answered after the Release is handled
            reply = (await asyncio.to_thread(conn.next_frame)).msg
            assert isinstance(reply, StatusReply) and reply.rid == rid
        grown = os.path.getsize(node.log_path) - before
    finally:
        conn.close()
    print(f"two releases of 10,000 ids not held: log +{grown} bytes")
    assert grown < 600, f"the releases wrote {grown} bytes of log"
