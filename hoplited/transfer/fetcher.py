"""The data plane: pulling an object into the local store, and streaming it to others.

Receiving: ask the owner shard for a source (it may be a node still receiving the object
itself), open a data connection, send ``Pull(offset)``; the reply's payload is the object
from ``offset`` on, which the kernel writes straight into the object's arena extent. Every
received chunk advances the object's watermark, which wakes anyone streaming it onward: a
node forwards bytes the moment they land (cut-through). If the source dies or stalls, the
receiver keeps its bytes and resumes from its watermark at another source.

Sending: write the stream header, then memoryview slices of whatever prefix is valid,
waiting on the watermark for more; the object stays pinned until the kernel has every byte.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Optional

from hoplite_client.net.handshake import dial
from hoplite_client.net.protocol import FrameProtocol
from hoplite_client.wire.errors import (
    ConnectionLostError,
    HopliteError,
    HopliteTimeoutError,
    InvalidArgumentError,
    ObjectNotFoundError,
    PeerUnavailableError,
    ProtocolError,
    RemoteProtocolError,
)
from hoplite_client.wire.frames import Frame, encode_header
from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.messages import (
    DataStream,
    Error,
    Locate,
    Located,
    Progress,
    Pull,
    TransferDone,
)
from hoplited.memory.store import StoredObject

if TYPE_CHECKING:
    from hoplited.node import Daemon

log = logging.getLogger("hoplited.transfer")

# Largest slice handed to the transport at once: big enough for few syscalls, small enough
# that a freshly landed prefix is forwarded without waiting for a whole block.
SEND_SLICE = 8 * 1024 * 1024
# How often a receiver tells the directory how far along it is (source choice uses it).
PROGRESS_INTERVAL = 0.05
# Transfers at least this big tell the daemon's link model how fast links are.
BANDWIDTH_SAMPLE_MIN = 1 << 20
# Sources tried before a get gives up on a transfer.
MAX_ATTEMPTS = 8

_RETRIABLE = (ConnectionLostError, PeerUnavailableError, HopliteTimeoutError, ProtocolError,
              OSError)


class Transfers:
    """Fetches objects into this node's store and serves pulls from it."""

    def __init__(self, daemon: "Daemon") -> None:
        self.daemon = daemon
        self._fetches: dict[ObjectID, asyncio.Task[StoredObject]] = {}

    async def fetch(self, oid: ObjectID, timeout: Optional[float]) -> StoredObject:
        """The complete local copy of ``oid``, pulling it from the cluster if needed."""
        obj = self.daemon.store.get(oid)
        if obj is None:
            task = self._fetches.get(oid)
            if task is None:
                task = asyncio.create_task(self._fetch(oid, timeout), name=f"fetch-{oid.short()}")
                self._fetches[oid] = task
                task.add_done_callback(lambda _: self._fetches.pop(oid, None))
            try:
                return await asyncio.wait_for(asyncio.shield(task), timeout)
            except asyncio.TimeoutError:
                raise HopliteTimeoutError(f"object {oid.hex()} not received within {timeout}s",
                                          oid=oid.hex()) from None
        try:
            await asyncio.wait_for(obj.wait_for(obj.size), timeout)
        except asyncio.TimeoutError:
            raise HopliteTimeoutError(f"object {oid.hex()} not complete within {timeout}s",
                                      oid=oid.hex()) from None
        return obj

    async def _fetch(self, oid: ObjectID, timeout: Optional[float]) -> StoredObject:
        daemon = self.daemon
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        obj: Optional[StoredObject] = None
        populate: Optional[asyncio.Task[None]] = None
        exclude: list[str] = []
        try:
            for _ in range(MAX_ATTEMPTS):
                if obj is not None and obj.error is not None:
                    raise obj.error
                remaining = None if deadline is None else max(0.0, deadline - loop.time())
                offset = obj.received if obj is not None else 0
                frame = await daemon.call_owner(
                    oid, lambda rid, t=remaining, o=offset: Locate(
                        rid=rid, oid=oid, timeout=t, exclude=list(exclude), offset=o))
                located: Located = frame.msg
                if located.source == daemon.node_id or (obj is None and daemon.store.get(oid)):
                    return await self._local_copy(oid)
                if located.source is None:
                    return self._store_inline(oid, located, frame.payload)
                if obj is None:
                    obj = daemon.store.create(oid, located.size, located.dtype, located.shape,
                                              located.version)
                    daemon.store.pin(obj)  # the kernel writes into it until the pull ends
                    populate = asyncio.create_task(
                        daemon.arena.populate(obj.offset, obj.size))
                elif obj.version != located.version:
                    raise ObjectNotFoundError(f"object {oid.hex()} was replaced while it was "
                                              f"being received", oid=oid.hex())
                try:
                    await self._pull(obj, located.source)
                except _RETRIABLE as exc:
                    log.warning("pull of %s from %s failed at %d/%d bytes (%s); resuming",
                                oid.short(), located.source, obj.received, obj.size, exc)
                    daemon.notify_owner(oid, TransferDone(oid=oid, source=located.source,
                                                          complete=False))
                    exclude.append(located.source)
                    continue
                daemon.notify_owner(oid, TransferDone(oid=oid, source=located.source,
                                                      complete=True))
                return obj
            raise PeerUnavailableError(f"gave up on {oid.hex()} after {MAX_ATTEMPTS} sources",
                                       oid=oid.hex())
        except BaseException as exc:
            if obj is not None and daemon.store.get(oid) is obj:
                error = exc if isinstance(exc, HopliteError) else ConnectionLostError(str(exc))
                daemon.store.remove(oid, error)
            raise
        finally:
            if populate is not None:
                populate.cancel()
            if obj is not None:
                daemon.store.unpin(obj)

    async def _local_copy(self, oid: ObjectID) -> StoredObject:
        """The object was put on this node while we were waiting for it."""
        obj = self.daemon.store.get(oid)
        if obj is None:
            raise ObjectNotFoundError(f"object {oid.hex()} vanished from this node",
                                      oid=oid.hex())
        await obj.wait_for(obj.size)
        return obj

    def _store_inline(self, oid: ObjectID, located: Located,
                      payload: Optional[memoryview]) -> StoredObject:
        data = payload if payload is not None else memoryview(b"")
        if len(data) != located.size:
            raise RemoteProtocolError(f"inline object of {len(data)} bytes, expected "
                                      f"{located.size}")
        obj = self.daemon.store.create(oid, located.size, located.dtype, located.shape,
                                       located.version)
        obj.buffer[:] = data
        obj.advance(obj.size)
        self.daemon.counters["bytes_in"] += obj.size
        return obj

    async def _pull(self, obj: StoredObject, source: str) -> None:
        """Stream ``obj`` from ``source`` starting at its watermark, until complete."""
        await self.pull_into(obj, source, obj.oid, obj.version, report=True)

    async def pull_into(self, obj: StoredObject, source: str, remote: ObjectID, version: bytes,
                        report: bool = False) -> None:
        """Stream ``source``'s object ``remote`` (at ``version``) into ``obj`` from its
        watermark on; ``report`` tells the directory how far along we are."""
        daemon = self.daemon
        member = daemon.membership.members.get(source)
        if member is None or not daemon.membership.is_alive(source):
            raise PeerUnavailableError(f"source {source} is not a live member", node=source)
        protocol, peer_id = await dial(member.host, member.port, "data", daemon.identity)
        start = obj.received
        done: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
        last_report = 0.0

        def sink(msg: DataStream, length: int) -> memoryview:
            if msg.offset != start or msg.size != obj.size or length != obj.size - start:
                raise RemoteProtocolError(
                    f"stream of bytes {msg.offset}..{msg.size} does not match the directory's "
                    f"record ({start}..{obj.size})")
            return obj.buffer[start:]

        def on_stream(got: int) -> None:
            nonlocal last_report
            obj.advance(start + got)
            now = time.monotonic()
            if report and now - last_report >= PROGRESS_INTERVAL:
                last_report = now
                daemon.notify_owner(obj.oid, Progress(oid=obj.oid, received=obj.received))

        def on_frame(frame: Frame) -> None:
            if isinstance(frame.msg, DataStream):
                obj.advance(obj.size)  # the last chunk completes the frame
            if not done.done():
                done.set_result(frame)

        def on_fail(error: HopliteError) -> None:
            protocol.abort(error)  # deleted or failed: stop writing into its memory now

        protocol.set_stream_sink(sink)
        protocol.on_stream = on_stream
        protocol.handler = on_frame
        obj.on_fail.append(on_fail)
        began = time.monotonic()
        try:
            protocol.send(Pull(rid=1, oid=remote, version=version, offset=start))
            frame = await self._watch(protocol, obj, done)
        finally:
            obj.on_fail.remove(on_fail)
            protocol.close()
            daemon.counters["bytes_in"] += obj.received - start
        if obj.received - start >= BANDWIDTH_SAMPLE_MIN:
            daemon.links_model.observe_bandwidth((obj.received - start)
                                                 / max(time.monotonic() - began, 1e-6))
        if isinstance(frame.msg, Error):
            raise PeerUnavailableError(f"source {source} refused: {frame.msg.message}",
                                       node=source)

    async def _watch(self, protocol: FrameProtocol, obj: StoredObject,
                     done: asyncio.Future[Frame]) -> Frame:
        """Wait for the stream to end; a silent source (no byte for stall_timeout) fails."""
        stall = self.daemon.config.stall_timeout
        seen = obj.received
        while True:
            finished, _ = await asyncio.wait({done, protocol.closed}, timeout=stall,
                                             return_when=asyncio.FIRST_COMPLETED)
            if done in finished:
                return done.result()
            if protocol.closed in finished:
                raise ConnectionLostError(f"source closed the stream at {obj.received}"
                                          f"/{obj.size} bytes")
            if obj.received == seen:
                raise HopliteTimeoutError(f"source sent nothing for {stall}s")
            seen = obj.received

    async def serve(self, protocol: FrameProtocol) -> None:
        """Answer Pull requests on an accepted data connection until it closes."""
        try:
            await self._serve(protocol)
        finally:
            protocol.abort()

    async def _serve(self, protocol: FrameProtocol) -> None:
        queue: asyncio.Queue[Frame] = asyncio.Queue()
        protocol.handler = queue.put_nowait
        while True:
            get = asyncio.ensure_future(queue.get())
            await asyncio.wait({get, protocol.closed}, return_when=asyncio.FIRST_COMPLETED)
            if not get.done():
                get.cancel()
                return
            msg = get.result().msg
            if not isinstance(msg, Pull):
                protocol.send(Error(rid=getattr(msg, "rid", 0), code="protocol",
                                    message=f"data connections take Pull, not "
                                            f"{type(msg).__name__}", data={}))
                continue
            try:
                await self._send(protocol, msg)
            except HopliteError as exc:
                log.info("stopped sending %s: %s", msg.oid.short(), exc)
                return

    async def _send(self, protocol: FrameProtocol, pull: Pull) -> None:
        obj = self.daemon.store.get(pull.oid)
        if obj is None or obj.version != pull.version or obj.error is not None:
            protocol.send(Error(rid=pull.rid, code=ObjectNotFoundError.code,
                                message=f"no copy of {pull.oid.hex()} (version "
                                        f"{pull.version.hex()}) here", data={}))
            return
        if not 0 <= pull.offset <= obj.size:
            protocol.send(Error(rid=pull.rid, code=InvalidArgumentError.code,
                                message=f"offset {pull.offset} outside 0..{obj.size}", data={}))
            return
        store = self.daemon.store
        store.pin(obj)
        try:
            protocol.write_raw(memoryview(encode_header(
                DataStream(rid=pull.rid, offset=pull.offset, size=obj.size),
                obj.size - pull.offset)))
            pos = pull.offset
            while pos < obj.size:
                valid = await obj.wait_for(pos + 1)
                end = min(valid, pos + SEND_SLICE)
                protocol.write_raw(obj.buffer[pos:end])
                self.daemon.counters["bytes_out"] += end - pos
                pos = end
                await protocol.drain()
            await protocol.flush()
        finally:
            store.unpin(obj)
