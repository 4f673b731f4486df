"""ReducePlan.validate: the plan's records agree after every event, and a record that
disagrees is named with the slot's last events."""

from __future__ import annotations

from collections.abc import Callable
from typing import get_args

import pytest

from hoplite_client.wire.errors import PeerUnavailableError
from hoplite_client.wire.ids import ObjectID
from hoplited.collectives.plan import (
    EVENT_HANDLERS,
    SLOT_TRANSITIONS,
    ChildLost,
    Event,
    FoldState,
    InputReady,
    Merge,
    NodeDied,
    Redo,
    ReducePlan,
    SlotState,
    TaskStarted,
)

pytestmark = pytest.mark.unit

R = ObjectID(b"\xee" * 20)
I = [ObjectID(bytes([i + 1]) * 20) for i in range(4)]  # noqa: E741 - inputs by index
BIG = 1 << 20


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
    plan.validate()


def placed_and_redone(plan: ReducePlan) -> str:
    slot = min(plan.slots)
    plan.redo[slot] = Redo(plan.slots[slot].input, plan.slots[slot].node, 1, 0)
    return f"slot {slot} is placed and redo at once"


def placed_and_merged(plan: ReducePlan) -> str:
    slot = max(plan.slots)
    plan.merged[slot] = Merge(slot, min(plan.slots), I[0], b"v0")
    return f"slot {slot} is placed and merged at once"


def indexed_on_another_node(plan: ReducePlan) -> str:
    slot = min(plan.slots)
    plan.slots[slot].node = "elsewhere"
    return f"slot {slot} is indexed on"


def waiting_without_a_redo(plan: ReducePlan) -> str:
    plan._wanted[I[3]] = [2]
    return "slot 2 waits for"


def placed_then_folded(plan: ReducePlan) -> str:
    slot = max(plan.slots)
    plan._drop_slot(slot)
    plan.folds[slot] = FoldState(slot, I[0], b"v0", "n0", min(plan.slots), 0, 0, 1, [])
    return f"slot {slot} went from placed to folded, which SLOT_TRANSITIONS does not allow"


def broken_pull_of_no_slot(plan: ReducePlan) -> str:
    slot = min(plan.slots)
    plan._drop_slot(slot)
    plan._broken[slot] = 10
    return f"slot {slot} has a broken pull but is not placed"


@pytest.mark.parametrize("corrupt", [placed_and_redone, placed_and_merged,
                                     indexed_on_another_node, waiting_without_a_redo,
                                     placed_then_folded, broken_pull_of_no_slot])
def test_records_that_disagree_are_named_with_the_last_events(
        corrupt: Callable[[ReducePlan], str]) -> None:
    plan = running_plan()
    expected = corrupt(plan)
    with pytest.raises(AssertionError, match=expected) as caught:
        plan.validate()
    assert "TaskStarted" in str(caught.value)  # the story comes with it


def test_each_slot_moves_only_as_the_transition_table_allows() -> None:
    """Every state is reachable from free, and each move's ends are states."""
    states = set(get_args(SlotState))
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
