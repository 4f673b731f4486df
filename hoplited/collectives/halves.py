"""Two trees of halves: a reduce whose inputs' two halves climb two complete trees at once.

A reduce of every listed input (k = n) into a result on this node is driven by a
:class:`HalvesReduce`. It waits for the inputs itself and, once the first is ready, knows the
size and decides (``choose.reduce_shape``, pure):

- one tree: the plain coordinator runs under the result's id;
- two trees of halves: two coordinators run under the halves' own ids, each reducing one half
  of every input (``ReduceSpec(window=, half=)``) into a view of the result, a composite of
  the two halves (the striped allreduce's memory, :mod:`hoplited.memory.store`).

Both plans get every ready input, in one order, so the i-th input takes complementary slots
and no node is inner in both trees (docs/simulation.md §6). The result is complete once both
views are: it is published and the halves' ids are dropped. A half that fails fails the
reduce: the other stops, the result is dropped and the failure recorded at the result's shard.
A lost input is each half's own repair (a lost slot is placed anew, docs/design.md §5); a
backup cannot stand in (k = n), so one half never sums other inputs than the other.
docs/design.md §4, "Two trees of halves".
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from hoplite_client.wire.errors import (
    HopliteError,
    ObjectDeletedError,
)
from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.messages import ObjectInfo
from hoplited.collectives import plan as p
from hoplited.collectives.coordinator import ReduceCoordinator, reduce_ended, wait_ready
from hoplited.collectives.ops import derived_id
from hoplited.directory.client import DirectoryClient
from hoplited.memory.arena import Arena
from hoplited.memory.store import ObjectStore, StoredObject
from hoplited.tasks import Tasks

log = logging.getLogger("hoplited.reduce")


def half_id(result: ObjectID, half: int) -> ObjectID:
    """The id of half ``half`` of ``result``: that half's reduce produces it."""
    return derived_id(result, half, b"half")


@dataclass(frozen=True, kw_only=True)
class HalvesDeps:
    """What a reduce in halves uses: the store, the arena, the directory, liveness and tasks;
    ``open(oid, window, half)``: a coordinator for the result (no window) or one half, started
    with its waits shared; ``close(oid)``: forget it (a running one stops); ``choose(size,
    dtype)``: the halves' bounds or None, as ``choose.reduce_shape`` decides for this node's
    link model."""

    store: ObjectStore
    arena: Arena
    directory: DirectoryClient
    is_alive: Callable[[str], bool]
    tasks: Tasks
    open: Callable[[ObjectID, tuple[int, int] | None, int | None], ReduceCoordinator]
    close: Callable[[ObjectID], object]
    choose: Callable[[int, str], list[tuple[int, int]] | None]


class HalvesReduce:
    """One reduce of every input into ``result``, as one tree or two trees of halves."""

    def __init__(self, deps: HalvesDeps, result: ObjectID, inputs: list[ObjectID],
                 deadline: float | None) -> None:
        self.d = deps
        self.result = result
        self._inputs = list(dict.fromkeys(inputs))
        self._deadline = deadline
        self.parts: list[ReduceCoordinator] = []  # the one tree, or the two halves
        self.whole: StoredObject | None = None  # two trees: the composite result
        self.error: HopliteError | None = None
        self.ended = asyncio.Event()
        self.deleted = False
        self._waits: list[asyncio.Task[None]] = []

    def start(self) -> None:
        for oid in self._inputs:
            self._waits.append(self._spawn(self._wait(oid), f"reduce-wait-{oid.short()}",
                                           functools.partial(self._input_failed, oid)))

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str,
               on_error: Callable[[HopliteError], None]) -> asyncio.Task[None]:
        def failed(exc: BaseException) -> None:
            if not isinstance(exc, HopliteError):  # a bug must still end the reduce, typed
                log.error("reduce %s: %s crashed", self.result.short(), name, exc_info=exc)
                exc = HopliteError(f"{name}: {type(exc).__name__}: {exc}")
            on_error(exc)
        return self.d.tasks.spawn(coro, name=name, on_error=failed)

    async def _wait(self, oid: ObjectID) -> None:
        frame = await wait_ready(self.d.directory, self.d.is_alive, oid, self._deadline)
        if self.ended.is_set():
            return
        if not self.parts:
            self._decide(frame.msg)
        for part in self.parts:
            part.ready(oid, frame)

    def _input_failed(self, oid: ObjectID, error: HopliteError) -> None:
        """An input never came: before any decision, one tree's plan says what that means."""
        if self.ended.is_set():
            return
        if not self.parts:
            self._one_tree()
        for part in self.parts:
            part.feed(p.InputFailed(oid, error))

    def _decide(self, first: ObjectInfo) -> None:
        halves = self.d.choose(first.size, first.dtype)
        if halves is None:
            self._one_tree()
            return
        d = self.d
        try:
            whole = d.store.create_composite(
                self.result, first.size, first.dtype, list(first.shape),
                [(half_id(self.result, h), lo, hi) for h, (lo, hi) in enumerate(halves)])
        except HopliteError as exc:  # no room (CapacityError): the reduce fails with it
            self._fail(exc)
            return
        self.whole = whole
        d.store.pin(whole)
        whole.temporary = False  # the result: announced now, so gets can wait behind it
        whole.producing = True  # if this node dies first, its shard fails the result's gets
        self._spawn(d.directory.announce(whole), "reduce-announce", self._fail)
        self._spawn(self._until_complete(whole), "reduce-result", self._fail)
        log.info("reduce %s: two trees of halves %s", self.result.short(), halves)
        self.parts = [d.open(half_id(self.result, h), bounds, h)
                      for h, bounds in enumerate(halves)]
        for part in self.parts:
            self._spawn(self._watch(part), "reduce-half", self._fail)

    def _one_tree(self) -> None:
        part = self.d.open(self.result, None, None)
        self.parts = [part]
        self._spawn(self._watch(part), "reduce-whole", self._fail)

    async def _watch(self, part: ReduceCoordinator) -> None:
        """A part ended: its failure is the reduce's; one tree's success is the reduce's."""
        await part.ended.wait()
        if part.error is not None:
            self._fail(part.error)
        elif self.whole is None:
            self._end()

    async def _until_complete(self, whole: StoredObject) -> None:
        """Both views are filled: publish the result."""
        await whole.wait_for(whole.size)
        await self.d.directory.publish(whole)
        self._end()

    async def reduced_inputs(self, timeout: float | None) -> list[ObjectID]:
        """The inputs in the result, in the order they became ready, once it is complete."""
        await reduce_ended(self.ended, self.result, timeout)
        if self.error is not None:
            raise self.error
        return list(self.parts[0].plan.used)

    def delete(self) -> None:
        """The result was deleted: a reduce still running into it stops."""
        self.deleted = True
        self._fail(ObjectDeletedError(f"the result {self.result.hex()} was deleted before "
                                      f"the reduce finished", oid=self.result.hex()))

    def _fail(self, error: HopliteError) -> None:
        """Stop every part, drop the result here and record why at its shard."""
        if self.ended.is_set():
            return
        self.error = error
        d = self.d
        if self.whole is None and self.parts:  # one tree: its coordinator did (or does) it
            if self.deleted:
                d.close(self.result)
            self._end()
            return
        log.warning("reduce %s failed: %s", self.result.short(), error)
        for part in self.parts:
            part.deleted = True  # nobody gets a half: nothing to record at its shard
            d.close(part.result)
        if self.whole is not None and d.store.get(self.result) is self.whole:
            d.store.remove(self.result, error)
        if not self.deleted:
            d.tasks.spawn(d.directory.fail(self.result, error), name="reduce-fail")
        self._end()

    def _end(self) -> None:
        self.ended.set()
        for wait in self._waits:
            wait.cancel()
        if self.whole is not None:
            self.d.store.unpin(self.whole)
            self.d.tasks.spawn(self._drop_halves(), name="reduce-halves")

    async def _drop_halves(self) -> None:
        """Once the halves' coordinators ended, forget them and drop their entries."""
        for part in self.parts:
            await part.ended.wait()
            self.d.close(part.result)
            try:
                await self.d.directory.delete(part.result)
            except HopliteError as exc:  # no entry (never announced), or its shard is gone
                log.debug("half %s not dropped: %s", part.result.short(), exc)
