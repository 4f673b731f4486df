"""The Unix-socket service for local client processes.

Connecting: the client sends ClientHello; the daemon answers ClientWelcome with the arena's
memfd attached (SCM_RIGHTS), so the client maps the same memory. After that the socket carries
only small control frames: object bytes go through shared memory. Large objects are reported
as arena offsets and pinned until the client releases its view; small ones (inline size) are
sent as the reply's payload. A client that disconnects releases its pins, and objects it had
created but not sealed are discarded.
"""

from __future__ import annotations

import array
import asyncio
import errno
import logging
import os
import socket
from typing import TYPE_CHECKING, Any, Optional

from hoplite_client.net.channel import Channel, remote_error
from hoplite_client.net.handshake import HANDSHAKE_TIMEOUT
from hoplite_client.net.protocol import FrameProtocol
from hoplite_client.wire.errors import (
    HopliteError,
    InvalidArgumentError,
    ObjectExistsError,
    ObjectNotFoundError,
    RemoteProtocolError,
)
from hoplite_client.wire.frames import (
    INLINE_MAX,
    SUPPORTED_VERSIONS,
    Frame,
    FrameReader,
    encode_header,
)
from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.messages import (
    REPLY_KINDS,
    Abort,
    ClientHello,
    ClientWelcome,
    Create,
    Created,
    Delete,
    Found,
    Get,
    InputList,
    Ok,
    Put,
    Reduce,
    ReducedInputs,
    Release,
    Seal,
    Stats,
    Status,
    StatusReply,
)
from hoplited.collectives.reduce import OPS, ReduceCoordinator
from hoplited.memory.store import StoredObject

if TYPE_CHECKING:
    from hoplited.node import Daemon

log = logging.getLogger("hoplited.clients")

STATUS_TIMEOUT = 2.0  # per member, when a client asks for the cluster's status


class ClientService:
    """Accepts local clients on the Unix socket and serves their requests."""

    def __init__(self, daemon: "Daemon") -> None:
        self.daemon = daemon
        self.sessions: set[ClientSession] = set()
        self._sock: Optional[socket.socket] = None
        self._path = ""
        self._accepting: Optional[asyncio.Task[None]] = None

    async def start(self, path: str) -> None:
        self._path = path
        self._sock = _bind_unix(path)
        self._accepting = asyncio.create_task(self._accept_loop(), name="unix-accept")

    def count(self) -> int:
        return len(self.sessions)

    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._sock is not None
        while True:
            try:
                conn, _ = await loop.sock_accept(self._sock)
            except OSError as exc:
                log.warning("accept on %s failed: %s", self._path, exc)
                await asyncio.sleep(0.1)
                continue
            self.daemon.spawn(self._welcome(conn), name="client-hello")

    async def _welcome(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        try:
            hello = await asyncio.wait_for(_read_frame(conn), HANDSHAKE_TIMEOUT)
            if not isinstance(hello.msg, ClientHello):
                raise RemoteProtocolError(f"expected ClientHello, got {type(hello.msg).__name__}")
            if not set(hello.msg.versions) & set(SUPPORTED_VERSIONS):
                raise RemoteProtocolError(f"client speaks versions {hello.msg.versions}")
            welcome = encode_header(ClientWelcome(version=max(SUPPORTED_VERSIONS),
                                                  node_id=self.daemon.node_id,
                                                  arena_size=self.daemon.arena.capacity))
            fds = array.array("i", [self.daemon.arena.fd])
            conn.sendmsg([welcome], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
        except (HopliteError, OSError, asyncio.TimeoutError) as exc:
            log.warning("client handshake failed: %s", exc or type(exc).__name__)
            conn.close()
            return
        protocol: FrameProtocol
        _, protocol = await loop.connect_accepted_socket(
            lambda: FrameProtocol(name=f"client-{hello.msg.pid}"), conn)
        session = ClientSession(self.daemon, protocol)
        self.sessions.add(session)
        protocol.on_lost.append(lambda _: self._ended(session))

    def _ended(self, session: "ClientSession") -> None:
        self.sessions.discard(session)
        session.cleanup()

    async def stop(self) -> None:
        if self._accepting is not None:
            self._accepting.cancel()
        if self._sock is not None:
            self._sock.close()
            try:
                os.unlink(self._path)
            except FileNotFoundError:
                pass
        for session in list(self.sessions):
            session.protocol.abort()


def _bind_unix(path: str) -> socket.socket:
    """Bind the socket readable by its owner only; refuse if a live daemon already owns it."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, mode=0o700, exist_ok=True)
    if os.path.exists(path):
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
        except OSError as exc:
            if exc.errno not in (errno.ECONNREFUSED, errno.ENOENT):
                raise
            os.unlink(path)  # left behind by a daemon that died
        else:
            raise InvalidArgumentError(f"a daemon is already serving {path}")
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(path)
    finally:
        os.umask(old)
    sock.listen(128)
    sock.setblocking(False)
    return sock


async def _read_frame(conn: socket.socket) -> Frame:
    """Read exactly one frame from a raw non-blocking socket (nothing past it)."""
    loop = asyncio.get_running_loop()
    reader = FrameReader()
    while True:
        buf = reader.get_buffer()
        n = await loop.sock_recv_into(conn, buf)
        if n == 0:
            raise RemoteProtocolError("client closed during the handshake")
        for event in reader.buffer_updated(n):
            if isinstance(event, Frame):
                return event
            raise event.error


class ClientSession:
    """One connected client: its requests, the views it holds and the objects it is writing."""

    def __init__(self, daemon: "Daemon", protocol: FrameProtocol) -> None:
        self.daemon = daemon
        self.protocol = protocol
        self.pins: dict[ObjectID, list[StoredObject]] = {}
        self.creating: set[ObjectID] = set()
        self.channel = Channel(protocol, REPLY_KINDS, on_request=self._on_request)

    def _on_request(self, frame: Frame) -> None:
        if isinstance(frame.msg, Release):
            self._release(frame.msg.oids)
            return
        self.daemon.spawn(self._answer(frame), name=f"client-{type(frame.msg).__name__}")

    async def _answer(self, frame: Frame) -> None:
        msg = frame.msg
        rid = getattr(msg, "rid", 0)
        try:
            reply, payload = await self._handle(msg, frame.payload)
        except HopliteError as exc:
            log.info("client request %s failed: %s", type(msg).__name__, exc)
            reply, payload = remote_error(rid, exc), None
        except Exception as exc:
            log.exception("client request %s crashed", type(msg).__name__)
            reply, payload = remote_error(rid, exc), None
        if not self.protocol.closed.done():
            self.protocol.send(reply, payload)

    async def _handle(self, msg: Any, payload: Optional[memoryview]) -> tuple[Any, Any]:
        d = self.daemon
        if isinstance(msg, Get):
            obj = await d.transfers.fetch(msg.oid, msg.timeout)
            if obj.size <= INLINE_MAX:
                return Found(rid=msg.rid, size=obj.size, dtype=obj.dtype, shape=obj.shape,
                             offset=None), bytes(obj.buffer)
            d.store.pin(obj)
            self.pins.setdefault(obj.oid, []).append(obj)
            return Found(rid=msg.rid, size=obj.size, dtype=obj.dtype, shape=obj.shape,
                         offset=obj.offset), None
        if isinstance(msg, Put):
            data = payload if payload is not None else memoryview(b"")
            if len(data) > INLINE_MAX:
                raise InvalidArgumentError("objects over 64 KiB are written with Create/Seal")
            obj = d.store.create(msg.oid, len(data), msg.dtype, msg.shape)
            obj.buffer[:] = data
            obj.advance(obj.size)
            await self._publish(msg.oid)
            return Ok(rid=msg.rid), None
        if isinstance(msg, Create):
            obj = d.store.create(msg.oid, msg.size, msg.dtype, msg.shape)
            self.creating.add(msg.oid)
            try:
                await d.arena.populate(obj.offset, obj.size)
            except HopliteError:
                self.creating.discard(msg.oid)
                d.store.remove(msg.oid)
                raise
            return Created(rid=msg.rid, offset=obj.offset), None
        if isinstance(msg, Seal):
            obj = d.store.get(msg.oid)
            if obj is None or msg.oid not in self.creating:
                raise ObjectNotFoundError(f"no object {msg.oid.hex()} being created by this client")
            self.creating.discard(msg.oid)
            obj.advance(obj.size)
            await self._publish(msg.oid)
            return Ok(rid=msg.rid), None
        if isinstance(msg, Abort):
            if msg.oid in self.creating:
                self.creating.discard(msg.oid)
                d.store.remove(msg.oid)
            return Ok(rid=msg.rid), None
        if isinstance(msg, Delete):
            await d.delete(msg.oid)
            return Ok(rid=msg.rid), None
        if isinstance(msg, Reduce):
            if not msg.inputs or not 1 <= msg.num_objects <= len(msg.inputs):
                raise InvalidArgumentError(f"num_objects must be between 1 and the "
                                           f"{len(msg.inputs)} inputs")
            if msg.op not in OPS:
                raise InvalidArgumentError(f"unknown reduce op {msg.op!r}; ops: {', '.join(OPS)}")
            if msg.result in d.reduces or d.store.get(msg.result) is not None:
                raise ObjectExistsError(f"object {msg.result.hex()} already exists")
            coordinator = ReduceCoordinator(d, msg.result, msg.inputs, msg.op, msg.num_objects,
                                            msg.timeout)
            d.reduces[msg.result] = coordinator
            coordinator.start()
            return Ok(rid=msg.rid), None
        if isinstance(msg, ReducedInputs):
            coordinator = d.reduces.get(msg.result)
            if coordinator is None:
                raise ObjectNotFoundError(f"no reduce into {msg.result.hex()} was issued on "
                                          f"this node")
            used = await coordinator.reduced_inputs(msg.timeout)
            return InputList(rid=msg.rid, inputs=used), None
        if isinstance(msg, Status):
            return StatusReply(rid=msg.rid, info=await self._cluster_status()), None
        raise RemoteProtocolError(f"{type(msg).__name__} is not a client request")

    async def _publish(self, oid: ObjectID) -> None:
        try:
            await self.daemon.publish(oid)
        except BaseException:
            self.daemon.store.remove(oid)
            raise

    async def _cluster_status(self) -> dict[str, Any]:
        d = self.daemon
        local = d.local_stats()
        others = [n for n in d.membership.alive_ids() if n != d.node_id]

        async def ask(node: str) -> dict[str, Any]:
            try:
                frame = await d.links[node].request(lambda rid: Stats(rid=rid),
                                                    timeout=STATUS_TIMEOUT)
                return frame.msg.info
            except (HopliteError, KeyError) as exc:
                return {"node_id": node, "error": str(exc)}

        infos = await asyncio.gather(*(ask(n) for n in others))
        return {"local": local, "nodes": [local, *infos]}

    def _release(self, oids: list[ObjectID]) -> None:
        for oid in oids:
            held = self.pins.get(oid)
            if not held:
                log.warning("client released %s it did not hold", oid.short())
                continue
            self.daemon.store.unpin(held.pop(0))
            if not held:
                del self.pins[oid]

    def cleanup(self) -> None:
        """The client is gone: release its views, discard what it never sealed."""
        for held in self.pins.values():
            for obj in held:
                self.daemon.store.unpin(obj)
        self.pins.clear()
        for oid in self.creating:
            self.daemon.store.remove(oid)
        self.creating.clear()
