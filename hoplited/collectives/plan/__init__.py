"""A reduce coordinator's decisions as a pure core: which inputs, slots, nodes and edges.

Theory of operation. Inputs become ready in any order; the first ``k`` are used, in readiness
order, and the rest are backups whose waits are cancelled once ``k`` are chosen. An input whose
wait fails (it timed out, or its id names a failed reduce's result) is one candidate fewer: the
reduce fails with its error only once the inputs still awaited cannot make up ``k``. The first
ready input fixes the metadata: small inputs (at most ``INLINE_MAX``) come inline from their
shards and are combined here once ``k`` are chosen; larger ones open the result on this node
and fix a tree of ``k`` slots (:mod:`.tree`). Each input takes a slot as it becomes ready
(:mod:`.placement`). A leaf not computed in place needs no task (its output is its input); any
other slot starts a task on its node. A parent learns where a child's output is once both
tasks exist (``TaskStarted``) and the child's version is known, so tasks can start
concurrently and edges are emitted exactly once in whatever order they complete. The root's
output, unless it is the result, is pulled into the result. A lost node's slots are redone
(:mod:`.repair`), and optimisations put inputs where a node's link carries one stream
(:mod:`.merge`, :mod:`.fold`) or order a combiner's late inputs (:mod:`.combiner`).

The modules:

- this one, the core: ``ReducePlan`` (the slots' table, ``_move``, ``handle`` and its
  dispatch ``EVENT_HANDLERS``, ``validate``), choosing the ``k`` inputs and the metadata
  (``_ready``), putting a slot on a node and its edges (``_put_steps``, ``_links``), and
  ``EventQueue``; it re-exports every name below that the rest of the daemon uses;
- :mod:`.model`: the events, the instructions, the slots' states, moves and records,
  ``ReduceSpec``, and the ``drive`` trampoline a repair's walks run on;
- :mod:`.placement`: arrival order -> slot, and the tree's shape (``Placement``);
- :mod:`.repair`: redo, reconnect, backups, restart (``Repair``), the events of failures;
- :mod:`.policy`: the hooks at which the core calls its optimisations (``Policy``), each a
  module of its own: :mod:`.merge` (several inputs on one node, ``Merging``), :mod:`.fold`
  (a lost input folded or absorbed, ``Folding``), :mod:`.combiner` (late inputs held, the
  early chain hurried, the last leaf placed ahead, ``LateInputs``). A new optimisation is a
  ``Policy`` and its line in ``ReducePlan.__init__``.

Slot states. Each slot is in one state (``SlotState``: free, placed, redo, merged, folding,
folded, absorbing), kept with that state's record in one table entry per slot (``SlotEntry``).
Every change goes through ``ReducePlan._move``, which refuses at once a move that
``SLOT_TRANSITIONS`` does not list, telling the plan's last events; it keeps the indexes of
the table that placement, repair and the policies look things up in: by state (read outside
as the views ``slots``, ``redo``, ``merged``, ``folding``, ``folds``, ``absorbing``,
``absorbed``) and by node. A repair that must decide a slot's next state while no lookup sees
it (a restart, a backup taking a slot, a lost input back, a failed fold) lifts it out of its
index first; the move it then makes is checked from the state it left. ``validate`` checks
the rest: the indexes against the table, and the records that refer to slots.

Nothing here waits or does I/O: ``ReducePlan.handle(event)`` returns the instructions the
driver (``hoplited.collectives.coordinator``) carries out, in order, feeding outcomes back as
events. ``history`` keeps the last (event, instructions) pairs for debugging. The tests set
``CHECK_INVARIANTS`` and patch ``check_reducible`` here, in the core's own namespace, which is
why the core is this package's ``__init__``."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import Any

import numpy as np

from hoplite_client.wire.errors import (
    HopliteError,
    InvalidArgumentError,
    PeerUnavailableError,
)
from hoplite_client.wire.frames import INLINE_MAX
from hoplite_client.wire.ids import ObjectID
from hoplited.collectives.ops import check_op, check_reducible, derived_id
from hoplited.collectives.plan.combiner import LATE_HOLD, LateInputs
from hoplited.collectives.plan.fold import Folding
from hoplited.collectives.plan.merge import MERGE_REACH, Merging
from hoplited.collectives.plan.model import (
    SLOT_STATES,
    SLOT_TRANSITIONS,
    STATE_RECORDS,
    Absorb,
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
    FoldState,
    HoldOver,
    Hurry,
    InputFailed,
    InputReady,
    Instruction,
    Merge,
    NodeDied,
    NodeSuspected,
    NodeTrusted,
    OpenResult,
    Publish,
    Published,
    PullRoot,
    Redo,
    ReduceSpec,
    Release,
    Reshape,
    Reshaped,
    RestartResult,
    ResultComplete,
    ResultFailed,
    Retry,
    Slot,
    SlotEntry,
    SlotFailed,
    SlotRecord,
    SlotState,
    StartTask,
    Steps,
    TaskStarted,
    WaitInput,
    drive,
    redo_path,
)
from hoplited.collectives.plan.placement import Placement
from hoplited.collectives.plan.policy import Policy, first_answer
from hoplited.collectives.plan.repair import (
    RECONNECT_DELAY,
    RECONNECT_MAX,
    UNREACHABLE,
    Repair,
)
from hoplited.collectives.tree import TreeShape

__all__ = [
    "CHECK_INVARIANTS", "EVENT_HANDLERS", "HISTORY_MAX", "LATE_HOLD", "MERGE_REACH",
    "RECONNECT_DELAY", "RECONNECT_MAX", "SLOT_STATES", "SLOT_TRANSITIONS", "STATE_RECORDS",
    "UNREACHABLE", "Absorb", "After", "CancelWaits", "ChildLost", "CombineInline", "Connect",
    "Event", "EventQueue", "Fail", "Fold", "Folded", "FoldFailed", "FoldState", "HoldOver",
    "Hurry", "InputFailed", "InputReady", "Instruction", "Merge", "NodeDied", "NodeSuspected",
    "NodeTrusted", "OpenResult", "Policy", "Publish", "Published", "PullRoot", "Redo",
    "ReducePlan", "ReduceSpec", "Release", "Reshape", "Reshaped", "RestartResult", "Retry",
    "ResultComplete", "ResultFailed", "Slot", "SlotEntry", "SlotFailed", "SlotRecord",
    "SlotState", "StartTask", "Steps", "TaskStarted", "WaitInput", "drive", "redo_path",
]

# (event, instructions) pairs kept: a reduce of a few dozen inputs sends ~3 events per slot,
# so its whole story fits; a huge one keeps its end, where failures are (like dask's story).
HISTORY_MAX = 256
# Tests set this: every plan then checks its indexes and records agree after each event
# (``validate``), at a cost linear in its slots, which a 10,000-input plan cannot pay per event;
# each slot's moves are checked as they are made, always (``ReducePlan._move``).
CHECK_INVARIANTS = False
# The schedule of a plan given none: one tree over whole inputs.
PLAIN = ReduceSpec()


class ReducePlan:
    """One reduce into ``result`` coordinated on node ``me``, scheduled as ``spec`` says;
    ``depth(k, size)`` is the tree depth for ``k`` inputs of ``size`` bytes (the driver's link
    model); ``patience``: seconds a node that looks alive may stay unreachable before the
    reduce fails."""

    def __init__(self, result: ObjectID, inputs: list[ObjectID], k: int, op: str, me: str,
                 depth: Callable[[int, int], int], patience: float = 6.0,
                 spec: ReduceSpec = PLAIN) -> None:
        window, everyone, half, here = spec.window, spec.everyone, spec.half, spec.here
        combiner, late = spec.combiner, spec.late
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
        self.window = window
        self.everyone = everyone
        self.here = here
        self.result, self.k, self.op, self.me = result, k, op, me
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
        self.task_nodes: list[str] = []
        self.dead: set[str] = set()  # nodes this reduce no longer uses
        self.declared: set[str] = set()  # those of them this node's membership declared dead
        self.error: HopliteError | None = None
        self.complete = False
        self.published = False
        self.history: deque[tuple[Event, tuple[Instruction, ...]]] = deque(maxlen=HISTORY_MAX)
        self._event: Event | None = None  # the event being handled (the end of a story)
        # which slot each input takes, and the optimisations, asked in this order at their
        # hooks (a new one is a Policy registered here)
        self._placement = Placement(k, me, spec, depth, self._taken)
        self._repairs = Repair(self)
        self._merge = Merging(self, spec, len(inputs))
        self._fold = Folding(self, len(inputs))
        self._late_inputs = LateInputs(self, spec)
        self._policies: tuple[Policy, ...] = (self._merge, self._fold, self._late_inputs)

    # --- the optimisations' counters and state, read outside (status, metrics, tests) ---
    @property
    def merges(self) -> int:
        """Inputs merged into another's slot so far."""
        return self._merge.merges

    @property
    def held(self) -> Mapping[ObjectID, InputReady]:
        """The late inputs a combiner holds (``LATE_HOLD``), in order (read-only)."""
        return MappingProxyType(self._late_inputs.held)

    @property
    def holds(self) -> int:
        """Late inputs held so far."""
        return self._late_inputs.holds

    @property
    def hurried(self) -> int:
        """Early chains sent ahead of their siblings (``Hurry``) so far."""
        return self._late_inputs.hurried

    @property
    def ahead(self) -> frozenset[ObjectID]:
        """The inputs whose leaves were placed ahead, not ready yet."""
        return frozenset(self._late_inputs.ahead)

    @property
    def aheads(self) -> int:
        """Leaves placed ahead so far."""
        return self._late_inputs.aheads

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
        for oid, waiting in self._repairs.wanted.items():
            for slot in waiting:
                redo = self._redo.get(slot)
                if redo is None or redo.input != oid:
                    raise self._fault(slot, f"waits for {oid.hex()} but is {redo}")
        extra = self.shape.size if self.shape is not None else 0  # a fold's extra pulls
        for slot in self._repairs.broken:
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
        """An input is ready: a lost one back, a backup waited for again, or a first-time
        input (unless a policy takes it: a combiner holds it, a leaf placed ahead)."""
        if ev.oid in self._repairs.wanted:
            for policy in self._policies:
                policy.on_input_back(ev)
            return self._repairs.replace(ev)
        if ev.oid in self._repairs.rewaiting:
            return self._repairs.backup_ready(ev)
        taken = first_answer(policy.on_ready(ev) for policy in self._policies)
        return self._ready(ev) if taken is None else taken

    def _task_started(self, ev: TaskStarted) -> list[Instruction]:
        """A slot's task runs: its edges, unless a policy holds them back (it first takes
        over a leaf's input), after what the policies tell it (the inputs merged into it)."""
        slot = self._slots.get(ev.slot)
        if slot is None or not slot.task or slot.version is not None or slot.gen != ev.gen:
            return []
        held = first_answer(policy.on_task_started(ev, slot) for policy in self._policies)
        if held is not None:
            return held
        slot.version = ev.version
        out = [ins for policy in self._policies for ins in policy.on_task_edges(ev.slot)]
        return out + self._links(ev.slot)

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

    # --- inputs chosen and placed ---
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
                self._placement.last_leaf = plain_allreduce and (self.here
                                                                 or self.me in ev.holders)
                self.shape = self._placement.new_shape(m.size)
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
                    self._repairs.backups = list(self._waiting)
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

    def _place(self, ev: InputReady) -> list[Instruction]:
        shape, me = self.shape, self.me
        assert shape is not None
        local = me in ev.holders
        alive = [n for n in ev.alive if n not in self.dead]
        node = me if local else (alive or list(ev.holders))[0]
        slot = self._placement.slot_for(shape, node, local)
        taken = first_answer(policy.on_place(slot, node, ev) for policy in self._policies)
        if taken is not None:
            return taken
        return self._put(slot, node, ev.oid, ev.version, gen=0, start=0)


    def _taken(self, slot: int) -> bool:
        """``slot`` has an input: it is in any state but free. A slot once taken stays taken
        (repairs move it between the others; only a leaf placed ahead whose input did not come
        leaves, ``LateInputs._unplace_ahead``), so the free slots only shrink and placement
        scans each slot about once: a reduce of 10,000 inputs places them in well under a
        second (bench/plan_scale.py)."""
        return slot in self._table

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
                                            start=start, input_version=version))
            return self._repairs.restart_all()
        for policy in self._policies:
            policy.on_put(slot, start)
        children = len(shape.children[slot])
        in_place = slot == shape.root and node == self.me
        if children == 0 and not in_place and not extras:  # a stripe's leaf too: its
            # consumer reads the stripe's window of the input, with no task and no copy
            self._move(slot, "placed", Slot(node, oid, oid, version, task=False, gen=gen,
                                            start=start, input_version=version))
            return self._links(slot)
        output = self.result if in_place else derived_id(self.result, slot, b"out%d" % gen)
        self._move(slot, "placed", Slot(node, oid, output, None, task=True, gen=gen,
                                        start=start, extras=extras, told=len(extras),
                                        input_version=version))
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
            out += yield self._repairs.restart_steps(child)
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

    # --- byte offsets ---
    def _item(self) -> int:
        assert self.meta is not None
        return np.dtype(self.meta.dtype).itemsize

    def _aligned(self, offset: int) -> int:
        """``offset`` rounded down to a whole element: folds switch sources between elements."""
        return offset - offset % self._item()

    # --- a Fold's or a Reshape's answer: the policy that sent it takes it ---
    def _folded(self, ev: Folded) -> list[Instruction]:
        return first_answer(policy.on_folded(ev) for policy in self._policies) or []

    def _fold_failed(self, ev: FoldFailed) -> list[Instruction]:
        return first_answer(policy.on_fold_failed(ev) for policy in self._policies) or []

    def _reshaped(self, ev: Reshaped) -> list[Instruction]:
        return first_answer(policy.on_reshaped(ev) for policy in self._policies) or []

    # --- what the policies rely on ---
    def _folded_into(self, slot: int) -> bool:
        """A lost input's bytes are spread over ``slot`` (a fold or an absorb relies on it)."""
        return any(policy.folds_into(slot) for policy in self._policies)

    def _fail(self, error: HopliteError) -> list[Instruction]:
        self.error = error
        out: list[Instruction] = []
        waits = [*self._waiting, *self._repairs.wanted, *sorted(self._repairs.rewaiting)]
        if waits:
            out.append(CancelWaits(tuple(waits)))
            self._waiting.clear()
            self._repairs.wanted.clear()
            self._repairs.rewaiting.clear()
        return out + [Fail(error)] + self._release()

    def _release(self) -> list[Instruction]:
        """Every task node not declared dead is told: one only given up on (unreachable, or
        dead in another node's view) may still hold pinned buffers of ours."""
        nodes = tuple(n for n in self.task_nodes if n not in self.declared)
        return [Release(nodes)] if nodes else []


# Each event's handler: the core's, the repairs' (failures and deaths), the combiner's (a held
# input's time over); complete for ``Event`` (tests/unit/test_reduce_plan_invariants.py).
EVENT_HANDLERS: dict[type, Callable[[ReducePlan, Any], list[Instruction]]] = {
    InputReady: ReducePlan._input_ready, TaskStarted: ReducePlan._task_started,
    Folded: ReducePlan._folded, FoldFailed: ReducePlan._fold_failed,
    Reshaped: ReducePlan._reshaped, ResultComplete: ReducePlan._result_complete,
    ResultFailed: ReducePlan._result_failed, Published: ReducePlan._published,
    HoldOver: lambda plan, ev: plan._late_inputs.hold_over(ev),
    InputFailed: lambda plan, ev: plan._repairs.input_failed(ev),
    SlotFailed: lambda plan, ev: plan._repairs.slot_failed(ev),
    ChildLost: lambda plan, ev: plan._repairs.child_lost(ev),
    Retry: lambda plan, ev: plan._repairs.retry(ev),
    NodeDied: lambda plan, ev: plan._repairs.node_lost(ev),
    NodeSuspected: lambda plan, ev: plan._repairs.node_lost(ev),
    NodeTrusted: lambda plan, ev: plan._repairs.node_trusted(ev)}


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
