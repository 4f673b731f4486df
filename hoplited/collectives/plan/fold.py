"""Folds (docs/design.md §5, "Folding a lost input"). A lost input back on a node that computes
another slot is added into that slot from the first byte it has not combined (``Fold``), and the
lost slot's consumer takes the lost slot's children from the fold's element on (``Reshape``),
plus the input's own bytes up to where the fold took effect; on a node where only a leaf runs,
the lost slot is placed there and takes the leaf's input over from where the leaf's consumer
stopped adding it. Either way that node's link carries one stream. A later loss that a fold
relies on starts the result again from byte 0 (``Repair.restart_all``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from hoplited.collectives.plan.model import (
    Absorb,
    ChildLost,
    Connect,
    Fold,
    Folded,
    FoldFailed,
    FoldState,
    InputReady,
    Instruction,
    Redo,
    Reshape,
    Reshaped,
    Retry,
    Slot,
    TaskStarted,
    redo_path,
)
from hoplited.collectives.plan.policy import Policy

if TYPE_CHECKING:
    from hoplited.collectives.plan import ReducePlan


class Folding(Policy):
    """The folds and absorbs of ``plan`` (its folding, folded and absorbing slots)."""

    def __init__(self, plan: ReducePlan, inputs: int) -> None:
        self.plan = plan
        # with backups, a lost slot may restart from 0; in a stripe, a fold's consumer may
        # have to pull the input's own bytes, which only a slot reads at the window's offset
        self._may_fold = inputs == plan.k and plan.window is None

    # --- hooks ---
    def on_put_back(self, slot: int, node: str, ev: InputReady, redo: Redo,
                    alone: bool) -> list[Instruction] | None:
        """Fold ``ev`` into a slot ``node`` computes, or absorb a leaf there; None if
        neither can be done."""
        shape = self.plan.shape
        assert shape is not None
        into = self._fold_target(slot, node, redo.start) if alone else None
        if into is not None:
            return self._fold(slot, redo, into, node, ev)
        # a leaf placed has no task to add another input to
        leaf = self._absorb_target(node) if alone and shape.children[slot] else None
        if leaf is not None:
            return self._absorb(slot, redo, leaf, node, ev)
        return None

    def on_task_started(self, ev: TaskStarted, placed: Slot) -> list[Instruction] | None:
        """A slot that absorbs a leaf's input: that input first, then its edges."""
        absorb = self.plan._absorbing.get(ev.slot)
        if absorb is None or absorb.cut < 0:
            return None
        absorb.version = ev.version
        return [Fold(ev.slot, ev.slot, placed.node, ev.version, absorb.leaf_input,
                     absorb.leaf_version, absorb.cut)]

    def folds_into(self, slot: int) -> bool:
        """A lost input's fold or a leaf's absorption relies on ``slot``."""
        plan = self.plan
        absorbs = [*plan._absorbed.values(), *plan._absorbing.values()]
        return any(slot in (f.into, f.parent) or (f.slot in plan._folding and slot in f.children)
                   for f in [*plan._folds.values(), *plan._folding.values()]) or any(
            slot in (a.slot, a.leaf, a.consumer) for a in absorbs)

    def relies_on(self, slot: int) -> bool:
        """A fold went into ``slot``, or a fold's consumer or lost children are it."""
        return self.folds_into(slot)

    def relies_on_node(self, node: str) -> bool:
        """Nodes whose loss a fold cannot survive: where its input was added, its consumer,
        and (until it is in effect) the lost slot's children."""
        plan = self.plan
        nodes: set[str] = set()
        for fold in [*plan._folds.values(), *plan._folding.values()]:
            slots = [fold.parent] + (fold.children if fold.slot in plan._folding else [])
            nodes.add(fold.node)
            nodes.update(plan._slots[s].node for s in slots if s in plan._slots)
        for absorb in [*plan._absorbed.values(), *plan._absorbing.values()]:
            nodes.add(absorb.node)
            if absorb.consumer in plan._slots:
                nodes.add(plan._slots[absorb.consumer].node)
        return node in nodes

    def on_child_lost(self, ev: ChildLost) -> list[Instruction] | None:
        """The pull of a folded input's bytes below its fold (a child key beyond the slots)
        broke: reconnected while its node looks alive, else everything starts again."""
        plan = self.plan
        if plan.shape is None or ev.child < plan.shape.size:
            return None
        fold = plan._folds.get(ev.child - plan.shape.size)
        consumer = None if fold is None else plan._slots.get(fold.parent)
        if (plan.complete or fold is None or consumer is None or ev.parent != fold.parent
                or ev.version != fold.version or ev.consumer != consumer.version):
            return []
        if ev.source_dead:
            plan.dead.add(fold.node)
        if fold.node in plan.dead or consumer.node in plan.dead:
            return plan._repairs.restart_all()
        return plan._repairs.reconnect(ev, fold.node)

    def on_retry(self, ev: Retry) -> list[Instruction] | None:
        """The pull of a folded input's bytes below its fold, reconnected."""
        plan = self.plan
        shape = plan.shape
        if shape is None or ev.child < shape.size:
            return None
        fold = plan._folds.get(ev.child - shape.size)
        if (plan.complete or fold is None or fold.version != ev.version
                or plan._repairs.broken.pop(ev.child, None) is None):
            return []
        return self._extra_connect(fold)

    def on_folded(self, ev: Folded) -> list[Instruction] | None:
        """The input is in ``into``'s sums from ``ev.at``: reshape the consumer."""
        plan = self.plan
        if ev.slot in plan._absorbing:
            return self._absorb_folded(ev)
        fold = plan._folding.get(ev.slot)
        consumer = None if fold is None else plan._slots.get(fold.parent)
        if (plan.complete or fold is None or fold.into != ev.into or fold.at >= 0
                or consumer is None or consumer.version is None):
            return []
        fold.at = max(ev.at, fold.start)
        more = len(fold.children) + (1 if fold.at > fold.start else 0)
        return [Reshape(fold.parent, consumer.node, consumer.version, ev.slot, fold.start, more)]

    def on_fold_failed(self, ev: FoldFailed) -> list[Instruction] | None:
        """The slot to fold into is gone: the lost slot is placed as usual after all (a leaf's
        consumer already stopped adding its input: everything starts again)."""
        plan = self.plan
        if ev.slot in plan._absorbing and not plan.complete:
            return plan._repairs.restart_all()
        fold = plan._folding.get(ev.slot)
        if plan.complete or fold is None:
            return []
        plan._lift(ev.slot)
        if fold.node in plan.dead:
            return plan._repairs.want(fold.slot, Redo(fold.input, fold.node, fold.gen, fold.start))
        return plan._put(fold.slot, fold.node, fold.input, fold.version, fold.gen, fold.start)

    def on_reshaped(self, ev: Reshaped) -> list[Instruction] | None:
        """The consumer took the new shape: the lost slot's children hang on it from the fold
        on, and it pulls the input's bytes the fold came too late for."""
        plan = self.plan
        shape = plan.shape
        cut = [a for a in plan._absorbing.values() if a.leaf == ev.slot and a.cut < 0]
        if cut and not plan.complete:
            return self._cut(cut[0], ev.until)
        fold = plan._folding.get(ev.slot)
        if plan.complete or shape is None or fold is None or fold.at < 0:
            return []
        consumer = plan._slots.get(fold.parent)
        children = [plan._slots.get(c) for c in fold.children]
        if consumer is None or any(c is None or c.version is None for c in children):
            return plan._repairs.restart_all()
        plan._move(ev.slot, "folded", fold)
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

    def on_restart(self, placed: Mapping[int, Slot]) -> None:
        """Folds no more: the restart places every slot from byte 0."""
        self._may_fold = False

    # --- folds (docs/design.md §5, "Folding a lost input") ---
    def _fold_target(self, slot: int, node: str, start: int) -> int | None:
        """The slot on ``node`` that lost ``slot``'s input can be added into, so ``node``'s
        link carries one stream, not two (None: place the slot as usual). Its consumer must
        be a live task and every child of it live with output from ``start`` on; among the
        slots ``node`` computes, an ancestor is best: it has not combined past ``start``."""
        plan = self.plan
        shape = plan.shape
        assert shape is not None
        parent = shape.parent[slot]
        consumer = None if parent is None else plan._slots.get(parent)
        if (not self._may_fold or plan._folding or consumer is None or not consumer.task
                or consumer.version is None or consumer.node in plan.dead):
            return None
        aligned = plan._aligned(start)
        for child in shape.children[slot]:
            c = plan._slots.get(child)
            if c is None or c.version is None or c.node in plan.dead or c.start > aligned:
                return None
        hosted = sorted(s for s, placed in plan._slots.items()
                        if placed.node == node and placed.task and placed.version is not None)
        ancestors = [s for s in redo_path(shape, slot)[1:] if s in hosted]
        best = ancestors or hosted
        return best[0] if best else None

    def _fold(self, slot: int, redo: Redo, into: int, node: str,
              ev: InputReady) -> list[Instruction]:
        plan = self.plan
        shape = plan.shape
        parent = None if shape is None else shape.parent[slot]
        target = plan._slots[into]
        assert shape is not None and parent is not None and target.version is not None
        fold = FoldState(slot, ev.oid, ev.version, node, into, parent,
                         plan._aligned(redo.start), redo.gen, list(shape.children[slot]))
        plan._move(slot, "folding", fold)
        return [Fold(slot, into, node, target.version, ev.oid, ev.version, fold.start)]

    def _absorb_target(self, node: str) -> int | None:
        """The leaf on ``node`` whose input a lost slot placed there can take over, when no
        slot there computes (None: no such leaf, or its consumer is not a live task)."""
        plan = self.plan
        shape = plan.shape
        if shape is None or not self._may_fold or plan._folding or plan._absorbing:
            return None
        taken = {a.leaf for a in plan._absorbed.values()}
        for leaf in sorted(plan._leaves.get(node, ())):  # the node's leaves only: a reduce of
            # thousands of inputs put again after a loss asks this once per input
            parent = shape.parent[leaf]
            if leaf in taken:
                continue
            consumer = None if parent is None else plan._slots.get(parent)
            if (consumer is not None and consumer.task and consumer.version is not None
                    and consumer.node not in plan.dead):
                return leaf
        return None

    def _absorb(self, slot: int, redo: Redo, leaf: int, node: str,
                ev: InputReady) -> list[Instruction]:
        """Ask the leaf's consumer to stop adding the leaf's input where it is (the lost slot
        is placed once it answered)."""
        plan = self.plan
        shape = plan.shape
        placed = plan._slots[leaf]
        parent = None if shape is None else shape.parent[leaf]
        consumer = None if parent is None else plan._slots.get(parent)
        assert parent is not None and consumer is not None and consumer.version is not None
        plan._move(slot, "absorbing", Absorb(slot, node, ev.oid, ev.version, redo.gen,
                                             redo.start, leaf, placed.input,
                                             placed.version or b"", parent))
        # not below the slot's start: the leaf may be on another branch, whose bytes below
        # it the lost slot's consumer never had; and from a whole element *above* it when the
        # consumer stopped inside one: the lost slot's new output must hold the old value up
        # to that element's end, which the consumer completes from it
        start = plan._aligned(redo.start + plan._item() - 1)
        # nor below the byte the consumer reads the leaf from: a fold hung the leaf on it
        # from the fold's start, and below that the leaf came in the folded slot's old sums
        start = max([start] + [f.start for f in plan._folds.values()
                               if f.parent == parent and leaf in f.children])
        # nor below where a slot on the leaf's way up to the lost slot's (up to where the two
        # ways meet) computes from: below it, its consumer holds an older placement's sums,
        # which have the leaf's input in them already
        assert shape is not None
        ours = set(redo_path(shape, slot))
        up: int | None = parent
        while up is not None and up not in ours:
            placed_up = plan._slots.get(up)
            redone = plan._redo.get(up)
            start = max(start, plan._aligned(placed_up.start if placed_up is not None
                                             else redone.start if redone is not None else 0))
            up = shape.parent[up]
        return [Reshape(parent, consumer.node, consumer.version, leaf, start, 0)]

    def _cut(self, absorb: Absorb, until: int) -> list[Instruction]:
        """The leaf's consumer adds its input below ``until`` only: place the lost slot."""
        absorb.cut = until
        return self.plan._put(absorb.slot, absorb.node, absorb.input, absorb.input_version,
                              absorb.gen, absorb.start)

    def _absorb_folded(self, ev: Folded) -> list[Instruction]:
        """The leaf's input is in the placed slot's sums: its edges may carry bytes now."""
        plan = self.plan
        absorb = plan._absorbing.get(ev.slot)
        placed = plan._slots.get(ev.slot)
        if absorb is None or absorb.version is None or placed is None or placed.gen != absorb.gen:
            return []
        plan._absorb_done(ev.slot)
        placed.version = absorb.version
        return plan._links(ev.slot)

    def _extra_connect(self, fold: FoldState) -> list[Instruction]:
        """The consumer pulls the input's bytes from the fold's start to where it took
        effect, under a child key beyond the slots (none if it took effect at the start)."""
        plan = self.plan
        shape = plan.shape
        consumer = plan._slots.get(fold.parent)
        if shape is None or consumer is None or fold.at <= fold.start:
            return []
        return [Connect(fold.parent, consumer.node, shape.size + fold.slot, fold.node,
                        fold.input, fold.version, fold.start, fold.at)]
