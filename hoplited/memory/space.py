"""Allocating in a bounded store: evict copies held elsewhere, else wait for room.

An allocation that does not fit first makes room: the eviction policy (:mod:`.eviction`, pure)
names the least recently used copies that may go, and each one's owner shard is asked whether
another live, complete copy remains (``may_drop``: the shard decides and forgets this holder
atomically). Only a copy the shard agreed to is dropped. While the shard is asked, the object
is marked ``evicting``: a local get waits for the verdict instead of pinning a copy about to
go (``settled``). If nothing more can go, a put waits (``wait`` seconds) until memory is freed
or unpinned here, then tries again; the deadline ends it with a ``CapacityError`` saying what
was asked and what is free. docs/architecture.md §6 has the rules.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

from hoplite_client.wire.errors import CapacityError, HopliteError
from hoplite_client.wire.ids import ObjectID
from hoplited.memory import eviction
from hoplited.memory.arena import PAGE
from hoplited.memory.store import ObjectStore, StoredObject, check_meta
from hoplited.tasks import Tasks

log = logging.getLogger("hoplited.store")

# A copy its shard refused to let go (last copy, or being sent) is not asked about again for
# this long unless it is used meanwhile: a full store of sole copies costs no request storm.
REFUSAL_MEMORY = 1.0
# How long the daemon's own allocations (a get's copy, a collective's buffers) wait for memory
# once nothing more may be evicted: what transfers and a restarted collective's old buffers
# pin is given back within moments, a full store of sole copies is not.
BRIEF_WAIT = 10.0

MayDrop = Callable[[StoredObject], Awaitable[bool]]


def brief_wait(deadline: float | None) -> float:
    """:data:`BRIEF_WAIT`, but never past ``deadline`` (the event loop's clock; None: none)."""
    if deadline is None:
        return BRIEF_WAIT
    return max(0.0, min(BRIEF_WAIT, deadline - asyncio.get_running_loop().time()))


def _pages(size: int) -> int:
    return (max(size, 1) + PAGE - 1) // PAGE * PAGE


class Space:
    """Allocation with eviction and waiting, over one store; ``may_drop`` asks the shard."""

    def __init__(self, store: ObjectStore, may_drop: MayDrop, tasks: Tasks) -> None:
        self._store = store
        self._may_drop = may_drop
        self._tasks = tasks
        self._lock = asyncio.Lock()  # one eviction round at a time: no double evictions

    async def create(self, oid: ObjectID, size: int, dtype: str, shape: list[int],
                     version: bytes | None = None, temporary: bool = False,
                     wait: float | None = 0.0,
                     stripes: Sequence[tuple[ObjectID, int, int]] = ()) -> StoredObject:
        """A new, empty object, evicting other copies to make room; waits at most ``wait`` s
        (None: forever) for memory to be freed. An object larger than the whole store, or
        bad metadata, fails at once. ``stripes``: a composite of those (``create_composite``)."""
        store = self._store
        check_meta(dtype, shape, size)
        self._within_capacity(size)
        deadline = self._deadline(wait)
        while True:
            seen = store.space_events
            try:
                if stripes:
                    return store.create_composite(oid, size, dtype, shape, stripes, version)
                return store.create(oid, size, dtype, shape, version, temporary)
            except CapacityError:
                pass
            await self._evict_or_wait(size, seen, deadline, wait)

    def fits(self, size: int) -> bool:
        """Whether an object of ``size`` bytes can be allocated here now, evicting nothing."""
        return self._store.arena.largest_free() >= _pages(size)

    async def room(self, size: int, wait: float | None = 0.0) -> None:
        """Return once an object of ``size`` bytes fits (:meth:`fits`), evicting and waiting
        as :meth:`create` does, for a caller that then allocates without yielding."""
        self._within_capacity(size)
        deadline = self._deadline(wait)
        while True:
            seen = self._store.space_events
            if self.fits(size):
                return
            await self._evict_or_wait(size, seen, deadline, wait)

    def _within_capacity(self, size: int) -> None:
        arena = self._store.arena
        if _pages(size) > arena.capacity:
            raise CapacityError(f"object of {size} bytes is larger than the store "
                                f"({arena.capacity} bytes)", requested=size,
                                free=arena.capacity - arena.used)

    @staticmethod
    def _deadline(wait: float | None) -> float | None:
        return None if wait is None else asyncio.get_running_loop().time() + wait

    async def _evict_or_wait(self, size: int, seen: int, deadline: float | None,
                             wait: float | None) -> None:
        """``size`` bytes did not fit: evict, or else wait for a free or an unpin here (the
        store's ``space_events`` was ``seen`` when it was tried); past ``deadline``, fail."""
        store, arena = self._store, self._store.arena
        if await self.make_room(size) or store.space_events != seen:
            return  # room made, or memory freed while the shards were asked
        remaining = None if deadline is None else deadline - asyncio.get_running_loop().time()
        if remaining is not None and remaining <= 0:
            free = arena.capacity - arena.used
            raise CapacityError(
                f"object store full: {size} bytes requested, {free} of {arena.capacity} "
                f"free (largest extent {arena.largest_free()}) after waiting {wait}s; "
                f"nothing else here may be evicted", requested=size, free=free)
        await store.wait_space(remaining)

    async def make_room(self, size: int) -> bool:
        """Evict until an extent of ``size`` bytes is free; whether one is now."""
        arena = self._store.arena
        need = _pages(size)
        async with self._lock:
            while arena.largest_free() < need:
                victims = eviction.choose(self._candidates(), need - arena.largest_free())
                if not victims:
                    return False
                asks = []
                for oid in victims:
                    obj = self._store.objects[oid]
                    # marked now: from here on a local get waits for the verdict
                    obj.evicting = asyncio.get_running_loop().create_future()
                    asks.append(self._tasks.spawn(self._evict(obj, obj.evicting),
                                                  name=f"evict-{oid.short()}"))
                # shielded: a put given up on must not leave a verdict unapplied (a yes the
                # shard acted on, a copy kept here that no shard lists any more)
                await asyncio.shield(asyncio.gather(*asks, return_exceptions=True))
            return True

    async def settled(self, obj: StoredObject) -> StoredObject | None:
        """``obj`` once no eviction of it is under way; None if it was evicted."""
        if obj.evicting is not None:
            await asyncio.shield(obj.evicting)
        return obj if self._store.get(obj.oid) is obj else None

    def _candidates(self) -> list[eviction.Candidate]:
        now = asyncio.get_running_loop().time()
        return [eviction.Candidate(
            oid=o.oid, size=_pages(o.size), last_use=o.last_use, pinned=o.pins > 0,
            complete=o.complete, temporary=o.temporary, producing=o.producing,
            evicting=o.evicting is not None,
            refused=o.refused_use == o.last_use and now - o.refused_at < REFUSAL_MEMORY)
            for o in self._store.objects.values() if not o.is_view]  # a view frees nothing

    async def _evict(self, obj: StoredObject, verdict: asyncio.Future[bool]) -> None:
        """Ask ``obj``'s shard; drop the copy if it agreed, remember a refusal; ``verdict``
        tells the gets waiting on it."""
        loop = asyncio.get_running_loop()
        allowed = False
        try:
            allowed = await self._may_drop(obj)
        except HopliteError as exc:
            log.info("could not ask to evict %s: %s", obj.oid.short(), exc)
        finally:
            obj.evicting = None
            if allowed:
                self._store.evict(obj)
            else:
                obj.refused_use, obj.refused_at = obj.last_use, loop.time()
            verdict.set_result(allowed)
