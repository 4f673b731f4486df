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
import contextlib
import functools
import logging
import os
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hoplite_client.net.protocol import FrameProtocol
from hoplite_client.wire.errors import (
    CapacityError,
    HopliteError,
    HopliteTimeoutError,
    InvalidArgumentError,
    ObjectDeletedError,
    ObjectExistsError,
    ObjectNotFoundError,
    PeerUnavailableError,
    error_from_wire,
)
from hoplite_client.wire.frames import (
    INLINE_MAX,
    MAX_IDS_PER_FRAME,
    MAX_READY,
    MAX_READY_HOLDERS,
)
from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.locate_hints import IN_RING, PLAIN
from hoplite_client.wire.messages import (
    AllreduceFailed,
    Error,
    Ok,
    ReadyInput,
    RingEnd,
    RingOpen,
    RingReport,
    RingTask,
    StripeReport,
    StripeTask,
    WireMessage,
)
from hoplited.collectives import plan as p
from hoplited.collectives import stripes as s
from hoplited.collectives.choose import MAX_COMBINERS
from hoplited.collectives.coordinator import wait_ready
from hoplited.collectives.layout import ALIGN, stripe_bounds
from hoplited.collectives.ops import check_op
from hoplited.collectives.reductions import Reductions
from hoplited.collectives.ring_member import OPEN_TIMEOUT, RingDeps, RingMember
from hoplited.directory.client import DirectoryClient
from hoplited.dispatch import Handler
from hoplited.memory.space import BRIEF_WAIT, Space
from hoplited.memory.store import (
    VERSION_SIZE,
    CopyWithdrawn,
    ObjectStore,
    StoredObject,
    check_meta,
)
from hoplited.rpc import Rpc
from hoplited.tasks import Tasks
from hoplited.transfer.fetcher import Fetcher

log = logging.getLogger("hoplited.allreduce")

# How long an allreduce whose ring gave way waits before asking for its inputs again.
RESTART_GRACE = 0.05

# A member's fetch of a stripe that failed (its reducer died, a source vanished) asks again
# after this long, until the result is complete here or the allreduce ends: the stripe is
# being reduced again elsewhere (its shard names the new reducer once it announces).
STRIPE_RETRY = 0.2
# How often a combiner looks again for its own input or its own stripe's first element,
# before it fetches the other stripes (``Member._until_put``).
OWN_POLL = 0.05


@dataclass(frozen=True, kw_only=True)
class AllreduceDeps:
    """What allreduces use: this node's id, store, the directory, peers, the fetcher, the
    reduces (each stripe is one), liveness, the live members (the ring, in id order), what
    ring members use, how long an allreduce waits for all its inputs to run them as a ring
    (0: never), the links' measured rate and latency (whether a ring pays), whether late
    inputs may end as a pair (docs/design.md §4, "A pair for the last two inputs"), and how
    long an object must take to cross a link for one."""

    me: str
    store: ObjectStore
    space: Space
    directory: DirectoryClient
    rpc: Rpc
    fetcher: Fetcher
    reductions: Reductions
    is_alive: Callable[[str], bool]
    tasks: Tasks
    members: Callable[[], list[str]]
    ring: RingDeps
    ring_wait: float
    link: Callable[[], tuple[float, float]]  # measured bandwidth (bytes/s), latency (s)
    pair: bool
    pair_min_transfer: float


@dataclass
class AllreduceCounts:
    """Allreduces orchestrated here that ran as a ring, those whose ring gave way, and those
    that ended as a pair or a trio of combiners (``hoplite status``, metrics)."""

    run: int = 0
    given_up: int = 0
    pairs: int = 0
    trios: int = 0


class Allreduces:
    """The allreduces orchestrated on this node and the members it takes part in."""

    def __init__(self, deps: AllreduceDeps) -> None:
        self._d = deps
        self._orchestrators: dict[ObjectID, Orchestrator] = {}
        self._members: dict[ObjectID, Member] = {}
        self._rings: dict[ObjectID, RingMember] = {}
        self._ring_arrivals: dict[ObjectID, asyncio.Event] = {}  # streams awaiting their task
        # results fetched here after this node's ring copy was dropped: (task, caller)
        self._fetches: dict[ObjectID, tuple[asyncio.Task[StoredObject], str]] = {}
        self._changes = 0  # failures, ends, deletes and deaths seen: a task that waited for
        # memory refuses if any came meanwhile (what it checked may be stale)
        self.counts = AllreduceCounts()

    def handlers(self) -> dict[type[WireMessage], Handler]:
        return {StripeTask: self.on_stripe_task, StripeReport: self.on_report,
                AllreduceFailed: self.on_failed, RingTask: self.on_ring_task,
                RingReport: self.on_ring_report, RingEnd: self.on_ring_end}

    def __len__(self) -> int:
        return (len(self._orchestrators) + len(self._members) + len(self._rings)
                + len(self._fetches))

    def start(self, result: ObjectID, inputs: list[ObjectID], op: str,
              timeout: float | None, striped: bool) -> None:
        """Validate and start an allreduce into ``result``; it runs in the background: as a
        ring if every input is ready at once and a ring pays, otherwise in stripes
        (``striped``) or as a reduce whose result every input's node gets."""
        plan = s.AllreducePlan(result, inputs, op, ring_wait=self._d.ring_wait,
                               striped=striped, link=self._d.link(), pair=self._d.pair,
                               pair_min_transfer=self._d.pair_min_transfer,
                               nodes=tuple(self._d.members()))
        if result in self._orchestrators or self._d.store.get(result) is not None:
            raise ObjectExistsError(f"object {result.hex()} already exists")
        orchestrator = Orchestrator(self._d, plan, timeout,
                                    lambda: self._orchestrators.pop(result, None), self.counts,
                                    lambda: self._withdraw_ring(result))
        self._orchestrators[result] = orchestrator
        orchestrator.start()

    def forget(self, result: ObjectID) -> bool:
        """``result`` was deleted: whatever runs into it here stops. Whether anything did."""
        self._changes += 1
        self._stop_fetch(result)
        orchestrator = self._orchestrators.pop(result, None)
        member = self._members.pop(result, None)
        ring = self._rings.pop(result, None)
        error = ObjectDeletedError(f"the result {result.hex()} was deleted", oid=result.hex())
        if orchestrator is not None:
            orchestrator.abort(error)
        if member is not None:
            member.stop(error)
        if ring is not None:
            ring.stop(error)
        return orchestrator is not None or member is not None or ring is not None

    def node_suspected(self, node: str) -> None:
        """A member fell silent: a ring through it stalls, so each plan decides (design §4)."""
        for orchestrator in list(self._orchestrators.values()):
            orchestrator.feed(s.NodeSuspected(node))

    def node_trusted(self, node: str) -> None:
        """A member silent before answers again: a ring's result it holds is safe again."""
        for orchestrator in list(self._orchestrators.values()):
            orchestrator.feed(s.NodeTrusted(node))

    def node_died(self, node: str) -> None:
        """A member died: its stripes are reduced again elsewhere. A member whose caller's
        node died stops (nobody would reassign a stripe or end the allreduce any more) and
        records the failure at the result's shard, as the caller's node would have: gets of
        the result anywhere then fail with that error instead of waiting out their timeouts
        (a result already complete somewhere is left alone). A member only suspected keeps
        its stripes (docs/design.md §4)."""
        self._changes += 1
        for result in [r for r, (_, caller) in self._fetches.items() if caller == node]:
            self._stop_fetch(result)  # nobody waits for that copy any more (gets here
            # fetch the result themselves)
        for orchestrator in list(self._orchestrators.values()):
            orchestrator.feed(s.NodeLost(node))
        for member in [m for m in self._members.values() if m.caller == node]:
            error = PeerUnavailableError(f"node {node}, which ran the allreduce into "
                                         f"{member.result.hex()}, died", node=node)
            member.stop(error)
            self._d.tasks.spawn(self._record(member.result, error), name="allreduce-fail")
        for ring in list(self._rings.values()):
            if ring.caller == node and ring.whole.temporary:  # nobody will commit it (or
                # hear that it failed here)
                error = PeerUnavailableError(f"node {node}, which ran the allreduce into "
                                             f"{ring.result.hex()}, died", node=node)
                ring.stop(error)
                self._d.tasks.spawn(self._record(ring.result, error), name="allreduce-fail")
            elif node == ring.successor:
                ring.successor_died()
            elif node == ring.predecessor and not ring.complete:
                # a neighbour: its stream is gone; any other member's death reaches this one
                # as the caller's RingEnd (a task names only its neighbours)
                ring.fail(PeerUnavailableError(f"ring member {node} died", node=node))

    async def _record(self, result: ObjectID, error: HopliteError) -> None:
        """Record the allreduce's failure at its result's shard, if that shard can be reached."""
        try:
            await self._d.directory.fail(result, error)
        except HopliteError as exc:  # its shard died too: gets there wait out their timeouts
            log.warning("allreduce %s: failure not recorded: %s", result.short(), exc)

    def on_stripe_task(self, peer: str, msg: StripeTask,
                       payload: memoryview | None) -> Ok | Awaitable[Ok]:
        """Take part in a striped allreduce: allocate the result and reduce the stripe the
        task names, if any. Out of room, the result evicts and waits (docs/architecture.md
        §6)."""
        check_task(msg)
        ring = self._rings.pop(msg.result, None)
        if ring is not None and ring.caller == peer:  # the ring gave way to the stripes
            ring.stop(CopyWithdrawn(f"the allreduce into {msg.result.hex()} runs in stripes"))
        if (msg.result in self._members or self._d.store.get(msg.result) is not None
                or self._d.space.fits(msg.size)):
            return self._stripe_task(peer, msg)
        return self._when_room(msg.size, self._changes, lambda: self._stripe_task(peer, msg))

    def _stripe_task(self, peer: str, msg: StripeTask) -> Ok:
        member = self._members.get(msg.result)
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
            member.reduce(msg.stripe, msg.gen, msg.pair, msg.ready)
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
        self._changes += 1
        if self._fetches.get(msg.result, (None, ""))[1] == peer:
            self._stop_fetch(msg.result)
        member = self._members.get(msg.result)
        if member is not None and member.caller == peer:
            member.stop(error_from_wire(msg.code, msg.message, {}))
        ring = self._rings.get(msg.result)
        if ring is not None and ring.caller == peer:
            ring.stop(error_from_wire(msg.code, msg.message, {}))

    # --- the ring (docs/design.md §4, "Ring allreduce") ---
    def on_ring_task(self, peer: str, msg: RingTask,
                     payload: memoryview | None) -> Ok | Awaitable[Ok]:
        """Take part in a ring: allocate the result and start the stream to the successor.
        A ring the same caller ran before into the same result gave way: its copy goes (the
        notice saying so may come later). Out of room, the result evicts and waits."""
        old = self._rings.get(msg.result)
        if old is not None and old.caller == peer and old.version != msg.version:
            self._withdraw_ring(msg.result)
        check_meta(msg.dtype, list(msg.shape), msg.size)
        if self._d.space.fits(msg.size):
            return self._ring_task(peer, msg)
        self._check_ring_free(msg.result)  # refused before waiting, and again after
        return self._when_room(msg.size, self._changes, lambda: self._ring_task(peer, msg))

    def _check_ring_free(self, result: ObjectID) -> None:
        if result in self._rings or result in self._members:
            raise ObjectExistsError(f"an allreduce into {result.hex()} runs here already",
                                    oid=result.hex())

    def _ring_task(self, peer: str, msg: RingTask) -> Ok:
        self._check_ring_free(msg.result)
        ring = RingMember(self._d.ring, msg, peer, lambda: self._forget_ring(msg.result, ring))
        self._rings[msg.result] = ring
        arrival = self._ring_arrivals.pop(msg.result, None)
        if arrival is not None:
            arrival.set()
        return Ok()

    async def _when_room(self, size: int, changes: int, then: Callable[[], Ok]) -> Ok:
        """Evict and wait until a result of ``size`` bytes fits here, then do ``then``; refuse
        if a failure, an end, a delete or a death came since the task arrived (``changes``
        was the count then): what the task found on arrival may be stale."""
        await self._d.space.room(size, BRIEF_WAIT)
        if self._changes != changes:
            raise CapacityError(f"no room for a result of {size} bytes here until the "
                                f"allreduces here changed", requested=size)
        return then()

    def _withdraw_ring(self, result: ObjectID) -> None:
        """The ring into ``result`` gave way: this node's member drops its copy now, before
        the allreduce starts again here (it would find the id taken)."""
        ring = self._rings.pop(result, None)
        if ring is not None:
            ring.stop(CopyWithdrawn(f"the ring into {result.hex()} was given up"))

    def _forget_ring(self, result: ObjectID, ring: RingMember) -> None:
        if self._rings.get(result) is ring:
            del self._rings[result]

    def on_ring_report(self, peer: str, msg: RingReport, payload: memoryview | None) -> None:
        orchestrator = self._orchestrators.get(msg.result)
        if orchestrator is None or not orchestrator.runs(msg.version):
            # a ring given up or ended since: its reports change nothing, but a member that
            # failed stays listed until its caller answers, so answer it
            if msg.code:
                self._d.rpc.tell(peer, RingEnd(result=msg.result, version=msg.version,
                                               commit=False))
            return
        if not msg.code:
            orchestrator.feed(s.RingDone(peer))
        else:
            orchestrator.feed(s.RingFailed(peer, error_from_wire(msg.code, msg.message, {})))

    def on_ring_end(self, peer: str, msg: RingEnd, payload: memoryview | None) -> None:
        self._changes += 1
        ring = self._rings.get(msg.result)
        if ring is None or ring.caller != peer or ring.version != msg.version:
            return
        if msg.commit and not ring.ended:
            ring.commit()
            return
        if ring.ended:  # failed here, and reported: the caller knows
            del self._rings[msg.result]
        else:
            self._withdraw_ring(msg.result)
        if msg.fetch:
            self._fetch_result(msg.result, peer, msg.version)

    def _fetch_result(self, result: ObjectID, caller: str, version: bytes) -> None:
        """This node's ring copy was dropped after the commit: fetch the result from the
        members that hold it, as the ring would have left it here (the caller's plan waits
        for this copy; docs/design.md §4, "Ring allreduce"). It ends with the allreduce's
        failure, the result's delete or the caller's death; a fetch that fails on its own
        is reported, and the plan no longer waits for it."""
        if result in self._fetches:
            return

        def failed(exc: BaseException) -> None:
            log.info("allreduce %s: the result not fetched: %s", result.short(), exc)
            error = exc if isinstance(exc, HopliteError) else HopliteError(str(exc))
            self._d.rpc.tell(caller, RingReport(result=result, version=version,
                                                code=error.code, message=str(error)))

        task = self._d.tasks.spawn(self._d.fetcher.fetch(result, None),
                                   name=f"allreduce-fetch-{result.short()}", on_error=failed)
        self._fetches[result] = (task, caller)
        task.add_done_callback(lambda done: self._fetched(result, done))

    def _fetched(self, result: ObjectID, task: asyncio.Task[StoredObject]) -> None:
        if self._fetches.get(result, (None, ""))[0] is task:
            del self._fetches[result]

    def _stop_fetch(self, result: ObjectID) -> None:
        fetch = self._fetches.pop(result, None)
        if fetch is not None:
            fetch[0].cancel()

    async def serve_ring(self, protocol: FrameProtocol, peer: str, msg: RingOpen) -> bool:
        """A predecessor opened its ring stream on a data connection: bind it to our member
        once our task is here too. True once the stream ended cleanly."""
        try:
            ring = await self._ring_of(msg)
            if ring.predecessor != peer:
                raise InvalidArgumentError(f"{peer} is not the ring predecessor here for "
                                           f"{msg.result.hex()}")
            done = ring.attach(protocol)
        except HopliteError as exc:
            log.info("ring stream from %s refused: %s", peer, exc)
            if not protocol.closed.done():
                protocol.send(Error(rid=msg.rid, code=exc.code, message=str(exc), data={}))
            return True  # nothing was streamed: the connection serves pulls again
        protocol.send(Ok(rid=msg.rid))
        return await done

    async def _ring_of(self, msg: RingOpen) -> RingMember:
        """This node's member of the ring ``msg`` opens, once its task is here (a ring run
        again may find the one before still here, about to go)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + OPEN_TIMEOUT
        while True:
            ring = self._rings.get(msg.result)
            if ring is not None and ring.version == msg.version:
                return ring
            arrival = self._ring_arrivals.setdefault(msg.result, asyncio.Event())
            try:
                async with asyncio.timeout_at(deadline):
                    await arrival.wait()
            except TimeoutError:
                raise HopliteTimeoutError(f"no ring task for {msg.result.hex()} within "
                                          f"{OPEN_TIMEOUT}s") from None
            finally:
                if self._ring_arrivals.get(msg.result) is arrival and not arrival.is_set():
                    del self._ring_arrivals[msg.result]


def check_task(msg: StripeTask) -> None:
    """Refuse a stripe task no orchestrator sends: bad metadata, an unknown op, stripes that
    do not fit the inputs or the object (each must be larger than an inline object)."""
    check_meta(msg.dtype, list(msg.shape), msg.size)
    check_op(msg.op)
    n = len(msg.inputs)
    if (not 2 <= msg.stripes <= min(n, MAX_IDS_PER_FRAME) or not -1 <= msg.stripe < msg.stripes
            or msg.gen < 0 or len(msg.version) != VERSION_SIZE
            or msg.size // msg.stripes <= INLINE_MAX + ALIGN
            or msg.pair and msg.stripes > MAX_COMBINERS):
        raise InvalidArgumentError(f"a stripe task of {msg.size} bytes in {msg.stripes} "
                                   f"stripes of {n} inputs (stripe {msg.stripe}, generation "
                                   f"{msg.gen}{', a pair' if msg.pair else ''})")
    if not msg.ready:
        return
    named = [r.oid for r in msg.ready]
    if (len(msg.ready) > MAX_READY or len(set(named)) != len(named)
            or not set(named) <= set(msg.inputs)
            or any(len(r.holders) > MAX_READY_HOLDERS for r in msg.ready)):
        raise InvalidArgumentError(f"a stripe task names {len(msg.ready)} inputs ready, at most "
                                   f"{MAX_READY} listed inputs once each with at most "
                                   f"{MAX_READY_HOLDERS} holders")


async def drop_entry(directory: DirectoryClient, oid: ObjectID) -> None:
    """Delete a stripe's directory entry and its copies, if it has any."""
    try:
        await directory.delete(oid)
    except HopliteError as exc:  # no entry (nobody announced it), or its shard is gone
        log.debug("stripe %s not dropped: %s", oid.short(), exc)


class Orchestrator:
    """Carries out one allreduce's plan on the caller's node."""

    def __init__(self, deps: AllreduceDeps, plan: s.AllreducePlan, timeout: float | None,
                 forget: Callable[[], object], counts: AllreduceCounts,
                 withdraw_ring: Callable[[], None]) -> None:
        self.d = deps
        self._counts = counts
        self._withdraw_ring = withdraw_ring  # this node's ring member, if any, drops its copy
        self.plan = plan
        self._timeout = timeout
        self._forget = forget
        self._waits: list[asyncio.Task[None]] = []
        self._assigning: list[asyncio.Task[None]] = []  # StripeTask requests under way
        self._version = os.urandom(VERSION_SIZE)
        self._ended = False
        self._deadline: float | None = None
        self._timer: asyncio.TimerHandle | None = None  # the ring's wait for every input
        self._watcher: asyncio.Task[None] | None = None  # the watch of the result's shard

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._deadline = None if self._timeout is None else loop.time() + self._timeout
        self._wait_all()

    def _wait_all(self) -> None:
        for oid in self.plan.inputs:
            self._waits.append(self._spawn(self._wait(oid, self._deadline), f"allreduce-wait-"
                                           f"{oid.short()}", functools.partial(s.InputFailed,
                                                                               oid)))

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str,
               on_error: Callable[[HopliteError], s.Event | None]) -> asyncio.Task[None]:
        def failed(exc: BaseException) -> None:
            if not isinstance(exc, HopliteError):
                log.error("allreduce %s: %s crashed", self.plan.result.short(), name,
                          exc_info=exc)
                exc = HopliteError(f"{name}: {type(exc).__name__}: {exc}")
            event = on_error(exc)
            if event is not None:
                self.feed(event)
        return self.d.tasks.spawn(coro, name=name, on_error=failed)

    def runs(self, version: bytes) -> bool:
        """Whether ``version`` is the ring (or stripes) this allreduce runs now."""
        return version == self._version

    async def _watch(self, ins: s.Watch, version: bytes) -> None:
        """Wait until a live node not excluded holds the whole result at its shard, for
        ``ins.within`` at most; the plan ends an unbounded one (docs/design.md §4, "Ring
        allreduce")."""
        loop = asyncio.get_running_loop()
        deadline = None if ins.within is None else loop.time() + ins.within
        frame = await wait_ready(self.d.directory, self.d.is_alive, self.plan.result, deadline,
                                 ins.exclude)
        if self.runs(version):
            self.feed(s.ResultReady(tuple(n for n in frame.msg.holders if self.d.is_alive(n)
                                          and n not in ins.exclude)))

    def _unseen(self, ins: s.Watch, error: HopliteError) -> s.Event | None:
        """A watch that ended without a copy: a bounded one ran out, or the shard could not
        be asked (then the members done are trusted to publish)."""
        if ins.within is not None and isinstance(error, HopliteTimeoutError):
            return s.NoCopy()
        log.info("allreduce %s: the result's shard is not watched: %s",
                 self.plan.result.short(), error)
        return s.ResultUnseen(error)

    async def _wait(self, oid: ObjectID, deadline: float | None,
                    exclude: tuple[str, ...] = ()) -> None:
        frame = await wait_ready(self.d.directory, self.d.is_alive, oid, deadline, exclude)
        info = frame.msg
        self.feed(s.InputReady(oid, tuple(n for n in info.holders if self.d.is_alive(n)),
                               info.size, info.dtype, tuple(info.shape), info.version,
                               asyncio.get_running_loop().time()))

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
                d.reductions.start(plan.result, plan.listed, plan.op, len(plan.listed),
                                   self._timeout, everyone=not plan.striped)
            except HopliteError as exc:
                log.warning("allreduce %s: %s", plan.result.short(), exc)
                d.tasks.spawn(d.directory.fail(plan.result, exc), name="allreduce-fail")
        elif isinstance(ins, s.Assign):
            if ins.pair and ins.stripe >= 0:
                if ins.stripe == 0 and not ins.gen:  # counted once, at the guess
                    if plan.stripes == 3:
                        self._counts.trios += 1
                    else:
                        self._counts.pairs += 1
                log.info("allreduce %s: stripe %d of %d by a combiner on %s",
                         plan.result.short(), ins.stripe, plan.stripes, ins.node)
            if ins.gen:
                log.info("allreduce %s: stripe %d reduced again on %s", plan.result.short(),
                         ins.stripe, ins.node)
            self._assigning.append(self._spawn(self._assign(ins),
                                               f"allreduce-assign-{ins.stripe}",
                                               functools.partial(self._unassigned, ins)))
        elif isinstance(ins, s.Arm):
            if self._timer is not None:  # the wait for the input before
                self._timer.cancel()
            self._timer = asyncio.get_running_loop().call_later(
                ins.delay, lambda: self.feed(s.GatherOver()))
        elif isinstance(ins, s.StartRing):
            self._start_ring(ins)
        elif isinstance(ins, s.Commit):
            for node in ins.members:
                d.rpc.tell(node, RingEnd(result=plan.result, version=self._version,
                                         commit=True))
        elif isinstance(ins, s.Watch):
            if ins.exclude or ins.within is not None:
                log.info("allreduce %s: no member known to hold the result answers; a copy "
                         "elsewhere is looked for (%s, not on %s)", plan.result.short(),
                         f"for {ins.within:g} s" if ins.within is not None
                         else "until one answers again", list(ins.exclude))
            if self._watcher is not None:
                self._watcher.cancel()
            self._watcher = self._spawn(self._watch(ins, self._version), "allreduce-watch",
                                        functools.partial(self._unseen, ins))
            self._waits.append(self._watcher)
        elif isinstance(ins, s.Restart):
            self._restart(ins)
        elif isinstance(ins, s.Withdraw):
            for node in ins.members:
                d.rpc.tell(node, RingEnd(result=plan.result, version=self._version,
                                         commit=False, fetch=True))
        elif isinstance(ins, s.WaitAgain):
            self._waits.append(self._spawn(
                self._wait(ins.oid, self._deadline, ins.exclude),
                f"allreduce-wait-{ins.oid.short()}", functools.partial(s.InputFailed, ins.oid)))
        elif isinstance(ins, s.Cleanup):
            for oid in ins.stripes:
                d.tasks.spawn(drop_entry(d.directory, oid), name="allreduce-cleanup")
        else:
            log.warning("allreduce %s failed: %s", plan.result.short(), ins.error)
            d.tasks.spawn(d.directory.fail(plan.result, ins.error), name="allreduce-fail")
            d.tasks.spawn(self._tell_after_tasks(ins.members, self._failed(ins.error)),
                          name="allreduce-failed")
            self._drop_stripes()

    def _start_ring(self, ins: s.StartRing) -> None:
        first = self.plan.first
        assert first is not None
        log.info("allreduce %s: a ring of %d", self.plan.result.short(), len(ins.members))
        self._counts.run += 1
        version = self._version
        ring = [node for node, _ in ins.members]
        n = len(ring)

        async def send(node: str, task: RingTask) -> None:
            await self.d.rpc.call_node(node, task)

        def undelivered(node: str, error: HopliteError) -> s.Event | None:
            return s.RingFailed(node, error) if self.runs(version) else None

        for position, (node, adds) in enumerate(ins.members):  # each its own part only
            task = RingTask(result=self.plan.result, inputs=list(adds), position=position,
                            members=n, predecessor=ring[position - 1],
                            successor=ring[(position + 1) % n], op=self.plan.op,
                            size=first.size, dtype=first.dtype, shape=list(first.shape),
                            version=version)
            self._assigning.append(self._spawn(send(node, task), f"allreduce-ring-{node}",
                                               functools.partial(undelivered, node)))

    def _restart(self, ins: s.Restart) -> None:
        """The ring failed before anyone held the result: drop it everywhere, then run the
        allreduce again (:meth:`~.stripes.AllreducePlan.again`: a ring once more, without
        the nodes lost or silent), from the inputs' waits (a lost input put again counts),
        within the caller's deadline."""
        log.info("allreduce %s: the ring gave way (%s); again", self.plan.result.short(),
                 ins.error)
        self._counts.given_up += 1
        self._withdraw_ring()
        self.d.tasks.spawn(self._tell_after_tasks(ins.members, RingEnd(
            result=self.plan.result, version=self._version, commit=False)),
            name="allreduce-ring-drop")
        for wait in self._waits:
            wait.cancel()
        self._waits = []
        if self._timer is not None:  # the given-up ring's wait for its inputs
            self._timer.cancel()
        retired = self._version
        self.plan = self.plan.again()
        self._version = os.urandom(VERSION_SIZE)
        # The members saw the stream break before the membership hears why: a killed node
        # is declared dead (its port refuses the probe) within milliseconds. Asked at once,
        # the shards still name it a holder, so its input would take the chain's first slot
        # and block the survivors' partial sums until it is put again (docs/benchmarks.md,
        # "Ring allreduce"); after the grace it hangs on the root instead.
        if ins.retire:
            self._waits.append(self._spawn(self._retire(retired), "allreduce-retire",
                                           lambda error: None))
        else:
            self._timer = asyncio.get_running_loop().call_later(RESTART_GRACE, self._wait_all)

    async def _retire(self, version: bytes) -> None:
        """Delete the committed ring's ``version`` of the result at its shard, so a copy of
        it published late is refused and dropped, then await the inputs again after the
        grace: the next run publishes another version under the same id."""
        begun = asyncio.get_running_loop().time()
        try:
            await self.d.directory.retire(self.plan.result, version)
        except HopliteError as exc:  # its shard unreachable: a late copy of the committed
            # version is then not refused there
            log.warning("allreduce %s: the committed ring's copy not retired: %s",
                        self.plan.result.short(), exc)
        await asyncio.sleep(max(0.0, begun + RESTART_GRACE - asyncio.get_running_loop().time()))
        self._wait_all()

    def _unassigned(self, ins: s.Assign, error: HopliteError) -> s.Event:
        return s.undelivered(ins.node, ins.stripe, ins.gen, error, self.d.is_alive(ins.node))

    async def _assign(self, ins: s.Assign) -> None:
        first = self.plan.first
        assert first is not None
        await self.d.rpc.call_node(ins.node, StripeTask(
            result=self.plan.result, inputs=self.plan.listed, op=self.plan.op, size=first.size,
            dtype=first.dtype, shape=list(first.shape), version=self._version,
            stripes=self.plan.stripes, stripe=ins.stripe, gen=ins.gen, timeout=self._timeout,
            pair=ins.pair, ready=[ReadyInput(oid=h.oid, holders=list(h.alive[:MAX_READY_HOLDERS]),
                                             version=h.version)
                                  for h in ins.ready[:MAX_READY] if h.alive]))

    def _failed(self, error: HopliteError) -> AllreduceFailed:
        return AllreduceFailed(result=self.plan.result, code=error.code, message=str(error))

    async def _tell_after_tasks(self, members: tuple[str, ...], msg: WireMessage) -> None:
        """Tell ``members`` ``msg`` (drop the result), once every stripe or ring task sent
        so far arrived (or failed): a notice that overtook its task would find nothing to
        stop."""
        await asyncio.gather(*self._assigning, return_exceptions=True)
        for node in members:
            self.d.rpc.tell(node, msg)

    def abort(self, error: HopliteError) -> None:
        """The result was deleted: every member drops its partial result, and the plan ends."""
        if not self._ended:
            others = tuple(n for n in dict.fromkeys(self.plan.members + self.plan.ring)
                           if n != self.d.me)
            self.d.tasks.spawn(self._tell_after_tasks(others, self._failed(error)),
                               name="allreduce-failed")
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
        if self._timer is not None:
            self._timer.cancel()
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
        self.bounds = stripe_bounds(msg.size, itemsize, msg.stripes)
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
                fetch = (self._fetch_after(j, msg.stripe) if msg.pair and msg.stripe >= 0
                         else self._fetch(j))
                self._fetches[j] = deps.tasks.spawn(fetch, name=f"stripe-fetch-{j}",
                                                    on_error=self._failed)
        self._complete = deps.tasks.spawn(self._until_complete(), name="allreduce-result",
                                          on_error=self._failed)

    def reduce(self, stripe: int, gen: int, combiner: bool = False,
               ready: Sequence[ReadyInput] = ()) -> None:
        """Reduce ``stripe`` here (assignment ``gen``; as a combiner, one half of a pair),
        into its view of the result, starting from the inputs ``ready`` (the caller's node
        read their records a moment ago)."""
        if self._ended or self.whole.regions[stripe].filled:
            return  # complete here already: this copy serves the others
        fetch = self._fetches.pop(stripe, None)
        if fetch is not None:
            fetch.cancel()
        self._reducing[stripe] = gen
        self.d.tasks.spawn(self._reduce_here(stripe, gen, fetch, combiner, ready),
                           name="stripe-reduce", on_error=self._failed)

    async def _reduce_here(self, stripe: int, gen: int, fetch: asyncio.Task[None] | None,
                           combiner: bool, ready: Sequence[ReadyInput]) -> None:
        """Once this node's fetch of the stripe has ended, start its reduce here; report it
        if it fails. The fetch is awaited, not only cancelled: one that had allocated the
        stripe's view would otherwise take the id the reduce creates."""
        d, oid = self.d, self.ids[stripe]
        if fetch is not None:
            await asyncio.wait([fetch])
        shared = d.fetcher.abort(oid)
        if shared is not None:
            await asyncio.wait([shared])
        if self._ended or self._reducing.get(stripe) != gen:
            return
        partial = d.store.get(oid)
        if partial is not None:  # fetched in part: the reduce computes it here from byte 0
            d.store.remove(oid, ObjectNotFoundError(
                f"stripe {stripe} of {self.result.hex()} is reduced on {d.me} now",
                oid=oid.hex()))
        m = self._msg
        known = [p.InputReady(r.oid, tuple(r.holders), alive, m.size, m.dtype, tuple(m.shape),
                              r.version)
                 for r in ready if (alive := tuple(n for n in r.holders if d.is_alive(n)))]
        # the combiners: the live members that held no input ready at the guess
        holding = {n for r in ready for n in r.holders}
        late_nodes = (tuple(sorted(n for n in d.members() if n not in holding))
                      if combiner else ())
        d.reductions.start(oid, m.inputs, m.op, len(m.inputs), m.timeout,
                           window=self.bounds[stripe],
                           ring=() if combiner else tuple(sorted(d.members())),
                           combiner=combiner, ready=known, late=m.stripes,
                           late_nodes=late_nodes if len(late_nodes) == m.stripes else ())
        await self._watch(stripe, gen)

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
        """Fetch ``stripe`` into its view, from wherever its shard says (its ring predecessor,
        but for a pair's halves), until it is here."""
        region = self.whole.regions[stripe]
        while not region.filled:
            try:
                await self.d.fetcher.fetch(self.ids[stripe], None,
                                           hint=PLAIN if self._msg.pair else IN_RING)
            except HopliteError as exc:
                if region.filled or self._ended:
                    return
                log.info("allreduce %s: stripe %d: %s; asking again", self.result.short(),
                         stripe, exc)
                await asyncio.sleep(STRIPE_RETRY)

    async def _fetch_after(self, stripe: int, own: int) -> None:
        """A combiner fetches another stripe once an input is complete on this node, or its
        own stripe has a first element (every input exists then: the guess was wrong). The
        combiners then enrol in each other's stripes in the order they put, after every
        member, so the last to put forwards nothing: its uplink carries the rest of its input
        and its own stripe once each (docs/design.md §4, "A pair for the last two inputs",
        "Three combiners"). Asked at once, a pair's combiner races the members and forwards
        the other half in 3 of 8 runs; asked at their own stripes' first elements, three
        combiners enrol together and one forwards another's third."""
        await self._until_put(own)
        await self._fetch(stripe)

    async def _until_put(self, own: int) -> None:
        """Until an input is complete here or stripe ``own`` has a first element, looking
        again every :data:`OWN_POLL` (or the stripe is here, or the allreduce ended)."""
        store, first = self.d.store, np.dtype(self._msg.dtype).itemsize
        while not self._ended and not self.whole.regions[own].filled:
            view = store.get(self.ids[own])
            if view is not None and view.received >= first:
                return
            put = await store.wait_any_created(self._msg.inputs, OWN_POLL)
            if put is None:
                continue
            with contextlib.suppress(TimeoutError, HopliteError):
                async with asyncio.timeout(OWN_POLL):  # not wait_for: docs/architecture.md §3
                    await put.wait_for(put.size)
            if put.complete or put.error is not None:
                return

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
