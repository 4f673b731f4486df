"""Little for the unauthenticated, and bounded per-client state, piece by piece: the
rate-limited log, the frame reader's header cap, a connection in its handshake closed at its
first bad frame, the dispatcher's cap on a client's waits and the status record's samples
(tests/net/test_unauthenticated.py and tests/net/test_client_limits.py drive real daemons)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
from typing import Any

import msgpack
import pytest
from helpers import errors_in, raw_frame, recv_until_close

from hoplite_client.net.log_limit import LimitedLog, limited
from hoplite_client.net.protocol import FrameProtocol, Phase
from hoplite_client.wire import auth
from hoplite_client.wire.errors import RemoteProtocolError
from hoplite_client.wire.frames import (
    HANDSHAKE_MAX_HEADER,
    MAX_HEADER,
    PRELUDE,
    PRELUDE_SIZE,
    SUPPORTED_VERSIONS,
    Frame,
    FrameReader,
    encode,
    encode_header,
)
from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.messages import (
    CLIENT,
    Accepted,
    Auth,
    ClientHello,
    ClientWelcome,
    Error,
    Get,
    Hello,
    Ok,
    Ping,
    ReducedInputs,
    Release,
    Welcome,
    kinds_for,
)
from hoplited.dispatch import Dispatcher
from hoplited.status import CLUSTER_SAMPLE, _cut
from hoplited.tasks import Tasks

OID = ObjectID(bytes(20))


# --- the rate-limited log --------------------------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_first_line_is_logged_then_one_per_interval_with_the_count(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    logger = logging.getLogger("test.limited")
    warn = LimitedLog(logger, interval=10.0, clock=clock)
    with caplog.at_level(logging.WARNING, logger="test.limited"):
        for i in range(1000):
            warn("bad frame %d", i)
            clock.now += 0.001
        assert [r.getMessage() for r in caplog.records] == ["bad frame 0"]
        assert warn.left_out == 999
        clock.now += 10.0
        warn("bad frame %d", 1000)
    assert [r.getMessage() for r in caplog.records] == [
        "bad frame 0", "bad frame 1000 (and 999 more like it in the last 10 s)"]
    assert warn.left_out == 0


async def test_lines_left_out_are_counted_once_the_interval_ends(
        caplog: pytest.LogCaptureFixture) -> None:
    """With a loop running, the count goes out when the interval ends, even if nothing more
    comes: a flood that stopped is still reported."""
    logger = logging.getLogger("test.limited.flush")
    warn = LimitedLog(logger, interval=0.05)
    with caplog.at_level(logging.WARNING, logger="test.limited.flush"):
        for i in range(5):
            warn("refused %s", i)
        async with asyncio.timeout(10):  # the count's line, once the interval ends
            while len(caplog.records) < 2:
                await asyncio.sleep(0.01)
    assert [r.getMessage() for r in caplog.records] == [
        "refused 0", "refused 4 (and 4 more like it in the last 0.05 s)"]


def test_one_limited_log_per_logger_and_kind() -> None:
    logger = logging.getLogger("test.limited.kinds")
    assert limited(logger, "a") is limited(logger, "a")
    assert limited(logger, "a") is not limited(logger, "b")


# --- the frame reader's header cap -----------------------------------------------------------
def _prelude(header_len: int) -> bytes:
    return PRELUDE.pack(b"HP", SUPPORTED_VERSIONS[-1], Ping.KIND, header_len, 0)


@pytest.mark.parametrize("read_ahead", [0, 4096], ids=["exact-parts", "read-ahead"])
def test_a_header_over_the_cap_breaks_the_reader_before_anything_is_allocated(
        read_ahead: int) -> None:
    reader = FrameReader(read_ahead=read_ahead, max_header=HANDSHAKE_MAX_HEADER)
    with pytest.raises(RemoteProtocolError, match="out of range"):
        reader.feed(_prelude(HANDSHAKE_MAX_HEADER + 1))
    assert reader.broken is not None
    # nothing was made for the header: the reader still holds only its prelude's part
    assert len(reader._part) == PRELUDE_SIZE


@pytest.mark.parametrize("read_ahead", [0, 4096], ids=["exact-parts", "read-ahead"])
def test_raising_the_cap_takes_larger_headers_from_the_next_frame_on(read_ahead: int) -> None:
    """A notice after the handshake may list hundreds of ids: its header passes once the
    owner raised the cap, whether read in parts or whole from the read-ahead scratch."""
    release = Release(oids=[OID] * 300)
    frame = encode_header(release)
    assert len(frame) - PRELUDE_SIZE > HANDSHAKE_MAX_HEADER
    with pytest.raises(RemoteProtocolError):
        FrameReader(read_ahead=read_ahead, max_header=HANDSHAKE_MAX_HEADER).feed(frame)
    reader = FrameReader(read_ahead=read_ahead, max_header=HANDSHAKE_MAX_HEADER)
    assert [e.msg for e in reader.feed(encode_header(Ping(rid=1)))] == [Ping(rid=1)]
    reader.max_header = MAX_HEADER
    assert [e.msg for e in reader.feed(frame)] == [release]


def test_the_default_cap_is_max_header() -> None:
    assert FrameReader().max_header == MAX_HEADER


def test_every_handshake_message_fits_the_cap_with_room_to_spare() -> None:
    """The largest of each handshake kind a daemon, tool or client sends: node ids of 64
    characters (daemons use 12), an Error naming an IPv6 address, a refusal quoting a peer's
    id; each is under an eighth of the cap."""
    node = "n" * 64
    nonce, proof = auth.new_nonce(), b"p" * 32
    address = "[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff]:65535"
    largest = [
        Hello(versions=SUPPORTED_VERSIONS, node_id=node, nonce=nonce, role="tool"),
        Welcome(version=SUPPORTED_VERSIONS[-1], node_id=node, nonce=nonce, proof=proof),
        Auth(proof=proof), Accepted(version=SUPPORTED_VERSIONS[-1]),
        ClientHello(versions=SUPPORTED_VERSIONS, pid=2**31),
        ClientWelcome(version=SUPPORTED_VERSIONS[-1], node_id=node, arena_size=2**50),
        Error(code="connection_lost", message=f"inbound from {address}: no answer within "
                                              f"10.0s", data={}),
        Error(code="auth", message=f"peer {node!r} does not know the cluster token", data={}),
        Error(code="version", message=f"peer speaks versions {list(range(20))}, we speak "
                                      f"{SUPPORTED_VERSIONS}", data={}),
    ]
    for msg in largest:
        assert len(encode_header(msg)) - PRELUDE_SIZE <= HANDSHAKE_MAX_HEADER // 8, msg


# --- a connection in its handshake -----------------------------------------------------------
async def _connected(authenticated: bool) -> tuple[FrameProtocol, socket.socket]:
    ours, theirs = socket.socketpair()
    loop = asyncio.get_running_loop()
    _, protocol = await loop.create_connection(
        lambda: FrameProtocol(name="inbound from test", authenticated=authenticated), sock=ours)
    theirs.settimeout(10)
    return protocol, theirs


def _unknown_kinds(n: int) -> bytes:
    return raw_frame(250, msgpack.packb([7])) * n


async def test_the_first_bad_frame_before_the_handshake_closes_the_connection_unanswered(
        caplog: pytest.LogCaptureFixture) -> None:
    protocol, theirs = await _connected(authenticated=False)
    try:
        with caplog.at_level(logging.WARNING, logger="hoplite.protocol"):
            theirs.sendall(_unknown_kinds(1000))
            async with asyncio.timeout(10):
                await protocol.closed
            answer, closed = await asyncio.to_thread(recv_until_close, theirs, 10)
    finally:
        theirs.close()
    assert closed and answer == b""  # not a byte sent
    assert len(caplog.records) <= 1


async def test_a_header_over_the_handshake_cap_is_answered_once_and_closes() -> None:
    protocol, theirs = await _connected(authenticated=False)
    try:
        theirs.sendall(_prelude(MAX_HEADER))
        async with asyncio.timeout(10):
            await protocol.closed
        answer, closed = await asyncio.to_thread(recv_until_close, theirs, 10)
    finally:
        theirs.close()
    assert closed
    assert [e.code for e in errors_in(answer)] == ["protocol"]


async def test_once_authenticated_bad_frames_are_answered_and_large_headers_read() -> None:
    got: list[Any] = []
    protocol, theirs = await _connected(authenticated=False)
    protocol.authenticate()
    protocol.enter(Phase.CHANNEL, handler=lambda frame: got.append(frame.msg))
    padded = msgpack.packb([3, "x" * (2 * HANDSHAKE_MAX_HEADER)])
    theirs.sendall(_unknown_kinds(2) + raw_frame(Ping.KIND, padded)
                   + b"".join(bytes(b) for b in encode(Ping(rid=4))))
    reader = FrameReader()
    answers: list[Any] = []
    try:
        async with asyncio.timeout(10):
            while len(answers) < 3:
                data = await asyncio.to_thread(theirs.recv, 65536)
                answers += [e.msg for e in reader.feed(data)]
    finally:
        theirs.close()
        protocol.close()
    assert [(type(a), a.rid) for a in answers] == [(Error, 7), (Error, 7), (Error, 3)]
    assert got == [Ping(rid=4)] and not protocol.closed.done()


# --- a client's waits ------------------------------------------------------------------------
def _collect(sent: list[Any]) -> Any:
    return lambda reply, payload, rid: sent.append(dataclasses.replace(reply, rid=rid))


async def test_waits_beyond_the_cap_are_refused_with_the_limit_and_the_rest_complete() -> None:
    gate = asyncio.Event()

    async def wait(origin: str, msg: Any, payload: Any) -> Ok:
        await gate.wait()
        return Ok()

    table: dict[type, Any] = {cls: (lambda origin, msg, payload: Ok())
                              for cls in kinds_for(CLIENT)}
    table[Get] = table[ReducedInputs] = wait
    tasks = Tasks()
    dispatcher = Dispatcher(CLIENT, table, tasks, capped=(Get, ReducedInputs), max_waiting=3)
    sent: list[Any] = []
    for rid in range(1, 6):
        msg = (Get(rid=rid, oid=OID, timeout=None) if rid % 2
               else ReducedInputs(rid=rid, result=OID, timeout=None))
        dispatcher.deliver("client", Frame(msg), _collect(sent))
    assert [(s.rid, s.code, s.data) for s in sent] == [(4, "capacity", {"limit": 3}),
                                                       (5, "capacity", {"limit": 3})]
    assert dispatcher.waiting == 3
    gate.set()
    await asyncio.sleep(0.01)
    assert sorted(s.rid for s in sent[2:]) == [1, 2, 3] and dispatcher.waiting == 0
    dispatcher.deliver("client", Frame(Get(rid=6, oid=OID, timeout=None)), _collect(sent))
    await asyncio.sleep(0.01)
    assert sent[-1] == Ok(rid=6) and len(tasks) == 0


# --- the status record -----------------------------------------------------------------------
def test_a_cluster_record_shares_its_samples_out_and_keeps_every_count() -> None:
    """Each node's lists under way are cut to its share of CLUSTER_SAMPLE (their counts and
    every other field kept), so the reply fits its frame however many nodes are busy."""
    busy = {"node_id": "n", "transfers_count": 40, "transfers": [{"object": "ab"}] * 32,
            "members": [{"node_id": "m"}] * 40, "clients": 2}
    nodes = 64
    share = CLUSTER_SAMPLE // nodes
    cut = _cut(busy, share)
    assert cut == {**busy, "transfers": [{"object": "ab"}] * share}
    assert len(busy["transfers"]) == 32  # the record given is left as it was
    record = {"local": busy, "nodes": [_cut(busy, share)] * nodes}
    assert len(msgpack.packb(record)) < MAX_HEADER // 2
