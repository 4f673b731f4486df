"""Sending: serving ``Pull`` requests on accepted data connections.

Write the stream header, then memoryview slices of whatever prefix of the object is valid,
waiting on its watermark for more (so a node still receiving an object forwards it as it
lands); honour the transport's write pressure; keep the object pinned until the kernel has
every byte. Between pulls a connection may carry a ring allreduce's stream from its dialler
(``RingOpen``, then segments): it is handed to the ring for that long, so rings reuse the warm
connections pulls keep (docs/design.md §4, "Ring allreduce").
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from hoplite_client.net.protocol import FrameProtocol, Phase
from hoplite_client.wire.errors import (
    HopliteError,
    InvalidArgumentError,
    ObjectNotFoundError,
    PeerUnavailableError,
)
from hoplite_client.wire.frames import Frame, encode_header
from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.messages import DataStream, Error, Pull, RingOpen
from hoplited.memory.store import ObjectStore, StoredObject
from hoplited.transfer.traffic import Traffic

log = logging.getLogger("hoplited.transfer")

# Largest slice handed to the transport at once: big enough for few syscalls, small enough
# that a freshly landed prefix is forwarded without waiting for a whole block.
SEND_SLICE = 8 * 1024 * 1024
# A Pull may reach a node that its shard enrolled as a source before the node's own fetch has
# created the copy (the Locate's answer is still on its way): the sender waits this long for
# it, rather than refusing and sending the puller to another source (docs/design.md §3).
ENROLLED_WAIT = 2.0
# How long a Pull placed ahead (version b"": a reduce's leaf placed before its input exists,
# docs/design.md §4, "The last input's leaf placed ahead") waits for a complete copy here;
# after that the puller hears "no copy" and its plan waits for the input, as for a leaf not
# placed ahead.
AHEAD_WAIT = 10.0

# Takes a connection whose dialler opened a ring stream on it; True once the stream ended
# cleanly (the connection is back in SERVING, for pulls), False if the connection must close.
RingServer = Callable[[FrameProtocol, str, RingOpen], Awaitable[bool]]


class Sender:
    """Streams local objects to the receivers that pull them."""

    def __init__(self, store: ObjectStore, traffic: Traffic,
                 fetching: Callable[[ObjectID], bool], ring: RingServer) -> None:
        self._store = store
        self._traffic = traffic
        self._fetching = fetching  # this node is fetching the id: its copy is on its way
        self._ring = ring
        self._streams: Counter[ObjectID] = Counter()  # streams being sent, by object
        self._peers: dict[str, set[FrameProtocol]] = {}  # connections served, by dialler

    def sending(self, oid: ObjectID) -> int:
        """How many pulls of ``oid`` this node serves now."""
        return self._streams[oid]

    async def serve(self, protocol: FrameProtocol, peer: str) -> None:
        """Answer ``peer``'s Pull requests on an accepted data connection until it closes."""
        served = self._peers.setdefault(peer, set())
        served.add(protocol)
        try:
            await self._serve(protocol, peer)
        finally:
            served.discard(protocol)
            if not served and self._peers.get(peer) is served:
                del self._peers[peer]
            protocol.abort()

    def peer_died(self, node: str) -> None:
        """``node`` was declared dead: end what we send it now. A frozen receiver reads
        nothing, so a stream to it waits on the transport's write pressure for ever and keeps
        what it sends pinned, deleted or not (docs/design.md §5, "Sends to the dead")."""
        error = PeerUnavailableError(f"receiver {node} died", node=node)
        for protocol in list(self._peers.pop(node, ())):
            protocol.abort(error)

    async def _serve(self, protocol: FrameProtocol, peer: str) -> None:
        # None: the connection closed (a marker in the queue, so no task waits on both)
        queue: asyncio.Queue[Frame[Any] | None] = asyncio.Queue()
        protocol.enter(Phase.SERVING, handler=queue.put_nowait)
        protocol.on_lost.append(lambda _: queue.put_nowait(None))
        while not protocol.closed.done():
            frame = await queue.get()
            if frame is None:
                return
            msg = frame.msg
            if isinstance(msg, RingOpen):  # the ring's stream ends back in SERVING
                if not await self._ring(protocol, peer, msg):
                    return
                continue
            if not isinstance(msg, Pull):
                protocol.send(Error(rid=getattr(msg, "rid", 0), code="protocol",
                                    message=f"data connections take Pull, not "
                                            f"{type(msg).__name__}", data={}))
                continue
            try:
                await self._send(protocol, msg, peer)
            except HopliteError as exc:
                log.info("stopped sending %s: %s", msg.oid.short(), exc)
                return

    async def _send(self, protocol: FrameProtocol, pull: Pull, peer: str) -> None:
        store = self._store
        if pull.version:
            obj = store.get(pull.oid)
            if obj is None and self._fetching(pull.oid):
                obj = await store.wait_created(pull.oid, ENROLLED_WAIT)
        else:
            obj = await self._ahead(pull.oid)
        if (obj is None or obj.version != (pull.version or obj.version)
                or obj.error is not None):
            protocol.send(Error(rid=pull.rid, code=ObjectNotFoundError.code,
                                message=f"no copy of {pull.oid.hex()} (version "
                                        f"{pull.version.hex()}) here", data={}))
            return
        whole, base = obj, 0
        if pull.window is not None:
            try:
                obj, base = await self._window(obj, pull.window)
            except HopliteError as exc:
                protocol.send(Error(rid=pull.rid, code=exc.code, message=str(exc), data={}))
                return
        size = obj.size if pull.window is None else pull.window[1] - pull.window[0]
        if not 0 <= pull.offset <= size:
            protocol.send(Error(rid=pull.rid, code=InvalidArgumentError.code,
                                message=f"offset {pull.offset} outside 0..{size}", data={}))
            return
        store.pin(obj)
        self._streams[whole.oid] += 1
        try:
            protocol.write_raw(memoryview(encode_header(
                DataStream(rid=pull.rid, offset=pull.offset, size=size), size - pull.offset)))
            pos = pull.offset
            while pos < size:
                valid = await obj.wait_for(base + pos + 1) - base
                end = min(valid, pos + SEND_SLICE, size)
                protocol.write_raw(obj.buffer[base + pos:base + end])
                self._traffic.add_sent(peer, end - pos)
                pos = end
                await protocol.drain()
            await protocol.flush()
        finally:
            store.unpin(obj)
            self._streams[whole.oid] -= 1
            if not self._streams[whole.oid]:
                del self._streams[whole.oid]

    async def _ahead(self, oid: ObjectID) -> StoredObject | None:
        """The copy of ``oid`` a pull placed ahead waits for: created here and complete within
        :data:`AHEAD_WAIT`, at whatever version (the puller's plan learns it from the shard),
        or None. Nothing is pinned while it waits."""
        store = self._store
        try:
            async with asyncio.timeout(AHEAD_WAIT):  # not wait_for: docs/architecture.md §3
                obj = store.get(oid) or await store.wait_created(oid, AHEAD_WAIT)
                if obj is not None:
                    await obj.wait_for(obj.size)
        except (TimeoutError, HopliteError):
            return None
        return obj

    async def _window(self, obj: StoredObject, window: list[int]) -> tuple[StoredObject, int]:
        """What serves bytes ``window`` of ``obj`` (a half, docs/design.md §3), and where they
        start in it: the object itself once complete, else the view of its half that this
        node's own fetch fills (it may be about to create it)."""
        if len(window) != 2 or not 0 <= window[0] < window[1] <= obj.size:
            raise InvalidArgumentError(f"window {window} outside 0..{obj.size}")
        lo, hi = window
        if obj.complete:
            return obj, lo
        for region in obj.regions:
            if (region.lo, region.hi) == (lo, hi):
                view = self._store.get(region.oid) or await self._store.wait_created(
                    region.oid, ENROLLED_WAIT)
                if view is not None and view.error is None:
                    return view, 0
        raise ObjectNotFoundError(f"no copy of bytes {lo}..{hi} of {obj.oid.hex()} here",
                                  oid=obj.oid.hex())
