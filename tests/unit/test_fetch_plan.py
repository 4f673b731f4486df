"""FetchPlan: given these events, exactly these instructions (no daemon, no asyncio)."""

from __future__ import annotations

import ast
import inspect
from typing import Any

import pytest

from hoplite_client.wire.errors import (
    ConnectionLostError,
    HopliteTimeoutError,
    InvalidArgumentError,
    ObjectDeletedError,
    ObjectNotFoundError,
    PeerUnavailableError,
    RemoteProtocolError,
)
from hoplite_client.wire.ids import ObjectID
from hoplited.transfer import fetch_plan
from hoplited.transfer.fetch_plan import (
    Allocate,
    AskOwner,
    CallerJoined,
    CopyFailed,
    Done,
    Fail,
    FetchPlan,
    Located,
    LocateFailed,
    Pull,
    PullEnded,
    Report,
    StoreInline,
    UseLocalCopy,
)

pytestmark = pytest.mark.unit

OID = ObjectID(bytes(range(20)))
ME = "me"
V1, V2 = b"v1" * 4, b"v2" * 4
LOST = ConnectionLostError("source closed the stream")
STALL = HopliteTimeoutError("source sent nothing for 30s")
GONE = ObjectDeletedError("deleted")


def at(source: str | None, now: float = 1.0, version: bytes = V1, here: bool = False) -> Located:
    return Located(now, source, 1000, "<f4", (250,), version, here)


def ended(source: str, watermark: int, error: Any = None, now: float = 2.0) -> PullEnded:
    return PullEnded(now, source, watermark, error)


# (deadline at start (start is at t=0), events, instructions per event)
CASES: dict[str, tuple[float | None, list[Any], list[list[Any]]]] = {
    "first source works": (None, [at("a"), ended("a", 1000)], [
        [Allocate(1000, "<f4", (250,), V1), Pull("a", 0)],
        [Report("a", complete=True), Done()]]),
    "source dies mid-stream: resume at the watermark elsewhere": (None, [
        at("a"), ended("a", 400, LOST), at("b"), ended("b", 1000)], [
        [Allocate(1000, "<f4", (250,), V1), Pull("a", 0)],
        [Report("a", complete=False), AskOwner(("a",), 400, None)],
        [Pull("b", 400)],
        [Report("b", complete=True), Done()]]),
    "a stalled source is excluded too": (10.0, [at("a"), ended("a", 10, STALL, now=4.0)], [
        [Allocate(1000, "<f4", (250,), V1), Pull("a", 0)],
        [Report("a", complete=False), AskOwner(("a",), 10, 6.0)]]),
    "another version on resume: never splice two puts": (None, [
        at("a"), ended("a", 400, LOST), at("b", version=V2)], [
        [Allocate(1000, "<f4", (250,), V1), Pull("a", 0)],
        [Report("a", complete=False), AskOwner(("a",), 400, None)],
        [Fail(ObjectNotFoundError)]]),
    "inline answer": (None, [at(None)], [[StoreInline(), Done()]]),
    "put here while we waited": (None, [at("a", here=True)], [[UseLocalCopy(), Done()]]),
    "the owner names this node": (None, [at(ME)], [[UseLocalCopy(), Done()]]),
    "a fatal pull error ends the fetch": (None, [
        at("a"), ended("a", 0, InvalidArgumentError("bad"))], [
        [Allocate(1000, "<f4", (250,), V1), Pull("a", 0)],
        [Report("a", complete=False), Fail(InvalidArgumentError)]]),
    "protocol garbage from a source is retriable": (None, [
        at("a"), ended("a", 0, RemoteProtocolError("x"))], [
        [Allocate(1000, "<f4", (250,), V1), Pull("a", 0)],
        [Report("a", complete=False), AskOwner(("a",), 0, None)]]),
    "the local copy was deleted": (None, [at("a"), CopyFailed(GONE)], [
        [Allocate(1000, "<f4", (250,), V1), Pull("a", 0)], [Fail(ObjectDeletedError)]]),
    "locate timed out at the deadline": (5.0, [LocateFailed(5.0, HopliteTimeoutError("t"))],
                                         [[Fail(HopliteTimeoutError)]]),
    "a failed reduce's record (a timeout error) is final": (
        5.0, [LocateFailed(1.0, HopliteTimeoutError("reduce timed out"))],
        [[Fail(HopliteTimeoutError)]]),
    "a late caller extends the deadline: the timed-out locate is asked again": (5.0, [
        CallerJoined(None), LocateFailed(5.0, HopliteTimeoutError("t")), at("a", now=6.0)], [
        [], [AskOwner((), 0, None)], [Allocate(1000, "<f4", (250,), V1), Pull("a", 0)]]),
    "a later caller with a shorter timeout changes nothing": (5.0, [
        CallerJoined(2.0), LocateFailed(5.0, HopliteTimeoutError("t"))],
        [[], [Fail(HopliteTimeoutError)]]),
    "extended to a finite deadline: the remaining time is asked": (5.0, [
        CallerJoined(9.0), LocateFailed(5.0, HopliteTimeoutError("t"))],
        [[], [AskOwner((), 0, 4.0)]]),
    "a stale PullEnded (not the pull in progress) is ignored": (None, [
        at("a"), ended("b", 999, LOST), ended("a", 1000)], [
        [Allocate(1000, "<f4", (250,), V1), Pull("a", 0)], [],
        [Report("a", complete=True), Done()]]),
    "a duplicate answer during a pull is ignored": (None, [at("a"), at("b")], [
        [Allocate(1000, "<f4", (250,), V1), Pull("a", 0)], []]),
    "events after Done are ignored": (None, [at(None), ended("a", 5, LOST), at("a")], [
        [StoreInline(), Done()], [], []]),
    "the watermark never goes back": (None, [
        at("a"), ended("a", 600, LOST), at("b"), ended("b", 100, LOST)], [
        [Allocate(1000, "<f4", (250,), V1), Pull("a", 0)],
        [Report("a", complete=False), AskOwner(("a",), 600, None)],
        [Pull("b", 600)],
        [Report("b", complete=False), AskOwner(("a", "b"), 600, None)]]),
}


def _same(got: list[Any], want: list[Any]) -> bool:
    """Instructions equal; a Fail matches the error class given in the table."""
    if len(got) != len(want):
        return False
    for g, w in zip(got, want):
        if isinstance(w, Fail) and isinstance(w.error, type):
            if not (isinstance(g, Fail) and type(g.error) is w.error):
                return False
        elif g != w:
            return False
    return True


@pytest.mark.parametrize("name", list(CASES))
def test_fetch_plan(name: str) -> None:
    deadline, events, expected = CASES[name]
    plan = FetchPlan(OID, ME, deadline)
    assert plan.start(0.0) == [AskOwner((), 0, deadline)]
    for event, want in zip(events, expected, strict=True):
        got = plan.handle(event)
        assert _same(got, want), f"{event} -> {got}, expected {want}"


def test_attempts_are_bounded() -> None:
    plan = FetchPlan(OID, ME, None, max_attempts=3)
    plan.start(0.0)
    out: list[Any] = []
    for i, source in enumerate("abc"):
        assert plan.handle(at(source))[-1] == Pull(source, i)
        out = plan.handle(ended(source, i + 1, LOST))
    assert out[0] == Report("c", complete=False)
    assert isinstance(out[-1], Fail) and isinstance(out[-1].error, PeerUnavailableError)
    assert "after 3 sources" in str(out[-1].error)
    assert plan.handle(at("d")) == []  # over
    assert len(plan.history) == 8  # start + 7 events


def test_inline_answer_after_allocation_is_a_replacement() -> None:
    plan = FetchPlan(OID, ME, None)
    plan.start(0.0)
    plan.handle(at("a"))
    plan.handle(ended("a", 10, LOST))
    (fail,) = plan.handle(at(None))
    assert isinstance(fail, Fail) and isinstance(fail.error, ObjectNotFoundError)


def test_the_plan_does_no_io() -> None:
    tree = ast.parse(inspect.getsource(fetch_plan))
    imported = {alias.name.split(".")[0] for node in ast.walk(tree)
                if isinstance(node, ast.Import | ast.ImportFrom)
                for alias in (node.names if isinstance(node, ast.Import)
                              else [ast.alias(node.module or "")])}
    assert not imported & {"asyncio", "socket", "time", "random"}
