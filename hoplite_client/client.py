"""The async client: put, get, delete and status through the local daemon's Unix socket."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import struct
import threading
from collections.abc import Sequence
from typing import Any, TypeAlias

import numpy as np
from numpy.typing import NDArray

from hoplite_client.arena_map import ArenaMap
from hoplite_client.net.channel import Channel
from hoplite_client.net.endpoints import default_socket, trusted_owner
from hoplite_client.net.protocol import FrameProtocol
from hoplite_client.wire.errors import (
    CapacityError,
    ConnectionLostError,
    ForeignDaemonError,
    HopliteError,
    HopliteTimeoutError,
    InvalidArgumentError,
    RemoteProtocolError,
    error_from_wire,
)
from hoplite_client.wire.frames import (
    INLINE_MAX,
    MAX_IDS_PER_FRAME,
    PRELUDE_SIZE,
    SUPPORTED_VERSIONS,
    Frame,
    FrameReader,
    encode_header,
)
from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.messages import (
    Abort,
    Allreduce,
    ClientHello,
    ClientWelcome,
    Create,
    Delete,
    Error,
    Get,
    Put,
    Reduce,
    ReducedInputs,
    Release,
    Seal,
    Status,
)
from hoplite_client.wire.receivers import check_receivers
from hoplite_client.wire.timeouts import check_timeout

log = logging.getLogger("hoplite.client")

CONNECT_TIMEOUT = 10.0
# After a get's own timeout, how long we still wait for the daemon's verdict on it.
REPLY_GRACE = 30.0
# Transfers a gather keeps in flight: enough to fill the local link from many senders.
GATHER_CONCURRENCY = 8
# How long a put waits for room in a full store by default: long enough for another client to
# delete or release something, short enough that a store full of sole copies answers with a
# CapacityError instead of hanging the caller (docs/architecture.md §6).
PUT_TIMEOUT = 10.0
# A request the daemon answers without waiting for any object (reduce, allreduce, delete,
# status): a daemon that has not answered after this long is stuck or gone, and the caller
# gets a HopliteTimeoutError instead of waiting forever.
CONTROL_TIMEOUT = 60.0

# What put stores: an array of a plain dtype, or bytes-like data (stored as uint8).
ArrayLike: TypeAlias = NDArray[Any] | bytes | bytearray | memoryview


async def connect(socket_path: str | None = None,
                  timeout: float | None = CONNECT_TIMEOUT) -> Client:
    """Connect to the daemon at ``socket_path`` (default ``$HOPLITE_SOCKET``), waiting up to
    ``timeout`` s for its welcome (None or inf: forever; see :func:`check_timeout`)."""
    timeout = check_timeout(timeout)
    path = socket_path or default_socket()
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        async with asyncio.timeout(timeout):
            await loop.sock_connect(sock, path)
        _check_daemon_user(sock, path)
        await loop.sock_sendall(sock, encode_header(ClientHello(versions=SUPPORTED_VERSIONS,
                                                                pid=os.getpid())))
        async with asyncio.timeout(timeout):
            welcome, fd = await _receive_welcome(sock)
    except TimeoutError:
        sock.close()
        raise HopliteTimeoutError(f"daemon at {path} did not answer within {timeout}s") from None
    except OSError as exc:
        sock.close()
        raise ConnectionLostError(f"cannot reach the daemon at {path}: {exc}") from exc
    except BaseException:
        sock.close()
        raise
    arena = ArenaMap(fd, welcome.arena_size)
    _, protocol = await loop.create_unix_connection(lambda: FrameProtocol(name="daemon"),
                                                    sock=sock)
    return Client(protocol, arena, welcome.node_id)


def _check_daemon_user(sock: socket.socket, path: str) -> None:
    """Refuse a daemon that runs as another user than us or root (SO_PEERCRED): a socket
    another user put where ours should be, which would receive everything we put."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _, uid, _ = struct.unpack("3i", creds)
    if not trusted_owner(uid):
        raise ForeignDaemonError(
            f"the daemon at {path} runs as uid {uid}, neither us (uid {os.getuid()}) nor "
            f"root: another user may have put its socket there; connect to a socket of "
            f"yours (--socket, $HOPLITE_SOCKET), or remove {os.path.dirname(path) or '.'} "
            f"if it is not yours and start your daemon again", path=path, uid=uid)


async def _receive_welcome(sock: socket.socket) -> tuple[ClientWelcome, int]:
    """Read the ClientWelcome frame; the arena fd rides on its first bytes."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(sock.fileno(), wake)
    try:
        await ready
    finally:
        loop.remove_reader(sock.fileno())
    data, fds, _, _ = socket.recv_fds(sock, PRELUDE_SIZE, 1)
    reader = FrameReader()
    events = reader.feed(data)
    while not events:
        if not data:
            raise ConnectionLostError("daemon closed the connection during the handshake")
        data = await loop.sock_recv(sock, len(reader.get_buffer()))
        events = reader.feed(data) if data else []
        if not data:
            raise ConnectionLostError("daemon closed the connection during the handshake")
    frame = events[0]
    msg = frame.msg if isinstance(frame, Frame) else None
    if isinstance(msg, Error):
        raise error_from_wire(msg.code, msg.message, msg.data)
    if not isinstance(msg, ClientWelcome) or len(fds) != 1:
        for fd in fds:
            os.close(fd)
        raise RemoteProtocolError("daemon did not send its arena")
    return msg, fds[0]


def _as_array(value: ArrayLike) -> NDArray[Any]:
    """``value`` as an array of a storable dtype (bytes-like data as uint8)."""
    if isinstance(value, np.ndarray):
        arr = value
    elif isinstance(value, (bytes, bytearray, memoryview)):
        arr = np.frombuffer(memoryview(value).cast("B"), dtype=np.uint8)
    else:
        raise InvalidArgumentError(f"put takes a numpy array or bytes, not {type(value).__name__}")
    if arr.dtype.hasobject or arr.dtype.fields is not None:
        raise InvalidArgumentError(f"dtype {arr.dtype} cannot be stored (plain types only)")
    return arr


class Client:
    """A connection to the local daemon. Use ``async with`` or call :meth:`close`."""

    def __init__(self, protocol: FrameProtocol, arena: ArenaMap, node_id: str) -> None:
        self._protocol = protocol
        self._channel = Channel(protocol)
        self._arena = arena
        self.node_id = node_id
        self._loop = asyncio.get_running_loop()
        self._released: list[ObjectID] = []
        self._release_lock = threading.Lock()
        self._flush_scheduled = False

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def put(self, value: ArrayLike, object_id: ObjectID | None = None,
                  timeout: float | None = PUT_TIMEOUT) -> ObjectID:
        """Store an array (dtype and shape kept) or bytes (as uint8); returns its id.

        A full store first evicts copies held elsewhere; if that is not enough the put waits
        up to ``timeout`` s for room (None or inf: until there is room; 0: not at all), then
        raises CapacityError. Once all its bytes reached the daemon, the put completes there
        even if this call is cancelled or the client closes (docs/design.md §2.2). With no
        ``object_id``, an object of at most 64 KiB is named by the daemon, with an id its own
        directory shard owns if a few draws find one (up to 64 members): registering it then
        asks no other node (§2.4); a larger one gets a random id."""
        timeout = check_timeout(timeout)
        bound = None if timeout is None else timeout + REPLY_GRACE
        arr = _as_array(value)
        dtype, shape, size = arr.dtype.str, list(arr.shape), arr.nbytes
        data = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
        if size <= INLINE_MAX:  # an id left to the daemon is one its own shard owns
            stored = await self._channel.request(Put(oid=object_id, dtype=dtype, shape=shape,
                                                     timeout=timeout), data, timeout=bound)
            return stored.msg.oid
        oid = object_id or ObjectID.random()
        await self._channel.request(Create(oid=oid, size=size, dtype=dtype, shape=shape,
                                           timeout=timeout), timeout=bound)
        try:  # the bytes stream from the array into the extent Create reserved
            await self._channel.request(Seal(oid=oid), data, bulk=True)
        except BaseException:
            # cancelled before its bytes went, the object would wait for them until we close;
            # once they went, the daemon seals it all the same and this finds nothing to drop
            if self._channel.is_open:
                with contextlib.suppress(HopliteError):
                    await self._channel.request(Abort(oid=oid))
            raise
        return oid

    async def get(self, object_id: ObjectID, timeout: float | None = None,
                  receivers: int = 0) -> NDArray[Any]:
        """A read-only array of the object, waiting up to ``timeout`` s for it to exist (None
        or inf: forever; 0: only a complete copy already on this node will do).

        ``receivers``: how many nodes get the object at about the same time (a broadcast), if
        the caller knows; its shard then sends it down a binary tree where that beats a chain
        (many receivers of a small object). 0: unknown, one chain.

        Large objects are zero-copy views of shared memory; the daemon keeps the memory until
        every array derived from the result is gone. Each such view holds a file descriptor
        meanwhile: past the process's limit, get raises CapacityError.

        At most 1,024 gets and reduced_inputs of one client wait at once; one more raises
        CapacityError at once (``data['limit']``): let some finish first (:meth:`gather`
        keeps a few in flight), or use another connection.
        """
        timeout = check_timeout(timeout)
        receivers = check_receivers(receivers)
        bound = None if timeout is None else timeout + REPLY_GRACE
        frame = await self._channel.request(Get(oid=object_id, timeout=timeout,
                                                receivers=receivers), timeout=bound)
        found = frame.msg
        dtype = np.dtype(found.dtype)
        shape = tuple(found.shape)
        if found.offset is None:
            data = bytes(frame.payload) if frame.payload is not None else b""
            return np.frombuffer(data, dtype=dtype).reshape(shape)
        try:
            return self._arena.view(found.offset, found.size, dtype, shape,
                                    lambda: self._release_later(object_id))
        except OSError as exc:  # no descriptor or address space left for one more view
            self._release_later(object_id)  # the daemon pinned it for a view that never was
            raise CapacityError(f"cannot map object {object_id.hex()}: {exc} (each view holds "
                                f"a file descriptor)", oid=object_id.hex()) from exc

    async def reduce(self, object_ids: Sequence[ObjectID], op: str = "sum",
                     num_objects: int | None = None, object_id: ObjectID | None = None,
                     timeout: float | None = None) -> ObjectID:
        """Start reducing the objects with ``op`` (sum, min, max, prod); returns the result's
        id at once. The first ``num_objects`` inputs to become ready are used (default: all);
        ids may name objects not put yet. The result lands on this node; get it like any
        object. ``timeout`` bounds the wait for the inputs. At most ``MAX_IDS_PER_FRAME``
        (10,000) inputs: more would not fit in one frame; reduce groups, then their results."""
        timeout = check_timeout(timeout)
        ids = list(object_ids)
        if len(ids) > MAX_IDS_PER_FRAME:
            raise InvalidArgumentError(
                f"a reduce takes at most {MAX_IDS_PER_FRAME} inputs, not {len(ids)}: reduce "
                f"groups of them, then the groups' results", limit=MAX_IDS_PER_FRAME)
        k = len(ids) if num_objects is None else num_objects
        result = object_id or ObjectID.random()
        await self._channel.request(Reduce(result=result, inputs=ids, op=op, num_objects=k,
                                           timeout=timeout), timeout=CONTROL_TIMEOUT)
        return result

    async def allreduce(self, object_ids: Sequence[ObjectID], op: str = "sum",
                        object_id: ObjectID | None = None, timeout: float | None = None,
                        striped: bool = False) -> ObjectID:
        """Start reducing every object with ``op``; returns the result's id at once; every
        participant then gets it. When every input is ready at once, the nodes holding them
        run a ring (one holding several adds them all) and the result lands on each of them:
        2(N-1)/N copies of the object per link, gloo's bound (docs/design.md §4, "Ring
        allreduce"); a ring hit by a failure runs again over the survivors. Otherwise (inputs
        that come one by one, or all on one node) the reduce computes the result on this node
        and gets chain behind it, or with ``striped`` large objects are cut into one stripe per
        input, each reduced towards another input's node and gathered from there. An input
        listed twice counts twice. ``timeout`` bounds the wait for the inputs; at most
        ``MAX_IDS_PER_FRAME`` inputs."""
        timeout = check_timeout(timeout)
        ids = list(object_ids)
        if len(ids) > MAX_IDS_PER_FRAME:
            raise InvalidArgumentError(
                f"an allreduce takes at most {MAX_IDS_PER_FRAME} inputs, not {len(ids)}",
                limit=MAX_IDS_PER_FRAME)
        result = object_id or ObjectID.random()
        await self._channel.request(Allreduce(result=result, inputs=ids, op=op,
                                              striped=striped, timeout=timeout),
                                    timeout=CONTROL_TIMEOUT)
        return result

    async def reduced_inputs(self, result_id: ObjectID,
                             timeout: float | None = None) -> list[ObjectID]:
        """Which inputs went into a reduce issued on this node, in the order they were ready;
        answered once the result is complete (until then a backup may replace a lost input).
        Counts against the same limit of waits as :meth:`get` (CapacityError past it)."""
        timeout = check_timeout(timeout)
        bound = None if timeout is None else timeout + REPLY_GRACE
        frame = await self._channel.request(ReducedInputs(result=result_id, timeout=timeout),
                                            timeout=bound)
        return list(frame.msg.inputs)

    async def gather(self, object_ids: Sequence[ObjectID], timeout: float | None = None,
                     concurrency: int = GATHER_CONCURRENCY) -> list[NDArray[Any]]:
        """Get many objects at once (at most ``concurrency`` transfers in flight), in order;
        ``timeout`` applies to each get."""
        timeout = check_timeout(timeout)
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise InvalidArgumentError(f"concurrency must be an int >= 1, not {concurrency!r}")
        limit = asyncio.Semaphore(concurrency)

        async def one(oid: ObjectID) -> NDArray[Any]:
            async with limit:
                return await self.get(oid, timeout)

        return list(await asyncio.gather(*(one(oid) for oid in object_ids)))

    async def delete(self, object_id: ObjectID,
                     timeout: float | None = CONTROL_TIMEOUT) -> None:
        """Delete every copy in the cluster (copies in use go when their users are done),
        waiting up to ``timeout`` s for the daemon to confirm (None or inf: forever)."""
        timeout = check_timeout(timeout)
        await self._channel.request(Delete(oid=object_id), timeout=timeout)

    async def status(self, timeout: float | None = CONTROL_TIMEOUT) -> dict[str, Any]:
        """This daemon's view of the cluster: members, objects, bytes in and out per node,
        waiting up to ``timeout`` s for it (None or inf: forever)."""
        timeout = check_timeout(timeout)
        frame = await self._channel.request(Status(), timeout=timeout)
        return frame.msg.info

    def _release_later(self, oid: ObjectID) -> None:
        """Called by the garbage collector (any thread) when a view's mapping dies."""
        with self._release_lock:
            self._released.append(oid)
            if self._flush_scheduled:
                return
            self._flush_scheduled = True
        try:
            self._loop.call_soon_threadsafe(self._flush_releases)
        except RuntimeError:  # the loop is closed, so is our connection: the daemon released
            log.debug("view of %s dropped after the client's loop closed", oid.short())

    def _flush_releases(self) -> None:
        """Tell the daemon which views died, however many: one notice per batch that fits a
        frame. A notice that cannot be sent is logged; on a closed connection that is no
        loss (the daemon released all our views when it closed), anything else is a bug."""
        with self._release_lock:
            oids, self._released = self._released, []
            self._flush_scheduled = False
        if not oids or not self._channel.is_open:
            return
        for sent, notice in enumerate(release_notices(oids)):
            try:
                self._channel.notify(notice)
            except ConnectionLostError as exc:
                log.debug("%d views dropped as the connection closed: %s",
                          len(oids) - sent * MAX_IDS_PER_FRAME, exc)
                return
            except HopliteError as exc:
                log.error("could not release %d views: %s",
                          len(oids) - sent * MAX_IDS_PER_FRAME, exc)
                return

    async def wait_closed(self) -> None:
        """Return once the connection to the daemon is gone: :meth:`close` was called, or
        the daemon stopped or died (how an application learns that its node's daemon is
        gone, and so are the objects only it held)."""
        await asyncio.shield(self._protocol.closed)

    async def close(self) -> None:
        """Close the connection. Arrays returned by :meth:`get` must not be used afterwards:
        the daemon no longer keeps their memory for us."""
        self._channel.close()
        try:
            async with asyncio.timeout(5.0):
                await asyncio.shield(self._protocol.closed)
        except TimeoutError:
            self._protocol.abort()
        self._arena.close()


def release_notices(oids: Sequence[ObjectID]) -> list[Release]:
    """``oids`` as Release notices of at most ``MAX_IDS_PER_FRAME`` ids each, in order: one
    notice for all of them could exceed the frame header limit."""
    return [Release(oids=list(oids[i:i + MAX_IDS_PER_FRAME]))
            for i in range(0, len(oids), MAX_IDS_PER_FRAME)]
