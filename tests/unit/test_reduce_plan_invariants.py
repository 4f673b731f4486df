"""ReducePlan's slot states: each move is checked against SLOT_TRANSITIONS as it is made, and
validate() finds an index or a record that disagrees with the table after an event; either
names the slot with the plan's last events."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import get_args

import pytest

from hoplite_client.wire.errors import PeerUnavailableError
from hoplite_client.wire.ids import ObjectID
from hoplited.collectives.plan import (
    EVENT_HANDLERS,
    SLOT_STATES,
    SLOT_TRANSITIONS,
    Absorb,
    ChildLost,
    Event,
    FoldState,
    InputReady,
    Instruction,
    Merge,
    NodeDied,
    Published,
    Redo,
    ReducePlan,
    Slot,
    SlotRecord,
    SlotState,
    TaskStarted,
)

pytestmark = pytest.mark.unit

R = ObjectID(b"\xee" * 20)
I = [ObjectID(bytes([i + 1]) * 20) for i in range(4)]  # noqa: E741 - inputs by index
BIG = 1 << 20
FREE = 9  # a slot number no input of running_plan takes


def running_plan() -> ReducePlan:
    """Four inputs on four nodes, every slot's task started and connected."""
    plan = ReducePlan(R, I, 4, "sum", "me", lambda k, size: k)
    for i in range(4):
        plan.handle(InputReady(I[i], (f"n{i}",), (f"n{i}",), BIG, "<f4", (BIG // 4,),
                               b"v%d" % i))
    for slot, placed in sorted(plan.slots.items()):
        if placed.task:
            plan.handle(TaskStarted(slot, 0, b"t%d" % slot))
    plan.validate()
    return plan


def test_a_repair_keeps_the_records_in_agreement() -> None:
    plan = running_plan()
    slot, placed = next((s, p) for s, p in sorted(plan.slots.items())
                        if plan.shape is not None and plan.shape.parent[s] is not None)
    parent = plan.shape.parent[slot] if plan.shape is not None else None
    assert parent is not None and placed.version is not None
    plan.handle(ChildLost(parent, slot, placed.version, 100, True,
                          PeerUnavailableError("stream broke"), plan.slots[parent].version))
    plan.handle(NodeDied(placed.node))
    assert slot in plan.redo and slot not in plan.slots
    assert plan.slot_state(slot) == "redo"
    plan.validate()


def test_the_views_are_read_only_and_follow_the_table() -> None:
    plan = running_plan()
    view = plan.redo
    with pytest.raises(TypeError):
        view[0] = Redo(I[0], "n0", 1, 0)  # type: ignore[index]
    plan._move(0, "redo", Redo(I[0], "n0", 1, 0))
    assert 0 in view and 0 not in plan.slots  # a view taken earlier sees the move
    assert {s for s in range(4) if plan.slot_state(s) == "placed"} == set(plan.slots)


# --- a record that disagrees with the table is found by validate() ---
def table_says_redo_of_a_placement(plan: ReducePlan) -> str:
    slot = min(plan.slots)
    plan._table[slot].state = "redo"
    return f"slot {slot} is redo with Slot"


def indexed_in_two_states(plan: ReducePlan) -> str:
    slot = max(plan.slots)
    plan._merged[slot] = Merge(slot, min(plan.slots), I[0], b"v0")
    return f"slot {slot} is indexed as merged but is placed"


def indexed_on_another_node(plan: ReducePlan) -> str:
    slot = min(plan.slots)
    plan.slots[slot].node = "elsewhere"
    return f"slot {slot} is indexed on"


def waiting_without_a_redo(plan: ReducePlan) -> str:
    plan._repairs.wanted[I[3]] = [2]
    return "slot 2 waits for"


def lifted_and_left(plan: ReducePlan) -> str:
    slot = min(plan.slots)
    plan._lift(slot)
    return f"slot {slot} was lifted out of placed and given no state"


def broken_pull_of_no_slot(plan: ReducePlan) -> str:
    slot = min(plan.slots)
    plan._move(slot, "redo", Redo(plan.slots[slot].input, plan.slots[slot].node, 1, 0))
    plan._repairs.broken[slot] = 10
    return f"slot {slot} has a broken pull but is not placed"


def absorb_not_indexed(plan: ReducePlan) -> str:
    slot = max(plan.slots)
    plan._table[slot].absorb = absorb(slot)
    return f"slot {slot} has an absorb not indexed so"


def published_before_complete(plan: ReducePlan) -> str:
    plan.published = True
    return "published before complete"


@pytest.mark.parametrize("corrupt", [table_says_redo_of_a_placement, indexed_in_two_states,
                                     indexed_on_another_node, waiting_without_a_redo,
                                     lifted_and_left, broken_pull_of_no_slot,
                                     absorb_not_indexed, published_before_complete])
def test_records_that_disagree_are_named_with_the_last_events(
        corrupt: Callable[[ReducePlan], str]) -> None:
    plan = running_plan()
    expected = corrupt(plan)
    with pytest.raises(AssertionError, match=expected) as caught:
        plan.validate()
    assert "TaskStarted" in str(caught.value)  # the story comes with it


# --- each move is checked as it is made ---
def absorb(slot: int) -> Absorb:
    return Absorb(slot, "n9", I[0], b"v0", 1, 0, 0, I[1], b"v1", 2)


def record(state: SlotState, slot: int) -> SlotRecord | None:
    """A record of the kind ``state`` keeps, for ``slot``."""
    fold = FoldState(slot, I[0], b"v0", "n9", 0, 2, 0, 1, [])
    records: dict[SlotState, SlotRecord | None] = {
        "free": None, "placed": Slot("n9", I[0], I[0], b"v0", task=True),
        "redo": Redo(I[0], "n9", 1, 0), "merged": Merge(slot, 0, I[0], b"v0"),
        "folding": fold, "folded": fold, "absorbing": absorb(slot)}
    return records[state]


def moved_to(state: SlotState) -> ReducePlan:
    """A running plan whose slot ``FREE`` got to ``state`` by allowed moves."""
    plan = running_plan()
    came: dict[SlotState, SlotState | None] = {"free": None}
    frontier: deque[SlotState] = deque(["free"])
    while frontier:
        here = frontier.popleft()
        for start, end in sorted(SLOT_TRANSITIONS):
            if start == here and end not in came:
                came[end] = here
                frontier.append(end)
    path: list[SlotState] = []
    at: SlotState | None = state
    while at is not None and at != "free":
        path.append(at)
        at = came[at]
    for step in reversed(path):
        plan._move(FREE, step, record(step, FREE))
    assert plan.slot_state(FREE) == state
    plan.validate()
    return plan


@pytest.mark.parametrize("start, end", [(a, b) for a in SLOT_STATES for b in SLOT_STATES])
def test_each_move_is_checked_as_it_is_made(start: SlotState, end: SlotState) -> None:
    """An allowed move changes the slot's state and keeps the indexes; a forbidden one raises
    at once, naming the slot and the move with the plan's last events, and changes nothing."""
    plan = moved_to(start)
    if (start, end) in SLOT_TRANSITIONS:
        plan._move(FREE, end, record(end, FREE))
        assert plan.slot_state(FREE) == end
        assert (FREE in plan.slots) == (end == "placed")
        assert (FREE in plan.redo) == (end == "redo")
        assert (FREE in plan.merged) == (end == "merged")
        assert (FREE in plan.folds) == (end == "folded")
        # an absorb goes with the slot into its placement
        assert (FREE in plan.absorbing) == (end == "absorbing" or start == "absorbing"
                                            and end == "placed")
    else:
        with pytest.raises(AssertionError, match=f"slot {FREE} went from {start} to {end}, "
                                                 f"which SLOT_TRANSITIONS does not allow"
                           ) as caught:
            plan._move(FREE, end, record(end, FREE))
        assert "TaskStarted" in str(caught.value)  # the story comes with it
        assert plan.slot_state(FREE) == start
    plan.validate()


@pytest.mark.parametrize("start, end", [("placed", "redo"), ("placed", "placed"),
                                        ("placed", "folded"), ("redo", "redo"),
                                        ("redo", "folding")])
def test_a_lifted_slot_moves_as_from_the_state_it_left(start: SlotState,
                                                       end: SlotState) -> None:
    plan = moved_to(start)
    plan._lift(FREE)
    assert FREE not in plan.slots and FREE not in plan.redo  # no lookup sees it
    if (start, end) in SLOT_TRANSITIONS:
        plan._move(FREE, end, record(end, FREE))
        plan.validate()
    else:
        with pytest.raises(AssertionError, match=f"went from {start} to {end}"):
            plan._move(FREE, end, record(end, FREE))


def test_a_record_of_another_kind_is_refused() -> None:
    plan = moved_to("placed")
    with pytest.raises(AssertionError, match=f"slot {FREE} went to redo with Slot.*not a Redo"):
        plan._move(FREE, "redo", record("placed", FREE))
    assert plan.slot_state(FREE) == "placed"


def test_an_absorb_goes_with_the_slot_into_its_placement_only() -> None:
    plan = moved_to("absorbing")
    plan._move(FREE, "placed", record("placed", FREE))
    assert plan.absorbing[FREE] is plan._table[FREE].absorb
    plan._absorb_done(FREE)
    plan._move(FREE, "placed", record("placed", FREE))  # placed again: still took it over
    assert FREE in plan.absorbed and FREE not in plan.absorbing
    plan.validate()
    plan._move(FREE, "redo", record("redo", FREE))
    assert FREE not in plan.absorbed and plan._table[FREE].absorb is None
    plan.validate()


def test_a_move_refused_while_an_event_is_handled_tells_that_event(
        monkeypatch: pytest.MonkeyPatch) -> None:
    plan = running_plan()

    def corrupt(plan: ReducePlan, ev: Published) -> list[Instruction]:
        plan._move(0, "folded", record("folded", 0))
        return []

    monkeypatch.setitem(EVENT_HANDLERS, Published, corrupt)
    with pytest.raises(AssertionError, match="slot 0 went from placed to folded") as caught:
        plan.handle(Published())
    assert "Published() (being handled)" in str(caught.value)
    assert "TaskStarted" in str(caught.value)


def test_every_state_is_reachable_and_each_move_is_between_states() -> None:
    states = set(get_args(SlotState))
    assert set(SLOT_STATES) == states
    assert {end for move in SLOT_TRANSITIONS for end in move} <= states
    reached, frontier = {"free"}, ["free"]
    while frontier:
        here = frontier.pop()
        for start, end in SLOT_TRANSITIONS:
            if start == here and end not in reached:
                reached.add(end)
                frontier.append(end)
    assert reached == states


def test_every_event_has_one_handler() -> None:
    assert set(EVENT_HANDLERS) == set(get_args(Event))
