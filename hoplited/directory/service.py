"""The directory shard's side of the protocol: answers to what members ask or tell it.

Each handler turns one message into a call on :class:`~hoplited.directory.shard.DirectoryShard`
and, for requests, builds the reply. The shard owns the decisions; this module only translates.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from hoplite_client.wire.errors import InvalidArgumentError, error_from_wire
from hoplite_client.wire.frames import INLINE_MAX
from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.messages import (Announce, DeleteEntry, Drop, FailEntry, Located, Locate,
                                          ObjectInfo, Ok, Progress, Publish, TransferDone,
                                          WaitObject, WireMessage)

from hoplited.directory.shard import DirectoryShard
from hoplited.dispatch import Handler

Tell = Callable[[str, WireMessage], None]


class DirectoryService:
    """Serves this node's shard: Locate, WaitObject, Publish, Announce, progress, deletes."""

    def __init__(self, shard: DirectoryShard, me: str, owner_of: Callable[[ObjectID], str],
                 is_alive: Callable[[str], bool], tell: Tell) -> None:
        self.shard = shard
        self._me = me
        self._owner_of = owner_of
        self._is_alive = is_alive
        self._tell = tell

    def handlers(self) -> dict[type[WireMessage], Handler]:
        return {Locate: self.on_locate, Publish: self.on_publish, Progress: self.on_progress,
                TransferDone: self.on_transfer_done, DeleteEntry: self.on_delete_entry,
                Announce: self.on_announce, WaitObject: self.on_wait_object,
                FailEntry: self.on_fail_entry}

    async def on_locate(self, peer: str, msg: Locate,
                        payload: Optional[memoryview]) -> tuple[Located, Optional[bytes]]:
        src = await self.shard.locate(msg.oid, peer, msg.timeout, msg.exclude, msg.offset)
        e = src.entry
        return Located(source=src.node, size=e.size, dtype=e.dtype, shape=e.shape,
                       version=e.version), e.inline

    def on_publish(self, peer: str, msg: Publish, payload: Optional[memoryview]) -> Ok:
        inline = bytes(payload) if payload is not None else b"" if msg.size == 0 else None
        if inline is not None and len(inline) != msg.size:
            raise InvalidArgumentError("inline payload does not match the object's size")
        if inline is None and msg.size <= INLINE_MAX:
            raise InvalidArgumentError("small objects are published with their bytes")
        self.shard.publish(msg.oid, peer, msg.size, msg.dtype, msg.shape, msg.version, inline)
        return Ok()

    def on_progress(self, peer: str, msg: Progress, payload: Optional[memoryview]) -> None:
        self.shard.progress(msg.oid, peer, msg.received)

    def on_transfer_done(self, peer: str, msg: TransferDone,
                         payload: Optional[memoryview]) -> None:
        self.shard.transfer_done(msg.oid, msg.source, peer, msg.complete)

    def on_delete_entry(self, peer: str, msg: DeleteEntry, payload: Optional[memoryview]) -> Ok:
        for holder in self.shard.delete(msg.oid):
            self._tell(holder, Drop(oid=msg.oid))
        return Ok()

    def on_announce(self, peer: str, msg: Announce, payload: Optional[memoryview]) -> Ok:
        for h in msg.holdings:
            if self._owner_of(h.oid) == self._me:
                self.shard.publish(h.oid, peer, h.size, h.dtype, h.shape, h.version, None,
                                   received=h.received)
        return Ok()

    async def on_wait_object(self, peer: str, msg: WaitObject,
                             payload: Optional[memoryview]) -> tuple[ObjectInfo, Any]:
        entry = await self.shard.wait_object(msg.oid, msg.timeout)
        holders = [n for n in entry.complete_holders() if self._is_alive(n)]
        return ObjectInfo(holders=holders, size=entry.size, dtype=entry.dtype,
                          shape=entry.shape, version=entry.version), entry.inline

    def on_fail_entry(self, peer: str, msg: FailEntry, payload: Optional[memoryview]) -> Ok:
        self.shard.fail(msg.oid, error_from_wire(msg.code, msg.message, {}))
        return Ok()
