"""ReducePlan, the reduce coordinator's pure core: tables of events and exact instructions."""

from __future__ import annotations

import importlib
import itertools
import random
import sys
import typing
from dataclasses import dataclass, replace

import pytest
from helpers import top_level_imports
from hypothesis import given, settings
from hypothesis import strategies as st

import hoplited.collectives.plan as plan_module
from hoplite_client.wire.errors import (
    ConnectionLostError,
    HopliteError,
    HopliteTimeoutError,
    InvalidArgumentError,
    ObjectNotFoundError,
    PeerUnavailableError,
    error_from_wire,
)
from hoplite_client.wire.frames import INLINE_MAX
from hoplite_client.wire.ids import ObjectID
from hoplited.collectives.coordinator import INSTRUCTION_HANDLERS
from hoplited.collectives.ops import derived_id
from hoplited.collectives.plan import (
    HISTORY_MAX,
    LATE_HOLD,
    After,
    CancelWaits,
    ChildLost,
    CombineInline,
    Connect,
    Event,
    Fail,
    Fold,
    Folded,
    FoldFailed,
    HoldOver,
    Hurry,
    InputFailed,
    InputReady,
    Instruction,
    NodeDied,
    NodeSuspected,
    NodeTrusted,
    OpenResult,
    Publish,
    Published,
    PullRoot,
    ReducePlan,
    ReduceSpec,
    Release,
    Reshape,
    Reshaped,
    RestartResult,
    ResultComplete,
    ResultFailed,
    Retry,
    SlotFailed,
    StartTask,
    TaskStarted,
    WaitInput,
    redo_path,
)
from hoplited.collectives.tree import tree_shape

pytestmark = pytest.mark.unit

ME = "me"
R = ObjectID(b"\xee" * 20)
I = [ObjectID(bytes([i + 1]) * 20) for i in range(8)]  # noqa: E741 - inputs by index
BIG = 1 << 20
DT = "<f4"
SHAPE = (BIG // 4,)
SMALL = 64
OPEN = OpenResult(BIG, DT, SHAPE)
TIMEOUT = HopliteTimeoutError("input wait timed out")
GONE = ObjectNotFoundError("input deleted")
BROKEN = PeerUnavailableError("stream broke", node="n1")
REPORTED = error_from_wire("unavailable", "slot 1: its input vanished", {})


def v(i: int) -> bytes:
    """The version of input ``i``."""
    return b"v%d" % i


def t(slot: int) -> bytes:
    """The version of slot ``slot``'s task output."""
    return b"t%d" % slot


def out(slot: int, gen: int = 0) -> ObjectID:
    return derived_id(R, slot, b"out%d" % gen)


def ready(i: int, *holders: str, alive: tuple[str, ...] | None = None, size: int = BIG,
          dtype: str = DT, shape: tuple[int, ...] = SHAPE) -> InputReady:
    return InputReady(I[i], holders, holders if alive is None else alive, size, dtype, shape,
                      v(i))


def task(slot: int, node: str, i: int, output: ObjectID, children: int, gen: int = 0,
         start: int = 0) -> StartTask:
    return StartTask(slot, gen, node, I[i], output, "sum", DT, SHAPE, children, start)


def conn(parent: int, parent_node: str, child: int, child_node: str, child_output: ObjectID,
         version: bytes) -> Connect:
    return Connect(parent, parent_node, child, child_node, child_output, version)


def cancel(*idx: int) -> CancelWaits:
    return CancelWaits(tuple(I[i] for i in idx))


def started(slot: int, gen: int = 0) -> TaskStarted:
    return TaskStarted(slot, gen, t(slot) + b".%d" % gen if gen else t(slot))


def lost(node: str, slot: int, redo: list[int]) -> Fail:
    return Fail(PeerUnavailableError(f"node {node} died holding slot {slot} of reduce {R.hex()}",
                                     node=node, slot=slot, redo=redo))


def mismatch(i: int, got: str, first: str) -> Fail:
    return Fail(InvalidArgumentError(f"input {I[i].hex()} is {got} but the first input was "
                                     f"{first}", oid=I[i].hex()))


def norm(instructions: list[Instruction]) -> list[object]:
    """Errors compare by identity: compare a Fail by its error's class, message and data. An
    edge's parent version is the parent's task output's, checked apart (``addressed``)."""
    return [("Fail", type(x.error).__name__, str(x.error), x.error.data)
            if isinstance(x, Fail) else replace(x, parent_version=b"")
            if isinstance(x, Connect) else x for x in instructions]


@dataclass(frozen=True)
class Case:
    id: str
    k: int
    steps: list[tuple[Event, list[Instruction]]]
    n: int = 0  # inputs I[0..n-1]; 0: k of them
    depth: int = 0
    inputs: tuple[int, ...] = ()  # explicit input indices (overrides n)
    patience: float = 1.5
    everyone: bool = False  # an allreduce
    here: bool = False  # an allreduce: an input is ready on this node already
    merge: bool = True  # a slot adds the other inputs ready on its node


DONE: tuple[Event, list[Instruction]] = (ResultComplete(), [Publish()])
# A chain of three (n0's leaf, n1, root on n2), every task started and every edge connected.
RUNNING_CHAIN: list[tuple[Event, list[Instruction]]] = [
    (ready(0, "n0"), [OPEN]),
    (ready(1, "n1"), [task(1, "n1", 1, out(1), 1)]),
    (ready(2, "n2"), [task(2, "n2", 2, out(2), 1)]),
    (started(1), [conn(1, "n1", 0, "n0", I[0], v(0))]),
    (started(2), [conn(2, "n2", 1, "n1", out(1), t(1)), PullRoot("n2", out(2), t(2))]),
]

# A chain of four (n0's leaf, n1, n2, root on n3), running.
RUNNING_CHAIN4: list[tuple[Event, list[Instruction]]] = [
    (ready(0, "n0"), [OPEN]),
    (ready(1, "n1"), [task(1, "n1", 1, out(1), 1)]),
    (ready(2, "n2"), [task(2, "n2", 2, out(2), 1)]),
    (ready(3, "n3"), [task(3, "n3", 3, out(3), 1)]),
    (started(1), [conn(1, "n1", 0, "n0", I[0], v(0))]),
    (started(2), [conn(2, "n2", 1, "n1", out(1), t(1))]),
    (started(3), [conn(3, "n3", 2, "n2", out(2), t(2)), PullRoot("n3", out(3), t(3))]),
]
# Slot 2 of that chain lost at byte 802, its input back on n1 (slot 1, below it) and folded
# there from byte 1200: its consumer takes slot 1's output and the input's bytes 800..1200.
FOLDED_LATE: list[tuple[Event, list[Instruction]]] = [
    *RUNNING_CHAIN4,
    (ChildLost(3, 2, t(2), 802, True, BROKEN, t(3)), [WaitInput(I[2], ("n2",))]),
    (ready(2, "n1"), [Fold(2, 1, "n1", t(1), I[2], v(2), 800)]),  # a whole element: 800
    (Folded(2, 1, 1200), [Reshape(3, "n3", t(3), 2, 800, 2)]),
    (Reshaped(2), [Connect(3, "n3", 1, "n1", out(1), t(1), 800),
                   Connect(3, "n3", 6, "n1", I[2], v(2), 800, 1200)]),
]

# Slot 2 of that chain lost at 802, its input back on n0 where only leaf 0 runs: slot 1 stops
# adding the leaf's input at 1600 (asked: from 804, the first whole element its consumer
# has no byte of) and slot 2, placed on n0, adds it from there.
ABSORBED: list[tuple[Event, list[Instruction]]] = [
    *RUNNING_CHAIN4,
    (ChildLost(3, 2, t(2), 802, True, BROKEN, t(3)), [WaitInput(I[2], ("n2",))]),
    (ready(2, "n0"), [Reshape(1, "n1", t(1), 0, 804, 0)]),  # lost at 802: from 804
    (Reshaped(0, 1600), [task(2, "n0", 2, out(2, 1), 1, gen=1, start=802)]),
    (started(2, gen=1), [Fold(2, 2, "n0", t(2) + b".1", I[0], v(0), 1600)]),  # edges wait
    (Folded(2, 2, 1600), [conn(3, "n3", 2, "n0", out(2, 1), t(2) + b".1"),
                          conn(2, "n0", 1, "n1", out(1), t(1))]),
    (Folded(2, 2, 1600), []),
]

# The chain above with two backups (inputs 3 and 4), nothing connected yet.
BACKUP_CHAIN: list[tuple[Event, list[Instruction]]] = [
    (ready(0, "n0"), [OPEN]),
    (ready(1, "n1"), [task(1, "n1", 1, out(1), 1)]),
    (ready(2, "n2"), [task(2, "n2", 2, out(2), 1), cancel(3, 4)]),
]

# A chain of four: n1's leaf, n2's slot 1, which adds input 2 as well (slot 2 left the chain),
# and the root on n3; running.
MERGED: list[tuple[Event, list[Instruction]]] = [
    (ready(0, "n1"), [OPEN]),
    (ready(1, "n2"), [task(1, "n2", 1, out(1), 1)]),
    (ready(2, "n2"), []),  # slot 1 has combined nothing: it adds input 2, told once started
    (ready(3, "n3"), [task(3, "n3", 3, out(3), 1)]),  # the root: slot 2 is gone
    (started(1), [Fold(2, 1, "n2", t(1), I[2], v(2), 0), conn(1, "n2", 0, "n1", I[0], v(0))]),
    (started(3), [conn(3, "n3", 1, "n2", out(1), t(1)), PullRoot("n3", out(3), t(3))]),
    (Folded(2, 1, 0, t(1)), []),
]

# MERGED, then n2 (slot 1, which adds input 2) dies: everything starts again, both inputs
# are waited for apart. Slot 1's output is all in its consumer's hands, or not: its pull
# broke at 500.
HOST_LOST: list[tuple[Event, list[Instruction]]] = [
    *MERGED,
    (NodeDied("n2"), []),
    (ChildLost(3, 1, t(1), 500, True, BROKEN, t(3)),
     [RestartResult(), WaitInput(I[1], ("n2",)), task(3, "n3", 3, out(3, 1), 1, gen=1),
      WaitInput(I[2], ("n2",))]),
]


def back_together(node: str, leaf: str) -> list[tuple[Event, list[Instruction]]]:
    """After a restart of the chain leaf → 1 → 2 → root 3 (task 3 placed, gen 1): inputs 1
    and 2 are put again on ``node``; slot 1 adds input 2, slot 2 leaves the chain, and the
    reduce ends (``leaf``: slot 0's node)."""
    return [
        (ready(1, node), [task(1, node, 1, out(1, 1), 1, gen=1)]),
        (ready(2, node), []),
        (started(1, gen=1), [Fold(2, 1, node, t(1) + b".1", I[2], v(2), 0),
                             conn(1, node, 0, leaf, I[0], v(0))]),
        (started(3, gen=1), [conn(3, "n3", 1, node, out(1, 1), t(1) + b".1"),
                             PullRoot("n3", out(3, 1), t(3) + b".1")]),
        (Folded(2, 1, 0, t(1) + b".1"), []),
        DONE,
    ]


# A source that answers a pull with "no copy of that version here".
NO_COPY = error_from_wire("not_found", "source n0 refused: no copy here", {})
# A holder the input's shard named, whose task finds no complete copy of that input there.
LACKING = error_from_wire("not_found", "input is not complete here", {"oid": I[1].hex()})

CASES = [
    # --- choosing inputs and slots ---
    Case("k3-of-5-arrival-4-1-2-local-2-takes-root", k=3, n=5, depth=1, steps=[
        (ready(4, "n4"), [OPEN]),  # slot 0, a leaf: no task
        (ready(1, "n1", "n9", alive=("n9",)), []),  # slot 2, a leaf on its live holder
        (ready(2, "n2", ME), [task(1, ME, 2, R, 2), cancel(0, 3)]),
        (started(1), [conn(1, ME, 0, "n4", I[4], v(4)), conn(1, ME, 2, "n9", I[1], v(1))]),
        DONE,
        (Published(), [Release((ME,))]),
        (NodeDied("n4"), []),
    ]),
    # chaos seed 31, trial 2: a consumer's report of a broken pull came while we suspected
    # the consumer; it answered again, and the pull must resume (it hung for good)
    Case("pull-broken-while-its-consumer-is-suspected-resumes-when-trusted", k=3, steps=[
        *RUNNING_CHAIN,
        (NodeSuspected("n1"), []),
        (ChildLost(1, 0, v(0), 500, False, BROKEN, t(1)), []),
        (NodeTrusted("n1"), [conn(1, "n1", 0, "n0", I[0], v(0))]),
        (NodeTrusted("n1"), []),  # once
        DONE,
    ]),
    Case("retry-due-while-its-consumer-is-suspected-waits-for-it", k=3, steps=[
        *RUNNING_CHAIN,
        (ChildLost(1, 0, v(0), 500, False, BROKEN, t(1)), [After(0.1, Retry(0, v(0)))]),
        (NodeSuspected("n1"), []),
        (Retry(0, v(0)), []),
        (NodeTrusted("n1"), [conn(1, "n1", 0, "n0", I[0], v(0))]),
    ]),
    Case("connect-to-a-consumer-suspected-meanwhile-is-sent-again-when-trusted", k=3, steps=[
        *RUNNING_CHAIN,
        (ChildLost(1, 0, v(0), 500, False, BROKEN, t(1)), [After(0.1, Retry(0, v(0)))]),
        (Retry(0, v(0)), [conn(1, "n1", 0, "n0", I[0], v(0))]),
        (NodeSuspected("n1"), []),
        (SlotFailed(1, None, BROKEN, child=0), []),
        (NodeTrusted("n1"), [conn(1, "n1", 0, "n0", I[0], v(0))]),
    ]),
    Case("broken-pull-of-a-suspected-consumer-whose-child-died-meanwhile-is-redone", k=3, steps=[
        *RUNNING_CHAIN,
        (NodeSuspected("n1"), []),
        (ChildLost(1, 0, v(0), 500, False, BROKEN, t(1)), []),
        (NodeDied("n0"), []),  # its consumer is lost to us, for now
        (NodeTrusted("n1"), [WaitInput(I[0], ("n0",))]),
    ]),
    # chaos seed 31, trial 2, with the pull above resumed: a leaf's node withdrew its copy of
    # the input once healed (the id was put again elsewhere); reconnecting could never succeed
    Case("leaf-whose-node-lost-its-input-is-redone-on-another-holder", k=3, steps=[
        *RUNNING_CHAIN,
        (ChildLost(1, 0, v(0), 500, False, NO_COPY, t(1)), [WaitInput(I[0], ("n0",))]),
        (ready(0, "n0", "n7"), [conn(1, "n1", 0, "n7", I[0], v(0))]),
    ]),
    Case("task-output-missing-is-reconnected-as-before", k=3, steps=[
        *RUNNING_CHAIN,
        (ChildLost(2, 1, t(1), 500, False, NO_COPY, t(2)), [After(0.1, Retry(1, t(1)))]),
    ]),
    # a node named as the input's holder has no complete copy when its task starts (a copy
    # withdrawn or replaced since): the slot waits for the input on another node
    Case("task-finds-its-input-lacking-placed-on-another-holder", k=3, steps=[
        (ready(0, "n0"), [OPEN]),
        (ready(1, "n1"), [task(1, "n1", 1, out(1), 1)]),
        (ready(2, "n2"), [task(2, "n2", 2, out(2), 1)]),
        (started(2), [PullRoot("n2", out(2), t(2))]),
        (SlotFailed(1, 0, LACKING), [WaitInput(I[1], ("n1",))]),
        (ready(1, "n1", "n5"), [task(1, "n5", 1, out(1, 1), 1, gen=1)]),
        (SlotFailed(1, 0, LACKING), []),  # the first placement's, replaced since
        (started(1, gen=1), [conn(2, "n2", 1, "n5", out(1, 1), t(1) + b".1"),
                             conn(1, "n5", 0, "n0", I[0], v(0))]),
        DONE,
    ]),
    Case("task-lacking-twice-waits-for-a-third-holder", k=3, steps=[
        (ready(0, "n0"), [OPEN]),
        (ready(1, "n1"), [task(1, "n1", 1, out(1), 1)]),
        (SlotFailed(1, 0, LACKING), [WaitInput(I[1], ("n1",))]),
        (ready(1, "n1", "n5"), [task(1, "n5", 1, out(1, 1), 1, gen=1)]),
        (SlotFailed(1, 1, LACKING), [WaitInput(I[1], ("n1", "n5"))]),
        (ready(1, "n1", "n5"), [WaitInput(I[1], ("n1", "n5"))]),  # none of them usable
    ]),
    # another input missing is not this slot's stale holder: the reduce fails as before
    Case("task-lacking-another-input-fails", k=3, steps=[
        (ready(0, "n0"), [OPEN]),
        (ready(1, "n1"), [task(1, "n1", 1, out(1), 1)]),
        (SlotFailed(1, 0, GONE), [cancel(2), Fail(GONE), Release(("n1",))]),
    ]),
    Case("chain-no-local-input", k=3, steps=[
        (ready(0, "n0"), [OPEN]),
        (ready(1, "n1"), [task(1, "n1", 1, out(1), 1)]),
        (ready(2, "n2"), [task(2, "n2", 2, out(2), 1)]),
        (started(2), [PullRoot("n2", out(2), t(2))]),
        (started(1), [conn(2, "n2", 1, "n1", out(1), t(1)), conn(1, "n1", 0, "n0", I[0], v(0))]),
        (started(1), []),  # duplicate
        DONE,
        (ResultComplete(), []),
        (Published(), [Release(("n1", "n2"))]),
    ]),
    Case("chain-local-first-takes-root", k=3, steps=[
        (ready(0, ME, "n0"), [OPEN, task(2, ME, 0, R, 1)]),
        (ready(1, "n1"), []),
        (started(2), []),  # its child is not placed yet; the result is computed in place
        (ready(2, "n2"), [task(1, "n2", 2, out(1), 1)]),
        (started(1), [conn(2, ME, 1, "n2", out(1), t(1)), conn(1, "n2", 0, "n1", I[1], v(1))]),
        DONE,
        (Published(), [Release((ME, "n2"))]),
    ]),
    # an allreduce whose first input is here: the root here pulls the chain of the early
    # inputs and, as a leaf of its own, the last input (docs/design.md §4)
    Case("allreduce-local-first-last-input-hangs-on-root", k=4, everyone=True, steps=[
        # the result announces its 3 other getters, so its shard can shape their gets
        (ready(0, ME), [replace(OPEN, receivers=3), task(2, ME, 0, R, 2)]),
        (ready(1, "n1"), []),  # slot 0, the chain's leaf
        (ready(2, "n2"), [task(1, "n2", 2, out(1), 1)]),
        (started(2), []),
        (ready(3, "n3"), [conn(2, ME, 3, "n3", I[3], v(3))]),  # slot 3: the root's leaf
        (started(1), [conn(2, ME, 1, "n2", out(1), t(1)), conn(1, "n2", 0, "n1", I[1], v(1))]),
        DONE,
        (Published(), [Release((ME, "n2"))]),
    ]),
    # the inputs ready when the allreduce starts are reported in any order: one held here
    # still takes the root, and the last input still hangs on it
    Case("allreduce-input-here-reported-second-last-input-hangs-on-root", k=4, everyone=True,
         here=True, steps=[
             (ready(1, "n1"), [replace(OPEN, receivers=3)]),  # slot 0, the chain's leaf
             (ready(0, ME), [task(2, ME, 0, R, 2)]),
             (ready(2, "n2"), [task(1, "n2", 2, out(1), 1)]),
             (started(2), []),
             (ready(3, "n3"), [conn(2, ME, 3, "n3", I[3], v(3))]),  # slot 3: the root's leaf
         ]),
    Case("allreduce-first-input-elsewhere-keeps-the-chain", k=3, everyone=True, steps=[
        (ready(0, "n0"), [replace(OPEN, receivers=2)]),
        (ready(1, ME), [task(2, ME, 1, R, 1)]),  # the root, as in any reduce
        (ready(2, "n2"), [task(1, "n2", 2, out(1), 1)]),
    ]),
    Case("tree-local-input-arriving-late-takes-root", k=3, n=4, depth=1, steps=[
        (ready(0, "n0"), [OPEN]),
        (ready(1, "n1"), []),
        (ready(3, "n3", ME), [task(1, ME, 3, R, 2), cancel(2)]),
        (ready(2, ME), []),  # a backup, even though local
        (started(1), [conn(1, ME, 0, "n0", I[0], v(0)), conn(1, ME, 2, "n1", I[1], v(1))]),
    ]),
    Case("second-local-input-is-a-leaf-on-me", k=3, depth=1, steps=[
        (ready(0, ME), [OPEN, task(1, ME, 0, R, 2)]),
        (ready(1, ME, "n1"), []),
        (started(1), [conn(1, ME, 0, ME, I[1], v(1))]),
        (ready(2, "n2"), [conn(1, ME, 2, "n2", I[2], v(2))]),
    ]),
    Case("k1-leaf-root-is-pulled", k=1, n=2, steps=[
        (ready(1, "n1"), [OPEN, PullRoot("n1", I[1], v(1)), cancel(0)]),
        DONE,
        (Published(), []),
    ]),
    Case("k1-local-input-copied-in-place", k=1, steps=[
        (ready(0, ME), [OPEN, task(0, ME, 0, R, 0)]),
        (started(0), []),
        DONE,
        (Published(), [Release((ME,))]),
    ]),
    Case("dead-and-not-alive-holders-are-skipped", k=2, steps=[
        (NodeDied("nx"), []),
        (ready(0, "nx", "n0"), [OPEN]),  # the plan heard nx died
        (ready(1, "nd", "n1", alive=("n1",)), [task(1, "n1", 1, out(1), 1)]),
        (started(1), [conn(1, "n1", 0, "n0", I[0], v(0)), PullRoot("n1", out(1), t(1))]),
    ]),
    Case("no-live-holder-first-holder", k=1, steps=[
        (ready(0, "n5", "n6", alive=()), [OPEN, PullRoot("n5", I[0], v(0))]),
    ]),
    Case("duplicate-ready-and-backups-ignored", k=2, n=3, steps=[
        (ready(0, "n0"), [OPEN]),
        (ready(0, "n0"), []),
        (ready(1, "n1"), [task(1, "n1", 1, out(1), 1), cancel(2)]),
        (ready(2, "n2"), []),
        (InputFailed(I[2], TIMEOUT), []),  # a cancelled backup's wait ending late
        (ready(7, "n7"), []),  # not an input
    ]),
    Case("input-listed-twice-used-twice", k=2, inputs=(0, 0, 1), steps=[
        (ready(0, "n0"), [OPEN, task(1, "n0", 0, out(1), 1), cancel(1)]),
        (ready(0, "n0"), []),
        (started(1), [conn(1, "n0", 0, "n0", I[0], v(0)), PullRoot("n0", out(1), t(1))]),
    ]),
    Case("child-started-before-parent-placed", k=5, depth=1, steps=[
        (ready(0, "n0"), [OPEN]),
        (ready(1, "n1"), [task(1, "n1", 1, out(1), 1)]),
        (started(1), [conn(1, "n1", 0, "n0", I[0], v(0))]),
        (ready(2, "n2"), []),  # slot 3
        (ready(3, "n3"), [task(4, "n3", 3, out(4), 1)]),
        (ready(4, "n4"), [task(2, "n4", 4, out(2), 2)]),
        (started(4), [conn(4, "n3", 3, "n2", I[2], v(2))]),
        (started(2), [conn(2, "n4", 1, "n1", out(1), t(1)), conn(2, "n4", 4, "n3", out(4), t(4)),
                      PullRoot("n4", out(2), t(2))]),
    ]),
    Case("tree-7-out-of-order-task-versions", k=7, depth=2, steps=[
        (ready(0, "n0"), [OPEN]),
        (ready(1, "n1"), [task(1, "n1", 1, out(1), 2)]),
        (ready(2, "n2"), []),
        (ready(3, "n3"), []),  # slot 4
        (ready(4, "n4"), [task(5, "n4", 4, out(5), 2)]),
        (ready(5, "n5"), []),  # slot 6
        (ready(6, "n6"), [task(3, "n6", 6, out(3), 2)]),
        (started(3), [PullRoot("n6", out(3), t(3))]),
        (started(5), [conn(3, "n6", 5, "n4", out(5), t(5)), conn(5, "n4", 4, "n3", I[3], v(3)),
                      conn(5, "n4", 6, "n5", I[5], v(5))]),
        (started(1), [conn(3, "n6", 1, "n1", out(1), t(1)), conn(1, "n1", 0, "n0", I[0], v(0)),
                      conn(1, "n1", 2, "n2", I[2], v(2))]),
        (started(1), []),
        (started(3), []),
        (TaskStarted(0, 0, b"x"), []),  # a leaf has no task
        (TaskStarted(9, 0, b"x"), []),
        DONE,
        (Published(), [Release(("n1", "n4", "n6"))]),
    ]),
    # --- inline inputs ---
    Case("inline-only", k=2, n=3, steps=[
        (ready(2, "n2", size=SMALL), []),
        (ready(0, "n0", size=SMALL), [cancel(1),
                                      CombineInline((I[2], I[0]), "sum", SMALL, DT, SHAPE)]),
        (NodeDied("n2"), []),
        DONE,
        (Published(), []),
    ]),
    Case("inline-boundary", k=1, steps=[
        (ready(0, "n0", size=INLINE_MAX),
         [CombineInline((I[0],), "sum", INLINE_MAX, DT, SHAPE)]),
    ]),
    Case("just-above-inline-opens-the-result", k=1, steps=[
        (ready(0, "n0", size=INLINE_MAX + 1),
         [OpenResult(INLINE_MAX + 1, DT, SHAPE), PullRoot("n0", I[0], v(0))]),
    ]),
    Case("inline-combine-fails", k=1, steps=[
        (ready(0, "n0", size=SMALL), [CombineInline((I[0],), "sum", SMALL, DT,
                                                               SHAPE)]),
        (ResultFailed(GONE), [Fail(GONE)]),
        (ResultComplete(), []),
    ]),
    # --- bad inputs ---
    Case("dtype-mismatch", k=3, n=4, steps=[
        (ready(0, "n0"), [OPEN]),
        (ready(1, "n1"), [task(1, "n1", 1, out(1), 1)]),
        (ready(2, "n2", dtype="<i4"),
         [cancel(3), mismatch(2, "<i4[262144]", "<f4[262144]"), Release(("n1",))]),
        (started(1), []),
        (ready(3, "n3"), []),
    ]),
    Case("shape-mismatch", k=2, steps=[
        (ready(0, "n0"), [OPEN]),
        (ready(1, "n1", shape=(2, BIG // 8)), [mismatch(1, "<f4[2, 131072]", "<f4[262144]")]),
    ]),
    Case("not-numeric-dtype", k=1, n=2, steps=[
        (ready(0, "n0", dtype="<U4"),
         [cancel(1), Fail(InvalidArgumentError("cannot reduce dtype <U4: numeric types only"))]),
    ]),
    Case("unknown-dtype", k=1, steps=[
        (ready(0, "n0", dtype="nonsense"),
         [Fail(InvalidArgumentError("unknown dtype 'nonsense'"))]),
    ]),
    Case("no-holder", k=1, steps=[
        (ready(0), [Fail(PeerUnavailableError(f"input {I[0].hex()} has no holder",
                                              oid=I[0].hex()))]),
    ]),
    # --- failures ---
    Case("input-wait-fails-while-the-others-can-make-up-k", k=2, n=3, steps=[
        (ready(0, "n0"), [OPEN]),
        (InputFailed(I[1], TIMEOUT), []),  # one candidate fewer: input 2 may still come
        (ready(2, "n2"), [task(1, "n2", 2, out(1), 1)]),
    ]),
    Case("input-wait-fails-when-the-others-cannot-make-up-k", k=2, n=3, steps=[
        (ready(0, "n0"), [OPEN]),
        (InputFailed(I[1], TIMEOUT), []),
        (InputFailed(I[2], GONE), [Fail(GONE)]),
        (ready(2, "n2"), []),
    ]),
    Case("failed-input-before-any-ready-small-backup-used", k=1, n=2, steps=[
        (InputFailed(I[0], TIMEOUT), []),  # e.g. the id of a reduce that timed out
        (ready(1, "n1", size=SMALL), [CombineInline((I[1],), "sum", SMALL, DT, SHAPE)]),
    ]),
    Case("every-input-fails", k=1, n=2, steps=[
        (InputFailed(I[1], GONE), []),
        (InputFailed(I[0], TIMEOUT), [Fail(TIMEOUT)]),
    ]),
    Case("input-listed-twice-fails-both-places", k=2, inputs=(0, 0, 1), steps=[
        (InputFailed(I[0], GONE), [cancel(1), Fail(GONE)]),
    ]),
    Case("input-wait-fails-with-a-task-running", k=3, steps=[
        (ready(0, "n0"), [OPEN]),
        (ready(1, "n1"), [task(1, "n1", 1, out(1), 1)]),
        (InputFailed(I[2], GONE), [Fail(GONE), Release(("n1",))]),
    ]),
    Case("slot-fails", k=3, steps=[
        (ready(0, "n0"), [OPEN]),
        (ready(1, "n1"), [task(1, "n1", 1, out(1), 1)]),
        (ready(2, "n2"), [task(2, "n2", 2, out(2), 1)]),
        (started(2), [PullRoot("n2", out(2), t(2))]),
        (SlotFailed(1, None, REPORTED), [Fail(REPORTED), Release(("n1", "n2"))]),
        (started(1), []),
        (SlotFailed(2, None, GONE), []),
        (ResultComplete(), []),
    ]),
    Case("slot-failure-after-complete-ignored", k=2, steps=[
        (ready(0, "n0"), [OPEN]),
        (ready(1, "n1"), [task(1, "n1", 1, out(1), 1)]),
        DONE,
        (SlotFailed(1, None, BROKEN), []),
        (Published(), [Release(("n1",))]),
    ]),
    Case("root-pull-fails", k=1, steps=[
        (ready(0, "n0"), [OPEN, PullRoot("n0", I[0], v(0))]),
        (ResultFailed(BROKEN), [Fail(BROKEN)]),
    ]),
    Case("publish-fails", k=2, steps=[
        (ready(0, "n0"), [OPEN]),
        (ready(1, "n1"), [task(1, "n1", 1, out(1), 1)]),
        DONE,
        (ResultFailed(GONE), [Fail(GONE), Release(("n1",))]),
        (Published(), []),
    ]),
    # --- node deaths and repair (docs/design.md §5) ---
    Case("task-node-dies-before-connected-is-redone-from-0", k=3, steps=[
        (ready(0, "n0"), [OPEN]),
        (ready(1, "n1"), [task(1, "n1", 1, out(1), 1)]),
        (ready(2, "n2"), [task(2, "n2", 2, out(2), 1)]),
        (NodeDied("n1"), [WaitInput(I[1], ("n1",))]),
        (SlotFailed(1, 0, BROKEN), []),  # its task's start, failing afterwards
        (ready(1, "n5"), [task(1, "n5", 1, out(1, 1), 1, gen=1)]),
        (started(1, gen=1), [conn(1, "n5", 0, "n0", I[0], v(0))]),
        (started(1), []),  # the first placement's answer, late
        (started(2), [conn(2, "n2", 1, "n5", out(1, 1), t(1) + b".1"),
                      PullRoot("n2", out(2), t(2))]),
        DONE,
        (Published(), [Release(("n2", "n5"))]),
    ]),
    Case("inner-slot-lost-mid-stream-resumes-at-the-offset", k=3, steps=[
        *RUNNING_CHAIN,
        (NodeDied("n1"), []),  # connected: wait for its consumer's word
        (ChildLost(2, 1, t(1), 500, True, BROKEN, t(2)), [WaitInput(I[1], ("n1",))]),
        (ChildLost(2, 1, t(1), 500, True, BROKEN, t(2)), []),  # a duplicate report
        (ready(1, "n1", alive=()), [WaitInput(I[1], ("n1",))]),  # the shard lags
        (ready(1, "n5"), [task(1, "n5", 1, out(1, 1), 1, gen=1, start=500)]),
        (started(1, gen=1), [conn(2, "n2", 1, "n5", out(1, 1), t(1) + b".1"),
                             conn(1, "n5", 0, "n0", I[0], v(0))]),
        DONE,
        (Published(), [Release(("n2", "n5"))]),
    ]),
    Case("suspected-node-is-repaired-around-and-still-told-to-release", k=3, steps=[
        *RUNNING_CHAIN,
        (NodeSuspected("n1"), []),  # connected: wait for its consumer's word
        (ChildLost(2, 1, t(1), 500, False, BROKEN, t(2)), [WaitInput(I[1], ("n1",))]),
        (ready(1, "n1"), [WaitInput(I[1], ("n1",))]),  # only the silent node holds it
        (ready(1, "n1", "n5"), [task(1, "n5", 1, out(1, 1), 1, gen=1, start=500)]),
        (started(1, gen=1), [conn(2, "n2", 1, "n5", out(1, 1), t(1) + b".1"),
                             conn(1, "n5", 0, "n0", I[0], v(0))]),
        DONE,
        (Published(), [Release(("n1", "n2", "n5"))]),  # n1 may be back: it frees its buffers
    ]),
    Case("a-suspected-node-that-answers-again-may-hold-its-input-again", k=3, steps=[
        *RUNNING_CHAIN,
        (NodeSuspected("n1"), []),
        (ChildLost(2, 1, t(1), 500, False, BROKEN, t(2)), [WaitInput(I[1], ("n1",))]),
        (NodeTrusted("n1"), [WaitInput(I[1], ())]),  # nobody puts it elsewhere: n1 will do
        (ready(1, "n1"), [task(1, "n1", 1, out(1, 1), 1, gen=1, start=500)]),
        (NodeTrusted("n2"), []),
        DONE,
        (Published(), [Release(("n1", "n2"))]),
    ]),
    Case("suspected-before-connected-is-redone-from-0-then-dies", k=3, steps=[
        (ready(0, "n0"), [OPEN]),
        (ready(1, "n1"), [task(1, "n1", 1, out(1), 1)]),
        (ready(2, "n2"), [task(2, "n2", 2, out(2), 1)]),
        (NodeSuspected("n1"), [WaitInput(I[1], ("n1",))]),
        (NodeDied("n1"), []),  # the verdict changes nothing more
        (ready(1, "n5"), [task(1, "n5", 1, out(1, 1), 1, gen=1)]),
        (started(1, gen=1), [conn(1, "n5", 0, "n0", I[0], v(0))]),
        (started(2), [conn(2, "n2", 1, "n5", out(1, 1), t(1) + b".1"),
                      PullRoot("n2", out(2), t(2))]),
        DONE,
        (Published(), [Release(("n2", "n5"))]),
    ]),
    Case("report-before-the-verdict-waits-then-repairs", k=3, steps=[
        *RUNNING_CHAIN,
        (ChildLost(2, 1, t(1), 700, False, BROKEN, t(2)), [After(0.1, Retry(1, t(1)))]),
        (NodeDied("n1"), [WaitInput(I[1], ("n1",))]),
        (Retry(1, t(1)), []),  # stale: the slot is being redone
        (ready(1, ME), [task(1, ME, 1, out(1, 1), 1, gen=1, start=700)]),
    ]),
    Case("broken-pull-of-a-live-node-is-reconnected-then-fails", k=3, steps=[
        *RUNNING_CHAIN,
        (ChildLost(2, 1, t(1), 10, False, BROKEN, t(2)), [After(0.1, Retry(1, t(1)))]),
        (Retry(1, t(1)), [conn(2, "n2", 1, "n1", out(1), t(1))]),
        (Retry(1, t(1)), []),  # no break pending
        (ChildLost(2, 1, t(1), 20, False, BROKEN, t(2)), [After(0.2, Retry(1, t(1)))]),
        (Retry(1, t(1)), [conn(2, "n2", 1, "n1", out(1), t(1))]),
        (ChildLost(2, 1, t(1), 30, False, BROKEN, t(2)), [After(0.4, Retry(1, t(1)))]),
        (Retry(1, t(1)), [conn(2, "n2", 1, "n1", out(1), t(1))]),
        (ChildLost(2, 1, t(1), 40, False, BROKEN, t(2)), [After(0.8, Retry(1, t(1)))]),
        (Retry(1, t(1)), [conn(2, "n2", 1, "n1", out(1), t(1))]),
        (ChildLost(2, 1, t(1), 50, False, BROKEN, t(2)), [Fail(PeerUnavailableError(
            f"slot 1 on node n1 of reduce {R.hex()}: its output could not be received after "
            f"4 reconnections: {BROKEN}", node="n1", slot=1)), Release(("n1", "n2"))]),
    ]),
    Case("reconnect-delays-are-capped", k=3, patience=3.0, steps=[
        *RUNNING_CHAIN,
        *[step for delay in (0.1, 0.2, 0.4, 0.8, 1.0, 1.0) for step in (
            (ChildLost(2, 1, t(1), 10, False, BROKEN, t(2)), [After(delay, Retry(1, t(1)))]),
            (Retry(1, t(1)), [conn(2, "n2", 1, "n1", out(1), t(1))]))],
        (ChildLost(2, 1, t(1), 10, False, BROKEN, t(2)), [Fail(PeerUnavailableError(
            f"slot 1 on node n1 of reduce {R.hex()}: its output could not be received after "
            f"6 reconnections: {BROKEN}", node="n1", slot=1)), Release(("n1", "n2"))]),
    ]),
    Case("a-consumer-that-suspects-the-source-reconnects-past-the-patience", k=3, patience=3.0,
         steps=[
        *RUNNING_CHAIN,
        # the consumer's link to n1 is broken while ours works: no count against the patience
        *[step for delay in (0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0, 1.0) for step in (
            (ChildLost(2, 1, t(1), 10, False, BROKEN, t(2), True),
             [After(delay, Retry(1, t(1)))]),
            (Retry(1, t(1)), [conn(2, "n2", 1, "n1", out(1), t(1))]))],
        # trusted there again, and still broken: the patience counts from here
        *[step for _ in range(3) for step in (
            (ChildLost(2, 1, t(1), 10, False, BROKEN, t(2)), [After(1.0, Retry(1, t(1)))]),
            (Retry(1, t(1)), [conn(2, "n2", 1, "n1", out(1), t(1))]))],
        (ChildLost(2, 1, t(1), 10, False, BROKEN, t(2)), [Fail(PeerUnavailableError(
            f"slot 1 on node n1 of reduce {R.hex()}: its output could not be received after "
            f"11 reconnections: {BROKEN}", node="n1", slot=1)), Release(("n1", "n2"))]),
    ]),
    Case("root-pull-broken-repairs-the-root", k=3, steps=[
        *RUNNING_CHAIN,
        (ChildLost(None, 2, t(2), 900, True, BROKEN), [WaitInput(I[2], ("n2",))]),
        (ready(2, "n7"), [task(2, "n7", 2, out(2, 1), 1, gen=1, start=900)]),
        (started(2, gen=1), [conn(2, "n7", 1, "n1", out(1), t(1)),
                             PullRoot("n7", out(2, 1), t(2) + b".1")]),
    ]),
    Case("root-put-again-here-is-computed-in-place", k=3, steps=[
        *RUNNING_CHAIN,
        (ChildLost(None, 2, t(2), 900, True, BROKEN), [WaitInput(I[2], ("n2",))]),
        (ready(2, "n7", ME), [task(2, ME, 2, R, 1, gen=1, start=900)]),
        (started(2, gen=1), [conn(2, ME, 1, "n1", out(1), t(1))]),
    ]),
    Case("node-with-a-slot-and-its-child-dies", k=3, merge=False, steps=[
        (ready(0, "n1"), [OPEN]),
        (ready(1, "n1"), [task(1, "n1", 1, out(1), 1)]),
        (ready(2, "n2"), [task(2, "n2", 2, out(2), 1)]),
        (started(1), [conn(1, "n1", 0, "n1", I[0], v(0))]),
        (started(2), [conn(2, "n2", 1, "n1", out(1), t(1)), PullRoot("n2", out(2), t(2))]),
        (NodeDied("n1"), []),
        (ChildLost(2, 1, t(1), 300, False, BROKEN, t(2)), [WaitInput(I[1], ("n1",)),
                                                     WaitInput(I[0], ("n1",))]),
        (ready(0, "n6"), []),  # a leaf again: its consumer is not started yet
        (ready(1, "n5"), [task(1, "n5", 1, out(1, 1), 1, gen=1, start=300)]),
        (started(1, gen=1), [conn(2, "n2", 1, "n5", out(1, 1), t(1) + b".1"),
                             conn(1, "n5", 0, "n6", I[0], v(0))]),
    ]),
    # --- folds: a lost input back where a slot runs is added into it (docs/design.md §5) ---
    Case("input-back-on-the-consumers-node-is-folded-into-the-consumer", k=3, steps=[
        *RUNNING_CHAIN,
        (NodeDied("n1"), []),
        (ChildLost(2, 1, t(1), 500, True, BROKEN, t(2)), [WaitInput(I[1], ("n1",))]),
        (ready(1, "n2"), [Fold(1, 2, "n2", t(2), I[1], v(1), 500)]),
        (Folded(1, 2, 500), [Reshape(2, "n2", t(2), 1, 500, 1)]),
        (Folded(1, 2, 500), []),  # a duplicate
        (Reshaped(1), [Connect(2, "n2", 0, "n0", I[0], v(0), 500)]),
        (Reshaped(1), []),
        (ChildLost(2, 0, v(0), 900, False, BROKEN, t(2)), [After(0.1, Retry(0, v(0)))]),
        (Retry(0, v(0)), [conn(2, "n2", 0, "n0", I[0], v(0))]),  # slot 0 hangs on slot 2 now
        DONE,
        (Published(), [Release(("n2",))]),
    ]),
    Case("folded-late-the-input-below-the-fold-is-pulled-and-reconnected", k=4, steps=[
        *FOLDED_LATE,
        (ChildLost(3, 6, v(2), 1000, False, BROKEN, t(3)), [After(0.1, Retry(6, v(2)))]),
        (Retry(6, v(2)), [Connect(3, "n3", 6, "n1", I[2], v(2), 800, 1200)]),
        (ChildLost(3, 6, b"old", 1000, False, BROKEN, t(3)), []),  # stale
        DONE,
        (Published(), [Release(("n1", "n2", "n3"))]),  # n2 is dead in n3's view only
    ]),
    Case("the-node-a-fold-is-in-dies-everything-starts-again", k=4, steps=[
        *FOLDED_LATE,
        (NodeDied("n1"), [RestartResult(), WaitInput(I[1], ("n1", "n2")),
                          WaitInput(I[2], ("n1", "n2")),
                          task(3, "n3", 3, out(3, 1), 1, gen=1)]),
        (ChildLost(3, 6, v(2), 1000, True, BROKEN, t(3)), []),  # the fold is gone
        # no second fold, nor a second task on n5: slot 1 adds it, slot 2 leaves the chain
        *back_together("n5", leaf="n0"),
    ]),
    Case("a-fold-whose-target-is-gone-places-the-slot-as-usual", k=3, steps=[
        *RUNNING_CHAIN,
        (ChildLost(2, 1, t(1), 500, True, BROKEN, t(2)), [WaitInput(I[1], ("n1",))]),
        (ready(1, "n2"), [Fold(1, 2, "n2", t(2), I[1], v(1), 500)]),
        (FoldFailed(1, GONE), [task(1, "n2", 1, out(1, 1), 1, gen=1, start=500)]),
        (Folded(1, 2, 500), []),  # too late
    ]),
    Case("a-child-of-the-lost-slot-dies-before-the-fold-takes-effect", k=3, steps=[
        *RUNNING_CHAIN,
        (ChildLost(2, 1, t(1), 500, True, BROKEN, t(2)), [WaitInput(I[1], ("n1",))]),
        (ready(1, "n2"), [Fold(1, 2, "n2", t(2), I[1], v(1), 500)]),
        (NodeDied("n0"), [RestartResult(), WaitInput(I[0], ("n0", "n1")),
                          task(1, "n2", 1, out(1, 2), 1, gen=2),
                          task(2, "n2", 2, out(2, 1), 1, gen=1)]),
        (Folded(1, 2, 500), []),
    ]),
    Case("input-back-where-only-its-own-child-runs-is-placed-as-usual", k=3, steps=[
        *RUNNING_CHAIN,
        (ChildLost(2, 1, t(1), 500, True, BROKEN, t(2)), [WaitInput(I[1], ("n1",))]),
        (ready(1, "n0"), [task(1, "n0", 1, out(1, 1), 1, gen=1, start=500)]),
    ]),
    Case("input-back-where-a-leaf-runs-takes-the-leafs-input-over", k=4, steps=[
        *ABSORBED,
        DONE,
        (Published(), [Release(("n1", "n2", "n3", "n0"))]),
    ]),
    Case("a-lost-leaf-is-folded-into-its-consumer", k=4, steps=[
        *RUNNING_CHAIN4,
        (ChildLost(1, 0, v(0), 400, True, BROKEN, t(1)), [WaitInput(I[0], ("n0",))]),
        (NodeDied("n0"), []),
        (ready(0, "n1"), [Fold(0, 1, "n1", t(1), I[0], v(0), 400)]),  # no child to hang on 1
    ]),
    Case("a-lost-leaf-has-no-task-to-take-another-leaf-over", k=3, depth=1, steps=[
        (ready(0, "n0"), [OPEN]),  # slot 0, a leaf
        (ready(1, "n1"), []),  # slot 2, a leaf
        (ready(2, "n2"), [task(1, "n2", 2, out(1), 2)]),  # the root
        (started(1), [conn(1, "n2", 0, "n0", I[0], v(0)), conn(1, "n2", 2, "n1", I[1], v(1)),
                      PullRoot("n2", out(1), t(1))]),
        (ChildLost(1, 0, v(0), 400, True, BROKEN, t(1)), [WaitInput(I[0], ("n0",))]),
        (ready(0, "n1"), [conn(1, "n2", 0, "n1", I[0], v(0))]),  # a leaf again, no cut
    ]),
    Case("an-input-ready-while-a-lost-slot-takes-a-leaf-over-takes-a-free-slot", k=5, steps=[
        *RUNNING_CHAIN4[:-1],  # slot 3 is no root here: the root waits for input 4
        (started(3), [conn(3, "n3", 2, "n2", out(2), t(2))]),
        (ChildLost(3, 2, t(2), 802, True, BROKEN, t(3)), [WaitInput(I[2], ("n2",))]),
        (ready(2, "n0"), [Reshape(1, "n1", t(1), 0, 804, 0)]),  # slot 2 takes leaf 0 over
        (ready(4, "n4"), [task(4, "n4", 4, out(4), 1)]),  # the root: slot 2 is not free
        (Reshaped(0, 1600), [task(2, "n0", 2, out(2, 1), 1, gen=1, start=802)]),
        (started(4), [conn(4, "n4", 3, "n3", out(3), t(3)), PullRoot("n4", out(4), t(4))]),
    ]),
    Case("the-consumer-of-a-taken-over-leaf-dies-everything-starts-again", k=4, steps=[
        *ABSORBED,
        (NodeDied("n1"), [RestartResult(), WaitInput(I[1], ("n1", "n2")),
                          task(2, "n0", 2, out(2, 2), 1, gen=2),
                          task(3, "n3", 3, out(3, 1), 1, gen=1)]),
    ]),
    Case("a-leaf-taken-over-before-the-slot-starts-then-its-node-dies", k=4, steps=[
        *RUNNING_CHAIN4,
        (ChildLost(3, 2, t(2), 802, True, BROKEN, t(3)), [WaitInput(I[2], ("n2",))]),
        (ready(2, "n0"), [Reshape(1, "n1", t(1), 0, 804, 0)]),  # lost at 802: from 804
        (NodeDied("n0"), [RestartResult(), WaitInput(I[0], ("n0", "n2")),
                          task(1, "n1", 1, out(1, 1), 1, gen=1),
                          WaitInput(I[2], ("n0", "n2")),
                          task(3, "n3", 3, out(3, 1), 1, gen=1)]),
        (Reshaped(0, 1600), []),  # too late
    ]),
    Case("no-fold-with-backups", k=3, n=5, steps=[
        *BACKUP_CHAIN,
        (started(1), [conn(1, "n1", 0, "n0", I[0], v(0))]),
        (started(2), [conn(2, "n2", 1, "n1", out(1), t(1)), PullRoot("n2", out(2), t(2))]),
        (ChildLost(2, 1, t(1), 500, True, BROKEN, t(2)), [WaitInput(I[1], ("n1",)),
                                                        WaitInput(I[3], ("n1",)),
                                                        WaitInput(I[4], ("n1",))]),
        (ready(1, "n2"), [task(1, "n2", 1, out(1, 1), 1, gen=1, start=500)]),
    ]),
    Case("dead-leaf-whose-consumer-had-every-byte-costs-nothing", k=3, steps=[
        *RUNNING_CHAIN,
        (NodeDied("n0"), []),
        DONE,
        (Published(), [Release(("n1", "n2"))]),
    ]),
    Case("lost-input-never-comes-back", k=3, steps=[
        *RUNNING_CHAIN,
        (ChildLost(2, 1, t(1), 500, True, BROKEN, t(2)), [WaitInput(I[1], ("n1",))]),
        (InputFailed(I[1], TIMEOUT), [Fail(PeerUnavailableError(
            f"node n1 died holding input {I[1].hex()} (slot 1) of reduce {R.hex()}, and no "
            f"copy came back: {TIMEOUT}", node="n1", slot=1, oid=I[1].hex())),
            Release(("n1", "n2"))]),  # n1 is dead in n2's view only: told, in case
    ]),
    Case("input-put-again-with-another-shape", k=3, steps=[
        *RUNNING_CHAIN,
        (ChildLost(2, 1, t(1), 500, True, BROKEN, t(2)), [WaitInput(I[1], ("n1",))]),
        (NodeDied("n1"), []),
        (ready(1, "n5", shape=(2, BIG // 8)),
         [mismatch(1, "<f4[2, 131072]", "<f4[262144]"), Release(("n2",))]),
    ]),
    Case("stale-and-senseless-reports-are-ignored", k=3, steps=[
        *RUNNING_CHAIN,
        (ChildLost(2, 1, b"old", 500, True, BROKEN, t(2)), []),  # another placement's stream
        (ChildLost(0, 1, t(1), 500, True, BROKEN, t(0)), []),  # not its parent
        (ChildLost(2, 9, t(1), 500, True, BROKEN, t(2)), []),  # no such slot
        (Retry(1, t(1)), []),
    ]),
    Case("unreachable-task-node-is-treated-as-dead", k=3, steps=[
        (ready(0, "n0"), [OPEN]),
        (ready(1, "n1"), [task(1, "n1", 1, out(1), 1)]),
        (SlotFailed(1, 0, ConnectionLostError("refused")), [WaitInput(I[1], ("n1",))]),
        (SlotFailed(1, 0, ConnectionLostError("refused")), []),
        (InputFailed(I[1], TIMEOUT), [cancel(2), Fail(PeerUnavailableError(
            f"node n1 died holding input {I[1].hex()} (slot 1) of reduce {R.hex()}, and no "
            f"copy came back: {TIMEOUT}", node="n1", slot=1, oid=I[1].hex())),
            Release(("n1",))]),  # given up on, not declared dead: its buffers are freed
    ]),
    Case("error-reported-by-a-task-node-fails-the-reduce", k=3, steps=[
        *RUNNING_CHAIN,
        (SlotFailed(1, None, REPORTED), [Fail(REPORTED), Release(("n1", "n2"))]),
    ]),
    Case("unused-node-dies", k=2, n=3, steps=[
        (ready(0, "n0", "n5"), [OPEN]),
        (NodeDied("n5"), []),  # another holder of a placed input
        (NodeDied("n9"), []),
        (ready(1, "n1"), [task(1, "n1", 1, out(1), 1), cancel(2)]),
        (NodeDied("n2"), []),  # would have held the backup
    ]),
    # --- backups (k below the number of inputs) ---
    Case("backup-takes-a-slot-that-had-sent-nothing-no-restart", k=3, n=5, steps=[
        *BACKUP_CHAIN,
        (NodeDied("n1"), [WaitInput(I[1], ("n1",)), WaitInput(I[3], ("n1",)),
                          WaitInput(I[4], ("n1",))]),  # never connected: from its start, 0
        (ready(3, "n3"), [cancel(1), task(1, "n3", 3, out(1, 1), 1, gen=1)]),
        (ready(4, "n4"), []),  # kept: the next repair takes it at once
        (ready(1, "n1", "n5", alive=("n5",)), []),  # its slot is taken: not used
        (started(1, gen=1), [conn(1, "n3", 0, "n0", I[0], v(0))]),
        (started(2), [conn(2, "n2", 1, "n3", out(1, 1), t(1) + b".1"),
                      PullRoot("n2", out(2), t(2))]),
        (ChildLost(None, 2, t(2), 800, True, BROKEN),
         [RestartResult(), task(2, "n4", 4, out(2, 1), 1, gen=1)]),
        (started(2, gen=1), [conn(2, "n4", 1, "n3", out(1, 1), t(1) + b".1"),
                             PullRoot("n4", out(2, 1), t(2) + b".1")]),
        DONE,
        (Published(), [Release(("n2", "n3", "n4"))]),
    ]),
    Case("backup-after-bytes-restarts-the-path-and-the-result", k=3, n=4, steps=[
        (ready(0, "n0"), [OPEN]),
        (ready(1, "n1"), [task(1, "n1", 1, out(1), 1)]),
        (ready(2, "n2"), [task(2, "n2", 2, out(2), 1), cancel(3)]),
        (started(1), [conn(1, "n1", 0, "n0", I[0], v(0))]),
        (started(2), [conn(2, "n2", 1, "n1", out(1), t(1)), PullRoot("n2", out(2), t(2))]),
        (ChildLost(2, 1, t(1), 500, True, BROKEN, t(2)),
         [WaitInput(I[1], ("n1",)), WaitInput(I[3], ("n1",))]),
        (ready(3, "n3"), [cancel(1), RestartResult(), task(2, "n2", 2, out(2, 1), 1, gen=1),
                          task(1, "n3", 3, out(1, 1), 1, gen=1)]),
        (ChildLost(2, 1, t(1), 600, True, BROKEN, t(2)), []),  # the old placement's
        (started(2, gen=1), [PullRoot("n2", out(2, 1), t(2) + b".1")]),
        (started(1, gen=1), [conn(2, "n2", 1, "n3", out(1, 1), t(1) + b".1"),
                             conn(1, "n3", 0, "n0", I[0], v(0))]),
        (ChildLost(2, 1, t(1) + b".1", 10, False, BROKEN, t(2)), []),  # from the old task
        (ChildLost(2, 1, t(1) + b".1", 10, False, BROKEN, t(2) + b".1"),
         [After(0.1, Retry(1, t(1) + b".1"))]),  # from the new one: reconnected
        DONE,
        (Published(), [Release(("n1", "n2", "n3"))]),  # n1 only given up on: told
    ]),
    Case("restarted-root-here-computes-in-place-again", k=2, n=3, steps=[
        (ready(0, ME), [OPEN, task(1, ME, 0, R, 1)]),
        (ready(1, "n1"), [cancel(2)]),
        (started(1), [conn(1, ME, 0, "n1", I[1], v(1))]),
        (ChildLost(1, 0, v(1), 64, True, BROKEN, t(1)),
         [WaitInput(I[1], ("n1",)), WaitInput(I[2], ("n1",))]),
        (ready(2, "n2"), [cancel(1), RestartResult(), task(1, ME, 0, R, 1, gen=1)]),
        (started(1, gen=1), [conn(1, ME, 0, "n2", I[2], v(2))]),
    ]),
    Case("unfit-or-failed-backups-are-never-used", k=2, n=4, steps=[
        (ready(0, "n0"), [OPEN]),
        (ready(1, "n1"), [task(1, "n1", 1, out(1), 1), cancel(2, 3)]),
        (started(1), [conn(1, "n1", 0, "n0", I[0], v(0)), PullRoot("n1", out(1), t(1))]),
        (ChildLost(1, 0, v(0), 64, True, BROKEN, t(1)),
         [WaitInput(I[0], ("n0",)), WaitInput(I[2], ("n0",)), WaitInput(I[3], ("n0",))]),
        (ready(2, "n2", shape=(2, BIG // 8)), []),
        (InputFailed(I[3], TIMEOUT), []),
        (ready(0, "n6"), [conn(1, "n1", 0, "n6", I[0], v(0))]),  # the same id: resumed
    ]),
    Case("node-dies-after-complete", k=3, steps=[
        (ready(0, "n0"), [OPEN]),
        (ready(1, "n1"), [task(1, "n1", 1, out(1), 1)]),
        (ready(2, "n2"), [task(2, "n2", 2, out(2), 1)]),
        DONE,
        (NodeDied("n1"), []),
        (ChildLost(2, 1, t(1), 5, True, BROKEN, t(2)), []),
        (Published(), [Release(("n2",))]),  # a dead node is not told
    ]),
    # --- several inputs on one node (docs/design.md §4, "Several inputs on one node") ---
    Case("a-second-input-on-a-tasks-node-is-added-by-that-task", k=4, steps=MERGED),
    Case("a-leafs-node-gets-a-second-input-the-leaf-becomes-a-task-adding-both", k=3, steps=[
        (ready(0, "n1"), [OPEN]),
        (ready(1, "n1"), [StartTask(0, 1, "n1", I[0], out(0, 1), "sum", DT, SHAPE, 0, 0,
                                    extras=(I[1],))]),
        (ready(2, "n2"), [task(2, "n2", 2, out(2), 1)]),
        (started(0, gen=1), []),
        (started(2), [conn(2, "n2", 0, "n1", out(0, 1), t(0) + b".1"),
                      PullRoot("n2", out(2), t(2))]),
        DONE,
    ]),
    Case("a-slot-whose-sums-went-further-than-merge-reach-gets-no-merge", k=8, steps=[
        (ready(0, "n0"), [OPEN]),
        *[(ready(i, f"n{i}"), [task(i, f"n{i}", i, out(i), 1)]) for i in range(1, 6)],
        *[(started(i), [conn(i, f"n{i}", i - 1, f"n{i - 1}", out(i - 1) if i > 1 else I[0],
                             t(i - 1) if i > 1 else v(0))]) for i in range(1, 6)],
        # slot 1's sums are in slots 2..5: placing five again is too much for one input
        (ready(6, "n1"), [task(6, "n1", 6, out(6), 1)]),
    ]),
    Case("a-slot-read-by-a-slot-nobody-reads-yet-is-placed-again-with-it", k=5, steps=[
        (ready(0, "n0"), [OPEN]),
        (ready(1, "n1"), [task(1, "n1", 1, out(1), 1)]),
        (ready(2, "n2"), [task(2, "n2", 2, out(2), 1)]),
        (started(1), [conn(1, "n1", 0, "n0", I[0], v(0))]),
        (started(2), [conn(2, "n2", 1, "n1", out(1), t(1))]),
        (ready(3, "n1"), [StartTask(1, 1, "n1", I[1], out(1, 1), "sum", DT, SHAPE, 1, 0,
                                    extras=(I[3],)),
                          task(2, "n2", 2, out(2, 1), 1, gen=1)]),  # slot 3 left the chain
        (started(2, gen=1), []),
        (started(1, gen=1), [conn(2, "n2", 1, "n1", out(1, 1), t(1) + b".1"),
                             conn(1, "n1", 0, "n0", I[0], v(0))]),
        (ready(4, "n3"), [task(4, "n3", 4, out(4), 1)]),
        (started(4), [conn(4, "n3", 2, "n2", out(2, 1), t(2) + b".1"),
                      PullRoot("n3", out(4), t(4))]),
        DONE,
    ]),
    Case("a-task-its-consumer-reads-nothing-of-is-placed-again-adding-both", k=4, steps=[
        (ready(0, "n0"), [OPEN]),
        (ready(1, "n1"), [task(1, "n1", 1, out(1), 1)]),
        (started(1), [conn(1, "n1", 0, "n0", I[0], v(0))]),
        (ready(2, "n1"), [StartTask(1, 1, "n1", I[1], out(1, 1), "sum", DT, SHAPE, 1, 0,
                                    extras=(I[2],))]),  # its child pulled again from 0
        (ready(3, "n2"), [task(3, "n2", 3, out(3), 1)]),
        (started(1), []),  # the first placement's: stale
        (started(1, gen=1), [conn(1, "n1", 0, "n0", I[0], v(0))]),
        (started(3), [conn(3, "n2", 1, "n1", out(1, 1), t(1) + b".1"),
                      PullRoot("n2", out(3), t(3))]),
        DONE,
    ]),
    Case("without-merges-each-input-takes-a-slot", k=3, merge=False, steps=[
        (ready(0, "n1"), [OPEN]),
        (ready(1, "n1"), [task(1, "n1", 1, out(1), 1)]),
    ]),
    Case("a-merge-folded-late-starts-the-result-again-with-every-merge", k=4, steps=[
        *MERGED[:5],
        (Folded(2, 1, 400, t(1)), [RestartResult(),
                                   StartTask(1, 1, "n2", I[1], out(1, 1), "sum", DT, SHAPE,
                                             1, 0, extras=(I[2],)),
                                   task(3, "n3", 3, out(3, 1), 1, gen=1)]),
        (started(1, gen=1), [conn(1, "n2", 0, "n1", I[0], v(0))]),
    ]),
    Case("a-merge-answered-by-an-older-task-is-ignored", k=4, steps=[
        *MERGED[:5],
        (Folded(2, 1, 400, b"old"), []),
        (FoldFailed(2, GONE, b"old"), []),
    ]),
    Case("a-merged-input-missing-on-its-node-is-waited-for-elsewhere", k=4, steps=[
        *MERGED[:5],
        (FoldFailed(2, ObjectNotFoundError("no copy", oid=I[2].hex()), t(1)),
         [RestartResult(), StartTask(1, 1, "n2", I[1], out(1, 1), "sum", DT, SHAPE, 1, 0),
          task(3, "n3", 3, out(3, 1), 1, gen=1), WaitInput(I[2], ("n2",))]),
    ]),
    Case("inputs-put-again-on-one-node-after-their-hosts-death-share-a-slot", k=4, steps=[
        *HOST_LOST,  # slot 1 adds input 2 again: slot 2 leaves the chain, no second task
        *back_together("n4", leaf="n1"),
    ]),
    Case("a-leaf-put-again-beside-a-task-never-told-of-it-is-added-by-that-task", k=4, steps=[
        *MERGED,
        (NodeDied("n1"), []),
        (NodeDied("n2"), []),
        (ChildLost(3, 1, t(1), 500, True, BROKEN, t(3)),
         [RestartResult(), WaitInput(I[0], ("n1", "n2")), WaitInput(I[1], ("n1", "n2")),
          task(3, "n3", 3, out(3, 1), 1, gen=1), WaitInput(I[2], ("n1", "n2"))]),
        (ready(1, "n4"), [task(1, "n4", 1, out(1, 1), 1, gen=1)]),
        (started(1, gen=1), []),
        # slot 1 adds input 0 and counts its leaf, slot 0, as cut: it waits for it no more
        (ready(0, "n4"), [Fold(0, 1, "n4", t(1) + b".1", I[0], v(0), 0),
                          Reshape(1, "n4", t(1) + b".1", 0, 0, 0)]),
        (Reshaped(0, 0), []),
        (Folded(0, 1, 0, t(1) + b".1"), []),
        # with no child left slot 1 may have combined; nobody read it: placed again with both
        (ready(2, "n4"), [StartTask(1, 2, "n4", I[1], out(1, 2), "sum", DT, SHAPE, 0, 0,
                                    extras=(I[0], I[2]))]),
    ]),
    Case("a-node-holding-merged-inputs-dies-its-inputs-are-waited-for-apart", k=4, steps=[
        *HOST_LOST,
        (ready(1, "n4"), [task(1, "n4", 1, out(1, 1), 1, gen=1)]),
        (ready(2, "n5"), [task(2, "n5", 2, out(2), 1)]),
    ]),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_plan(case: Case) -> None:
    idx = case.inputs or tuple(range(case.n or case.k))
    plan = ReducePlan(R, [I[i] for i in idx], case.k, "sum", ME, depth=lambda k, size: case.depth,
                      patience=case.patience,
                      spec=ReduceSpec(everyone=case.everyone, here=case.here, merge=case.merge))
    for i, (event, expected) in enumerate(case.steps):
        assert norm(plan.handle(event)) == norm(expected), f"step {i}: {event}"


def drive(k: int, depth: int, arrival: tuple[int, ...],
          local: int | None) -> tuple[ReducePlan, list[Instruction]]:
    """Feed inputs in ``arrival`` order, answering all but the newest started task after each,
    the rest newest first at the end; returns the plan and every instruction."""
    plan = ReducePlan(R, I[:k], k, "sum", ME, depth=lambda n, size: depth)
    seen: list[Instruction] = []
    pending: list[int] = []
    for i in arrival:
        holders = (ME,) if i == local else (f"n{i}",)
        seen += plan.handle(ready(i, *holders))
        pending += [x.slot for x in seen if isinstance(x, StartTask) and x.slot not in pending]
        while len(pending) > 1:
            seen += plan.handle(started(pending.pop(0)))
    for slot in reversed(pending):
        seen += plan.handle(started(slot))
    return plan, seen


SHAPES = [(3, 0), (4, 0), (3, 1), (5, 1), (5, 2), (6, 2)]


@pytest.mark.parametrize(("k", "depth"), SHAPES, ids=[f"k{k}-d{d}" for k, d in SHAPES])
def test_every_edge_once_whatever_the_order(k: int, depth: int) -> None:
    shape = tree_shape(k, depth)
    edges = sorted((p, c) for c, p in enumerate(shape.parent) if p is not None)
    for arrival in itertools.permutations(range(k)):
        for local in (None, arrival[0], arrival[-1]):
            plan, seen = drive(k, depth, arrival, local)
            slot_of = {s.output: slot for slot, s in plan.slots.items()}
            connects = [x for x in seen if isinstance(x, Connect)]
            assert sorted((x.parent_slot, slot_of[x.child_output]) for x in connects) == edges
            assert all(x.child_slot == slot_of[x.child_output] for x in connects)
            for x in connects:
                child = plan.slots[slot_of[x.child_output]]
                assert (x.parent_node, x.child_node, x.child_version) == (
                    plan.slots[x.parent_slot].node, child.node, child.version)
            pulls = [x for x in seen if isinstance(x, PullRoot)]
            in_place = local is not None and plan.slots[shape.root].node == ME
            assert len(pulls) == (0 if in_place else 1), (arrival, local)
            assert plan.used == [I[i] for i in arrival]


REDO = [
    ("k1", 1, 0, 0, [0]),
    ("chain-leaf", 4, 0, 0, [0, 1, 2, 3]),
    ("chain-middle", 4, 0, 2, [2, 3]),
    ("chain-root", 4, 0, 3, [3]),
    ("tree7-left-leaf", 7, 2, 0, [0, 1, 3]),
    ("tree7-right-leaf", 7, 2, 6, [6, 5, 3]),
    ("tree7-inner", 7, 2, 5, [5, 3]),
    ("tree7-root", 7, 2, 3, [3]),
    ("tree5-d1-right-chain", 5, 1, 3, [3, 4, 2]),
]


@pytest.mark.parametrize(("k", "depth", "slot", "path"), [r[1:] for r in REDO],
                         ids=[r[0] for r in REDO])
def test_redo_path(k: int, depth: int, slot: int, path: list[int]) -> None:
    assert redo_path(tree_shape(k, depth), slot) == path


@pytest.mark.parametrize(("inputs", "k", "op"), [
    ([], 1, "sum"), (I[:2], 0, "sum"), (I[:2], 3, "sum"), (I[:2], 2, "avg"),
], ids=["no-inputs", "k0", "k-above-n", "unknown-op"])
def test_constructor_refuses(inputs: list[ObjectID], k: int, op: str) -> None:
    with pytest.raises(InvalidArgumentError):
        ReducePlan(R, inputs, k, op, ME, depth=lambda n, size: 0)


def test_depth_is_asked_for_k_and_the_size() -> None:
    asked: list[tuple[int, int]] = []

    def depth(n: int, size: int) -> int:
        asked.append((n, size))
        return 1

    plan = ReducePlan(R, I[:4], 3, "max", ME, depth=depth)
    plan.handle(ready(0, "n0"))
    plan.handle(ready(1, "n1"))
    assert asked == [(3, BIG)]
    assert plan.shape == tree_shape(3, 1)


def test_used_and_chosen() -> None:
    plan = ReducePlan(R, I[:3], 2, "sum", ME, depth=lambda n, size: 0)
    plan.handle(ready(2, "n2"))
    assert (plan.used, plan.chosen) == ([I[2]], False)
    plan.handle(ready(0, "n0"))
    assert (plan.used, plan.chosen) == ([I[2], I[0]], True)


def test_a_backup_takes_the_lost_inputs_place_in_used() -> None:
    plan = ReducePlan(R, I[:4], 3, "sum", ME, depth=lambda n, size: 0)
    for step, _ in BACKUP_CHAIN[:3]:
        plan.handle(step)
    plan.handle(NodeDied("n1"))
    plan.handle(ready(3, "n3"))
    assert plan.used == [I[0], I[3], I[2]]


def test_history_is_bounded_and_records_outcomes() -> None:
    plan = ReducePlan(R, I[:2], 2, "sum", ME, depth=lambda n, size: 0)
    first = ready(0, "n0")
    plan.handle(first)
    assert list(plan.history) == [(first, (OPEN,))]
    for _ in range(HISTORY_MAX + 5):
        plan.handle(NodeDied("n9"))
    assert len(plan.history) == HISTORY_MAX
    assert plan.history[-1] == (NodeDied("n9"), ())


def test_fail_carries_the_reported_error() -> None:
    plan = ReducePlan(R, I[:2], 2, "sum", ME, depth=lambda n, size: 0)
    [fail] = [x for x in plan.handle(InputFailed(I[0], TIMEOUT)) if isinstance(x, Fail)]
    assert fail.error is TIMEOUT and plan.error is TIMEOUT
    assert isinstance(plan.error, HopliteError)


@pytest.mark.parametrize("name", ["", ".model", ".placement", ".repair", ".policy", ".merge",
                                  ".fold", ".combiner"])
def test_pure_module_imports_no_io(name: str) -> None:
    module = importlib.import_module(plan_module.__name__ + name)
    assert not top_level_imports(module) & {"asyncio", "socket", "time", "logging", "random"}


# --- a stripe (window) of the inputs: a striped allreduce's reduces (docs/design.md §4) ---
WIN = (BIG // 4, BIG // 2)
WSIZE = WIN[1] - WIN[0]
WSHAPE = (WSIZE // 4,)


def stripe_plan(k: int = 2) -> ReducePlan:
    return ReducePlan(R, I[:k], k, "sum", ME, depth=lambda n, size: 0, spec=ReduceSpec(window=WIN))


def failure(out: list[Instruction]) -> Fail | None:
    return next((x for x in out if isinstance(x, Fail)), None)


def test_a_stripe_reduces_only_its_bytes_and_its_result_is_a_flat_array() -> None:
    p = stripe_plan()
    assert p.handle(ready(0, ME)) == [OpenResult(WSIZE, DT, WSHAPE), StartTask(
        1, 0, ME, I[0], R, "sum", DT, WSHAPE, 1, 0, *WIN)]
    assert p.handle(ready(1, "n1")) == []  # a leaf: no task, its parent's is not started
    # the parent reads the stripe's bytes of the leaf's input itself: no copy on n1
    assert norm(p.handle(started(1))) == [Connect(1, ME, 0, "n1", I[1], v(1), window=WIN)]


def test_a_stripe_leaf_placed_under_a_started_parent_is_connected_at_once() -> None:
    p = stripe_plan()
    p.handle(ready(0, ME))
    p.handle(started(1))
    assert norm(p.handle(ready(1, "n1"))) == [Connect(1, ME, 0, "n1", I[1], v(1), window=WIN)]


def test_a_whole_objects_leaf_is_read_without_a_window() -> None:
    p = ReducePlan(R, I[:2], 2, "sum", ME, depth=lambda n, size: 0)
    p.handle(ready(0, ME))
    p.handle(started(1))
    assert norm(p.handle(ready(1, "n1"))) == [Connect(1, ME, 0, "n1", I[1], v(1))]


@pytest.mark.parametrize("other,why", [
    (ready(1, "n1", shape=(BIG // 8, 2)), "another shape of the same size"),
    (ready(1, "n1", size=BIG * 2, shape=(BIG // 2,)), "a bigger input"),
    (ready(1, "n1", dtype="<i4"), "another dtype"),
])
def test_stripe_inputs_must_agree_as_whole_inputs(other: InputReady, why: str) -> None:
    p = stripe_plan()
    p.handle(ready(0, ME))
    fail = failure(p.handle(other))
    assert isinstance(fail, Fail) and isinstance(fail.error, InvalidArgumentError), why


def test_a_stripe_outside_the_inputs_or_across_elements_fails() -> None:
    outside = ReducePlan(R, I[:2], 2, "sum", ME, depth=lambda n, s: 0,
                         spec=ReduceSpec(window=(0, BIG * 2)))
    fail = failure(outside.handle(ready(0, ME)))
    assert isinstance(fail, Fail) and isinstance(fail.error, InvalidArgumentError)
    odd = ReducePlan(R, I[:2], 2, "sum", ME, depth=lambda n, s: 0,
                     spec=ReduceSpec(window=(2, BIG // 2)))
    fail = failure(odd.handle(ready(0, ME)))
    assert isinstance(fail, Fail) and "whole elements" in str(fail.error)


@pytest.mark.parametrize("window", [(0, INLINE_MAX), (-4, BIG), (BIG, BIG)])
def test_a_stripe_must_be_larger_than_inline(window: tuple[int, int]) -> None:
    with pytest.raises(InvalidArgumentError):
        ReducePlan(R, I[:2], 2, "sum", ME, depth=lambda n, s: 0, spec=ReduceSpec(window=window))


# --- ring order: a stripe's chain runs round the ring and ends at its reducer (§4) ---
RING = ("n1", "n2", "n3", ME, "n5", "n6")


def slots_taken(k: int, ring: tuple[str, ...], order: list[str]) -> dict[str, int]:
    """Which slot each node's input takes (its last) when they become ready in ``order``."""
    p = ReducePlan(R, I[:k], k, "sum", ME, depth=lambda n, size: 0,
                   spec=ReduceSpec(window=WIN, ring=ring, merge=False))
    got: dict[str, int] = {}
    for i, node in enumerate(order):
        p.handle(ready(i, node))
        got[node] = next(slot for slot, placed in p.slots.items() if placed.input == I[i])
    return got


@pytest.mark.parametrize("order", [
    ["n3", "n2", ME, "n6", "n1", "n5"], [ME, "n1", "n2", "n3", "n5", "n6"],
    ["n6", "n5", "n3", "n2", "n1", ME]], ids=["shuffled", "in order", "reversed"])
def test_a_ring_orders_the_chain_from_this_nodes_successor(order: list[str]) -> None:
    """Whatever order the inputs come in, the chain starts after this node and ends here."""
    assert slots_taken(6, RING, order) == {"n5": 0, "n6": 1, "n1": 2, "n2": 3, "n3": 4, ME: 5}


def test_without_a_ring_the_chain_follows_readiness() -> None:
    assert slots_taken(4, (), ["n3", ME, "n1", "n2"]) == {"n3": 0, ME: 3, "n1": 1, "n2": 2}


@pytest.mark.parametrize("k,order,expected", [
    # fewer inputs than ring members: positions scale to the chain, nearest free slot
    (3, ["n2", "n5", ME], {"n5": 0, "n2": 1, ME: 2}),
    # two inputs on one node: the second takes the nearest free slot
    (4, ["n6", "n6", "n1", ME], {"n6": 1, "n1": 2, ME: 3}),
    # a node outside the ring takes the first free slot
    (3, ["x", "n5", ME], {"x": 0, "n5": 1, ME: 2}),
])
def test_ring_slots_are_nearest_free(k: int, order: list[str], expected: dict[str, int]) -> None:
    assert slots_taken(k, RING, order) == expected


@settings(max_examples=40)
@given(seed=st.integers(0, 2**32 - 1))
def test_ring_slots_follow_the_nearest_free_rule_however_crowded(seed: int) -> None:
    """Up to 40 inputs, several per node, in any order (the root taken early or late): each
    takes the free non-root slot nearest its node's ideal place, the lower on a tie, as
    the rule reads when every free slot is listed and compared."""
    rng = random.Random(seed)
    k = rng.randint(3, 40)
    inputs = [ObjectID(bytes([i + 1]) * 20) for i in range(k)]
    p = ReducePlan(R, inputs, k, "sum", ME, depth=lambda n, size: 0,
                   spec=ReduceSpec(window=WIN, ring=RING, merge=False))
    taken: set[int] = set()
    for i in range(k):
        node = rng.choice([*RING, "x"])
        ev = InputReady(inputs[i], (node,), (node,), BIG, DT, SHAPE, v(i))
        before = set(p.slots)
        p.handle(ev)
        slots = sorted(set(p.slots) - before)
        assert p.shape is not None
        root = p.shape.root
        free = [s for s in range(k) if s not in taken and s != root]
        if (node == ME and root not in taken) or not free:
            want = root
        elif node not in RING:
            want = free[0]
        else:
            order = [s for s in range(k) if s != root]
            distance = (RING.index(node) - RING.index(ME)) % len(RING)
            ideal = (distance - 1) * (len(order) - 1) / (len(RING) - 2)
            want = min(free, key=lambda s: (abs(order.index(s) - ideal), s))
        assert slots == [want]
        taken.add(want)


def test_a_stripe_places_a_lost_input_again_rather_than_folding_it() -> None:
    """In a stripe, an input put again on a node that computes another slot is placed there
    as a slot of its own: a fold's consumer may have to pull the input's own bytes, and a pull
    of an input does not know the window (a whole reduce folds it, test above)."""
    p = stripe_plan(3)
    p.handle(ready(0, ME))
    p.handle(ready(1, "n1"))
    p.handle(ready(2, "n2"))
    for slot in (2, 1):  # slot 0 is a leaf: no task
        p.handle(started(slot))
    p.handle(NodeDied("n1"))
    assert p.handle(ChildLost(1, 0, v(1), 64, True, BROKEN, t(1))) == [
        WaitInput(I[1], ("n1",))]
    out = p.handle(ready(1, "n2"))
    assert not any(isinstance(x, Fold) for x in out)
    assert (p.slots[0].node, p.slots[0].input, p.slots[0].task) == ("n2", I[1], False)
    assert norm(out) == [Connect(1, "n2", 0, "n2", I[1], v(1), window=WIN)]


# --- two trees of halves (docs/simulation.md §6) ---
HALVES = ((0, BIG // 2), (BIG // 2, BIG))


@pytest.mark.parametrize("k, local", [(8, True), (8, False), (3, True), (5, False)])
def test_two_trees_of_halves_share_no_inner_node(k: int, local: bool) -> None:
    """Fed the same arrivals, the two halves' plans place every input once in each tree; no
    input's node computes a slot with children in both (its downlink would carry the object
    twice) but the roots' node, whose root has one child in each tree: this node if it holds
    an input, else the last to arrive."""
    plans = [ReducePlan(R, I[:k], k, "sum", ME, depth=lambda n, size: 0,
                        spec=ReduceSpec(window=w, half=h))
             for h, w in enumerate(HALVES)]
    inner: list[set[str]] = [set(), set()]
    roots: list[tuple[str, int]] = []
    for i in range(k):
        node = ME if local and i == 0 else f"n{i}"
        for h, p in enumerate(plans):
            for ins in p.handle(ready(i, node)):
                if isinstance(ins, StartTask) and ins.children:
                    inner[h].add(ins.node)
                    if p.shape is not None and ins.slot == p.shape.root:
                        roots.append((ins.node, ins.children))
    assert all(len(p.slots) == k for p in plans)
    top = ME if local else f"n{k - 1}"
    assert roots == [(top, 1), (top, 1)]
    assert inner[0] & inner[1] == {top}


def test_a_tree_of_halves_needs_a_window_of_every_input() -> None:
    with pytest.raises(InvalidArgumentError, match="window of every input"):
        ReducePlan(R, I[:4], 4, "sum", ME, depth=lambda n, size: 0, spec=ReduceSpec(half=0))
    with pytest.raises(InvalidArgumentError, match="window of every input"):
        ReducePlan(R, I[:4], 3, "sum", ME, depth=lambda n, size: 0,
                   spec=ReduceSpec(window=HALVES[0], half=0))
    with pytest.raises(InvalidArgumentError, match="window of every input"):
        ReducePlan(R, I[:4], 4, "sum", ME, depth=lambda n, size: 0,
                   spec=ReduceSpec(window=HALVES[0], half=2))


# --- a combiner: a pair's stripe, whose root adds no input (docs/design.md §4) ---
def combiner_plan(k: int, late: int = 2) -> ReducePlan:
    return ReducePlan(R, I[:k], k, "sum", ME, depth=lambda n, size: 0,
                      spec=ReduceSpec(window=WIN, combiner=True, late=late))


def test_a_combiner_starts_its_root_here_before_any_input_of_its_own() -> None:
    """The root task starts with the first input, names the result as its input (it adds
    none), and pulls the chain's top as soon as that is placed; the last two inputs are
    leaves of the root, wherever they come, this node's own included. A leaf has no task:
    its consumer reads the stripe's bytes of its input, pulled or, here, where it is."""
    p = combiner_plan(4)
    root = StartTask(2, 0, ME, R, R, "sum", DT, WSHAPE, 3, 0, *WIN)
    assert p.handle(ready(0, "n1")) == [OpenResult(WSIZE, DT, WSHAPE), root]
    assert p.handle(ready(1, "n2")) == [
        StartTask(1, 0, "n2", I[1], out(1), "sum", DT, WSHAPE, 1, 0, *WIN)]
    assert p.handle(started(2)) == []
    assert norm(p.handle(started(1))) == [Connect(2, ME, 1, "n2", out(1), t(1)),
                                          Connect(1, "n2", 0, "n1", I[0], v(0), window=WIN)]
    assert norm(p.handle(ready(2, ME))) == [Connect(2, ME, 3, ME, I[2], v(2), window=WIN)]
    assert norm(p.handle(ready(3, "n3"))) == [Connect(2, ME, 4, "n3", I[3], v(3), window=WIN)]
    assert p.used == I[:4] and p.chosen


def test_a_combiner_of_two_inputs_has_two_leaves() -> None:
    p = combiner_plan(2)
    out_ = p.handle(ready(0, "n1"))
    assert out_[1] == StartTask(0, 0, ME, R, R, "sum", DT, WSHAPE, 2, 0, *WIN)
    p.handle(ready(1, "n2"))
    assert p.shape is not None and p.shape.children[0] == [1, 2]
    assert {s: (x.input, x.task) for s, x in p.slots.items()} == {
        0: (R, True), 1: (I[0], False), 2: (I[1], False)}


def test_a_trio_s_combiner_hangs_the_last_three_inputs_on_its_root() -> None:
    """A third of a trio (docs/design.md §4, "Three combiners"): the chain holds the first
    k - 3 inputs, the root takes slot k - 3, the last three are its leaves."""
    p = combiner_plan(4, late=3)
    first = p.handle(ready(0, "n1"))
    assert first[1] == StartTask(1, 0, ME, R, R, "sum", DT, WSHAPE, 4, 0, *WIN)
    assert placing(p, ready(1, "n2"), ready(2, "n3"), ready(3, ME)) == I[1:4]
    assert [s for s, x in sorted(p.slots.items()) if x.input in I[1:4]] == [2, 3, 4]
    assert p.shape is not None and p.shape.children[1] == [0, 2, 3, 4]


# --- a trio's combiner holds late inputs while its own is missing (docs/design.md §4,
# "Who pulls a late input first") ---
RATE = 125e6  # bytes/s: 1 Gbit/s
HOLD = LATE_HOLD * WSIZE / RATE  # one third combiner's stripe, at the link's rate


def trio_plan(k: int = 5, late: int = 3, rate: float = RATE) -> ReducePlan:
    return ReducePlan(R, I[:k], k, "sum", ME, depth=lambda n, size: 0,
                      spec=ReduceSpec(window=WIN, combiner=True, late=late, rate=rate))


def placing(p: ReducePlan, *events: Event) -> list[ObjectID]:
    """The inputs whose slots ``events`` place, in order (a stripe's leaf has no task to
    start: its consumer reads its input's window)."""
    got: list[ObjectID] = []
    for ev in events:
        before = {slot: (x.input, x.node, x.gen) for slot, x in p.slots.items()}
        p.handle(ev)
        got += [x.input for slot, x in sorted(p.slots.items())
                if before.get(slot) != (x.input, x.node, x.gen) and x.input != R]
    return got


def test_a_late_input_waits_while_a_third_combiner_has_put_and_this_one_has_not() -> None:
    """Two early inputs, then the first late one (n3) is pulled at once; the second (n4) is
    held, n3 having put and this node not, so n4's uplink feeds n3's stripe first; this
    node's own input then places it."""
    p = trio_plan()
    assert placing(p, ready(0, "n1"), ready(1, "n2")) == I[:2]
    assert placing(p, ready(2, "n3")) == [I[2]]
    assert p.handle(ready(3, "n4")) == [After(HOLD, HoldOver(I[3]))]
    assert list(p.held) == [I[3]]
    assert placing(p, ready(4, ME)) == [I[4], I[3]]
    assert not p.held and p.chosen and p.used == [I[0], I[1], I[2], I[4], I[3]]
    assert p.handle(HoldOver(I[3])) == []


def test_a_held_input_is_placed_when_its_time_is_over() -> None:
    p = trio_plan()
    for i, node in enumerate(("n1", "n2", "n3", "n4")):
        p.handle(ready(i, node))
    assert placing(p, HoldOver(I[3])) == [I[3]] and not p.held
    assert placing(p, ready(4, ME)) == [I[4]] and p.chosen


def test_a_combiner_whose_input_never_comes_holds_longer_behind_two_thirds() -> None:
    """A wrong guess: the last input is not this node's; two other late nodes have put."""
    p = trio_plan()
    for i, node in enumerate(("n1", "n2", "n3")):
        p.handle(ready(i, node))
    assert p.handle(ready(3, "n4")) == [After(HOLD, HoldOver(I[3]))]
    assert p.handle(ready(4, "n5")) == [After(2 * HOLD, HoldOver(I[4]))]
    assert placing(p, HoldOver(I[4]), HoldOver(I[3])) == [I[4], I[3]]
    assert p.chosen and not p.held


@pytest.mark.parametrize("late, rate, nodes", [
    (2, RATE, ("n1", "n2", "n3", "n4", ME)),  # a pair's combiner never holds
    (3, 0.0, ("n1", "n2", "n3", "n4", ME)),  # no rate known
    (3, RATE, ("n1", "n2", ME, "n3", "n4")),  # this node put first
    (3, RATE, ("n1", "n2", "n3", ME, "n4")),  # ... or second
    (3, RATE, ("n1", "n2", "n3", "n3", ME)),  # the late inputs so far are on one node
    (3, RATE, ("n1", "n2", "n3", ME, ME)),
], ids=["pair", "no-rate", "own-first", "own-second", "same-node", "own-twice"])
def test_no_hold(late: int, rate: float, nodes: tuple[str, ...]) -> None:
    p = trio_plan(late=late, rate=rate)
    assert sorted(placing(p, *(ready(i, node) for i, node in enumerate(nodes)))) == sorted(
        I[:5]) and p.chosen
    assert not p.held and p.holds == 0


def hurry_plan(k: int = 5, late: int = 3, rate: float = RATE,
               early: tuple[str, ...] = ("n1", "n2")) -> ReducePlan:
    """A trio's combiner whose early inputs (on ``early``) are placed and connected."""
    p = trio_plan(k, late, rate)
    for i, node in enumerate(early):
        p.handle(ready(i, node))
    for slot in range(len(early) + 1):
        p.handle(started(slot))
    return p


def hurries(out: list[Instruction]) -> list[Instruction]:
    return [x for x in out if isinstance(x, Hurry)]


def test_the_combiner_that_puts_first_sends_its_early_chain_ahead() -> None:
    """This node's input is the first late one: the chain's first edge, slot 0 (n1) into
    slot 1 (n2), goes ahead of the other stripes' at n2 (docs/design.md §4, "The first
    combiner's chain goes first"); nothing more once the others put."""
    p = hurry_plan()
    assert hurries(p.handle(ready(2, ME))) == [Hurry(1, "n2", 0, t(1))] and p.hurried == 1
    assert hurries(p.handle(ready(3, "n3")) + p.handle(ready(4, "n4"))) == []
    assert p.chosen and p.hurried == 1


@pytest.mark.parametrize("k, late, rate, early, late_nodes", [
    (5, 3, RATE, ("n1", "n2"), ("n3", ME, "n4")),  # another combiner put first
    (5, 3, RATE, ("n1", "n2"), ("n3", "n4", ME)),  # ... and another second
    (5, 2, RATE, ("n1", "n2", "n3"), (ME, "n4")),  # a pair's combiner: no hold, no hurry
    (5, 3, 0.0, ("n1", "n2"), (ME, "n3", "n4")),  # no rate known
    (4, 3, RATE, ("n1",), (ME, "n3", "n4")),  # a chain of one input: no edge below the root
], ids=["own-second", "own-last", "pair", "no-rate", "no-chain-edge"])
def test_no_hurry(k: int, late: int, rate: float, early: tuple[str, ...],
                  late_nodes: tuple[str, ...]) -> None:
    p = hurry_plan(k, late, rate, early)
    out: list[Instruction] = []
    for i, node in enumerate(late_nodes, start=len(early)):
        out += p.handle(ready(i, node))
    assert hurries(out) == [] and p.hurried == 0 and p.chosen


def test_no_hurry_before_the_chain_s_first_edge_is_told() -> None:
    """The second input's task has not started: its pull of the first is not running yet."""
    p = trio_plan()
    p.handle(ready(0, "n1"))
    p.handle(ready(1, "n2"))
    p.handle(started(0))
    assert hurries(p.handle(ready(2, ME))) == [] and p.hurried == 0


def test_a_death_places_the_held_inputs_before_its_repair() -> None:
    """A repair sees every input placed: the held one goes in first, on its live node."""
    p = trio_plan()
    for i, node in enumerate(("n1", "n2", "n3", "n4")):
        p.handle(ready(i, node))
    assert placing(p, NodeDied("n1"))[:1] == [I[3]] and not p.held


# --- the last input's leaf placed ahead (docs/design.md §4, "The last input's leaf placed
# ahead") ---
TRIO = ("n3", "n4", ME)  # the nodes guessed to put the late inputs


def ahead_plan(late: int = 3, late_nodes: tuple[str, ...] = TRIO) -> ReducePlan:
    return ReducePlan(R, I[:5], 5, "sum", ME, depth=lambda n, size: 0,
                      spec=ReduceSpec(window=WIN, combiner=True, late=late, rate=RATE,
                                      late_nodes=late_nodes))


def root_started(p: ReducePlan) -> int:
    """Start the root (the combiner's task here) and return its slot."""
    assert p.shape is not None
    p.handle(started(p.shape.root))
    return p.shape.root


def leaf_of(p: ReducePlan, oid: ObjectID) -> tuple[int, str, bytes]:
    """(slot, node, input version) of ``oid``'s leaf."""
    (slot, x), = [(s, x) for s, x in p.slots.items() if x.input == oid and not x.task]
    return slot, x.node, x.input_version


def placed_ahead() -> tuple[ReducePlan, int, int]:
    """A trio's plan with its root started, two late inputs in (n3's and this node's), and
    the last input's leaf placed ahead on n4: (plan, root slot, the leaf's slot)."""
    p = ahead_plan()
    placing(p, ready(0, "n1"), ready(1, "n2"))
    root = root_started(p)
    placing(p, ready(2, "n3"), ready(3, ME))
    return p, root, leaf_of(p, I[4])[0]


def test_the_last_inputs_leaf_waits_on_the_one_late_node_left() -> None:
    """Two late inputs are in, on n3 and here: the last is n4's, so its leaf goes there at
    once, version unknown (b""), and its consumer's pull waits there for it."""
    p = ahead_plan()
    placing(p, ready(0, "n1"), ready(1, "n2"))
    root = root_started(p)
    placing(p, ready(2, "n3"))
    got = p.handle(ready(3, ME))
    slot, node, held = leaf_of(p, I[4])
    assert (node, held) == ("n4", b"") and p.ahead == {I[4]} and p.aheads == 1
    assert Connect(root, ME, slot, "n4", I[4], b"", window=WIN) in norm(got)
    assert p.chosen and not any(isinstance(x, CancelWaits) for x in got)
    assert p.handle(ready(4, "n4")) == []  # as guessed: its version is held from now on
    assert leaf_of(p, I[4]) == (slot, "n4", v(4)) and not p.ahead


def test_a_wrong_guess_moves_the_leaf_to_the_inputs_holder() -> None:
    p, root, slot = placed_ahead()
    got = norm(p.handle(ready(4, "n5")))
    assert got == [Connect(root, ME, slot, "n5", I[4], v(4), window=WIN)]
    assert leaf_of(p, I[4]) == (slot, "n5", v(4)) and not p.ahead


def test_a_leaf_placed_ahead_that_finds_nothing_waits_for_its_input_as_before() -> None:
    """The pull's wait at n4 ran out ("no copy"): the slot is free again and the input
    placed where it is reported, n4 included (it is not taken for a node lacking it)."""
    p, root, slot = placed_ahead()
    lost = ChildLost(root, slot, b"", 0, False, ObjectNotFoundError("no copy"), t(root))
    assert p.handle(lost) == [] and not p.chosen and not p.ahead
    assert slot not in p.slots
    got = norm(p.handle(ready(4, "n4")))
    assert got == [Connect(root, ME, slot, "n4", I[4], v(4), window=WIN)] and p.chosen


def test_a_guessed_node_that_dies_has_its_leaf_wait_for_the_input_elsewhere() -> None:
    p, root, slot = placed_ahead()
    p.handle(NodeDied("n4"))
    lost = ChildLost(root, slot, b"", 0, True, ConnectionLostError("gone"), t(root))
    assert p.handle(lost) == [WaitInput(I[4], ("n4",))]
    got = norm(p.handle(ready(4, "n5")))
    assert got == [Connect(root, ME, slot, "n5", I[4], v(4), window=WIN)] and not p.ahead


@pytest.mark.parametrize("late, late_nodes, nodes", [
    (3, (), ("n1", "n2", "n3", ME)),  # no guess given
    (3, TRIO, ("n1", "n2", "n3", "n4")),  # the one left is this node
    (3, TRIO, ("n1", "n2", "n3", "n3")),  # two late inputs on one node: two nodes left
    (3, TRIO, ("n1", "n2", "n3")),  # two inputs missing
    (2, ("n4", ME), ("n1", "n2", "n3", "n4")),  # a pair whose last is this node's
], ids=["no-guess", "left-is-me", "same-node", "two-missing", "pair-left-is-me"])
def test_nothing_placed_ahead(late: int, late_nodes: tuple[str, ...],
                              nodes: tuple[str, ...]) -> None:
    p = ahead_plan(late, late_nodes)
    placing(p, *(ready(i, node) for i, node in enumerate(nodes)))
    assert not p.ahead and p.aheads == 0 and len(p.used) + len(p.held) == len(nodes)


def test_a_pairs_last_leaf_is_placed_ahead_too() -> None:
    p = ahead_plan(2, ("n4", ME))
    placing(p, ready(0, "n1"), ready(1, "n2"), ready(2, "n3"), ready(3, ME))
    assert leaf_of(p, I[4])[1:] == ("n4", b"") and p.ahead == {I[4]}


@pytest.mark.parametrize("kwargs", [
    {"window": None}, {"half": 0}, {"k": 3}, {"inputs": I[:1], "k": 1},
    {"late": 1}, {"late": 5}])
def test_a_combiner_reduces_a_window_of_every_input(kwargs: dict[str, object]) -> None:
    args: dict[str, object] = {"inputs": I[:4], "k": 4, "window": WIN} | kwargs
    with pytest.raises(InvalidArgumentError, match="combiner"):
        ReducePlan(R, args["inputs"], args["k"], "sum", ME,  # type: ignore[arg-type]
                   depth=lambda n, size: 0,
                   spec=ReduceSpec(window=args["window"],  # type: ignore[arg-type]
                                   half=args.get("half"), combiner=True,  # type: ignore[arg-type]
                                   late=args.get("late", 2)))  # type: ignore[arg-type]


def test_a_chain_deeper_than_pythons_recursion_is_repaired(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A chain of three times the recursion limit, every slot on one node: the root's pull
    breaks with the node dead, and its repair walks the whole chain (on the plan's own stack,
    not Python's); every input is waited for again, and once put again on another node every
    slot is placed there. The plan's records are checked once after each of those steps, not
    after each of its 9,000 events (a check walks every slot: a minute, checked so)."""
    monkeypatch.setattr(plan_module, "CHECK_INVARIANTS", False)
    k = 3 * sys.getrecursionlimit()
    ids = [ObjectID(i.to_bytes(4, "big") * 5) for i in range(k)]
    plan = ReducePlan(R, ids, k, "sum", ME, depth=lambda n, size: 0, spec=ReduceSpec(merge=False))
    first: list[Instruction] = []
    for i, oid in enumerate(ids):
        first += plan.handle(InputReady(oid, ("n1",), ("n1",), BIG, DT, SHAPE, b"v%d" % i))
    for ins in first:
        if isinstance(ins, StartTask):
            plan.handle(TaskStarted(ins.slot, ins.gen, b"t%d" % ins.slot))
    plan.validate()
    assert plan.shape is not None
    root = plan.slots[plan.shape.root]
    assert root.version is not None
    redo = plan.handle(ChildLost(None, plan.shape.root, root.version, 0, True, BROKEN))
    plan.validate()
    assert plan.error is None
    assert len(redo) == k and set(redo) == {WaitInput(oid, ("n1",)) for oid in ids}
    again: list[Instruction] = []
    for i, oid in enumerate(ids):
        again += plan.handle(InputReady(oid, ("n2",), ("n2",), BIG, DT, SHAPE, b"w%d" % i))
    plan.validate()
    assert plan.error is None
    assert {ins.slot for ins in again if isinstance(ins, StartTask) and ins.node == "n2"} == (
        set(range(k)) - {0})  # slot 0, the chain's first, is a leaf: no task


def test_the_daemons_coordinator_carries_out_every_kind_of_instruction() -> None:
    """A kind the plan gives with no handler in the coordinator would fail at run time."""
    assert set(INSTRUCTION_HANDLERS) == set(typing.get_args(plan_module.Instruction))
