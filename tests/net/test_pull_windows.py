"""``Pull.window`` on a daemon's data connection (docs/protocol.md; the halves of a broadcast
taken as two trees, docs/design.md §3): a window is served as the bytes it names, and bad
windows or offsets get a typed error on a connection that goes on serving."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import IO_TIMEOUT, assert_healthy_after_abuse

from hoplite_client.net.handshake import Identity, dial
from hoplite_client.net.protocol import FrameProtocol, Phase
from hoplite_client.wire.errors import InvalidArgumentError
from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.messages import DataStream, Error, Locate, Located, Pull

pytestmark = pytest.mark.net

SIZE = 3 * 4096 + 100


async def connection(cluster, node: int, role: str) -> FrameProtocol:  # type: ignore[no-untyped-def]
    with open(cluster.token_file, "rb") as f:
        me = Identity("window-puller", f.read().strip())
    host, port = cluster.nodes[node].listen.rsplit(":", 1)
    protocol, _ = await dial(host, int(port), role, me)
    return protocol


async def version_of(cluster, oid: ObjectID) -> bytes:  # type: ignore[no-untyped-def]
    """The put's version, from its owner shard (the other shard refuses: not its owner)."""
    for node in range(len(cluster.nodes)):
        peer = await connection(cluster, node, "peer")
        try:
            peer.send(Locate(rid=1, oid=oid, timeout=IO_TIMEOUT, exclude=[], offset=0))
            frame = await peer.next_frame(IO_TIMEOUT)
        finally:
            peer.close()
        if isinstance(frame.msg, Located):
            return frame.msg.version
    raise AssertionError("no shard located the object")


async def test_windows_are_served_and_bad_ones_refused(make_cluster, connect) -> None:  # type: ignore[no-untyped-def]
    """Bytes 4096 + 5 .. 8192 + 7 of a put, asked as window (4096, 8192 + 7) from offset 5,
    come exactly; windows that are empty, out of the object or not a pair, and an offset past
    the window, are refused as invalid arguments, and the connection serves the next Pull."""
    cluster = await make_cluster(2)
    client = await connect(cluster.sockets[0])
    data = np.arange(SIZE, dtype=np.uint32).astype(np.uint8)
    oid = await client.put(data)
    version = await version_of(cluster, oid)
    protocol = await connection(cluster, 0, "data")
    try:
        got = bytearray(4096 + 7 - 5)

        def sink(msg: DataStream, length: int) -> memoryview:
            assert length == len(got)
            return memoryview(got)

        with protocol.enter(Phase.RECEIVING, sink=sink):  # frames still queue up
            protocol.send(Pull(rid=1, oid=oid, version=version, offset=5,
                               window=[4096, 8192 + 7]))
            frame = await protocol.next_frame(IO_TIMEOUT)
        assert isinstance(frame.msg, DataStream), frame.msg
        assert (frame.msg.offset, frame.msg.size) == (5, 4096 + 7)
        assert bytes(got) == data[4096 + 5:8192 + 7].tobytes()
        bad = [([10, 10], 0), ([-1, 10], 0), ([0, SIZE + 1], 0), ([1, 2, 3], 0), ([0], 0),
               ([0, 100], 101)]
        for rid, (window, offset) in enumerate(bad, start=2):
            protocol.send(Pull(rid=rid, oid=oid, version=version, offset=offset,
                               window=window))
            frame = await protocol.next_frame(IO_TIMEOUT)
            assert isinstance(frame.msg, Error) and frame.msg.rid == rid, (window, frame.msg)
            assert frame.msg.code == InvalidArgumentError.code, (window, frame.msg)
    finally:
        protocol.close()
    await assert_healthy_after_abuse(cluster)
