"""A ring member whose successor stops reading (docs/design.md §5, "Sends to the dead"): two
real ring members in real stores, streaming to each other over socket pairs."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from hoplite_client.net.protocol import FrameProtocol
from hoplite_client.wire.errors import HopliteError, ObjectDeletedError
from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.messages import Ok, RingOpen, RingReport, RingTask, WireMessage
from hoplited.collectives.ring import ring_schedule
from hoplited.collectives.ring_member import RingDeps, RingMember
from hoplited.memory.arena import Arena
from hoplited.memory.store import VERSION_SIZE, ObjectStore, StoredObject
from hoplited.tasks import Tasks
from hoplited.transfer.traffic import Traffic

# 32 MiB of float32: each member's last segments (16 MiB) are far more than a connection
# buffers (FrameProtocol's 4 MiB high water and the kernel's), so a successor that stops
# reading stops its predecessor's stream
ELEMENTS = 8 << 20
SIZE = ELEMENTS * 4
WAIT = 60.0  # bounds a bug only: every step takes well under a second
CALLER = "caller"


@dataclass
class Directory:
    """The directory as a member sees it: records what the member publishes."""

    published: list[StoredObject] = field(default_factory=list)
    refusal: HopliteError | None = None  # what the owner answers a publish with, if not Ok

    async def publish(self, obj: StoredObject, moved: bool = False) -> None:
        if self.refusal is not None:
            raise self.refusal
        self.published.append(obj)


@dataclass
class Node:
    """One daemon's part: its store, tasks, what it told the caller, and its ring member."""

    name: str
    store: ObjectStore
    tasks: Tasks = field(default_factory=Tasks)
    directory: Directory = field(default_factory=Directory)
    told: list[WireMessage] = field(default_factory=list)
    member: RingMember | None = None
    forgotten: asyncio.Event = field(default_factory=asyncio.Event)
    inbound: FrameProtocol | None = None  # the predecessor's stream, as this node reads it


class Ring:
    """Two members, each the other's predecessor and successor; ``pause_at``: the node that
    stops reading its predecessor's stream once that many segments came (None: never)."""

    def __init__(self, pause: tuple[str, int] | None) -> None:
        self.nodes = {name: Node(name, ObjectStore(Arena(3 * SIZE))) for name in "ab"}
        self.pause = pause
        self.result = ObjectID.random()
        self.version = os.urandom(VERSION_SIZE)
        self.inputs = {name: ObjectID.random() for name in self.nodes}
        self._sockets: list[socket.socket] = []
        self._protocols: list[FrameProtocol] = []

    def value(self, name: str) -> np.ndarray:
        return np.full(ELEMENTS, 1.0 if name == "a" else 2.0, dtype=np.float32)

    def start(self) -> None:
        for position, (name, node) in enumerate(self.nodes.items()):
            obj = node.store.create(self.inputs[name], SIZE, "<f4", [ELEMENTS])
            obj.buffer[:] = self.value(name).tobytes()
            obj.advance(SIZE)
            other = "b" if name == "a" else "a"
            task = RingTask(result=self.result, inputs=[self.inputs[name]], position=position,
                            members=2, predecessor=other, successor=other, op="sum",
                            size=SIZE, dtype="<f4", shape=[ELEMENTS], version=self.version)
            node.member = RingMember(self._deps(node), task, CALLER, node.forgotten.set)

    def _deps(self, node: Node) -> RingDeps:
        async def connect(successor: str) -> FrameProtocol:
            return await self._connect(successor)

        return RingDeps(me=node.name, store=node.store,
                        directory=node.directory,  # type: ignore[arg-type]
                        tell=lambda to, msg: node.told.append(msg), connect=connect,
                        give_back=lambda to, protocol: protocol.close(),
                        probe=lambda n: None, observe_rate=lambda rate: None,
                        traffic=Traffic(), tasks=node.tasks, stall_timeout=WAIT * 10)

    async def _connect(self, successor: str) -> FrameProtocol:
        """A data connection to ``successor``, whose end attaches the stream to its member
        once the RingOpen came (as ``Allreduces.serve_ring`` does)."""
        ours, theirs = socket.socketpair()
        self._sockets += [ours, theirs]
        loop = asyncio.get_running_loop()
        _, mine = await loop.create_connection(lambda: FrameProtocol(name="to"), sock=ours)
        _, remote = await loop.create_connection(lambda: FrameProtocol(name="from"),
                                                 sock=theirs)
        self._protocols += [mine, remote]
        node = self.nodes[successor]
        node.tasks.spawn(self._serve(node, remote), name="serve-ring")
        return mine

    async def _serve(self, node: Node, protocol: FrameProtocol) -> None:
        frame = await protocol.next_frame(WAIT)  # in its handshake phase: frames queue up
        assert isinstance(frame.msg, RingOpen)
        protocol.send(Ok(rid=frame.msg.rid))
        member = node.member
        assert member is not None
        node.inbound = protocol
        if self.pause is not None and self.pause[0] == node.name:
            on_frame, after = member._on_frame, self.pause[1]
            seen = 0

            def counting(frame: Any) -> bool:
                nonlocal seen
                ended = on_frame(frame)
                seen += 1
                if seen == after:  # from now on it reads nothing, as if frozen
                    assert protocol.transport is not None
                    protocol.transport.pause_reading()
                return ended

            member._on_frame = counting  # type: ignore[method-assign]
        member.attach(protocol)

    async def close(self) -> None:
        for node in self.nodes.values():
            await node.tasks.cancel_all()
        for protocol in self._protocols:
            protocol.abort()
        await asyncio.sleep(0)  # the transports close on the next iteration
        for node in self.nodes.values():
            node.store.arena.close()
        for sock in self._sockets:
            sock.close()


@pytest.fixture
async def ring_of_two(request: pytest.FixtureRequest) -> AsyncIterator[Ring]:
    ring = Ring(request.param)
    ring.start()
    try:
        yield ring
    finally:
        await ring.close()


async def until(event: asyncio.Event) -> None:
    async with asyncio.timeout(WAIT):
        await event.wait()


def reported(node: Node) -> bool:
    return any(isinstance(m, RingReport) and not m.code for m in node.told)


# b stops reading a's stream once it has every segment it adds to: a then holds the whole
# result (b's last segments reach it) while the rest of its own stream waits on b
SCHEDULE = ring_schedule(SIZE, 4, 2, 1).receive
ADDED = sum(seg.add for seg in SCHEDULE)


@pytest.mark.parametrize("ring_of_two", [("b", ADDED)], indirect=True)
async def test_a_member_whose_successor_died_stops_its_stream_and_publishes(
        ring_of_two: Ring) -> None:
    a = ring_of_two.nodes["a"]
    assert a.member is not None
    async with asyncio.timeout(WAIT):
        while not reported(a):
            await asyncio.sleep(0.01)
    assert a.member.complete
    a.member.commit()
    await asyncio.sleep(0.5)  # an observation window: a may not be forgotten meanwhile
    assert not a.forgotten.is_set()  # its stream to b still waits
    a.member.successor_died()
    await until(a.forgotten)
    assert a.directory.published == [a.member.whole]
    np.testing.assert_array_equal(
        np.frombuffer(a.member.whole.buffer, dtype=np.float32), np.full(ELEMENTS, 3.0))
    assert [o.pins for o in a.store.objects.values()] == [0, 0]  # input and result


@pytest.mark.parametrize("ring_of_two", [None], indirect=True)
async def test_a_member_still_receiving_fails_when_its_successor_dies(
        ring_of_two: Ring) -> None:
    """Its predecessor is the same dead node: the result cannot be whole here."""
    a = ring_of_two.nodes["a"]
    assert a.member is not None
    a.member.successor_died()
    async with asyncio.timeout(WAIT):
        while not any(isinstance(m, RingReport) and m.code for m in a.told):
            await asyncio.sleep(0.01)
    assert not a.member.complete and a.member.ended


@pytest.mark.parametrize("ring_of_two", [None], indirect=True)
async def test_a_member_whose_copy_is_refused_drops_it_and_reports(ring_of_two: Ring) -> None:
    """A committed ring's version retired at the shard (it lost every holder and runs again,
    docs/design.md §4, "Ring allreduce"): a member publishing late keeps no copy nobody
    lists, and reports the failure to the caller."""
    refusal = ObjectDeletedError("object was deleted, or is another version now", oid="ab")
    for node in ring_of_two.nodes.values():
        node.directory.refusal = refusal
    async with asyncio.timeout(WAIT):
        while not all(reported(node) for node in ring_of_two.nodes.values()):
            await asyncio.sleep(0.01)
    for node in ring_of_two.nodes.values():
        assert node.member is not None
        node.member.commit()
    async with asyncio.timeout(WAIT):
        while not all(node.member is not None and node.member.ended
                      for node in ring_of_two.nodes.values()):
            await asyncio.sleep(0.01)
    for name, node in ring_of_two.nodes.items():
        failures = [m for m in node.told if isinstance(m, RingReport) and m.code]
        assert [m.code for m in failures] == [refusal.code]
        assert node.store.get(ring_of_two.result) is None
        assert list(node.store.objects) == [ring_of_two.inputs[name]]
        assert [o.pins for o in node.store.objects.values()] == [0]
