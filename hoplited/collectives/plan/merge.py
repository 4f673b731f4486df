"""Several inputs on one node (docs/design.md §4). An input ready on a node that already has
a slot is added by that slot instead of taking one of its own, so the node's link carries one
stream: the slot it would have taken leaves the tree (its children hang on its parent) and
the host adds it from its start, by a ``Fold`` while the host's task has not been told of
every child (it cannot have combined a byte), or else by placing the host again with the
input among its ``extras``, together with the slots above it up to one whose consumer has
read nothing (at most ``MERGE_REACH``). Losing a host loses all its inputs: the result starts
again from byte 0, each of them waited for as an input of its own (``Repair.restart_all``).
Each edge names the placement of its parent it is meant for, so a task placed again never resumes
a pull of the old value.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from hoplite_client.wire.errors import ObjectNotFoundError
from hoplited.collectives.plan.model import (
    Connect,
    Fold,
    Folded,
    FoldFailed,
    InputReady,
    Instruction,
    Merge,
    Redo,
    ReduceSpec,
    Reshape,
    Slot,
    drive,
)
from hoplited.collectives.plan.policy import Policy

if TYPE_CHECKING:
    from hoplited.collectives.plan import ReducePlan

# The most slots placed again so that a slot adds an input put on its node: it and those
# above it whose consumers have read nothing yet, each pulling its children again from byte
# 0 (docs/design.md §4, "Several inputs on one node").
MERGE_REACH = 4


class Merging(Policy):
    """The merges of ``plan``: an input put where a slot can still add it from its start."""

    def __init__(self, plan: ReducePlan, spec: ReduceSpec, inputs: int) -> None:
        self.plan = plan
        # merges add an input from the host's start: never once a slot computes from a later
        # byte (its consumer holds earlier sums without the input); with backups a lost
        # host's inputs are waited for as themselves (a restart), which backups could replace
        self._enabled = (spec.merge and not spec.combiner and spec.half is None
                         and inputs == plan.k)
        self._may_merge = self._enabled  # until a slot computes from a later byte
        self.merges = 0  # inputs merged into another's slot so far (status, metrics)
        self._apart: list[tuple[Merge, str]] = []  # merges a restart undid, to place again

    # --- hooks ---
    def on_place(self, slot: int, node: str, ev: InputReady) -> list[Instruction] | None:
        host = self._host(node) if node in ev.alive and self._removable(slot) else None
        if host is None:
            return None
        return self._merge(Merge(slot, host[0], ev.oid, ev.version), host[1])

    def on_put_back(self, slot: int, node: str, ev: InputReady, redo: Redo,
                    alone: bool) -> list[Instruction] | None:
        host = self._host(node) if redo.start == 0 and self._removable(slot) else None
        if host is None:
            return None
        return self._merge(Merge(slot, host[0], ev.oid, ev.version, redo.gen), host[1])

    def on_put(self, slot: int, start: int) -> None:
        if start > 0:
            self._may_merge = False

    def on_task_edges(self, slot: int) -> list[Instruction]:
        return self._tell_extras(slot)

    def relies_on(self, slot: int) -> bool:
        """A merge went into ``slot``: its inputs are lost with it."""
        placed = self.plan._slots.get(slot)
        return placed is not None and bool(placed.extras)

    def on_folded(self, ev: Folded) -> list[Instruction] | None:
        return self._answered(ev) if ev.slot in self.plan._merged else None

    def on_fold_failed(self, ev: FoldFailed) -> list[Instruction] | None:
        return self._answered(ev) if ev.slot in self.plan._merged else None

    def on_restart(self, placed: Mapping[int, Slot]) -> None:
        """Every merge is made again in the new shape where its host lives on (in the order
        they were made: hosts add their extras in it); the others are lifted, their inputs
        to take their own slots (``after_restart``)."""
        plan = self.plan
        self._may_merge = self._enabled  # every slot is placed anew from byte 0
        for merge in list(plan._merged.values()):
            host = placed.get(merge.host)
            node = "" if host is None else host.node  # "": not placed (waited for anywhere)
            lacking = {*plan._repairs.lacking.get(merge.input, ()),
                       *(() if host is None else plan._repairs.lacking.get(host.input, ()))}
            if host is None or node in plan.dead or node in lacking:
                plan._lift(merge.slot)
                self._apart.append((merge, node))
            else:
                self._remove(merge.slot)

    def after_restart(self) -> list[Instruction]:
        plan = self.plan
        out: list[Instruction] = []
        apart, self._apart = self._apart, []
        for merge, node in apart:
            if not node or node in plan.dead or node in plan._repairs.lacking.get(merge.input, ()):
                out += plan._repairs.want(merge.slot, Redo(merge.input, node, merge.gen, 0))
            else:
                out += plan._put(merge.slot, node, merge.input, merge.version, merge.gen, 0)
        return out

    # --- several inputs on one node ---
    def _host(self, node: str) -> tuple[int, list[int]] | None:
        """A slot on ``node`` that can still add another input from its start, so that
        ``node``'s link carries one stream, and the slots to place again for it: none for a
        task that cannot have combined a byte yet (it was not told of every child), else the
        slot and those above it up to one whose consumer has read nothing (``_unread``).
        None: there is no such slot."""
        plan = self.plan
        shape = plan.shape
        if not self._may_merge or shape is None or node in plan.dead:
            return None
        best: tuple[int, list[int]] | None = None  # the fewest slots placed again
        for slot in sorted(plan._hosts.get(node, set()) | plan._leaves.get(node, set())):
            placed = plan._slots[slot]
            if placed.input == plan.result or plan._folded_into(slot):
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
        plan = self.plan
        shape = plan.shape
        assert shape is not None
        path = [slot]
        while True:
            top = path[-1]
            placed = plan._slots[top]
            if placed.output == plan.result:  # the root computed in place: its sums are
                # the result's bytes, read by gets; none yet while it has combined nothing
                return path if any(c not in placed.fed for c in shape.children[top]) else []
            if not placed.connected:
                return path
            parent = shape.parent[top]
            above = None if parent is None else plan._slots.get(parent)
            if (parent is None or above is None or not above.task or above.node in plan.dead
                    or plan._folded_into(parent) or len(path) >= MERGE_REACH):
                return []
            path.append(parent)

    def _removable(self, slot: int) -> bool:
        """``slot``, about to take an input (a free slot, or a lifted one whose lost input is
        back), can leave the tree, its children hung on its parent: it is not the root, and
        its parent's task, if placed, was never told of it and either keeps its number of
        children or, ``slot`` being a leaf, is told to count it cut (``_merge``). A parent
        waiting to be placed again counts its children once placed."""
        plan = self.plan
        shape = plan.shape
        assert shape is not None
        parent = shape.parent[slot]
        if not self._may_merge or parent is None:
            return False
        placed = plan._slots.get(parent)
        if placed is None:
            return (not plan._taken(parent) or parent in plan._redo
                    or len(shape.children[slot]) == 1)
        if slot in placed.fed:
            return False
        return len(shape.children[slot]) == 1 or (
            not shape.children[slot] and placed.version is not None
            and not plan._folded_into(parent))

    def _remove(self, slot: int) -> None:
        """Take free ``slot`` out of the tree: its children take its place under its parent
        (the shape is the plan's own: built for it, and anew by a restart)."""
        shape = self.plan.shape
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
        plan = self.plan
        shape = plan.shape
        assert shape is not None
        children = list(shape.children[merge.slot])
        parent = shape.parent[merge.slot]
        self._remove(merge.slot)
        plan._move(merge.slot, "merged", merge)
        self.merges += 1
        host = plan._slots[merge.host]
        host.extras += (merge,)
        out: list[Instruction] = []
        for slot in again:  # the host first, a task that adds every input from byte 0
            out += drive(plan._repairs.restart_steps(slot))
        if not again:  # it has combined nothing yet
            out += self._tell_extras(merge.host)
        assert parent is not None
        consumer = plan._slots.get(parent)
        if not children and consumer is not None and consumer.version is not None:
            # a leaf its consumer's task counts among its children (not placed again above):
            # it ends before any byte, so the task waits for it no more
            out.append(Reshape(parent, consumer.node, consumer.version, merge.slot, 0, 0))
        for child in children:  # the parent reads them now, wherever the slot was to be
            placed = plan._slots.get(child)
            if (consumer is not None and consumer.version is not None and placed is not None
                    and placed.version is not None):
                placed.connected = True
                out.append(Connect(parent, consumer.node, child, placed.node, placed.output,
                                   placed.version))
        return out

    def _tell_extras(self, slot: int) -> list[Instruction]:
        """Folds of the inputs merged into ``slot`` that its task does not know yet, from its
        start (none before the task exists: they follow its ``TaskStarted``)."""
        plan = self.plan
        placed = plan._slots[slot]
        if placed.version is None:
            return []
        out: list[Instruction] = [
            Fold(m.slot, slot, placed.node, placed.version, m.input, m.version,
                 plan._aligned(placed.start)) for m in placed.extras[placed.told:]]
        placed.told = len(placed.extras)
        return out

    def _answered(self, ev: Folded | FoldFailed) -> list[Instruction]:
        """A merge's fold into the current task took effect late (its host combined first:
        the input's first bytes are in no sum) or failed: the result starts again from byte
        0, every merge still possible made again, the others' inputs placed as slots."""
        plan = self.plan
        merge = plan._merged[ev.slot]
        host = plan._slots.get(merge.host)
        if (plan.complete or host is None or host.version != ev.version
                or host.node in plan.dead):
            return []  # a task placed again since knew its extras; a death is handled as such
        if isinstance(ev, Folded):
            if ev.at <= plan._aligned(host.start):
                return []
        elif isinstance(ev.error, ObjectNotFoundError) and ev.error.data.get(
                "oid") == merge.input.hex():
            plan._repairs.lacking.setdefault(merge.input, set()).add(host.node)
        return plan._repairs.restart_all()
