"""The host's object store: objects in the arena, each with a progress watermark.

An object is readable from offset 0 up to its watermark ``received``; a transfer that is still
arriving advances it, and anyone streaming the object onward waits on it (a future per waiter,
never a polling loop). Objects are freed only when deleted *and* unpinned: client views and
outgoing transfers pin them.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
from collections.abc import Callable

import numpy as np

from hoplite_client.wire.errors import (
    HopliteError,
    InvalidArgumentError,
    ObjectDeletedError,
    ObjectExistsError,
)
from hoplite_client.wire.ids import ObjectID
from hoplited.memory.arena import Arena

log = logging.getLogger("hoplited.store")

VERSION_SIZE = 8  # random per put: a resumed transfer never splices two different objects


def check_meta(dtype: str, shape: list[int], size: int) -> None:
    """Reject dtypes numpy cannot rebuild without pickling, and sizes that disagree with them."""
    try:
        dt = np.dtype(dtype)
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"unknown dtype {dtype!r}") from exc
    if dt.hasobject or dt.kind not in "biufcmMSUV" or dt.fields is not None:
        raise InvalidArgumentError(f"dtype {dtype!r} is not a plain numeric or bytes type")
    if any(d < 0 for d in shape) or len(shape) > 32:
        raise InvalidArgumentError(f"bad shape {shape}")
    expected = math.prod(shape) * dt.itemsize
    if expected != size:
        raise InvalidArgumentError(f"{size} bytes do not match dtype {dtype} and shape {shape}"
                                   f" ({expected} bytes)")


class StoredObject:
    """One object's extent, metadata and progress; ``received == size`` once complete."""

    def __init__(self, oid: ObjectID, offset: int, size: int, dtype: str, shape: list[int],
                 version: bytes, buffer: memoryview, temporary: bool = False) -> None:
        self.oid = oid
        self.temporary = temporary  # a reduce's partial result: never announced to a shard
        self.producing = False  # computed here (a reduce's result): its shard ties it to us
        self.offset = offset
        self.size = size
        self.dtype = dtype
        self.shape = shape
        self.version = version
        self.buffer = buffer
        self.received = 0
        self.pins = 0
        self.deleted = False
        self.error: HopliteError | None = None
        self.on_fail: list[Callable[[HopliteError], None]] = []
        self._waiters: list[tuple[int, asyncio.Future[int]]] = []

    @property
    def complete(self) -> bool:
        return self.received == self.size and self.error is None

    def advance(self, received: int) -> None:
        """Move the watermark forward and wake the waiters it satisfies."""
        if received <= self.received:
            return
        self.received = received
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
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiters.append((threshold, fut))
        return await fut

    def fail(self, error: HopliteError) -> None:
        """This copy will never complete: wake every waiter with ``error``."""
        self.error = error
        for _, fut in self._waiters:
            if not fut.done():
                fut.set_exception(error)
        self._waiters = []
        for callback in self.on_fail:
            callback(error)


class ObjectStore:
    """Objects of this host by id; allocation, pinning and deferred freeing."""

    def __init__(self, arena: Arena) -> None:
        self.arena = arena
        self.objects: dict[ObjectID, StoredObject] = {}
        self._doomed: dict[int, StoredObject] = {}  # deleted but pinned, by offset

    def get(self, oid: ObjectID) -> StoredObject | None:
        return self.objects.get(oid)

    def create(self, oid: ObjectID, size: int, dtype: str, shape: list[int],
               version: bytes | None = None, temporary: bool = False) -> StoredObject:
        """Allocate a new, empty object (watermark 0); raises if the id exists or no room."""
        check_meta(dtype, shape, size)
        if oid in self.objects:
            raise ObjectExistsError(f"object {oid.hex()} already exists on this node",
                                    oid=oid.hex())
        offset = self.arena.alloc(size)
        obj = StoredObject(oid, offset, size, dtype, list(shape),
                           version or os.urandom(VERSION_SIZE), self.arena.buffer(offset, size),
                           temporary)
        self.objects[oid] = obj
        return obj

    def pin(self, obj: StoredObject) -> None:
        obj.pins += 1

    def unpin(self, obj: StoredObject) -> None:
        obj.pins -= 1
        if obj.pins <= 0 and obj.deleted:
            self._free(obj)

    def remove(self, oid: ObjectID, error: HopliteError | None = None) -> StoredObject | None:
        """Forget an object; its memory goes when the last pin does."""
        obj = self.objects.pop(oid, None)
        if obj is None:
            return None
        obj.deleted = True
        if obj.received < obj.size or error is not None:
            obj.fail(error or ObjectDeletedError(f"object {oid.hex()} was deleted"))
        if obj.pins <= 0:
            self._free(obj)
        else:
            self._doomed[obj.offset] = obj
        return obj

    def _free(self, obj: StoredObject) -> None:
        self._doomed.pop(obj.offset, None)
        obj.buffer.release()
        self.arena.free(obj.offset, obj.size)

    def stats(self) -> dict[str, int]:
        complete = [o for o in self.objects.values() if o.complete]
        return {
            "objects": len(self.objects),
            "complete_objects": len(complete),
            "stored_bytes": sum(o.size for o in self.objects.values()),
            "arena_used": self.arena.used,
            "capacity": self.arena.capacity,
            "pinned_deleted": len(self._doomed),
        }
