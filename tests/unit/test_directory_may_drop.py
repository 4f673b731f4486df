"""DirectoryState.may_drop, the shard's rule for letting a holder evict its copy: tables."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from hoplite_client.wire.errors import NotOwnerError
from hoplite_client.wire.ids import ObjectID
from hoplited.directory.state import DirectoryState

pytestmark = pytest.mark.unit

ME = "me"
SIZE = 1000
OID = ObjectID(bytes(20))
V1 = b"v1"


class World:
    """A DirectoryState owned by ``ME``, with the liveness it is injected with."""

    def __init__(self) -> None:
        self.dead: set[str] = set()
        self.owner = ME
        self.state = DirectoryState(1, lambda n: n not in self.dead, lambda oid: self.owner,
                                    ME)


Step = Callable[[World], object]


def put(holder: str, received: int | None = None, inline: bytes | None = None) -> Step:
    def step(w: World) -> object:
        w.state.publish(OID, holder, SIZE, "|u1", [SIZE], V1, inline, received)
        return None
    return step


def locate(requester: str) -> Step:
    def step(w: World) -> object:
        answer = w.state.try_locate(OID, requester, [], 0)
        return getattr(answer, "node", answer)
    return step


def done(source: str, receiver: str) -> Step:
    def step(w: World) -> object:
        w.state.transfer_done(OID, source, receiver, complete=True)
        return None
    return step


def drop(holder: str, version: bytes = V1) -> Step:
    """Whether the shard lets ``holder`` drop its copy."""
    return lambda w: w.state.may_drop(OID, holder, version).allowed


def die(node: str) -> Step:
    def step(w: World) -> object:
        w.dead.add(node)
        return None
    return step


def holders() -> Step:
    def step(w: World) -> object:
        entry = w.state.entries.get(OID)
        return None if entry is None else sorted(entry.holders)
    return step


@dataclass(frozen=True)
class Case:
    id: str
    steps: list[tuple[Step, object]]


CASES = [
    Case("the only copy may not go", [
        (put("a"), None), (drop("a"), False), (holders(), ["a"])]),
    Case("another complete copy: yes, and the asker is forgotten at once", [
        (put("a"), None), (put("b"), None), (drop("a"), True), (holders(), ["b"]),
        (locate("r"), "b"), (drop("b"), False)]),
    Case("the other copy is partial: no", [
        (put("a"), None), (put("b", received=SIZE // 2), None), (drop("a"), False)]),
    Case("the other complete copy is on a dead member: no", [
        (put("a"), None), (put("b"), None), (die("b"), None), (drop("a"), False)]),
    Case("a receiver is enrolled behind the asker: no, until its transfer is done", [
        (put("a"), None), (locate("r"), "a"), (put("b"), None), (drop("a"), False),
        (done("a", "r"), None), (drop("a"), True), (holders(), ["b", "r"])]),
    Case("a receiver got a copy from the asker: now either may go, not both", [
        (put("a"), None), (locate("r"), "a"), (done("a", "r"), None),
        (drop("r"), True), (drop("a"), False), (holders(), ["a"])]),
    Case("copies go one by one, never the last", [
        (put("a"), None), (put("b"), None), (locate("r"), "a"), (done("a", "r"), None),
        (drop("a"), True), (drop("b"), True), (drop("r"), False), (holders(), ["r"])]),
    Case("inline bytes do not count as a copy", [
        (put("a", inline=b"x" * SIZE), None), (drop("a"), False)]),
    Case("a copy the shard does not list may go if a live complete one exists", [
        (put("a"), None), (drop("cached"), True), (holders(), ["a"])]),
    Case("no entry: no (who else holds it is unknown)", [
        (drop("a"), False), (holders(), None)]),
    Case("a copy of another version is nobody's source: yes, entry untouched", [
        (put("a"), None), (drop("a", version=b"old"), True), (holders(), ["a"])]),
]


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_may_drop(case: Case) -> None:
    w = World()
    for i, (step, expected) in enumerate(case.steps):
        assert step(w) == expected, f"step {i}"


def test_not_the_owner_names_the_owner() -> None:
    """Asked about an id it does not own, the shard redirects (the caller retries there)."""
    w = World()
    w.owner = "other"
    with pytest.raises(NotOwnerError) as info:
        w.state.may_drop(OID, "a", V1)
    assert info.value.data["owner"] == "other"


def test_story_says_why() -> None:
    w = World()
    put("a")(w)
    w.state.may_drop(OID, "a", V1)
    put("b")(w)
    w.state.may_drop(OID, "a", V1)
    outcomes = [outcome for event, outcome in w.state.story(OID) if "drop" in event]
    assert outcomes == ["no: it holds the last live complete copy", "yes: complete on ['b']"]
