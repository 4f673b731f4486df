"""A reduce coordinator's decisions as a pure core: which inputs, slots, nodes and edges.

Theory of operation. Inputs become ready in any order; the first ``k`` are used, in readiness
order, and the rest are backups whose waits are cancelled once ``k`` are chosen. The first
ready input fixes the metadata: small inputs (at most ``INLINE_MAX``) come inline from their
shards and are combined here once ``k`` are chosen; larger ones open the result on this node
and fix a tree of ``k`` slots (:mod:`.tree`). Each input takes a slot as it becomes ready: an
input held here takes the root while it is free (the result is then computed in place, and
this node's link carries no second stream), otherwise the first free non-root slot, the root
last. A leaf not computed in place needs no task (its output is its input); any other slot
starts a task on its node. A parent learns where a child's output is once both tasks exist
(``TaskStarted``) and the child's version is known, so tasks can start concurrently and edges
are emitted exactly once in whatever order they complete. The root's output, unless it is the
result, is pulled into the result. A lost node holding a placed slot loses the partial sums
on that slot's path to the root (``redo_path``); for now the reduce then fails.

Nothing here waits or does I/O: ``ReducePlan.handle(event)`` returns the instructions the
driver (``hoplited.collectives.coordinator``) carries out, in order, feeding outcomes back as
events. ``history`` keeps the last (event, instructions) pairs for debugging.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from hoplite_client.wire.errors import HopliteError, InvalidArgumentError, PeerUnavailableError
from hoplite_client.wire.frames import INLINE_MAX
from hoplite_client.wire.ids import ObjectID
from hoplited.collectives.ops import check_op, check_reducible, derived_id
from hoplited.collectives.tree import TreeShape, tree_shape

# (event, instructions) pairs kept: a reduce of a few dozen inputs sends ~3 events per slot,
# so its whole story fits; a huge one keeps its end, where failures are (like dask's story).
HISTORY_MAX = 256


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
    """The task of ``slot`` exists on its node; its output has ``version``."""

    slot: int
    version: bytes


@dataclass(frozen=True, slots=True)
class SlotFailed:
    """The task of ``slot`` could not start, could not be connected, or failed later."""

    slot: int
    error: HopliteError


@dataclass(frozen=True, slots=True)
class NodeDied:
    """The membership declared ``node`` dead."""

    node: str


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


Event = (InputReady | InputFailed | TaskStarted | SlotFailed | NodeDied | ResultComplete
         | ResultFailed | Published)


# --- instructions: what the driver does, in order ---
@dataclass(frozen=True, slots=True)
class OpenResult:
    """Create the result here (pinned), announce it, and report ``ResultComplete`` when full."""

    size: int
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class StartTask:
    """Send ``ReduceTask`` to ``node`` (need not be awaited before the next instruction);
    report ``TaskStarted`` or ``SlotFailed``."""

    slot: int
    node: str
    input: ObjectID
    output: ObjectID
    op: str
    dtype: str
    shape: tuple[int, ...]
    children: int


@dataclass(frozen=True, slots=True)
class Connect:
    """Tell ``parent_node`` (``ReduceChild``) where a child's output is; failure: SlotFailed."""

    parent_slot: int
    parent_node: str
    child_node: str
    child_output: ObjectID
    child_version: bytes


@dataclass(frozen=True, slots=True)
class PullRoot:
    """Pull the root's output into the result; failure: ``ResultFailed``."""

    node: str
    output: ObjectID
    version: bytes


@dataclass(frozen=True, slots=True)
class CancelWaits:
    """Stop waiting for these inputs (backups, or the reduce failed)."""

    oids: tuple[ObjectID, ...]


@dataclass(frozen=True, slots=True)
class InputsChosen:
    """The inputs are chosen: ``reduced_inputs`` can answer ``used``."""

    used: tuple[ObjectID, ...]


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


Instruction = (OpenResult | StartTask | Connect | PullRoot | CancelWaits | InputsChosen
               | CombineInline | Publish | Fail | Release)


@dataclass(slots=True)
class Slot:
    """A placed slot: its node, input and output; ``version`` is None until its task started."""

    node: str
    input: ObjectID
    output: ObjectID
    version: bytes | None
    task: bool


def redo_path(shape: TreeShape, slot: int) -> list[int]:
    """The slots whose partial sums are lost with ``slot``'s: it and its ancestors, to the root."""
    path = [slot]
    parent = shape.parent[slot]
    while parent is not None:
        path.append(parent)
        parent = shape.parent[parent]
    return path


class ReducePlan:
    """One reduce into ``result`` coordinated on node ``me``; ``depth(k, size)`` is the tree
    depth for ``k`` inputs of ``size`` bytes (the driver's link model)."""

    def __init__(self, result: ObjectID, inputs: list[ObjectID], k: int, op: str, me: str,
                 depth: Callable[[int, int], int]) -> None:
        if not inputs or not 1 <= k <= len(inputs):
            raise InvalidArgumentError(f"num_objects must be between 1 and the "
                                       f"{len(inputs)} inputs")
        check_op(op)
        self.result, self.k, self.op, self.me, self._depth = result, k, op, me, depth
        self._waiting: dict[ObjectID, int] = {}  # input -> times listed, until ready
        for oid in inputs:
            self._waiting[oid] = self._waiting.get(oid, 0) + 1
        self.used: list[ObjectID] = []
        self.meta: InputReady | None = None
        self.shape: TreeShape | None = None
        self.slots: dict[int, Slot] = {}
        self.task_nodes: list[str] = []
        self.dead: set[str] = set()
        self.error: HopliteError | None = None
        self.complete = False
        self.published = False
        self.history: deque[tuple[Event, tuple[Instruction, ...]]] = deque(maxlen=HISTORY_MAX)

    @property
    def chosen(self) -> bool:
        """All ``k`` inputs are chosen (``used`` is final)."""
        return len(self.used) == self.k

    def handle(self, event: Event) -> list[Instruction]:
        """Apply ``event``; return the instructions to carry out, in order."""
        out: list[Instruction] = []
        if isinstance(event, NodeDied):
            self.dead.add(event.node)
        if self.error is None and not self.published:
            out = self._handle(event)
        self.history.append((event, tuple(out)))
        return out

    def _handle(self, ev: Event) -> list[Instruction]:
        if isinstance(ev, InputReady):
            return self._ready(ev)
        if isinstance(ev, InputFailed):
            if self._waiting.pop(ev.oid, 0) == 0:  # ready already, or a cancelled backup
                return []
            return self._fail(ev.error)
        if isinstance(ev, TaskStarted):
            slot = self.slots.get(ev.slot)
            if slot is None or not slot.task or slot.version is not None:
                return []
            slot.version = ev.version
            return self._links(ev.slot)
        if isinstance(ev, SlotFailed):
            return [] if self.complete else self._fail(ev.error)
        if isinstance(ev, NodeDied):
            return self._node_died(ev.node)
        if isinstance(ev, ResultComplete):
            if self.complete:
                return []
            self.complete = True
            return [Publish()]
        if isinstance(ev, ResultFailed):
            return self._fail(ev.error)
        self.published = True
        return self._release()

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
            except TypeError:  # numpy does not know the dtype at all
                return self._fail(InvalidArgumentError(f"cannot reduce dtype {ev.dtype}"))
            self.meta = ev
            if ev.size > INLINE_MAX:
                self.shape = tree_shape(self.k, self._depth(self.k, ev.size))
                out.append(OpenResult(ev.size, ev.dtype, ev.shape))
        elif (ev.dtype, ev.shape) != (self.meta.dtype, self.meta.shape):
            return self._fail(InvalidArgumentError(
                f"input {ev.oid.hex()} is {ev.dtype}{list(ev.shape)} but the first input was "
                f"{self.meta.dtype}{list(self.meta.shape)}", oid=ev.oid.hex()))
        for _ in range(min(times, self.k - len(self.used))):
            self.used.append(ev.oid)
            if self.shape is not None:
                out += self._place(ev)
        if self.chosen:
            if self._waiting:
                out.append(CancelWaits(tuple(self._waiting)))
                self._waiting.clear()
            out.append(InputsChosen(tuple(self.used)))
            if self.shape is None:
                m = self.meta
                out.append(CombineInline(tuple(self.used), self.op, m.size, m.dtype, m.shape))
        return out

    def _place(self, ev: InputReady) -> list[Instruction]:
        shape, me = self.shape, self.me
        assert shape is not None
        free = [s for s in range(shape.size) if s not in self.slots]
        others = [s for s in free if s != shape.root]
        local = me in ev.holders
        slot = shape.root if shape.root in free and local else (others or [shape.root])[0]
        alive = [n for n in ev.alive if n not in self.dead]
        node = me if local else (alive or list(ev.holders))[0]
        children = len(shape.children[slot])
        in_place = slot == shape.root and node == me
        if children == 0 and not in_place:  # a leaf's output is its input
            self.slots[slot] = Slot(node, ev.oid, ev.oid, ev.version, task=False)
            return self._links(slot)
        output = self.result if in_place else derived_id(self.result, slot, b"out")
        self.slots[slot] = Slot(node, ev.oid, output, None, task=True)
        if node not in self.task_nodes:
            self.task_nodes.append(node)
        return [StartTask(slot, node, ev.oid, output, self.op, ev.dtype, ev.shape, children)]

    def _links(self, slot: int) -> list[Instruction]:
        """Edges around ``slot`` (parent's first) and the root pull, that ``slot``'s placement or
        start just made possible: each becomes possible at exactly one such event, so once."""
        shape = self.shape
        assert shape is not None
        parent = shape.parent[slot]
        pairs = [(parent, slot)] if parent is not None else []
        out: list[Instruction] = []
        for p, c in pairs + [(slot, child) for child in shape.children[slot]]:
            ps, cs = self.slots.get(p), self.slots.get(c)
            if ps and cs and ps.version is not None and cs.version is not None:
                out.append(Connect(p, ps.node, cs.node, cs.output, cs.version))
        root = self.slots[slot]
        if slot == shape.root and root.version is not None and root.output != self.result:
            out.append(PullRoot(root.node, root.output, root.version))
        return out

    def _node_died(self, node: str) -> list[Instruction]:
        lost = sorted(s for s, placed in self.slots.items() if placed.node == node)
        if self.complete or not lost:
            return []
        assert self.shape is not None
        redo = sorted({s for slot in lost for s in redo_path(self.shape, slot)})
        return self._fail(PeerUnavailableError(
            f"node {node} died holding slot {lost[0]} of reduce {self.result.hex()}",
            node=node, slot=lost[0], redo=redo))

    def _fail(self, error: HopliteError) -> list[Instruction]:
        self.error = error
        out: list[Instruction] = []
        if self._waiting:
            out.append(CancelWaits(tuple(self._waiting)))
            self._waiting.clear()
        return out + [Fail(error)] + self._release()

    def _release(self) -> list[Instruction]:
        nodes = tuple(n for n in self.task_nodes if n not in self.dead)
        return [Release(nodes)] if nodes else []
