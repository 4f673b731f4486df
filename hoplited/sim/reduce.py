"""A simulated reduce: the real ``ReducePlan`` and tree decide, simulated nodes carry out.

The driver (a :class:`~hoplited.sim.plan_driver.PlanDriver`, a handler per instruction)
mirrors ``collectives/coordinator.py`` (waits for the inputs at the shard, tasks, edges, the
result) and the tree nodes of ``collectives/worker.py``: a slot's task combines block i once
every child's buffer holds it. Compute time is not modelled (numpy adds a block far faster
than a link brings it); the message hops are, and so is a trio's combiner's hold of a late
input (``After`` with ``HoldOver``). Instructions that only follow a failure (``WaitInput``,
``After`` with ``Retry``, ``RestartResult``) stop the simulation: failures are not modelled
(docs/simulation.md).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Mapping
from typing import TypeVar

from hoplite_client.wire.errors import HopliteError
from hoplite_client.wire.frames import INLINE_MAX
from hoplite_client.wire.ids import ObjectID
from hoplited.collectives import plan as p
from hoplited.collectives.tree import tree_depth
from hoplited.directory.state import Entry
from hoplited.sim.clock import Clock
from hoplited.sim.cluster import Cluster, SlotPull
from hoplited.sim.errors import SimulationError
from hoplited.sim.network import Copy
from hoplited.sim.plan_driver import PlanDriver

RESULT_VERSION = b"sim-result"  # the result is created once: no failures, no restart
FAILURE_ONLY = "only follows a failure, which is not modelled"
Ins = TypeVar("Ins")  # one kind of instruction


class Combine:
    """A slot's task: block i of ``out`` is ready (whole) once block i is ready (whole) in
    the buffer of each of its ``children``; a task without children has its output at once."""

    def __init__(self, clock: Clock, out: Copy, children: int) -> None:
        self.out, self.children = out, children
        self.bufs: list[Copy] = []
        if not children:  # the root of a one-input reduce, computed in place
            out.fill(clock.now)

    def attach(self, buf: Copy) -> None:
        """A child's buffer (its ``ReduceChild`` arrived): combine as its blocks land."""
        self.bufs.append(buf)
        buf.follow(self._advance)
        self._advance()

    def _advance(self) -> None:
        bufs, out = self.bufs, self.out
        if len(bufs) < self.children:
            return  # the worker computes only once every child is known
        while len(out.ready) < min(len(b.ready) for b in bufs):
            out.add_ready(max(b.ready[len(out.ready)] for b in bufs))
        while len(out.full) < min(len(b.full) for b in bufs):
            out.add_full(max(b.full[len(out.full)] for b in bufs))


class ReduceRun(PlanDriver[p.ReducePlan, p.Event]):
    """One reduce of ``inputs`` into ``result``, coordinated on node ``me``; ``everyone``: an
    allreduce, whose plan may shape the tree for it, ``here``: an input is complete on ``me``
    (``collectives/reductions.py`` tells the plan so); ``window`` and ``half``: one of two
    trees of halves (docs/simulation.md §6); ``window`` and ``combiner``: one stripe of an
    allreduce's pair or trio, its root a combiner on ``me`` with the last ``late`` inputs
    hanging on it (docs/design.md §4)."""

    def __init__(self, cluster: Cluster, me: str, result: ObjectID, inputs: list[ObjectID],
                 op: str = "sum", everyone: bool = False,
                 window: tuple[int, int] | None = None, half: int | None = None,
                 here: bool = False, combiner: bool = False, late: int = 2) -> None:
        self.cluster, self.me, self.result = cluster, me, result
        self.depth: int | None = None  # the tree depth the plan chose (0: one chain)
        super().__init__(p.ReducePlan(result, inputs, len(inputs), op, me, depth=self._depth,
                                      spec=p.ReduceSpec(everyone=everyone, window=window,
                                                        half=half, here=here,
                                                        combiner=combiner, late=late,
                                                        rate=cluster.net.rate)),
                         cluster.clock.after)
        self._inputs = list(dict.fromkeys(inputs))
        self.tasks: dict[int, Combine] = {}  # by slot
        self._adds: dict[int, ObjectID] = {}  # slot -> the input its task adds
        self._pulls: dict[tuple[int, int], SlotPull] = {}  # (slot, child) -> its pull
        self.published_at: float | None = None
        self._cancelled: set[ObjectID] = set()
        self._versions = itertools.count()
        self.on(p.OpenResult, self._open)
        self.on(p.StartTask, self._a_hop_away(self._task))
        self.on(p.Connect, self._a_hop_away(self._connect))
        self.on(p.Hurry, self._a_hop_away(self._hurry))
        self.on(p.PullRoot, self._pull_root)
        self.on(p.Publish, self._publish)
        self.on(p.CombineInline, self._combine_inline)
        self.on(p.Fold, self._fold)
        self.on(p.After, self._hold)
        self.on(p.CancelWaits, self._cancel)
        self.on(p.Fail, self._fail)
        self.ignore(p.Release)  # nothing to release: no memory is modelled
        self.refuse(FAILURE_ONLY, p.WaitInput, p.Reshape, p.RestartResult)

    def _depth(self, n: int, size: int) -> int:
        """The tree depth from the link model, which here knows the links exactly."""
        net = self.cluster.net
        self.depth = tree_depth(n, size, net.rate, net.latency, net.segment)
        return self.depth

    @property
    def error(self) -> HopliteError | None:
        return self.plan.error

    def start(self, known: Mapping[ObjectID, Entry] | None = None) -> None:
        """Wait for the inputs at the shard; those in ``known`` (ready, as an allreduce that
        took no ring already heard) are fed at once, in their order."""
        known = known or {}
        for oid, entry in known.items():
            self._ready(oid, entry)
        for oid in self._inputs:
            if oid not in known:
                self.cluster.shard.wait_object(oid, functools.partial(self._ready, oid))

    def _ready(self, oid: ObjectID, entry: Entry) -> None:
        if oid in self._cancelled:
            return
        holders = tuple(entry.complete_holders())
        self.feed(p.InputReady(oid, holders, holders, entry.size, entry.dtype,
                               tuple(entry.shape), entry.version))

    def _hop(self, fn: Callable[[], object]) -> None:
        self.later(self.cluster.net.latency, fn)

    def _a_hop_away(self, handler: Callable[[Ins], None]) -> Callable[[Ins], None]:
        """``handler``, run as the instruction's message reaches its node, a hop later."""
        return lambda ins: self._hop(lambda: handler(ins))

    def _pull_root(self, ins: p.PullRoot) -> None:
        c = self.cluster
        c.net.pull(c.copies[(ins.node, ins.output)], c.copies[(self.me, self.result)],
                   lambda: None)

    def _publish(self, ins: p.Publish) -> None:
        """Publish at the shard (a small result with its bytes); its reply comes two hops
        later."""
        m = self.plan.meta
        assert m is not None
        inline = bytes(m.size) if m.size <= INLINE_MAX else None
        self.cluster.shard.publish(self.result, self.me, m.size, m.dtype, list(m.shape),
                                   RESULT_VERSION, inline)
        self._hop(lambda: self._hop(self._published))

    def _combine_inline(self, ins: p.CombineInline) -> None:
        self._create(self.me, self.result, ins.size).fill(self.cluster.clock.now)
        self.feed(p.ResultComplete())

    def _fold(self, ins: p.Fold) -> None:
        """A merged input held where the slot runs: no link, the answer two hops later."""
        self._hop(lambda: self._hop(lambda: self.feed(
            p.Folded(ins.slot, ins.into, ins.at, ins.version))))

    def _hold(self, ins: p.After) -> None:
        """A trio's combiner holds a late input (docs/design.md §4); a retry follows a
        failure."""
        if not isinstance(ins.event, p.HoldOver):
            raise SimulationError(f"{ins} {FAILURE_ONLY}")
        self.fire(ins)

    def _cancel(self, ins: p.CancelWaits) -> None:
        self._cancelled.update(ins.oids)

    def _fail(self, ins: p.Fail) -> None:
        """The shard records the failure: gets of the result fail with it."""
        self.cluster.shard.fail(self.result, ins.error)

    def _open(self, ins: p.OpenResult) -> None:
        """Create the result here and announce it, so gets chain behind it at once."""
        c = self.cluster
        out = self._create(self.me, self.result, ins.size)
        c.shard.publish(self.result, self.me, ins.size, ins.dtype, list(ins.shape),
                        RESULT_VERSION, None, received=0, producing=True,
                        receivers=ins.receivers)
        out.when_complete(lambda t: c.clock.at(t, lambda: self.feed(p.ResultComplete())))

    def _task(self, ins: p.StartTask) -> None:
        """``ReduceTask`` reached ``ins.node``: the slot's output exists (the result itself
        for the root computed in place); the reply carries its version a hop later."""
        c = self.cluster
        size = ins.hi - ins.lo if ins.hi else c.copies[(ins.node, ins.input)].layout.size
        out = c.copies[(self.me, self.result)] if ins.output == self.result else self._create(
            ins.node, ins.output, size)
        self.tasks[ins.slot] = Combine(c.clock, out, ins.children)
        self._adds[ins.slot] = ins.input
        version = b"task-%d" % next(self._versions)
        self._hop(lambda: self.feed(p.TaskStarted(ins.slot, ins.gen, version)))

    def _connect(self, ins: p.Connect) -> None:
        """``ReduceChild`` reached the parent: it pulls the child's output into a buffer (a
        child on the parent's node, a pair's own input, is read where it is: no link); a
        stripe's leaf is its input's window, complete where the input is."""
        c = self.cluster
        source = c.copies[(ins.child_node, ins.child_output)]
        if ins.window is not None:
            lo, hi = ins.window
            whole = source
            source = Copy(ins.child_node, c.net.layout(hi - lo))
            source.fill(whole.full[-1] if whole.complete else c.clock.now)
        if ins.child_node == ins.parent_node:
            self.tasks[ins.parent_slot].attach(source)
            return
        buf = Copy(ins.parent_node, source.layout)
        self.tasks[ins.parent_slot].attach(buf)
        pull = SlotPull(self._adds[ins.parent_slot], source, buf)
        self._pulls[(ins.parent_slot, ins.child_slot)] = pull
        c.slot_pulls[ins.parent_node].append(pull)
        self._start_pull(pull)

    def _start_pull(self, pull: SlotPull) -> None:
        """Pull into ``pull.sink`` from its watermark; once done, resume those behind it."""
        def ended() -> None:
            pull.done = True
            for other in pull.behind:
                other.paused = False
                self._start_pull(other)
            pull.behind.clear()
        pull.stream = self.cluster.net.pull(pull.source, pull.sink, ended)

    def _hurry(self, ins: p.Hurry) -> None:
        """``ReduceHurry`` reached the slot's node: the pulls there by the slots adding the
        same input (the other stripes') from the same node stop until this one is done, as
        ``collectives/worker.py`` does."""
        pull = self._pulls.get((ins.parent_slot, ins.child_slot))
        if pull is None or pull.done:
            return
        for other in self.cluster.slot_pulls[ins.parent_node]:
            if (other is not pull and not other.done and not other.paused
                    and other.input == pull.input
                    and other.source.node == pull.source.node and other.stream is not None):
                other.stream.stop()
                other.paused = True
                pull.behind.append(other)

    def _published(self) -> None:
        """The shard's reply to ``Publish``."""
        self.published_at = self.cluster.clock.now
        self.feed(p.Published())

    def _create(self, node: str, oid: ObjectID, size: int) -> Copy:
        copy = Copy(node, self.cluster.net.layout(size))
        self.cluster.copies[(node, oid)] = copy
        return copy
