"""The host's object store: objects in the arena, each with a progress watermark.

An object is readable from offset 0 up to its watermark ``received``; a transfer that is still
arriving advances it, and anyone streaming the object onward waits on it (a future per waiter,
never a polling loop). Objects are freed only when deleted *and* unpinned: client views and
outgoing transfers pin them. Each object records when it was last used (put, got by a client,
sent to a peer) for the eviction policy (:mod:`.eviction`); allocations that wait for room
(:mod:`.space`) wait here for memory to be freed or unpinned, woken by a future, never polled.

A **composite** object (a striped allreduce's result, docs/design.md §4 "Striped allreduce") is
allocated once; each of its stripes is an object of its own id whose memory is a region of the
composite's (a *view*): a transfer or reduce writes a stripe in place, and the composite
completes when every region has been filled, with no copy. Creating a stripe's id makes its
view; removing it keeps the bytes it completed.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hoplite_client.wire.errors import (
    HopliteError,
    InvalidArgumentError,
    ObjectDeletedError,
    ObjectExistsError,
)
from hoplite_client.wire.ids import ObjectID
from hoplited.memory.arena import Arena
from hoplited.waiters import KeyedWaiters

log = logging.getLogger("hoplited.store")

VERSION_SIZE = 8  # random per put: a resumed transfer never splices two different objects


MAX_DTYPE_TEXT = 64  # far above any plain dtype ("<c16", "|S1048576"); parsing stays cheap


@functools.lru_cache(maxsize=256)
def _dtype(text: str) -> np.dtype[Any]:
    """numpy's dtype of ``text``, kept for the few texts a cluster uses: every put and get
    parses one, and numpy's parser costs more than the rest of a small put's checks."""
    return np.dtype(text)


def parse_dtype(dtype: str) -> np.dtype[Any]:
    """``dtype`` as numpy reads it; text numpy cannot read is an InvalidArgumentError. Numpy's
    parser raises TypeError, ValueError or even SyntaxError (a "09d7..." node id read as a
    repeat count), so every exception it raises on foreign text counts as unknown."""
    if len(dtype) > MAX_DTYPE_TEXT:
        raise InvalidArgumentError(f"dtype text of {len(dtype)} characters: unknown")
    try:
        return _dtype(dtype)
    except Exception as exc:  # any failure to parse foreign text, see the docstring
        raise InvalidArgumentError(f"unknown dtype {dtype!r}") from exc


def check_meta(dtype: str, shape: list[int], size: int) -> None:
    """Reject dtypes numpy cannot rebuild without pickling, and sizes that disagree with them."""
    dt = parse_dtype(dtype)
    if dt.hasobject or dt.kind not in "biufcmMSUV" or dt.fields is not None:
        raise InvalidArgumentError(f"dtype {dtype!r} is not a plain numeric or bytes type")
    if any(d < 0 for d in shape) or len(shape) > 32:
        raise InvalidArgumentError(f"bad shape {shape}")
    expected = math.prod(shape) * dt.itemsize
    if expected != size:
        raise InvalidArgumentError(f"{size} bytes do not match dtype {dtype} and shape {shape}"
                                   f" ({expected} bytes)")


class CopyWithdrawn(HopliteError):
    """A local copy under way was given up, not the object: it will be made again, here or
    elsewhere (a ring allreduce that gave way to stripes), so a get waiting on this copy
    fetches the object instead of failing. Never sent on the wire."""


class StoredObject:
    """One object's extent, metadata and progress; ``received == size`` once complete."""

    def __init__(self, oid: ObjectID, offset: int, size: int, dtype: str, shape: list[int],
                 version: bytes, buffer: memoryview, temporary: bool = False) -> None:
        self.oid = oid
        self.temporary = temporary  # a reduce's partial result: never announced to a shard
        self.producing = False  # computed here (a reduce's result): its shard ties it to us
        self.receivers = 0  # how many members will get it, if known (an allreduce's result)
        self.offset = offset
        self.size = size
        self.dtype = dtype
        self.shape = shape
        self.version = version
        self.buffer = buffer
        self.received = 0
        self.pins = 0
        self.deleted = False
        self.freed = False  # its memory went back to the arena (once, whatever pins it later)
        self.last_use = 0  # the store's use counter at its last put, get or send (LRU)
        # set while its shard is asked whether it may be evicted; its result says if it was
        self.evicting: asyncio.Future[bool] | None = None
        self.evicted = False  # dropped to make room while copies remain elsewhere
        self.refused_use: int | None = None  # last_use when its shard last refused eviction
        self.refused_at = 0.0  # and when (the event loop's clock)
        self.error: HopliteError | None = None
        self.on_fail: list[Callable[[HopliteError], None]] = []
        self._waiters: list[tuple[int, asyncio.Future[int]]] = []
        self.whole: StoredObject | None = None  # a view: the composite whose memory it is
        self.region = 0  # a view: its index among the composite's regions
        self.regions: list[Region] = []  # a composite: its stripes, in byte order

    @property
    def is_view(self) -> bool:
        """A stripe of a composite: it owns no memory of its own."""
        return self.whole is not None

    @property
    def complete(self) -> bool:
        return self.received == self.size and self.error is None

    def rewind(self, received: int) -> None:
        """Move the watermark back to ``received``: a reduce's child buffer pulled again
        from a new placement drops the bytes of an element it holds only in part, since the
        new placement's value of that element may differ (docs/design.md §5). Only for a
        buffer nobody reads beyond ``received``."""
        self.received = min(self.received, received)

    def advance(self, received: int) -> None:
        """Move the watermark forward and wake the waiters it satisfies."""
        if received <= self.received:
            return
        self.received = received
        if self.whole is not None and received == self.size and self.error is None:
            self.whole.region_filled(self.region)
        if not self._waiters:
            return
        still = []
        for threshold, fut in self._waiters:
            if fut.done():
                continue
            if received >= threshold:
                fut.set_result(received)
            else:
                still.append((threshold, fut))
        self._waiters = still

    async def wait_for(self, threshold: int) -> int:
        """Wait until at least ``threshold`` bytes are valid; returns the watermark."""
        if self.error is not None:
            raise self.error
        if self.received >= threshold:
            return self.received
        return await self.watermark(threshold)

    def watermark(self, threshold: int) -> asyncio.Future[int]:
        """A future of the watermark once at least ``threshold`` bytes are valid (done at once
        if they are; failed with the copy's error), for waits raced against other events."""
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        if self.error is not None:
            fut.set_exception(self.error)
        elif self.received >= threshold:
            fut.set_result(self.received)
        else:
            self._waiters.append((threshold, fut))
        return fut

    def fail(self, error: HopliteError) -> None:
        """This copy will never complete: wake every waiter with ``error``."""
        self.error = error
        for _, fut in self._waiters:
            if not fut.done():
                fut.set_exception(error)
        self._waiters = []
        for callback in self.on_fail:
            callback(error)

    def region_filled(self, index: int) -> None:
        """A composite's region ``index`` holds all its bytes; once every region does, the
        composite is complete (its watermark jumps: nobody reads a composite before)."""
        self.regions[index].filled = True
        if all(r.filled for r in self.regions):
            self.advance(self.size)


@dataclass
class Region:
    """One stripe of a composite: its id, its bytes ``lo..hi``, and whether they are all
    there (they stay, whatever happens to the stripe's object afterwards)."""

    oid: ObjectID
    lo: int
    hi: int
    filled: bool = False


class ObjectStore:
    """Objects of this host by id; allocation, pinning and deferred freeing."""

    def __init__(self, arena: Arena) -> None:
        self.arena = arena
        self.objects: dict[ObjectID, StoredObject] = {}
        self._doomed: dict[int, StoredObject] = {}  # deleted but pinned, by id()
        self._uses = itertools.count(1)
        self._space_waiters: list[asyncio.Future[None]] = []
        self._arrivals: KeyedWaiters[ObjectID] = KeyedWaiters()  # for an id to be created
        self._regions: dict[ObjectID, tuple[StoredObject, int]] = {}  # stripe id -> composite
        self.space_events = 0  # frees and unpins so far: a waiter can tell it missed one
        self.evictions = 0
        self.evicted_bytes = 0

    def get(self, oid: ObjectID) -> StoredObject | None:
        return self.objects.get(oid)

    def create(self, oid: ObjectID, size: int, dtype: str, shape: list[int],
               version: bytes | None = None, temporary: bool = False) -> StoredObject:
        """Allocate a new, empty object (watermark 0); raises if the id exists or no room."""
        check_meta(dtype, shape, size)
        if oid in self.objects:
            raise ObjectExistsError(f"object {oid.hex()} already exists on this node",
                                    oid=oid.hex())
        if oid in self._regions:
            return self._view(oid, size, dtype, shape, version or os.urandom(VERSION_SIZE))
        offset = self.arena.alloc(size)
        obj = StoredObject(oid, offset, size, dtype, list(shape),
                           version or os.urandom(VERSION_SIZE), self.arena.buffer(offset, size),
                           temporary)
        self._add(obj)
        return obj

    def _add(self, obj: StoredObject) -> None:
        self.objects[obj.oid] = obj
        self.touch(obj)
        self._arrivals.wake(obj.oid)

    def create_composite(self, oid: ObjectID, size: int, dtype: str, shape: list[int],
                         stripes: Sequence[tuple[ObjectID, int, int]],
                         version: bytes | None = None) -> StoredObject:
        """Allocate a composite object: ``stripes`` (id, lo, hi) tile its bytes in order, and
        creating one of those ids later makes a view of that region. It is temporary (never
        announced, never evicted) until it is complete, and pinned while a view lives."""
        ends = [lo for _, lo, _ in stripes] + [size]
        if (not stripes or ends[0] != 0 or any(hi != ends[i + 1] or hi <= lo
                                               for i, (_, lo, hi) in enumerate(stripes))):
            raise InvalidArgumentError(f"stripes {[(lo, hi) for _, lo, hi in stripes]} do not "
                                       f"tile 0..{size}")
        ids = [s for s, _, _ in stripes]
        if len(set(ids)) != len(ids) or any(s in self.objects or s in self._regions
                                            for s in [oid, *ids]):
            raise ObjectExistsError(f"object {oid.hex()} or one of its stripes exists here",
                                    oid=oid.hex())
        obj = self.create(oid, size, dtype, shape, version, temporary=True)
        obj.regions = [Region(s, lo, hi) for s, lo, hi in stripes]
        for index, s in enumerate(ids):
            self._regions[s] = (obj, index)
        return obj

    def _view(self, oid: ObjectID, size: int, dtype: str, shape: list[int],
              version: bytes) -> StoredObject:
        """The object ``oid``, a stripe of a composite: a view of the composite's memory."""
        whole, index = self._regions[oid]
        region = whole.regions[index]
        if size != region.hi - region.lo or np.dtype(dtype) != np.dtype(whole.dtype):
            raise InvalidArgumentError(f"stripe {oid.hex()} is {region.hi - region.lo} bytes "
                                       f"of {whole.dtype}, not {size} of {dtype}")
        if region.filled:
            raise ObjectExistsError(f"stripe {oid.hex()} of {whole.oid.hex()} is complete here "
                                    f"already", oid=oid.hex())
        obj = StoredObject(oid, whole.offset + region.lo, size, dtype, list(shape), version,
                           whole.buffer[region.lo:region.hi])
        obj.whole, obj.region = whole, index
        self.pin(whole)
        self._add(obj)
        return obj

    async def wait_created(self, oid: ObjectID, timeout: float) -> StoredObject | None:
        """The object ``oid`` once it is created here, or None after ``timeout`` s."""
        return await self.wait_any_created((oid,), timeout)

    async def wait_any_created(self, oids: Sequence[ObjectID],
                               timeout: float) -> StoredObject | None:
        """The first of ``oids`` created here, once one is, or None after ``timeout`` s."""
        for oid in oids:
            if oid in self.objects:
                return self.objects[oid]
        await self._arrivals.wait_any(oids, timeout)
        return next((self.objects[oid] for oid in oids if oid in self.objects), None)

    def touch(self, obj: StoredObject) -> None:
        """``obj`` was used now: it becomes the last the eviction policy would pick."""
        obj.last_use = next(self._uses)

    def pin(self, obj: StoredObject) -> None:
        """Keep ``obj``'s memory (a client view, a transfer reading or writing it); a use."""
        obj.pins += 1
        self.touch(obj)

    def unpin(self, obj: StoredObject) -> None:
        obj.pins -= 1
        if obj.pins <= 0 and obj.deleted:
            self._free(obj)
        elif obj.pins <= 0:
            self._space_changed()  # it may be evictable now

    def evict(self, obj: StoredObject) -> None:
        """Drop ``obj``, a complete copy its shard agreed to forget, and count it; a transfer
        that still sends it keeps its memory until it ends."""
        if self.objects.get(obj.oid) is not obj:
            return
        self.evictions += 1
        self.evicted_bytes += obj.size
        obj.evicted = True  # not deleted: a get that finds it gone fetches it again
        self.remove(obj.oid)

    async def wait_space(self, timeout: float | None) -> None:
        """Return when memory is freed or an object unpinned, or after ``timeout`` s."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._space_waiters.append(fut)
        try:
            async with asyncio.timeout(timeout):
                await fut
        except TimeoutError:
            pass
        finally:
            if fut in self._space_waiters:
                self._space_waiters.remove(fut)

    def _space_changed(self) -> None:
        self.space_events += 1
        waiters, self._space_waiters = self._space_waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    def remove(self, oid: ObjectID, error: HopliteError | None = None) -> StoredObject | None:
        """Forget an object; its memory goes when the last pin does."""
        obj = self.objects.pop(oid, None)
        if obj is None:
            return None
        for region in obj.regions:  # a composite takes its stripes with it (first: their
            self._regions.pop(region.oid, None)  # unpins must not free it half-removed)
            if self.objects.get(region.oid) is not None:
                self.remove(region.oid, error)
        obj.deleted = True
        if obj.received < obj.size or error is not None:
            obj.fail(error or ObjectDeletedError(f"object {oid.hex()} was deleted"))
        if obj.pins <= 0:
            self._free(obj)
        else:
            self._doomed[id(obj)] = obj
        return obj

    def _free(self, obj: StoredObject) -> None:
        """Give ``obj``'s memory back, once: a pin taken on a copy already freed (a task that
        kept it from before its delete) must not free its extent again under the object
        allocated there since."""
        self._doomed.pop(id(obj), None)
        if obj.freed:
            return
        obj.freed = True
        obj.buffer.release()
        if obj.whole is not None:  # a view: its memory is the composite's
            self.unpin(obj.whole)
            return
        self.arena.free(obj.offset, obj.size)
        self._space_changed()

    def stats(self) -> dict[str, int]:
        """Counts and bytes of what the store holds; ``buffer_bytes`` (reduce and allreduce
        buffers, never announced) and ``pinned_deleted_bytes`` (gone, but still read) say
        what a full store is full of."""
        complete = [o for o in self.objects.values() if o.complete]
        return {
            "objects": len(self.objects),
            "complete_objects": len(complete),
            "stored_bytes": sum(o.size for o in self.objects.values() if not o.is_view),
            "buffer_bytes": sum(o.size for o in self.objects.values()
                                if o.temporary and not o.is_view),
            "arena_used": self.arena.used,
            "capacity": self.arena.capacity,
            "pinned_deleted": len(self._doomed),
            "pinned_deleted_bytes": sum(o.size for o in self._doomed.values()
                                        if not o.is_view),
            "evictions": self.evictions,
            "evicted_bytes": self.evicted_bytes,
            "waiting_for_space": len(self._space_waiters),
        }
