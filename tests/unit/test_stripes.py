"""AllreducePlan and stripe bounds, the striped allreduce's pure core: events in, instructions
out (docs/design.md §4, "Striped allreduce")."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from helpers import top_level_imports

import hoplited.collectives.stripes as stripes_module
from hoplite_client.wire.errors import (
    ConnectionLostError,
    HopliteError,
    HopliteTimeoutError,
    InvalidArgumentError,
    PeerUnavailableError,
    UnreachableError,
    error_from_wire,
)
from hoplite_client.wire.ids import ObjectID
from hoplited.collectives.choose import PAIR_GAP, PAIR_MIN_TRANSFER, RING_WAIT_FLOOR, ring_saving
from hoplited.collectives.layout import ALIGN, stripe_bounds
from hoplited.collectives.stripes import (
    COPY_CHECK,
    AllreducePlan,
    Arm,
    Assign,
    Cleanup,
    Commit,
    Event,
    Fail,
    GatherOver,
    InputFailed,
    InputReady,
    Instruction,
    MemberDone,
    NoCopy,
    NodeLost,
    NodeSuspected,
    NodeTrusted,
    Plain,
    Restart,
    ResultReady,
    ResultUnseen,
    RingDone,
    RingFailed,
    StartRing,
    StripeFailed,
    WaitAgain,
    Watch,
    Withdraw,
    stripe_id,
    undelivered,
)

pytestmark = pytest.mark.unit

R = ObjectID(b"\xee" * 20)
I = [ObjectID(bytes([i + 1]) * 20) for i in range(6)]  # noqa: E741 - inputs by index
MIB = 1 << 20
BIG = 4 * MIB  # four inputs: one MiB stripes, the smallest worth striping
DT = "<f4"
TIMEOUT = HopliteTimeoutError("input wait timed out")
STOPPED = PeerUnavailableError("slot 2 lost child 1")


def ready(i: int, *alive: str, size: int = BIG, dtype: str = DT,
          shape: tuple[int, ...] = (BIG // 4,), at: float | None = None) -> InputReady:
    return InputReady(I[i], alive, size, dtype, shape, at=at)


CLEANUP = Cleanup(tuple(stripe_id(R, s) for s in range(4)))


def all_ready() -> list[tuple[Event, list[Instruction]]]:
    """Inputs 0..3 ready on n0..n3 in that order: stripe i on node ni."""
    return [(ready(i, f"n{i}"), [Assign(f"n{i}", i, 0)]) for i in range(4)]


@dataclass(frozen=True)
class Case:
    id: str
    steps: list[tuple[Event, list[Instruction]]]
    n: int = 4
    striped: bool = True
    link: tuple[float, float] = (1.25e9, 1e-4)
    nodes: tuple[str, ...] = ()  # the cluster's, for a pair (default: one per input)
    over: bool | None = None  # whether the plan is over after the last step, if checked


CASES = [
    Case("stripes follow readiness, one per input, and end when every member holds it",
         [(ready(2, "n2"), [Assign("n2", 0, 0)]), (ready(0, "n0"), [Assign("n0", 1, 0)]),
          (ready(3, "n3"), [Assign("n3", 2, 0)]), (MemberDone("n2"), []),
          (ready(1, "n1"), [Assign("n1", 3, 0)]), (MemberDone("n0"), []),
          (MemberDone("n3"), []), (MemberDone("n1"), [CLEANUP]),
          (MemberDone("n1"), [])]),
    Case("a node holding two inputs reduces two stripes; the least loaded holder is chosen",
         [(ready(0, "n0"), [Assign("n0", 0, 0)]), (ready(1, "n0", "n1"), [Assign("n1", 1, 0)]),
          (ready(2, "n0"), [Assign("n0", 2, 0)]), (ready(3, "n1", "n0"), [Assign("n1", 3, 0)]),
          (MemberDone("n0"), []), (MemberDone("n1"), [CLEANUP])]),
    Case("too small to give every input a stripe of a MiB: a plain reduce",
         [(ready(1, "n1", size=BIG - 4, shape=(BIG // 4 - 1,)), [Plain()]),
          (ready(0, "n0"), []), (NodeLost("n1"), [])]),
    Case("a lone input: a plain reduce", [(ready(0, "n0"), [Plain()])], n=1),
    Case("a dtype that cannot be reduced: the plain reduce reports it",
         [(ready(0, "n0", dtype="|S4"), [Plain()])]),
    Case("inputs that disagree fail it, naming the input",
         [(ready(0, "n0"), [Assign("n0", 0, 0)]), (MemberDone("n0"), []),
          (ready(1, "n1", dtype="<i4"), [Fail(InvalidArgumentError(
              f"input {I[1].hex()} is <i4[{BIG // 4}] but the first input was "
              f"<f4[{BIG // 4}]", oid=I[1].hex()), ("n0",))]),
          (ready(2, "n2"), [])]),
    Case("an input that never comes fails it; members drop the result",
         [(ready(0, "n0"), [Assign("n0", 0, 0)]), (InputFailed(I[3], TIMEOUT),
                                                   [Fail(TIMEOUT, ("n0",))])]),
    Case("a member's death: its stripes go to the least loaded live member, once",
         [*all_ready(), (MemberDone("n0"), []),
          (NodeLost("n2"), [Assign("n0", 2, 1)]), (NodeLost("n2"), []),
          (MemberDone("n1"), []), (MemberDone("n3"), []), (MemberDone("n0"), [CLEANUP])]),
    Case("a report of a replaced assignment is stale; the live one's failure is not",
         [*all_ready(), (NodeLost("n1"), [Assign("n0", 1, 1)]),
          (StripeFailed("n1", 1, 0, STOPPED), []),
          (StripeFailed("n1", -1, 0, STOPPED), []),
          (StripeFailed("n0", 1, 1, STOPPED), [Fail(STOPPED, ("n0", "n2", "n3"))])]),
    Case("a lost node holding an input not ready yet is not a member: nothing to redo",
         [(ready(0, "n0"), [Assign("n0", 0, 0)]), (NodeLost("n9"), []),
          (ready(1, "n9", "n1"), [Assign("n1", 1, 0)])]),
    Case("an input whose only holders are lost is waited for again, put again elsewhere",
         [(ready(0, "n0"), [Assign("n0", 0, 0)]), (NodeLost("n1"), []),
          (ready(1, "n1"), [WaitAgain(I[1], ("n1",))]), (ready(1, "n2"), [Assign("n2", 1, 0)])]),
    Case("every member lost while inputs are awaited: the next input's node takes over",
         [(ready(0, "n0"), [Assign("n0", 0, 0)]), (NodeLost("n0"), []),
          (ready(1, "n1"), [Assign("n1", 1, 0), Assign("n1", 0, 1)]),
          (ready(2, "n2"), [Assign("n2", 2, 0)])]),
    Case("every member lost once every input was ready: it fails",
         [(ready(0, "n0"), [Assign("n0", 0, 0)]), (ready(1, "n0"), [Assign("n0", 1, 0)]),
          (NodeLost("n0"), [Fail(PeerUnavailableError(
              f"every node reducing a stripe of {R.hex()} died (last: n0)", node="n0"), ())])],
         n=2),
    Case("a member that fails on its own fails it",
         [*all_ready(), (StripeFailed("n3", -1, 0, STOPPED), [
             Fail(STOPPED, ("n0", "n1", "n2", "n3"))]), (MemberDone("n0"), [])]),
]


WAIT = 0.1
SLOW = (4e6, 1e-4)  # 4 MB/s: a ring of 4 MiB saves far more than WAIT
ARM = Arm(-1.0)  # the wait for the next input, for a ring: made concrete per case (arm_for)
RING4 = StartRing((("n0", (I[0],)), ("n1", (I[1],)), ("n2", (I[2],)), ("n3", (I[3],))))
LOST = PeerUnavailableError("ring member n2 died", node="n2")


def ring_ready() -> list[tuple[Event, list[Instruction]]]:
    """Inputs 0..3 ready on n0..n3 within the ring's wait: the ring starts."""
    return [(ready(0, "n0"), [ARM]), (ready(1, "n1"), [ARM]), (ready(2, "n2"), [ARM]),
            (ready(3, "n3"), [RING4])]


COMMITTED = [Commit(("n0", "n1", "n2", "n3"))]


def restarted(members: tuple[str, ...], last: str) -> Restart:
    """Started over after the commit: nobody holds the result, and its version is retired."""
    return Restart(members, PeerUnavailableError(
        f"every ring member holding {R.hex()} died or failed (last: {last})", node=last),
        retire=True)


def silent_after_commit() -> list[tuple[Event, list[Instruction]]]:
    """n1 done (the commit), n3 failed, then n1 and n2 silent: n0 and n2 drop their ring
    copies to fetch the result, and the plan watches for their copies (and any other)."""
    return [*ring_ready(), (RingDone("n1"), COMMITTED),
            (RingFailed("n3", STOPPED), [Withdraw(("n3",))]), (NodeSuspected("n1"), []),
            (NodeSuspected("n2"), [Withdraw(("n0", "n2")), Watch(("n1", "n2"))])]


def all_done() -> list[tuple[Event, list[Instruction]]]:
    """Every member done, n0 first: committed, the watch running."""
    return [*ring_ready(), (RingDone("n0"), COMMITTED),
            *((RingDone(f"n{i}"), []) for i in range(1, 4))]


def all_ready_ring_off() -> list[tuple[Event, list[Instruction]]]:
    """The wait ran out before any input but the first: stripes."""
    return [(ready(0, "n0"), [ARM]), (GatherOver(), [Assign("n0", 0, 0)]),
            (ready(1, "n1"), [Assign("n1", 1, 0)])]


RING_CASES = [
    Case("every input ready in time on its own node: a ring in node order, whatever the "
         "readiness order; the first member done commits; over once every member is",
         [(ready(3, "n3"), [ARM]), (ready(1, "n1", "n2"), [ARM]), (ready(0, "n0"), [ARM]),
          (ready(2, "n1", "n2"), [RING4]), (RingDone("n2"), COMMITTED),
          (RingDone("n0"), []), (RingDone("n1"), []), (MemberDone("n1"), []),
          (RingDone("n3"), []), (RingDone("n3"), [])], over=True),
    Case("once over, a loss changes nothing: every member holds the result",
         [*all_done(), (NodeLost("n0"), []), (NodeLost("n1"), [])], over=True),
    Case("the wait runs out: stripes for the inputs ready so far, in their order, then on",
         [(ready(2, "n2"), [ARM]), (ready(0, "n0"), [ARM]),
          (GatherOver(), [Assign("n2", 0, 0), Assign("n0", 1, 0)]),
          (ready(3, "n3"), [Assign("n3", 2, 0)]), (GatherOver(), [])]),
    Case("two inputs only on one node: a ring of three, that node adding both",
         [(ready(0, "n0"), [ARM]), (ready(1, "n0"), [ARM]), (ready(2, "n2"), [ARM]),
          (ready(3, "n3"), [StartRing((("n0", (I[0], I[1])), ("n2", (I[2],)),
                                       ("n3", (I[3],))))]), (GatherOver(), [])]),
    Case("every input on one node: no ring, stripes at once",
         [(ready(0, "n0"), [ARM]), (ready(1, "n0"), [ARM]), (ready(2, "n0"), [ARM]),
          (ready(3, "n0"), [Assign("n0", 0, 0), Assign("n0", 1, 0), Assign("n0", 2, 0),
                            Assign("n0", 3, 0)])]),
    Case("a node fallen silent is no ring member: its input's other holder is, or none",
         [(ready(0, "n0"), [ARM]), (NodeSuspected("n1"), []), (ready(1, "n1", "n0"), [ARM]),
          (ready(2, "n2"), [ARM]), (ready(3, "n3"), [StartRing((("n0", (I[0], I[1])),
                                                             ("n2", (I[2],)),
                                                             ("n3", (I[3],))))])]),
    Case("a node lost while gathering is no ring member (its input's other holder is)",
         [(ready(0, "n0"), [ARM]), (ready(1, "n1", "n4"), [ARM]), (NodeLost("n1"), []),
          (ready(2, "n2"), [ARM]), (ready(3, "n3"), [StartRing((("n0", (I[0],)), ("n2", (I[2],)),
                                                              ("n3", (I[3],)),
                                                              ("n4", (I[1],))))])]),
    Case("a member lost before anyone is done: drop the ring, start again (.again())",
         [*ring_ready(), (NodeLost("n2"), [Restart(("n0", "n1", "n3"), LOST)]),
          (RingDone("n0"), []), (RingFailed("n1", STOPPED), [])]),
    Case("a member failing before anyone is done: the same, its error given",
         [*ring_ready(), (RingFailed("n1", STOPPED), [Restart(("n0", "n1", "n2", "n3"),
                                                               STOPPED)])]),
    Case("a member falling silent before anyone is done: drop the ring, start again",
         [*ring_ready(), (NodeSuspected("n9"), []),
          (NodeSuspected("n2"), [Restart(("n0", "n1", "n2", "n3"), PeerUnavailableError(
              "ring member n2 fell silent", node="n2"))]), (NodeSuspected("n1"), [])]),
    Case("a member falling silent after the commit: those not done drop their ring copies "
         "and fetch the result from the member done; over once they hold it",
         [*silent_after_commit(), (ResultReady(("n0",)), [Watch(("n0", "n1", "n2"))]),
          (ResultReady(("n3",)), [])], over=True),
    Case("a member told to fetch the result could not (its store full, say): the plan no "
         "longer waits for its copy",
         [*silent_after_commit(), (RingFailed("n0", STOPPED), []),
          (ResultReady(("n3",)), [])], over=True),
    Case("the member done silent and nobody's copy yet: it is waited for, and a member "
         "answering again must hold the result too",
         [*silent_after_commit(), (RingDone("n0"), []), (NodeTrusted("n2"), [Watch(("n1",))]),
          (NodeTrusted("n1"), []), (ResultReady(("n0", "n3")), [Watch(("n0", "n1", "n3"))]),
          (ResultReady(("n2",)), [])], over=True),
    Case("seed 42, trial 19: the member done fell silent for good; once it is declared dead "
         "nobody is known to hold the result: a bounded check, then start again, the "
         "version retired",
         [*silent_after_commit(), (NodeLost("n1"), [Watch(("n2",), COPY_CHECK)]),
          (NodeLost("n1"), []), (NoCopy(), [restarted(("n0", "n2", "n3"), "n1")]),
          (ResultReady(("n0",)), [])]),
    Case("seed 42, trial 15: the same, but the check finds a copy fetched in time: watch on",
         [*silent_after_commit(), (NodeLost("n1"), [Watch(("n2",), COPY_CHECK)]),
          (ResultReady(("n0",)), [Watch(("n0", "n2"))]), (ResultReady(("n3",)), [])],
         over=True),
    Case("the last holder lost while others still run: they may finish, so wait for them",
         [*ring_ready(), (RingDone("n0"), COMMITTED),
          (NodeLost("n0"), []), (RingDone("n1"), []), (NodeLost("n1"), []),
          (RingFailed("n2", STOPPED), [Withdraw(("n2",))]),
          (RingFailed("n3", STOPPED), [Withdraw(("n3",)), Watch((), COPY_CHECK)]),
          (NoCopy(), [restarted(("n2", "n3"), "n3")])]),
    Case("every member done lost; the check finds the copy a failed member fetched",
         [*ring_ready(), (RingDone("n0"), COMMITTED), (NodeLost("n0"), []),
          (RingFailed("n1", STOPPED), [Withdraw(("n1",))]), (NodeLost("n2"), []),
          (NodeLost("n3"), [Watch((), COPY_CHECK)]), (ResultReady(("n1",)), [])], over=True),
    Case("the watch gave up: a live member done is taken to be enough",
         [*ring_ready(), (RingDone("n0"), COMMITTED),
          (RingFailed("n1", STOPPED), [Withdraw(("n1",))]), (RingDone("n2"), []),
          (RingDone("n3"), [Watch(("n0", "n2", "n3"))]),
          (ResultUnseen(PeerUnavailableError("shard gone")), [])], over=True),
    Case("the watch gave up and nobody is known to hold the result: no check, start again",
         [*ring_ready(), (RingDone("n0"), COMMITTED), (NodeLost("n0"), []),
          (RingFailed("n1", STOPPED), [Withdraw(("n1",))]),
          (RingFailed("n2", STOPPED), [Withdraw(("n2",))]),
          (RingFailed("n3", STOPPED), [Withdraw(("n3",)), Watch((), COPY_CHECK)]),
          (ResultUnseen(PeerUnavailableError("shard gone")),
           [restarted(("n1", "n2", "n3"), "n3")])]),
    Case("silence means nothing to stripes: a silent member keeps its stripes",
         [*all_ready_ring_off(), (NodeSuspected("n1"), [])]),
    Case("after the commit a member's failure or death only loses its copy; a member that "
         "failed is told to drop it and fetch the result",
         [*ring_ready(), (RingDone("n0"), COMMITTED),
          (RingFailed("n1", STOPPED), [Withdraw(("n1",))]), (NodeLost("n2"), []),
          (RingDone("n3"), [Watch(("n0", "n3"))]), (ResultReady(("n1",)), [])], over=True),
    Case("the last member failing after the commit: the plan ends once it fetched the result",
         [*ring_ready(), (RingDone("n0"), COMMITTED), (RingDone("n1"), []),
          (NodeLost("n2"), []), (RingFailed("n3", STOPPED), [Withdraw(("n3",)),
                                                              Watch(("n0", "n1"))]),
          (ResultReady(("n3",)), [])], over=True),
    Case("an input that disagrees while gathering fails it; nothing was started",
         [(ready(0, "n0"), [ARM]), (ready(1, "n1", dtype="<i4"), [Fail(
             InvalidArgumentError(f"input {I[1].hex()} is <i4[{BIG // 4}] but the first input "
                                  f"was <f4[{BIG // 4}]", oid=I[1].hex()), ())])]),
    Case("an input that never comes while gathering fails it",
         [(ready(0, "n0"), [ARM]), (InputFailed(I[3], TIMEOUT), [Fail(TIMEOUT, ())])]),
    Case("an inline-sized object is reduced plainly, with no wait",
         [(ready(0, "n0", size=4096, shape=(1024,)), [Plain()])]),
    Case("not striped: without a ring, the plain reduce (then gets) whatever the size",
         [(ready(0, "n0"), [ARM]), (ready(1, "n0"), [ARM]), (ready(2, "n0"), [ARM]),
          (ready(3, "n0"), [Plain()])], striped=False),
    Case("not striped: a ring at any size where it pays (here 4 MiB at 4 MB/s)",
         [*ring_ready()], striped=False, link=(4e6, 1e-4)),
    Case("not striped: the wait running out gives the plain reduce too",
         [(ready(0, "n0"), [ARM]), (GatherOver(), [Plain()]), (ready(1, "n1"), [])],
         striped=False),
    Case("not striped: a ring all the same when every input is ready on its own node",
         [*ring_ready()], striped=False),
    Case("a ring is not limited by the stripes' MiB each: 8 KiB over 2 members",
         [(ready(1, "n1", size=80 << 10, shape=(20 << 10,)), [ARM]),
          (ready(0, "n0", size=80 << 10, shape=(20 << 10,)),
           [StartRing((("n0", (I[0],)), ("n1", (I[1],))))])], n=2),
    Case("the wait restarts at each input: inputs that keep coming get the ring, a gap longer "
         "than the wait gives the stripes for those ready so far, in their order",
         [(ready(0, "n0"), [ARM]), (ready(1, "n1"), [ARM]),
          (GatherOver(), [Assign("n0", 0, 0), Assign("n1", 1, 0)]),
          (ready(2, "n2"), [Assign("n2", 2, 0)])]),
]


def norm(instructions: list[Instruction]) -> list[object]:
    return [(type(x).__name__, type(x.error).__name__, str(x.error), x.error.data, x.members,
             isinstance(x, Restart) and x.retire)
            if isinstance(x, (Fail, Restart)) else x for x in instructions]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_plan(case: Case) -> None:
    plan = AllreducePlan(R, I[:case.n], "sum")
    for event, expected in case.steps:
        assert norm(plan.handle(event)) == norm(expected), event


def arm_for(case: Case, event: Event) -> Arm:
    """The wait for each next input: the configured one, or what the ring saves if less (but
    not below the floor)."""
    size = event.size if isinstance(event, InputReady) else BIG
    return Arm(min(WAIT, max(RING_WAIT_FLOOR, ring_saving(case.n, size, *case.link))))


@pytest.mark.parametrize("case", RING_CASES, ids=lambda c: c.id)
def test_plan_with_a_ring(case: Case) -> None:
    plan = AllreducePlan(R, I[:case.n], "sum", ring_wait=WAIT, striped=case.striped,
                         link=case.link)
    first: Event | None = None
    for event, expected in case.steps:
        first = first or event
        arm = arm_for(case, first)
        expected = [arm if x == ARM else x for x in expected]
        assert norm(plan.handle(event)) == norm(expected), event
    if case.over is not None:
        assert plan.over == case.over


def test_an_input_listed_twice_is_added_twice_on_a_ring() -> None:
    plan = AllreducePlan(R, [I[0], I[1], I[0]], "sum", ring_wait=WAIT, link=SLOW)
    assert plan.handle(ready(0, "n0")) == [Arm(WAIT)]
    assert plan.handle(ready(1, "n1")) == [StartRing((("n0", (I[0], I[0])), ("n1", (I[1],))))]


def test_a_ring_given_up_runs_again_as_a_ring_once_without_the_lost_or_silent() -> None:
    plan = AllreducePlan(R, I[:4], "sum", ring_wait=WAIT)
    for event, _ in ring_ready():
        plan.handle(event)
    assert norm(plan.handle(NodeSuspected("n3"))) == norm([Restart(
        ("n0", "n1", "n2", "n3"), PeerUnavailableError("ring member n3 fell silent",
                                                       node="n3"))])
    again = plan.again()
    # half the time 4 MiB takes at the default 1.25 GB/s is less than the configured wait
    assert again.rings == 1 and again.suspected == {"n3"} and again.ring_wait == WAIT
    slow = AllreducePlan(R, I[:4], "sum", ring_wait=WAIT, link=(4e6, 1e-4))
    slow.handle(ready(0, "n0"))
    assert slow.again().ring_wait == pytest.approx(0.5 * BIG / 4e6)
    again.handle(NodeLost("n2"))
    # the lost input put again on n1, the silent member's on n0: a ring of the others
    assert again.handle(ready(0, "n0")) == [Arm(WAIT)]
    again.handle(ready(1, "n1"))
    again.handle(ready(2, "n2", "n1"))
    assert again.handle(ready(3, "n3", "n0")) == [StartRing((("n0", (I[0], I[3])),
                                                             ("n1", (I[1], I[2]))))]
    assert norm(again.handle(RingFailed("n1", STOPPED))) == norm([Restart(("n0", "n1"),
                                                                          STOPPED)])
    third = again.again()  # no more rings: the stripes (or a reduce) repair around losses,
    assert third.rings == 0 and third.lost == {"n2"}  # unless a node adds several inputs
    assert third.handle(ready(0, "n0")) == [Arm(third.ring_wait)]
    third.handle(ready(1, "n1"))
    third.handle(ready(2, "n2", "n1"))
    assert third.handle(ready(3, "n3", "n0")) == [StartRing((("n0", (I[0], I[3])),
                                                             ("n1", (I[1], I[2]))))]


def test_past_its_ring_tries_a_plan_takes_the_stripes_unless_a_node_adds_several_inputs(
        ) -> None:
    """chaos --victims 3, seed 28: three deaths gave way two rings, and the stripes on the
    survivor holding four of the inputs took a buffer per input and stripe: its store full."""
    spread = AllreducePlan(R, I[:4], "sum", ring_wait=WAIT, rings=0, crowded=True,
                           cap_wait=False)  # as again() makes it
    assert spread.handle(ready(0, "n0")) == [Arm(WAIT)]
    for i in (1, 2):
        spread.handle(ready(i, f"n{i}"))
    assert spread.handle(ready(3, "n3"))[0] == Assign("n0", 0, 0)
    never = AllreducePlan(R, I[:4], "sum", ring_wait=WAIT, rings=0)  # not run again
    assert never.handle(ready(0, "n0")) == [Assign("n0", 0, 0)]


def test_a_plan_started_again_knows_the_dead() -> None:
    plan = AllreducePlan(R, I[:4], "sum", lost=frozenset({"n1"}))
    plan.handle(ready(0, "n0"))
    assert norm(plan.handle(ready(1, "n1"))) == norm([WaitAgain(I[1], ("n1",))])


@pytest.mark.parametrize("size,itemsize,m", [
    (BIG, 4, 4), (BIG + 4, 4, 4), (256 * MIB, 4, 8), (12 * MIB + 8, 8, 7), (3 * ALIGN, 4, 5),
    (MIB, 12, 3)])
def test_stripes_tile_the_object_on_aligned_whole_elements(size: int, itemsize: int,
                                                           m: int) -> None:
    bounds = stripe_bounds(size, itemsize, m)
    assert len(bounds) == m and bounds[0][0] == 0 and bounds[-1][1] == size
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    assert all(lo % itemsize == 0 and lo % ALIGN == 0 for lo, _ in bounds)
    sizes = [hi - lo for lo, hi in bounds]
    assert max(sizes) - min(sizes) <= 2 * ALIGN * itemsize or size < m * ALIGN


def test_no_inputs_or_an_unknown_op_is_refused() -> None:
    with pytest.raises(InvalidArgumentError):
        AllreducePlan(R, [], "sum")
    with pytest.raises(InvalidArgumentError):
        AllreducePlan(R, I[:4], "median")


def test_stripe_ids_are_distinct_and_stable() -> None:
    ids = {stripe_id(R, s) for s in range(64)}
    assert len(ids) == 64 and stripe_id(R, 3) == stripe_id(R, 3) and R not in ids


def test_the_core_does_no_io() -> None:
    assert not {"asyncio", "socket", "time"} & top_level_imports(stripes_module)


@pytest.mark.parametrize("link, wait", [
    (SLOW, WAIT),  # the ring saves more than the configured wait
    ((125e6, 1e-4), None),  # 1 Gbit/s: it saves less, more than the floor
    ((1.25e9, 1e-4), RING_WAIT_FLOOR),  # 10 Gbit/s: it saves less than the floor
])
def test_each_wait_for_a_ring_is_at_most_what_the_ring_saves(link: tuple[float, float],
                                                            wait: float | None) -> None:
    """Inputs further apart than the ring's saving are better served by the reduce, whose
    partial sum streams while they arrive (but inputs already put are reported some ms apart:
    the floor); a ring run again waits the configured time for its lost input put again,
    whatever the saving."""
    saving = ring_saving(4, 16 * MIB, *link)
    plan = AllreducePlan(R, I[:4], "sum", ring_wait=WAIT, link=link)
    if wait is None:
        assert RING_WAIT_FLOOR < saving < WAIT
    expected = Arm(saving if wait is None else wait)
    big = {"size": 16 * MIB, "shape": (4 * MIB,)}
    assert plan.handle(ready(0, "n0", **big)) == [expected]
    assert plan.handle(ready(1, "n1", **big)) == [expected]
    plan.handle(ready(2, "n2", **big))
    plan.handle(ready(3, "n3", **big))
    plan.handle(RingFailed("n1", STOPPED))
    again = plan.again()
    assert again.handle(ready(0, "n0", **big)) == [Arm(again.ring_wait)]
    assert again.ring_wait >= WAIT


# --- a pair for the last two inputs (docs/design.md §4) ---
NODES = ("n0", "n1", "n2", "n3", "n4")
NEXT = Arm(PAIR_GAP * (BIG / SLOW[0]))  # while pairing: the wait for the next input
# the combiners first, each given the inputs ready so far in order, then the other members
HELD3 = (ready(0, "n0"), ready(1, "n1"), ready(2, "n3"))
PAIR_N2_N4: list[Instruction] = [Assign("n2", 0, 0, True, HELD3), Assign("n4", 1, 0, True, HELD3),
                                 Assign("n0", -1, 0, True), Assign("n1", -1, 0, True),
                                 Assign("n3", -1, 0, True)]
HELD1 = (ready(0, "n0"),)
PAIR_N1_N2: list[Instruction] = [Assign("n1", 0, 0, True, HELD1), Assign("n2", 1, 0, True, HELD1),
                                 Assign("n0", -1, 0, True)]
PAIR_CASES = [
    Case("held until two are missing; the two nodes holding none reduce a half each",
         [(ready(0, "n0"), [ARM]), (GatherOver(), [NEXT]), (ready(1, "n1"), [NEXT]),
          (ready(2, "n3"), PAIR_N2_N4), (ready(3, "n2"), []), (GatherOver(), []),
          (ready(4, "n4"), []), (MemberDone("n4"), []),
          *[(MemberDone(f"n{i}"), []) for i in (0, 1, 2)],
          (MemberDone("n3"), [Cleanup((stripe_id(R, 0), stripe_id(R, 1)))])], n=5),
    Case("inputs further apart than the object takes to cross a link go the plain way",
         [(ready(0, "n0"), [ARM]), (GatherOver(), [NEXT]), (ready(1, "n1"), [NEXT]),
          (GatherOver(), [Plain()]), (ready(2, "n3"), [])], n=5),
    Case("two missing already when the wait runs out",
         [(ready(0, "n0"), [ARM]), (GatherOver(), PAIR_N1_N2)], n=3),
    Case("a combiner that dies has its half reduced again by a live member, a combiner too",
         [(ready(0, "n0"), [ARM]), (GatherOver(), [NEXT]), (ready(1, "n1"), [NEXT]),
          (ready(2, "n3"), PAIR_N2_N4), (NodeLost("n2"), [Assign("n0", 0, 1, True)]),
          (ready(3, "n1"), []), (ready(4, "n4"), []),
          *[(MemberDone(f"n{i}"), []) for i in (0, 1, 3)],
          (MemberDone("n4"), [Cleanup((stripe_id(R, 0), stripe_id(R, 1)))])], n=5),
    Case("every member lost: the allreduce fails rather than wait for an input to take it",
         [(ready(0, "n0"), [ARM]), (GatherOver(), PAIR_N1_N2),
          (NodeLost("n1"), [Assign("n0", 0, 1, True)]),
          (NodeLost("n0"), [Assign("n2", 0, 2, True)]),
          (NodeLost("n2"), [Fail(PeerUnavailableError(
              f"every node reducing a stripe of {R.hex()} died (last: n2)", node="n2"),
              ())])], n=3),
    Case("three nodes hold none: no guess, the held inputs go the plain way",
         [(ready(0, "n0"), [ARM]), (ready(1, "n1"), [ARM]), (GatherOver(), [Plain()]),
          (ready(2, "n2"), [])], n=4, nodes=NODES),
    Case("an input on two nodes leaves one idle node: plain",
         [(ready(0, "n0", "n1"), [ARM]), (GatherOver(), [NEXT]),
          (ready(1, "n2"), [Plain()])], n=4),
    Case("a node lost meanwhile is no guess",
         [(ready(0, "n0"), [ARM]), (NodeLost("n4"), []), (GatherOver(), [NEXT]),
          (ready(1, "n1"), [NEXT]), (ready(2, "n2"), [Plain()])], n=5),
    Case("a silent node is no guess",
         [(ready(0, "n0"), [ARM]), (GatherOver(), [NEXT]), (NodeSuspected("n3"), []),
          (ready(1, "n1"), [NEXT]), (ready(2, "n2"), [Plain()])], n=5),
    Case("every input within the wait: the ring, as without a pair",
         [(ready(0, "n0"), [ARM]), (ready(1, "n1"), [ARM]),
          (ready(2, "n2"), [StartRing((("n0", (I[0],)), ("n1", (I[1],)), ("n2", (I[2],))))])],
         n=3),
    Case("an input that does not match fails the allreduce while held",
         [(ready(0, "n0"), [ARM]), (GatherOver(), [NEXT]),
          (ready(1, "n1", dtype="<i4"), [Fail(InvalidArgumentError(
              f"input {I[1].hex()} is <i4[{BIG // 4}] but the first input was "
              f"<f4[{BIG // 4}]", oid=I[1].hex()), ())])], n=5),
    Case("an input whose wait fails fails the allreduce while held",
         [(ready(0, "n0"), [ARM]), (GatherOver(), [NEXT]), (InputFailed(I[1], TIMEOUT),
                                                          [Fail(TIMEOUT, ())])], n=5),
]


# --- a trio for the last three inputs (docs/design.md §4, "Three combiners") ---
# SLOW carries BIG in 1.05 s: inputs heard 0.3 s apart are closer than TRIO_GAP (0.47 s)
NODES6 = ("n0", "n1", "n2", "n3", "n4", "n5")
CLOSE = (ready(0, "n0", at=0.0), ready(1, "n1", at=0.3), ready(2, "n2", at=0.6))
TRIO: list[Instruction] = [Assign("n3", 0, 0, True, CLOSE), Assign("n4", 1, 0, True, CLOSE),
                           Assign("n5", 2, 0, True, CLOSE), *[Assign(f"n{i}", -1, 0, True)
                                                              for i in range(3)]]
APART = (ready(0, "n0", at=0.0), ready(1, "n1", at=0.6), ready(2, "n2", at=1.2),
         ready(3, "n3", at=1.8))
PAIR_OF_SIX: list[Instruction] = [Assign("n4", 0, 0, True, APART),
                                  Assign("n5", 1, 0, True, APART),
                                  *[Assign(f"n{i}", -1, 0, True) for i in range(4)]]
HELD_ON_TWO = (*CLOSE, ready(3, "n3", "n4"))
THIRDS = Cleanup(tuple(stripe_id(R, s) for s in range(3)))
TRIO_CASES = [
    Case("three missing, three idle, inputs close: a third each, told first",
         [(CLOSE[0], [ARM]), (GatherOver(), [NEXT]), (CLOSE[1], [NEXT]), (CLOSE[2], TRIO),
          (ready(3, "n4"), []), (ready(4, "n3"), []), (ready(5, "n5"), []),
          *[(MemberDone(f"n{i}"), []) for i in range(5)], (MemberDone("n5"), [THIRDS])],
         n=6, nodes=NODES6),
    Case("inputs further apart than TRIO_GAP: a pair, one input later",
         [(APART[0], [ARM]), (GatherOver(), [NEXT]), (APART[1], [NEXT]), (APART[2], [NEXT]),
          (APART[3], PAIR_OF_SIX)], n=6, nodes=NODES6),
    Case("times unknown: a pair",
         [(ready(0, "n0"), [ARM]), (GatherOver(), [NEXT]), (ready(1, "n1"), [NEXT]),
          (ready(2, "n2"), [NEXT]), (ready(3, "n3"), [
              Assign("n4", 0, 0, True, tuple(ready(i, f"n{i}") for i in range(4))),
              Assign("n5", 1, 0, True, tuple(ready(i, f"n{i}") for i in range(4))),
              *[Assign(f"n{i}", -1, 0, True) for i in range(4)]])], n=6, nodes=NODES6),
    Case("four idle with three missing: no trio; a pair once two are",
         [(CLOSE[0], [ARM]), (GatherOver(), [NEXT]), (CLOSE[1], [NEXT]), (CLOSE[2], [NEXT]),
          (HELD_ON_TWO[3], [Assign("n5", 0, 0, True, HELD_ON_TWO),
                            Assign("n6", 1, 0, True, HELD_ON_TWO),
                            *[Assign(f"n{i}", -1, 0, True) for i in range(5)]])],
         n=6, nodes=(*NODES6, "n6")),
    Case("a combiner that dies has its third reduced again by an idle member",
         [(CLOSE[0], [ARM]), (GatherOver(), [NEXT]), (CLOSE[1], [NEXT]), (CLOSE[2], TRIO),
          (NodeLost("n4"), [Assign("n0", 1, 1, True)]), (ready(3, "n3"), []),
          (ready(4, "n5"), []), (ready(5, "n0"), []),
          *[(MemberDone(f"n{i}"), []) for i in (0, 1, 2, 3)],
          (MemberDone("n5"), [THIRDS])], n=6, nodes=NODES6),
]


@pytest.mark.parametrize("case", PAIR_CASES + TRIO_CASES, ids=lambda c: c.id)
def test_plan_with_a_pair(case: Case) -> None:
    plan = AllreducePlan(R, I[:case.n], "sum", ring_wait=WAIT, striped=False, link=SLOW,
                         pair=True, nodes=case.nodes or NODES[:case.n])
    for event, expected in case.steps:
        expected = [Arm(WAIT) if x == ARM else x for x in expected]
        assert norm(plan.handle(event)) == norm(expected), event


@pytest.mark.parametrize("size", [MIB, 2 * MIB - ALIGN])
def test_no_pair_for_halves_below_a_stripe(size: int) -> None:
    plan = AllreducePlan(R, I[:3], "sum", ring_wait=WAIT, striped=False, link=SLOW,
                         pair=True, nodes=NODES[:3])
    assert plan.handle(ready(0, "n0", size=size, shape=(size // 4,))) == [Arm(WAIT)]
    assert plan.handle(GatherOver()) == [Plain()]


@pytest.mark.parametrize("rate", [BIG / PAIR_MIN_TRANSFER * 1.01, 1e12],
                         ids=["just-under-the-least-transfer", "loopback"])
def test_no_pair_for_an_object_that_crosses_a_link_quickly(rate: float) -> None:
    """Its chain would start too late to pay, and a short stream's lost tail waits out a
    retransmission timeout."""
    plan = AllreducePlan(R, I[:3], "sum", ring_wait=WAIT, striped=False, link=(rate, 1e-4),
                         pair=True, nodes=NODES[:3])
    plan.handle(ready(0, "n0"))
    assert plan.handle(GatherOver()) == [Plain()]


def test_a_pair_at_any_size_where_the_daemon_says_so() -> None:
    """``hoplited --pair-min-transfer 0``: loopback clusters take the pair too."""
    plan = AllreducePlan(R, I[:3], "sum", ring_wait=WAIT, striped=False, link=(1e12, 1e-4),
                         pair=True, pair_min_transfer=0.0, nodes=NODES[:3])
    plan.handle(ready(0, "n0"))
    assert any(isinstance(x, Assign) and x.pair for x in plan.handle(GatherOver()))


def test_a_pair_is_kept_when_the_plan_runs_again() -> None:
    plan = AllreducePlan(R, I[:3], "sum", ring_wait=WAIT, pair=True, pair_min_transfer=0.0,
                         nodes=NODES[:3])
    again = plan.again()
    assert again.pair and again.pair_min_transfer == 0.0 and again.nodes == NODES[:3]


def test_no_pair_where_the_link_model_takes_a_tree_for_the_early_inputs() -> None:
    """Hops dear against a half's transfer (here 10 ms against 17 ms): a chain of the early
    inputs would cost more than the pair saves."""
    plan = AllreducePlan(R, I[:6], "sum", ring_wait=WAIT, striped=False, link=(125e6, 0.01),
                         pair=True, nodes=("n0", "n1", "n2", "n3", "n4", "n5"))
    assert len(plan.handle(ready(0, "n0"))) == 1  # the wait for a ring
    assert plan.handle(GatherOver()) == [Plain()]


def _reported(error: HopliteError) -> HopliteError:
    """``error`` as it reaches us when the node itself answered with it."""
    return error_from_wire(error.code, str(error), {})


@pytest.mark.parametrize("error, alive, lost", [
    # nothing reached the node, or it is gone: the node is lost to the allreduce
    (UnreachableError("nothing listens"), True, True),
    (PeerUnavailableError("declared dead"), True, True),
    (ConnectionLostError("reset before an answer"), True, True),
    (HopliteTimeoutError("no answer"), False, True),
    (_reported(InvalidArgumentError("bad stripe")), False, True),
    # the node answered with an error: that stripe failed, the plan judges it
    (HopliteTimeoutError("no answer"), True, False),
    (_reported(InvalidArgumentError("bad stripe")), True, False),
    (_reported(ConnectionLostError("its own link to another broke")), True, False),
    (_reported(PeerUnavailableError("another member is dead")), True, False),
], ids=lambda v: type(v).__name__ if isinstance(v, HopliteError) else str(v))
def test_a_stripe_task_not_delivered(error: HopliteError, alive: bool, lost: bool) -> None:
    got = undelivered("n2", 1, 3, error, alive)
    assert got == (NodeLost("n2") if lost else StripeFailed("n2", 1, 3, error))
