"""A combiner's late inputs (docs/design.md §4, "Three combiners", "Who pulls a late input
first", "The last input's leaf placed ahead"): a plan with ``ReduceSpec.combiner`` holds a late
input of another node while its own is missing, sends its chain's first edge ahead of the
other stripes', and places the last input's leaf ahead on the node guessed to put it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hoplite_client.wire.errors import ObjectNotFoundError
from hoplite_client.wire.ids import ObjectID
from hoplited.collectives.plan.model import (
    After,
    ChildLost,
    HoldOver,
    Hurry,
    InputReady,
    Instruction,
    ReduceSpec,
    WaitInput,
)
from hoplited.collectives.plan.policy import Policy

if TYPE_CHECKING:
    from hoplited.collectives.plan import ReducePlan

# A trio's combiner whose own input is missing holds a late input of another node while a
# third combiner's input is ready, for this many of its stripe's transfers per such input, or
# until its own is put: that node's uplink then feeds the combiner that has put first
# (docs/design.md §4, "Three combiners", "Who pulls a late input first").
LATE_HOLD = 1.25


class LateInputs(Policy):
    """The late inputs of ``plan``, a combiner's if ``spec.combiner`` (else it takes none)."""

    def __init__(self, plan: ReducePlan, spec: ReduceSpec) -> None:
        self.plan = plan
        self.combiner, self.late, self.rate = spec.combiner, spec.late, spec.rate
        self.held: dict[ObjectID, InputReady] = {}  # late inputs held (LATE_HOLD), in order
        self._own = False  # an input on this node was ready (a combiner's own)
        self._late_nodes: list[tuple[str, ...]] = []  # the late inputs' holders so far
        # guessed to put the late inputs
        self.late_nodes = spec.late_nodes if spec.combiner else ()
        self.ahead: set[ObjectID] = set()  # inputs whose leaves were placed ahead
        self.aheads = 0  # leaves placed ahead so far (status, metrics)
        self.holds = 0  # late inputs held (LATE_HOLD) so far (status, metrics)
        self.hurried = 0  # early chains sent ahead of their siblings (Hurry; status, metrics)

    # --- hooks ---
    def on_ready(self, ev: InputReady) -> list[Instruction] | None:
        """A leaf placed ahead; for a combiner, any first-time input (held, if it holds it);
        None otherwise (no backup is waited for again: a combiner uses every input)."""
        if ev.oid in self.ahead:
            return self._ahead_ready(ev)
        if not self.combiner:
            return None
        out = self._hold(ev) if self._holds(ev) else self._unheld(ev)
        return out + self._place_ahead()

    def on_input_back(self, ev: InputReady) -> None:
        self.ahead.discard(ev.oid)

    def on_node_lost(self) -> list[Instruction]:
        """A repair sees every input placed: held inputs go first."""
        return self._release_held()

    def on_no_input(self, ev: ChildLost) -> list[Instruction] | None:
        if self._ahead(ev.child) and isinstance(ev.error, ObjectNotFoundError):
            return self._unplace_ahead(ev.child)
        return None

    def hold_over(self, ev: HoldOver) -> list[Instruction]:
        """A held input's time is up: it is placed now."""
        plan = self.plan
        held = self.held.pop(ev.oid, None)
        return [] if held is None else plan._ready(held) + self._place_ahead()

    # --- a trio's late inputs (docs/design.md §4, "Who pulls a late input first") ---
    def _holds(self, ev: InputReady) -> bool:
        """Whether this combiner holds late input ``ev``: one of a trio's last three, on
        another node, while this node's own is missing and a third node's is ready."""
        plan = self.plan
        if (not self.combiner or self.late < 3 or self.rate <= 0 or self._own
                or plan.meta is None or ev.oid in self.held or plan.me in ev.holders
                or not self._late(ev)):
            return False
        return any(self._third(nodes, ev) for nodes in self._late_nodes)

    def _late(self, ev: InputReady) -> bool:
        """``ev`` is awaited and comes after the chain's inputs: one of the last ``late``."""
        plan = self.plan
        return (ev.oid in plan._waiting
                and len(plan.used) + len(self.held) >= plan.k - self.late)

    def _third(self, nodes: tuple[str, ...], ev: InputReady) -> bool:
        """``nodes`` hold a late input of neither this node nor ``ev``'s."""
        return self.plan.me not in nodes and not set(nodes) & set(ev.holders)

    def _hold(self, ev: InputReady) -> list[Instruction]:
        """Hold ``ev`` for ``LATE_HOLD`` of a stripe's transfer per third node ready."""
        meta = self.plan.meta
        assert meta is not None
        self.held[ev.oid] = ev
        self.holds += 1
        thirds = sum(self._third(nodes, ev) for nodes in self._late_nodes)
        self._late_nodes.append(ev.holders)
        return [After(LATE_HOLD * thirds * meta.size / self.rate, HoldOver(ev.oid))]

    def _unheld(self, ev: InputReady) -> list[Instruction]:
        """``ev`` as usual; this node's own input releases every late input held, and if it
        is the first of the late inputs, sends this stripe's early chain ahead."""
        plan = self.plan
        late = self._late(ev)
        if late:
            self._late_nodes.append(ev.holders)
        out = plan._ready(ev)
        if plan.me in ev.holders:
            self._own = True
            out += self._release_held()
            if late and all(plan.me in nodes for nodes in self._late_nodes):
                out += self._hurry()
        return out

    def _hurry(self) -> list[Instruction]:
        """The chain's first edge (slot 0 into slot 1, on the nodes of the first two inputs)
        goes ahead of the other stripes' (``Hurry``), if this is a trio's combiner whose chain
        has such an edge, told to its task already."""
        plan = self.plan
        if (not self.combiner or self.late < 3 or self.rate <= 0 or plan.shape is None
                or plan.shape.root < 2):
            return []
        head, parent = plan._slots.get(0), plan._slots.get(1)
        if (head is None or parent is None or parent.version is None
                or 0 not in parent.fed):
            return []
        self.hurried += 1
        return [Hurry(1, parent.node, 0, parent.version)]

    def _release_held(self) -> list[Instruction]:
        """Every held late input, in the order they came ready."""
        held, self.held = list(self.held.values()), {}
        return [ins for ev in held for ins in self.plan._ready(ev)]

    # --- the last input's leaf placed ahead (docs/design.md §4) ---
    def _place_ahead(self) -> list[Instruction]:
        """Place the one missing input's leaf on the one guessed node that has put no late
        input yet, if that is another node: its consumer's pull (version ``b""``) waits there
        for the input, so its bytes leave as it is sealed, with no control message between."""
        plan = self.plan
        if (not self.late_nodes or plan.shape is None or plan.meta is None or self.held
                or plan.error is not None or len(plan._waiting) != 1):
            return []
        (oid, times), = plan._waiting.items()
        seen = {node for nodes in self._late_nodes for node in nodes}
        left = [n for n in self.late_nodes if n not in seen and n not in plan.dead]
        if times != 1 or len(left) != 1 or left[0] == plan.me:
            return []
        w = plan.whole
        assert w is not None
        self.ahead.add(oid)
        self.aheads += 1
        return plan._ready(InputReady(oid, (left[0],), (left[0],), w.size, w.dtype, w.shape,
                                      b""))

    def _ahead(self, slot: int) -> bool:
        """``slot`` is a leaf placed ahead: its input's version is not known yet."""
        placed = self.plan._slots.get(slot)
        return placed is not None and not placed.task and placed.input in self.ahead

    def _ahead_ready(self, ev: InputReady) -> list[Instruction]:
        """An input placed ahead is ready: on the node guessed, its leaf reads it at this
        version from now on; elsewhere, the leaf moves to a live holder (a wrong guess costs
        the pull's start, nothing else: the guessed node had no byte of it)."""
        plan = self.plan
        self.ahead.discard(ev.oid)
        out: list[Instruction] = []
        for slot, placed in sorted(plan._slots.items()):
            if placed.task or placed.input != ev.oid:
                continue
            if placed.node in ev.alive and placed.node not in plan.dead:
                placed.input_version = ev.version
                continue
            plan._repairs.lacking.setdefault(ev.oid, set()).add(placed.node)
            out += [ins for ins in plan._repairs.repair(slot, 0)
                    if not (isinstance(ins, WaitInput) and ins.oid == ev.oid)]
        if ev.oid in plan._repairs.wanted:
            out += plan._repairs.replace(ev)
        return out

    def _unplace_ahead(self, slot: int) -> list[Instruction]:
        """The pull of a leaf placed ahead found no input there in time: the input is waited
        for as before it was placed (its wait at the shard still runs)."""
        plan = self.plan
        placed = plan._slots[slot]
        plan._move(slot, "free")
        self.ahead.discard(placed.input)
        plan._repairs.reconnects.pop(slot, None)
        plan._repairs.broken.pop(slot, None)
        plan.used.remove(placed.input)
        plan._waiting[placed.input] = 1
        plan._placement.free(slot)  # the slot is free again for the input's placing
        return []
