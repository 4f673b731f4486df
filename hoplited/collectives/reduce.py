"""Reduce: a coordinator on the caller's node and tree-node tasks on the inputs' holders.

The coordinator waits for the inputs; the i-th to become ready (complete somewhere) takes
slot i of the tree (``reduce_tree``). A slot with children runs a task on the node holding its
input: the task pulls each child's output stream into a buffer and, block by block, combines
the prefix every child has delivered with its own input (``np.add(..., out=...)`` on slices),
advancing its output's watermark; its parent pulls that output while it grows, so the whole
tree is pipelined. A leaf's output is its input itself. The root's output streams into the
result object on the coordinator, which is announced as soon as its size is known, so gets of
the result (allreduce) start before the reduce ends. Inputs of at most 64 KiB travel inline
from their directory shards and are combined by the coordinator alone.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

import numpy as np

from hoplite_client.wire.errors import (
    HopliteError,
    HopliteTimeoutError,
    InvalidArgumentError,
    ObjectNotFoundError,
    error_from_wire,
)
from hoplite_client.wire.frames import INLINE_MAX, Frame
from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.messages import (
    Announce,
    FailEntry,
    Holding,
    ObjectInfo,
    ReduceChild,
    ReduceDone,
    ReduceFailed,
    ReduceTask,
    WaitObject,
)
from hoplited.collectives.tree import TreeShape, tree_depth, tree_shape
from hoplited.memory.store import StoredObject

if TYPE_CHECKING:
    from hoplited.node import Daemon

log = logging.getLogger("hoplited.reduce")

OPS = {"sum": np.add, "min": np.minimum, "max": np.maximum, "prod": np.multiply}
NUMERIC_KINDS = "biufc"  # bool, signed, unsigned, float, complex
# Bytes combined per step: small enough to forward soon, big enough to amortise the call.
COMPUTE_BLOCK = 4 * 1024 * 1024
# A coordinator re-asks a shard for an input this often; a wait it abandons (a backup input
# not needed any more) then ends on the shard within this time.
LONG_POLL = 30.0
# Blocks at least this big are combined in a worker thread (numpy drops the GIL meanwhile).
THREAD_BLOCK = 512 * 1024


def derived_id(result: ObjectID, slot: int, tag: bytes) -> ObjectID:
    """The id of a reduce's temporary object (slot output or child buffer)."""
    digest = hashlib.blake2b(result.binary() + slot.to_bytes(4, "big") + tag, digest_size=20)
    return ObjectID(digest.digest())


def check_reducible(op: str, dtype: str) -> None:
    if op not in OPS:
        raise InvalidArgumentError(f"unknown reduce op {op!r}; ops: {', '.join(OPS)}")
    if np.dtype(dtype).kind not in NUMERIC_KINDS:
        raise InvalidArgumentError(f"cannot reduce dtype {dtype}: numeric types only")


def combine(op: str, dtype: np.dtype, own: memoryview, others: list[memoryview],
            out: memoryview) -> None:
    """out = own ⊕ others[0] ⊕ ... elementwise (all byte views of equal length)."""
    o = np.frombuffer(out, dtype=dtype)
    a = np.frombuffer(own, dtype=dtype)
    if not others:
        o[...] = a
        return
    ufunc = OPS[op]
    ufunc(a, np.frombuffer(others[0], dtype=dtype), out=o)
    for other in others[1:]:
        ufunc(o, np.frombuffer(other, dtype=dtype), out=o)


# --------------------------------------------------------------------------- tree nodes ---
@dataclass
class SlotTask:
    """One slot of a reduce being computed on this node."""

    reduce_id: ObjectID
    slot: int
    coordinator: str
    op: str
    dtype: np.dtype
    own: StoredObject
    out: StoredObject
    expected: int
    children: list[StoredObject] = field(default_factory=list)
    all_children: asyncio.Event = field(default_factory=asyncio.Event)
    runner: Optional[asyncio.Task[None]] = None
    pulls: list[asyncio.Task[None]] = field(default_factory=list)


class ReduceWorker:
    """Runs the tree-node tasks this node was given."""

    def __init__(self, daemon: "Daemon") -> None:
        self.daemon = daemon
        self.tasks: dict[tuple[ObjectID, int], SlotTask] = {}

    async def start(self, coordinator: str, msg: ReduceTask) -> bytes:
        """Create the slot's output and start computing it; returns the output's version."""
        store = self.daemon.store
        own = store.get(msg.input)
        if own is None or not own.complete:
            raise ObjectNotFoundError(f"input {msg.input.hex()} is not complete here")
        if own.dtype != msg.dtype or own.shape != msg.shape:
            raise InvalidArgumentError(f"input {msg.input.hex()} is {own.dtype}{own.shape}, "
                                       f"not {msg.dtype}{msg.shape}")
        out = store.get(msg.output) if msg.output == msg.reduce_id else None
        if out is None:
            out = store.create(msg.output, own.size, own.dtype, own.shape, temporary=True)
            self.daemon.spawn(self.daemon.arena.populate(out.offset, out.size), "populate")
        store.pin(own)
        store.pin(out)
        task = SlotTask(msg.reduce_id, msg.slot, coordinator, msg.op, np.dtype(msg.dtype), own,
                        out, msg.children)
        if msg.children == 0:
            task.all_children.set()
        self.tasks[(msg.reduce_id, msg.slot)] = task
        task.runner = self.daemon.spawn(self._run(task), f"reduce-{msg.slot}")
        return out.version

    def add_child(self, msg: ReduceChild) -> None:
        """A child of one of our slots is placed: pull its output into a buffer of ours."""
        task = self.tasks.get((msg.reduce_id, msg.slot))
        if task is None:
            raise ObjectNotFoundError(f"no task for slot {msg.slot} of {msg.reduce_id.hex()}")
        store = self.daemon.store
        buf = store.create(derived_id(msg.reduce_id, msg.slot, b"in%d" % len(task.children)),
                           task.own.size, task.own.dtype, task.own.shape, temporary=True)
        store.pin(buf)
        task.children.append(buf)
        task.pulls.append(self.daemon.spawn(self._pull_child(task, buf, msg), "reduce-pull"))
        if len(task.children) == task.expected:
            task.all_children.set()

    async def _pull_child(self, task: SlotTask, buf: StoredObject, msg: ReduceChild) -> None:
        daemon = self.daemon
        daemon.spawn(daemon.arena.populate(buf.offset, buf.size), "populate")
        try:
            await daemon.transfers.pull_into(buf, msg.node, msg.oid, msg.version)
        except HopliteError as exc:
            buf.fail(exc)

    async def _run(self, task: SlotTask) -> None:
        try:
            await task.all_children.wait()
            await self._compute(task)
        except HopliteError as exc:
            log.warning("reduce %s slot %d failed: %s", task.reduce_id.short(), task.slot, exc)
            task.out.fail(exc)
            self.daemon.tell(task.coordinator, ReduceFailed(
                reduce_id=task.reduce_id, slot=task.slot, code=exc.code, message=str(exc)))

    async def _compute(self, task: SlotTask) -> None:
        loop = asyncio.get_running_loop()
        size, item = task.out.size, task.dtype.itemsize
        pos = 0
        while pos < size:
            ready = size
            for child in task.children:
                ready = min(ready, await child.wait_for(min(pos + item, size)))
            end = min(ready, pos + COMPUTE_BLOCK)
            end -= (end - pos) % item
            args = (task.op, task.dtype, task.own.buffer[pos:end],
                    [c.buffer[pos:end] for c in task.children], task.out.buffer[pos:end])
            if end - pos >= THREAD_BLOCK:
                await loop.run_in_executor(None, combine, *args)
            else:
                combine(*args)
            task.out.advance(end)
            pos = end

    def done(self, reduce_id: ObjectID) -> None:
        """The reduce ended: stop its tasks here and free their buffers."""
        store = self.daemon.store
        for key in [k for k in self.tasks if k[0] == reduce_id]:
            task = self.tasks.pop(key)
            for t in [task.runner, *task.pulls]:
                if t is not None:
                    t.cancel()
            store.unpin(task.own)
            for obj in [task.out, *task.children]:
                store.unpin(obj)
                if obj.temporary and store.get(obj.oid) is obj:
                    store.remove(obj.oid)


# -------------------------------------------------------------------------- coordinator ---
@dataclass
class Placed:
    node: str
    output: ObjectID
    version: bytes


class ReduceCoordinator:
    """Drives one reduce from the caller's node: slots, tasks, edges, the result."""

    def __init__(self, daemon: "Daemon", result: ObjectID, inputs: list[ObjectID], op: str,
                 k: int, timeout: Optional[float]) -> None:
        self.daemon = daemon
        self.result = result
        self.inputs = inputs
        self.op = op
        self.k = k
        self.timeout = timeout
        self.used: list[ObjectID] = []
        self.chosen = asyncio.Event()
        self.error: Optional[HopliteError] = None
        self.shape: Optional[TreeShape] = None
        self.meta: Optional[ObjectInfo] = None
        self.placed: dict[int, Placed] = {}
        self.task_nodes: set[str] = set()
        self.out: Optional[StoredObject] = None
        self.inline_parts: list[bytes] = []
        self.runner: Optional[asyncio.Task[None]] = None

    def start(self) -> None:
        self.runner = self.daemon.spawn(self._run(), f"reduce-{self.result.short()}")

    async def reduced_inputs(self, timeout: Optional[float]) -> list[ObjectID]:
        """The inputs in the result, in the order they became ready (once all are chosen)."""
        try:
            await asyncio.wait_for(self.chosen.wait(), timeout)
        except asyncio.TimeoutError:
            raise HopliteTimeoutError(f"reduce {self.result.hex()} has not chosen its inputs "
                                      f"within {timeout}s") from None
        if self.error is not None:
            raise self.error
        return list(self.used)

    def slot_failed(self, msg: ReduceFailed) -> None:
        """A tree node reported that its slot cannot be computed."""
        self._fail(error_from_wire(msg.code, f"slot {msg.slot}: {msg.message}", {}))

    async def _run(self) -> None:
        try:
            await self._collect()
            if self.out is not None:
                await self.out.wait_for(self.out.size)
                await self.daemon.publish(self.result)
        except HopliteError as exc:
            self._fail(exc)
        except asyncio.CancelledError:
            self._fail(HopliteError("the daemon is shutting down"))
            raise
        finally:
            if self.out is not None:
                self.daemon.store.unpin(self.out)
            for node in self.task_nodes:
                self.daemon.tell(node, ReduceDone(reduce_id=self.result))

    async def _collect(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = None if self.timeout is None else loop.time() + self.timeout
        pending = {asyncio.ensure_future(self._wait_ready(oid, deadline)): oid
                   for oid in self.inputs}
        try:
            while len(self.used) < self.k:
                if not pending:
                    raise ObjectNotFoundError("fewer inputs became ready than the reduce needs")
                done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for fut in done:
                    oid = pending.pop(fut)
                    frame = fut.result()
                    if len(self.used) < self.k:
                        await self._place(oid, frame)
        finally:
            for fut in pending:
                fut.cancel()
        self.chosen.set()
        if self.inline_parts:
            self._finish_inline()

    async def _wait_ready(self, oid: ObjectID, deadline: Optional[float]) -> Frame:
        """Wait for ``oid`` in bounded polls, so a shard never keeps a waiter we gave up on."""
        loop = asyncio.get_running_loop()
        while True:
            remaining = None if deadline is None else max(0.0, deadline - loop.time())
            poll = LONG_POLL if remaining is None else min(remaining, LONG_POLL)
            try:
                return await self.daemon.call_owner(
                    oid, lambda rid, t=poll: WaitObject(rid=rid, oid=oid, timeout=t))
            except HopliteTimeoutError:
                if remaining is not None and remaining <= LONG_POLL:
                    raise

    async def _place(self, oid: ObjectID, frame: Frame) -> None:
        info: ObjectInfo = frame.msg
        if self.meta is None:
            check_reducible(self.op, info.dtype)
            self.meta = info
            if info.size > INLINE_MAX:
                await self._open_result(info)
        elif (info.dtype, info.shape) != (self.meta.dtype, self.meta.shape):
            raise InvalidArgumentError(
                f"input {oid.hex()} is {info.dtype}{info.shape} but the first input was "
                f"{self.meta.dtype}{self.meta.shape}", oid=oid.hex())
        self.used.append(oid)
        if info.size <= INLINE_MAX:
            self.inline_parts.append(bytes(frame.payload) if frame.payload is not None else b"")
            return
        await self._place_slot(self._next_slot(info), oid, info)

    def _next_slot(self, info: ObjectInfo) -> int:
        """Slots go in order of readiness, except that an input held on this node takes the
        root: the result is then computed in place, and this node's link carries no second
        stream (the root's output) on top of its child's."""
        assert self.shape is not None
        root = self.shape.root
        free = [s for s in range(self.shape.size) if s not in self.placed]
        if root in free and self.daemon.node_id in info.holders:
            return root
        others = [s for s in free if s != root]
        return others[0] if others else root

    async def _open_result(self, info: ObjectInfo) -> None:
        """Create the result here and announce it at once, so gets can chain behind it."""
        d = self.daemon
        self.out = d.store.create(self.result, info.size, info.dtype, info.shape)
        d.store.pin(self.out)
        d.spawn(d.arena.populate(self.out.offset, self.out.size), "populate")
        model = d.links_model
        self.shape = tree_shape(self.k, tree_depth(self.k, info.size, model.bandwidth,
                                                   model.latency))
        holding = Holding(oid=self.result, size=info.size, dtype=info.dtype, shape=info.shape,
                          version=self.out.version, received=0)
        await d.call_owner(self.result, lambda rid: Announce(rid=rid, holdings=[holding]))

    async def _place_slot(self, slot: int, oid: ObjectID, info: ObjectInfo) -> None:
        d, shape, me = self.daemon, self.shape, self.daemon.node_id
        assert shape is not None
        alive = [n for n in info.holders if d.membership.is_alive(n)]
        node = me if me in info.holders else (alive or info.holders)[0]
        n_children = len(shape.children[slot])
        is_root = slot == shape.root
        if n_children == 0 and not (is_root and node == me):
            placed = Placed(node, oid, info.version)  # a leaf's output is its input
        else:
            output = self.result if is_root and node == me else derived_id(self.result, slot,
                                                                            b"out")
            frame = await d.call_node(node, lambda rid: ReduceTask(
                rid=rid, reduce_id=self.result, slot=slot, input=oid, output=output, op=self.op,
                dtype=info.dtype, shape=info.shape, children=n_children))
            self.task_nodes.add(node)
            placed = Placed(node, output, frame.msg.version)
        self.placed[slot] = placed
        parent = shape.parent[slot]
        if parent is not None and parent in self.placed:
            await self._connect(parent, slot)
        for child in shape.children[slot]:
            if child in self.placed:
                await self._connect(slot, child)
        if is_root and placed.output != self.result:
            assert self.out is not None
            d.spawn(self._pull_root(placed), "reduce-root")

    async def _connect(self, parent: int, child: int) -> None:
        p, c = self.placed[parent], self.placed[child]
        await self.daemon.call_node(p.node, lambda rid: ReduceChild(
            rid=rid, reduce_id=self.result, slot=parent, node=c.node, oid=c.output,
            version=c.version))

    async def _pull_root(self, root: Placed) -> None:
        assert self.out is not None
        try:
            await self.daemon.transfers.pull_into(self.out, root.node, root.output, root.version)
        except HopliteError as exc:
            self._fail(exc)

    def _finish_inline(self) -> None:
        """Combine small inputs here; ``_run`` then publishes the result with its bytes."""
        assert self.meta is not None
        dt = np.dtype(self.meta.dtype)
        arrays = [np.frombuffer(b, dtype=dt) for b in self.inline_parts]
        total = functools.reduce(lambda a, b: OPS[self.op](a, b), arrays[1:], arrays[0].copy())
        obj = self.daemon.store.create(self.result, self.meta.size, self.meta.dtype,
                                       self.meta.shape)
        obj.buffer[:] = np.ascontiguousarray(total, dtype=dt).view(np.uint8)
        obj.advance(obj.size)
        self.daemon.store.pin(obj)
        self.out = obj

    def _fail(self, error: HopliteError) -> None:
        if self.error is not None:
            return
        self.error = error
        self.chosen.set()
        log.warning("reduce %s failed: %s", self.result.short(), error)
        if self.runner is not None and self.runner is not asyncio.current_task():
            self.runner.cancel()
        d = self.daemon
        if d.store.get(self.result) is self.out and self.out is not None:
            d.store.remove(self.result, error)
        d.spawn(d.call_owner(self.result, lambda rid: FailEntry(
            rid=rid, oid=self.result, code=error.code, message=str(error))), "reduce-fail")
