"""Answers to control requests from peers (and from this node itself, for its own shard).

Every handler takes the requester's node id, the message and its payload, and returns the
reply and its payload; typed errors become ``Error`` replies. The daemon calls the same
handlers directly when the owner shard of an object is itself, so local and remote requests
follow one code path.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Optional

from hoplite_client.wire.errors import InvalidArgumentError, RemoteProtocolError, error_from_wire
from hoplite_client.wire.frames import INLINE_MAX
from hoplite_client.wire.messages import (
    Announce,
    DeleteEntry,
    Drop,
    FailEntry,
    Join,
    Locate,
    Located,
    Members,
    MemberUp,
    ObjectInfo,
    Ok,
    Ping,
    Progress,
    Publish,
    ReduceChild,
    ReduceDone,
    ReduceFailed,
    ReduceTask,
    Stats,
    StatusReply,
    TaskStarted,
    TransferDone,
    WaitObject,
)

if TYPE_CHECKING:
    from hoplited.node import Daemon

log = logging.getLogger("hoplited.control")

Reply = tuple[Optional[Any], Optional[Any]]
TOOL_REQUESTS = (Stats, Ping)


class ControlService:
    """Dispatches one control message to the directory shard, the store or the membership."""

    def __init__(self, daemon: "Daemon") -> None:
        self.daemon = daemon

    async def handle(self, peer: str, msg: Any, payload: Optional[memoryview]) -> Reply:
        """Run the handler for ``msg``; returns (reply or None for one-way, reply payload)."""
        d = self.daemon
        shard = d.shard
        if isinstance(msg, Locate):
            src = await shard.locate(msg.oid, peer, msg.timeout, msg.exclude, msg.offset)
            e = src.entry
            return Located(rid=msg.rid, source=src.node, size=e.size, dtype=e.dtype,
                           shape=e.shape, version=e.version), e.inline
        if isinstance(msg, Publish):
            inline = bytes(payload) if payload is not None else b"" if msg.size == 0 else None
            if inline is not None and len(inline) != msg.size:
                raise InvalidArgumentError("inline payload does not match the object's size")
            if inline is None and msg.size <= INLINE_MAX:
                raise InvalidArgumentError("small objects are published with their bytes")
            shard.publish(msg.oid, peer, msg.size, msg.dtype, msg.shape, msg.version, inline)
            return Ok(rid=msg.rid), None
        if isinstance(msg, Progress):
            shard.progress(msg.oid, peer, msg.received)
            return None, None
        if isinstance(msg, TransferDone):
            shard.transfer_done(msg.oid, msg.source, peer, msg.complete)
            return None, None
        if isinstance(msg, DeleteEntry):
            for holder in shard.delete(msg.oid):
                d.tell(holder, Drop(oid=msg.oid))
            return Ok(rid=msg.rid), None
        if isinstance(msg, Drop):
            d.drop_local(msg.oid)
            return None, None
        if isinstance(msg, Announce):
            for h in msg.holdings:
                if d.membership.owner(h.oid) == d.node_id:
                    shard.publish(h.oid, peer, h.size, h.dtype, h.shape, h.version, None,
                                  received=h.received)
            return Ok(rid=msg.rid), None
        if isinstance(msg, WaitObject):
            entry = await shard.wait_object(msg.oid, msg.timeout)
            holders = [n for n in entry.complete_holders() if d.membership.is_alive(n)]
            return ObjectInfo(rid=msg.rid, holders=holders, size=entry.size, dtype=entry.dtype,
                              shape=entry.shape, version=entry.version), entry.inline
        if isinstance(msg, FailEntry):
            shard.fail(msg.oid, error_from_wire(msg.code, msg.message, {}))
            return Ok(rid=msg.rid), None
        if isinstance(msg, ReduceTask):
            version = await d.reducer.start(peer, msg)
            return TaskStarted(rid=msg.rid, version=version), None
        if isinstance(msg, ReduceChild):
            d.reducer.add_child(msg)
            return Ok(rid=msg.rid), None
        if isinstance(msg, ReduceFailed):
            coordinator = d.reduces.get(msg.reduce_id)
            if coordinator is not None:
                coordinator.slot_failed(msg)
            return None, None
        if isinstance(msg, ReduceDone):
            d.reducer.done(msg.reduce_id)
            return None, None
        if isinstance(msg, Ping):
            return Ok(rid=msg.rid), None
        if isinstance(msg, Stats):
            return StatusReply(rid=msg.rid, info=d.local_stats()), None
        if isinstance(msg, Join):
            d.add_member(msg.member, announce=True)
            members = [d.membership.members[n] for n in d.membership.alive_ids()]
            return Members(rid=msg.rid, members=members), None
        if isinstance(msg, MemberUp):
            d.add_member(msg.member, announce=False)
            return Ok(rid=msg.rid), None
        raise RemoteProtocolError(f"{type(msg).__name__} is not a control request")
