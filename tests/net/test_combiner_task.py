"""Hostile combiner tasks from a member (docs/design.md §4, "A pair for the last two inputs";
docs/security.md): a ``ReduceTask`` whose input is its output asks the node to add only its
children into a stripe of a result held here. Every malformed one gets a typed error; the
daemon stays healthy and idle. So do tasks whose extra inputs (``extras``, §4 "Several inputs
on one node") are missing, unlike the task's own input, or given to a combiner."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from helpers import assert_healthy_after_abuse, every_node_stats

import hoplite_client
from hoplite_client.net.handshake import Identity, dial
from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.messages import Error, ReduceTask

R = ObjectID.random()
GOOD = ReduceTask(rid=1, reduce_id=R, slot=0, input=R, output=R, op="sum", dtype="<f4",
                  shape=[1 << 19], children=3, start=0, lo=0, hi=2 << 20, extras=[])


CASES: list[tuple[dict[str, object], str]] = [
    ({}, "not_found"),  # no result here to compute into
    ({"hi": 0}, "invalid"),  # a combiner computes a stripe
    ({"reduce_id": ObjectID.random()}, "invalid"),  # not in place
    ({"children": 0}, "invalid"),  # nothing to add
    ({"dtype": "O"}, "invalid"), ({"dtype": "no-such"}, "invalid"),
    ({"lo": 2, "hi": 6, "shape": [1]}, "invalid"),  # not on elements
    ({"shape": [7]}, "invalid"), ({"lo": 8, "hi": 4}, "invalid"),
]


async def test_malformed_combiner_tasks_get_typed_errors(make_cluster) -> None:
    cluster = await make_cluster(2)
    with open(cluster.token_file, "rb") as f:
        me = Identity("member-" + ObjectID.random().hex()[:8], f.read().strip())
    host, port = cluster.nodes[0].listen.rsplit(":", 1)
    protocol, _ = await dial(host, int(port), "peer", me)
    try:
        for rid, (change, code) in enumerate(CASES, start=1):
            protocol.send(replace(GOOD, rid=rid, **change))  # type: ignore[arg-type]
            frame = await protocol.next_frame(30.0)
            assert isinstance(frame.msg, Error) and frame.msg.code == code, (change, frame.msg)
    finally:
        protocol.close()
    await assert_healthy_after_abuse(cluster)


async def test_tasks_with_bad_extra_inputs_get_typed_errors_and_pin_nothing(
        make_cluster) -> None:
    """A task over an input held on node 0 whose extras are missing, of another type or
    shape, or many missing ones: each refused with a typed error before anything is pinned,
    so the input can still be deleted; then a good task with that input as its own extra."""
    cluster = await make_cluster(2)
    client = await hoplite_client.connect(cluster.sockets[0])
    try:
        own = await client.put(np.ones(1 << 18, dtype=np.float32))
        other = await client.put(np.ones(1 << 18, dtype=np.float64))
        shorter = await client.put(np.ones(1 << 10, dtype=np.float32))
        with open(cluster.token_file, "rb") as f:
            me = Identity("member-" + ObjectID.random().hex()[:8], f.read().strip())
        host, port = cluster.nodes[0].listen.rsplit(":", 1)
        protocol, _ = await dial(host, int(port), "peer", me)
        task = ReduceTask(rid=1, reduce_id=ObjectID.random(), slot=0, input=own,
                          output=ObjectID.random(), op="sum", dtype="<f4", shape=[1 << 18],
                          children=1, start=0, lo=0, hi=0, extras=[])
        cases: list[tuple[list[ObjectID], str]] = [
            ([ObjectID.random()], "not_found"), ([other], "invalid"), ([shorter], "invalid"),
            ([own, ObjectID.random()], "not_found"),
            ([ObjectID.random() for _ in range(5000)], "not_found"),
        ]
        try:
            for rid, (extras, code) in enumerate(cases, start=1):
                protocol.send(replace(task, rid=rid, extras=extras))
                frame = await protocol.next_frame(30.0)
                assert isinstance(frame.msg, Error) and frame.msg.code == code, (extras,
                                                                                  frame.msg)
            combiner = replace(GOOD, rid=len(cases) + 1, extras=[own])
            protocol.send(combiner)
            frame = await protocol.next_frame(30.0)
            assert isinstance(frame.msg, Error), frame.msg
        finally:
            protocol.close()
        for oid in (own, other, shorter):  # nothing pinned them: freed at once
            await client.delete(oid)
        node0 = cluster.nodes[0].node_id
        stats = await every_node_stats(client, [node0])
        assert stats[node0]["store"]["pinned_deleted"] == 0
    finally:
        await client.close()
    await assert_healthy_after_abuse(cluster)
