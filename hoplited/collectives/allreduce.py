"""Striped allreduce: the driver of :class:`~.stripes.AllreducePlan`, and each member's part.

The caller's node runs an :class:`Orchestrator`: it waits for the inputs at their shards, feeds
the plan, and sends ``StripeTask`` to the nodes the plan assigns stripes to. Each such node runs
a :class:`Member`: it allocates the result once, as a composite whose stripes are views of its
memory (:mod:`hoplited.memory.store`), reduces the stripes assigned to it (a reduce of a window
of the inputs, into the view: :class:`~.coordinator.Reductions`) and fetches every other stripe
into its view like any object, from whichever node the stripe's shard names, so stripes chain
through the members as broadcasts do. When every region is filled the result is complete with
no copy: the member publishes it and reports. docs/design.md §4, "Striped allreduce".
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import numpy as np

from hoplite_client.wire.errors import (
    HopliteError,
    InvalidArgumentError,
    ObjectDeletedError,
    ObjectExistsError,
    ObjectNotFoundError,
    PeerUnavailableError,
    error_from_wire,
)
from hoplite_client.wire.frames import INLINE_MAX, MAX_IDS_PER_FRAME
from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.messages import (
    AllreduceFailed,
    Ok,
    StripeReport,
    StripeTask,
    WireMessage,
)
from hoplited.collectives import stripes as s
from hoplited.collectives.coordinator import wait_ready
from hoplited.collectives.ops import check_op
from hoplited.collectives.reductions import Reductions
from hoplited.directory.client import DirectoryClient
from hoplited.dispatch import Handler
from hoplited.memory.store import VERSION_SIZE, ObjectStore, check_meta
from hoplited.rpc import Rpc
from hoplited.tasks import Tasks
from hoplited.transfer.fetcher import Fetcher

log = logging.getLogger("hoplited.allreduce")

# A member's fetch of a stripe that failed (its reducer died, a source vanished) asks again
# after this long, until the result is complete here or the allreduce ends: the stripe is
# being reduced again elsewhere (its shard names the new reducer once it announces).
STRIPE_RETRY = 0.2


@dataclass(frozen=True)
class AllreduceDeps:
    """What allreduces use: this node's id, store, the directory, peers, the fetcher, the
    reduces (each stripe is one), liveness and the live members (the ring, in id order)."""

    me: str
    store: ObjectStore
    directory: DirectoryClient
    rpc: Rpc
    fetcher: Fetcher
    reductions: Reductions
    is_alive: Callable[[str], bool]
    tasks: Tasks
    members: Callable[[], list[str]]


class Allreduces:
    """The allreduces orchestrated on this node and the members it takes part in."""

    def __init__(self, deps: AllreduceDeps) -> None:
        self._d = deps
        self._orchestrators: dict[ObjectID, Orchestrator] = {}
        self._members: dict[ObjectID, Member] = {}

    def handlers(self) -> dict[type[WireMessage], Handler]:
        return {StripeTask: self.on_stripe_task, StripeReport: self.on_report,
                AllreduceFailed: self.on_failed}

    def __len__(self) -> int:
        return len(self._orchestrators) + len(self._members)

    def start(self, result: ObjectID, inputs: list[ObjectID], op: str,
              timeout: float | None) -> None:
        """Validate and start an allreduce into ``result``; it runs in the background."""
        plan = s.AllreducePlan(result, inputs, op)
        if result in self._orchestrators or self._d.store.get(result) is not None:
            raise ObjectExistsError(f"object {result.hex()} already exists")
        orchestrator = Orchestrator(self._d, plan, inputs, timeout,
                                    lambda: self._orchestrators.pop(result, None))
        self._orchestrators[result] = orchestrator
        orchestrator.start()

    def forget(self, result: ObjectID) -> bool:
        """``result`` was deleted: whatever runs into it here stops. Whether anything did."""
        orchestrator = self._orchestrators.pop(result, None)
        member = self._members.pop(result, None)
        error = ObjectDeletedError(f"the result {result.hex()} was deleted", oid=result.hex())
        if orchestrator is not None:
            orchestrator.abort(error)
        if member is not None:
            member.stop(error)
        return orchestrator is not None or member is not None

    def node_died(self, node: str) -> None:
        """A member died: its stripes are reduced again elsewhere. A member whose caller's
        node died stops (nobody would reassign a stripe or end the allreduce any more) and
        records the failure at the result's shard, as the caller's node would have: gets of
        the result anywhere then fail with that error instead of waiting out their timeouts
        (a result already complete somewhere is left alone). A member only suspected keeps
        its stripes (docs/design.md §4)."""
        for orchestrator in list(self._orchestrators.values()):
            orchestrator.feed(s.NodeLost(node))
        for member in [m for m in self._members.values() if m.caller == node]:
            error = PeerUnavailableError(f"node {node}, which ran the allreduce into "
                                         f"{member.result.hex()}, died", node=node)
            member.stop(error)
            self._d.tasks.spawn(self._record(member.result, error), name="allreduce-fail")

    async def _record(self, result: ObjectID, error: HopliteError) -> None:
        """Record the allreduce's failure at its result's shard, if that shard can be reached."""
        try:
            await self._d.directory.fail(result, error)
        except HopliteError as exc:  # its shard died too: gets there time out as before
            log.warning("allreduce %s: failure not recorded: %s", result.short(), exc)

    def on_stripe_task(self, peer: str, msg: StripeTask, payload: memoryview | None) -> Ok:
        member = self._members.get(msg.result)
        check_task(msg)
        if member is None:
            existing = self._d.store.get(msg.result)
            if existing is not None:  # complete here already, or fetched the plain way
                if existing.complete:
                    self._d.rpc.tell(peer, StripeReport(result=msg.result, stripe=-1, gen=0,
                                                        code="", message=""))
                return Ok()
            member = Member(self._d, msg, peer, lambda: self._members.pop(msg.result, None))
            self._members[msg.result] = member
        if msg.stripe >= 0:
            member.reduce(msg.stripe, msg.gen)
        return Ok()

    def on_report(self, peer: str, msg: StripeReport, payload: memoryview | None) -> None:
        orchestrator = self._orchestrators.get(msg.result)
        if orchestrator is None:
            return
        if not msg.code:
            orchestrator.feed(s.MemberDone(peer))
        else:
            orchestrator.feed(s.StripeFailed(peer, msg.stripe, msg.gen,
                                             error_from_wire(msg.code, msg.message, {})))

    def on_failed(self, peer: str, msg: AllreduceFailed, payload: memoryview | None) -> None:
        member = self._members.get(msg.result)
        if member is not None and member.caller == peer:
            member.stop(error_from_wire(msg.code, msg.message, {}))


def check_task(msg: StripeTask) -> None:
    """Refuse a stripe task no orchestrator sends: bad metadata, an unknown op, stripes that
    do not fit the inputs or the object (each must be larger than an inline object)."""
    check_meta(msg.dtype, list(msg.shape), msg.size)
    check_op(msg.op)
    n = len(msg.inputs)
    if (not 2 <= msg.stripes <= min(n, MAX_IDS_PER_FRAME) or not -1 <= msg.stripe < msg.stripes
            or msg.gen < 0 or len(msg.version) != VERSION_SIZE
            or msg.size // msg.stripes <= INLINE_MAX + s.ALIGN):
        raise InvalidArgumentError(f"a stripe task of {msg.size} bytes in {msg.stripes} "
                                   f"stripes of {n} inputs (stripe {msg.stripe}, generation "
                                   f"{msg.gen})")


async def drop_entry(directory: DirectoryClient, oid: ObjectID) -> None:
    """Delete a stripe's directory entry and its copies, if it has any."""
    try:
        await directory.delete(oid)
    except HopliteError as exc:  # no entry (nobody announced it), or its shard is gone
        log.debug("stripe %s not dropped: %s", oid.short(), exc)


class Orchestrator:
    """Carries out one allreduce's plan on the caller's node."""

    def __init__(self, deps: AllreduceDeps, plan: s.AllreducePlan, inputs: list[ObjectID],
                 timeout: float | None, forget: Callable[[], object]) -> None:
        self.d = deps
        self.plan = plan
        self._inputs = inputs  # as listed (repeats count twice, as in a reduce)
        self._timeout = timeout
        self._forget = forget
        self._waits: list[asyncio.Task[None]] = []
        self._assigning: list[asyncio.Task[None]] = []  # StripeTask requests under way
        self._version = os.urandom(VERSION_SIZE)
        self._ended = False

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = None if self._timeout is None else loop.time() + self._timeout
        for oid in self.plan.inputs:
            self._waits.append(self._spawn(self._wait(oid, deadline), f"allreduce-wait-"
                                           f"{oid.short()}", functools.partial(s.InputFailed,
                                                                               oid)))

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str,
               on_error: Callable[[HopliteError], s.Event]) -> asyncio.Task[None]:
        def failed(exc: BaseException) -> None:
            if not isinstance(exc, HopliteError):
                log.error("allreduce %s: %s crashed", self.plan.result.short(), name,
                          exc_info=exc)
                exc = HopliteError(f"{name}: {type(exc).__name__}: {exc}")
            self.feed(on_error(exc))
        return self.d.tasks.spawn(coro, name=name, on_error=failed)

    async def _wait(self, oid: ObjectID, deadline: float | None) -> None:
        frame = await wait_ready(self.d.directory, self.d.is_alive, oid, deadline)
        info = frame.msg
        self.feed(s.InputReady(oid, tuple(n for n in info.holders if self.d.is_alive(n)),
                               info.size, info.dtype, tuple(info.shape)))

    def feed(self, event: s.Event) -> None:
        if self._ended:
            return
        for ins in self.plan.handle(event):
            self._execute(ins)
        if self.plan.over:
            self.end()

    def _execute(self, ins: s.Instruction) -> None:
        d, plan = self.d, self.plan
        if isinstance(ins, s.Plain):
            try:
                d.reductions.start(plan.result, self._inputs, plan.op, len(self._inputs),
                                   self._timeout)
            except HopliteError as exc:
                log.warning("allreduce %s: %s", plan.result.short(), exc)
                d.tasks.spawn(d.directory.fail(plan.result, exc), name="allreduce-fail")
        elif isinstance(ins, s.Assign):
            if ins.gen:
                log.info("allreduce %s: stripe %d reduced again on %s", plan.result.short(),
                         ins.stripe, ins.node)
            self._assigning.append(self._spawn(self._assign(ins),
                                               f"allreduce-assign-{ins.stripe}",
                                               functools.partial(self._unassigned, ins)))
        elif isinstance(ins, s.Cleanup):
            for oid in ins.stripes:
                d.tasks.spawn(drop_entry(d.directory, oid), name="allreduce-cleanup")
        else:
            log.warning("allreduce %s failed: %s", plan.result.short(), ins.error)
            d.tasks.spawn(d.directory.fail(plan.result, ins.error), name="allreduce-fail")
            d.tasks.spawn(self._tell_failed(ins.members, ins.error), name="allreduce-failed")
            self._drop_stripes()

    def _unassigned(self, ins: s.Assign, error: HopliteError) -> s.Event:
        """A stripe task that could not be delivered: an unreachable node is lost to us."""
        if isinstance(error, PeerUnavailableError) or not self.d.is_alive(ins.node):
            return s.NodeLost(ins.node)
        return s.StripeFailed(ins.node, ins.stripe, ins.gen, error)

    async def _assign(self, ins: s.Assign) -> None:
        first = self.plan.first
        assert first is not None
        await self.d.rpc.call_node(ins.node, StripeTask(
            result=self.plan.result, inputs=self._inputs, op=self.plan.op, size=first.size,
            dtype=first.dtype, shape=list(first.shape), version=self._version,
            stripes=self.plan.stripes, stripe=ins.stripe, gen=ins.gen, timeout=self._timeout))

    async def _tell_failed(self, members: tuple[str, ...], error: HopliteError) -> None:
        """Tell ``members`` to drop the result, once every stripe task sent them arrived (or
        failed): a notice that overtook its task would find nothing to stop."""
        await asyncio.gather(*self._assigning, return_exceptions=True)
        for node in members:
            self.d.rpc.tell(node, AllreduceFailed(result=self.plan.result, code=error.code,
                                                  message=str(error)))

    def abort(self, error: HopliteError) -> None:
        """The result was deleted: every member drops its partial result, and the plan ends."""
        if not self._ended:
            others = tuple(n for n in self.plan.members if n != self.d.me)
            self.d.tasks.spawn(self._tell_failed(others, error), name="allreduce-failed")
            self._drop_stripes()
        self.end()

    def _drop_stripes(self) -> None:
        """Drop the entries of the stripes assigned so far: their reducers announced them
        and their fetchers enrolled, and a failed allreduce's stripes name nothing."""
        for stripe in self.plan.owner:
            self.d.tasks.spawn(drop_entry(self.d.directory,
                                          s.stripe_id(self.plan.result, stripe)),
                               name="allreduce-cleanup")

    def end(self) -> None:
        if self._ended:
            return
        self._ended = True
        for wait in self._waits:
            wait.cancel()
        self._forget()


class Member:
    """One node's part in an allreduce: the composite result, its stripes, their fetches."""

    def __init__(self, deps: AllreduceDeps, msg: StripeTask, caller: str,
                 forget: Callable[[], object]) -> None:
        self.d = deps
        self.result = msg.result
        self.caller = caller
        self._msg = msg
        self._forget = forget
        itemsize = np.dtype(msg.dtype).itemsize
        self.bounds = s.stripe_bounds(msg.size, itemsize, msg.stripes)
        self.ids = [s.stripe_id(msg.result, j) for j in range(msg.stripes)]
        self.whole = deps.store.create_composite(
            msg.result, msg.size, msg.dtype, list(msg.shape),
            [(oid, lo, hi) for oid, (lo, hi) in zip(self.ids, self.bounds)], msg.version)
        deps.store.pin(self.whole)
        self._reducing: dict[int, int] = {}  # stripe -> assignment generation
        self._fetches: dict[int, asyncio.Task[None]] = {}
        self._ended = False
        for j in range(msg.stripes):
            if j != msg.stripe:
                self._fetches[j] = deps.tasks.spawn(self._fetch(j), name=f"stripe-fetch-{j}",
                                                    on_error=self._failed)
        self._complete = deps.tasks.spawn(self._until_complete(), name="allreduce-result",
                                          on_error=self._failed)

    def reduce(self, stripe: int, gen: int) -> None:
        """Reduce ``stripe`` here (assignment ``gen``), into its view of the result."""
        if self._ended or self.whole.regions[stripe].filled:
            return  # complete here already: this copy serves the others
        d, oid = self.d, self.ids[stripe]
        fetch = self._fetches.pop(stripe, None)
        if fetch is not None:
            fetch.cancel()
        partial = d.store.get(oid)
        if partial is not None:  # fetched in part: the reduce computes it here from byte 0
            d.store.remove(oid, ObjectNotFoundError(
                f"stripe {stripe} of {self.result.hex()} is reduced on {d.me} now",
                oid=oid.hex()))
        self._reducing[stripe] = gen
        m = self._msg
        d.reductions.start(oid, m.inputs, m.op, len(m.inputs), m.timeout,
                           window=self.bounds[stripe], ring=tuple(sorted(d.members())))
        d.tasks.spawn(self._watch(stripe, gen), name="stripe-reduce", on_error=self._failed)

    async def _watch(self, stripe: int, gen: int) -> None:
        """Report the stripe's reduce if it fails; once it ended, forget it (its result, the
        view, stays until the stripes are dropped)."""
        oid = self.ids[stripe]
        error = await self.d.reductions.outcome(oid)
        self.d.reductions.forget(oid)
        if error is not None and not self._ended:  # no result without this stripe
            self._report(stripe, gen, error)
            self.stop(error)

    async def _fetch(self, stripe: int) -> None:
        """Fetch ``stripe`` into its view, from wherever its shard says, until it is here."""
        region = self.whole.regions[stripe]
        while not region.filled:
            try:
                await self.d.fetcher.fetch(self.ids[stripe], None, ring=True)
            except HopliteError as exc:
                if region.filled or self._ended:
                    return
                log.info("allreduce %s: stripe %d: %s; asking again", self.result.short(),
                         stripe, exc)
                await asyncio.sleep(STRIPE_RETRY)

    async def _until_complete(self) -> None:
        await self.whole.wait_for(self.whole.size)
        self.whole.temporary = False  # a plain object from now on
        await self.d.directory.publish(self.whole)
        self.d.rpc.tell(self.caller, StripeReport(result=self.result, stripe=-1, gen=0,
                                                  code="", message=""))
        self._end()

    def _failed(self, exc: BaseException) -> None:
        error = exc if isinstance(exc, HopliteError) else HopliteError(
            f"{type(exc).__name__}: {exc}")
        if not isinstance(exc, HopliteError):
            log.error("allreduce %s: member crashed", self.result.short(), exc_info=exc)
        if not self._ended:
            self._report(-1, 0, error)
            self.stop(error)

    def _report(self, stripe: int, gen: int, error: HopliteError) -> None:
        self.d.rpc.tell(self.caller, StripeReport(result=self.result, stripe=stripe, gen=gen,
                                                  code=error.code, message=str(error)))

    def stop(self, error: HopliteError) -> None:
        """The allreduce failed (or its result was deleted): drop the partial result here."""
        if self._ended:
            return
        for stripe in self._reducing:  # their announcements go too (after them, in order)
            self.d.reductions.forget(self.ids[stripe])
            self.d.tasks.spawn(drop_entry(self.d.directory, self.ids[stripe]),
                               name="allreduce-cleanup")
        if not self.whole.complete and self.d.store.get(self.result) is self.whole:
            self.d.store.remove(self.result, error)
        self._complete.cancel()
        self._end()

    def _end(self) -> None:
        self._ended = True
        for task in self._fetches.values():
            task.cancel()
        self._fetches.clear()
        self.d.store.unpin(self.whole)
        self._forget()
