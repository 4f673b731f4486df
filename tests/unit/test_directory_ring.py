"""DirectoryState.try_locate in ring order (a striped allreduce's gathers): tables, and the
shard's bounded wait for a predecessor."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.locate_hints import IN_RING
from hoplited.directory import shard as shard_module
from hoplited.directory.shard import DirectoryShard
from hoplited.directory.state import DirectoryState, NotYet

pytestmark = pytest.mark.unit

ME = "me"
SIZE = 1000
OID = ObjectID(bytes(20))
V1 = b"v1"


class World:
    """A DirectoryState owned by ``ME`` with fan-out 1, and the liveness it is injected with."""

    def __init__(self) -> None:
        self.dead: set[str] = set()
        self.state = DirectoryState(1, lambda n: n not in self.dead, lambda oid: ME, ME)


Step = Callable[[World], object]


def produce(holder: str) -> Step:
    """``holder`` computes the object (a stripe's reducer announcing its output)."""
    def step(w: World) -> object:
        w.state.publish(OID, holder, SIZE, "|u1", [SIZE], V1, None, 0, producing=True)
        return None
    return step


def put(holder: str) -> Step:
    def step(w: World) -> object:
        w.state.publish(OID, holder, SIZE, "|u1", [SIZE], V1, None)
        return None
    return step


def ring(requester: str, *waiting: str, exclude: tuple[str, ...] = ()) -> Step:
    """A ring locate by ``requester`` while ``waiting`` also wait: the source, or why not."""
    def step(w: World) -> object:
        answer = w.state.try_locate(OID, requester, exclude, 0, IN_RING, waiting)
        if isinstance(answer, NotYet):
            return ("wait", answer.reason.split()[2].rstrip(",")) if answer.ring else "not yet"
        return answer.node
    return step


def plain(requester: str) -> Step:
    def step(w: World) -> object:
        return getattr(w.state.try_locate(OID, requester, [], 0), "node", None)
    return step


def die(node: str) -> Step:
    def step(w: World) -> object:
        w.dead.add(node)
        return None
    return step


@dataclass(frozen=True)
class Case:
    id: str
    steps: list[tuple[Step, object]]


CASES = [
    Case("no entry yet: the usual wait", [(ring("b", "c"), "not yet")]),
    Case("the producer's successor takes it at once", [
        (produce("a"), None), (ring("b", "c", "d"), "a")]),
    Case("a requester waits for its predecessor, then chains behind it", [
        (produce("a"), None), (ring("c", "b", "d"), ("wait", "b")),
        (ring("b", "c", "d"), "a"), (ring("c", "d"), "b"), (ring("d"), "c")]),
    Case("the ring wraps round: the last id chains to the first", [
        (produce("c"), None), (ring("d", "a", "b"), "c"), (ring("a", "b"), "d"),
        (ring("b"), "a")]),
    Case("a predecessor that is not waiting is not in the ring", [
        (produce("a"), None), (ring("d"), "a")]),
    Case("a dead predecessor is skipped", [
        (produce("a"), None), (die("b"), None), (ring("c", "b"), "a")]),
    Case("an excluded predecessor (it stalled) is skipped", [
        (produce("a"), None), (ring("b"), "a"), (ring("c", exclude=("b",)), "a")]),
    Case("a busy predecessor gives way to the usual choice", [
        (produce("a"), None), (ring("b"), "a"), (plain("x"), "b"), (ring("c"), "x")]),
    Case("only the requester holds anything: no ring, nothing to pull", [
        (produce("b"), None), (ring("b", "a"), "not yet")]),
    Case("every holder dead: no source, no ring wait", [
        (produce("a"), None), (die("a"), None), (ring("c", "b"), "not yet")]),
    Case("a complete copy is a predecessor like any holder", [
        (put("a"), None), (put("d"), None), (ring("c", "b"), ("wait", "b")),
        (ring("b", "c"), "a"), (ring("c"), "b")]),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_ring_choice(case: Case) -> None:
    w = World()
    for i, (step, expected) in enumerate(case.steps):
        assert step(w) == expected, f"step {i}"


def test_plain_locates_ignore_the_ring() -> None:
    """Without ``ring`` the choice is the usual one: the earliest, least busy holder."""
    w = World()
    produce("a")(w)
    assert plain("c")(w) == "a"
    assert plain("b")(w) == "c"


async def test_shard_chains_waiting_requesters_in_ring_order() -> None:
    """Requesters waiting together before the object exists chain round the ring once the
    producer announces it, whatever order they asked in."""
    s = DirectoryShard(1, lambda n: True, lambda oid: "me", "me")
    waits = {n: asyncio.ensure_future(s.locate(OID, n, 5, [], 0, IN_RING))
             for n in ("e", "c", "b", "d")}
    await asyncio.sleep(0.01)
    s.publish(OID, "a", SIZE, "|u1", [SIZE], V1, None, 0, producing=True)
    got = {n: (await w).node for n, w in waits.items()}
    assert got == {"b": "a", "c": "b", "d": "c", "e": "d"}
    assert not s._ring  # nothing left registered


async def test_shard_stops_waiting_for_a_predecessor_after_ring_wait(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A predecessor that never enrols (it waits for another reason) delays its successor by
    RING_WAIT at most: then the successor takes the usual choice."""
    monkeypatch.setattr(shard_module, "RING_WAIT", 0.05)
    s = DirectoryShard(1, lambda n: True, lambda oid: "me", "me")
    s.publish(OID, "a", SIZE, "|u1", [SIZE], V1, None, 0, producing=True)
    s.state.try_locate(OID, "z", [], 0)  # a plain receiver takes a's only slot
    stuck = asyncio.ensure_future(s.locate(OID, "b", 5, ["a", "z", "c"], 0, IN_RING))
    await asyncio.sleep(0.01)
    assert not stuck.done()  # nobody it may use: it waits as usual
    got = await asyncio.wait_for(s.locate(OID, "c", 5, [], 0, IN_RING), 2)
    assert got.node == "z"  # waited for b, then chose as usual (a is busy serving z)
    stuck.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stuck
    assert not s._ring
