"""Hostile ``ReduceChild`` windows from a member (docs/design.md §4, "A stripe's leaf has no
task"; docs/security.md): a child named with a window that is not its slot's stripe (other
bytes, reversed, negative, past the input, or not a pair) gets a typed error before anything
is pinned or pulled, the slot keeps no child, and the daemon stays healthy and idle. (Good
windows are what every pair, trio and striped allreduce sends: tests/cluster.)"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from helpers import assert_healthy_after_abuse, every_node_stats

import hoplite_client
from hoplite_client.net.handshake import Identity, dial
from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.messages import (
    Error,
    ReduceChild,
    ReduceDone,
    ReduceTask,
    TaskStarted,
)

ELEMENTS = 1 << 18  # float32: a 1 MiB input
LO, HI = 1 << 18, 1 << 19  # its second quarter, the slot's stripe


async def test_bad_child_windows_get_typed_errors_and_pin_nothing(make_cluster) -> None:
    cluster = await make_cluster(2)
    client = await hoplite_client.connect(cluster.sockets[0])
    try:
        data = np.arange(ELEMENTS, dtype=np.float32)
        own = await client.put(data)
        leaf = await client.put(np.ones(ELEMENTS, dtype=np.float32))
        with open(cluster.token_file, "rb") as f:
            me = Identity("member-" + ObjectID.random().hex()[:8], f.read().strip())
        node0 = cluster.nodes[0].node_id
        host, port = cluster.nodes[0].listen.rsplit(":", 1)
        protocol, _ = await dial(host, int(port), "peer", me)
        reduce_id, output = ObjectID.random(), ObjectID.random()
        try:
            protocol.send(ReduceTask(rid=1, reduce_id=reduce_id, slot=1, input=own,
                                     output=output, op="sum", dtype="<f4",
                                     shape=[(HI - LO) // 4], children=1, start=0, lo=LO,
                                     hi=HI, extras=[]))
            frame = await protocol.next_frame(30.0)
            assert isinstance(frame.msg, TaskStarted), frame.msg
            good = ReduceChild(rid=2, reduce_id=reduce_id, slot=1, child=0, node=node0,
                               oid=leaf, version=b"", start=0, until=0,
                               slot_version=frame.msg.version, window=[LO, HI])
            bad: list[list[int]] = [[0, HI - LO], [HI, LO], [-LO, HI], [LO, HI + 4],
                                    [LO], [LO, HI, HI], [LO, 1 << 62], []]
            for rid, window in enumerate(bad, start=3):
                protocol.send(replace(good, rid=rid, window=window))
                frame = await protocol.next_frame(30.0)
                assert isinstance(frame.msg, Error) and frame.msg.code == "invalid", (
                    window, frame.msg)
            stats = await every_node_stats(client, [node0])
            slots = [s for s in stats[node0]["reduce_slots"] if s["reduce"] == reduce_id.hex()]
            assert [s["children"] for s in slots] == [[]], stats[node0]["reduce_slots"]
        finally:
            protocol.send(ReduceDone(reduce_id=reduce_id))
            protocol.close()
        for oid in (own, leaf):  # nothing pinned them past the task: freed at once
            await client.delete(oid)
        stats = await every_node_stats(client, [node0])
        assert stats[node0]["store"]["pinned_deleted"] == 0
    finally:
        await client.close()
    await assert_healthy_after_abuse(cluster)
