"""One connected local client: its requests, the views it holds, the objects it is writing.

After the handshake (:mod:`.listener`) the Unix socket carries control frames and the bytes
of puts: a small put's ride in its frame, a large put's stream with its ``Seal`` straight into
the extent its ``Create`` reserved (the client maps nothing writable: docs/security.md). A get
reports a large object as an arena offset, pinned until the client releases its view; a small
one rides as the reply's payload. When the client disconnects its pins are released and the
objects it created but never sealed are discarded. A put or create into a full store evicts
copies held elsewhere or waits for room (:mod:`hoplited.memory.space`) up to the put's own
timeout.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from hoplite_client.net.channel import Channel
from hoplite_client.net.log_limit import limited
from hoplite_client.net.protocol import FrameProtocol
from hoplite_client.wire.errors import (
    HopliteError,
    InvalidArgumentError,
    ObjectDeletedError,
    ObjectNotFoundError,
    RemoteProtocolError,
)
from hoplite_client.wire.frames import INLINE_MAX, MAX_IDS_PER_FRAME
from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.locate_hints import among
from hoplite_client.wire.messages import (
    CLIENT,
    Abort,
    Allreduce,
    Create,
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
    Status,
    StatusReply,
    Stored,
    WireMessage,
)
from hoplite_client.wire.receivers import check_receivers
from hoplited.collectives.allreduce import Allreduces
from hoplited.collectives.reductions import Reductions
from hoplited.directory.client import DirectoryClient
from hoplited.dispatch import Dispatcher
from hoplited.memory.arena import Arena
from hoplited.memory.space import Space
from hoplited.memory.store import ObjectStore, StoredObject
from hoplited.tasks import Tasks
from hoplited.transfer.fetcher import Fetcher

log = logging.getLogger("hoplited.clients")


@dataclass(frozen=True, kw_only=True)
class SessionDeps:
    """What serving a client takes: the store, transfers, the directory, reduces, status, and
    allocation that evicts or waits for room."""

    store: ObjectStore
    arena: Arena
    fetcher: Fetcher
    directory: DirectoryClient
    reductions: Reductions
    allreduces: Allreduces
    cluster_status: Callable[[], Awaitable[dict[str, Any]]]
    tasks: Tasks
    errors: Counter[str]  # error replies by type (the metrics)
    space: Space
    put_id: Callable[[], ObjectID]  # a fresh id for a put that names none (§2.4)


class ClientSession:
    """Serves one client connection; ``cleanup`` runs when it closes."""

    def __init__(self, protocol: FrameProtocol, deps: SessionDeps) -> None:
        self.protocol = protocol
        self.d = deps
        self.pins: dict[ObjectID, list[StoredObject]] = {}
        # created and not sealed, each pinned: a delete meanwhile must not free the extent a
        # Seal may be streaming into
        self.creating: dict[ObjectID, StoredObject] = {}
        self._streaming: StoredObject | None = None  # the one whose Seal's bytes arrive now
        self._dispatcher = dispatcher = Dispatcher(CLIENT, {cls: getattr(self, name)
                                         for cls, name in HANDLERS.items()}, deps.tasks,
                                deps.errors, lasting=(Put, Seal), capped=(Get, ReducedInputs))
        self.channel = Channel(protocol, on_request=lambda frame: dispatcher.deliver(
            protocol.name, frame, self._respond), sink=self._seal_sink)
        protocol.read_in_bulk()  # a large put's bytes land in a worker thread

    def _respond(self, reply: Any, payload: Any, rid: int) -> None:
        if not self.protocol.closed.done():
            self.protocol.send(reply, payload, rid)

    async def on_get(self, me: str, msg: Get, payload: memoryview | None
                     ) -> tuple[Found, bytes | None]:
        """A complete copy here is answered at once (so timeout 0 polls it); else fetch. A
        copy whose eviction is being asked about is waited for: if it goes, it is fetched."""
        receivers = check_receivers(msg.receivers)
        obj = self.d.store.get(msg.oid)
        if obj is not None:
            obj = await self.d.space.settled(obj)
        if obj is None or not obj.complete:
            obj = await self.d.fetcher.fetch(msg.oid, msg.timeout, hint=among(receivers))
        if obj.size <= INLINE_MAX:
            self.d.store.touch(obj)
            return Found(size=obj.size, dtype=obj.dtype, shape=obj.shape, offset=None), \
                bytes(obj.buffer)
        self.d.store.pin(obj)
        self.pins.setdefault(obj.oid, []).append(obj)
        return Found(size=obj.size, dtype=obj.dtype, shape=obj.shape, offset=obj.offset), None

    async def on_put(self, me: str, msg: Put, payload: memoryview | None) -> Stored:
        """Store and publish a small object, under an id of the daemon's choosing if the
        client named none: one this node's shard owns, so that publishing it asks no other
        node (docs/design.md §2.4)."""
        data = payload if payload is not None else memoryview(b"")
        if len(data) > INLINE_MAX:
            raise InvalidArgumentError("objects over 64 KiB are written with Create/Seal")
        oid = msg.oid if msg.oid is not None else self.d.put_id()
        obj = await self.d.space.create(oid, len(data), msg.dtype, msg.shape, wait=msg.timeout)
        obj.buffer[:] = data
        obj.advance(obj.size)
        await self._publish(obj)
        return Stored(oid=oid)

    async def on_create(self, me: str, msg: Create, payload: memoryview | None) -> Ok:
        """Reserve and back the extent a large put's ``Seal`` streams into."""
        obj = await self.d.space.create(msg.oid, msg.size, msg.dtype, msg.shape,
                                        wait=msg.timeout)
        self.d.store.pin(obj)
        self.creating[msg.oid] = obj
        self.d.arena.fill_begins(obj.offset)
        try:
            await self.d.arena.populate(obj.offset, obj.size)
        except BaseException:
            if self.creating.pop(msg.oid, None) is obj:
                self._discard(obj)
            raise
        return Ok()

    def _seal_sink(self, msg: Seal, size: int) -> memoryview:
        """Where a ``Seal``'s bytes go: the extent of the object this client is creating. Any
        other stream breaks the connection, since its bytes could go nowhere."""
        obj = self.creating.pop(msg.oid, None)
        if obj is None or size != obj.size:
            if obj is not None:
                self._discard(obj)
            raise RemoteProtocolError(f"a Seal of {size} bytes for {msg.oid.hex()}, which this "
                                      f"client is not creating at that size")
        self._streaming = obj
        return obj.buffer

    def on_seal(self, me: str, msg: Seal, payload: memoryview | None) -> Awaitable[Ok]:
        """All the object's bytes have landed: it is complete; publish it. Taken on arrival,
        so a client that leaves now does not discard it (Seal is a lasting kind)."""
        obj, self._streaming = self._streaming, None
        if obj is None or obj.oid != msg.oid:  # its bytes came before this client's Create
            if obj is not None:
                self._discard(obj)
            raise ObjectNotFoundError(f"no object {msg.oid.hex()} being created by this client")
        self.d.store.unpin(obj)
        self.d.arena.fill_ends(obj.offset)
        if obj.deleted:
            raise ObjectDeletedError(f"object {msg.oid.hex()} was deleted while it was put",
                                     oid=msg.oid.hex())
        obj.advance(obj.size)
        return self._sealed(obj)

    async def _sealed(self, obj: StoredObject) -> Ok:
        await self._publish(obj)
        return Ok()

    def on_abort(self, me: str, msg: Abort, payload: memoryview | None) -> Ok:
        obj = self.creating.pop(msg.oid, None)
        if obj is not None:
            self._discard(obj)
        return Ok()

    def _discard(self, obj: StoredObject) -> None:
        """Drop an object this client created and will not seal."""
        self.d.store.unpin(obj)
        self.d.arena.fill_ends(obj.offset)
        if self.d.store.get(obj.oid) is obj:
            self.d.store.remove(obj.oid)

    async def on_delete(self, me: str, msg: Delete, payload: memoryview | None) -> Ok:
        """Remove every copy in the cluster and the directory entry; a reduce into the id
        issued here stops, even before its result exists."""
        local = self.d.store.get(msg.oid) is not None
        reducing = self.d.reductions.forget(msg.oid) | self.d.allreduces.forget(msg.oid)
        try:
            await self.d.directory.delete(msg.oid)
        except HopliteError:
            if not (local or reducing):
                raise
        self.d.store.remove(msg.oid)
        return Ok()

    def on_reduce(self, me: str, msg: Reduce, payload: memoryview | None) -> Ok:
        """Start the reduce; more inputs than one frame lists are refused, because its
        InputList reply could not be sent."""
        if len(msg.inputs) > MAX_IDS_PER_FRAME:
            raise InvalidArgumentError(f"a reduce takes at most {MAX_IDS_PER_FRAME} inputs, "
                                       f"not {len(msg.inputs)}", limit=MAX_IDS_PER_FRAME)
        self.d.reductions.start(msg.result, msg.inputs, msg.op, msg.num_objects, msg.timeout)
        return Ok()

    def on_allreduce(self, me: str, msg: Allreduce, payload: memoryview | None) -> Ok:
        """Start the allreduce: a ring, stripes or a reduce whose result every input's node
        gets (docs/design.md §4, "Ring allreduce"); as for a reduce, more inputs than one
        frame lists are refused."""
        if len(msg.inputs) > MAX_IDS_PER_FRAME:
            raise InvalidArgumentError(f"an allreduce takes at most {MAX_IDS_PER_FRAME} "
                                       f"inputs, not {len(msg.inputs)}",
                                       limit=MAX_IDS_PER_FRAME)
        self.d.allreduces.start(msg.result, msg.inputs, msg.op, msg.timeout, msg.striped)
        return Ok()

    async def on_reduced_inputs(self, me: str, msg: ReducedInputs,
                                payload: memoryview | None) -> InputList:
        return InputList(inputs=await self.d.reductions.reduced_inputs(msg.result, msg.timeout))

    async def on_status(self, me: str, msg: Status, payload: memoryview | None) -> StatusReply:
        return StatusReply(info=await self.d.cluster_status())

    def on_release(self, me: str, msg: Release, payload: memoryview | None) -> None:
        """Unpin one view of each id; ids not held are counted, and logged one line per
        notice at most (and at a bounded rate: a client can send such notices in a loop)."""
        unheld: list[ObjectID] = []
        for oid in msg.oids:
            held = self.pins.get(oid)
            if not held:
                unheld.append(oid)
                continue
            self.d.store.unpin(held.pop(0))
            if not held:
                del self.pins[oid]
        if unheld:
            limited(log, "release of ids not held")(
                "%s released %d id(s) it did not hold, e.g. %s", self.protocol.name,
                len(unheld), unheld[0].short())

    async def _publish(self, obj: StoredObject) -> None:
        """Register a put's object with its owner shard; one that is refused, or whose owner
        cannot be reached, goes. All its bytes are here, so the put completes even if the
        client leaves meanwhile: Put and Seal are lasting kinds, whose handling the client's
        leaving does not cancel. Cancelled with the request, a publish already sent could
        land after the copy was removed, and the shard would list a copy nobody holds
        (docs/design.md §2.2, "A put outlives its client")."""
        try:
            await self.d.directory.publish(obj)
        except BaseException:
            if self.d.store.get(obj.oid) is obj:
                self.d.store.remove(obj.oid)
            raise

    def cleanup(self) -> None:
        """The client is gone: stop its requests, release its views, discard what it never
        sealed."""
        self._dispatcher.close()
        for held in self.pins.values():
            for obj in held:
                self.d.store.unpin(obj)
        self.pins.clear()
        unsealed = [*self.creating.values(), *filter(None, [self._streaming])]
        self.creating.clear()
        self._streaming = None
        for obj in unsealed:
            self._discard(obj)


# The client role's handler table (method names, bound per session); the listener checks it
# is complete when it starts, before any client connects.
HANDLERS: dict[type[WireMessage], str] = {
    Get: "on_get", Put: "on_put", Create: "on_create", Seal: "on_seal", Abort: "on_abort",
    Delete: "on_delete", Reduce: "on_reduce", Allreduce: "on_allreduce",
    ReducedInputs: "on_reduced_inputs", Status: "on_status", Release: "on_release"}
