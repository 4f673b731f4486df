"""Reduce coordination: the driver that carries out a :class:`~.plan.ReducePlan`.

One coordinator per reduce runs on the caller's node. The plan decides (which inputs, which
slot and node each takes, which edges exist, when to publish, what a failure means); the
coordinator does the I/O: it waits for the inputs at their shards (bounded long polls), sends
``ReduceTask`` and ``ReduceChild`` to the tree nodes (independent ones concurrently), creates,
announces, pulls and publishes the result, and feeds every outcome back to the plan as an
event. Events are queued and handled one at a time, so an instruction that completes at once
(an inline combine) never re-enters the plan (docs/design.md §4).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hoplite_client.wire.errors import (
    CapacityError,
    HopliteError,
    HopliteTimeoutError,
)
from hoplite_client.wire.frames import INLINE_MAX, Frame
from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.messages import (
    ObjectInfo,
    ReduceChild,
    ReduceDone,
    ReduceFold,
    ReduceHurry,
    ReduceReshape,
    ReduceTask,
)
from hoplited.cluster.link_model import LinkModel
from hoplited.collectives import plan as p
from hoplited.collectives.input_wait import GiveUp, InputWait, Ready, Sleep, Step
from hoplited.collectives.ops import OPS
from hoplited.directory.client import DirectoryClient
from hoplited.memory.arena import Arena
from hoplited.memory.space import Space, brief_wait
from hoplited.memory.store import CopyWithdrawn, ObjectStore, StoredObject
from hoplited.rpc import Rpc
from hoplited.tasks import Tasks
from hoplited.transfer.fetch_plan import is_retriable
from hoplited.transfer.fetcher import Fetcher

log = logging.getLogger("hoplited.reduce")


@dataclass(frozen=True, kw_only=True)
class CoordinatorDeps:
    """What a coordinator uses: this node's id, store and arena, the directory, peers;
    ``patience``: how long a member may look alive while unreachable (its liveness bound)."""

    me: str
    store: ObjectStore
    arena: Arena
    space: Space
    directory: DirectoryClient
    rpc: Rpc
    fetcher: Fetcher
    link_model: LinkModel
    is_alive: Callable[[str], bool]
    tasks: Tasks
    patience: float


async def wait_ready(directory: DirectoryClient, is_alive: Callable[[str], bool],
                     oid: ObjectID, deadline: float | None,
                     exclude: tuple[str, ...] = ()) -> Frame[ObjectInfo]:
    """The shard's record of ``oid`` once a live node not in ``exclude`` holds all of it (or it
    comes inline), in bounded polls as :class:`InputWait` decides (it never lets us spin);
    raises the typed error it gave up with."""
    loop = asyncio.get_running_loop()
    wait = InputWait(oid, deadline)
    step: Step = wait.poll(loop.time())
    while not isinstance(step, Ready):
        if isinstance(step, GiveUp):
            raise step.error
        if isinstance(step, Sleep):  # the shard has not heard of a death yet
            await asyncio.sleep(step.delay)
            step = wait.poll(loop.time())
            continue
        try:
            frame = await directory.wait_object(oid, step.timeout)
        except HopliteError as exc:
            step = wait.failed(loop.time(), exc)
            continue
        info = frame.msg
        usable = info.size <= INLINE_MAX or any(
            n not in exclude and is_alive(n) for n in info.holders)
        step = wait.answered(loop.time(), usable, info.holders)
    return frame


async def reduce_ended(ended: asyncio.Event, result: ObjectID, timeout: float | None) -> None:
    """Wait for the reduce into ``result`` to end (``ended``), or raise HopliteTimeoutError."""
    try:
        async with asyncio.timeout(timeout):
            await ended.wait()
    except TimeoutError:
        raise HopliteTimeoutError(f"reduce {result.hex()} has not completed within "
                                  f"{timeout}s") from None


def withdraw_result(store: ObjectStore, old: StoredObject) -> None:
    """Take the result's copy ``old`` out of the store as the reduce starts it again. Only
    this copy goes, not the object: a get waiting on it (on this node, where it is
    produced) fetches again and finds the new version, even while that one waits for room,
    instead of failing (docs/design.md §5, "Backups")."""
    if store.get(old.oid) is old:
        store.remove(old.oid, CopyWithdrawn(
            f"reduce {old.oid.hex()} started its result again: a repair redid the path to it"))


class ReduceCoordinator:
    """Carries out one reduce's plan: waits, tasks, edges, the result."""

    def __init__(self, deps: CoordinatorDeps, plan: p.ReducePlan, inputs: list[ObjectID],
                 deadline: float | None) -> None:
        self.d = deps
        self.plan = plan
        self.result = plan.result
        self._inputs = list(dict.fromkeys(inputs))
        self._deadline = deadline  # the event loop's clock; None: no timeout
        self.ended = asyncio.Event()
        self.out: StoredObject | None = None
        # the tasks about this version of the result: a restart ends them (an announcement
        # of the old version still retrying would erase the new one's entry at a new owner)
        self._about_out: list[asyncio.Task[None]] = []
        self._inline: dict[ObjectID, bytes] = {}
        self._waits: dict[ObjectID, asyncio.Task[None]] = {}
        self._root_pull: asyncio.Task[None] | None = None
        self._starting: set[asyncio.Task[None]] = set()  # ReduceTask requests under way
        self._queue = p.EventQueue(plan, self._execute)
        # the result waits for room: every instruction after its opening waits for it
        self._opening = False
        self._held: list[p.Instruction] = []
        self._ended = False
        self.deleted = False  # its result was deleted while it ran: nothing to record

    @property
    def error(self) -> HopliteError | None:
        """Why the reduce failed, once it has; None while it runs or once it published."""
        return self.plan.error

    def start(self, wait_inputs: bool = True, ready: Sequence[p.InputReady] = ()) -> None:
        """Begin: feed the inputs ``ready`` (known ready elsewhere, in order: a stripe's, from
        the caller's node; listed inputs larger than inline ones, whose bytes no record here
        carries, as ``check_task`` ensures) and wait for every other input, unless its waits
        are shared (``wait_inputs`` False: a reduce in halves, whose driver hands each ready
        input to both plans through :meth:`ready`, in one order); repairs still wait for lost
        inputs here."""
        known = {ev.oid for ev in ready}
        for ev in ready:
            self.feed(ev)
        if wait_inputs:
            for oid in self._inputs:
                if oid not in known:
                    self._wait(oid, ())

    def _wait(self, oid: ObjectID, exclude: tuple[str, ...]) -> None:
        """Wait for ``oid`` (again: the wait under way, with another exclude list, ends)."""
        old = self._waits.get(oid)
        if old is not None:
            old.cancel()
        self._waits[oid] = self._spawn(self._wait_ready(oid, exclude),
                                       f"reduce-wait-{oid.short()}",
                                       functools.partial(p.InputFailed, oid))

    async def reduced_inputs(self, timeout: float | None) -> list[ObjectID]:
        """The inputs in the result, in the order they became ready, once it is complete (a
        backup may take a lost input's place until then)."""
        await reduce_ended(self.ended, self.result, timeout)
        if self.plan.error is not None:
            raise self.plan.error
        return list(self.plan.used)

    # --- events in ---
    def feed(self, event: p.Event) -> None:
        """Hand ``event`` to the plan and carry out what it says (queued: never re-entered)."""
        if isinstance(event, p.ChildLost | p.NodeDied | p.NodeSuspected | p.NodeTrusted) and (
                not self._ended):
            log.info("reduce %s: %s", self.result.short(), event)
        self._queue.feed(event)
        self._end_if_over()

    def _end_if_over(self) -> None:
        """End the reduce here once the plan has published or failed it."""
        if (self.plan.error is not None or self.plan.published) and not self._ended:
            self._end()

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str,
               on_error: Callable[[HopliteError], p.Event]) -> asyncio.Task[None]:
        """Run ``coro``; a failure comes back to the plan as ``on_error(error)``."""
        def failed(exc: BaseException) -> None:
            if not isinstance(exc, HopliteError):  # a bug must still end the reduce, typed
                log.error("reduce %s: %s crashed", self.result.short(), name, exc_info=exc)
                exc = HopliteError(f"{name}: {type(exc).__name__}: {exc}")
            self.feed(on_error(exc))
        return self.d.tasks.spawn(coro, name=name, on_error=failed)

    async def _wait_ready(self, oid: ObjectID, exclude: tuple[str, ...]) -> None:
        """Wait for ``oid`` (:func:`wait_ready`) and feed its holders and metadata."""
        self.ready(oid, await wait_ready(self.d.directory, self.d.is_alive, oid, self._deadline,
                                         exclude))

    def ready(self, oid: ObjectID, frame: Frame[ObjectInfo]) -> None:
        """Input ``oid`` is ready as its shard's record ``frame`` says: feed it to the plan
        (with its bytes, if it came inline)."""
        info = frame.msg
        if info.size <= INLINE_MAX:
            self._inline[oid] = bytes(frame.payload) if frame.payload is not None else b""
        self.feed(p.InputReady(oid, tuple(info.holders),
                               tuple(n for n in info.holders if self.d.is_alive(n)),
                               info.size, info.dtype, tuple(info.shape), info.version))

    # --- instructions out ---
    def _execute(self, ins: p.Instruction) -> None:
        if self._opening or self._held:
            self._held.append(ins)
            return
        if _is_repair(ins, self.plan.merged):
            log.info("reduce %s repair: %s", self.result.short(), ins)
        INSTRUCTION_HANDLERS[type(ins)](self, ins)

    def _on_start_task(self, ins: p.StartTask) -> None:
        task = self._spawn(self._start_task(ins), f"reduce-task-{ins.slot}",
                           functools.partial(p.SlotFailed, ins.slot, ins.gen))
        self._starting.add(task)
        task.add_done_callback(self._starting.discard)

    def _on_connect(self, ins: p.Connect) -> None:
        plain = ins.start == 0 and ins.until == 0  # not a fold's part of a child
        self._spawn(self._connect(ins), f"reduce-connect-{ins.parent_slot}",
                    functools.partial(p.SlotFailed, ins.parent_slot, None,
                                      child=ins.child_slot if plain else None,
                                      version=ins.parent_version))

    def _on_hurry(self, ins: p.Hurry) -> None:
        self.d.rpc.tell(ins.parent_node, ReduceHurry(
            reduce_id=self.result, slot=ins.parent_slot, version=ins.parent_version,
            child=ins.child_slot))

    def _on_fold(self, ins: p.Fold) -> None:
        self._spawn(self._fold(ins), f"reduce-fold-{ins.slot}",
                    functools.partial(p.FoldFailed, ins.slot, version=ins.version))

    def _on_reshape(self, ins: p.Reshape) -> None:
        self._spawn(self._reshape(ins), f"reduce-reshape-{ins.parent}",
                    functools.partial(p.SlotFailed, ins.parent, None, version=ins.version))

    def _on_pull_root(self, ins: p.PullRoot) -> None:
        if self.out is not None:  # None: the result could not be created (failed)
            self._pull_root(ins)

    def _on_wait_input(self, ins: p.WaitInput) -> None:
        self._wait(ins.oid, ins.exclude)

    def _on_after(self, ins: p.After) -> None:
        hold = isinstance(ins.event, p.HoldOver)
        self._spawn(self._after(ins), "reduce-hold" if hold else "reduce-retry",
                    p.ResultFailed)

    def _on_cancel_waits(self, ins: p.CancelWaits) -> None:
        for oid in ins.oids:
            wait = self._waits.get(oid)
            if wait is not None:
                wait.cancel()

    def _on_restart_result(self, ins: p.RestartResult) -> None:
        self._restart_result()

    def _on_publish(self, ins: p.Publish) -> None:
        assert self.out is not None
        self._spawn(self._publish(self.out), "reduce-publish", p.ResultFailed)

    def _on_fail(self, ins: p.Fail) -> None:
        self._fail(ins.error)

    def _on_release(self, ins: p.Release) -> None:
        self.d.tasks.spawn(self._release(ins.nodes), name="reduce-release")

    def _open_result(self, ins: p.OpenResult) -> None:
        """Create the result here and announce it at once, so gets can chain behind it."""
        self._create_result(ins, lambda out: self._opened(out, ins))

    def _create_result(self, ins: p.OpenResult | p.CombineInline,
                       then: Callable[[StoredObject], None]) -> None:
        """Create the result and do ``then`` with it. Out of room, it evicts and waits, and
        the instructions after it wait for it (docs/architecture.md §6)."""
        try:
            out = self.d.store.create(self.result, ins.size, ins.dtype, list(ins.shape))
        except CapacityError:
            self._opening = True
            self.d.tasks.spawn(self._create_when_room(ins, then), name="reduce-open")
            return
        except HopliteError as exc:
            self.feed(p.ResultFailed(exc))
            return
        then(out)

    async def _create_when_room(self, ins: p.OpenResult | p.CombineInline,
                                then: Callable[[StoredObject], None]) -> None:
        """Create the result once there is room, then carry out what was held meanwhile; no
        room by the deadline fails the reduce with the ``CapacityError``."""
        d = self.d
        out: StoredObject | None = None
        error: HopliteError | None = None
        try:
            out = await d.space.create(self.result, ins.size, ins.dtype, list(ins.shape),
                                       wait=brief_wait(self._deadline))
        except HopliteError as exc:
            error = exc
        except Exception as exc:  # a bug must still end the reduce, typed
            log.error("reduce %s: opening the result crashed", self.result.short(), exc_info=exc)
            error = HopliteError(f"reduce-open: {type(exc).__name__}: {exc}")
        finally:
            self._opening = False
        if out is None:
            assert error is not None
            self.feed(p.ResultFailed(error))  # held: after what the plan said before it
        elif self._ended:  # failed meanwhile: nothing will read or end it
            d.store.remove(self.result)
        else:
            then(out)
        held, self._held = self._held, []
        self._queue.resume(held)
        self._end_if_over()

    def _opened(self, out: StoredObject, ins: p.OpenResult) -> None:
        d = self.d
        self.out = out
        d.store.pin(out)
        out.producing = True  # if this node dies first, its shard fails the result's gets
        out.receivers = ins.receivers
        tasks = self._about_out = []
        if not d.arena.backed(out.offset, out.size):
            tasks.append(self._spawn(d.arena.populate(out.offset, out.size), "reduce-populate",
                                     p.ResultFailed))
        tasks.append(self._spawn(d.directory.announce(out), "reduce-announce", p.ResultFailed))
        tasks.append(self._spawn(self._until_complete(out), "reduce-result", p.ResultFailed))

    def _restart_result(self) -> None:
        """Replace the result by an empty one of a new version (docs/design.md §5): streams
        of the old one end, and its getters start over once the new one is announced."""
        old, d = self.out, self.d
        assert old is not None
        for task in (self._root_pull, *self._about_out):
            if task is not None:
                task.cancel()  # before the removal below fails what they wait on
        self._root_pull, self._about_out = None, []
        withdraw_result(d.store, old)
        d.store.unpin(old)
        self.out = None
        self._open_result(p.OpenResult(old.size, old.dtype, tuple(old.shape), old.receivers))

    def _pull_root(self, ins: p.PullRoot) -> None:
        """Pull the root's output into the result from its watermark; a pull that breaks for a
        reason another source could fix is the root slot's loss (the plan repairs it)."""
        out, shape = self.out, self.plan.shape
        assert out is not None and shape is not None

        def lost(error: HopliteError) -> p.Event:
            if out is not self.out:  # the result was started again: this pull is stale
                return p.ChildLost(None, shape.root, b"", 0, False, error)
            if out.error is None and is_retriable(error):
                return p.ChildLost(None, shape.root, ins.version, out.received,
                                   not self.d.is_alive(ins.node), error)
            return p.ResultFailed(error)
        self._root_pull = self._spawn(
            self.d.fetcher.pull_into(out, ins.node, ins.output, ins.version), "reduce-root",
            lost)

    async def _release(self, nodes: tuple[str, ...]) -> None:
        """Tell ``nodes`` the reduce ended, once every task request sent them was answered or
        failed: a ReduceDone that overtook its ReduceTask would find nothing to stop, and the
        task would then run on with nobody to end it."""
        await asyncio.gather(*self._starting, return_exceptions=True)
        for node in nodes:
            self.d.rpc.tell(node, ReduceDone(reduce_id=self.result))

    async def _after(self, ins: p.After) -> None:
        await asyncio.sleep(ins.delay)
        self.feed(ins.event)

    async def _until_complete(self, out: StoredObject) -> None:
        await out.wait_for(out.size)
        self.feed(p.ResultComplete())

    async def _start_task(self, ins: p.StartTask) -> None:
        frame = await self.d.rpc.call_node(ins.node, ReduceTask(
            reduce_id=self.result, slot=ins.slot, input=ins.input, output=ins.output,
            op=ins.op, dtype=ins.dtype, shape=list(ins.shape), children=ins.children,
            start=ins.start, lo=ins.lo, hi=ins.hi, extras=list(ins.extras)))
        self.feed(p.TaskStarted(ins.slot, ins.gen, frame.msg.version))

    async def _connect(self, ins: p.Connect) -> None:
        await self.d.rpc.call_node(ins.parent_node, ReduceChild(
            reduce_id=self.result, slot=ins.parent_slot, child=ins.child_slot,
            node=ins.child_node, oid=ins.child_output, version=ins.child_version,
            start=ins.start, until=ins.until, slot_version=ins.parent_version,
            window=None if ins.window is None else list(ins.window)))

    async def _fold(self, ins: p.Fold) -> None:
        frame = await self.d.rpc.call_node(ins.node, ReduceFold(
            reduce_id=self.result, slot=ins.into, version=ins.version, input=ins.input,
            input_version=ins.input_version, at=ins.at))
        self.feed(p.Folded(ins.slot, ins.into, frame.msg.at, ins.version))

    async def _reshape(self, ins: p.Reshape) -> None:
        frame = await self.d.rpc.call_node(ins.parent_node, ReduceReshape(
            reduce_id=self.result, slot=ins.parent, version=ins.version, child=ins.child,
            until=ins.until, more=ins.more))
        self.feed(p.Reshaped(ins.child, frame.msg.until))

    async def _publish(self, out: StoredObject) -> None:
        await self.d.directory.publish(out)
        self.feed(p.Published())

    def _combine_inline(self, ins: p.CombineInline) -> None:
        """Combine small inputs here; the result is then published with its bytes."""
        missing = [oid for oid in ins.parts if oid not in self._inline]
        if missing:
            self.feed(p.ResultFailed(HopliteError(f"input {missing[0].hex()} came without "
                                                  f"its bytes")))
            return
        self._create_result(ins, lambda out: self._combined(out, ins))

    def _combined(self, out: StoredObject, ins: p.CombineInline) -> None:
        dt = np.dtype(ins.dtype)
        arrays = [np.frombuffer(self._inline[oid], dtype=dt) for oid in ins.parts]
        total = functools.reduce(lambda a, b: OPS[ins.op](a, b), arrays[1:], arrays[0].copy())
        self.out = out
        self.d.store.pin(out)
        np.frombuffer(out.buffer, dtype=np.uint8)[:] = np.ascontiguousarray(total, dtype=dt).view(
            np.uint8).reshape(-1)
        out.advance(out.size)
        self.feed(p.ResultComplete())

    def _fail(self, error: HopliteError) -> None:
        """Drop the result here, stop pulling it, and record the failure at its shard."""
        log.warning("reduce %s failed: %s", self.result.short(), error)
        if self._root_pull is not None:
            self._root_pull.cancel()
        d = self.d
        if self.out is not None and d.store.get(self.result) is self.out:
            d.store.remove(self.result, error)
        if not self.deleted:  # a deleted result's id names nothing: no failure to record
            d.tasks.spawn(d.directory.fail(self.result, error), name="reduce-fail")

    def _end(self) -> None:
        """The reduce is over (published or failed): unpin the result, drop the waits."""
        self._ended = True
        self.ended.set()
        for wait in self._waits.values():
            wait.cancel()
        self._inline.clear()
        if self.out is not None:
            self.d.store.unpin(self.out)


def _is_repair(ins: p.Instruction, merged: Mapping[int, p.Merge]) -> bool:
    """Whether ``ins`` repairs the tree (logged): not a merge's fold or reshape, nor a task
    that adds several inputs, nor a late input's hold."""
    if (isinstance(ins, p.Fold) and ins.slot in merged
            or isinstance(ins, p.Reshape) and ins.child in merged
            or isinstance(ins, p.StartTask) and bool(ins.extras)
            or isinstance(ins, p.After) and isinstance(ins.event, p.HoldOver)):
        return False
    return (isinstance(ins, p.WaitInput | p.After | p.Fold | p.Reshape | p.RestartResult)
            or isinstance(ins, p.StartTask) and ins.gen > 0)


# How the coordinator carries out each kind of instruction (every kind the plan gives:
# tests/unit/test_reduce_plan.py checks).
INSTRUCTION_HANDLERS: dict[type, Callable[[ReduceCoordinator, Any], None]] = {
    p.OpenResult: ReduceCoordinator._open_result,
    p.StartTask: ReduceCoordinator._on_start_task,
    p.Connect: ReduceCoordinator._on_connect,
    p.Hurry: ReduceCoordinator._on_hurry,
    p.Fold: ReduceCoordinator._on_fold,
    p.Reshape: ReduceCoordinator._on_reshape,
    p.PullRoot: ReduceCoordinator._on_pull_root,
    p.WaitInput: ReduceCoordinator._on_wait_input,
    p.After: ReduceCoordinator._on_after,
    p.CancelWaits: ReduceCoordinator._on_cancel_waits,
    p.RestartResult: ReduceCoordinator._on_restart_result,
    p.CombineInline: ReduceCoordinator._combine_inline,
    p.Publish: ReduceCoordinator._on_publish,
    p.Fail: ReduceCoordinator._on_fail,
    p.Release: ReduceCoordinator._on_release,
}
