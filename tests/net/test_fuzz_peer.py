"""Fuzzing the peer protocol after the handshake: a member that holds the token but sends
well-framed requests with hostile values (docs/security.md: such a member is trusted with the
data, not with the daemon's health).

Every kind a peer may send is built as raw msgpack from its field types (wire/messages.py),
with values from adversarial sets, over a real authenticated peer connection (``dial`` with
the cluster's token). Allowed outcomes: a reply (typed errors for hostile values) or a closed
connection, after which the fuzzer dials again. Afterwards: both daemons alive, idle, no
traceback in their logs (a handler's untyped failure logs one), and put/get still correct
between them. An ``Error`` reply may carry any code: a hostile member may record a failure
of its own making (``FailEntry``), which later answers for that id. Lying is not refused —
a hostile member may publish holdings it does not have — so the stores are not checked for
emptiness here (tests/net/test_fuzz_client.py does that for clients).

``HOPLITE_FUZZ_REQUESTS`` and ``HOPLITE_FUZZ_SEED`` as for the client fuzzer (300 here: every
kind first, in a random order, then kinds at random).
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
from collections import Counter
from typing import Any

import msgpack
from helpers import assert_healthy_after_abuse, eventually, local_stats, raw_frame

from hoplite_client.net.handshake import Identity, dial
from hoplite_client.net.protocol import FrameProtocol
from hoplite_client.wire.errors import HopliteError
from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.messages import PEER, Error, kinds_for

REQUESTS = int(os.environ.get("HOPLITE_FUZZ_REQUESTS", "300"))
SEED = int(os.environ.get("HOPLITE_FUZZ_SEED", "20261123"))
REPLY_WINDOW = 0.02
MORE_REPLIES = 0.001
POOL = [ObjectID.random() for _ in range(24)]  # ids reused across requests
INTS = [0, 1, -1, 3, 65536, 2**31, 2**63 - 1, -(2**63), 2**64 - 1]
FLOATS = [0.0, 0.01, 1.0, -1.0, math.nan, math.inf, -math.inf, 1e308]
STRS = ["", "sum", "<f4", "O", "09d76a56d9d6", "nonexistent-node", "x" * 5000, "\udcff".encode(
    "utf-8", "surrogateescape").decode("latin-1")]


def value(rng: random.Random, typ: str, nodes: list[str]) -> Any:
    """A value for a field declared ``typ``: mostly of that type, hostile within it, and
    sometimes of another type altogether."""
    if rng.random() < 0.08:
        return rng.choice([None, True, "text", b"bytes", [], {}, 3, 2.5, [1, [2]]])
    if typ.startswith("list[ObjectID]"):
        return [rng.choice(POOL).binary() for _ in range(rng.choice([0, 1, 5, 20_000]))]
    if "ObjectID" in typ:
        return rng.choice(POOL).binary() if rng.random() < 0.9 else rng.randbytes(
            rng.choice([0, 19, 20, 21]))
    if typ.startswith("float"):
        return rng.choice(FLOATS + [None])
    if typ == "int":
        return rng.choice(INTS + [rng.randrange(0, 1 << 24)])
    if typ == "str":
        return rng.choice(STRS + nodes)
    if typ == "bytes":
        return rng.randbytes(rng.choice([0, 8, 20, 4096]))
    if typ == "bool":
        return rng.choice([True, False])
    if typ == "list[int]":
        return rng.choice([[], [4], [-1], [2**62, 2**62], [1] * 40])
    if typ == "list[str]":
        return rng.choice([[], nodes, ["ghost"] * 3, ["x" * 1000] * 100])
    # a nested record (MemberInfo, Holding...): a plausible-looking or a broken array
    return rng.choice([[], ["node", "198.51.100.7", 1, "/nonexistent.sock", "h"],
                       [["junk"] * 3] * 3, [[rng.choice(POOL).binary(), 5, 4, b"v"]]])


def kinds_to_send(rng: random.Random, n: int) -> list[type[Any]]:
    """The kinds of ``n`` requests: every peer kind once, in a random order, then kinds at
    random (with ``n`` at least the number of kinds, each is sent)."""
    kinds = list(kinds_for(PEER))
    first = rng.sample(kinds, len(kinds))
    return (first + [rng.choice(kinds) for _ in range(n - len(first))])[:n]


def request(rng: random.Random, rid: int, nodes: list[str], cls: type[Any]) -> bytes:
    types = [str(f.type) for f in dataclasses.fields(cls)]
    fields = [rid if i == 0 and cls.SHAPE == "request" else value(rng, t, nodes)
              for i, t in enumerate(types)]
    payload = rng.randbytes(rng.choice([0, 16, 4096])) if cls.PAYLOAD == "small" else b""
    return raw_frame(cls.KIND, msgpack.packb(fields, use_bin_type=True), payload)


async def test_hostile_peer_requests(make_cluster) -> None:  # type: ignore[no-untyped-def]
    cluster = await make_cluster(2)
    with open(cluster.token_file, "rb") as f:
        me = Identity("fuzzer-" + ObjectID.random().hex()[:8], f.read().strip())
    nodes = [n.node_id for n in cluster.nodes]
    rng = random.Random(SEED)
    outcomes: Counter[str] = Counter()
    sent: Counter[str] = Counter()
    conns: dict[int, FrameProtocol] = {}

    async def conn(i: int) -> FrameProtocol:
        if i not in conns or conns[i].closed.done():
            host, port = cluster.nodes[i].listen.rsplit(":", 1)
            conns[i], _ = await dial(host, int(port), "peer", me)
        return conns[i]

    try:
        for rid, cls in enumerate(kinds_to_send(rng, REQUESTS), start=1):
            protocol = await conn(rid % 2)
            protocol.write_raw(memoryview(request(rng, rid, nodes, cls)))
            sent[cls.__name__] += 1
            window = REPLY_WINDOW
            try:
                while True:
                    frame = await protocol.next_frame(window)
                    window = MORE_REPLIES  # the rest of a burst, if any
                    outcomes["error " + frame.msg.code if isinstance(frame.msg, Error)
                             else "reply"] += 1
            except HopliteError:  # nothing more for now, or the daemon closed the connection
                if protocol.closed.done():
                    outcomes["closed"] += 1
            except TimeoutError:
                pass
    finally:
        for protocol in conns.values():
            protocol.close()
    print(f"seed {SEED}: {REQUESTS} peer requests {dict(sent)}; outcomes {dict(outcomes)}")
    assert sum(outcomes.values()) > 0
    if len(kinds_for(PEER)) <= REQUESTS:
        assert set(sent) == {cls.__name__ for cls in kinds_for(PEER)}, sent

    for node in cluster.nodes:
        assert node.running, f"daemon {node.index} died: {cluster.log_tail(node)}"
    token = me.token

    async def fakes_judged_dead() -> bool:
        """No daemon counts a member the fuzzer announced (one of neither daemon) alive."""
        for node in cluster.nodes:
            members = (await local_stats(node, token))["members"]
            if any(m["alive"] and m["node_id"] not in nodes for m in members):
                return False
        return True

    await eventually(fakes_judged_dead, timeout=60, what="the announced members judged dead")
    await assert_healthy_after_abuse(cluster)
