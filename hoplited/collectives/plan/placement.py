"""Arrival order -> slot: the tree a reduce's inputs fill (:mod:`hoplited.collectives.tree`) and
which free slot each input takes as it becomes ready (docs/design.md §4): an input held here
takes the root while it is free (the result is then computed in place, and this node's link
carries no second stream), otherwise the first free non-root slot in readiness order, in a tree
of halves its fill order, or with a ring the slot nearest its node's place after this node; the
root last."""

from __future__ import annotations

import math
from collections.abc import Callable

from hoplited.collectives.plan.model import ReduceSpec
from hoplited.collectives.tree import (
    TreeShape,
    pair_shape,
    tree_shape,
    two_tree_fill,
    two_tree_shape,
)


class Placement:
    """Slot choice for a plan of ``k`` slots coordinated on ``me``, as ``spec`` says;
    ``depth(k, size)`` is the tree depth the link model picks, ``taken(slot)`` whether a
    slot has an input (once taken, a slot stays taken but for ``free``)."""

    def __init__(self, k: int, me: str, spec: ReduceSpec, depth: Callable[[int, int], int],
                 taken: Callable[[int], bool]) -> None:
        self.k, self.me, self._depth, self._taken = k, me, depth, taken
        self.half, self.ring, self.combiner, self.late = (spec.half, spec.ring, spec.combiner,
                                                          spec.late)
        self.last_leaf = False  # the tree's shape: see tree_shape
        self._low = 0  # every slot below this one is taken or the root (placement scans on)
        self._fill: list[int] | None = None  # a tree of halves' fill order, once needed
        self._fill_at = 0  # every slot before this place in it is taken

    def new_shape(self, size: int) -> TreeShape:
        """A new tree for inputs of ``size`` bytes, every slot free: one of two trees of
        halves, a combiner's chain and leaves, or the chain or full tree the link model
        picks."""
        self._low, self._fill, self._fill_at = 0, None, 0  # its root may be another slot
        if self.half is not None:
            return two_tree_shape(self.k)
        if self.combiner:
            return pair_shape(self.k, self.late)
        return tree_shape(self.k, self._depth(self.k, size), self.last_leaf)

    def slot_for(self, shape: TreeShape, node: str, local: bool) -> int:
        """The slot an input ready on ``node`` takes (``local``: it is held here)."""
        first = self._first_free(shape)
        if local and not self._taken(shape.root):
            return shape.root
        if first is not None and self.half is not None:
            return self._next_in_fill(shape, first)
        if first is not None:
            return self._ring_slot(shape, node, first)
        return shape.root

    def free(self, slot: int) -> None:
        """``slot`` is free again (a leaf placed ahead whose input did not come there)."""
        self._low = min(self._low, slot)

    def _first_free(self, shape: TreeShape) -> int | None:
        """The lowest free slot other than the root (None if there is none)."""
        while self._low < shape.size and (self._low == shape.root or self._taken(self._low)):
            self._low += 1
        return self._low if self._low < shape.size else None

    def _next_in_fill(self, shape: TreeShape, first: int) -> int:
        """The first free slot in this tree of halves' fill order, which lists the non-root
        slots (``first`` if none is free)."""
        if self._fill is None:
            assert self.half is not None
            self._fill = two_tree_fill(shape.size, self.half)
        fill = self._fill
        while self._fill_at < len(fill) and self._taken(fill[self._fill_at]):
            self._fill_at += 1
        return fill[self._fill_at] if self._fill_at < len(fill) else first

    def _ring_slot(self, shape: TreeShape, node: str, first: int) -> int:
        """The free non-root slot for an input on ``node``: in readiness order (``first``),
        or with a ring, the one nearest the node's place after this node (so each stripe's
        chain runs round the ring and ends here), the lower on a tie."""
        ring = self.ring
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
