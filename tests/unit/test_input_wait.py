"""A reduce's wait for one input: which shard answers are polled again, slept on, or final.

Tables of (call, expected step) on a bare ``InputWait``, no shard. The property that matters
most: whatever the shard answers, the wait never asks twice in a row without a poll held at the
shard for a good share of its time or a sleep in between (a stored timeout error taken for
the poll's expiry would be asked again at once, forever, at 100% CPU).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from helpers import top_level_imports

from hoplite_client.wire.errors import (
    HopliteError,
    HopliteTimeoutError,
    ObjectNotFoundError,
    PeerUnavailableError,
    error_from_wire,
)
from hoplite_client.wire.ids import ObjectID
from hoplited.collectives import input_wait as input_wait_module
from hoplited.collectives.input_wait import (
    LONG_POLL,
    REWAIT_POLL,
    GiveUp,
    InputWait,
    Poll,
    Ready,
    Sleep,
    Step,
)

OID = ObjectID(bytes([7]) * 20)
EXPIRED = HopliteTimeoutError("object was not available within 30.0s (not put yet)")
# A failed reduce's tombstone, as its shard answers it: a timeout error, at once.
STORED = error_from_wire("timeout", "input 01.. was not available within 0.3s", {})
GONE = ObjectNotFoundError("deleted")
DEAD = PeerUnavailableError("node n1 died producing it", node="n1")


@dataclass(frozen=True)
class Failed:
    """The pending poll raised ``error`` at ``now``."""

    now: float
    error: HopliteError


@dataclass(frozen=True)
class Answered:
    """The shard named holders at ``now``; ``usable``: one is alive and not excluded."""

    now: float
    usable: bool


@dataclass(frozen=True)
class Polled:
    """The driver asks for the next poll at ``now`` (after a Sleep)."""

    now: float


Call = Failed | Answered | Polled


@dataclass(frozen=True)
class Case:
    id: str
    deadline: float | None  # the first poll is sent at time 0
    steps: list[tuple[Call, Step | type[GiveUp]]]


def run(wait: InputWait, call: Call) -> Step:
    if isinstance(call, Failed):
        return wait.failed(call.now, call.error)
    if isinstance(call, Answered):
        return wait.answered(call.now, call.usable, ["n1"])
    return wait.poll(call.now)


CASES = [
    Case("no-deadline-poll-expires-and-is-asked-again", None, [
        (Failed(30.0, EXPIRED), Poll(LONG_POLL)),
        (Failed(60.0, EXPIRED), Poll(LONG_POLL)),
        (Answered(61.0, True), Ready()),
    ]),
    Case("no-deadline-stored-timeout-is-the-inputs-failure", None, [
        (Failed(0.01, STORED), GiveUp(STORED)),
    ]),
    Case("stored-timeout-after-a-long-poll-expired", None, [
        (Failed(30.0, EXPIRED), Poll(LONG_POLL)),
        (Failed(30.02, STORED), GiveUp(STORED)),  # the earlier reduce failed meanwhile
    ]),
    Case("far-deadline-stored-timeout-is-final", 100.0, [
        (Failed(0.0, STORED), GiveUp(STORED)),
    ]),
    Case("far-deadline-polls-until-the-last-one", 70.0, [
        (Failed(30.0, EXPIRED), Poll(LONG_POLL)),
        (Failed(60.0, EXPIRED), Poll(10.0)),  # the rest of the reduce's time
        (Failed(70.0, EXPIRED), GiveUp(EXPIRED)),  # the reduce's own timeout
    ]),
    Case("short-deadline-expiry-is-the-reduces-timeout", 0.3, [
        (Failed(0.3, EXPIRED), GiveUp(EXPIRED)),
    ]),
    Case("deadline-passed-poll-of-zero-is-final", 0.0, [
        (Failed(0.0, EXPIRED), GiveUp(EXPIRED)),
    ]),
    Case("other-errors-are-final", None, [
        (Failed(0.0, GONE), GiveUp(GONE)),
    ]),
    Case("a-dead-producer-is-final", None, [
        (Failed(5.0, DEAD), GiveUp(DEAD)),
    ]),
    Case("no-usable-holder-sleeps-then-polls", None, [
        (Answered(0.01, False), Sleep(REWAIT_POLL)),
        (Polled(0.11), Poll(LONG_POLL)),
        (Answered(0.12, True), Ready()),
    ]),
    Case("no-usable-holder-near-the-deadline-times-out", 2.0, [
        (Answered(1.0, False), Sleep(REWAIT_POLL)),
        (Polled(1.5), Poll(0.5)),
        (Answered(1.9375, False), GiveUp),
    ]),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_steps(case: Case) -> None:
    wait = InputWait(OID, case.deadline)
    first = wait.poll(0.0)
    assert first == Poll(LONG_POLL if case.deadline is None else min(case.deadline, LONG_POLL))
    for i, (call, want) in enumerate(case.steps):
        got = run(wait, call)
        if want is GiveUp:
            assert isinstance(got, GiveUp), f"step {i}: {got}"
            assert isinstance(got.error, HopliteTimeoutError) and OID.hex() in str(got.error)
        else:
            assert got == want, f"step {i} ({call}): {got} != {want}"


@pytest.mark.parametrize("deadline", [None, 0.0, 0.3, 45.0, 1000.0])
@pytest.mark.parametrize("error", [EXPIRED, STORED, GONE])
def test_an_instant_answer_is_never_asked_again_at_once(deadline: float | None,
                                                        error: HopliteError) -> None:
    """The spin: a shard that answers every poll at once with an error. Each answer either
    ends the wait or is followed by a sleep; never by another poll at the same instant."""
    wait = InputWait(OID, deadline)
    wait.poll(0.0)
    assert isinstance(wait.failed(0.0, error), GiveUp)


def test_an_instant_empty_answer_always_sleeps_first() -> None:
    wait = InputWait(OID, None)
    for i in range(100):
        wait.poll(i * REWAIT_POLL)
        assert wait.answered(i * REWAIT_POLL, False, []) == Sleep(REWAIT_POLL)


def test_pure_module_imports_no_io() -> None:
    assert not top_level_imports(input_wait_module) & {"asyncio", "socket", "time", "os", "threading"}
