"""Repair (docs/design.md §5). A slot's *consumer* is its parent's task, or for the root the
pull into the result; it keeps every byte it received. When a consumer's pull breaks
(``ChildLost``) and the slot's node is dead, only that slot is redone: its input is waited for
again (another live copy, or the same id put again on another node, as a restarted task does)
and the slot is placed anew, computing from the byte where its consumer stopped; the consumer
resumes there. An id names one value, so the bytes before that offset are still right and no
partial sum on the path to the root is redone. Dead children of a redone slot are redone from
the same offset; a dead slot whose consumer already has every byte costs nothing. A pull that
broke while its source still looks alive is reconnected after a backoff, a few times. A lost
input that does not come back within the reduce's timeout fails the reduce, naming the dead
node.

A later loss that an optimisation relies on (a fold, a merge: ``Policy.relies_on``) starts
the result again from byte 0 (``Repair.restart_all``). The walks go through the tree as
generators (``Steps``), run on a stack of their own (``drive``): a repair goes as deep as a
run of lost slots.

Backups. With ``k`` below the number of inputs, a repair also waits again for the inputs not
used (their waits were cancelled once ``k`` were chosen); whichever comes first takes the lost
slot: the same id (resumed as above) or a backup, and a backup already ready is used at once.
A backup is another value, so the slot computes from byte 0; if its consumer had received
bytes of the lost value, so had every partial sum on the path to the root (``redo_path``):
those slots are started again from byte 0 on their nodes and the result restarts under a new
version (``RestartResult``; getters behind it start over). Every other slot keeps its output,
and children repaired earlier from a later byte are started again from 0. ``used`` names the
inputs in the result once it is complete.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hoplite_client.wire.errors import (
    ConnectionLostError,
    ObjectNotFoundError,
    PeerUnavailableError,
)
from hoplite_client.wire.ids import ObjectID
from hoplited.collectives.plan.model import (
    Absorb,
    After,
    CancelWaits,
    ChildLost,
    Connect,
    FoldState,
    InputFailed,
    InputReady,
    Instruction,
    NodeDied,
    NodeSuspected,
    NodeTrusted,
    PullRoot,
    Redo,
    RestartResult,
    Retry,
    Slot,
    SlotFailed,
    Steps,
    WaitInput,
    drive,
    redo_path,
)
from hoplited.collectives.plan.policy import first_answer

if TYPE_CHECKING:
    from hoplited.collectives.plan import ReducePlan

# A consumer's pull that broke while the source looked alive is reconnected after this delay,
# doubled each time up to RECONNECT_MAX, until the delays add up to the plan's ``patience``
# (the membership's verdict on a silent node comes within its heartbeat timeout + interval,
# docs/design.md §5): a dead node is then redone, a live one has been given every chance.
RECONNECT_DELAY = 0.1
RECONNECT_MAX = 1.0
# Errors of a request to a tree node that mean the node could not be reached at all.
UNREACHABLE = (PeerUnavailableError, ConnectionLostError)


class Repair:
    """The repairs of ``plan``: the inputs it waits for again, its broken pulls, its
    backups."""

    def __init__(self, plan: ReducePlan) -> None:
        self.plan = plan
        self.wanted: dict[ObjectID, list[int]] = {}  # lost input -> slots waiting for it
        self.broken: dict[int, int] = {}  # slot -> offset its consumer stopped at, node alive
        # slot -> (its version, its consumer's, offset): a broken pull reported, or due to be
        # retried, while this node suspects the consumer; resumed if it answers again
        self._orphans: dict[int, tuple[bytes, bytes, int]] = {}
        self.backups: list[ObjectID] = []  # inputs not used, once k are chosen (tree only)
        self.rewaiting: set[ObjectID] = set()  # backups waited for again, for a repair
        self.spares: list[InputReady] = []  # backups ready, not used (yet)
        self.reconnects: dict[int, tuple[int, float]] = {}  # slot -> (tries, delays summed)
        # input -> nodes where a task found no complete copy of it: a stale holder, not asked
        # for that input again
        self.lacking: dict[ObjectID, set[str]] = {}

    # --- events ---
    def node_lost(self, ev: NodeDied | NodeSuspected) -> list[Instruction]:
        """A repair sees every input placed: what the policies hold goes first."""
        plan = self.plan
        out = [ins for policy in plan._policies for ins in policy.on_node_lost()]
        return out + self._node_died(ev.node)

    def node_trusted(self, ev: NodeTrusted) -> list[Instruction]:
        """Every lost input is waited for anew, the trusted node's copies included."""
        return ([WaitInput(oid, self._excluded(oid)) for oid in self.wanted]
                + self._resume_orphans())

    def input_failed(self, ev: InputFailed) -> list[Instruction]:
        plan = self.plan
        if plan._waiting.pop(ev.oid, 0) > 0:
            if len(plan.used) + sum(plan._waiting.values()) < plan.k:
                return plan._fail(ev.error)
            return []  # one candidate fewer: the inputs still awaited can make up k
        if ev.oid in self.rewaiting:  # a backup: one fewer candidate, nothing more
            self.rewaiting.discard(ev.oid)
            return []
        slots = self.wanted.pop(ev.oid, None)
        if not slots:  # ready already, or a cancelled backup
            return []
        redo = plan._redo[slots[0]]
        return plan._fail(PeerUnavailableError(
            f"node {redo.died_on} died holding input {ev.oid.hex()} (slot {slots[0]}) of reduce "
            f"{plan.result.hex()}, and no copy came back: {ev.error}",
            node=redo.died_on, slot=slots[0], oid=ev.oid.hex()))

    def slot_failed(self, ev: SlotFailed) -> list[Instruction]:
        plan = self.plan
        placed = plan._slots.get(ev.slot)
        if plan.complete or (placed is None and ev.slot in plan._redo):
            return []
        if placed is not None and (ev.gen is not None and placed.gen != ev.gen
                                   or ev.version is not None and placed.version != ev.version):
            return []  # an earlier placement's task, replaced since
        if placed is not None and placed.node in plan.dead:
            child = None if ev.child is None else plan._slots.get(ev.child)
            if ev.child is not None and child is not None:  # a connect to a node we
                # suspect: sent again if it answers
                self._orphan(ev.child, child.version, placed, placed.start)
            return []  # its death is handled as such (a repair if its output is still needed)
        if placed is not None and isinstance(ev.error, UNREACHABLE) and not ev.error.reported:
            plan.dead.add(placed.node)  # its node is gone for this reduce, before the verdict
            return self._node_died(placed.node)
        if (placed is not None and placed.task and placed.version is None
                and isinstance(ev.error, ObjectNotFoundError)
                and ev.error.data.get("oid") == placed.input.hex()):
            # the holder the input's shard named has no complete copy (any more): the slot
            # is placed again on another holder, once one has it all (docs/design.md §5)
            return self._redo_lacking(ev.slot, placed, placed.start)
        return plan._fail(ev.error)

    def child_lost(self, ev: ChildLost) -> list[Instruction]:
        plan = self.plan
        taken = first_answer(policy.on_child_lost(ev) for policy in plan._policies)
        if taken is not None:
            return taken
        shape = plan.shape
        placed = plan._slots.get(ev.child)
        if (plan.complete or shape is None or placed is None or placed.version != ev.version
                or ev.parent != shape.parent[ev.child]):
            return []  # stale: the slot was placed again since, or the report makes no sense
        if ev.parent is not None:
            consumer = plan._slots.get(ev.parent)
            if consumer is None or ev.consumer != consumer.version:
                return []  # the consumer was placed again since: it connects its children
            if consumer.node in plan.dead:  # if it is lost, its repair redoes this slot
                self._orphan(ev.child, placed.version, consumer, ev.offset)
                return []
        if ev.source_dead:
            plan.dead.add(placed.node)
        if placed.node in plan.dead:
            return self.repair(ev.child, ev.offset)
        taken = first_answer(policy.on_no_input(ev) for policy in plan._policies)
        if taken is not None:
            return taken
        if not placed.task and isinstance(ev.error, ObjectNotFoundError):
            # a leaf's node has no copy of its input any more (withdrawn after a partition,
            # its id put again elsewhere): redone from the offset on another holder
            return self._redo_lacking(ev.child, placed, ev.offset)
        return self.reconnect(ev, placed.node)

    def reconnect(self, ev: ChildLost, node: str) -> list[Instruction]:
        """A pull from ``node``, which looks alive, broke: try again after a backoff, until
        the delays add up to the plan's patience. While the consumer suspects ``node``, which
        we do not, the wait does not count: our views differ, and end when the consumer trusts
        it again (its link to it works) or when our own suspicion or verdict repairs it."""
        plan = self.plan
        tries, waited = self.reconnects.get(ev.child, (0, 0.0))
        if waited >= plan.patience and not ev.source_suspected:
            return plan._fail(PeerUnavailableError(
                f"slot {ev.child} on node {node} of reduce {plan.result.hex()}: its "
                f"output could not be received after {tries} reconnections: {ev.error}",
                node=node, slot=ev.child))
        delay = min(RECONNECT_DELAY * 2 ** tries, RECONNECT_MAX)
        self.reconnects[ev.child] = (tries + 1, waited + (0.0 if ev.source_suspected else delay))
        self.broken[ev.child] = ev.offset
        return [After(delay, Retry(ev.child, ev.version))]

    def retry(self, ev: Retry) -> list[Instruction]:
        plan = self.plan
        taken = first_answer(policy.on_retry(ev) for policy in plan._policies)
        if taken is not None:
            return taken
        shape = plan.shape
        placed = plan._slots.get(ev.child)
        offset = self.broken.pop(ev.child, None)
        if (plan.complete or shape is None or placed is None or placed.version != ev.version
                or offset is None):
            return []
        parent = shape.parent[ev.child]
        if parent is None:
            return [PullRoot(placed.node, placed.output, placed.version)]
        ps = plan._slots.get(parent)
        if ps is None or ps.version is None:
            return []
        if ps.node in plan.dead:  # a pull to start on a node we suspect now
            self._orphan(ev.child, placed.version, ps, offset)
            return []
        return [Connect(parent, ps.node, ev.child, placed.node, placed.output, placed.version)]

    def _orphan(self, child: int, version: bytes | None, consumer: Slot, offset: int) -> None:
        """``child``'s consumer, on a node we suspect, has a broken pull of it: if that node
        is declared dead the consumer's repair redoes ``child``; if it answers again, the
        pull must resume (``_resume_orphans``), or the reduce would wait for it for good
        (tests/unit/test_reduce_plan.py, pull-broken-while-its-consumer-is-suspected-...)."""
        plan = self.plan
        if consumer.node not in plan.declared and version is not None and consumer.version:
            self._orphans[child] = (version, consumer.version, offset)

    def _resume_orphans(self) -> list[Instruction]:
        """Pulls broken while their consumer was suspected, whose consumer we trust again:
        connected again, or their slot redone if its own node is lost since."""
        plan = self.plan
        shape = plan.shape
        out: list[Instruction] = []
        if shape is None or plan.complete:
            return out
        for child, (version, consumer_version, offset) in list(self._orphans.items()):
            parent = shape.parent[child]
            consumer = None if parent is None else plan._slots.get(parent)
            placed = plan._slots.get(child)
            if (consumer is None or consumer.version != consumer_version or placed is None
                    or placed.version != version):
                del self._orphans[child]  # placed again since: connected by that placement
                continue
            if consumer.node in plan.dead:
                continue  # still suspected
            del self._orphans[child]
            if placed.node in plan.dead:
                out += self.repair(child, offset)
            else:
                assert parent is not None
                out.append(Connect(parent, consumer.node, child, placed.node, placed.output,
                                   version))
        return out

    def _node_died(self, node: str) -> list[Instruction]:
        """Slots on ``node`` whose consumer lacks bytes are redone: those it reported broken,
        and those never connected to it (their consumer has nothing of them yet)."""
        plan = self.plan
        shape = plan.shape
        if plan.complete or shape is None:
            return []
        if any(policy.relies_on_node(node) for policy in plan._policies):
            return self.restart_all()
        out: list[Instruction] = []
        for slot in sorted(s for s, placed in plan._slots.items() if placed.node == node):
            placed = plan._slots.get(slot)
            if placed is None:  # redone already, as a dead child of a slot redone above
                continue
            parent = shape.parent[slot]
            consumer = None if parent is None else plan._slots.get(parent)
            if parent in plan._redo:  # the consumer waits to be placed again: its repair
                # looked at its children before this death, so this slot is redone now
                out += self.repair(slot, plan._redo[parent].start)
                continue
            if consumer is not None and consumer.node in plan.dead:
                continue  # the consumer is lost too: its repair redoes this slot
            offset = self.broken.pop(slot, None)
            if offset is None and not placed.connected:
                offset = consumer.start if consumer is not None else 0
            if offset is not None:
                out += self.repair(slot, offset)
        return out

    def repair(self, slot: int, start: int) -> list[Instruction]:
        """``_repair_steps``, run to its end."""
        return drive(self._repair_steps(slot, start))

    def _repair_steps(self, slot: int, start: int) -> Steps:
        """Place ``slot`` again, computing from byte ``start``: a ready backup takes it at once,
        otherwise its input is waited for anew (and the backups, if any); its dead children are
        redone from the same byte. A slot a fold relies on starts everything again."""
        plan = self.plan
        shape = plan.shape
        assert shape is not None
        if any(policy.relies_on(slot) for policy in plan._policies):
            return self.restart_all()
        placed = plan._slots[slot]
        self.reconnects.pop(slot, None)
        self.broken.pop(slot, None)
        redo = Redo(placed.input, placed.node, placed.gen + 1, start)
        spare = self._spare()
        if spare is not None:
            plan._lift(slot)
            return (yield self._swap_steps(slot, redo, spare))
        out = self.want(slot, redo)
        for oid in self.backups:
            out.append(WaitInput(oid, self._excluded(oid)))
            self.rewaiting.add(oid)
        self.backups = []
        for child in shape.children[slot]:
            c = plan._slots.get(child)
            if c is not None and c.node in plan.dead:
                out += yield self._repair_steps(child, start)
            elif child in plan._redo:
                plan._redo[child].start = min(plan._redo[child].start, start)
        return out

    def want(self, slot: int, redo: Redo) -> list[Instruction]:
        """``slot`` waits for its input again (one wait per input, whatever its slots)."""
        plan = self.plan
        plan._move(slot, "redo", redo)
        out: list[Instruction] = []
        if redo.input not in self.wanted:
            self.wanted[redo.input] = []
            out.append(WaitInput(redo.input, self._excluded(redo.input)))
        self.wanted[redo.input].append(slot)
        return out

    def _redo_lacking(self, slot: int, placed: Slot, start: int) -> list[Instruction]:
        """``slot``'s node has no copy of its input: never that node for that input again,
        and the slot redone from ``start`` elsewhere."""
        self.lacking.setdefault(placed.input, set()).add(placed.node)
        return self.repair(slot, start)

    def _excluded(self, oid: ObjectID) -> tuple[str, ...]:
        """The nodes whose copies of input ``oid`` this reduce does not use: the dead, and
        those found lacking it."""
        plan = self.plan
        return tuple(sorted(plan.dead | self.lacking.get(oid, set())))

    def _usable(self, ev: InputReady) -> list[str]:
        """The live holders of a backup that fits the reduce (none: it cannot be used)."""
        plan = self.plan
        if not plan._fits(ev):
            return []
        return [n for n in ev.alive if n not in plan.dead]

    def _spare(self) -> InputReady | None:
        """A ready backup with a live holder, taken off the list (None if there is none)."""
        while self.spares:
            ev = self.spares.pop(0)
            if self._usable(ev):
                return ev
        return None

    def backup_ready(self, ev: InputReady) -> list[Instruction]:
        """A backup waited for again is ready: it takes a slot still waiting for its input,
        or is kept for the next repair."""
        plan = self.plan
        self.rewaiting.discard(ev.oid)
        if not self._usable(ev):
            return []  # another type or shape, or no live holder: never used
        if not plan._redo:
            self.spares.append(ev)
            return []
        slot = min(plan._redo)
        redo = plan._redo[slot]
        plan._lift(slot)
        out: list[Instruction] = []
        waiting = self.wanted.get(redo.input, [])
        if slot in waiting:
            waiting.remove(slot)
            if not waiting:
                del self.wanted[redo.input]
                out.append(CancelWaits((redo.input,)))
        return out + self._swap(slot, redo, ev)

    def _swap(self, slot: int, redo: Redo, ev: InputReady) -> list[Instruction]:
        """``_swap_steps``, run to its end."""
        return drive(self._swap_steps(slot, redo, ev))

    def _swap_steps(self, slot: int, redo: Redo, ev: InputReady) -> Steps:
        """Backup ``ev`` takes lifted ``slot`` (lost ``redo.input``) from byte 0: if the
        consumer had bytes of the lost value, every partial sum up to the result starts again
        from 0 (first: the slot is placed once they are)."""
        plan = self.plan
        shape = plan.shape
        assert shape is not None
        plan.used[plan.used.index(redo.input)] = ev.oid
        out: list[Instruction] = []
        if redo.start > 0:
            out.append(RestartResult())
            for ancestor in redo_path(shape, slot)[1:]:
                out += yield self.restart_steps(ancestor)
        alive = self._usable(ev)
        node = plan.me if plan.me in alive else alive[0]
        out += yield plan._put_steps(slot, node, ev.oid, ev.version, redo.gen, 0)
        return out + (yield self._from_zero_below_steps(slot))

    def restart_steps(self, slot: int) -> Steps:
        """Start ``slot``'s task again from byte 0 on its node (a new output), unless it is
        lost itself (then its repair starts from 0)."""
        plan = self.plan
        placed = plan._slots.get(slot)
        if placed is None:
            if slot not in plan._redo:
                return []
            plan._redo[slot].start = 0  # waiting for its input: placed later, from 0
            return (yield self._from_zero_below_steps(slot))
        if placed.node in plan.dead:
            return (yield self._repair_steps(slot, 0))
        self.reconnects.pop(slot, None)
        self.broken.pop(slot, None)
        out = yield plan._put_steps(slot, placed.node, placed.input, placed.input_version,
                                    placed.gen + 1, 0, placed.extras)
        return out + (yield self._from_zero_below_steps(slot))

    def _from_zero_below_steps(self, slot: int) -> Steps:
        """``slot``'s new task reads its children from byte 0: lost ones are redone from 0,
        tasks that compute only from a later byte start again, and none is connected yet."""
        plan = self.plan
        shape = plan.shape
        assert shape is not None
        out: list[Instruction] = []
        for child in shape.children[slot]:
            c = plan._slots.get(child)
            if c is None:
                if child in plan._redo:
                    plan._redo[child].start = 0
                    out += yield self._from_zero_below_steps(child)
                continue
            c.connected = False
            self.broken.pop(child, None)
            self.reconnects.pop(child, None)
            if c.node in plan.dead:
                out += yield self._repair_steps(child, 0)
            elif c.task and c.start > 0:
                out += yield self.restart_steps(child)
        return out

    def replace(self, ev: InputReady) -> list[Instruction]:
        """A lost input is back: a policy puts it into a slot its node has already (a merge,
        a fold, an absorb), or the slots waiting for it are placed on a live holder."""
        plan = self.plan
        assert plan.meta is not None and plan.shape is not None
        lacking = self.lacking.get(ev.oid, set())
        alive = [n for n in ev.alive if n not in plan.dead and n not in lacking]
        if not alive and plan._fits(ev):  # the shard's view of deaths lags ours
            return [WaitInput(ev.oid, self._excluded(ev.oid))]
        slots = self.wanted.pop(ev.oid)
        if not plan._fits(ev):
            return plan._fail(plan._mismatch(ev))
        node = plan.me if plan.me in alive else alive[0]
        out: list[Instruction] = []
        for slot in slots:
            redo = plan._redo[slot]
            plan._lift(slot)
            out += self._put_back(slot, node, ev, redo, len(slots) == 1)
        return out

    def _put_back(self, slot: int, node: str, ev: InputReady, redo: Redo,
                  alone: bool) -> list[Instruction]:
        """Lifted ``slot``'s lost input is back on ``node``: the first policy that puts it
        elsewhere does, else the slot is placed there from where its consumer stopped."""
        plan = self.plan
        taken = first_answer(policy.on_put_back(slot, node, ev, redo, alone)
                       for policy in plan._policies)
        if taken is not None:
            return taken
        return plan._put(slot, node, ev.oid, ev.version, redo.gen, redo.start)

    def restart_all(self) -> list[Instruction]:
        """A node a fold or a merge relied on is lost: the lost bytes are spread over its
        slots, so the result starts again from byte 0 over the tree's first shape; every live
        slot's task starts again, lost inputs are waited for again, and the policies make
        their merges again where they can (docs/design.md §5)."""
        plan = self.plan
        assert plan.meta is not None
        folded: dict[int, FoldState | Absorb] = {**plan._folds, **plan._folding}
        folded.update((a.slot, a) for a in plan._absorbing.values() if a.slot not in plan._slots)
        placed = dict(plan._slots)
        for slot in [*plan._absorbing, *plan._absorbed]:
            plan._end_absorb(slot, plan._table[slot])
        # every slot with an input in the tree is lifted, so that none is linked to before it
        # is placed anew; a slot waiting for its input waits on, to be placed from byte 0
        for slot in [*placed, *folded]:
            plan._lift(slot)
        self.broken.clear()
        self._orphans.clear()
        self.reconnects.clear()
        plan.shape = shape = plan._placement.new_shape(plan.meta.size)
        out: list[Instruction] = [RestartResult()]
        for policy in plan._policies:
            policy.on_restart(placed)
        for slot in range(shape.size):
            fold, old = folded.get(slot), placed.get(slot)
            if slot in plan._merged:
                continue
            if isinstance(fold, Absorb):
                node, oid, version, gen = fold.node, fold.input, fold.input_version, fold.gen + 1
            elif fold is not None:
                node, oid, version, gen = fold.node, fold.input, fold.version, fold.gen + 1
            elif old is not None:  # a task's output version is made anew
                version, node, oid, gen = old.input_version, old.node, old.input, old.gen + 1
            else:
                if slot in plan._redo:
                    plan._redo[slot].start = 0
                continue
            extras = tuple(m for m in plan._merged.values() if m.host == slot)
            if node in plan.dead or node in self.lacking.get(oid, ()):
                out += self.want(slot, Redo(oid, node, gen, 0))
            else:
                out += plan._put(slot, node, oid, version, gen, 0, extras)
        for policy in plan._policies:
            out += policy.after_restart()
        return out
