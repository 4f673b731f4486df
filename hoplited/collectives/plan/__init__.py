"""A reduce coordinator's decisions as a pure core: which inputs, slots, nodes and edges.

Theory of operation. Inputs become ready in any order; the first ``k`` are used, in readiness
order, and the rest are backups whose waits are cancelled once ``k`` are chosen. An input whose
wait fails (it timed out, or its id names a failed reduce's result) is one candidate fewer: the
reduce fails with its error only once the inputs still awaited cannot make up ``k``. The first
ready input fixes the metadata: small inputs (at most ``INLINE_MAX``) come inline from their
shards and are combined here once ``k`` are chosen; larger ones open the result on this node
and fix a tree of ``k`` slots (:mod:`.tree`). Each input takes a slot as it becomes ready: an
input held here takes the root while it is free (the result is then computed in place, and
this node's link carries no second stream), otherwise the first free non-root slot, the root
last. A leaf not computed in place needs no task (its output is its input); any other slot
starts a task on its node. A parent learns where a child's output is once both tasks exist
(``TaskStarted``) and the child's version is known, so tasks can start concurrently and edges
are emitted exactly once in whatever order they complete. The root's output, unless it is the
result, is pulled into the result.

Repair (docs/design.md §5). A slot's *consumer* is its parent's task, or for the root the pull
into the result; it keeps every byte it received. When a consumer's pull breaks
(``ChildLost``) and the slot's node is dead, only that slot is redone: its input is waited for
again (another live copy, or the same id put again on another node, as a restarted task does)
and the slot is placed anew, computing from the byte where its consumer stopped; the consumer
resumes there. An id names one value, so the bytes before that offset are still right and no
partial sum on the path to the root is redone. Dead children of a redone slot are redone from
the same offset; a dead slot whose consumer already has every byte costs nothing. A pull that
broke while its source still looks alive is reconnected after a backoff, a few times. A lost
input that does not come back within the reduce's timeout fails the reduce, naming the dead
node.

Folds (docs/design.md §5, "Folding a lost input"). A lost input back on a node that computes
another slot is added into that slot from the first byte it has not combined (``Fold``), and
the lost slot's consumer takes the lost slot's children from the fold's element on
(``Reshape``), plus the input's own bytes up to where the fold took effect; on a node where
only a leaf runs, the lost slot is placed there and takes the leaf's input over from where
the leaf's consumer stopped adding it. Either way that node's link carries one stream. A later
loss that a fold relies on starts the result again from byte 0 (``_restart_all``).

Several inputs on one node (docs/design.md §4). An input ready on a node that already has a
slot is added by that slot instead of taking one of its own, so the node's link carries one
stream: the slot it would have taken leaves the tree (its children hang on its parent) and
the host adds it from its start, by a ``Fold`` while the host's task has not been told of
every child (it cannot have combined a byte), or else by placing the host again with the
input among its ``extras``, together with the slots above it up to one whose consumer has
read nothing (at most ``MERGE_REACH``). Losing a host loses all its inputs: the result starts
again from byte 0, each of them waited for as an input of its own (``_restart_all``). Each
edge names the placement of its parent it is meant for, so a task placed again never resumes
a pull of the old value.

Backups. With ``k`` below the number of inputs, a repair also waits again for the inputs not
used (their waits were cancelled once ``k`` were chosen); whichever comes first takes the lost
slot: the same id (resumed as above) or a backup, and a backup already ready is used at once.
A backup is another value, so the slot computes from byte 0; if its consumer had received
bytes of the lost value, so had every partial sum on the path to the root (``redo_path``):
those slots are started again from byte 0 on their nodes and the result restarts under a new
version (``RestartResult``; getters behind it start over). Every other slot keeps its output,
and children repaired earlier from a later byte are started again from 0. ``used`` names the
inputs in the result once it is complete.

Slot states. Each slot is in one state (``SlotState``: free, placed, redo, merged, folding,
folded, absorbing), kept with that state's record in one table entry per slot (``SlotEntry``).
Every change goes through ``ReducePlan._move``, which refuses at once a move that
``SLOT_TRANSITIONS`` does not list, telling the plan's last events; it keeps the indexes of
the table that placement and repair look things up in: by state (read outside as the views
``slots``, ``redo``, ``merged``, ``folding``, ``folds``, ``absorbing``, ``absorbed``) and
by node. A repair that must decide a slot's next state while no lookup sees it (a restart, a
backup taking a slot, a lost input back, a failed fold) lifts it out of its index first; the
move it then makes is checked from the state it left. ``validate`` checks the rest: the
indexes against the table, and the records that refer to slots.

Nothing here waits or does I/O: ``ReducePlan.handle(event)`` returns the instructions the
driver (``hoplited.collectives.coordinator``) carries out, in order, feeding outcomes back as
events. ``history`` keeps the last (event, instructions) pairs for debugging.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Generator, Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Literal, get_args

import numpy as np

from hoplite_client.wire.errors import (
    ConnectionLostError,
    HopliteError,
    InvalidArgumentError,
    ObjectNotFoundError,
    PeerUnavailableError,
)
from hoplite_client.wire.frames import INLINE_MAX
from hoplite_client.wire.ids import ObjectID
from hoplited.collectives.ops import check_op, check_reducible, derived_id
from hoplited.collectives.tree import (
    TreeShape,
    pair_shape,
    tree_shape,
    two_tree_fill,
    two_tree_shape,
)

# (event, instructions) pairs kept: a reduce of a few dozen inputs sends ~3 events per slot,
# so its whole story fits; a huge one keeps its end, where failures are (like dask's story).
HISTORY_MAX = 256
# A consumer's pull that broke while the source looked alive is reconnected after this delay,
# doubled each time up to RECONNECT_MAX, until the delays add up to the plan's ``patience``
# (the membership's verdict on a silent node comes within its heartbeat timeout + interval,
# docs/design.md §5): a dead node is then redone, a live one has been given every chance.
RECONNECT_DELAY = 0.1
RECONNECT_MAX = 1.0
# The most slots placed again so that a slot adds an input put on its node: it and those
# above it whose consumers have read nothing yet, each pulling its children again from byte
# 0 (docs/design.md §4, "Several inputs on one node").
MERGE_REACH = 4
# A trio's combiner whose own input is missing holds a late input of another node while a
# third combiner's input is ready, for this many of its stripe's transfers per such input, or
# until its own is put: that node's uplink then feeds the combiner that has put first
# (docs/design.md §4, "Three combiners", "Who pulls a late input first").
LATE_HOLD = 1.25
# Tests set this: every plan then checks its indexes and records agree after each event
# (``validate``), at a cost linear in its slots, which a 10,000-input plan cannot pay per event;
# each slot's moves are checked as they are made, always (``ReducePlan._move``).
CHECK_INVARIANTS = False
# Errors of a request to a tree node that mean the node could not be reached at all.
UNREACHABLE = (PeerUnavailableError, ConnectionLostError)


# --- events: what happened, fed to ReducePlan.handle ---
@dataclass(frozen=True, slots=True)
class InputReady:
    """Input ``oid`` is complete; ``alive`` are the ``holders`` the membership thinks are up."""

    oid: ObjectID
    holders: tuple[str, ...]
    alive: tuple[str, ...]
    size: int
    dtype: str
    shape: tuple[int, ...]
    version: bytes


@dataclass(frozen=True, slots=True)
class InputFailed:
    """The wait for input ``oid`` failed or timed out."""

    oid: ObjectID
    error: HopliteError


@dataclass(frozen=True, slots=True)
class TaskStarted:
    """The task of ``slot`` (placement ``gen``) exists on its node; its output has ``version``."""

    slot: int
    gen: int
    version: bytes


@dataclass(frozen=True, slots=True)
class SlotFailed:
    """The task of ``slot`` could not start, could not be connected, or failed later; ``gen``
    None: whichever placement is current (or the one whose output has ``version``, if given).
    ``child``: telling it where that child's output is failed (a plain ``Connect``)."""

    slot: int
    gen: int | None
    error: HopliteError
    child: int | None = None
    version: bytes | None = None


@dataclass(frozen=True, slots=True)
class ChildLost:
    """The consumer of slot ``child`` (its parent slot ``parent``; None: the pull of the root
    into the result) stopped receiving its output (at ``version``) at ``offset`` bytes;
    ``source_dead``: the consumer's node has declared the child's node dead; ``consumer``: the
    version of the reporting task's output (None for the root pull); ``source_suspected``: the
    consumer's node holds the child's node alive but suspects it (its own link to it may be
    broken while ours works: docs/design.md §5, "A link broken between two members")."""

    parent: int | None
    child: int
    version: bytes
    offset: int
    source_dead: bool
    error: HopliteError
    consumer: bytes | None = None
    source_suspected: bool = False


@dataclass(frozen=True, slots=True)
class Retry:
    """An ``After`` delay ran out: reconnect ``child`` (output ``version``) to its consumer."""

    child: int
    version: bytes


@dataclass(frozen=True, slots=True)
class HoldOver:
    """An ``After`` delay ran out: a held late input ``oid`` (``LATE_HOLD``) is pulled now."""

    oid: ObjectID


@dataclass(frozen=True, slots=True)
class NodeDied:
    """The membership declared ``node`` dead."""

    node: str


@dataclass(frozen=True, slots=True)
class NodeSuspected:
    """``node`` stopped answering (a suspicion, before any verdict): the reduce stops using
    it and repairs around it as if it had died; it is still told to release what it holds."""

    node: str


@dataclass(frozen=True, slots=True)
class NodeTrusted:
    """``node`` answers again after a suspicion (no verdict came): an input lost with it may
    come from it again, since nobody may put it elsewhere."""

    node: str


@dataclass(frozen=True, slots=True)
class Folded:
    """Slot ``slot``'s input (lost, or merged) now enters slot ``into``'s sums from byte
    ``at`` on; ``version``: the output of ``into``'s task that said so."""

    slot: int
    into: int
    at: int
    version: bytes = b""


@dataclass(frozen=True, slots=True)
class FoldFailed:
    """Slot ``slot``'s input could not be folded into another slot (that task is gone, or the
    input is not complete on its node); ``version``: the task's output it was sent to."""

    slot: int
    error: HopliteError
    version: bytes = b""


@dataclass(frozen=True, slots=True)
class Reshaped:
    """The consumer of child ``slot`` took its new shape: that child's bytes end at
    ``until`` (at least where the plan asked; later if the consumer had combined further)."""

    slot: int
    until: int = 0


@dataclass(frozen=True, slots=True)
class ResultComplete:
    """The result object on this node holds every byte."""


@dataclass(frozen=True, slots=True)
class ResultFailed:
    """Making the result failed: opening it, pulling the root, combining inline, publishing."""

    error: HopliteError


@dataclass(frozen=True, slots=True)
class Published:
    """The complete result was published."""


Event = (InputReady | InputFailed | TaskStarted | SlotFailed | ChildLost | Retry | HoldOver
         | NodeDied | NodeSuspected | NodeTrusted | Folded | FoldFailed | Reshaped | ResultComplete
         | ResultFailed | Published)


# --- instructions: what the driver does, in order ---
@dataclass(frozen=True, slots=True)
class OpenResult:
    """Create the result here (pinned), announce it, and report ``ResultComplete`` when full.
    ``receivers``: how many other nodes will get it (an allreduce's), 0 if unknown."""

    size: int
    dtype: str
    shape: tuple[int, ...]
    receivers: int = 0


@dataclass(frozen=True, slots=True)
class StartTask:
    """Send ``ReduceTask`` to ``node`` (need not be awaited before the next instruction);
    report ``TaskStarted`` or ``SlotFailed``."""

    slot: int
    gen: int
    node: str
    input: ObjectID
    output: ObjectID
    op: str
    dtype: str
    shape: tuple[int, ...]
    children: int
    start: int
    lo: int = 0  # a stripe: the slot reads its inputs' bytes lo..hi (hi 0: all of them)
    hi: int = 0
    extras: tuple[ObjectID, ...] = ()  # more inputs on ``node`` it adds, from ``start`` too


@dataclass(frozen=True, slots=True)
class Connect:
    """Tell ``parent_node`` (``ReduceChild``) where child ``child_slot``'s output is; failure:
    SlotFailed of the parent. The child adds bytes ``start`` to ``until`` (0: to the end).
    ``parent_version``: the parent task's output (set by ``handle``); a task placed again
    since refuses the edge, which was another placement's. ``window`` (set by ``handle``):
    the child is a stripe's leaf, whose output is its whole input; the parent reads these
    bytes of it."""

    parent_slot: int
    parent_node: str
    child_slot: int
    child_node: str
    child_output: ObjectID
    child_version: bytes
    start: int = 0
    until: int = 0
    parent_version: bytes = b""
    window: tuple[int, int] | None = None


@dataclass(frozen=True, slots=True)
class Hurry:
    """Tell ``parent_node`` (``ReduceHurry``, no answer) that its task of ``parent_slot``
    (output ``parent_version``) pulls child ``child_slot`` ahead of the pulls that its sibling
    tasks there (other stripes of the same input) make from the same node, which wait until
    this one is done: the early chain of the trio combiner that put first (docs/design.md §4,
    "The first combiner's chain goes first")."""

    parent_slot: int
    parent_node: str
    child_slot: int
    parent_version: bytes


@dataclass(frozen=True, slots=True)
class Fold:
    """Tell ``node`` (``ReduceFold``) that its slot ``into`` (output ``version``) adds
    ``input`` (at ``input_version``) from byte ``at`` on, or from the first byte it has not
    combined yet if later; report ``Folded`` or ``FoldFailed``."""

    slot: int
    into: int
    node: str
    version: bytes
    input: ObjectID
    input_version: bytes
    at: int


@dataclass(frozen=True, slots=True)
class Reshape:
    """Tell ``parent_node`` (``ReduceReshape``) that its slot ``parent`` (output ``version``)
    takes child ``child``'s bytes below ``until`` only, or below the first byte it has not
    combined yet if that is later, and ``more`` new children from there on; report
    ``Reshaped``, or SlotFailed of the parent."""

    parent: int
    parent_node: str
    version: bytes
    child: int
    until: int
    more: int


@dataclass(frozen=True, slots=True)
class PullRoot:
    """Pull the root's output into the result; failure: ``ResultFailed``."""

    node: str
    output: ObjectID
    version: bytes


@dataclass(frozen=True, slots=True)
class WaitInput:
    """Wait again for input ``oid`` (lost with a dead node) until a node not in ``exclude``
    holds all of it; report ``InputReady`` or ``InputFailed``."""

    oid: ObjectID
    exclude: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class After:
    """Feed ``event`` back in ``delay`` seconds."""

    delay: float
    event: Retry | HoldOver


@dataclass(frozen=True, slots=True)
class CancelWaits:
    """Stop waiting for these inputs (backups, or the reduce failed)."""

    oids: tuple[ObjectID, ...]


@dataclass(frozen=True, slots=True)
class RestartResult:
    """Drop the result's bytes and create it again, empty, under a new version (announced as
    before): a backup took a slot whose old value had reached it."""


@dataclass(frozen=True, slots=True)
class CombineInline:
    """Combine the inline bytes of ``parts`` (in order) into the result; then ResultComplete."""

    parts: tuple[ObjectID, ...]
    op: str
    size: int
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Publish:
    """Publish the complete result; then report ``Published`` (or ``ResultFailed``)."""


@dataclass(frozen=True, slots=True)
class Fail:
    """The reduce failed: drop the result here, tell its shard (FailEntry), stop the pull, and
    answer ``reduced_inputs`` with ``error``."""

    error: HopliteError


@dataclass(frozen=True, slots=True)
class Release:
    """Tell these nodes the reduce is over (``ReduceDone``)."""

    nodes: tuple[str, ...]


Instruction = (OpenResult | StartTask | Connect | Hurry | Fold | Reshape | PullRoot | WaitInput
               | After | CancelWaits | RestartResult | CombineInline | Publish | Fail | Release)


@dataclass(frozen=True, slots=True)
class Merge:
    """Input ``input`` (at ``version``) came ready on the node of slot ``host``, which adds
    it: slot ``slot``, which it would have taken, left the tree (docs/design.md §4, "Several
    inputs on one node")."""

    slot: int
    host: int
    input: ObjectID
    version: bytes
    gen: int = 0  # the next placement of ``slot``, should the merge be undone


# Where a slot of the tree stands (ReducePlan.slot_state; docs/design.md §4, §5), each state
# with the record it keeps (SlotEntry.record):
#   free       no input has taken it (no record: the slot has no entry)
#   placed     on a node, its input there and a task if it adds children (``Slot``); it may
#              carry an ``Absorb``: the leaf whose input it takes, or took, over
#   redo       its node lost while its consumer lacked bytes: it waits for its input (``Redo``)
#   merged     out of the tree, its input added by the slot on the same node (``Merge``)
#   folding    its lost input back on a node whose slot is told to add it (``FoldState``)
#   folded     that slot adds it, and the consumer took the new shape: out of the tree
#   absorbing  its lost input back on a node where only a leaf runs: it waits for the leaf's
#              consumer to stop adding the leaf's input, then is placed there (``Absorb``)
SlotState = Literal["free", "placed", "redo", "merged", "folding", "folded", "absorbing"]
SLOT_STATES: tuple[SlotState, ...] = get_args(SlotState)
# Every move a slot may make; ReducePlan._move refuses any other as it is made.
SLOT_TRANSITIONS: frozenset[tuple[SlotState, SlotState]] = frozenset({
    ("free", "placed"),  # its input is ready (or a leaf is placed ahead of it)
    ("free", "merged"),  # its input is ready on a node whose slot adds it
    ("placed", "free"),  # a leaf placed ahead: its input did not come there in time
    # placed again: its task starts again from byte 0 (a restart, an input merged into it,
    # a consumer that reads it from an earlier byte), or a ready backup takes it at once
    ("placed", "placed"),
    ("placed", "redo"),  # its node is lost while its consumer lacks bytes
    ("redo", "placed"),  # its input is back, or a backup takes the slot
    ("redo", "merged"),  # back on a node whose slot can add it from its start
    ("redo", "folding"),  # back on a node whose slot adds it from where it stands
    ("redo", "absorbing"),  # back on a node where only a leaf runs
    ("folding", "folded"),  # the consumer took the new shape
    ("folding", "placed"),  # the slot to fold into is gone: placed as usual
    ("folding", "redo"),  # ... and its node is lost as well
    # the leaf's consumer stopped adding the leaf's input: placed, carrying its ``Absorb``
    # until its task has that input in its sums
    ("absorbing", "placed"),
    # a restart from byte 0 (a node a fold or merge relied on is lost): each slot is placed
    # anew, or waits for its input where its node is lost
    ("absorbing", "redo"), ("folded", "placed"), ("folded", "redo"),
    ("merged", "placed"), ("merged", "redo"),
})


@dataclass(slots=True)
class Slot:
    """A placed slot: its node, input and output; ``version`` is None until its task started;
    ``gen`` counts its placements, ``start`` is the byte its output is computed from, and
    ``connected`` says whether its consumer was told where its output is. ``extras``: the
    merges whose inputs it adds as well, the first ``told`` of them known to its task;
    ``fed``: the children its task was told of (it combines nothing before it has all);
    ``held``: the input's version, which a task placed again as a leaf is read at."""

    node: str
    input: ObjectID
    output: ObjectID
    version: bytes | None
    task: bool
    gen: int = 0
    start: int = 0
    connected: bool = False
    extras: tuple[Merge, ...] = ()
    told: int = 0
    fed: set[int] = field(default_factory=set)
    held: bytes = b""


@dataclass(slots=True)
class Redo:
    """A slot being placed again: its input, the node it died on, the next ``gen``, and the
    byte its consumer stopped at."""

    input: ObjectID
    died_on: str
    gen: int
    start: int


@dataclass(slots=True)
class FoldState:
    """Lost slot ``slot``'s input, back on ``node``, added into that node's slot ``into``
    rather than sent as a stream of its own; its consumer ``parent`` takes the lost slot's
    bytes below ``start``, its ``children``'s from ``start`` on, and the input itself from
    ``start`` to ``at`` (the byte the fold took effect from: later than ``start`` when
    ``into`` had combined further already; -1 until known)."""

    slot: int
    input: ObjectID
    version: bytes
    node: str
    into: int
    parent: int
    start: int
    gen: int
    children: list[int]
    at: int = -1


@dataclass(slots=True)
class Absorb:
    """Lost slot ``slot``'s input is back on ``node``, where only leaf ``leaf`` runs: the
    slot is placed there as usual, and takes the leaf's input (``leaf_input`` at
    ``leaf_version``) into its sums from byte ``cut`` on, where the leaf's consumer stopped
    adding it, so ``node``'s link carries one stream. ``version``: the new task's output's,
    held back until the leaf's input is in (no child may feed it before)."""

    slot: int
    node: str
    input: ObjectID
    input_version: bytes
    gen: int
    start: int
    leaf: int
    leaf_input: ObjectID
    leaf_version: bytes
    consumer: int
    cut: int = -1
    version: bytes | None = None


SlotRecord = Slot | Redo | Merge | FoldState | Absorb
# The kind of record each state keeps: ReducePlan._move refuses another.
STATE_RECORDS: dict[SlotState, type] = {
    "free": type(None), "placed": Slot, "redo": Redo, "merged": Merge, "folding": FoldState,
    "folded": FoldState, "absorbing": Absorb}


@dataclass(slots=True)
class SlotEntry:
    """A slot's one state (``SlotState``) and the record it keeps there (``STATE_RECORDS``).
    ``absorb``: the leaf input the slot takes over, set as it becomes absorbing and kept by
    its placements until the result starts again (``absorbed`` once that input is in its
    task's sums)."""

    state: SlotState
    record: SlotRecord
    absorb: Absorb | None = None
    absorbed: bool = False


def redo_path(shape: TreeShape, slot: int) -> list[int]:
    """The slots whose partial sums are lost with ``slot``'s: it and its ancestors, to the root."""
    path = [slot]
    parent = shape.parent[slot]
    while parent is not None:
        path.append(parent)
        parent = shape.parent[parent]
    return path


# A repair's walk over the tree, as a generator: it yields the walks it needs (a child's
# repair, an ancestor's restart) and is sent their instructions back.
Steps = Generator["Steps", list[Instruction], list[Instruction]]


def drive(steps: Steps) -> list[Instruction]:
    """Run ``steps`` and every walk it yields, on a stack of our own rather than Python's: a
    repair goes as deep as a run of lost slots, thousands in a long chain (docs/design.md §5)."""
    stack = [steps]
    result: list[Instruction] | None = None
    while stack:
        top = stack[-1]
        try:
            walk = next(top) if result is None else top.send(result)
        except StopIteration as stop:
            stack.pop()
            result = stop.value
            continue
        stack.append(walk)
        result = None
    assert result is not None
    return result


@dataclass(frozen=True, kw_only=True)
class ReduceSpec:
    """The schedule of one reduce, fixed when it opens; the defaults are one tree over whole
    inputs, its result for the caller's node (docs/design.md §4 tells each choice)."""

    # reduce only the inputs' bytes lo..hi (a stripe of a striped allreduce): the result is
    # that stripe, a flat array of hi - lo bytes
    window: tuple[int, int] | None = None
    # the nodes in ring order: an input held elsewhere takes the free slot nearest its node's
    # distance after ``me`` there, rather than the first free one ("Ring-ordered stripes")
    ring: tuple[str, ...] = ()
    # every node gets the result (a plain allreduce): if the first input reported is held
    # here, or ``here`` says one ready input is, it takes the root and the last input a leaf
    # of the root's ("The last input hangs on the root")
    everyone: bool = False
    # this plan is tree 0 or 1 of two trees of halves (``window`` is that half): the inputs
    # fill complete trees whose inner slots differ (docs/simulation.md §6)
    half: int | None = None
    here: bool = False
    # the root is a task here that adds no input of its own, started once the size is known,
    # over a chain of the first k - ``late`` inputs and a leaf for each of the last ``late``
    # (``pair_shape``): a stripe of an allreduce's pair or trio ("A pair for the last two
    # inputs", "Three combiners")
    combiner: bool = False
    # an input ready on a node whose slot has combined nothing yet is added by that slot, in
    # place of a slot of its own ("Several inputs on one node")
    merge: bool = True
    late: int = 2
    # the links' bytes/s: a trio's combiner holds late inputs while its own is missing
    # (``LATE_HOLD``)
    rate: float = 0.0
    # the nodes guessed to put the late inputs (the combiners): once one input is missing and
    # all of them but one, not this node, have put a late input, that input's leaf is placed
    # ahead on the node left ("The last input's leaf placed ahead")
    late_nodes: tuple[str, ...] = ()


class ReducePlan:
    """One reduce into ``result`` coordinated on node ``me``, scheduled as ``spec`` says;
    ``depth(k, size)`` is the tree depth for ``k`` inputs of ``size`` bytes (the driver's link
    model); ``patience``: seconds a node that looks alive may stay unreachable before the
    reduce fails."""

    def __init__(self, result: ObjectID, inputs: list[ObjectID], k: int, op: str, me: str,
                 depth: Callable[[int, int], int], patience: float = 6.0,
                 spec: ReduceSpec = ReduceSpec()) -> None:
        window, ring, everyone, half, here = (spec.window, spec.ring, spec.everyone, spec.half,
                                              spec.here)
        combiner, merge, late, rate = spec.combiner, spec.merge, spec.late, spec.rate
        late_nodes = spec.late_nodes
        if not inputs or not 1 <= k <= len(inputs):
            raise InvalidArgumentError(f"num_objects must be between 1 and the "
                                       f"{len(inputs)} inputs")
        if window is not None and not 0 <= window[0] < window[1] - INLINE_MAX:
            raise InvalidArgumentError(f"a stripe {window} must hold more than {INLINE_MAX} "
                                       f"bytes")
        check_op(op)
        if half is not None and (half not in (0, 1) or window is None or k != len(inputs)):
            raise InvalidArgumentError("a tree of halves reduces a window of every input")
        if combiner and (window is None or half is not None or k != len(inputs)
                         or not 2 <= late <= k):
            raise InvalidArgumentError(f"a combiner reduces a window of every input, with "
                                       f"2 to {k} of them late ({late})")
        self.combiner = combiner
        self.late = late
        self.rate = rate
        self.held: dict[ObjectID, InputReady] = {}  # late inputs held (LATE_HOLD), in order
        self._own = False  # an input on this node was ready (a combiner's own)
        self._late_nodes: list[tuple[str, ...]] = []  # the late inputs' holders so far
        self.late_nodes = late_nodes if combiner else ()  # guessed to put the late inputs
        self.ahead: set[ObjectID] = set()  # inputs whose leaves were placed ahead
        self.aheads = 0  # leaves placed ahead so far (status, metrics)
        self.window = window
        self.half = half
        self.ring = ring
        self.everyone = everyone
        self.here = here
        self._last_leaf = False  # the tree's shape: see tree_shape
        self._low = 0  # every slot below this one is taken or the root (placement scans on)
        self._fill: list[int] | None = None  # a tree of halves' fill order, once needed
        self._fill_at = 0  # every slot before this place in it is taken
        self.result, self.k, self.op, self.me, self._depth = result, k, op, me, depth
        self.patience = patience
        self._waiting: dict[ObjectID, int] = {}  # input -> times listed, until ready
        for oid in inputs:
            self._waiting[oid] = self._waiting.get(oid, 0) + 1
        self.used: list[ObjectID] = []
        self.meta: InputReady | None = None  # the result's size and type (the stripe's)
        self.whole: InputReady | None = None  # the first input's: the others must agree
        self.shape: TreeShape | None = None
        # Each taken slot's state and record (a free slot has no entry): the one account of
        # where the slots stand, changed only by _move, which checks each move against
        # SLOT_TRANSITIONS as it is made
        self._table: dict[int, SlotEntry] = {}
        # slots _lift took out of their state's index, for _move to give them their next
        # state before the event is handled (a repair decides it while they are in none)
        self._lifted: set[int] = set()
        # The table's records by state, kept by _move for the lookups and scans placement and
        # repair make per event (read outside through the views ``slots``, ``redo``, ...):
        # slot -> record, in the order the slots entered the state (the merges: the order
        # they were made, which a restart keeps: hosts add their extras in it)
        self._slots: dict[int, Slot] = {}  # placed
        self._redo: dict[int, Redo] = {}  # waiting for their inputs again
        self._merged: dict[int, Merge] = {}  # out of the tree, their inputs added by hosts
        self._folding: dict[int, FoldState] = {}  # lost slot -> its fold, not in effect yet
        self._folds: dict[int, FoldState] = {}  # lost slot -> its fold, in effect
        self._by_state: dict[SlotState, dict[int, Any]] = {
            "placed": self._slots, "redo": self._redo, "merged": self._merged,
            "folding": self._folding, "folded": self._folds}
        # the slots' absorbs (SlotEntry.absorb): lost slot -> the leaf it takes over, while
        # that leaf's input is not in its sums (absorbing, or placed since), and once it is
        self._absorbing: dict[int, Absorb] = {}
        self._absorbed: dict[int, Absorb] = {}
        # the placed slots by node (kept by _move): without a task, and with one
        self._leaves: dict[str, set[int]] = {}
        self._hosts: dict[str, set[int]] = {}
        self.merges = 0  # inputs merged into another's slot so far (status, metrics)
        self.holds = 0  # late inputs held (LATE_HOLD) so far (status, metrics)
        self.hurried = 0  # early chains sent ahead of their siblings (Hurry; status, metrics)
        # merges add an input from the host's start: never once a slot computes from a later
        # byte (its consumer holds earlier sums without the input); with backups a lost
        # host's inputs are waited for as themselves (a restart), which backups could replace
        self._merging = merge and not combiner and half is None and len(inputs) == k
        self._may_merge = self._merging  # until a slot computes from a later byte
        self.task_nodes: list[str] = []
        self.dead: set[str] = set()  # nodes this reduce no longer uses
        self.declared: set[str] = set()  # those of them this node's membership declared dead
        self.error: HopliteError | None = None
        self.complete = False
        self.published = False
        self._wanted: dict[ObjectID, list[int]] = {}  # lost input -> slots waiting for it
        self._broken: dict[int, int] = {}  # slot -> offset its consumer stopped at, node alive
        # slot -> (its version, its consumer's, offset): a broken pull reported, or due to be
        # retried, while this node suspects the consumer; resumed if it answers again
        self._orphans: dict[int, tuple[bytes, bytes, int]] = {}
        self._backups: list[ObjectID] = []  # inputs not used, once k are chosen (tree only)
        self._rewaiting: set[ObjectID] = set()  # backups waited for again, for a repair
        self.spares: list[InputReady] = []  # backups ready, not used (yet)
        self._reconnects: dict[int, tuple[int, float]] = {}  # slot -> (tries, delays summed)
        # input -> nodes where a task found no complete copy of it: a stale holder, not asked
        # for that input again
        self._lacking: dict[ObjectID, set[str]] = {}
        # with backups, a lost slot may restart from 0; in a stripe, a fold's consumer may
        # have to pull the input's own bytes, which only a slot reads at the window's offset
        self._may_fold = len(inputs) == k and window is None
        self.history: deque[tuple[Event, tuple[Instruction, ...]]] = deque(maxlen=HISTORY_MAX)
        self._event: Event | None = None  # the event being handled (the end of a story)

    # --- the slots' states: one entry each, changed only by _move ---
    def slot_state(self, slot: int) -> SlotState:
        """Where ``slot`` stands (``SLOT_STATES``)."""
        entry = self._table.get(slot)
        return "free" if entry is None else entry.state

    @property
    def slots(self) -> Mapping[int, Slot]:
        """The placed slots and their placements (read-only)."""
        return MappingProxyType(self._slots)

    @property
    def redo(self) -> Mapping[int, Redo]:
        """The slots waiting for their inputs again (read-only)."""
        return MappingProxyType(self._redo)

    @property
    def merged(self) -> Mapping[int, Merge]:
        """The merged slots and their merges, in the order they were made (read-only)."""
        return MappingProxyType(self._merged)

    @property
    def folding(self) -> Mapping[int, FoldState]:
        """The folding slots and their folds, not in effect yet (read-only)."""
        return MappingProxyType(self._folding)

    @property
    def folds(self) -> Mapping[int, FoldState]:
        """The folded slots and their folds, in effect (read-only)."""
        return MappingProxyType(self._folds)

    @property
    def absorbing(self) -> Mapping[int, Absorb]:
        """The slots taking a leaf's input over, absorbing or placed (read-only)."""
        return MappingProxyType(self._absorbing)

    @property
    def absorbed(self) -> Mapping[int, Absorb]:
        """The placed slots that took a leaf's input over (read-only)."""
        return MappingProxyType(self._absorbed)

    def _move(self, slot: int, to: SlotState, record: SlotRecord | None = None) -> None:
        """``slot`` is ``to`` now, keeping ``record`` (``STATE_RECORDS``), and the indexes
        follow; its absorb goes with it into ``placed`` (from absorbing, or from one placement
        to the next) and ends with any other move. A move ``SLOT_TRANSITIONS`` does not allow
        (from the state a lifted slot left), or a record of another kind, raises
        AssertionError with the slot's story."""
        entry = self._table.get(slot)
        was: SlotState = "free" if entry is None else entry.state
        if (was, to) not in SLOT_TRANSITIONS:
            raise self._fault(slot, f"went from {was} to {to}, which SLOT_TRANSITIONS does "
                                    f"not allow")
        if type(record) is not STATE_RECORDS[to]:
            raise self._fault(slot, f"went to {to} with {record!r}, not a "
                                    f"{STATE_RECORDS[to].__name__}")
        if entry is not None:
            if slot in self._lifted:
                self._lifted.discard(slot)
            else:
                self._unindex(slot, entry)
            if entry.absorb is not None and to != "placed":
                self._end_absorb(slot, entry)
        if record is None:  # free: no entry
            del self._table[slot]
            return
        if entry is None:
            entry = self._table[slot] = SlotEntry(to, record)
        entry.state, entry.record = to, record
        if isinstance(record, Absorb):
            entry.absorb = self._absorbing[slot] = record
        index = self._by_state.get(to)
        if index is not None:
            index[slot] = record
        if isinstance(record, Slot):
            by_node = self._hosts if record.task else self._leaves
            by_node.setdefault(record.node, set()).add(slot)

    def _unindex(self, slot: int, entry: SlotEntry) -> None:
        """Take ``slot`` out of its state's index (and a placed one out of its node's)."""
        index = self._by_state.get(entry.state)
        if index is not None:
            del index[slot]
        placed = entry.record
        if isinstance(placed, Slot):
            by_node = self._hosts if placed.task else self._leaves
            by_node[placed.node].discard(slot)

    def _lift(self, slot: int) -> None:
        """Take ``slot`` out of its state's index, so that no lookup sees it while a repair
        decides where it goes (a restart, a backup's swap, a lost input back, a failed
        fold); ``_move`` gives it its next state, checked from the one it left, before the
        event is handled."""
        self._unindex(slot, self._table[slot])
        self._lifted.add(slot)

    def _absorb_done(self, slot: int) -> None:
        """The leaf input that placed ``slot`` takes over is in its task's sums."""
        self._table[slot].absorbed = True
        self._absorbed[slot] = self._absorbing.pop(slot)

    def _end_absorb(self, slot: int, entry: SlotEntry) -> None:
        """``slot`` carries no absorb any more (the result starts again)."""
        (self._absorbed if entry.absorbed else self._absorbing).pop(slot)
        entry.absorb, entry.absorbed = None, False

    def validate(self) -> None:
        """Check what the moves themselves do not: every slot the table holds has a state and
        is in that state's index, under its record, and no index holds another; the by-node
        indexes match the placements and the absorbs their slots; every wait for a lost input
        is a redo's, every broken pull a placed slot's; a published result is complete.
        Raises AssertionError with the plan's last events otherwise."""
        for slot, entry in self._table.items():
            state, record, absorb = entry.state, entry.record, entry.absorb
            index = self._by_state.get(state)
            absorbs = self._absorbed if entry.absorbed else self._absorbing
            if slot in self._lifted:
                raise self._fault(slot, f"was lifted out of {state} and given no state")
            if type(record) is not STATE_RECORDS[state]:
                raise self._fault(slot, f"is {state} with {record!r}")
            if index is not None and index.get(slot) is not record:
                raise self._fault(slot, f"is {state} but not indexed so")
            if (absorb is not record if state == "absorbing"
                    else absorb is not None and state != "placed"):
                raise self._fault(slot, f"is {state} with the absorb {absorb}")
            if (absorb is not None or entry.absorbed) and absorbs.get(slot) is not absorb:
                raise self._fault(slot, f"has an absorb not indexed so: {absorb}")
        for state, index in self._by_state.items():
            for slot in index:
                if self.slot_state(slot) != state:
                    raise self._fault(slot, f"is indexed as {state} but is "
                                            f"{self.slot_state(slot)}")
        for name, absorbs in (("absorbing", self._absorbing), ("absorbed", self._absorbed)):
            for slot, absorb in absorbs.items():
                carrier = self._table.get(slot)
                if (carrier is None or carrier.absorb is not absorb
                        or carrier.absorbed != (name == "absorbed")):
                    raise self._fault(slot, f"is indexed as {name} but is {carrier}")
        for node_slots, task in ((self._hosts, True), (self._leaves, False)):
            for node, indexed in node_slots.items():
                for slot in indexed:
                    placed = self._slots.get(slot)
                    if placed is None or placed.node != node or placed.task != task:
                        raise self._fault(slot, f"is indexed on {node} "
                                                f"({'task' if task else 'leaf'}) as {placed}")
        for slot, placed in self._slots.items():
            by_node = self._hosts if placed.task else self._leaves
            if slot not in by_node.get(placed.node, ()):
                raise self._fault(slot, "is not indexed")
        for oid, waiting in self._wanted.items():
            for slot in waiting:
                redo = self._redo.get(slot)
                if redo is None or redo.input != oid:
                    raise self._fault(slot, f"waits for {oid.hex()} but is {redo}")
        extra = self.shape.size if self.shape is not None else 0  # a fold's extra pulls
        for slot in self._broken:
            if slot not in self._slots and slot < extra:
                raise self._fault(slot, "has a broken pull but is not placed")
        if self.published and not self.complete:
            raise self._fault(-1, "published before complete")

    def _fault(self, slot: int, what: str) -> AssertionError:
        """``slot`` did ``what``, which it must not: an error telling the plan's last events
        (and the one being handled, if any)."""
        story = [f"  {ev} -> {list(out)}" for ev, out in list(self.history)[-8:]]
        if self._event is not None:
            story.append(f"  {self._event} (being handled)")
        return AssertionError(f"reduce {self.result.hex()}: slot {slot} {what}; last events:\n"
                              + "\n".join(story))

    @property
    def chosen(self) -> bool:
        """All ``k`` inputs are chosen (``used`` is final)."""
        return len(self.used) == self.k

    def handle(self, event: Event) -> list[Instruction]:
        """Apply ``event``; return the instructions to carry out, in order."""
        out: list[Instruction] = []
        if isinstance(event, NodeDied | NodeSuspected):
            self.dead.add(event.node)
        if isinstance(event, NodeDied):
            self.declared.add(event.node)
        if isinstance(event, NodeTrusted) and event.node not in self.declared:
            self.dead.discard(event.node)
        if self.error is None and not self.published:
            self._event = event
            try:
                out = self._handle(event)
            finally:
                self._event = None
            if self._lifted:  # a repair that gave a slot no next state
                raise self._fault(min(self._lifted), "was lifted and given no state")
        out = [edge for ins in out if (edge := self._addressed(ins)) is not None]
        self.history.append((event, tuple(out)))
        if CHECK_INVARIANTS:
            self.validate()
        return out

    def _addressed(self, ins: Instruction) -> Instruction | None:
        """``ins``, a ``Connect`` addressed to its parent's current task (which, told of every
        child, may have combined: no merge into it then); None for an edge to a parent placed
        again in the same event, whose new task is told of its children once it exists."""
        if not isinstance(ins, Connect):
            return ins
        parent = self._slots.get(ins.parent_slot)
        if parent is None or parent.version is None or parent.node != ins.parent_node:
            return None
        parent.fed.add(ins.child_slot)
        child = self._slots.get(ins.child_slot)
        leaf = (child is not None and not child.task and ins.child_output == child.input
                and ins.child_node == child.node)
        return replace(ins, parent_version=parent.version,
                       window=self.window if leaf else None)

    def _handle(self, ev: Event) -> list[Instruction]:
        handler: Callable[[ReducePlan, Any], list[Instruction]] = EVENT_HANDLERS[type(ev)]
        return handler(self, ev)

    def _input_ready(self, ev: InputReady) -> list[Instruction]:
        """An input is ready: a lost one back, a leaf placed ahead, a backup waited for
        again, or a first-time input (held, if a combiner holds it)."""
        if ev.oid in self._wanted:
            self.ahead.discard(ev.oid)
            return self._replace(ev)
        if ev.oid in self.ahead:
            return self._ahead_ready(ev)
        if ev.oid in self._rewaiting:
            return self._backup_ready(ev)
        out = self._hold(ev) if self._holds(ev) else self._unheld(ev)
        return out + self._place_ahead()

    def _hold_over(self, ev: HoldOver) -> list[Instruction]:
        held = self.held.pop(ev.oid, None)
        return [] if held is None else self._ready(held) + self._place_ahead()

    def _task_started(self, ev: TaskStarted) -> list[Instruction]:
        """A slot's task runs: its edges, unless it first takes over a leaf's input."""
        slot = self._slots.get(ev.slot)
        if slot is None or not slot.task or slot.version is not None or slot.gen != ev.gen:
            return []
        absorb = self._absorbing.get(ev.slot)
        if absorb is not None and absorb.cut >= 0:  # the leaf's input first, then edges
            absorb.version = ev.version
            return [Fold(ev.slot, ev.slot, slot.node, ev.version, absorb.leaf_input,
                         absorb.leaf_version, absorb.cut)]
        slot.version = ev.version
        return self._tell_extras(ev.slot) + self._links(ev.slot)

    def _node_lost(self, ev: NodeDied | NodeSuspected) -> list[Instruction]:
        """A repair sees every input placed: held inputs go first."""
        return self._release_held() + self._node_died(ev.node)

    def _node_trusted(self, ev: NodeTrusted) -> list[Instruction]:
        """Every lost input is waited for anew, the trusted node's copies included."""
        return ([WaitInput(oid, self._excluded(oid)) for oid in self._wanted]
                + self._resume_orphans())

    def _result_complete(self, ev: ResultComplete) -> list[Instruction]:
        if self.complete:
            return []
        self.complete = True
        return [Publish()]

    def _result_failed(self, ev: ResultFailed) -> list[Instruction]:
        return self._fail(ev.error)

    def _published(self, ev: Published) -> list[Instruction]:
        self.published = True
        return self._release()

    # --- a trio's late inputs (docs/design.md §4, "Who pulls a late input first") ---
    def _holds(self, ev: InputReady) -> bool:
        """Whether this combiner holds late input ``ev``: one of a trio's last three, on
        another node, while this node's own is missing and a third node's is ready."""
        if (not self.combiner or self.late < 3 or self.rate <= 0 or self._own
                or self.meta is None or ev.oid in self.held or self.me in ev.holders
                or not self._late(ev)):
            return False
        return any(self._third(nodes, ev) for nodes in self._late_nodes)

    def _late(self, ev: InputReady) -> bool:
        """``ev`` is awaited and comes after the chain's inputs: one of the last ``late``."""
        return (ev.oid in self._waiting
                and len(self.used) + len(self.held) >= self.k - self.late)

    def _third(self, nodes: tuple[str, ...], ev: InputReady) -> bool:
        """``nodes`` hold a late input of neither this node nor ``ev``'s."""
        return self.me not in nodes and not set(nodes) & set(ev.holders)

    def _hold(self, ev: InputReady) -> list[Instruction]:
        """Hold ``ev`` for ``LATE_HOLD`` of a stripe's transfer per third node ready."""
        assert self.meta is not None
        self.held[ev.oid] = ev
        self.holds += 1
        thirds = sum(self._third(nodes, ev) for nodes in self._late_nodes)
        self._late_nodes.append(ev.holders)
        return [After(LATE_HOLD * thirds * self.meta.size / self.rate, HoldOver(ev.oid))]

    def _unheld(self, ev: InputReady) -> list[Instruction]:
        """``ev`` as usual; this node's own input releases every late input held, and if it
        is the first of the late inputs, sends this stripe's early chain ahead."""
        late = self._late(ev)
        if late:
            self._late_nodes.append(ev.holders)
        out = self._ready(ev)
        if self.me in ev.holders:
            self._own = True
            out += self._release_held()
            if late and all(self.me in nodes for nodes in self._late_nodes):
                out += self._hurry()
        return out

    def _hurry(self) -> list[Instruction]:
        """The chain's first edge (slot 0 into slot 1, on the nodes of the first two inputs)
        goes ahead of the other stripes' (``Hurry``), if this is a trio's combiner whose chain
        has such an edge, told to its task already."""
        if (not self.combiner or self.late < 3 or self.rate <= 0 or self.shape is None
                or self.shape.root < 2):
            return []
        head, parent = self._slots.get(0), self._slots.get(1)
        if (head is None or parent is None or parent.version is None
                or 0 not in parent.fed):
            return []
        self.hurried += 1
        return [Hurry(1, parent.node, 0, parent.version)]

    def _release_held(self) -> list[Instruction]:
        """Every held late input, in the order they came ready."""
        held, self.held = list(self.held.values()), {}
        return [ins for ev in held for ins in self._ready(ev)]

    # --- the last input's leaf placed ahead (docs/design.md §4) ---
    def _place_ahead(self) -> list[Instruction]:
        """Place the one missing input's leaf on the one guessed node that has put no late
        input yet, if that is another node: its consumer's pull (version ``b""``) waits there
        for the input, so its bytes leave as it is sealed, with no control message between."""
        if (not self.late_nodes or self.shape is None or self.meta is None or self.held
                or self.error is not None or len(self._waiting) != 1):
            return []
        (oid, times), = self._waiting.items()
        seen = {node for nodes in self._late_nodes for node in nodes}
        left = [n for n in self.late_nodes if n not in seen and n not in self.dead]
        if times != 1 or len(left) != 1 or left[0] == self.me:
            return []
        w = self.whole
        assert w is not None
        self.ahead.add(oid)
        self.aheads += 1
        return self._ready(InputReady(oid, (left[0],), (left[0],), w.size, w.dtype, w.shape,
                                      b""))

    def _ahead(self, slot: int) -> bool:
        """``slot`` is a leaf placed ahead: its input's version is not known yet."""
        placed = self._slots.get(slot)
        return placed is not None and not placed.task and placed.input in self.ahead

    def _ahead_ready(self, ev: InputReady) -> list[Instruction]:
        """An input placed ahead is ready: on the node guessed, its leaf reads it at this
        version from now on; elsewhere, the leaf moves to a live holder (a wrong guess costs
        the pull's start, nothing else: the guessed node had no byte of it)."""
        self.ahead.discard(ev.oid)
        out: list[Instruction] = []
        for slot, placed in sorted(self._slots.items()):
            if placed.task or placed.input != ev.oid:
                continue
            if placed.node in ev.alive and placed.node not in self.dead:
                placed.held = ev.version
                continue
            self._lacking.setdefault(ev.oid, set()).add(placed.node)
            out += [ins for ins in self._repair(slot, 0)
                    if not (isinstance(ins, WaitInput) and ins.oid == ev.oid)]
        if ev.oid in self._wanted:
            out += self._replace(ev)
        return out

    def _unplace_ahead(self, slot: int) -> list[Instruction]:
        """The pull of a leaf placed ahead found no input there in time: the input is waited
        for as before it was placed (its wait at the shard still runs)."""
        placed = self._slots[slot]
        self._move(slot, "free")
        self.ahead.discard(placed.input)
        self._reconnects.pop(slot, None)
        self._broken.pop(slot, None)
        self.used.remove(placed.input)
        self._waiting[placed.input] = 1
        self._low = min(self._low, slot)  # the slot is free again for the input's placing
        return []

    def _ready(self, ev: InputReady) -> list[Instruction]:
        times = self._waiting.pop(ev.oid, 0)
        if times == 0:  # a duplicate, or a backup whose wait was cancelled
            return []
        if ev.size > INLINE_MAX and not ev.holders:
            return self._fail(PeerUnavailableError(f"input {ev.oid.hex()} has no holder",
                                                   oid=ev.oid.hex()))
        out: list[Instruction] = []
        if self.meta is None:
            try:
                check_reducible(self.op, ev.dtype)
            except InvalidArgumentError as exc:
                return self._fail(exc)
            self.whole = self.meta = ev
            if self.window is not None:
                lo, hi = self.window
                item = np.dtype(ev.dtype).itemsize
                if hi > ev.size or lo % item or hi % item:
                    return self._fail(InvalidArgumentError(
                        f"stripe {lo}..{hi} is not whole elements of the {ev.size}-byte input "
                        f"{ev.oid.hex()}", oid=ev.oid.hex()))
                self.meta = replace(ev, size=hi - lo, shape=((hi - lo) // item,))
            m = self.meta
            if m.size > INLINE_MAX:
                plain_allreduce = self.everyone and self.window is None
                self._last_leaf = plain_allreduce and (self.here or self.me in ev.holders)
                self.shape = self._new_shape()
                # an allreduce's result goes to every input's node: its gets know their number
                receivers = self.k - 1 if plain_allreduce else 0
                out.append(OpenResult(m.size, m.dtype, m.shape, receivers))
                if self.combiner:  # its task pulls the chain's sums while inputs still come
                    out += self._put(self.shape.root, self.me, self.result, b"", gen=0,
                                     start=0)
        elif not self._fits(ev):
            return self._fail(self._mismatch(ev))
        for _ in range(min(times, self.k - len(self.used))):
            self.used.append(ev.oid)
            if self.shape is not None:
                out += self._place(ev)
        if self.chosen:
            if self._waiting:
                out.append(CancelWaits(tuple(self._waiting)))
                if self.shape is not None:
                    self._backups = list(self._waiting)
                self._waiting.clear()
            if self.shape is None:
                m = self.meta
                out.append(CombineInline(tuple(self.used), self.op, m.size, m.dtype, m.shape))
        return out

    def _fits(self, ev: InputReady) -> bool:
        """``ev`` has the first input's size, type and shape."""
        w = self.whole
        assert w is not None
        return (ev.size, ev.dtype, ev.shape) == (w.size, w.dtype, w.shape)

    def _mismatch(self, ev: InputReady) -> InvalidArgumentError:
        assert self.whole is not None
        return InvalidArgumentError(
            f"input {ev.oid.hex()} is {ev.dtype}{list(ev.shape)} but the first input was "
            f"{self.whole.dtype}{list(self.whole.shape)}", oid=ev.oid.hex())

    def _new_shape(self) -> TreeShape:
        """The tree for the first input's size: one of two trees of halves, or the chain or
        full tree the link model picks."""
        assert self.meta is not None
        if self.half is not None:
            return two_tree_shape(self.k)
        if self.combiner:
            return pair_shape(self.k, self.late)
        return tree_shape(self.k, self._depth(self.k, self.meta.size), self._last_leaf)

    def _place(self, ev: InputReady) -> list[Instruction]:
        shape, me = self.shape, self.me
        assert shape is not None
        local = me in ev.holders
        alive = [n for n in ev.alive if n not in self.dead]
        node = me if local else (alive or list(ev.holders))[0]
        first = self._first_free()
        if local and not self._taken(shape.root):
            slot = shape.root
        elif first is not None and self.half is not None:
            slot = self._next_in_fill(first)
        elif first is not None:
            slot = self._ring_slot(node, first)
        else:
            slot = shape.root
        host = self._host(node) if node in ev.alive and self._removable(slot) else None
        if host is not None:
            return self._merge(Merge(slot, host[0], ev.oid, ev.version), host[1])
        return self._put(slot, node, ev.oid, ev.version, gen=0, start=0)

    # --- several inputs on one node (docs/design.md §4, "Several inputs on one node") ---
    def _host(self, node: str) -> tuple[int, list[int]] | None:
        """A slot on ``node`` that can still add another input from its start, so that
        ``node``'s link carries one stream, and the slots to place again for it: none for a
        task that cannot have combined a byte yet (it was not told of every child), else the
        slot and those above it up to one whose consumer has read nothing (``_unread``).
        None: there is no such slot."""
        shape = self.shape
        if not self._may_merge or shape is None or node in self.dead:
            return None
        best: tuple[int, list[int]] | None = None  # the fewest slots placed again
        for slot in sorted(self._hosts.get(node, set()) | self._leaves.get(node, set())):
            placed = self._slots[slot]
            if placed.input == self.result or self._folded_into(slot):
                continue  # a combiner adds no input; a lost input's fold relies on it
            if placed.task and any(c not in placed.fed for c in shape.children[slot]):
                return slot, []
            path = self._unread(slot)
            if path and (best is None or len(path) < len(best[1])):
                best = slot, path
        return best

    def _unread(self, slot: int) -> list[int]:
        """``slot`` and the slots above it, up to the first whose consumer has read nothing
        of it; placed again from byte 0, they drop nothing anyone holds ([]: there are more
        than ``MERGE_REACH``, or the root's sums have reached the result already)."""
        shape = self.shape
        assert shape is not None
        path = [slot]
        while True:
            top = path[-1]
            placed = self._slots[top]
            if placed.output == self.result:  # the root computed in place: its sums are
                # the result's bytes, read by gets; none yet while it has combined nothing
                return path if any(c not in placed.fed for c in shape.children[top]) else []
            if not placed.connected:
                return path
            parent = shape.parent[top]
            above = None if parent is None else self._slots.get(parent)
            if (parent is None or above is None or not above.task or above.node in self.dead
                    or self._folded_into(parent) or len(path) >= MERGE_REACH):
                return []
            path.append(parent)

    def _removable(self, slot: int) -> bool:
        """``slot``, about to take an input (a free slot, or a lifted one whose lost input is
        back), can leave the tree, its children hung on its parent: it is not the root, and
        its parent's task, if placed, was never told of it and either keeps its number of
        children or, ``slot`` being a leaf, is told to count it cut (``_merge``). A parent
        waiting to be placed again counts its children once placed."""
        shape = self.shape
        assert shape is not None
        parent = shape.parent[slot]
        if not self._may_merge or parent is None:
            return False
        placed = self._slots.get(parent)
        if placed is None:
            return (not self._taken(parent) or parent in self._redo
                    or len(shape.children[slot]) == 1)
        if slot in placed.fed:
            return False
        return len(shape.children[slot]) == 1 or (
            not shape.children[slot] and placed.version is not None
            and not self._folded_into(parent))

    def _remove(self, slot: int) -> None:
        """Take free ``slot`` out of the tree: its children take its place under its parent
        (the shape is this plan's own: built for it, and anew by a restart)."""
        shape = self.shape
        assert shape is not None
        parent = shape.parent[slot]
        assert parent is not None
        siblings = shape.children[parent]
        at = siblings.index(slot)
        siblings[at:at + 1] = shape.children[slot]
        for child in shape.children[slot]:
            shape.parent[child] = parent
        shape.children[slot] = []
        shape.parent[slot] = None

    def _merge(self, merge: Merge, again: list[int]) -> list[Instruction]:
        """Input ``merge.input`` is added by the slot already on its node: ``merge.slot``
        leaves the tree, and the host's task adds the input from its start: a ``Fold`` once
        the task exists, or (``again``: the host and the slots above it that may hold its
        sums, none read) placed again with it, from byte 0."""
        shape = self.shape
        assert shape is not None
        children = list(shape.children[merge.slot])
        parent = shape.parent[merge.slot]
        self._remove(merge.slot)
        self._move(merge.slot, "merged", merge)
        self.merges += 1
        host = self._slots[merge.host]
        host.extras += (merge,)
        out: list[Instruction] = []
        for slot in again:  # the host first, a task that adds every input from byte 0
            out += drive(self._restart_steps(slot))
        if not again:  # it has combined nothing yet
            out += self._tell_extras(merge.host)
        assert parent is not None
        consumer = self._slots.get(parent)
        if not children and consumer is not None and consumer.version is not None:
            # a leaf its consumer's task counts among its children (not placed again above):
            # it ends before any byte, so the task waits for it no more
            out.append(Reshape(parent, consumer.node, consumer.version, merge.slot, 0, 0))
        for child in children:  # the parent reads them now, wherever the slot was to be
            placed = self._slots.get(child)
            if (consumer is not None and consumer.version is not None and placed is not None
                    and placed.version is not None):
                placed.connected = True
                out.append(Connect(parent, consumer.node, child, placed.node, placed.output,
                                   placed.version))
        return out

    def _tell_extras(self, slot: int) -> list[Instruction]:
        """Folds of the inputs merged into ``slot`` that its task does not know yet, from its
        start (none before the task exists: they follow its ``TaskStarted``)."""
        placed = self._slots[slot]
        if placed.version is None:
            return []
        out: list[Instruction] = [
            Fold(m.slot, slot, placed.node, placed.version, m.input, m.version,
                 self._aligned(placed.start)) for m in placed.extras[placed.told:]]
        placed.told = len(placed.extras)
        return out

    def _merge_answered(self, ev: Folded | FoldFailed) -> list[Instruction]:
        """A merge's fold into the current task took effect late (its host combined first:
        the input's first bytes are in no sum) or failed: the result starts again from byte
        0, every merge still possible made again, the others' inputs placed as slots."""
        merge = self._merged[ev.slot]
        host = self._slots.get(merge.host)
        if (self.complete or host is None or host.version != ev.version
                or host.node in self.dead):
            return []  # a task placed again since knew its extras; a death is handled as such
        if isinstance(ev, Folded):
            if ev.at <= self._aligned(host.start):
                return []
        elif isinstance(ev.error, ObjectNotFoundError) and ev.error.data.get(
                "oid") == merge.input.hex():
            self._lacking.setdefault(merge.input, set()).add(host.node)
        return self._restart_all()

    def _taken(self, slot: int) -> bool:
        """``slot`` has an input: it is in any state but free. A slot once taken stays taken
        (repairs move it between the others; only a leaf placed ahead whose input did not come
        leaves, ``_unplace_ahead``), so the free slots only shrink and placement scans each
        slot about once: a reduce of 10,000 inputs places them in well under a second
        (bench/plan_scale.py)."""
        return slot in self._table

    def _first_free(self) -> int | None:
        """The lowest free slot other than the root (None if there is none)."""
        shape = self.shape
        assert shape is not None
        while self._low < shape.size and (self._low == shape.root or self._taken(self._low)):
            self._low += 1
        return self._low if self._low < shape.size else None

    def _next_in_fill(self, first: int) -> int:
        """The first free slot in this tree of halves' fill order, which lists the non-root
        slots (``first`` if none is free)."""
        shape = self.shape
        assert shape is not None
        if self._fill is None:
            assert self.half is not None
            self._fill = two_tree_fill(shape.size, self.half)
        fill = self._fill
        while self._fill_at < len(fill) and self._taken(fill[self._fill_at]):
            self._fill_at += 1
        return fill[self._fill_at] if self._fill_at < len(fill) else first

    def _ring_slot(self, node: str, first: int) -> int:
        """The free non-root slot for an input on ``node``: in readiness order (``first``),
        or with a ring, the one nearest the node's place after this node (so each stripe's
        chain runs round the ring and ends here), the lower on a tie."""
        ring, shape = self.ring, self.shape
        assert shape is not None
        if node not in ring or self.me not in ring or len(ring) < 3:
            return first
        places = shape.size - 1  # the non-root slots, in order; place p is slot p or p + 1
        distance = (ring.index(node) - ring.index(self.me)) % len(ring)  # 0 (here) .. n - 1
        ideal = (distance - 1) * (places - 1) / (len(ring) - 2)
        below = max(min(math.floor(ideal), places - 1), -1)
        above = below + 1
        while below >= 0 or above < places:  # places by distance from ideal
            if below >= 0 and (above >= places or ideal - below <= above - ideal):
                place, below = below, below - 1
            else:
                place, above = above, above + 1
            slot = place + (place >= shape.root)
            if not self._taken(slot):
                return slot
        return first

    def _put(self, slot: int, node: str, oid: ObjectID, version: bytes, gen: int,
             start: int, extras: tuple[Merge, ...] = ()) -> list[Instruction]:
        """``_put_steps``, run to its end."""
        return drive(self._put_steps(slot, node, oid, version, gen, start, extras))

    def _put_steps(self, slot: int, node: str, oid: ObjectID, version: bytes, gen: int,
                   start: int, extras: tuple[Merge, ...] = ()) -> Steps:
        """Place ``slot`` on ``node`` with input ``oid`` (and the inputs of ``extras``, held
        there too): a leaf's output is its input, any other slot starts a task (the root on
        this node computes the result in place). A child that computes only from a later byte
        than ``start`` (redone after an earlier loss) starts again: this slot reads it from
        ``start``; if a fold relies on that child, the result starts again from byte 0
        instead (a restarted child would lose its cut)."""
        shape = self.shape
        assert shape is not None and self.meta is not None
        late = [c for c in shape.children[slot] if (placed := self._slots.get(c)) is not None
                and placed.task and placed.node not in self.dead
                and self._aligned(placed.start) > self._aligned(start)]
        if any(self._folded_into(c) for c in late):  # this slot is placed by the restart
            self._move(slot, "placed", Slot(node, oid, oid, version, task=False, gen=gen,
                                            start=start, held=version))
            return self._restart_all()
        if start > 0:
            self._may_merge = False
        children = len(shape.children[slot])
        in_place = slot == shape.root and node == self.me
        if children == 0 and not in_place and not extras:  # a stripe's leaf too: its
            # consumer reads the stripe's window of the input, with no task and no copy
            self._move(slot, "placed", Slot(node, oid, oid, version, task=False, gen=gen,
                                            start=start, held=version))
            return self._links(slot)
        output = self.result if in_place else derived_id(self.result, slot, b"out%d" % gen)
        self._move(slot, "placed", Slot(node, oid, output, None, task=True, gen=gen,
                                        start=start, extras=extras, told=len(extras),
                                        held=version))
        if node not in self.task_nodes:
            self.task_nodes.append(node)
        m = self.meta
        lo, hi = self.window or (0, 0)
        out: list[Instruction] = [StartTask(slot, gen, node, oid, output, self.op, m.dtype,
                                            m.shape, children, start, lo, hi,
                                            tuple(x.input for x in extras))]
        for child in shape.children[slot]:
            if self._slots.get(child) is None and child in self._redo:  # placed from here later
                self._redo[child].start = min(self._redo[child].start, start)
        for child in late:
            out += yield self._restart_steps(child)
        return out

    def _links(self, slot: int) -> list[Instruction]:
        """Edges around ``slot`` (parent's first) and the root pull, that ``slot``'s placement or
        start just made possible: each becomes possible at exactly one such event, so once."""
        shape = self.shape
        assert shape is not None
        parent = shape.parent[slot]
        pairs = [(parent, slot)] if parent is not None else []
        out: list[Instruction] = []
        for p, c in pairs + [(slot, child) for child in shape.children[slot]]:
            ps, cs = self._slots.get(p), self._slots.get(c)
            if ps and cs and ps.version is not None and cs.version is not None:
                cs.connected = True
                out.append(Connect(p, ps.node, c, cs.node, cs.output, cs.version))
        root = self._slots[slot]
        if slot == shape.root and root.version is not None and root.output != self.result:
            root.connected = True
            out.append(PullRoot(root.node, root.output, root.version))
        return out

    # --- failures and repair ---
    def _input_failed(self, ev: InputFailed) -> list[Instruction]:
        if self._waiting.pop(ev.oid, 0) > 0:
            if len(self.used) + sum(self._waiting.values()) < self.k:
                return self._fail(ev.error)
            return []  # one candidate fewer: the inputs still awaited can make up k
        if ev.oid in self._rewaiting:  # a backup: one fewer candidate, nothing more
            self._rewaiting.discard(ev.oid)
            return []
        slots = self._wanted.pop(ev.oid, None)
        if not slots:  # ready already, or a cancelled backup
            return []
        redo = self._redo[slots[0]]
        return self._fail(PeerUnavailableError(
            f"node {redo.died_on} died holding input {ev.oid.hex()} (slot {slots[0]}) of reduce "
            f"{self.result.hex()}, and no copy came back: {ev.error}",
            node=redo.died_on, slot=slots[0], oid=ev.oid.hex()))

    def _slot_failed(self, ev: SlotFailed) -> list[Instruction]:
        placed = self._slots.get(ev.slot)
        if self.complete or (placed is None and ev.slot in self._redo):
            return []
        if placed is not None and (ev.gen is not None and placed.gen != ev.gen
                                   or ev.version is not None and placed.version != ev.version):
            return []  # an earlier placement's task, replaced since
        if placed is not None and placed.node in self.dead:
            child = None if ev.child is None else self._slots.get(ev.child)
            if ev.child is not None and child is not None:  # a connect to a node we
                # suspect: sent again if it answers
                self._orphan(ev.child, child.version, placed, placed.start)
            return []  # its death is handled as such (a repair if its output is still needed)
        if placed is not None and isinstance(ev.error, UNREACHABLE) and not ev.error.reported:
            self.dead.add(placed.node)  # its node is gone for this reduce, before the verdict
            return self._node_died(placed.node)
        if (placed is not None and placed.task and placed.version is None
                and isinstance(ev.error, ObjectNotFoundError)
                and ev.error.data.get("oid") == placed.input.hex()):
            # the holder the input's shard named has no complete copy (any more): the slot
            # is placed again on another holder, once one has it all (docs/design.md §5)
            return self._redo_lacking(ev.slot, placed, placed.start)
        return self._fail(ev.error)

    def _child_lost(self, ev: ChildLost) -> list[Instruction]:
        shape = self.shape
        if shape is not None and ev.child >= shape.size:
            return self._extra_lost(ev)
        placed = self._slots.get(ev.child)
        if (self.complete or shape is None or placed is None or placed.version != ev.version
                or ev.parent != shape.parent[ev.child]):
            return []  # stale: the slot was placed again since, or the report makes no sense
        if ev.parent is not None:
            consumer = self._slots.get(ev.parent)
            if consumer is None or ev.consumer != consumer.version:
                return []  # the consumer was placed again since: it connects its children
            if consumer.node in self.dead:  # if it is lost, its repair redoes this slot
                self._orphan(ev.child, placed.version, consumer, ev.offset)
                return []
        if ev.source_dead:
            self.dead.add(placed.node)
        if placed.node in self.dead:
            return self._repair(ev.child, ev.offset)
        if self._ahead(ev.child) and isinstance(ev.error, ObjectNotFoundError):
            return self._unplace_ahead(ev.child)
        if not placed.task and isinstance(ev.error, ObjectNotFoundError):
            # a leaf's node has no copy of its input any more (withdrawn after a partition,
            # its id put again elsewhere): redone from the offset on another holder
            return self._redo_lacking(ev.child, placed, ev.offset)
        return self._reconnect(ev, placed.node)

    def _reconnect(self, ev: ChildLost, node: str) -> list[Instruction]:
        """A pull from ``node``, which looks alive, broke: try again after a backoff, until
        the delays add up to the plan's patience. While the consumer suspects ``node``, which
        we do not, the wait does not count: our views differ, and end when the consumer trusts
        it again (its link to it works) or when our own suspicion or verdict repairs it."""
        tries, waited = self._reconnects.get(ev.child, (0, 0.0))
        if waited >= self.patience and not ev.source_suspected:
            return self._fail(PeerUnavailableError(
                f"slot {ev.child} on node {node} of reduce {self.result.hex()}: its "
                f"output could not be received after {tries} reconnections: {ev.error}",
                node=node, slot=ev.child))
        delay = min(RECONNECT_DELAY * 2 ** tries, RECONNECT_MAX)
        self._reconnects[ev.child] = (tries + 1, waited + (0.0 if ev.source_suspected else delay))
        self._broken[ev.child] = ev.offset
        return [After(delay, Retry(ev.child, ev.version))]

    def _extra_lost(self, ev: ChildLost) -> list[Instruction]:
        """The pull of a folded input's bytes below its fold (a child key beyond the slots)
        broke: reconnected while its node looks alive, else everything starts again."""
        assert self.shape is not None
        fold = self._folds.get(ev.child - self.shape.size)
        consumer = None if fold is None else self._slots.get(fold.parent)
        if (self.complete or fold is None or consumer is None or ev.parent != fold.parent
                or ev.version != fold.version or ev.consumer != consumer.version):
            return []
        if ev.source_dead:
            self.dead.add(fold.node)
        if fold.node in self.dead or consumer.node in self.dead:
            return self._restart_all()
        return self._reconnect(ev, fold.node)

    def _retry(self, ev: Retry) -> list[Instruction]:
        shape = self.shape
        if shape is not None and ev.child >= shape.size:
            fold = self._folds.get(ev.child - shape.size)
            if (self.complete or fold is None or fold.version != ev.version
                    or self._broken.pop(ev.child, None) is None):
                return []
            return self._extra_connect(fold)
        placed = self._slots.get(ev.child)
        offset = self._broken.pop(ev.child, None)
        if (self.complete or shape is None or placed is None or placed.version != ev.version
                or offset is None):
            return []
        parent = shape.parent[ev.child]
        if parent is None:
            return [PullRoot(placed.node, placed.output, placed.version)]
        ps = self._slots.get(parent)
        if ps is None or ps.version is None:
            return []
        if ps.node in self.dead:  # a pull to start on a node we suspect now
            self._orphan(ev.child, placed.version, ps, offset)
            return []
        return [Connect(parent, ps.node, ev.child, placed.node, placed.output, placed.version)]

    def _orphan(self, child: int, version: bytes | None, consumer: Slot, offset: int) -> None:
        """``child``'s consumer, on a node we suspect, has a broken pull of it: if that node
        is declared dead the consumer's repair redoes ``child``; if it answers again, the
        pull must resume (``_resume_orphans``), or the reduce would wait for it for good
        (``bench/chaos.py --partition --victims 2``, seed 31, trial 2: hung)."""
        if consumer.node not in self.declared and version is not None and consumer.version:
            self._orphans[child] = (version, consumer.version, offset)

    def _resume_orphans(self) -> list[Instruction]:
        """Pulls broken while their consumer was suspected, whose consumer we trust again:
        connected again, or their slot redone if its own node is lost since."""
        shape = self.shape
        out: list[Instruction] = []
        if shape is None or self.complete:
            return out
        for child, (version, consumer_version, offset) in list(self._orphans.items()):
            parent = shape.parent[child]
            consumer = None if parent is None else self._slots.get(parent)
            placed = self._slots.get(child)
            if (consumer is None or consumer.version != consumer_version or placed is None
                    or placed.version != version):
                del self._orphans[child]  # placed again since: connected by that placement
                continue
            if consumer.node in self.dead:
                continue  # still suspected
            del self._orphans[child]
            if placed.node in self.dead:
                out += self._repair(child, offset)
            else:
                assert parent is not None
                out.append(Connect(parent, consumer.node, child, placed.node, placed.output,
                                   version))
        return out

    def _node_died(self, node: str) -> list[Instruction]:
        """Slots on ``node`` whose consumer lacks bytes are redone: those it reported broken,
        and those never connected to it (their consumer has nothing of them yet)."""
        shape = self.shape
        if self.complete or shape is None:
            return []
        if node in self._fold_nodes():
            return self._restart_all()
        out: list[Instruction] = []
        for slot in sorted(s for s, placed in self._slots.items() if placed.node == node):
            placed = self._slots.get(slot)
            if placed is None:  # redone already, as a dead child of a slot redone above
                continue
            parent = shape.parent[slot]
            consumer = None if parent is None else self._slots.get(parent)
            if parent in self._redo:  # the consumer waits to be placed again: its repair
                # looked at its children before this death, so this slot is redone now
                out += self._repair(slot, self._redo[parent].start)
                continue
            if consumer is not None and consumer.node in self.dead:
                continue  # the consumer is lost too: its repair redoes this slot
            offset = self._broken.pop(slot, None)
            if offset is None and not placed.connected:
                offset = consumer.start if consumer is not None else 0
            if offset is not None:
                out += self._repair(slot, offset)
        return out

    def _repair(self, slot: int, start: int) -> list[Instruction]:
        """``_repair_steps``, run to its end."""
        return drive(self._repair_steps(slot, start))

    def _repair_steps(self, slot: int, start: int) -> Steps:
        """Place ``slot`` again, computing from byte ``start``: a ready backup takes it at once,
        otherwise its input is waited for anew (and the backups, if any); its dead children are
        redone from the same byte. A slot a fold relies on starts everything again."""
        shape = self.shape
        assert shape is not None
        if self._fold_relies_on(slot):
            return self._restart_all()
        placed = self._slots[slot]
        self._reconnects.pop(slot, None)
        self._broken.pop(slot, None)
        redo = Redo(placed.input, placed.node, placed.gen + 1, start)
        spare = self._spare()
        if spare is not None:
            self._lift(slot)
            return (yield self._swap_steps(slot, redo, spare))
        out = self._want(slot, redo)
        for oid in self._backups:
            out.append(WaitInput(oid, self._excluded(oid)))
            self._rewaiting.add(oid)
        self._backups = []
        for child in shape.children[slot]:
            c = self._slots.get(child)
            if c is not None and c.node in self.dead:
                out += yield self._repair_steps(child, start)
            elif child in self._redo:
                self._redo[child].start = min(self._redo[child].start, start)
        return out

    def _want(self, slot: int, redo: Redo) -> list[Instruction]:
        """``slot`` waits for its input again (one wait per input, whatever its slots)."""
        self._move(slot, "redo", redo)
        out: list[Instruction] = []
        if redo.input not in self._wanted:
            self._wanted[redo.input] = []
            out.append(WaitInput(redo.input, self._excluded(redo.input)))
        self._wanted[redo.input].append(slot)
        return out

    def _redo_lacking(self, slot: int, placed: Slot, start: int) -> list[Instruction]:
        """``slot``'s node has no copy of its input: never that node for that input again,
        and the slot redone from ``start`` elsewhere."""
        self._lacking.setdefault(placed.input, set()).add(placed.node)
        return self._repair(slot, start)

    def _excluded(self, oid: ObjectID) -> tuple[str, ...]:
        """The nodes whose copies of input ``oid`` this reduce does not use: the dead, and
        those found lacking it."""
        return tuple(sorted(self.dead | self._lacking.get(oid, set())))

    def _usable(self, ev: InputReady) -> list[str]:
        """The live holders of a backup that fits the reduce (none: it cannot be used)."""
        if not self._fits(ev):
            return []
        return [n for n in ev.alive if n not in self.dead]

    def _spare(self) -> InputReady | None:
        """A ready backup with a live holder, taken off the list (None if there is none)."""
        while self.spares:
            ev = self.spares.pop(0)
            if self._usable(ev):
                return ev
        return None

    def _backup_ready(self, ev: InputReady) -> list[Instruction]:
        """A backup waited for again is ready: it takes a slot still waiting for its input,
        or is kept for the next repair."""
        self._rewaiting.discard(ev.oid)
        if not self._usable(ev):
            return []  # another type or shape, or no live holder: never used
        if not self._redo:
            self.spares.append(ev)
            return []
        slot = min(self._redo)
        redo = self._redo[slot]
        self._lift(slot)
        out: list[Instruction] = []
        waiting = self._wanted.get(redo.input, [])
        if slot in waiting:
            waiting.remove(slot)
            if not waiting:
                del self._wanted[redo.input]
                out.append(CancelWaits((redo.input,)))
        return out + self._swap(slot, redo, ev)

    def _swap(self, slot: int, redo: Redo, ev: InputReady) -> list[Instruction]:
        """``_swap_steps``, run to its end."""
        return drive(self._swap_steps(slot, redo, ev))

    def _swap_steps(self, slot: int, redo: Redo, ev: InputReady) -> Steps:
        """Backup ``ev`` takes lifted ``slot`` (lost ``redo.input``) from byte 0: if the
        consumer had bytes of the lost value, every partial sum up to the result starts again
        from 0 (first: the slot is placed once they are)."""
        shape = self.shape
        assert shape is not None
        self.used[self.used.index(redo.input)] = ev.oid
        out: list[Instruction] = []
        if redo.start > 0:
            out.append(RestartResult())
            for ancestor in redo_path(shape, slot)[1:]:
                out += yield self._restart_steps(ancestor)
        alive = self._usable(ev)
        node = self.me if self.me in alive else alive[0]
        out += yield self._put_steps(slot, node, ev.oid, ev.version, redo.gen, 0)
        return out + (yield self._from_zero_below_steps(slot))

    def _restart_steps(self, slot: int) -> Steps:
        """Start ``slot``'s task again from byte 0 on its node (a new output), unless it is
        lost itself (then its repair starts from 0)."""
        placed = self._slots.get(slot)
        if placed is None:
            if slot not in self._redo:
                return []
            self._redo[slot].start = 0  # waiting for its input: placed later, from 0
            return (yield self._from_zero_below_steps(slot))
        if placed.node in self.dead:
            return (yield self._repair_steps(slot, 0))
        self._reconnects.pop(slot, None)
        self._broken.pop(slot, None)
        out = yield self._put_steps(slot, placed.node, placed.input, placed.held,
                                    placed.gen + 1, 0, placed.extras)
        return out + (yield self._from_zero_below_steps(slot))

    def _from_zero_below_steps(self, slot: int) -> Steps:
        """``slot``'s new task reads its children from byte 0: lost ones are redone from 0,
        tasks that compute only from a later byte start again, and none is connected yet."""
        shape = self.shape
        assert shape is not None
        out: list[Instruction] = []
        for child in shape.children[slot]:
            c = self._slots.get(child)
            if c is None:
                if child in self._redo:
                    self._redo[child].start = 0
                    out += yield self._from_zero_below_steps(child)
                continue
            c.connected = False
            self._broken.pop(child, None)
            self._reconnects.pop(child, None)
            if c.node in self.dead:
                out += yield self._repair_steps(child, 0)
            elif c.task and c.start > 0:
                out += yield self._restart_steps(child)
        return out

    def _replace(self, ev: InputReady) -> list[Instruction]:
        """A lost input is back: fold it into a slot its node computes already, or place the
        slots waiting for it on a live holder."""
        shape = self.shape
        assert self.meta is not None and shape is not None
        lacking = self._lacking.get(ev.oid, set())
        alive = [n for n in ev.alive if n not in self.dead and n not in lacking]
        if not alive and self._fits(ev):  # the shard's view of deaths lags ours
            return [WaitInput(ev.oid, self._excluded(ev.oid))]
        slots = self._wanted.pop(ev.oid)
        if not self._fits(ev):
            return self._fail(self._mismatch(ev))
        node = self.me if self.me in alive else alive[0]
        out: list[Instruction] = []
        for slot in slots:
            redo = self._redo[slot]
            self._lift(slot)
            host = self._host(node) if redo.start == 0 and self._removable(slot) else None
            into = (self._fold_target(slot, node, redo.start) if len(slots) == 1
                    and host is None else None)
            # a leaf placed has no task to add another input to
            leaf = (self._absorb_target(node) if len(slots) == 1 and host is None
                    and into is None and shape.children[slot] else None)
            if host is not None:
                out += self._merge(Merge(slot, host[0], ev.oid, ev.version, redo.gen), host[1])
            elif into is not None:
                out += self._fold(slot, redo, into, node, ev)
            elif leaf is not None:
                out += self._absorb(slot, redo, leaf, node, ev)
            else:
                out += self._put(slot, node, ev.oid, ev.version, redo.gen, redo.start)
        return out

    # --- folds (docs/design.md §5, "Folding a lost input") ---
    def _fold_target(self, slot: int, node: str, start: int) -> int | None:
        """The slot on ``node`` that lost ``slot``'s input can be added into, so ``node``'s
        link carries one stream, not two (None: place the slot as usual). Its consumer must
        be a live task and every child of it live with output from ``start`` on; among the
        slots ``node`` computes, an ancestor is best: it has not combined past ``start``."""
        shape = self.shape
        assert shape is not None
        parent = shape.parent[slot]
        consumer = None if parent is None else self._slots.get(parent)
        if (not self._may_fold or self._folding or consumer is None or not consumer.task
                or consumer.version is None or consumer.node in self.dead):
            return None
        aligned = self._aligned(start)
        for child in shape.children[slot]:
            c = self._slots.get(child)
            if c is None or c.version is None or c.node in self.dead or c.start > aligned:
                return None
        hosted = sorted(s for s, placed in self._slots.items()
                        if placed.node == node and placed.task and placed.version is not None)
        ancestors = [s for s in redo_path(shape, slot)[1:] if s in hosted]
        best = ancestors or hosted
        return best[0] if best else None

    def _item(self) -> int:
        assert self.meta is not None
        return np.dtype(self.meta.dtype).itemsize

    def _aligned(self, offset: int) -> int:
        """``offset`` rounded down to a whole element: folds switch sources between elements."""
        return offset - offset % self._item()

    def _fold(self, slot: int, redo: Redo, into: int, node: str,
              ev: InputReady) -> list[Instruction]:
        shape = self.shape
        parent = None if shape is None else shape.parent[slot]
        target = self._slots[into]
        assert shape is not None and parent is not None and target.version is not None
        fold = FoldState(slot, ev.oid, ev.version, node, into, parent,
                         self._aligned(redo.start), redo.gen, list(shape.children[slot]))
        self._move(slot, "folding", fold)
        return [Fold(slot, into, node, target.version, ev.oid, ev.version, fold.start)]

    def _absorb_target(self, node: str) -> int | None:
        """The leaf on ``node`` whose input a lost slot placed there can take over, when no
        slot there computes (None: no such leaf, or its consumer is not a live task)."""
        shape = self.shape
        if shape is None or not self._may_fold or self._folding or self._absorbing:
            return None
        taken = {a.leaf for a in self._absorbed.values()}
        for leaf in sorted(self._leaves.get(node, ())):  # the node's leaves only: a reduce of
            # thousands of inputs put again after a loss asks this once per input
            parent = shape.parent[leaf]
            if leaf in taken:
                continue
            consumer = None if parent is None else self._slots.get(parent)
            if (consumer is not None and consumer.task and consumer.version is not None
                    and consumer.node not in self.dead):
                return leaf
        return None

    def _absorb(self, slot: int, redo: Redo, leaf: int, node: str,
                ev: InputReady) -> list[Instruction]:
        """Ask the leaf's consumer to stop adding the leaf's input where it is (the lost slot
        is placed once it answered)."""
        shape = self.shape
        placed = self._slots[leaf]
        parent = None if shape is None else shape.parent[leaf]
        consumer = None if parent is None else self._slots.get(parent)
        assert parent is not None and consumer is not None and consumer.version is not None
        self._move(slot, "absorbing", Absorb(slot, node, ev.oid, ev.version, redo.gen,
                                             redo.start, leaf, placed.input,
                                             placed.version or b"", parent))
        # not below the slot's start: the leaf may be on another branch, whose bytes below
        # it the lost slot's consumer never had; and from a whole element *above* it when the
        # consumer stopped inside one: the lost slot's new output must hold the old value up
        # to that element's end, which the consumer completes from it
        start = self._aligned(redo.start + self._item() - 1)
        # nor below the byte the consumer reads the leaf from: a fold hung the leaf on it
        # from the fold's start, and below that the leaf came in the folded slot's old sums
        start = max([start] + [f.start for f in self._folds.values()
                               if f.parent == parent and leaf in f.children])
        # nor below where a slot on the leaf's way up to the lost slot's (up to where the two
        # ways meet) computes from: below it, its consumer holds an older placement's sums,
        # which have the leaf's input in them already
        assert shape is not None
        ours = set(redo_path(shape, slot))
        up: int | None = parent
        while up is not None and up not in ours:
            placed_up = self._slots.get(up)
            redone = self._redo.get(up)
            start = max(start, self._aligned(placed_up.start if placed_up is not None
                                             else redone.start if redone is not None else 0))
            up = shape.parent[up]
        return [Reshape(parent, consumer.node, consumer.version, leaf, start, 0)]

    def _cut(self, absorb: Absorb, until: int) -> list[Instruction]:
        """The leaf's consumer adds its input below ``until`` only: place the lost slot."""
        absorb.cut = until
        return self._put(absorb.slot, absorb.node, absorb.input, absorb.input_version,
                         absorb.gen, absorb.start)

    def _absorb_folded(self, ev: Folded) -> list[Instruction]:
        """The leaf's input is in the placed slot's sums: its edges may carry bytes now."""
        absorb = self._absorbing.get(ev.slot)
        placed = self._slots.get(ev.slot)
        if absorb is None or absorb.version is None or placed is None or placed.gen != absorb.gen:
            return []
        self._absorb_done(ev.slot)
        placed.version = absorb.version
        return self._links(ev.slot)

    def _folded(self, ev: Folded) -> list[Instruction]:
        """The input is in ``into``'s sums from ``ev.at``: reshape the consumer."""
        if ev.slot in self._merged:
            return self._merge_answered(ev)
        if ev.slot in self._absorbing:
            return self._absorb_folded(ev)
        fold = self._folding.get(ev.slot)
        consumer = None if fold is None else self._slots.get(fold.parent)
        if (self.complete or fold is None or fold.into != ev.into or fold.at >= 0
                or consumer is None or consumer.version is None):
            return []
        fold.at = max(ev.at, fold.start)
        more = len(fold.children) + (1 if fold.at > fold.start else 0)
        return [Reshape(fold.parent, consumer.node, consumer.version, ev.slot, fold.start, more)]

    def _fold_failed(self, ev: FoldFailed) -> list[Instruction]:
        """The slot to fold into is gone: the lost slot is placed as usual after all (a leaf's
        consumer already stopped adding its input: everything starts again)."""
        if ev.slot in self._merged:
            return self._merge_answered(ev)
        if ev.slot in self._absorbing and not self.complete:
            return self._restart_all()
        fold = self._folding.get(ev.slot)
        if self.complete or fold is None:
            return []
        self._lift(ev.slot)
        if fold.node in self.dead:
            return self._want(fold.slot, Redo(fold.input, fold.node, fold.gen, fold.start))
        return self._put(fold.slot, fold.node, fold.input, fold.version, fold.gen, fold.start)

    def _reshaped(self, ev: Reshaped) -> list[Instruction]:
        """The consumer took the new shape: the lost slot's children hang on it from the fold
        on, and it pulls the input's bytes the fold came too late for."""
        shape = self.shape
        cut = [a for a in self._absorbing.values() if a.leaf == ev.slot and a.cut < 0]
        if cut and not self.complete:
            return self._cut(cut[0], ev.until)
        fold = self._folding.get(ev.slot)
        if self.complete or shape is None or fold is None or fold.at < 0:
            return []
        consumer = self._slots.get(fold.parent)
        children = [self._slots.get(c) for c in fold.children]
        if consumer is None or any(c is None or c.version is None for c in children):
            return self._restart_all()
        self._move(ev.slot, "folded", fold)
        siblings = [c for c in shape.children[fold.parent] if c != ev.slot]
        shape.children[fold.parent] = sorted(siblings + fold.children)
        shape.children[ev.slot] = []
        shape.parent[ev.slot] = None
        out: list[Instruction] = []
        for slot, c in zip(fold.children, children, strict=True):
            assert c is not None and c.version is not None
            shape.parent[slot] = fold.parent
            c.connected = True
            out.append(Connect(fold.parent, consumer.node, slot, c.node, c.output, c.version,
                               fold.start))
        return out + self._extra_connect(fold)

    def _extra_connect(self, fold: FoldState) -> list[Instruction]:
        """The consumer pulls the input's bytes from the fold's start to where it took
        effect, under a child key beyond the slots (none if it took effect at the start)."""
        shape = self.shape
        consumer = self._slots.get(fold.parent)
        if shape is None or consumer is None or fold.at <= fold.start:
            return []
        return [Connect(fold.parent, consumer.node, shape.size + fold.slot, fold.node,
                        fold.input, fold.version, fold.start, fold.at)]

    def _fold_nodes(self) -> set[str]:
        """Nodes whose loss a fold cannot survive: where its input was added, its consumer,
        and (until it is in effect) the lost slot's children."""
        nodes: set[str] = set()
        for fold in [*self._folds.values(), *self._folding.values()]:
            slots = [fold.parent] + (fold.children if fold.slot in self._folding else [])
            nodes.add(fold.node)
            nodes.update(self._slots[s].node for s in slots if s in self._slots)
        for absorb in [*self._absorbed.values(), *self._absorbing.values()]:
            nodes.add(absorb.node)
            if absorb.consumer in self._slots:
                nodes.add(self._slots[absorb.consumer].node)
        return nodes

    def _fold_relies_on(self, slot: int) -> bool:
        """Losing ``slot`` loses more than its own input's bytes: a fold or a merge went into
        it, or a fold's consumer or lost children are it."""
        placed = self._slots.get(slot)
        return self._folded_into(slot) or (placed is not None and bool(placed.extras))

    def _folded_into(self, slot: int) -> bool:
        """A lost input's fold or a leaf's absorption relies on ``slot``."""
        absorbs = [*self._absorbed.values(), *self._absorbing.values()]
        return any(slot in (f.into, f.parent) or (f.slot in self._folding and slot in f.children)
                   for f in [*self._folds.values(), *self._folding.values()]) or any(
            slot in (a.slot, a.leaf, a.consumer) for a in absorbs)

    def _restart_all(self) -> list[Instruction]:
        """A node a fold relied on is lost: the lost bytes are spread over the fold's slots,
        so the result starts again from byte 0 over the tree's first shape; every live slot's
        task starts again, lost inputs are waited for again (docs/design.md §5)."""
        assert self.meta is not None
        folded: dict[int, FoldState | Absorb] = {**self._folds, **self._folding}
        folded.update((a.slot, a) for a in self._absorbing.values() if a.slot not in self._slots)
        placed = dict(self._slots)
        merges = list(self._merged.values())  # in the order they were made
        for slot in [*self._absorbing, *self._absorbed]:
            self._end_absorb(slot, self._table[slot])
        # every slot with an input in the tree is lifted, so that none is linked to before it
        # is placed anew; a slot waiting for its input waits on, to be placed from byte 0
        for slot in [*placed, *folded]:
            self._lift(slot)
        self._may_fold = False
        self._may_merge = self._merging  # every slot is placed anew from byte 0
        self._broken.clear()
        self._orphans.clear()
        self._reconnects.clear()
        self.shape = shape = self._new_shape()
        self._low, self._fill, self._fill_at = 0, None, 0  # its root may be another slot
        out: list[Instruction] = [RestartResult()]
        apart: list[tuple[Merge, str]] = []  # merges undone: their inputs take their slots
        for merge in merges:  # made again in the new shape where the host lives on
            host = placed.get(merge.host)
            node = "" if host is None else host.node  # "": not placed (waited for anywhere)
            lacking = {*self._lacking.get(merge.input, ()),
                       *(() if host is None else self._lacking.get(host.input, ()))}
            if host is None or node in self.dead or node in lacking:
                self._lift(merge.slot)
                apart.append((merge, node))
            else:
                self._remove(merge.slot)
        for slot in range(shape.size):
            fold, old = folded.get(slot), placed.get(slot)
            if slot in self._merged:
                continue
            if isinstance(fold, Absorb):
                node, oid, version, gen = fold.node, fold.input, fold.input_version, fold.gen + 1
            elif fold is not None:
                node, oid, version, gen = fold.node, fold.input, fold.version, fold.gen + 1
            elif old is not None:  # a task's output version is made anew
                version, node, oid, gen = old.held, old.node, old.input, old.gen + 1
            else:
                if slot in self._redo:
                    self._redo[slot].start = 0
                continue
            extras = tuple(m for m in self._merged.values() if m.host == slot)
            if node in self.dead or node in self._lacking.get(oid, ()):
                out += self._want(slot, Redo(oid, node, gen, 0))
            else:
                out += self._put(slot, node, oid, version, gen, 0, extras)
        for merge, node in apart:
            if not node or node in self.dead or node in self._lacking.get(merge.input, ()):
                out += self._want(merge.slot, Redo(merge.input, node, merge.gen, 0))
            else:
                out += self._put(merge.slot, node, merge.input, merge.version, merge.gen, 0)
        return out

    def _fail(self, error: HopliteError) -> list[Instruction]:
        self.error = error
        out: list[Instruction] = []
        waits = [*self._waiting, *self._wanted, *sorted(self._rewaiting)]
        if waits:
            out.append(CancelWaits(tuple(waits)))
            self._waiting.clear()
            self._wanted.clear()
            self._rewaiting.clear()
        return out + [Fail(error)] + self._release()

    def _release(self) -> list[Instruction]:
        """Every task node not declared dead is told: one only given up on (unreachable, or
        dead in another node's view) may still hold pinned buffers of ours."""
        nodes = tuple(n for n in self.task_nodes if n not in self.declared)
        return [Release(nodes)] if nodes else []


# Each event's handler; complete for ``Event`` (tests/unit/test_reduce_plan_invariants.py).
EVENT_HANDLERS: dict[type, Callable[[ReducePlan, Any], list[Instruction]]] = {
    InputReady: ReducePlan._input_ready, HoldOver: ReducePlan._hold_over,
    InputFailed: ReducePlan._input_failed, TaskStarted: ReducePlan._task_started,
    SlotFailed: ReducePlan._slot_failed, ChildLost: ReducePlan._child_lost,
    Retry: ReducePlan._retry, NodeDied: ReducePlan._node_lost,
    NodeSuspected: ReducePlan._node_lost, NodeTrusted: ReducePlan._node_trusted,
    Folded: ReducePlan._folded, FoldFailed: ReducePlan._fold_failed,
    Reshaped: ReducePlan._reshaped, ResultComplete: ReducePlan._result_complete,
    ResultFailed: ReducePlan._result_failed, Published: ReducePlan._published}


class EventQueue:
    """Feeds a plan its events one at a time, in arrival order, and hands each instruction to
    ``execute``: an outcome fed back while instructions run is queued, never handled inside
    the event that caused it (the daemon's driver and the simulator's share this order)."""

    def __init__(self, plan: ReducePlan, execute: Callable[[Instruction], None]) -> None:
        self._plan = plan
        self._execute = execute
        self._events: deque[Event] = deque()
        self._draining = False

    def feed(self, event: Event) -> None:
        self._events.append(event)
        if not self._draining:
            self.resume(())

    def resume(self, held: Iterable[Instruction]) -> None:
        """Carry out instructions the driver held back (in order, as if the event that made
        them were being handled now), then the events fed meanwhile."""
        self._draining = True
        try:
            for instruction in held:
                self._execute(instruction)
            while self._events:
                for instruction in self._plan.handle(self._events.popleft()):
                    self._execute(instruction)
        finally:
            self._draining = False
