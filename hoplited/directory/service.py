"""The directory shard's side of the protocol: answers to what members ask or tell it.

Each handler turns one message into a call on :class:`~hoplited.directory.shard.DirectoryShard`
and, for requests, builds the reply. The shard owns the decisions; this module only translates.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from hoplite_client.wire.errors import (
    InvalidArgumentError,
    NotOwnerError,
    ObjectDeletedError,
    error_from_wire,
)
from hoplite_client.wire.frames import INLINE_MAX
from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.locate_hints import Among, LocateHint, Plain, check_hint
from hoplite_client.wire.messages import (
    Announce,
    Deleted,
    DeleteEntry,
    Drop,
    EvictAnswer,
    EvictCopy,
    FailEntry,
    Locate,
    Located,
    ObjectInfo,
    Ok,
    Progress,
    Publish,
    TransferDone,
    WaitObject,
    WireMessage,
)
from hoplite_client.wire.receivers import check_receivers
from hoplited.directory.shard import DirectoryShard, Split
from hoplited.directory.state import Source
from hoplited.dispatch import Handler
from hoplited.rpc import Rpc
from hoplited.tasks import Tasks

log = logging.getLogger("hoplited.directory")

# How long a delete waits for a holder to confirm its Drop: a live member answers in
# milliseconds; a dead or silent one must not hold the delete up (its copy dies with it).
DROP_TIMEOUT = 5.0


def check_half(value: int) -> int:
    """``value`` as a half of an object taken as two halves: 0 or 1, or -1 for the whole."""
    if value not in (-1, 0, 1):
        raise InvalidArgumentError(f"half must be 0, 1 or -1 (the whole object), not {value}")
    return value


# A locate's answer: where to pull from, or the split or the inline bytes themselves.
LocateAnswer = tuple[Located, bytes | None]


def _located(src: Source | Split) -> LocateAnswer:
    """The ``Located`` reply for a source the shard picked (or a split, or inline bytes)."""
    e = src.entry
    if isinstance(src, Split):
        return Located(source=None, size=e.size, dtype=e.dtype, shape=e.shape,
                       version=e.version, index=src.index, receivers=src.receivers,
                       halves=[b for bounds in src.bounds for b in bounds]), None
    return Located(source=src.node, size=e.size, dtype=e.dtype, shape=e.shape,
                   version=e.version), e.inline


class DirectoryService:
    """Serves this node's shard: Locate, WaitObject, Publish, Announce, progress, deletes,
    evictions."""

    def __init__(self, shard: DirectoryShard, me: str, owner_of: Callable[[ObjectID], str],
                 is_alive: Callable[[str], bool], rpc: Rpc, tasks: Tasks) -> None:
        self.shard = shard
        self._me = me
        self._owner_of = owner_of
        self._is_alive = is_alive
        self._rpc = rpc
        self._tasks = tasks

    def handlers(self) -> dict[type[WireMessage], Handler]:
        return {Locate: self.on_locate, Publish: self.on_publish, Progress: self.on_progress,
                TransferDone: self.on_transfer_done, DeleteEntry: self.on_delete_entry,
                Announce: self.on_announce, WaitObject: self.on_wait_object,
                FailEntry: self.on_fail_entry, EvictCopy: self.on_evict_copy}

    def on_locate(self, peer: str, msg: Locate, payload: memoryview | None
                  ) -> LocateAnswer | Awaitable[LocateAnswer]:
        """A source for ``peer``: answered at once when one is ready for a plain get, else
        waited for (the dispatcher runs the wait as a task)."""
        hint = check_hint(msg.hint)
        if isinstance(hint, Plain | Among):
            ready = self.shard.locate_now(msg.oid, peer, msg.exclude, msg.offset, hint)
            if ready is not None:
                return _located(ready)
        return self._locate(peer, msg, hint)

    async def _locate(self, peer: str, msg: Locate, hint: LocateHint) -> LocateAnswer:
        return _located(await self.shard.locate(msg.oid, peer, msg.timeout, msg.exclude,
                                                msg.offset, hint))

    def on_publish(self, peer: str, msg: Publish, payload: memoryview | None) -> Ok:
        inline = bytes(payload) if payload is not None else b"" if msg.size == 0 else None
        if inline is not None and len(inline) != msg.size:
            raise InvalidArgumentError("inline payload does not match the object's size")
        if inline is None and msg.size <= INLINE_MAX:
            raise InvalidArgumentError("small objects are published with their bytes")
        drops = self.shard.publish(msg.oid, peer, msg.size, msg.dtype, msg.shape, msg.version,
                                   inline, moved=msg.moved)
        self._drop_later([(node, msg.oid) for node in drops if node != peer])
        if peer in drops:
            raise ObjectDeletedError(f"object {msg.oid.hex()} was deleted, or is another "
                                     f"version now", oid=msg.oid.hex())
        return Ok()

    def on_progress(self, peer: str, msg: Progress, payload: memoryview | None) -> None:
        self.shard.progress(msg.oid, peer, msg.received, check_half(msg.half))

    def on_transfer_done(self, peer: str, msg: TransferDone,
                         payload: memoryview | None) -> None:
        self.shard.transfer_done(msg.oid, msg.source, peer, msg.complete, check_half(msg.half))

    async def on_delete_entry(self, peer: str, msg: DeleteEntry,
                              payload: memoryview | None) -> Deleted:
        """Remove the entry and have every live holder drop its copy before answering with
        the version removed (the deleter sends it again if the owner moves soon after)."""
        version, holders = self.shard.delete(msg.oid, msg.version, msg.again, msg.retire)
        await self._drop([(n, msg.oid) for n in holders if self._is_alive(n)],
                         withdrawn=msg.retire)
        return Deleted(version=version)

    def on_announce(self, peer: str, msg: Announce, payload: memoryview | None) -> Ok:
        """Record the holdings we own; if some are not ours (the sender heard of a death that
        makes us their owner before we did), say so after recording the rest: the sender
        announces again once ownership has settled (publishing twice changes nothing). A
        copy of a version deleted since, or one announced again after a move of an id
        deleted where no entry was, is not recorded: the sender is told to drop it
        (docs/design.md §5, "Deletes and moving owners"). Handled at once, in the order
        messages arrive: a producer's announcement and then its failure record must not
        swap (the record would be erased)."""
        for h in msg.holdings:
            check_receivers(h.receivers)
        refused = 0
        drops = []
        for h in msg.holdings:
            if self._owner_of(h.oid) != self._me:
                refused += 1
                continue
            drops += [(node, h.oid) for node in self.shard.publish(
                h.oid, peer, h.size, h.dtype, h.shape, h.version, None, received=h.received,
                producing=h.producing, source=h.source, serving=h.serving,
                receivers=h.receivers, moved=msg.moved)]
        self._drop_later(drops)
        if refused:
            raise NotOwnerError(f"not the owner of {refused} of the {len(msg.holdings)} "
                                f"announced objects")
        return Ok()

    def _drop_later(self, copies: list[tuple[str, ObjectID]]) -> None:
        """Have each (node, id) holder drop a copy refused or replaced here, from a task of
        its own: the handler answers at once, in the order messages arrive. A holder that
        is only silent (a re-put replaced its version while it was suspected) answers once
        it runs again, or is declared dead, within the retry window."""
        if copies:
            self._tasks.spawn(self._drop(copies, self._rpc.retry_window), name="drop-copies")

    async def _drop(self, copies: list[tuple[str, ObjectID]],
                    timeout: float = DROP_TIMEOUT, withdrawn: bool = False) -> None:
        """Have each (node, id) holder drop its copy, and wait for it (``timeout`` each);
        ``withdrawn``: a version retired, not the object deleted."""
        results = await asyncio.gather(*(self._rpc.call_node(node, Drop(oid=oid,
                                                                        withdrawn=withdrawn),
                                                             timeout=timeout)
                                         for node, oid in copies), return_exceptions=True)
        for (node, oid), result in zip(copies, results):
            if isinstance(result, BaseException):
                log.info("%s did not confirm dropping %s: %s", node, oid.short(), result)

    async def on_wait_object(self, peer: str, msg: WaitObject,
                             payload: memoryview | None) -> tuple[ObjectInfo, Any]:
        entry = await self.shard.wait_object(msg.oid, msg.timeout)
        holders = [n for n in entry.complete_holders() if self._is_alive(n)]
        return ObjectInfo(holders=holders, size=entry.size, dtype=entry.dtype,
                          shape=entry.shape, version=entry.version), entry.inline

    def on_evict_copy(self, peer: str, msg: EvictCopy, payload: memoryview | None) -> EvictAnswer:
        """Decide, in one step, whether ``peer`` may drop its copy (docs/protocol.md §6)."""
        verdict = self.shard.may_drop(msg.oid, peer, msg.version)
        return EvictAnswer(allowed=verdict.allowed, reason=verdict.reason)

    def on_fail_entry(self, peer: str, msg: FailEntry, payload: memoryview | None) -> Ok:
        self.shard.fail(msg.oid, error_from_wire(msg.code, msg.message, {}))
        return Ok()
