"""A reduce plan's vocabulary: the events it is fed, the instructions it returns, each slot's
state and record (``SlotState``, ``SLOT_TRANSITIONS``), and the schedule ``ReduceSpec``.
Data only: :mod:`hoplited.collectives.plan` and its policies act on it."""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Literal, get_args

from hoplite_client.wire.errors import HopliteError
from hoplite_client.wire.ids import ObjectID
from hoplited.collectives.tree import TreeShape


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
    ``input_version``: the input's version, which a task placed again as a leaf is read at."""

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
    input_version: bytes = b""


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
