"""Reduce tree nodes: the slots this node computes for reduces coordinated elsewhere.

A slot with children runs on the node holding its input: it pulls each child's output stream
into a buffer of its own and, block by block, combines the prefix every child has delivered
with its input (in place, :mod:`.ops`), advancing its output's watermark; its parent pulls that
output while it grows, so the whole tree is pipelined (docs/design.md §4). A failure is reported
to the coordinator, which decides what happens to the reduce. A child's pull that breaks keeps
its bytes and is reported (``ReduceChildLost``): the coordinator reconnects it or places the
child again, and the next ``ReduceChild`` for it resumes where the pull stopped. A repaired
slot's task computes only from ``start`` on, because its consumer already holds the bytes
before (docs/design.md §5). A slot may add several inputs held here (``ReduceTask.extras``,
docs/design.md §4, "Several inputs on one node"). A fold changes a running task's shape:
``ReduceFold`` adds another input from the first byte not combined yet, ``ReduceReshape``
ends a lost child's range and announces children that take over from there; each child and
input covers a byte range, and the combine loop re-reads them whenever they change. A
*combiner* (a task whose input is its output, the result computed in place) adds no input of
its own, only its children: the root of one half of an allreduce's pair, started before this
node's input exists (docs/design.md §4, "A pair for the last two inputs"). It reads a child
whose output is in this store (this node's input, once put) where it is, with no pull. A
combine in a worker thread keeps what it reads and writes pinned until it ends, even if its
task was released meanwhile. Buffers that do not fit evict and wait for memory; the
handlers stay synchronous otherwise (docs/architecture.md §6)."""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import numpy as np

from hoplite_client.wire.errors import (
    CapacityError,
    HopliteError,
    InvalidArgumentError,
    ObjectNotFoundError,
    PeerUnavailableError,
)
from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.messages import (
    Folded,
    Ok,
    ReduceChild,
    ReduceChildLost,
    ReduceDone,
    ReduceFailed,
    ReduceFold,
    ReduceHurry,
    ReduceReshape,
    ReduceTask,
    ReshapeDone,
    TaskStarted,
    WireMessage,
)
from hoplited.collectives.ops import check_reducible, combine, derived_id
from hoplited.dispatch import Handler
from hoplited.memory.arena import Arena
from hoplited.memory.space import BRIEF_WAIT, Space
from hoplited.memory.store import ObjectStore, StoredObject, parse_dtype
from hoplited.tasks import Tasks
from hoplited.transfer.fetcher import Fetcher

log = logging.getLogger("hoplited.reduce")

# Bytes combined per step: small enough to forward soon, big enough to amortise the call.
COMPUTE_BLOCK = 4 * 1024 * 1024
# Blocks at least this big are combined in a worker thread (numpy drops the GIL meanwhile).
THREAD_BLOCK = 512 * 1024

# The most children a reshape may add: a lost slot's children and its folded input.
MAX_NEW_CHILDREN = 3

Tell = Callable[[str, WireMessage], None]
T = TypeVar("T")


@dataclass
class SlotTask:
    """One slot of a reduce being computed on this node."""

    reduce_id: ObjectID
    slot: int
    coordinator: str
    op: str
    dtype: np.dtype[Any]
    own: StoredObject | None  # None: a combiner
    out: StoredObject
    expected: int
    start: int  # the first byte computed: a whole element's
    lo: int = 0  # a stripe: where the output's bytes are in the inputs
    children: dict[int, StoredObject] = field(default_factory=dict)  # by child slot
    ranges: dict[int, tuple[int, int]] = field(default_factory=dict)  # child -> bytes it adds
    cut: set[int] = field(default_factory=set)  # children that end before any byte of ours
    extras: list[tuple[int, StoredObject]] = field(default_factory=list)  # folded, from byte
    all_children: asyncio.Event = field(default_factory=asyncio.Event)
    changed: bool = False  # ranges or inputs changed since the combine loop read them
    wake: asyncio.Future[None] | None = None  # the combine loop's wait for a change
    combined: int = 0  # the first byte not combined yet (nor being combined)
    runner: asyncio.Task[None] | None = None
    pulls: dict[int, asyncio.Task[None]] = field(default_factory=dict)
    borrowed: set[int] = field(default_factory=set)  # children read where they are, here
    # children read where they are from a byte of theirs: a stripe's leaf, an input here
    bases: dict[int, int] = field(default_factory=dict)
    sources: dict[int, ReduceChild] = field(default_factory=dict)  # child -> its last placing
    # edges and reshapes in arrival order while an edge's buffer waits for memory: those
    # queued behind it (or it), and the turn they take
    queued: int = 0
    edges: asyncio.Lock = field(default_factory=asyncio.Lock)

    def change(self) -> None:
        """A fold or reshape changed what the combine loop reads: it reads it again."""
        self.changed = True
        if self.wake is not None and not self.wake.done():
            self.wake.set_result(None)

    def check_children(self) -> None:
        """Set ``all_children`` once every expected child is known (or cut)."""
        if len(self.children) + len(self.cut) >= self.expected:
            self.all_children.set()
        else:
            self.all_children.clear()


class ReduceWorker:
    """Runs the tree-node tasks this node was given."""

    def __init__(self, store: ObjectStore, arena: Arena, space: Space, fetcher: Fetcher,
                 tell: Tell, tasks: Tasks, is_alive: Callable[[str], bool],
                 is_trusted: Callable[[str], bool]) -> None:
        self._store = store
        self._arena = arena
        self._space = space
        self._fetcher = fetcher
        self._tell = tell
        self._tasks = tasks
        self._is_alive = is_alive
        self._is_trusted = is_trusted
        self.slots: dict[tuple[ObjectID, int], SlotTask] = {}
        self.folds = 0  # lost inputs folded into a slot here, ever (status, metrics)
        self.paused = 0  # pulls paused behind a hurried sibling here, ever (status, metrics)
        self._placing: dict[tuple[ObjectID, int], object] = {}  # slot -> its newest task's
        # output still waiting for memory

    def in_flight(self) -> list[dict[str, Any]]:
        """Every slot computed here: its reduce, its children (the tree's edges into it) and
        the bytes of its partial sum so far (``hoplite status``)."""
        return [{"reduce": t.reduce_id.hex(), "slot": t.slot, "coordinator": t.coordinator,
                 "children": sorted(t.children), "computed": t.out.received,
                 "size": t.expected} for t in self.slots.values()]

    def handlers(self) -> dict[type[WireMessage], Handler]:
        return {ReduceTask: self.on_task, ReduceChild: self.on_child, ReduceDone: self.on_done,
                ReduceFold: self.on_fold, ReduceReshape: self.on_reshape,
                ReduceHurry: self.on_hurry}

    def on_task(self, coordinator: str, msg: ReduceTask,
                payload: memoryview | None) -> TaskStarted | Awaitable[TaskStarted]:
        """Create the slot's output and start computing it; the reply carries its version.
        A slot placed here again replaces its task, whose memory is given back before the new
        output is allocated; out of room, the output evicts and waits (docs/architecture.md
        §6)."""
        store = self._store
        own, extras = self._inputs(msg)
        size, shape = self._extent(msg) if own is None else self._extent_of(own, msg)
        if not 0 <= msg.start <= size or msg.children < (own is None):
            raise InvalidArgumentError(f"start {msg.start} outside 0..{size} or "
                                       f"{msg.children} children")
        key = (msg.reduce_id, msg.slot)
        self._release(*key)
        self._placing.pop(key, None)  # an earlier placement still waiting for memory: stale
        if msg.output == msg.reduce_id:  # the root computed in place, into the result here
            out = store.get(msg.output)
            if out is None:  # the reduce failed (or its result was deleted) meanwhile: a
                # buffer under the result's id would be found by gets and fail them wrongly
                raise ObjectNotFoundError(f"the result {msg.output.hex()} is not here any more")
            if out.received != msg.start or out.size != size:
                raise InvalidArgumentError(f"the result holds {out.received} of {out.size} "
                                           f"bytes, the task was to start at {msg.start} of "
                                           f"{size}")
            return self._begin(coordinator, msg, own, extras, out)
        try:
            out = store.create(msg.output, size, msg.dtype, shape, temporary=True)
        except CapacityError:
            return self._begin_when_room(coordinator, msg, own, extras, size, shape)
        return self._begin(coordinator, msg, own, extras, out)

    async def _begin_when_room(self, coordinator: str, msg: ReduceTask,
                               own: StoredObject | None, extras: list[StoredObject], size: int,
                               shape: list[int]) -> TaskStarted:
        """Allocate the output once there is room, then start the task, unless what it was
        to read changed meanwhile."""
        key = (msg.reduce_id, msg.slot)
        placing = self._placing[key] = object()
        try:
            out = await self._space.create(msg.output, size, msg.dtype, shape, temporary=True,
                                           wait=BRIEF_WAIT)
        finally:
            current = self._placing.get(key) is placing
            if current:
                del self._placing[key]
        try:
            if not current:
                raise InvalidArgumentError(f"slot {msg.slot} was placed again or released "
                                           f"while its output waited for memory")
            if not self._is_alive(coordinator):  # its tasks here were ended meanwhile
                raise PeerUnavailableError(f"coordinator {coordinator} died", node=coordinator)
            if (own, extras) != self._inputs(msg):
                raise ObjectNotFoundError(f"an input of slot {msg.slot} is not complete here "
                                          f"any more", oid=msg.input.hex())
        except HopliteError:
            self._store.remove(out.oid)
            raise
        return self._begin(coordinator, msg, own, extras, out)

    def _begin(self, coordinator: str, msg: ReduceTask, own: StoredObject | None,
               extras: list[StoredObject], out: StoredObject) -> TaskStarted:
        """Start the slot's task into ``out``, its output."""
        store = self._store
        dtype = np.dtype(msg.dtype)
        # whole elements from the element holding byte ``start``: the bytes below it that
        # this rewrites are the same sums (children are combined in slot order)
        start = msg.start - msg.start % dtype.itemsize
        if out.temporary:
            out.advance(start)  # never read below: the consumer holds those bytes
        if own is not None:
            store.pin(own)
        for extra in extras:
            store.pin(extra)
        store.pin(out)
        task = SlotTask(msg.reduce_id, msg.slot, coordinator, msg.op, dtype, own, out,
                        msg.children, start, msg.lo if msg.hi else 0, combined=start,
                        extras=[(start, extra) for extra in extras])
        task.check_children()
        self.slots[(msg.reduce_id, msg.slot)] = task
        if out.temporary:
            self._populate(task, out)
        task.runner = self._tasks.spawn(self._run(task), name=f"reduce-{msg.slot}",
                                        on_error=functools.partial(self._failed, task))
        return TaskStarted(version=out.version)

    def _inputs(self, msg: ReduceTask) -> tuple[StoredObject | None, list[StoredObject]]:
        """The task's own input (None: a combiner) and its extras, each complete here."""
        own = None if msg.input == msg.output else self._store.get(msg.input)
        if msg.input != msg.output and (own is None or not own.complete):
            raise ObjectNotFoundError(f"input {msg.input.hex()} is not complete here",
                                      oid=msg.input.hex())
        return own, [self._extra(own, oid) for oid in msg.extras]

    def _extra(self, own: StoredObject | None, oid: ObjectID) -> StoredObject:
        """Another input a task adds beside its own: complete here, and like its own."""
        extra = self._store.get(oid)
        if extra is None or not extra.complete:
            raise ObjectNotFoundError(f"input {oid.hex()} is not complete here", oid=oid.hex())
        if own is None or (extra.size, extra.dtype, extra.shape) != (own.size, own.dtype,
                                                                     own.shape):
            raise InvalidArgumentError(
                f"input {oid.hex()} is {extra.dtype}{extra.shape}, not like the slot's own"
                + ("" if own is None else f" {own.dtype}{own.shape}"), oid=oid.hex())
        return extra

    @staticmethod
    def _extent(msg: ReduceTask) -> tuple[int, list[int]]:
        """The size and shape of a combiner's output: a stripe of the result, computed in
        place (its children's outputs are that size, each checked where it is computed)."""
        if msg.output != msg.reduce_id or not msg.hi:
            raise InvalidArgumentError("a slot with no input of its own computes a stripe of "
                                       "the result in place")
        check_reducible(msg.op, msg.dtype)
        dtype = parse_dtype(msg.dtype)
        size = msg.hi - msg.lo
        if (not 0 <= msg.lo < msg.hi or msg.lo % dtype.itemsize or size % dtype.itemsize
                or msg.shape != [size // dtype.itemsize]):
            raise InvalidArgumentError(f"stripe {msg.lo}..{msg.hi} {msg.shape} is not whole "
                                       f"{msg.dtype} elements")
        return size, list(msg.shape)

    @staticmethod
    def _extent_of(own: StoredObject, msg: ReduceTask) -> tuple[int, list[int]]:
        """The size and shape of the task's output: the input's, or its stripe's."""
        if own.dtype != msg.dtype:  # compared as text first: a peer's text is parsed only
            # once it is the stored input's, which the store checked
            raise InvalidArgumentError(f"input {msg.input.hex()} is {own.dtype}{own.shape} "
                                       f"({own.size} bytes), not {msg.dtype} elements")
        dtype = np.dtype(own.dtype)
        if own.size % dtype.itemsize:
            raise InvalidArgumentError(f"input {msg.input.hex()} is {own.dtype}{own.shape} "
                                       f"({own.size} bytes), not whole {msg.dtype} elements")
        if not msg.hi:
            if own.shape != msg.shape:
                raise InvalidArgumentError(f"input {msg.input.hex()} is {own.dtype}{own.shape},"
                                           f" not {msg.dtype}{msg.shape}")
            return own.size, own.shape
        size = msg.hi - msg.lo
        if (not 0 <= msg.lo < msg.hi <= own.size or msg.lo % dtype.itemsize
                or size % dtype.itemsize or msg.shape != [size // dtype.itemsize]):
            raise InvalidArgumentError(f"stripe {msg.lo}..{msg.hi} {msg.shape} is not whole "
                                       f"elements of input {msg.input.hex()} ({own.size} bytes)")
        return size, list(msg.shape)

    def on_child(self, peer: str, msg: ReduceChild,
                 payload: memoryview | None) -> Ok | Awaitable[Ok]:
        """A child of one of our slots is placed: pull its output into a buffer of ours (again:
        resume the buffer from where the last pull stopped, from the child's new place). An
        edge meant for another placement of the slot is refused: its buffer would mix two
        values. A new buffer out of room evicts and waits; the task's later edges and
        reshapes wait for it, in arrival order."""
        task = self._task(msg.reduce_id, msg.slot, msg.slot_version)
        if task.queued:
            return self._later(task, lambda: self._child(
                self._task(msg.reduce_id, msg.slot, msg.slot_version), msg))
        answer = self._child(task, msg)
        if isinstance(answer, Ok):
            return answer
        return self._later(task, lambda: answer)

    def _child(self, task: SlotTask, msg: ReduceChild) -> Ok | Awaitable[Ok]:
        size = task.out.size
        until = msg.until or size
        if not 0 <= msg.start <= until <= size:
            raise InvalidArgumentError(f"child bytes {msg.start}..{msg.until} outside 0..{size}")
        if msg.window is not None and msg.window != [task.lo, task.lo + size]:
            raise InvalidArgumentError(f"a child's window {msg.window} is not the stripe's "
                                       f"bytes {task.lo}..{task.lo + size}")
        buf = task.children.get(msg.child)
        if msg.child in task.borrowed:  # its output was here; it cannot move and stay here
            raise InvalidArgumentError(f"child {msg.child} of slot {msg.slot} was read here "
                                       f"and cannot be pulled from {msg.node} now")
        if buf is not None:  # pulled again, from a new placement: resume at a whole element,
            # never mix one element's bytes from two values (docs/design.md §5, "Resuming
            # inside an element"); the slot has combined only whole elements, so nothing it
            # used goes
            item = task.dtype.itemsize
            buf.rewind(max(task.ranges[msg.child][0], buf.received - buf.received % item))
            return self._pull_from(task, buf, msg)
        if msg.child in task.cut or len(task.children) + len(task.cut) >= task.expected:
            raise InvalidArgumentError(f"slot {msg.slot} has all its {task.expected} "
                                       f"children; {msg.child} is not one")
        store = self._store
        here = None if task.own is not None else store.get(msg.oid)
        base = 0 if msg.window is None else msg.window[0]
        if (here is not None and here.version == msg.version and here is not task.out
                and here.error is None and (here.size == size if msg.window is None
                                            else here.complete and here.size >= base + size)):
            store.pin(here)  # a child computed (or an input held) here: read in place
            task.children[msg.child] = here
            task.ranges[msg.child] = (max(task.start, msg.start), until)
            task.borrowed.add(msg.child)
            if base:
                task.bases[msg.child] = base
            task.check_children()
            return Ok()
        oid = derived_id(msg.reduce_id, msg.slot, b"in%d" % msg.child)
        try:
            buf = store.create(oid, size, task.out.dtype, task.out.shape, temporary=True)
        except CapacityError:
            return self._child_when_room(task, msg, oid)
        return self._child_buffer(task, msg, buf)

    async def _child_when_room(self, task: SlotTask, msg: ReduceChild, oid: ObjectID) -> Ok:
        """The child's buffer, once there is room, unless the task ended meanwhile."""
        buf = await self._space.create(oid, task.out.size, task.out.dtype, task.out.shape,
                                       temporary=True, wait=BRIEF_WAIT)
        if self.slots.get((task.reduce_id, task.slot)) is not task or task.out.error:
            self._store.remove(buf.oid)  # released or failed while it waited for memory
            raise ObjectNotFoundError(f"no task for slot {msg.slot} of "
                                      f"{msg.reduce_id.hex()} any more")
        return self._child_buffer(task, msg, buf)

    def _child_buffer(self, task: SlotTask, msg: ReduceChild, buf: StoredObject) -> Ok:
        """Pull the child into ``buf``, its new buffer."""
        first = max(task.start, msg.start)
        buf.advance(first)  # the task computes from its start only
        self._store.pin(buf)
        task.children[msg.child] = buf
        task.ranges[msg.child] = (first, msg.until or task.out.size)
        self._populate(task, buf)
        return self._pull_from(task, buf, msg)

    def _pull_from(self, task: SlotTask, buf: StoredObject, msg: ReduceChild) -> Ok:
        self._pull(task, buf, msg)
        task.check_children()
        return Ok()

    def _later(self, task: SlotTask, work: Callable[[], T | Awaitable[T]]) -> Awaitable[T]:
        """Do ``work`` once the task's edges and reshapes that came before it are done (one
        of them waits for memory); counted at once, so those after it wait too."""
        task.queued += 1
        return self._in_turn(task, work)

    async def _in_turn(self, task: SlotTask, work: Callable[[], T | Awaitable[T]]) -> T:
        try:
            async with task.edges:
                answer = work()
                return await answer if inspect.isawaitable(answer) else answer
        finally:
            task.queued -= 1

    def _pull(self, task: SlotTask, buf: StoredObject, msg: ReduceChild) -> None:
        """(Re)start pulling child ``msg.child`` into ``buf`` as ``msg`` says."""
        old = task.pulls.get(msg.child)
        if old is not None:
            old.cancel()
        task.sources[msg.child] = msg
        task.pulls[msg.child] = self._tasks.spawn(self._pull_child(task, buf, msg),
                                                  name="reduce-pull",
                                                  on_error=functools.partial(self._failed, task))

    def on_hurry(self, peer: str, msg: ReduceHurry, payload: memoryview | None) -> None:
        """The pull of child ``msg.child`` by this slot goes first: the running pulls that the
        other tasks here adding the same input (its other stripes) make from the same node
        stop, and resume from their buffers' watermarks once it is done, however it ends
        (docs/design.md §4, "The first combiner's chain goes first"). A pull that is not
        running, or a task placed again, is left as it is."""
        task = self.slots.get((msg.reduce_id, msg.slot))
        if task is None or task.out.version != msg.version or task.own is None:
            return
        pull, source = task.pulls.get(msg.child), task.sources.get(msg.child)
        if pull is None or pull.done() or source is None:
            return
        behind: list[tuple[SlotTask, int, asyncio.Task[None]]] = []
        for other in self.slots.values():
            if other is task or other.own is None or other.own.oid != task.own.oid:
                continue
            for child, running in other.pulls.items():
                placing = other.sources.get(child)
                if not running.done() and placing is not None and placing.node == source.node:
                    running.cancel()
                    behind.append((other, child, running))
        if behind:
            self.paused += len(behind)
            log.debug("reduce %s slot %d: child %d from %s goes first, %d pulls wait",
                      msg.reduce_id.short(), msg.slot, msg.child, source.node, len(behind))
            pull.add_done_callback(lambda _: self._resume(behind))

    def _resume(self, behind: list[tuple[SlotTask, int, asyncio.Task[None]]]) -> None:
        """Pull again, from a whole element below the watermark, each child paused behind a
        hurried pull, unless its task was released or placed again, or it was pulled again
        meanwhile (a repair's edge)."""
        for task, child, cancelled in behind:
            if (self.slots.get((task.reduce_id, task.slot)) is not task
                    or task.out.error is not None or task.pulls.get(child) is not cancelled):
                continue
            buf, item = task.children[child], task.dtype.itemsize
            buf.rewind(max(task.ranges[child][0], buf.received - buf.received % item))
            self._pull(task, buf, task.sources[child])

    def on_fold(self, peer: str, msg: ReduceFold, payload: memoryview | None) -> Folded:
        """Add another input held here (a lost slot's, or one merged into the slot) to one of
        our slots' sums from the first byte it has not combined yet (``at`` at the
        earliest); the reply says which byte."""
        task = self._task(msg.reduce_id, msg.slot, msg.version)
        if task.own is None:
            raise InvalidArgumentError(f"slot {msg.slot} adds no input: nothing to fold into")
        extra = self._extra(task.own, msg.input)
        if extra.version != msg.input_version:
            raise ObjectNotFoundError(f"input {msg.input.hex()} is not complete here",
                                      oid=msg.input.hex())
        if not 0 <= msg.at <= task.out.size or msg.at % task.dtype.itemsize:
            raise InvalidArgumentError(f"fold at {msg.at}: not a whole element of "
                                       f"0..{task.out.size}")
        at = max(msg.at, task.combined)
        self._store.pin(extra)
        task.extras.append((at, extra))
        task.change()
        self.folds += 1
        return Folded(at=at)

    def on_reshape(self, peer: str, msg: ReduceReshape,
                   payload: memoryview | None) -> ReshapeDone | Awaitable[ReshapeDone]:
        """A child's bytes end at ``until``, or at the first byte not combined yet if that is
        later (-1: there); ``more`` children take over from there. The reply says where the
        child's bytes end. Waits for the edges that came before it and wait for memory."""
        task = self._task(msg.reduce_id, msg.slot, msg.version)
        if task.queued:
            return self._later(task, lambda: self._reshape(
                self._task(msg.reduce_id, msg.slot, msg.version), msg))
        return self._reshape(task, msg)

    def _reshape(self, task: SlotTask, msg: ReduceReshape) -> ReshapeDone:
        if (not -1 <= msg.until <= task.out.size or msg.until % task.dtype.itemsize
                and msg.until != -1 or not 0 <= msg.more <= MAX_NEW_CHILDREN):
            raise InvalidArgumentError(f"reshape at {msg.until} with {msg.more} children")
        cut = max(msg.until, task.combined)  # never below what was combined with the child
        if msg.more and cut != msg.until:
            raise InvalidArgumentError(f"slot {msg.slot} combined up to {task.combined}, past "
                                       f"{msg.until} where new children were to take over")
        if msg.child in task.children:
            first, until = task.ranges[msg.child]
            cut = min(until, max(first, cut))
            task.ranges[msg.child] = (first, cut)
            pull = task.pulls.pop(msg.child, None)
            running = pull is not None and not pull.done()
            if pull is not None:
                pull.cancel()
            buf, source = task.children[msg.child], task.sources.get(msg.child)
            if running and buf.received < cut and source is not None:
                # bytes below the cut are still to come: pulled on from the same source and
                # version up to the cut only (a leaf taken over from a byte past what had
                # arrived, docs/design.md §5)
                self._pull(task, buf, replace(source, until=cut))
        elif cut > task.start:
            raise InvalidArgumentError(f"slot {msg.slot} has no bytes of child {msg.child} "
                                       f"below {cut}")
        else:
            task.cut.add(msg.child)
        task.expected += msg.more
        task.check_children()
        task.change()
        return ReshapeDone(until=cut)

    def _task(self, reduce_id: ObjectID, slot: int, version: bytes | None = None) -> SlotTask:
        """The task of ``slot`` (whose output has ``version``, if given)."""
        task = self.slots.get((reduce_id, slot))
        if task is None or (version is not None and task.out.version != version):
            raise ObjectNotFoundError(f"no task for slot {slot} of {reduce_id.hex()}")
        return task

    async def _pull_child(self, task: SlotTask, buf: StoredObject, msg: ReduceChild) -> None:
        """Pull a child's output (up to ``msg.until``, if set: the rest is never read); a
        broken pull keeps its bytes and is reported."""
        try:
            window = None if msg.window is None else (msg.window[0], msg.window[1])
            await self._fetcher.pull_into(buf, msg.node, msg.oid, msg.version,
                                          until=msg.until or None, window=window)
        except HopliteError as error:
            if buf.error is not None:
                return  # the buffer was dropped: the reduce is over here
            log.info("reduce %s slot %d: child %d from %s broke at %d/%d bytes (%s)",
                     msg.reduce_id.short(), msg.slot, msg.child, msg.node, buf.received,
                     buf.size, error)
            self._tell(task.coordinator, ReduceChildLost(
                reduce_id=msg.reduce_id, slot=msg.slot, child=msg.child, version=msg.version,
                offset=buf.received, source_dead=not self._is_alive(msg.node),
                consumer=task.out.version, code=error.code, message=str(error),
                source_suspected=(self._is_alive(msg.node)
                                  and not self._is_trusted(msg.node))))

    def _populate(self, task: SlotTask, buf: StoredObject) -> None:
        """Back a buffer of ``task`` with memory; if there is none, the buffer fails (so nothing
        writes into it any more) and so does the slot."""
        def unbacked(exc: BaseException) -> None:
            buf.fail(exc if isinstance(exc, HopliteError) else CapacityError(
                f"no memory for a buffer of slot {task.slot}: {exc!r}"))
            self._failed(task, exc)
        if not self._arena.backed(buf.offset, buf.size):
            self._tasks.spawn(self._arena.populate(buf.offset, buf.size), name="populate",
                              on_error=unbacked)

    async def _run(self, task: SlotTask) -> None:
        await self._compute(task)

    def _failed(self, task: SlotTask, exc: BaseException) -> None:
        """A task of the slot failed (computing, pulling a child, backing a buffer): its output
        will not complete, and the coordinator decides what that means for the reduce."""
        if self.slots.get((task.reduce_id, task.slot)) is not task or task.out.error is not None:
            return  # released, or failed already: reported once
        error = exc if isinstance(exc, HopliteError) else HopliteError(
            f"slot {task.slot}: {type(exc).__name__}: {exc}")
        log.warning("reduce %s slot %d failed: %s", task.reduce_id.short(), task.slot, error,
                    exc_info=None if isinstance(exc, HopliteError) else exc)
        task.out.fail(error)
        self._tell(task.coordinator, ReduceFailed(
            reduce_id=task.reduce_id, slot=task.slot, code=error.code, message=str(error)))

    async def _compute(self, task: SlotTask) -> None:
        loop = asyncio.get_running_loop()
        size, item = task.out.size, task.dtype.itemsize
        pos = task.start
        while pos < size:
            if task.out.error is not None:  # failed or dropped: never written any further
                raise task.out.error
            await task.all_children.wait()
            task.changed = False
            live, end = self._inputs_at(task, pos)
            for child, base in live:  # wait for an element of each, or a change of shape
                got = await self._wait(task, child, base + min(pos + item, end))
                if got is None:
                    break
                end = min(end, got - base)
            if task.changed or not task.all_children.is_set():
                continue  # a fold or reshape arrived meanwhile: read the ranges again
            end -= (end - pos) % item
            task.combined = end
            # in slot order, so a slot computed again (repair) writes bit-identical sums
            lo = task.lo
            parts = ([c.buffer[base + pos:base + end] for c, base in live]
                     + [x.buffer[lo + pos:lo + end] for at, x in task.extras if at <= pos])
            if task.own is not None:
                parts.insert(0, task.own.buffer[lo + pos:lo + end])
            if not parts:  # a combiner whose children's ranges left a gap
                raise InvalidArgumentError(f"slot {task.slot} has nothing to add at byte {pos}")
            args = (task.op, task.dtype, parts[0], parts[1:], task.out.buffer[pos:end])
            if end - pos >= THREAD_BLOCK:
                await self._combine_in_thread(loop, task, [c for c, _ in live], args)
            else:
                combine(*args)
            task.out.advance(end)
            pos = end

    async def _combine_in_thread(self, loop: asyncio.AbstractEventLoop, task: SlotTask,
                                 live: list[StoredObject], args: tuple[Any, ...]) -> None:
        """``combine(*args)`` in a worker thread. A task released meanwhile (placed again, or
        its reduce over) stops waiting, but the thread writes on until its block is done: the
        objects it reads and writes stay pinned until then, so no new object gets their
        memory under it (a slot placed again at once reuses the same sizes)."""
        store = self._store
        held = [task.out, *live, *(x for _, x in task.extras)]
        if task.own is not None:
            held.append(task.own)
        for obj in held:
            store.pin(obj)

        def finished(future: asyncio.Future[None]) -> None:
            for obj in held:
                store.unpin(obj)
            if not future.cancelled():
                future.exception()  # read: raised below, unless nobody waits any more

        done = loop.run_in_executor(None, combine, *args)
        done.add_done_callback(finished)
        await asyncio.shield(done)

    @staticmethod
    def _inputs_at(task: SlotTask, pos: int) -> tuple[list[tuple[StoredObject, int]], int]:
        """The children adding byte ``pos``, in slot order, each with where the slot's bytes
        start in it, and where the block from ``pos`` must end: at most a compute block, and
        never across a child's or input's range."""
        end = min(task.out.size, pos + COMPUTE_BLOCK)
        live = []
        for key in sorted(task.children):
            first, until = task.ranges[key]
            if first <= pos < until:
                live.append((task.children[key], task.bases.get(key, 0)))
                end = min(end, until)
            elif pos < first:
                end = min(end, first)
        for at, _ in task.extras:
            if pos < at:
                end = min(end, at)
        return live, end

    @staticmethod
    async def _wait(task: SlotTask, buf: StoredObject, threshold: int) -> int | None:
        """``buf``'s watermark once it reaches ``threshold``; None if the task's shape
        changed first (the combine loop then reads it again)."""
        if task.changed:
            return None
        got = buf.watermark(threshold)
        if not got.done():
            task.wake = asyncio.get_running_loop().create_future()
            try:
                await asyncio.wait((got, task.wake), return_when=asyncio.FIRST_COMPLETED)
            finally:
                task.wake.cancel()
                task.wake = None
                if not got.done():
                    got.cancel()
                elif not got.cancelled():
                    got.exception()  # read here if the loop itself is being cancelled
        return None if got.cancelled() else got.result()

    def on_done(self, peer: str, msg: ReduceDone, payload: memoryview | None) -> None:
        """The reduce ended: stop its tasks here and free their buffers (an output still
        waiting for memory is dropped once it has some)."""
        for reduce_id, slot in [k for k in self.slots if k[0] == msg.reduce_id]:
            self._release(reduce_id, slot)
        for key in [k for k in self._placing if k[0] == msg.reduce_id]:
            del self._placing[key]

    def node_died(self, node: str) -> None:
        """A coordinator died: nobody will end its reduces' tasks here, so end them now."""
        for reduce_id, slot in [k for k, t in self.slots.items() if t.coordinator == node]:
            self._release(reduce_id, slot)

    def _release(self, reduce_id: ObjectID, slot: int) -> None:
        """Stop one slot's task and pulls; unpin its buffers, drop the temporary ones."""
        task = self.slots.pop((reduce_id, slot), None)
        if task is None:
            return
        store = self._store
        for t in [task.runner, *task.pulls.values()]:
            if t is not None:
                t.cancel()
        if task.own is not None:
            store.unpin(task.own)
        for _, extra in task.extras:
            store.unpin(extra)
        for key, obj in [(None, task.out), *task.children.items()]:
            store.unpin(obj)
            if obj.temporary and store.get(obj.oid) is obj and key not in task.borrowed:
                store.remove(obj.oid)
