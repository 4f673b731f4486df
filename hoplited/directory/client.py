"""This member's side of the object directory: typed requests to owner shards.

Every message a member sends about an object to the object's owner shard is built here, so
the rest of the daemon calls ``directory.locate(...)`` instead of assembling wire records. It
also keeps the directory's soft state true: when membership changes, the store's holdings are
re-announced to their (new) owners, and a ``Drop`` from a shard removes the local copy.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from hoplite_client.wire.errors import HopliteError, ObjectDeletedError, ObjectNotFoundError
from hoplite_client.wire.frames import INLINE_MAX, Frame
from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.locate_hints import PLAIN, LocateHint
from hoplite_client.wire.messages import (
    Announce,
    DeleteEntry,
    Drop,
    EvictCopy,
    FailEntry,
    Holding,
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
from hoplited.cluster.membership import Membership, OwnerSet
from hoplited.directory.recent_deletes import RecentDeletes, Resend
from hoplited.dispatch import Handler
from hoplited.memory.store import CopyWithdrawn, ObjectStore, StoredObject
from hoplited.rpc import RETRY_PAUSE_MAX, Rpc, owner_moved
from hoplited.tasks import Tasks

log = logging.getLogger("hoplited.directory")


class DirectoryClient:
    """Asks and tells owner shards about objects; re-announces holdings on membership change."""

    def __init__(self, rpc: Rpc, store: ObjectStore, membership: Membership,
                 tasks: Tasks) -> None:
        self._rpc = rpc
        self._store = store
        self._membership = membership
        self._tasks = tasks
        self._deletes = RecentDeletes(rpc.retry_window)

    def handlers(self) -> dict[type[WireMessage], Handler]:
        return {Drop: self.on_drop}

    async def locate(self, oid: ObjectID, timeout: float | None, exclude: list[str],
                     offset: int, hint: LocateHint = PLAIN) -> Frame[Located]:
        """A source for ``oid`` (this node is enrolled as a receiver resuming at ``offset``);
        ``hint``: what this node is, a ring member (docs/design.md §4), a get among known
        receivers or the receiver of one half (§3)."""
        return await self._rpc.call_owner(oid, Locate(
            oid=oid, timeout=timeout, exclude=list(exclude), offset=offset, hint=hint))

    async def wait_object(self, oid: ObjectID, timeout: float | None) -> Frame[ObjectInfo]:
        """Holders and metadata of ``oid`` once it is complete somewhere (small ones inline)."""
        return await self._rpc.call_owner(oid, WaitObject(oid=oid, timeout=timeout))

    async def publish(self, obj: StoredObject, moved: bool = False) -> None:
        """Register a complete local object with its owner shard (small ones with their bytes,
        sent from its memory: pinned until the owner answered, since a delete meanwhile would
        otherwise free that memory under a request still retried towards a new owner);
        ``moved``: published again because its owner moved, not a new put."""
        inline = obj.buffer if obj.size <= INLINE_MAX else None
        self._store.pin(obj)
        try:
            await self._rpc.call_owner(obj.oid, Publish(oid=obj.oid, size=obj.size,
                                                        dtype=obj.dtype, shape=obj.shape,
                                                        version=obj.version, moved=moved),
                                       inline, wanted=lambda: self._store.get(obj.oid) is obj)
        finally:
            self._store.unpin(obj)

    async def _republish(self, obj: StoredObject) -> None:
        """Publish a small copy to its new owner; one deleted meanwhile goes (the owner refused
        it: docs/design.md §5, "Deletes and moving owners"). A copy dropped here before an
        owner took it is not sent (again): its memory may be freed already, and an owner would
        list a copy nobody holds, one no delete removed (the deleter's own copy, say, removed
        as its delete returns: see
        ``test_a_small_copy_that_goes_while_its_republish_is_refused_is_not_sent_again`` in
        tests/unit/test_reannounce.py)."""
        if self._store.get(obj.oid) is not obj:
            return
        try:
            await self.publish(obj, moved=True)
        except ObjectDeletedError as exc:
            if not exc.reported:  # it went from here before an owner had it: nothing to tell
                return
            if self._store.get(obj.oid) is obj:
                self._store.remove(obj.oid)

    async def announce(self, obj: StoredObject) -> None:
        """Register a local object still being written (its holders may chain behind us)."""
        await self._rpc.call_owner(obj.oid, Announce(holdings=[_holding(obj)]))

    async def fail(self, oid: ObjectID, error: HopliteError) -> None:
        """Record at the owner shard that ``oid`` will never exist: its gets fail with
        ``error``."""
        await self._rpc.call_owner(oid, FailEntry(oid=oid, code=error.code, message=str(error)))

    async def delete(self, oid: ObjectID) -> None:
        """Remove the entry; the shard tells every holder to drop its copy. Remembered for a
        retry window and sent again to a new owner if the id's owner moves meanwhile, with
        the version removed (the owner's answer, else our own copy's): docs/design.md §5,
        "Deletes and moving owners"."""
        obj = self._store.get(oid)
        version = None if obj is None else obj.version
        owners = self._membership.owner_set
        try:
            frame = await self._rpc.call_owner(oid, DeleteEntry(oid=oid))
        except ObjectNotFoundError as exc:
            if exc.reported:  # the owner has no entry: its copies may be on their way there
                self._remember(oid, version, owners)
            raise
        self._remember(oid, frame.msg.version or version, owners)

    async def retire(self, oid: ObjectID, version: bytes) -> None:
        """Delete ``oid`` at ``version`` only: its entry goes if it is that version (its
        copies are withdrawn: gets waiting on them take the next version), and a copy of that
        version published later is refused. Another version under the same id may then be put
        (a committed ring that lost every holder runs again, docs/design.md §4, "Ring
        allreduce"). Like a delete, it is sent again if the id's owner moves soon after."""
        owners = self._membership.owner_set
        await self._rpc.call_owner(oid, DeleteEntry(oid=oid, version=version, retire=True))
        self._remember(oid, version, owners, retire=True)

    def _remember(self, oid: ObjectID, version: bytes | None, sent_under: OwnerSet,
                  retire: bool = False) -> None:
        """Record a delete (``retire``: a retire) sent while ``sent_under`` owned the ids; if
        owners moved while it was on its way, send it again now (the move's resends did not
        know it yet)."""
        again = self._deletes.deleted(oid, version, asyncio.get_running_loop().time(),
                                      moved=self._membership.owner_set is not sent_under,
                                      retire=retire)
        if again is not None:
            self._tasks.spawn(self._delete_again(again), name="delete-again")

    async def _delete_again(self, again: Resend) -> None:
        """Send a delete (or a retire) again to the id's new owner (whatever it answers is
        only logged: the first one has already answered its caller)."""
        try:
            await self._rpc.call_owner(again.oid, DeleteEntry(
                oid=again.oid, version=again.version, again=True, retire=again.retire))
        except HopliteError as exc:
            log.info("could not send the delete of %s again: %s", again.oid.short(), exc)

    async def may_drop(self, obj: StoredObject) -> bool:
        """Ask ``obj``'s owner shard whether this node may evict its copy; a yes means the
        shard already forgot us as a holder (the caller must drop the copy)."""
        frame = await self._rpc.call_owner(obj.oid, EvictCopy(oid=obj.oid, version=obj.version))
        if not frame.msg.allowed:
            log.debug("may not evict %s: %s", obj.oid.short(), frame.msg.reason)
        return frame.msg.allowed

    def progress(self, oid: ObjectID, received: int, half: int = -1) -> None:
        self._rpc.tell_owner(oid, Progress(oid=oid, received=received, half=half))

    def transfer_done(self, oid: ObjectID, source: str, complete: bool, half: int = -1) -> None:
        self._rpc.tell_owner(oid, TransferDone(oid=oid, source=source, complete=complete,
                                               half=half))

    def on_drop(self, peer: str, msg: Drop, payload: memoryview | None) -> Ok:
        withdrawn = CopyWithdrawn(f"the version of {msg.oid.hex()} here was retired: it is "
                                  f"made again") if msg.withdrawn else None
        if self._store.remove(msg.oid, withdrawn) is not None:
            log.debug("dropped %s", msg.oid.short())
        return Ok()

    def moved(self, oid: ObjectID, previous: OwnerSet) -> bool:
        """Whether the owner shard of ``oid`` is another than among the ``previous`` owners."""
        return previous.owner(oid) != self._membership.owner(oid)

    def reannounce(self, previous: OwnerSet, source_of: Callable[[ObjectID], str | None],
                   serving: Callable[[ObjectID], int]) -> None:
        """Tell each object's new owner shard what we hold (the directory is soft state),
        where each partial copy is pulled from (``source_of``) and how many pulls each copy
        serves (``serving``), so the shard knows the chains; and send our recent deletes of
        ids whose owner moved again, to the new owner."""
        now = asyncio.get_running_loop().time()
        for again in self._deletes.owners_moved(lambda oid: self.moved(oid, previous), now):
            self._tasks.spawn(self._delete_again(again), name="delete-again")
        moved: list[ObjectID] = []
        for obj in self._store.objects.values():
            if not _announceable(obj) or not self.moved(obj.oid, previous):
                continue
            if not self._republish_if_small(obj):
                moved.append(obj.oid)
        if moved:
            self._tasks.spawn(self._announce(moved, source_of, serving), name="reannounce")

    def announce_late(self, obj: StoredObject, asked_under: OwnerSet,
                      source_of: Callable[[ObjectID], str | None]) -> None:
        """``obj`` was made here from a shard's answer to a request sent while ``asked_under``
        owned the ids. If owners moved before it existed, their move's re-announcement
        (``reannounce``) missed it, and only the shard that answered lists it: a stand-in
        that then gave the id back to its trusted owner, whose delete would then leave the
        copy here. So it is announced here, as that move would have announced it
        (tests/unit/test_announce_late.py)."""
        if self._membership.owner_set is asked_under or not _announceable(obj):
            return
        if not self._republish_if_small(obj):
            self._tasks.spawn(self._announce([obj.oid], source_of, lambda _: 0),
                              name="reannounce")

    def _republish_if_small(self, obj: StoredObject) -> bool:
        """A small object goes to its new owner published with its bytes once complete (a
        partial one, not at all); returns whether ``obj`` is small, so not announced."""
        if obj.size > INLINE_MAX:
            return False
        if obj.complete:
            self._tasks.spawn(self._republish(obj), name="republish")
        return True

    def _holdings(self, oids: list[ObjectID], source_of: Callable[[ObjectID], str | None],
                  serving: Callable[[ObjectID], int]) -> list[Holding]:
        """What the store holds of ``oids`` now. Read at each attempt, never kept: a result
        begun again meanwhile has a new version, and announcing the old one would erase the
        new one's entry at the owner (its producer is alive, docs/design.md §5 "Ownership")."""
        out = []
        for oid in oids:
            obj = self._store.objects.get(oid)
            if obj is not None and _announceable(obj):
                out.append(_holding(obj, source_of(oid), serving(oid)))
        return out

    async def _announce(self, oids: list[ObjectID],
                        source_of: Callable[[ObjectID], str | None],
                        serving: Callable[[ObjectID], int]) -> None:
        """Announce what we hold of ``oids`` to their owners, following ownership while it
        moves: a new owner that has not yet heard of the death that made it the owner refuses,
        and is asked again shortly (for as long as a request to an owner would be). The
        owners are told at once, each batch read as it is sent: one read before an earlier
        owner answered could carry a result's old version after the new one's announcement,
        and erase it there (docs/design.md §5, "Ownership")."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self._rpc.retry_window
        attempt = 0
        while oids:
            by_owner: dict[str, list[ObjectID]] = {}
            for oid in oids:
                by_owner.setdefault(self._membership.owner(oid), []).append(oid)
            refused = await asyncio.gather(*(
                self._announce_to(owner, ids, source_of, serving, give_up)
                for owner, ids in by_owner.items()))
            oids = [oid for ids in refused for oid in ids]
            if oids:
                await asyncio.sleep(min(RETRY_PAUSE_MAX, 0.02 * 2 ** attempt))
                attempt += 1

    async def _announce_to(self, owner: str, oids: list[ObjectID],
                           source_of: Callable[[ObjectID], str | None],
                           serving: Callable[[ObjectID], int],
                           give_up: float) -> list[ObjectID]:
        """Announce what we hold of ``oids`` to ``owner``, read in the same step as the request
        is sent; the ids to ask about again (the owner refused as not yet the owner)."""
        batch = self._holdings(oids, source_of, serving)
        if not batch:
            return []
        try:
            await self._rpc.call_node(owner, Announce(holdings=batch, moved=True))
        except HopliteError as exc:
            if not owner_moved(exc) or asyncio.get_running_loop().time() >= give_up:
                log.info("could not announce %d objects to %s: %s", len(batch), owner, exc)
                return []
            return [h.oid for h in batch]
        return []


def _announceable(obj: StoredObject) -> bool:
    """Whether the directory should hear of ``obj``: not failed, not a private buffer."""
    return obj.error is None and not obj.temporary


def _holding(obj: StoredObject, source: str | None = None, serving: int = 0) -> Holding:
    return Holding(oid=obj.oid, size=obj.size, dtype=obj.dtype, shape=obj.shape,
                   version=obj.version, received=obj.received,
                   producing=obj.producing and not obj.complete,
                   source=None if obj.complete else source, serving=serving,
                   receivers=obj.receivers)
