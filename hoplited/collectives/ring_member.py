"""One node's part in a ring allreduce: its stream to the successor, the one from its
predecessor, and the result between them (docs/design.md §4, "Ring allreduce").

The member allocates the result, takes an idle data connection to its successor (the standing
one pulls keep warm; dialled if none) and, once the successor has its own task (``RingOpen``
answered), sends its schedule's first segments from its input (with several inputs here,
from their sum), then every received segment the schedule forwards, in the order received,
and gives the connection back. The predecessor's stream lands straight in the result's
memory: the reader asks :meth:`sink` for the next segment's view, checked against the
schedule, so nothing is copied and a peer cannot write anywhere else. Reduce-scatter segments
get this member's inputs combined in place. Once the last segment is here the member reports
to the caller's node, and publishes its copy when the caller commits. A neighbour that
vanishes or stalls, or any bad frame, ends the member with a typed error it reports; the
caller decides what happens next (:mod:`.stripes`).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from hoplite_client.net.protocol import FrameProtocol, Phase
from hoplite_client.wire.errors import (
    ConnectionLostError,
    HopliteError,
    HopliteTimeoutError,
    InvalidArgumentError,
    PeerUnavailableError,
    RemoteProtocolError,
    error_from_wire,
)
from hoplite_client.wire.frames import INLINE_MAX, MAX_IDS_PER_FRAME, Frame, encode_header
from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.messages import (
    Error,
    Ok,
    RingOpen,
    RingReport,
    RingSegment,
    RingTask,
    WireMessage,
)
from hoplited.collectives.ops import OPS, check_reducible
from hoplited.collectives.ring import RING_MAX, ring_schedule
from hoplited.directory.client import DirectoryClient
from hoplited.memory.store import (
    VERSION_SIZE,
    CopyWithdrawn,
    ObjectStore,
    StoredObject,
    check_meta,
)
from hoplited.tasks import Tasks
from hoplited.transfer.pull_stream import PullStream
from hoplited.transfer.traffic import Traffic

log = logging.getLogger("hoplited.ring")

# Dialling the successor and its answer to RingOpen (it answers once its own task is there,
# sent by the caller's node at the same moment as ours).
OPEN_TIMEOUT = 10.0
# A stream this long (after its first segment) is a sample of the link's rate, as a pull of
# at least 1 MiB is (hoplited/cluster/link_model.py).
RATE_SAMPLE_MIN = 1 << 20


@dataclass(frozen=True, kw_only=True)
class RingDeps:
    """What a ring member uses: this node's id, its store, the directory (to publish), a
    one-way to the caller, data connections to members (taken or dialled, given back once a
    stream ended cleanly, probed when one broke off), the link model's rate and the traffic
    counters to feed, tasks, and how long a stream may stand still before the member gives
    up."""

    me: str
    store: ObjectStore
    directory: DirectoryClient
    tell: Callable[[str, WireMessage], None]
    connect: Callable[[str], Awaitable[FrameProtocol]]
    give_back: Callable[[str, FrameProtocol], None]
    probe: Callable[[str], None]  # a neighbour's stream broke: is its process gone?
    observe_rate: Callable[[float], None]  # bytes/s the predecessor's stream ran at
    traffic: Traffic  # object bytes moved, per peer (status, metrics)
    tasks: Tasks
    stall_timeout: float


def check_ring_task(me: str, msg: RingTask) -> tuple[int, list[ObjectID]]:
    """Refuse a ring task no caller sends; returns this node's position in the ring and the
    inputs it adds."""
    check_meta(msg.dtype, list(msg.shape), msg.size)
    check_reducible(msg.op, msg.dtype)
    n = msg.members
    if (not 2 <= n <= RING_MAX or not 0 <= msg.position < n
            or not 1 <= len(msg.inputs) <= MAX_IDS_PER_FRAME
            or not msg.predecessor or not msg.successor or me in (msg.predecessor, msg.successor)
            or (n == 2) != (msg.predecessor == msg.successor)
            or msg.size <= INLINE_MAX or len(msg.version) != VERSION_SIZE):
        raise InvalidArgumentError(f"a ring task of {msg.size} bytes at {msg.position} of {n} "
                                   f"members ({len(msg.inputs)} inputs)")
    return msg.position, list(msg.inputs)


class RingMember:
    """Runs this node's part of one ring allreduce."""

    def __init__(self, deps: RingDeps, msg: RingTask, caller: str,
                 forget: Callable[[], object]) -> None:
        self.d = deps
        self.result = msg.result
        self.version = msg.version
        self.caller = caller
        self._forget = forget
        pos, inputs = check_ring_task(deps.me, msg)
        n = msg.members
        self.successor, self.predecessor = msg.successor, msg.predecessor
        own: list[StoredObject] = []
        for oid in inputs:
            obj = deps.store.get(oid)
            if obj is None or not obj.complete or (obj.size, obj.dtype, obj.shape) != (
                    msg.size, msg.dtype, list(msg.shape)):
                raise InvalidArgumentError(f"input {oid.hex()} is not here whole as "
                                           f"{msg.dtype}{list(msg.shape)}", oid=oid.hex())
            own.append(obj)
        dtype = np.dtype(msg.dtype)
        self._schedule = ring_schedule(msg.size, dtype.itemsize, n, pos)
        self._ufunc = OPS[msg.op]
        self._dtype = dtype
        self.whole = deps.store.create(msg.result, msg.size, msg.dtype, list(msg.shape),
                                       msg.version, temporary=True)
        self._own = own
        for obj in own:
            deps.store.pin(obj)
        deps.store.pin(self.whole)
        self._next = 0  # index of the next segment the predecessor sends
        self._first_at = 0.0  # when the first segment was here
        self._streamed = 0  # bytes received after the first segment
        # the first segments go from the input itself, or, with several inputs here, from
        # their sum, made in the result's memory just before each is sent
        self._unsummed = len(self._schedule.first) if len(own) > 1 else 0
        source = self.whole if len(own) > 1 else own[0]
        self._outbox: deque[memoryview] = deque(source.buffer[lo:hi]
                                                for lo, hi in self._schedule.first)
        self._to_send = len(self._schedule.first) + sum(s.forward
                                                        for s in self._schedule.receive)
        loop = asyncio.get_running_loop()
        self._more = asyncio.Event()  # the outbox grew
        self._more.set()
        self._received: asyncio.Future[None] = loop.create_future()
        self._committed: asyncio.Future[None] = loop.create_future()
        self._inbound: PullStream | None = None  # until the last segment arrived
        self._inbound_done: asyncio.Future[bool] = loop.create_future()
        self._outbound: FrameProtocol | None = None  # until given back
        self._progress = loop.time()
        self._ended = False
        self.complete = False
        self._sender: asyncio.Task[None] | None = None  # the stream to the successor
        self._main = deps.tasks.spawn(self._run(), name=f"ring-{msg.result.short()}",
                                      on_error=self.fail)

    # --- the predecessor's stream ---
    def attach(self, protocol: FrameProtocol) -> asyncio.Future[bool]:
        """``protocol`` carries the predecessor's segments from now on. The future: True once
        the last one arrived (the connection is ours no more, and may serve pulls again),
        False if the stream broke off (the connection must close)."""
        if self._ended or self._inbound is not None or self._inbound_done.done():
            raise RemoteProtocolError(f"ring {self.result.short()} has its stream already")
        self._inbound = PullStream(protocol, self.sink, self._on_frame)
        protocol.on_lost.append(self._inbound_lost)
        return self._inbound_done

    def sink(self, msg: Any, length: int) -> memoryview:
        """Where the next segment goes: its view of the result, if it is the one expected."""
        receive = self._schedule.receive
        if (not isinstance(msg, RingSegment) or msg.index != self._next
                or self._next >= len(receive)
                or length != receive[self._next].hi - receive[self._next].lo):
            raise RemoteProtocolError(f"ring {self.result.short()}: unexpected segment "
                                      f"({type(msg).__name__}, {length} bytes) at "
                                      f"{self._next}")
        seg = receive[self._next]
        return self.whole.buffer[seg.lo:seg.hi]

    def _on_frame(self, frame: Frame[Any]) -> bool:
        """A segment is in (any other frame fails the member); True after the last one."""
        if self._ended:
            return False
        if not isinstance(frame.msg, RingSegment):
            self.fail(RemoteProtocolError(f"{self.predecessor} sent "
                                          f"{type(frame.msg).__name__} on a ring stream"))
            return False
        seg = self._schedule.receive[self._next]
        self._next += 1
        self._progress = asyncio.get_running_loop().time()
        self.d.traffic.add_received(self.predecessor, seg.hi - seg.lo)
        if self._next == 1:
            self._first_at = self._progress
        else:
            self._streamed += seg.hi - seg.lo
        view = self.whole.buffer[seg.lo:seg.hi]
        if seg.add:
            out = np.frombuffer(view, dtype=self._dtype)
            for obj in self._own:
                self._ufunc(out, np.frombuffer(obj.buffer[seg.lo:seg.hi], dtype=self._dtype),
                            out=out)
        if seg.forward:
            self._outbox.append(view)
            self._more.set()
        if self._next < len(self._schedule.receive) or self._inbound is None:
            return False
        inbound, self._inbound = self._inbound, None
        inbound.protocol.on_lost.remove(self._inbound_lost)
        inbound.close()  # frames after the stream go to whoever had the connection before
        self._inbound_done.set_result(True)
        self._received.set_result(None)
        if self._streamed >= RATE_SAMPLE_MIN and self._progress > self._first_at:
            # the ring keeps each link busy: its stream's rate is the link's, as a pull's
            # is (the reduce's and broadcast's shapes read it)
            self.d.observe_rate(self._streamed / (self._progress - self._first_at))
        return True

    def _inbound_lost(self, exc: BaseException | None) -> None:
        if not self._inbound_done.done():
            self._inbound_done.set_result(False)
        if not self._received.done() and not self._ended:
            self.d.probe(self.predecessor)  # a killed predecessor is declared dead at once
            self.fail(ConnectionLostError(f"ring {self.result.short()}: the stream from "
                                          f"{self.predecessor} closed early"))

    # --- the member's course ---
    async def _run(self) -> None:
        self._sender = sender = self.d.tasks.spawn(self._send(), name="ring-send",
                                                   on_error=self._send_failed)
        watchdog = self.d.tasks.spawn(self._watch(), name="ring-watch", on_error=self.fail)
        try:
            await self._received
            self.whole.advance(self.whole.size)
            self.complete = True
            self.d.tell(self.caller, RingReport(result=self.result, version=self.version,
                                                code="", message=""))
            await asyncio.wait([sender])  # its failure, once whole here, is only logged
            await self._committed
        finally:
            watchdog.cancel()
        self.whole.temporary = False
        try:
            await self.d.directory.publish(self.whole)
        except HopliteError:  # refused (a version retired since: docs/design.md §4, "Ring
            # allreduce") or not recorded: the copy goes with the member (``fail``)
            self.whole.temporary = True
            raise
        self._end()

    async def _send(self) -> None:
        async with asyncio.timeout(OPEN_TIMEOUT):
            protocol = await self.d.connect(self.successor)
        self._outbound = protocol
        if self._ended:
            protocol.abort()
            return
        protocol.enter(Phase.OPENING)  # the answer is read with next_frame
        protocol.send(RingOpen(rid=1, result=self.result, version=self.version))
        frame = await protocol.next_frame(OPEN_TIMEOUT)
        if isinstance(frame.msg, Error):
            raise error_from_wire(frame.msg.code, frame.msg.message, frame.msg.data)
        if not isinstance(frame.msg, Ok):
            raise RemoteProtocolError(f"{self.successor} answered RingOpen with "
                                      f"{type(frame.msg).__name__}")
        protocol.enter(Phase.SENDING, handler=lambda f: self.fail(RemoteProtocolError(
            f"{self.successor} sent {type(f.msg).__name__} on our ring stream")))
        loop = asyncio.get_running_loop()
        sent = 0
        while sent < self._to_send:
            if not self._outbox:
                self._more.clear()
                await self._more.wait()
                continue
            view = self._outbox.popleft()
            if sent < self._unsummed:
                self._sum_inputs(*self._schedule.first[sent])
            protocol.write_raw(memoryview(encode_header(RingSegment(index=sent), len(view))))
            protocol.write_raw(view)
            self.d.traffic.add_sent(self.successor, len(view))
            sent += 1
            await protocol.drain()
            self._progress = loop.time()
        await protocol.flush()
        self._outbound = None
        self.d.give_back(self.successor, protocol)

    def _sum_inputs(self, lo: int, hi: int) -> None:
        """Bytes ``lo..hi`` of the result: this node's inputs combined."""
        out = np.frombuffer(self.whole.buffer[lo:hi], dtype=self._dtype)
        first, *rest = (np.frombuffer(obj.buffer[lo:hi], dtype=self._dtype)
                        for obj in self._own)
        np.copyto(out, first)
        for other in rest:
            self._ufunc(out, other, out=out)

    def _send_failed(self, exc: BaseException) -> None:
        """The stream to the successor broke: fatal unless the result is whole here already
        (then only the successor misses segments, and it reports that itself)."""
        if not self._ended:
            self.d.probe(self.successor)
        if self.complete:
            log.info("ring %s: stream to %s: %s", self.result.short(), self.successor, exc)
        else:
            self.fail(exc)

    async def _watch(self) -> None:
        """Fail once neither stream moved for the stall timeout (a neighbour stopped)."""
        loop = asyncio.get_running_loop()
        limit = self.d.stall_timeout
        while True:
            await asyncio.sleep(max(0.1, limit - (loop.time() - self._progress)))
            if loop.time() - self._progress >= limit:
                raise HopliteTimeoutError(f"ring {self.result.short()}: no progress for "
                                          f"{limit}s")

    def successor_died(self) -> None:
        """The successor died. With the result whole here, only the successor missed
        segments: stop streaming to it and go on to publish. A frozen successor reads
        nothing, and the stream would otherwise wait on the connection's write pressure
        until the stall timeout, the member's copy and inputs pinned (see
        ``test_a_member_whose_successor_died_stops_its_stream_and_publishes`` in
        tests/unit/test_ring_member.py). A member still receiving fails, as for a lost
        predecessor (docs/design.md §5, "Sends to the dead")."""
        if not self.complete:
            self.fail(PeerUnavailableError(f"ring member {self.successor} died",
                                           node=self.successor))
            return
        if self._sender is not None:
            self._sender.cancel()
        if self._outbound is not None:
            self._outbound.abort()
            self._outbound = None

    # --- what the caller says ---
    def commit(self) -> None:
        """The result exists: publish this copy once it is whole."""
        if not self._committed.done():
            self._committed.set_result(None)

    def fail(self, exc: BaseException) -> None:
        """This member cannot finish: report why to the caller and drop what it holds."""
        if self._ended:
            return
        if isinstance(exc, HopliteError):
            error = exc
        elif isinstance(exc, (TimeoutError, OSError)):
            error = ConnectionLostError(f"ring {self.result.short()}: {self.successor}: {exc}")
        else:
            log.error("ring %s crashed", self.result.short(), exc_info=exc)
            error = HopliteError(f"{type(exc).__name__}: {exc}")
        log.info("ring %s: %s", self.result.short(), error)
        self.d.tell(self.caller, RingReport(result=self.result, version=self.version,
                                            code=error.code, message=str(error)))
        # the result is made again (or exists elsewhere): gets here fetch it instead; the
        # member stays listed until the caller answers, or dies (then the node records the
        # failure for the result's getters)
        self._drop(CopyWithdrawn(f"ring {self.result.short()}: {error}"))

    def stop(self, error: HopliteError) -> None:
        """The caller ended this ring (or the result was deleted): drop it and be forgotten."""
        self._drop(error)
        self._forget()

    @property
    def ended(self) -> bool:
        return self._ended

    def _drop(self, error: HopliteError) -> None:
        """Drop this member's copy (unless already published) and close its streams."""
        if self._ended:
            return
        if self.whole.temporary and self.d.store.get(self.result) is self.whole:
            self.d.store.remove(self.result, error)
        self._main.cancel()
        self._release()

    def _end(self) -> None:
        self._release()
        self._forget()

    def _release(self) -> None:
        self._ended = True
        if not self._received.done():
            self._received.cancel()
        self._outbox.clear()
        inbound = None if self._inbound is None else self._inbound.protocol
        for protocol in (inbound, self._outbound):  # cut off mid-stream: unusable
            if protocol is not None:
                protocol.abort()
        self._inbound = self._outbound = None
        if not self._inbound_done.done():
            self._inbound_done.set_result(False)
        for obj in self._own:
            self.d.store.unpin(obj)
        self.d.store.unpin(self.whole)

