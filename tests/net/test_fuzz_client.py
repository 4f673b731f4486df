"""Fuzzing the client protocol: well-framed requests with hostile values, on real daemons.

Every request kind a client may send is built by hand (raw msgpack, so wrong types reach the
daemon too) with values drawn from adversarial sets: sizes and counts at the edges of their
integer types, NaN and infinite timeouts, dtypes numpy cannot or must not rebuild, shapes
that disagree with sizes, id lists longer than a frame holds, unknown ops. Allowed outcomes:
a reply (a typed error for hostile values), no reply yet (a wait that is still pending), or a
closed connection (after which the fuzzer reconnects). Afterwards: both daemons alive, idle,
no traceback in their logs, every store back to empty once the ids used are deleted, no get
still waiting, and put/get still correct between them.

``make fuzz`` runs it long (``HOPLITE_FUZZ_REQUESTS``, default 300 here: every kind first, in
a random order, then kinds at random; the seed is ``HOPLITE_FUZZ_SEED``).
"""

from __future__ import annotations

import asyncio
import math
import os
import random
from collections import Counter
from typing import Any

import msgpack
from helpers import IO_TIMEOUT, RawConn, assert_healthy_after_abuse, eventually, raw_frame
from hypothesis import given, settings
from hypothesis import strategies as st

import hoplite_client as hc
from hoplite_client.wire.errors import RemoteProtocolError
from hoplite_client.wire.frames import Frame, FrameReader
from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.messages import CLIENT, Error, kinds_for

REQUESTS = int(os.environ.get("HOPLITE_FUZZ_REQUESTS", "300"))
SEED = int(os.environ.get("HOPLITE_FUZZ_SEED", "20261123"))
POOL = [ObjectID.random() for _ in range(24)]  # ids reused across requests, deleted after
OTHERS: set[bytes] = set()  # valid ids drawn outside the pool, deleted after too
REPLY_WINDOW = 0.02  # seconds to look for replies after each request (waits stay pending)
MORE_REPLIES = 0.001  # ... and for more once some came

INTS = [0, 1, -1, 7, 4096, 65537, 2**31 - 1, 2**31, 2**32, 2**53 + 1, 2**63 - 1, -(2**63),
        2**64 - 1]
FLOATS = [0.0, 0.001, 0.5, 2.0, -0.0, -1.0, math.nan, math.inf, -math.inf, 1e308, -1e-300]
DTYPES = ["<f4", "<f8", "|u1", "<i8", "O", "object", "V0", "<U0", "S0", "", "f4,f4",
          "[('a','<f4')]", "<M8[ns]", "x" * 300, "|b1", "<c16", ">f4", "float32",
          "09d76a56d9d6"]  # numpy raises SyntaxError on it (a node id)
OPS = ["sum", "max", "min", "prod", "", "SUM", "mean", "x" * 200]


def some_id(rng: random.Random, fresh_ok: bool = True) -> Any:
    """An id: mostly from the pool; sometimes a fresh valid one (only where it may name an
    object the daemon then stores, so the clean-up can delete it); sometimes not an id."""
    roll = rng.random()
    if roll < 0.85:
        return rng.choice(POOL).binary()
    if roll < 0.87 and fresh_ok:
        fresh = rng.randbytes(20)
        OTHERS.add(fresh)
        return fresh
    return rng.choice([b"", b"\x00" * 19, b"\x01" * 21, "not-bytes", 5, None])


def some_value(rng: random.Random, kind: str) -> Any:
    """A value for a field of type ``kind`` (mostly plausible, often hostile, sometimes of
    another type altogether)."""
    if rng.random() < 0.08:
        return rng.choice([None, True, "text", b"bytes", [], {}, 3, 2.5, [1, [2]]])
    if kind == "oid":
        return some_id(rng)
    if kind == "int":
        return rng.choice(INTS + [rng.randrange(0, 1 << 20)])
    if kind == "size":
        return rng.choice(INTS + [rng.randrange(0, 1 << 16) * 4, 1 << 30, 1 << 40])
    if kind == "timeout":
        return rng.choice(FLOATS + [None])
    if kind == "dtype":
        return rng.choice(DTYPES)
    if kind == "shape":
        return rng.choice([[], [0], [1], [-1], [16], [2, 8], [2**62, 2**62], [1] * 40,
                           [rng.randrange(1, 1 << 14)], ["a"], [1.5]])
    if kind == "ids":
        n = rng.choice([0, 1, 2, 3, 8, 200, 10_001, 15_000])
        return [some_id(rng, fresh_ok=False) for _ in range(n)]
    if kind == "op":
        return rng.choice(OPS)
    if kind == "bool":
        return rng.choice([True, False])
    raise AssertionError(kind)


# Field kinds of each client request, in wire order (wire/messages.py); rid first.
FIELDS: dict[str, list[str]] = {
    "Put": ["oid", "dtype", "shape"],
    "Create": ["oid", "size", "dtype", "shape"],
    "Seal": ["oid"],
    "Abort": ["oid"],
    "Get": ["oid", "timeout"],
    "Delete": ["oid"],
    "Release": ["ids"],
    "Status": [],
    "Reduce": ["oid", "ids", "op", "int", "timeout"],
    "Allreduce": ["oid", "ids", "op", "bool", "timeout"],
    "ReducedInputs": ["oid", "timeout"],
}


def kinds_to_send(rng: random.Random, n: int) -> list[type[Any]]:
    """The kinds of ``n`` requests: every client kind once, in a random order, then kinds
    at random (with ``n`` at least the number of kinds, each is sent)."""
    kinds = list(kinds_for(CLIENT))
    first = rng.sample(kinds, len(kinds))
    return (first + [rng.choice(kinds) for _ in range(n - len(first))])[:n]


def request(rng: random.Random, rid: int, cls: type[Any] | None = None) -> tuple[str, bytes]:
    """One well-framed request of client kind ``cls`` (None: one at random): (its name, the
    frame's bytes)."""
    if cls is None:
        cls = rng.choice(list(kinds_for(CLIENT)))
    name = cls.__name__
    fields: list[Any] = [] if cls.SHAPE == "oneway" else [rid]
    fields += [some_value(rng, kind) for kind in FIELDS[name]]
    if name in ("Reduce", "Allreduce") and fields[-1] in (None, math.inf):
        fields[-1] = 1.0  # a reduce without a timeout waits for ever for inputs never put
    if rng.random() < 0.03:
        fields = fields[: rng.randrange(len(fields) + 1)]  # too few fields
    elif rng.random() < 0.03:
        fields.append("extra")
    payload = b""
    if name == "Put":
        payload = rng.randbytes(rng.choice([0, 1, 4, 64, 4096, 65536]))
    header = msgpack.packb(fields, use_bin_type=True)
    return name, raw_frame(cls.KIND, header, payload)


class Fuzzer:
    """One raw client connection at a time; reconnects when the daemon closes one."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.conn: RawConn | None = None
        self.outcomes: Counter[str] = Counter()

    def _connect(self) -> RawConn:
        conn = RawConn.unix(self.path)
        conn.client_handshake()
        conn.sock.settimeout(REPLY_WINDOW)
        return conn

    def send(self, frame: bytes) -> None:
        if self.conn is None:
            self.conn = self._connect()
        try:
            self.conn.sock.settimeout(IO_TIMEOUT)
            self.conn.send(frame)
            self._drain()
        except (BrokenPipeError, ConnectionResetError):
            self._closed()

    def _drain(self) -> None:
        """Read whatever replies have come; every one must decode as a known frame."""
        assert self.conn is not None
        self.conn.sock.settimeout(REPLY_WINDOW)
        while True:
            try:
                data = self.conn.sock.recv(1 << 20)
            except TimeoutError:
                return
            except ConnectionResetError:
                self._closed()
                return
            self.conn.sock.settimeout(MORE_REPLIES)  # the rest of a burst, if any
            if not data:
                self._closed()
                return
            for event in self.conn.reader.feed(data):  # a reply that is no frame raises here
                assert isinstance(event, Frame), f"undecodable reply: {event!r}"
                msg = event.msg
                self.outcomes["error " + msg.code if isinstance(msg, Error) else "reply"] += 1

    def _closed(self) -> None:
        assert self.conn is not None
        self.conn.close()
        self.conn = None
        self.outcomes["closed"] += 1

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


async def test_hostile_client_requests(make_cluster, connect) -> None:  # type: ignore[no-untyped-def]
    cluster = await make_cluster(2)
    rng = random.Random(SEED)
    fuzzers = [Fuzzer(s) for s in cluster.sockets]
    kinds: Counter[str] = Counter()

    def run() -> None:
        for rid, cls in enumerate(kinds_to_send(rng, REQUESTS), start=1):
            name, frame = request(rng, rid, cls)
            kinds[name] += 1
            fuzzers[rid % 2].send(frame)
        for f in fuzzers:
            f.close()

    try:
        await asyncio.to_thread(run)
    finally:
        for f in fuzzers:
            f.close()
    outcomes = fuzzers[0].outcomes + fuzzers[1].outcomes
    print(f"seed {SEED}: {REQUESTS} requests {dict(kinds)}; outcomes {dict(outcomes)}")
    assert outcomes["reply"] + sum(v for k, v in outcomes.items() if k.startswith("error")) > 0
    if len(kinds_for(CLIENT)) <= REQUESTS:
        assert set(kinds) == {cls.__name__ for cls in kinds_for(CLIENT)}, kinds

    for node in cluster.nodes:
        assert node.running, f"daemon {node.index} died: {cluster.log_tail(node)}"
    clients = [await connect(s) for s in cluster.sockets]
    for oid in [*POOL, *map(ObjectID, OTHERS)]:  # whatever the fuzzing put or reduced
        try:
            await clients[0].delete(oid)
        except hc.HopliteError:
            pass

    states: list[tuple[int, int, int, int]] = []

    async def settled() -> bool:
        states.clear()
        for client in clients:
            info = (await client.status())["local"]
            store = info["store"]
            states.append((store["objects"], store["pinned_deleted"], store["arena_used"],
                           info["directory"]["waiting_gets"]))
        return all(state == (0, 0, 0, 0) for state in states)
    try:
        await eventually(settled, what="stores empty and no get waiting", timeout=60)
    except AssertionError:
        raise AssertionError(f"after the fuzzing, (objects, pinned deleted, arena bytes, "
                             f"waiting gets) per node: {states}") from None

    await assert_healthy_after_abuse(cluster)


@settings(max_examples=3)
@given(seed=st.integers(0, 2**32 - 1))
def test_requests_are_well_framed(seed: int) -> None:
    """The generator's frames are frames: each decodes to one event (a message, or a header
    the reader refuses but skips) or, over the header limit, to the fatal error a daemon
    closes the connection on."""
    rng = random.Random(seed)
    seen: Counter[str] = Counter()
    for rid in range(300):
        _, frame = request(rng, rid)
        try:
            events = FrameReader().feed(frame)
        except RemoteProtocolError:
            seen["fatal"] += 1
            continue
        assert len(events) == 1
        seen["frame" if isinstance(events[0], Frame) else "refused"] += 1
    assert seen["frame"] and seen["refused"], seen
