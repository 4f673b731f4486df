"""Ring streams nobody asked for, on a daemon's data connections (docs/protocol.md: a
``RingOpen`` between pulls, then ``RingSegment``s): refused typed, the connection still
serving pulls, and the daemon healthy afterwards."""

from __future__ import annotations

import asyncio

import pytest
from helpers import IO_TIMEOUT, assert_healthy_after_abuse

from hoplite_client.net.handshake import Identity, dial
from hoplite_client.net.protocol import FrameProtocol
from hoplite_client.wire.errors import HopliteTimeoutError
from hoplite_client.wire.frames import encode_header
from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.messages import Error, Pull, RingOpen, RingSegment
from hoplited.collectives.ring_member import OPEN_TIMEOUT
from hoplited.memory.store import VERSION_SIZE

pytestmark = pytest.mark.net


async def data_connection(cluster, node: int, name: str) -> FrameProtocol:  # type: ignore[no-untyped-def]
    with open(cluster.token_file, "rb") as f:
        me = Identity(name, f.read().strip())
    host, port = cluster.nodes[node].listen.rsplit(":", 1)
    protocol, _ = await dial(host, int(port), "data", me)
    return protocol


async def test_a_ring_stream_nobody_expects_is_refused_and_pulls_go_on(make_cluster) -> None:  # type: ignore[no-untyped-def]
    """A RingOpen for a result no ring runs is refused with a timeout error once the
    daemon has waited for a task that never comes; a Pull on the same connection is then
    answered as usual (here: no such copy)."""
    cluster = await make_cluster(2)
    protocol = await data_connection(cluster, 0, "stranger")
    try:
        protocol.send(RingOpen(rid=1, result=ObjectID.random(), version=bytes(VERSION_SIZE)))
        frame = await protocol.next_frame(OPEN_TIMEOUT + IO_TIMEOUT)
        assert isinstance(frame.msg, Error) and frame.msg.rid == 1
        assert frame.msg.code == HopliteTimeoutError.code
        protocol.send(Pull(rid=2, oid=ObjectID.random(), version=b"v" * 8, offset=0))
        frame = await protocol.next_frame(IO_TIMEOUT)
        assert isinstance(frame.msg, Error) and frame.msg.rid == 2
    finally:
        protocol.close()
    await assert_healthy_after_abuse(cluster)


async def test_segments_without_a_ring_are_refused(make_cluster) -> None:  # type: ignore[no-untyped-def]
    """Segments sent with no RingOpen get a protocol error (small ones) or a closed
    connection (larger than a small payload), never a write into anyone's memory."""
    cluster = await make_cluster(2)
    protocol = await data_connection(cluster, 1, "stranger")
    try:
        protocol.write_raw(memoryview(encode_header(RingSegment(index=0), 4096)))
        protocol.write_raw(memoryview(bytes(4096)))
        frame = await protocol.next_frame(IO_TIMEOUT)
        assert isinstance(frame.msg, Error) and frame.msg.code == "protocol"
        protocol.write_raw(memoryview(encode_header(RingSegment(index=0), 4 << 20)))
        protocol.write_raw(memoryview(bytes(4 << 20)))
        await asyncio.wait_for(protocol.closed, IO_TIMEOUT)
    finally:
        protocol.close()
    await assert_healthy_after_abuse(cluster)
