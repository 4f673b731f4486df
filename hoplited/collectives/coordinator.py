"""Reduce coordination: one coordinator per reduce, on the node of the caller.

The coordinator waits for the inputs (bounded long polls at their shards); the i-th to become
ready takes slot i of the tree (:mod:`.tree`); it starts a task on each slot's node
(:mod:`.worker`), tells parents where their children's outputs are, and pulls the root's output
into the result object, which it announces as soon as its size is known, so gets of the result
(allreduce) chain behind the reduce before it ends. Inputs of at most 64 KiB come inline from
their shards and are combined here (docs/design.md §4).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from hoplite_client.wire.errors import (HopliteError, HopliteTimeoutError, InvalidArgumentError,
                                        ObjectExistsError, ObjectNotFoundError, error_from_wire)
from hoplite_client.wire.frames import INLINE_MAX, Frame
from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.messages import (ObjectInfo, ReduceChild, ReduceDone, ReduceFailed,
                                          ReduceTask, WireMessage)

from hoplited.cluster.link_model import LinkModel
from hoplited.collectives.ops import OPS, check_op, check_reducible, derived_id
from hoplited.collectives.tree import TreeShape, tree_depth, tree_shape
from hoplited.directory.client import DirectoryClient
from hoplited.dispatch import Handler
from hoplited.memory.arena import Arena
from hoplited.memory.store import ObjectStore, StoredObject
from hoplited.rpc import Rpc
from hoplited.tasks import Tasks
from hoplited.transfer.fetcher import Fetcher

log = logging.getLogger("hoplited.reduce")

# A coordinator re-asks a shard for an input this often; a wait it abandons (a backup input
# not needed any more) then ends on the shard within this time.
LONG_POLL = 30.0


@dataclass(frozen=True)
class CoordinatorDeps:
    """What a coordinator uses: this node's id, store and arena, the directory, peers."""

    me: str
    store: ObjectStore
    arena: Arena
    directory: DirectoryClient
    rpc: Rpc
    fetcher: Fetcher
    link_model: LinkModel
    is_alive: Callable[[str], bool]
    tasks: Tasks


class Reductions:
    """The reduces coordinated on this node, by result id; owns their lifetime."""

    def __init__(self, deps: CoordinatorDeps) -> None:
        self._deps = deps
        self._running: dict[ObjectID, ReduceCoordinator] = {}

    def handlers(self) -> dict[type[WireMessage], Handler]:
        return {ReduceFailed: self.on_slot_failed}

    def __len__(self) -> int:
        return len(self._running)

    def start(self, result: ObjectID, inputs: list[ObjectID], op: str, k: int,
              timeout: Optional[float]) -> None:
        """Validate and start a reduce into ``result``; it runs in the background."""
        if not inputs or not 1 <= k <= len(inputs):
            raise InvalidArgumentError(f"num_objects must be between 1 and the "
                                       f"{len(inputs)} inputs")
        check_op(op)
        if result in self._running or self._deps.store.get(result) is not None:
            raise ObjectExistsError(f"object {result.hex()} already exists")
        coordinator = ReduceCoordinator(self._deps, result, inputs, op, k, timeout)
        self._running[result] = coordinator
        coordinator.start()

    async def reduced_inputs(self, result: ObjectID, timeout: Optional[float]) -> list[ObjectID]:
        """Which inputs the reduce into ``result`` used, once it has chosen them."""
        coordinator = self._running.get(result)
        if coordinator is None:
            raise ObjectNotFoundError(f"no reduce into {result.hex()} was issued on this node")
        return await coordinator.reduced_inputs(timeout)

    def forget(self, result: ObjectID) -> None:
        """The result was deleted: nothing about this reduce is kept any more."""
        self._running.pop(result, None)

    def on_slot_failed(self, peer: str, msg: ReduceFailed,
                       payload: Optional[memoryview]) -> None:
        coordinator = self._running.get(msg.reduce_id)
        if coordinator is not None:
            coordinator.slot_failed(msg)


@dataclass
class Placed:
    node: str
    output: ObjectID
    version: bytes


class ReduceCoordinator:
    """Drives one reduce from the caller's node: slots, tasks, edges, the result."""

    def __init__(self, deps: CoordinatorDeps, result: ObjectID, inputs: list[ObjectID],
                 op: str, k: int, timeout: Optional[float]) -> None:
        self.d = deps
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
        self.runner = self.d.tasks.spawn(self._run(), name=f"reduce-{self.result.short()}")

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
                await self.d.directory.publish(self.out)
        except HopliteError as exc:
            self._fail(exc)
        except asyncio.CancelledError:
            self._fail(HopliteError("the daemon is shutting down"))
            raise
        finally:
            if self.out is not None:
                self.d.store.unpin(self.out)
            for node in self.task_nodes:
                self.d.rpc.tell(node, ReduceDone(reduce_id=self.result))

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

    async def _wait_ready(self, oid: ObjectID,
                          deadline: Optional[float]) -> Frame[ObjectInfo]:
        """Wait for ``oid`` in bounded polls, so a shard never keeps a waiter we gave up on."""
        loop = asyncio.get_running_loop()
        while True:
            remaining = None if deadline is None else max(0.0, deadline - loop.time())
            poll = LONG_POLL if remaining is None else min(remaining, LONG_POLL)
            try:
                return await self.d.directory.wait_object(oid, poll)
            except HopliteTimeoutError:
                if remaining is not None and remaining <= LONG_POLL:
                    raise

    async def _place(self, oid: ObjectID, frame: Frame[ObjectInfo]) -> None:
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
        if root in free and self.d.me in info.holders:
            return root
        others = [s for s in free if s != root]
        return others[0] if others else root

    async def _open_result(self, info: ObjectInfo) -> None:
        """Create the result here and announce it at once, so gets can chain behind it."""
        d = self.d
        self.out = d.store.create(self.result, info.size, info.dtype, info.shape)
        d.store.pin(self.out)
        d.tasks.spawn(d.arena.populate(self.out.offset, self.out.size), name="populate")
        model = d.link_model
        self.shape = tree_shape(self.k, tree_depth(self.k, info.size, model.bandwidth,
                                                   model.latency))
        await d.directory.announce(self.out)

    async def _place_slot(self, slot: int, oid: ObjectID, info: ObjectInfo) -> None:
        d, shape, me = self.d, self.shape, self.d.me
        assert shape is not None
        alive = [n for n in info.holders if d.is_alive(n)]
        node = me if me in info.holders else (alive or info.holders)[0]
        n_children = len(shape.children[slot])
        is_root = slot == shape.root
        if n_children == 0 and not (is_root and node == me):
            placed = Placed(node, oid, info.version)  # a leaf's output is its input
        else:
            output = self.result if is_root and node == me else derived_id(self.result, slot,
                                                                            b"out")
            frame = await d.rpc.call_node(node, ReduceTask(
                reduce_id=self.result, slot=slot, input=oid, output=output, op=self.op,
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
            d.tasks.spawn(self._pull_root(placed), name="reduce-root")

    async def _connect(self, parent: int, child: int) -> None:
        p, c = self.placed[parent], self.placed[child]
        await self.d.rpc.call_node(p.node, ReduceChild(
            reduce_id=self.result, slot=parent, node=c.node, oid=c.output, version=c.version))

    async def _pull_root(self, root: Placed) -> None:
        assert self.out is not None
        try:
            await self.d.fetcher.pull_into(self.out, root.node, root.output, root.version)
        except HopliteError as exc:
            self._fail(exc)

    def _finish_inline(self) -> None:
        """Combine small inputs here; ``_run`` then publishes the result with its bytes."""
        assert self.meta is not None
        dt = np.dtype(self.meta.dtype)
        arrays = [np.frombuffer(b, dtype=dt) for b in self.inline_parts]
        total = functools.reduce(lambda a, b: OPS[self.op](a, b), arrays[1:], arrays[0].copy())
        obj = self.d.store.create(self.result, self.meta.size, self.meta.dtype,
                                       self.meta.shape)
        obj.buffer[:] = np.ascontiguousarray(total, dtype=dt).view(np.uint8)
        obj.advance(obj.size)
        self.d.store.pin(obj)
        self.out = obj

    def _fail(self, error: HopliteError) -> None:
        if self.error is not None:
            return
        self.error = error
        self.chosen.set()
        log.warning("reduce %s failed: %s", self.result.short(), error)
        if self.runner is not None and self.runner is not asyncio.current_task():
            self.runner.cancel()
        d = self.d
        if d.store.get(self.result) is self.out and self.out is not None:
            d.store.remove(self.result, error)
        d.tasks.spawn(d.directory.fail(self.result, error), name="reduce-fail")
