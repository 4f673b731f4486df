"""Hostile combiner tasks from a member (docs/design.md §4, "A pair for the last two inputs";
docs/security.md): a ``ReduceTask`` whose input is its output asks the node to add only its
children into a stripe of a result held here. Every malformed one gets a typed error; the
daemon stays healthy and idle."""

from __future__ import annotations

from dataclasses import replace

from helpers import assert_healthy_after_abuse

from hoplite_client.net.handshake import Identity, dial
from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.messages import Error, ReduceTask

R = ObjectID.random()
GOOD = ReduceTask(rid=1, reduce_id=R, slot=0, input=R, output=R, op="sum", dtype="<f4",
                  shape=[1 << 19], children=3, start=0, lo=0, hi=2 << 20)


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
