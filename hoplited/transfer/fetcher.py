"""Receiving: pulling an object into the local store from whichever node can send it.

Ask the owner shard for a source (it may be a node still receiving the object itself), open
a data connection, send ``Pull(offset)``; the reply's payload is the object from ``offset`` on,
which the kernel writes straight into the object's arena extent. Every received chunk advances
the object's watermark, which wakes anyone streaming it onward (:mod:`.sender`): a node forwards
bytes the moment they land (cut-through). If the source dies or stalls, the receiver keeps its
bytes and resumes from its watermark at another source.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hoplite_client.net.handshake import Identity, refused
from hoplite_client.net.protocol import FrameProtocol
from hoplite_client.wire.errors import (
    CapacityError,
    ConnectionLostError,
    HopliteError,
    HopliteTimeoutError,
    ObjectDeletedError,
    ObjectNotFoundError,
    PeerUnavailableError,
    RemoteProtocolError,
)
from hoplite_client.wire.frames import Frame
from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.locate_hints import PLAIN, Among, InRing, LocateHint, Plain
from hoplite_client.wire.messages import DataStream, Error, Located, Pull
from hoplited.cluster.link_model import LinkModel, PullRate
from hoplited.cluster.membership import Membership
from hoplited.directory.client import DirectoryClient
from hoplited.memory.arena import Arena
from hoplited.memory.space import Space, brief_wait
from hoplited.memory.store import CopyWithdrawn, ObjectStore, StoredObject, parse_dtype
from hoplited.tasks import Tasks
from hoplited.transfer import fetch_plan as fp
from hoplited.transfer.data_connections import DataConnections
from hoplited.transfer.fetch_plan import view_id
from hoplited.transfer.pull_stream import PullStream
from hoplited.transfer.sender import SEND_SLICE
from hoplited.transfer.traffic import Traffic

log = logging.getLogger("hoplited.transfer")

# How often a receiver tells the directory how far along it is (source choice uses it).
PROGRESS_INTERVAL = 0.05
# Transfers at least this big tell the daemon's link model how fast links are.
BANDWIDTH_SAMPLE_MIN = 1 << 20
class Fetcher:
    """Fetches objects into this node's store; one fetch per object however many ask."""

    def __init__(self, identity: Identity, store: ObjectStore, arena: Arena,
                 directory: DirectoryClient, membership: Membership, link_model: LinkModel,
                 traffic: Traffic, tasks: Tasks, stall_timeout: float,
                 refused: Callable[[str], None], patience: float = 0.0, *,
                 space: Space, connections: DataConnections) -> None:
        self.me = identity.node_id
        self._store = store
        self._space = space  # a copy makes room by evicting, then waits briefly (architecture §6)
        self._arena = arena
        self._directory = directory
        self._membership = membership
        self._link_model = link_model
        self._traffic = traffic
        self._tasks = tasks
        self._stall_timeout = stall_timeout
        self._refused = refused  # a source refused our dial: its liveness hears it at once
        self._patience = patience  # how long a death verdict may take (fetch_plan.py)
        self._pulls: dict[str, set[FrameProtocol]] = {}  # live data connections by source
        # done when the source dies or falls silent: ends our dials to it (a frozen process's
        # kernel accepts the connection, and its handshake would wait out HANDSHAKE_TIMEOUT)
        self._deaths: dict[str, asyncio.Future[None]] = {}
        self._connections = connections  # idle ones, kept for the next pull
        self._fetches: dict[ObjectID, tuple[asyncio.Task[StoredObject], fp.FetchPlan]] = {}
        self._callers: Counter[ObjectID] = Counter()  # gets waiting on each fetch
        self._half_plans: dict[ObjectID, list[fp.FetchPlan]] = {}  # a fetch's halves' plans
        self.halved = 0  # objects received as two halves

    def in_flight(self) -> list[dict[str, Any]]:
        """Every fetch under way: the object, its phase, the source pulled and the bytes held
        (``hoplite status``)."""
        out = []
        for oid, (_, plan) in self._fetches.items():
            obj = self._store.get(oid)
            out.append({"object": oid.hex(), "phase": plan.phase, "source": plan.source,
                        "received": plan.watermark if obj is None else obj.received,
                        "size": plan.size})
        return out

    def fetching(self, oid: ObjectID) -> bool:
        """True while a fetch of ``oid`` is under way here (its copy may not exist yet)."""
        return oid in self._fetches

    def pulling_from(self, oid: ObjectID) -> str | None:
        """The member ``oid`` is being pulled from now (None: no pull under way)."""
        fetch = self._fetches.get(oid)
        return None if fetch is None else fetch[1].source

    async def fetch(self, oid: ObjectID, timeout: float | None,
                    hint: Plain | InRing | Among = PLAIN) -> StoredObject:
        """The complete local copy of ``oid``, pulling it from the cluster if needed; waits at
        most ``timeout`` (this caller's own, whoever else is fetching the same id). The copy is
        still in the store when this returns: the caller may pin it before anything else runs.
        ``hint``: what a fetch this call starts tells the owner (its ring predecessor wanted,
        docs/design.md §4; how many get the object together, §3)."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        try:
            async with asyncio.timeout_at(deadline):
                obj = await self._complete_copy(oid, deadline, hint)
                while obj.deleted and (obj.evicted and obj.error is None
                                       or isinstance(obj.error, CopyWithdrawn)):
                    # between the copy's completion and our turn to run it was evicted to
                    # make room (it is complete elsewhere: its shard said so), or withdrawn
                    # (a ring that gave way, a result started again: it is made again), so
                    # fetch it again
                    obj = await self._complete_copy(oid, deadline, hint)
        except HopliteError:
            raise  # the fetch's own end: a timeout the shard recorded (a failed reduce's) too
        except TimeoutError:
            raise HopliteTimeoutError(f"object {oid.hex()} not received within {timeout}s",
                                      oid=oid.hex()) from None
        if obj.deleted:  # deleted between the copy's completion and our turn to run
            raise obj.error or ObjectDeletedError(f"object {oid.hex()} was deleted",
                                                  oid=oid.hex())
        return obj

    async def _complete_copy(self, oid: ObjectID, deadline: float | None,
                             hint: LocateHint) -> StoredObject:
        """Join (or start) the one fetch of ``oid``, or wait for the local copy to complete;
        a local copy given up while we wait (``CopyWithdrawn``) sends us to fetch; a fetch
        started here says ``hint``."""
        while True:
            try:
                return await self._complete_copy_once(oid, deadline, hint)
            except CopyWithdrawn:
                continue

    async def _complete_copy_once(self, oid: ObjectID, deadline: float | None,
                                  hint: LocateHint) -> StoredObject:
        running = self._fetches.get(oid)  # first: a fetch in progress has allocated already
        if running is not None and running[0].done():  # it ended (the local copy it waited
            # on was withdrawn), and is not forgotten yet: awaited again, it would raise at
            # once, without a pause, for as long as we asked again
            self._forget(oid, running[0])
            running = None
        obj = self._store.get(oid)
        if running is not None or obj is None:
            if running is None:
                plan = fp.FetchPlan(oid, self.me, deadline, patience=self._patience,
                                    hint=hint)
                task = self._tasks.spawn(self._fetch(plan),
                                         name=f"fetch-{oid.short()}")
                self._fetches[oid] = (task, plan)
                task.add_done_callback(lambda done: self._forget(oid, done))
            else:
                task, plan = running
                for joined in [plan, *self._half_plans.get(oid, ())]:
                    joined.handle(fp.CallerJoined(deadline))  # ours may outlast the others'
            self._callers[oid] += 1
            try:
                return await asyncio.shield(task)  # it outlives callers that give up...
            finally:
                self._callers[oid] -= 1
                if not self._callers[oid]:
                    del self._callers[oid]
                    self._abandon(oid, task, plan)
        while True:
            try:
                await obj.wait_for(obj.size)
                return obj
            except HopliteError:
                again = self._store.get(oid)
                if again is None or again is obj:
                    raise
                obj = again  # a reduce started its result again (docs/design.md §5)

    async def _fetch(self, plan: fp.FetchPlan, half: _Half | None = None) -> StoredObject:
        """Carry out ``plan``: ask, allocate, pull, report, feeding each outcome back. The
        plan of a whole object allocates its copy; that of one ``half`` (its plan's asks say
        which) fills the view made with the whole copy, and ends with that view."""
        oid, store = plan.oid, self._store
        loop = asyncio.get_running_loop()
        obj: StoredObject | None = None  # the copy this fetch allocated
        result: StoredObject | None = None
        located: Frame[Located] | None = None
        populate: asyncio.Task[None] | None = None
        todo: deque[fp.Instruction] = deque(plan.start(loop.time()))
        asked_under = self._membership.owner_set  # who owned the ids when we last asked
        try:
            while todo:
                ins = todo.popleft()
                into = obj if half is None else half.view  # what pulls fill
                if isinstance(ins, fp.AskOwner):
                    asked_under = self._membership.owner_set
                    answer = await self._ask(oid, ins, into, loop)
                    if not isinstance(answer, Frame):
                        todo.extend(plan.handle(answer))
                        continue
                    located, m = answer, answer.msg
                    todo.extend(plan.handle(fp.Located(
                        loop.time(), m.source, m.size, m.dtype, tuple(m.shape), m.version,
                        here=into is None and store.get(oid) is not None,
                        halves=_bounds(m.halves), index=m.index, receivers=m.receivers)))
                elif isinstance(ins, fp.Done):
                    return result if result is not None else _complete(into)
                elif isinstance(ins, fp.Fail):
                    raise ins.error
                elif isinstance(ins, fp.Report):
                    self._directory.transfer_done(oid, ins.source, ins.complete,
                                                  -1 if half is None else half.half)
                elif isinstance(ins, fp.Pull):
                    assert into is not None
                    window = None if half is None else half.window
                    todo.extend(plan.handle(await self._pull(
                        into, ins.source, loop, oid, window, -1 if half is None else half.half)))
                elif half is not None:
                    await self._half_step(oid, ins, half)
                elif isinstance(ins, fp.UseLocalCopy):
                    result = await self._local_copy(oid)
                elif isinstance(ins, fp.StoreInline):
                    assert located is not None
                    result = await self._store_inline(oid, located.msg, located.payload)
                    self._directory.announce_late(result, asked_under, self.pulling_from)
                elif isinstance(ins, fp.Allocate):
                    obj = await self._space.create(oid, ins.size, ins.dtype, list(ins.shape),
                                                   ins.version, wait=brief_wait(plan.deadline))
                    self._directory.announce_late(obj, asked_under, self.pulling_from)
                    populate = self._receive_into(obj)
                elif isinstance(ins, fp.FetchHalves):
                    obj = await self._space.create(
                        oid, ins.size, ins.dtype, list(ins.shape), ins.version,
                        wait=brief_wait(plan.deadline), stripes=[(view_id(oid, h), lo, hi)
                                 for h, (lo, hi) in enumerate(ins.bounds)])
                    self._directory.announce_late(obj, asked_under, self.pulling_from)
                    populate = self._receive_into(obj)
                    todo.extend(plan.handle(await self._fetch_halves(obj, ins, plan)))
                else:  # Discard
                    assert obj is not None
                    if store.get(oid) is obj:  # those reading it from us ask again too
                        store.remove(oid, ObjectNotFoundError(
                            f"object {oid.hex()} changed version while being received (put "
                            f"again, or a reduce started its result again)", oid=oid.hex()))
                    store.unpin(obj)
                    if populate is not None:
                        populate.cancel()
                    obj = populate = None
            raise AssertionError("a fetch plan ends with Done or Fail")
        except BaseException as exc:
            if obj is not None and store.get(oid) is obj:
                error = exc if isinstance(exc, HopliteError) else ConnectionLostError(str(exc))
                store.remove(oid, error)
            raise
        finally:
            if populate is not None:
                populate.cancel()
            if obj is not None:
                store.unpin(obj)

    @staticmethod
    async def _half_step(oid: ObjectID, ins: fp.Instruction, half: _Half) -> None:
        """What a half's fetch does where a whole object's allocates, discards or stores: its
        view was made with the copy, and a half is never inline or split again."""
        view = half.view
        if (isinstance(ins, fp.Discard) or isinstance(ins, fp.Allocate)
                and (ins.size != view.size or ins.version != view.version)):
            raise ObjectNotFoundError(
                f"half {half.half} of {oid.hex()} changed while being received (put again)",
                oid=oid.hex())
        if isinstance(ins, fp.UseLocalCopy):
            await view.wait_for(view.size)
        elif not isinstance(ins, fp.Allocate):
            raise RemoteProtocolError(f"half {half.half} of {oid.hex()}: the owner answered "
                                      f"{type(ins).__name__}")

    def _receive_into(self, obj: StoredObject) -> asyncio.Task[None] | None:
        """Pin the new copy ``obj`` (the kernel writes into it until the pulls end) and back
        its pages meanwhile; the task that backs them (None: they are backed already)."""
        self._store.pin(obj)
        if self._arena.backed(obj.offset, obj.size):
            return None
        return self._tasks.spawn(self._arena.populate(obj.offset, obj.size), name="populate",
                                 on_error=functools.partial(self._unbacked, obj))

    async def _fetch_halves(self, obj: StoredObject, ins: fp.FetchHalves,
                            plan: fp.FetchPlan) -> fp.HalvesEnded:
        """Fetch both halves of the composite ``obj`` at once, each with a plan of its own
        (docs/design.md §3, "Two trees of halves for a broadcast"); the first failure stops
        the other. The halves' views go once the copy is whole: it serves both from then on."""
        store = self._store
        itemsize = parse_dtype(obj.dtype).itemsize
        views = [store.create(view_id(obj.oid, h), hi - lo, obj.dtype,
                              [(hi - lo) // itemsize], obj.version)
                 for h, (lo, hi) in enumerate(ins.bounds)]
        plans = [fp.FetchPlan(obj.oid, self.me, plan.deadline, patience=self._patience,
                              hint=ins.hint(h))
                 for h in range(len(views))]
        self._half_plans[obj.oid] = plans
        halves = [self._tasks.spawn(self._fetch(hp, _Half(view, h, ins.bounds[h])),
                                    name=f"fetch-half-{h}-{obj.oid.short()}",
                                    on_error=_awaited)
                  for h, (view, hp) in enumerate(zip(views, plans))]
        try:
            for done in asyncio.as_completed(halves):
                await done
        except HopliteError as exc:
            return fp.HalvesEnded(exc)
        finally:
            for task in halves:
                task.cancel()
            await asyncio.gather(*halves, return_exceptions=True)
            if self._half_plans.get(obj.oid) is plans:
                del self._half_plans[obj.oid]
        for view in views:
            if store.get(view.oid) is view:
                store.remove(view.oid)
        obj.temporary = False  # a copy like any other from now on: it may be evicted
        self.halved += 1
        # its shard may have been rebuilt meanwhile and know nothing of this receiver: tell
        # it the copy is whole, so that gets may use it and a delete reaches it (a message
        # that never makes an entry: the object may have been deleted meanwhile)
        self._directory.transfer_done(obj.oid, self.me, True)
        return fp.HalvesEnded(None)

    def abort(self, oid: ObjectID) -> asyncio.Task[StoredObject] | None:
        """Stop the fetch of ``oid`` under way here, whatever its phase, once nobody waits for
        it: the caller computes ``oid`` here instead (an allreduce stripe given to this node,
        docs/design.md §4), and a fetch that allocated meanwhile would take its id. The
        fetch's task, to await its end (its copy removed), or None."""
        running = self._fetches.get(oid)
        if running is None or self._callers.get(oid):
            return None
        task = running[0]
        self._forget(oid, task)
        task.cancel()
        return task

    def _forget(self, oid: ObjectID, task: asyncio.Task[StoredObject]) -> None:
        """``task`` ended: it is no longer the fetch of ``oid`` (a newer one may be)."""
        running = self._fetches.get(oid)
        if running is not None and running[0] is task:
            del self._fetches[oid]

    def _abandon(self, oid: ObjectID, task: asyncio.Task[StoredObject],
                 plan: fp.FetchPlan) -> None:
        """...unless none is left and nothing is being received yet: then it stops asking, so
        a get given up on (or whose client left) leaves no fetch waiting for ever."""
        if task.done() or plan.phase != "asking" or plan.version is not None:
            return
        self._forget(oid, task)  # a caller arriving now starts a fresh fetch
        task.cancel()

    async def _ask(self, oid: ObjectID, ins: fp.AskOwner, obj: StoredObject | None,
                   loop: asyncio.AbstractEventLoop
                   ) -> Frame[Located] | fp.LocateFailed | fp.CopyFailed:
        """Ask the owner for a source, saying the plan's hint. If our partial copy (or the
        view a half's fetch fills) fails meanwhile (it was deleted), the ask ends with that:
        the shard would wait for a put that may never come, and the copy's memory stay pinned
        until then."""
        if obj is not None and obj.error is not None:
            return fp.CopyFailed(obj.error)
        scope = asyncio.timeout(None)  # expired at once by the copy's failure, if it fails

        def failed(_: HopliteError) -> None:
            if scope.when() is None:  # once
                scope.reschedule(loop.time())

        if obj is not None:
            obj.on_fail.append(failed)
        try:
            async with scope:
                return await self._directory.locate(oid, ins.timeout, list(ins.exclude),
                                                    ins.offset, ins.hint)
        except HopliteError as exc:  # the shard's answer, its timeout included
            return fp.LocateFailed(loop.time(), exc)
        except TimeoutError:
            if obj is None or obj.error is None:
                raise  # not the scope's
            return fp.CopyFailed(obj.error)  # the copy failed
        finally:
            if obj is not None:
                obj.on_fail.remove(failed)

    def _unbacked(self, obj: StoredObject, exc: BaseException) -> None:
        """The copy's memory could not be backed (no memory left): fail the copy, which stops
        its pulls and ends the fetch with the error, instead of writing into unbacked pages."""
        if self._store.get(obj.oid) is obj:
            self._store.remove(obj.oid, exc if isinstance(exc, HopliteError) else CapacityError(
                f"no memory for object {obj.oid.hex()}: {exc!r}", oid=obj.oid.hex()))

    async def _pull(self, obj: StoredObject, source: str, loop: asyncio.AbstractEventLoop,
                    remote: ObjectID | None = None, window: tuple[int, int] | None = None,
                    half: int = -1) -> fp.PullEnded | fp.CopyFailed:
        """One pull from ``source`` (of ``window`` of ``remote``, a half), its outcome as the
        plan's event."""
        error: HopliteError | None = None
        try:
            await self.pull_into(obj, source, obj.oid if remote is None else remote,
                                 obj.version, report=True,
                                 stall=self._link_model.stall_window(SEND_SLICE,
                                                                     self._stall_timeout),
                                 window=window, half=half)
        except HopliteError as exc:
            error = exc
        if obj.error is not None:
            return fp.CopyFailed(obj.error)
        if error is not None:
            log.warning("pull of %s from %s failed at %d/%d bytes (%s)", obj.oid.short(), source,
                        obj.received, obj.size, error)
        return fp.PullEnded(loop.time(), source, obj.received, error)

    async def _local_copy(self, oid: ObjectID) -> StoredObject:
        """The object was put on this node while we were waiting for it."""
        obj = self._store.get(oid)
        if obj is None:
            raise ObjectNotFoundError(f"object {oid.hex()} vanished from this node",
                                      oid=oid.hex())
        await obj.wait_for(obj.size)
        return obj

    def source_died(self, node: str) -> None:
        """A member was declared dead or fell silent: abort our pulls from it now (they resume
        elsewhere, from their watermarks) instead of waiting out a stall."""
        error = PeerUnavailableError(f"source {node} died", node=node)
        self._connections.drop(node)
        death = self._deaths.pop(node, None)
        if death is not None and not death.done():
            death.set_result(None)
        for protocol in list(self._pulls.pop(node, ())):
            protocol.abort(error)

    async def _store_inline(self, oid: ObjectID, located: Located,
                            payload: memoryview | None) -> StoredObject:
        data = payload if payload is not None else memoryview(b"")
        if len(data) != located.size:
            raise RemoteProtocolError(f"inline object of {len(data)} bytes, expected "
                                      f"{located.size}")
        obj = await self._space.create(oid, located.size, located.dtype, located.shape,
                                       located.version)
        obj.buffer[:] = data
        obj.advance(obj.size)
        self._traffic.add_received(self._membership.owner(oid), obj.size)  # its shard's answer
        return obj

    async def pull_into(self, obj: StoredObject, source: str, remote: ObjectID, version: bytes,
                        report: bool = False, stall: float | None = None,
                        until: int | None = None, window: tuple[int, int] | None = None,
                        half: int = -1) -> None:
        """Stream ``source``'s object ``remote`` (at ``version``) into ``obj`` from its
        watermark on; ``report`` tells the directory how far along we are. ``stall``: how long
        the source may send nothing (default: the configured cap; a reduce's pulls keep it,
        since a partial sum legitimately waits for inputs that have not arrived yet).
        ``until``: close the stream once the watermark reaches it (bytes past it may land).
        ``window``: only those bytes of ``remote``, its half ``half`` (``obj`` is that size)."""
        if until is not None and obj.received >= until:
            return
        self._store.pin(obj)  # its memory stays valid until the stream is closed
        try:
            await self._pull_pinned(obj, source, remote, version,
                                    _Stream(report, stall, until, window, half))
        finally:
            self._store.unpin(obj)

    async def _pull_pinned(self, obj: StoredObject, source: str, remote: ObjectID,
                           version: bytes, how: _Stream) -> None:
        member = self._membership.members.get(source)
        if member is None or not self._membership.is_trusted(source):
            raise self._untrusted(source, "is not a live member, or is silent")
        idle = self._connections.take(source, member.host, member.port)
        if idle is not None:
            try:
                await self._stream(idle, obj, source, remote, version, how)
                return
            except _Unanswered:
                # closed before the source said a word: the end of a kept connection, no news
                # about the source, which a fresh connection asks again (docs/design.md §3)
                pass
        try:
            protocol = await self._dial(source, member.host, member.port)
        except ConnectionLostError as exc:
            if refused(exc):
                self._refused(source)
            raise
        try:
            await self._stream(protocol, obj, source, remote, version, how)
        except _Unanswered as exc:
            raise exc.error from None

    async def _dial(self, source: str, host: str, port: int) -> FrameProtocol:
        """A new data connection to ``source``, given up on as soon as it dies or falls
        silent (``source_died``): a pull must not wait out a handshake to a frozen node, whose
        kernel still accepts the connection (say, after a reduce slot's pull on an idle
        connection to a source that fell silent ended unanswered: see
        ``test_a_pull_aborted_by_its_source_falling_silent_does_not_dial_it_again`` in
        tests/unit/test_fetcher_silent_source.py)."""
        if not self._membership.is_trusted(source):  # e.g. it fell silent while we used an
            # idle connection to it, which then closed unanswered
            raise self._untrusted(source, "died or fell silent")
        loop = asyncio.get_running_loop()
        death = self._deaths.get(source)
        if death is None or death.done():
            death = self._deaths[source] = loop.create_future()
        # its failure is this pull's, raised below: nothing to do when it ends
        dial = self._tasks.spawn(self._connections.dial(host, port), name=f"dial-{source}",
                                 on_error=lambda exc: None)
        try:
            await asyncio.wait((dial, death), return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not dial.done():
                dial.cancel()  # the handshake aborts its connection
        if not dial.done() or dial.cancelled():
            raise self._untrusted(source, "died or fell silent")
        return dial.result()

    def _untrusted(self, source: str, what: str) -> PeerUnavailableError:
        """The error of a pull given up because ``source`` is not trusted. ``silent`` when it
        is a member only suspected: the fetch may take it again once it answers (a partition
        healed), where a dead one is excluded for good (:mod:`.fetch_plan`)."""
        silent = source in self._membership.members and self._membership.is_alive(source)
        return PeerUnavailableError(f"source {source} {what}", node=source, silent=silent)

    async def _stream(self, protocol: FrameProtocol, obj: StoredObject, source: str,
                      remote: ObjectID, version: bytes, how: _Stream) -> None:
        """One Pull on ``protocol``; the connection goes back to the idle pool when the
        source's answer ended cleanly, and is closed otherwise. Raises :class:`_Unanswered`
        when it closed before any answer."""
        report, stall, until = how.report, how.stall, how.until
        if obj.error is not None:  # failed or deleted while we connected: nothing to fill
            protocol.close()
            raise obj.error
        pulls = self._pulls.setdefault(source, set())
        pulls.add(protocol)
        start = obj.received
        last_report = 0.0

        def check(msg: DataStream, length: int) -> None:
            if msg.offset != start or msg.size != obj.size or length != obj.size - start:
                raise RemoteProtocolError(
                    f"stream of bytes {msg.offset}..{msg.size} does not match the directory's "
                    f"record ({start}..{obj.size})")

        def on_progress(got: int) -> None:
            nonlocal last_report
            obj.advance(start + got)
            if until is not None and obj.received >= until:
                stream.stop()
            now = time.monotonic()
            meter.chunk(now, got)
            if report and now - last_report >= PROGRESS_INTERVAL:
                last_report = now
                self._directory.progress(remote, obj.received, how.half)

        def on_landed() -> None:
            obj.advance(obj.size)  # the last chunk completes the frame

        def on_fail(error: HopliteError) -> None:
            protocol.abort(error)  # deleted or failed: stop writing into its memory now

        stream = PullStream.into(protocol, obj.buffer, start, source, check=check,
                                 on_progress=on_progress, on_landed=on_landed)
        obj.on_fail.append(on_fail)
        meter = PullRate(time.monotonic())
        frame: Frame[DataStream | Error] | None = None
        try:
            protocol.send(Pull(rid=1, oid=remote, version=version, offset=start,
                               window=None if how.window is None else list(how.window)))
            # a silent source fails, unless the membership still trusts it: then it only
            # waits upstream (a partial holder or a result that has no bytes yet,
            # docs/design.md §5, "Stalls behind a result"), and fails only after the
            # configured cap; a frozen or dead source is not trusted within a second or two,
            # and its pulls are aborted then anyway (``source_died``)
            frame = await stream.wait(self._stall_timeout if stall is None else stall,
                                      self._stall_timeout,
                                      lambda: self._membership.is_trusted(source))
        except ConnectionLostError as exc:
            if not stream.answered and obj.error is None:
                raise _Unanswered(exc) from None
            raise
        except HopliteError:
            raise  # some are OSErrors too (a stall, say): kept as they are
        except OSError as exc:
            if not stream.answered and obj.error is None:
                raise _Unanswered(ConnectionLostError(f"pull from {source}: {exc}")) from None
            raise ConnectionLostError(f"pull from {source}: {exc}") from exc
        finally:
            stream.settle()
            pulls.discard(protocol)
            if not pulls and self._pulls.get(source) is pulls:
                del self._pulls[source]
            obj.on_fail.remove(on_fail)
            if frame is not None:  # the answer ended: nothing more comes on this connection
                self._connections.give_back(source, protocol)
            else:
                protocol.close()
            self._traffic.add_received(source, obj.received - start)
        rate = meter.rate(BANDWIDTH_SAMPLE_MIN)
        if rate is not None:
            self._link_model.observe_bandwidth(rate)
        if frame is not None and isinstance(frame.msg, Error):
            # "no copy here" stays what it is: the source may hold a newer copy soon, and a
            # reduce redoes a leaf whose node lost its input (docs/design.md §5)
            refusal = (ObjectNotFoundError if frame.msg.code == ObjectNotFoundError.code
                       else PeerUnavailableError)
            raise refusal(f"source {source} refused: {frame.msg.message}", node=source)


@dataclass(frozen=True, slots=True)
class _Half:
    """A half's fetch: the ``view`` of the whole copy its pulls fill, which half, and its bytes
    of the whole object (``window``)."""

    view: StoredObject
    half: int
    window: tuple[int, int]


@dataclass(frozen=True, slots=True)
class _Stream:
    """How one pull streams: reports progress, its stall window, where it stops early, and
    the window (and half) of the remote object it takes."""

    report: bool
    stall: float | None
    until: int | None
    window: tuple[int, int] | None
    half: int


def _awaited(exc: BaseException) -> None:
    """A half's fetch failed: the whole object's fetch awaits it and ends with its error."""


def _bounds(flat: list[int] | None) -> tuple[tuple[int, int], ...] | None:
    """(lo0, hi0, lo1, hi1) as the two halves' bounds; anything else is the shard's error."""
    if flat is None:
        return None
    if len(flat) != 4 or not 0 <= flat[0] < flat[1] == flat[2] < flat[3]:
        raise RemoteProtocolError(f"halves {flat} do not split an object in two")
    return (flat[0], flat[1]), (flat[2], flat[3])


class _Unanswered(Exception):
    """A data connection closed before its source answered the Pull (``error``: how)."""

    def __init__(self, error: ConnectionLostError) -> None:
        super().__init__(str(error))
        self.error = error


def _complete(obj: StoredObject | None) -> StoredObject:
    assert obj is not None, "a pulled fetch has its local copy"
    return obj
