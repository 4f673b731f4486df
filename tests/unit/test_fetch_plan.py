"""FetchPlan: given these events, exactly these instructions (no daemon, no asyncio)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from helpers import top_level_imports

from hoplite_client.wire.errors import (
    ConnectionLostError,
    HopliteError,
    HopliteTimeoutError,
    InvalidArgumentError,
    LocalProtocolError,
    ObjectDeletedError,
    ObjectNotFoundError,
    PeerUnavailableError,
    RemoteProtocolError,
)
from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.locate_hints import PLAIN, Half
from hoplited.transfer import fetch_plan
from hoplited.transfer.fetch_plan import (
    OWNER_POLL,
    STALL_RETRY,
    Allocate,
    AskOwner,
    CallerJoined,
    CopyFailed,
    Discard,
    Done,
    Event,
    Fail,
    FetchHalves,
    FetchPlan,
    HalvesEnded,
    Instruction,
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
SIZE = 1000
V1, V2 = b"v1" * 4, b"v2" * 4
LOST = ConnectionLostError("source closed the stream")
DEAD = PeerUnavailableError("source b died", node="b")
# a pull refused because its source is a member this node only suspects (a partition)
SILENT = PeerUnavailableError("source a is not a live member, or is silent", node="a",
                              silent=True)
STALL = HopliteTimeoutError("source sent nothing for 1s")
GONE = ObjectDeletedError("deleted")
ALLOC = Allocate(SIZE, "<f4", (250,), V1)


@dataclass(frozen=True)
class FailWith:
    """Expected: a Fail whose error is exactly of class ``cls``."""

    cls: type[HopliteError]


Want = Instruction | FailWith


def at(source: str | None, now: float = 1.0, version: bytes = V1, here: bool = False) -> Located:
    return Located(now, source, SIZE, "<f4", (250,), version, here)


BOUNDS = ((0, 500), (500, SIZE))
HALVES = FetchHalves(SIZE, "<f4", (250,), V1, BOUNDS, 3, 7)


def split(now: float = 1.0) -> Located:
    """The owner's answer that the object is taken as two halves, this node receiver 3 of
    trees built for 7."""
    return Located(now, None, SIZE, "<f4", (250,), V1, halves=BOUNDS, index=3, receivers=7)


def ended(source: str, watermark: int, error: Exception | None = None,
          now: float = 2.0) -> PullEnded:
    return PullEnded(now, source, watermark, error)


def timed_out(now: float) -> LocateFailed:
    return LocateFailed(now, HopliteTimeoutError("not available within the timeout"))


@dataclass(frozen=True)
class Case:
    deadline: float | None  # the first caller's; the plan starts at t=0
    steps: list[tuple[Event, list[Want]]]  # each event and exactly what it must yield


CASES: dict[str, Case] = {
    "first source works": Case(None, [
        (at("a"), [ALLOC, Pull("a", 0)]),
        (ended("a", SIZE), [Report("a", complete=True), Done()])]),
    "source closes mid-stream: resume at the watermark elsewhere, the first avoided": Case(None, [
        (at("a"), [ALLOC, Pull("a", 0)]),
        (ended("a", 400, LOST),
         [Report("a", complete=False), AskOwner(("a",), 400, STALL_RETRY)]),
        (at("b"), [Pull("b", 400)]),
        (ended("b", SIZE), [Report("b", complete=True), Done()])]),
    "node death and a stall are retriable; a stalled source is avoided for a while": Case(10.0, [
        (at("a"), [ALLOC, Pull("a", 0)]),
        (ended("a", 10, STALL, now=4.0), [Report("a", False), AskOwner(("a",), 10, STALL_RETRY)]),
        (at("b", now=5.0), [Pull("b", 10)]),
        (ended("b", 20, DEAD, now=9.75), [Report("b", False), AskOwner(("b", "a"), 20, 0.25)])]),
    "nobody else while a stalled source is avoided: it is asked for again": Case(None, [
        (at("a"), [ALLOC, Pull("a", 0)]),
        (ended("a", 10, STALL, now=4.0), [Report("a", False), AskOwner(("a",), 10, STALL_RETRY)]),
        (timed_out(6.0), [AskOwner((), 10, OWNER_POLL)]),
        (at("a", now=6.5), [Pull("a", 10)]),
        (ended("a", SIZE, now=9.0), [Report("a", True), Done()])]),
    # chaos seed 29, trial 12: excluded for good, the only holder stalled a get for 30 s
    "a source only suspected is avoided for a while, then taken again": Case(None, [
        (at("a"), [ALLOC, Pull("a", 0)]),
        (ended("a", 0, SILENT, now=1.0), [Report("a", False), AskOwner(("a",), 0, STALL_RETRY)]),
        (timed_out(1.5), [AskOwner((), 0, OWNER_POLL)]),
        (at("a", now=2.0), [Pull("a", 0)]),
        (ended("a", SIZE, now=3.0), [Report("a", True), Done()])]),
    "a dead source stays excluded when the stalled one is forgiven": Case(30.0, [
        (at("a"), [ALLOC, Pull("a", 0)]),
        (ended("a", 10, DEAD, now=1.0), [Report("a", False), AskOwner(("a",), 10, OWNER_POLL)]),
        (at("b", now=1.5), [Pull("b", 10)]),
        (ended("b", 10, STALL, now=3.0), [Report("b", False), AskOwner(("a", "b"), 10, STALL_RETRY)]),
        (timed_out(5.0), [AskOwner(("a",), 10, OWNER_POLL)])]),
    "a socket error and protocol garbage are retriable": Case(None, [
        (at("a"), [ALLOC, Pull("a", 0)]),
        (ended("a", 0, OSError("reset")), [Report("a", False), AskOwner(("a",), 0, OWNER_POLL)]),
        (at("b"), [Pull("b", 0)]),
        (ended("b", 5, RemoteProtocolError("x")),
         [Report("b", False), AskOwner(("a", "b"), 5, OWNER_POLL)])]),
    "another version on resume (put again): never splice, start over from byte 0": Case(None, [
        (at("a"), [ALLOC, Pull("a", 0)]),
        (ended("a", 400, DEAD), [Report("a", False), AskOwner(("a",), 400, OWNER_POLL)]),
        (at("b", version=V2), [Discard(), Allocate(SIZE, "<f4", (250,), V2), Pull("b", 0)]),
        (ended("b", 300, LOST), [Report("b", False), AskOwner(("b",), 300, STALL_RETRY)]),
        (at("c", version=V2), [Pull("c", 300)]),
        (ended("c", SIZE), [Report("c", True), Done()])]),
    "an inline answer after allocation replaces the partial copy too": Case(None, [
        (at("a"), [ALLOC, Pull("a", 0)]),
        (ended("a", 400, LOST), [Report("a", False), AskOwner(("a",), 400, STALL_RETRY)]),
        (at(None), [Discard(), StoreInline(), Done()])]),
    "inline answer": Case(None, [(at(None), [StoreInline(), Done()])]),
    "put here while we waited": Case(None, [(at("a", here=True), [UseLocalCopy(), Done()])]),
    "the owner names this node": Case(None, [(at(ME), [UseLocalCopy(), Done()])]),
    "a fatal pull error ends the fetch (the source is still reported)": Case(None, [
        (at("a"), [ALLOC, Pull("a", 0)]),
        (ended("a", 0, InvalidArgumentError("bad")),
         [Report("a", False), FailWith(InvalidArgumentError)])]),
    "a failed pull that got every byte is complete": Case(None, [
        (at("a"), [ALLOC, Pull("a", 0)]),
        (ended("a", SIZE, LOST), [Report("a", complete=True), Done()])]),
    "the local copy was deleted mid-pull: report the source, fail": Case(None, [
        (at("a"), [ALLOC, Pull("a", 0)]),
        (CopyFailed(GONE), [Report("a", False), FailWith(ObjectDeletedError)])]),
    "the local copy was deleted while asking": Case(None, [
        (at("a"), [ALLOC, Pull("a", 0)]),
        (ended("a", 400, LOST), [Report("a", False), AskOwner(("a",), 400, STALL_RETRY)]),
        (CopyFailed(GONE), [FailWith(ObjectDeletedError)])]),
    "the shard says the object will never exist": Case(None, [
        (LocateFailed(0.5, ObjectNotFoundError("failed reduce")), [FailWith(ObjectNotFoundError)])]),
    "locate timed out at the deadline": Case(5.0, [
        (timed_out(5.0), [FailWith(HopliteTimeoutError)])]),
    "a timeout under the deadline it was asked with is final (a failed reduce's record)": Case(
        5.0, [(timed_out(1.0), [FailWith(HopliteTimeoutError)])]),
    "a late caller with no timeout: the timed-out locate is asked again, no limit": Case(5.0, [
        (CallerJoined(None), []),
        (timed_out(5.0), [AskOwner((), 0, OWNER_POLL)]),
        (at("a", now=6.0), [ALLOC, Pull("a", 0)]),
        (ended("a", SIZE, now=7.0), [Report("a", True), Done()])]),
    "a late caller with a longer timeout: asked again with the remaining time": Case(5.0, [
        (CallerJoined(9.0), []),
        (timed_out(5.0), [AskOwner((), 0, 4.0)]),
        (timed_out(9.0), [FailWith(HopliteTimeoutError)])]),
    "a later caller with a shorter timeout changes nothing": Case(5.0, [
        (CallerJoined(2.0), []),
        (timed_out(5.0), [FailWith(HopliteTimeoutError)])]),
    "extended during a pull: the resume asks with the extended remaining time": Case(5.0, [
        (at("a", now=1.0), [ALLOC, Pull("a", 0)]),
        (CallerJoined(20.0), []),
        (ended("a", 300, DEAD, now=8.0), [Report("a", False), AskOwner(("a",), 300, OWNER_POLL)])]),
    "deadline passed when a pull fails: HopliteTimeoutError, no zero-time ask": Case(5.0, [
        (at("a", now=1.0), [ALLOC, Pull("a", 0)]),
        (ended("a", 300, LOST, now=5.0), [Report("a", False), FailWith(HopliteTimeoutError)])]),
    "a stale PullEnded (not the pull in progress) is ignored": Case(None, [
        (at("a"), [ALLOC, Pull("a", 0)]),
        (ended("b", 999, LOST), []),
        (ended("a", SIZE), [Report("a", True), Done()])]),
    "a duplicate PullEnded of a source already excluded is ignored": Case(None, [
        (at("a"), [ALLOC, Pull("a", 0)]),
        (ended("a", 400, DEAD), [Report("a", False), AskOwner(("a",), 400, OWNER_POLL)]),
        (ended("a", 400, DEAD), []),
        (at("b"), [Pull("b", 400)])]),
    "a duplicate answer or locate failure during a pull is ignored": Case(None, [
        (at("a"), [ALLOC, Pull("a", 0)]),
        (at("b"), []),
        (timed_out(3.0), []),
        (ended("a", SIZE), [Report("a", True), Done()])]),
    "events after Done are ignored": Case(None, [
        (at(None), [StoreInline(), Done()]),
        (ended("a", 5, LOST), []),
        (at("a"), []),
        (CopyFailed(GONE), []),
        (CallerJoined(None), [])]),
    "events after Fail are ignored": Case(5.0, [
        (timed_out(5.0), [FailWith(HopliteTimeoutError)]),
        (CallerJoined(None), []),
        (timed_out(6.0), []),
        (at("a"), [])]),
    "the watermark never goes back": Case(None, [
        (at("a"), [ALLOC, Pull("a", 0)]),
        (ended("a", 600, DEAD), [Report("a", False), AskOwner(("a",), 600, OWNER_POLL)]),
        (at("b"), [Pull("b", 600)]),
        (ended("b", 100, DEAD), [Report("b", False), AskOwner(("a", "b"), 600, OWNER_POLL)])]),
    "a source whose copy went (a result started again) is asked again, new version": Case(None, [
        (at("a"), [ALLOC, Pull("a", 0)]),
        (ended("a", 700, ObjectNotFoundError("no copy of that version")),
         [Report("a", False), AskOwner(("a",), 700, STALL_RETRY)]),
        (timed_out(3.0), [AskOwner((), 700, OWNER_POLL)]),
        (at("a", version=V2), [Discard(), Allocate(SIZE, "<f4", (250,), V2), Pull("a", 0)]),
        (ended("a", SIZE), [Report("a", True), Done()])]),
    "a new version clears the exclusions, which were about the old one": Case(None, [
        (at("a"), [ALLOC, Pull("a", 0)]),
        (ended("a", 10, DEAD), [Report("a", False), AskOwner(("a",), 10, OWNER_POLL)]),
        (at("b", version=V2), [Discard(), Allocate(SIZE, "<f4", (250,), V2), Pull("b", 0)]),
        (ended("b", 20, DEAD), [Report("b", False), AskOwner(("b",), 20, OWNER_POLL)])]),
    "split: the halves are fetched on their own, and their end is the fetch's": Case(None, [
        (split(), [HALVES]),
        (ended("a", SIZE), []),  # no pull of the whole runs: stale
        (at("a"), []),
        (HalvesEnded(None), [Done()])]),
    "split: a half that failed fails the fetch": Case(None, [
        (split(), [HALVES]),
        (HalvesEnded(DEAD), [FailWith(PeerUnavailableError)])]),
    "split: the copy deleted while the halves run": Case(None, [
        (split(), [HALVES]),
        (CopyFailed(GONE), [FailWith(ObjectDeletedError)]),
        (HalvesEnded(None), [])]),
    "split after a copy was begun (nothing received): it is discarded first": Case(None, [
        (at("a"), [ALLOC, Pull("a", 0)]),
        (ended("a", 0, DEAD), [Report("a", False), AskOwner(("a",), 0, OWNER_POLL)]),
        (split(), [Discard(), HALVES]),
        (HalvesEnded(None), [Done()])]),
    "an end of halves that were never asked for is stale": Case(None, [
        (HalvesEnded(None), []),
        (at("a"), [ALLOC, Pull("a", 0)])]),
}


def _matches(got: Instruction, want: Want) -> bool:
    if isinstance(want, FailWith):
        return isinstance(got, Fail) and type(got.error) is want.cls
    return got == want


@pytest.mark.parametrize("name", list(CASES))
def test_fetch_plan(name: str) -> None:
    case = CASES[name]
    plan = FetchPlan(OID, ME, case.deadline)
    assert plan.start(0.0) == [AskOwner((), 0, OWNER_POLL if case.deadline is None
                                        or case.deadline > OWNER_POLL else case.deadline)]
    for event, want in case.steps:
        got = plan.handle(event)
        assert len(got) == len(want) and all(map(_matches, got, want)), \
            f"{event} -> {got}, expected {want}"
    assert [event for event, _ in plan.history] == ["start"] + [e for e, _ in case.steps]


def test_attempts_are_bounded() -> None:
    plan = FetchPlan(OID, ME, None, max_attempts=3)
    plan.start(0.0)
    out: list[Instruction] = []
    for source in "abc":
        assert plan.handle(at(source))[-1] == Pull(source, 0)
        out = plan.handle(ended(source, 0, LOST))
    assert out[0] == Report("c", complete=False)
    assert isinstance(out[-1], Fail) and type(out[-1].error) is PeerUnavailableError
    assert "after 3 sources sent nothing" in str(out[-1].error)
    assert plan.outcome == out[-1] and plan.phase == "over"
    assert plan.stalled == ["a", "b", "c"]
    assert plan.handle(at("d")) == []  # over


def test_refusals_of_a_suspected_source_use_no_attempt() -> None:
    plan = FetchPlan(OID, ME, None, max_attempts=2)
    plan.start(0.0)
    for i in range(10):  # suspected for as long as a partition lasts
        assert plan.handle(at("a", now=float(i)))[-1] == Pull("a", 0)
        out = plan.handle(ended("a", 0, SILENT, now=i + 0.5))
        assert out == [Report("a", complete=False), AskOwner(("a",), 0, STALL_RETRY)]
    assert plan.fruitless == 0
    plan.handle(at("a", now=11.0))
    assert plan.handle(ended("a", SIZE, now=12.0)) == [Report("a", complete=True), Done()]


def test_default_budget_is_eight_sources() -> None:
    plan = FetchPlan(OID, ME, None)
    plan.start(0.0)
    for i in range(8):
        source = f"n{i}"
        assert plan.handle(at(source)) == ([ALLOC] if i == 0 else []) + [Pull(source, 0)]
        out = plan.handle(ended(source, 0, LOST))
    assert isinstance(out[-1], Fail) and isinstance(out[-1].error, PeerUnavailableError)


@pytest.mark.parametrize("patience, ends, gives_up", [
    (0.0, [1.0, 1.5, 2.0], True),     # no patience: the third fruitless pull ends it
    (4.0, [1.0, 1.5, 2.0], False),    # within the verdict window of the first: ask again
    (4.0, [1.0, 3.0, 5.0], True),     # past it: the membership would have decided by now
    (4.0, [1.0, 2.0, 5.0, 5.5], True),
])
def test_fruitless_pulls_end_the_fetch_only_after_the_patience(
        patience: float, ends: list[float], gives_up: bool) -> None:
    """A source only the heartbeat can condemn keeps the fetch alive until it could have been
    declared dead (then the owner stops offering it), however many pulls it wasted."""
    plan = FetchPlan(OID, ME, None, max_attempts=3, patience=patience)
    plan.start(0.0)
    out: list[Instruction] = []
    for now in ends:
        plan.handle(at("a", now=now - 0.1))
        out = plan.handle(ended("a", 0, LOST, now=now))
        if isinstance(out[-1], Fail):
            break
    assert isinstance(out[-1], Fail) is gives_up
    if not gives_up:
        assert isinstance(out[-1], AskOwner)


def test_patience_must_be_a_duration() -> None:
    for bad in (-1.0, float("nan")):
        with pytest.raises(LocalProtocolError):
            FetchPlan(OID, ME, None, patience=bad)


def test_sources_that_send_something_do_not_use_up_the_budget() -> None:
    plan = FetchPlan(OID, ME, None, max_attempts=2)
    plan.start(0.0)
    for i in range(5):
        source = f"n{i}"
        plan.handle(at(source))
        out = plan.handle(ended(source, 10 * (i + 1), LOST))
        assert isinstance(out[-1], AskOwner), out
    plan.handle(at("x"))
    assert isinstance(plan.handle(ended("x", 50, LOST))[-1], AskOwner)
    plan.handle(at("y"))
    assert isinstance(plan.handle(ended("y", 50, LOST))[-1], Fail)


def test_a_fatal_non_hoplite_error_is_wrapped() -> None:
    plan = FetchPlan(OID, ME, None)
    plan.start(0.0)
    plan.handle(at("a"))
    bug = ValueError("boom")
    report, fail = plan.handle(ended("a", 3, bug))
    assert report == Report("a", complete=False)
    assert isinstance(fail, Fail) and type(fail.error) is HopliteError
    assert fail.error.__cause__ is bug


def test_history_is_bounded() -> None:
    plan = FetchPlan(OID, ME, None)
    plan.start(0.0)
    for _ in range(200):
        plan.handle(CallerJoined(None))
    assert len(plan.history) == fetch_plan.HISTORY_MAX
    assert plan.history[-1] == (CallerJoined(None), ())


def test_events_before_start_are_stale_and_start_once() -> None:
    plan = FetchPlan(OID, ME, 5.0)
    assert plan.handle(at("a")) == []
    assert plan.handle(CallerJoined(8.0)) == []
    assert plan.start(1.0) == [AskOwner((), 0, 7.0)]
    with pytest.raises(LocalProtocolError):
        plan.start(1.0)
    with pytest.raises(LocalProtocolError):
        FetchPlan(OID, ME, None, max_attempts=0)


def test_the_plan_does_no_io() -> None:
    assert not top_level_imports(fetch_plan) & {"asyncio", "socket", "time", "random"}


@pytest.mark.parametrize("deadline, answers, want", [
    # no deadline: every poll that ran out is asked again, for ever
    (None, [OWNER_POLL, 2 * OWNER_POLL, 3 * OWNER_POLL], [OWNER_POLL] * 3),
    # a far deadline: polls, then the time that remains, then the end
    (25.0, [OWNER_POLL, 20.0], [OWNER_POLL, 5.0]),
    (25.0, [OWNER_POLL, 20.0, 25.0], [OWNER_POLL, 5.0, "fail"]),
    # a timeout that comes back at once is the shard's stored failure: final, no spin
    (None, [0.1], ["fail"]),
    (None, [OWNER_POLL, OWNER_POLL + 0.1], [OWNER_POLL, "fail"]),
])
def test_the_owner_is_asked_in_bounded_polls(deadline: float | None, answers: list[float],
                                             want: list[float | str]) -> None:
    """No ask waits at the shard longer than OWNER_POLL, so a fetch that stops leaves no
    waiter there for long; a poll that ran out is asked again until the deadline."""
    plan = FetchPlan(OID, ME, deadline)
    assert plan.start(0.0) == [AskOwner((), 0, OWNER_POLL)]
    for now, expected in zip(answers, want, strict=True):
        out = plan.handle(timed_out(now))
        if expected == "fail":
            assert len(out) == 1 and isinstance(out[0], Fail)
        else:
            assert out == [AskOwner((), 0, expected)]


def test_every_ask_says_the_plans_hint_and_a_split_says_each_halfs() -> None:
    """A plan's asks, the first and those after a failed pull, carry its hint; a half's hint
    repeats what the split said, so a rebuilt shard learns the trees again."""
    hint = HALVES.hint(1)
    assert hint == Half(half=1, index=3, receivers=7, window=list(BOUNDS[1]))
    plan = FetchPlan(OID, ME, deadline=None, hint=hint)
    (ask,) = plan.start(0.0)
    assert isinstance(ask, AskOwner) and ask.hint == hint
    plan.handle(Located(0.1, "a", SIZE // 2, "<f4", (125,), V1))
    *_, again = plan.handle(PullEnded(0.2, "a", 10, LOST))
    assert isinstance(again, AskOwner) and again.hint == hint
    assert FetchPlan(OID, ME, deadline=None).start(0.0) == [AskOwner((), 0, OWNER_POLL, PLAIN)]
