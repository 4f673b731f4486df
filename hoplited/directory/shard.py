"""This daemon's shard of the object directory: who holds what, and who should send to whom.

Entries are soft state rebuilt from stores' announcements. A receiver asking for a source is
enrolled at once as a partial holder, so receivers that arrive together chain behind each
other (fan-out per holder is limited) and the chains split into a tree as copies complete.
A holder may only be given sources enrolled before it (or complete ones), so re-attaching
after a failure can never form a cycle.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from dataclasses import dataclass, field
from typing import Callable, Optional

from hoplite_client.wire.errors import (
    HopliteError,
    HopliteTimeoutError,
    NotOwnerError,
    ObjectExistsError,
    ObjectNotFoundError,
)
from hoplite_client.wire.ids import ObjectID

log = logging.getLogger("hoplited.directory")



@dataclass
class Holder:
    """A node holding (part of) an object, as the shard last heard."""

    received: int
    seq: int  # enrolment order; sources must have a smaller one (no cycles)
    serving: int = 0  # transfers it is sending to others now
    source: Optional[str] = None


@dataclass
class Entry:
    oid: ObjectID
    size: int
    dtype: str
    shape: list[int]
    version: bytes
    inline: Optional[bytes] = None
    holders: dict[str, Holder] = field(default_factory=dict)

    def complete_holders(self) -> list[str]:
        return [n for n, h in self.holders.items() if h.received >= self.size]


@dataclass(frozen=True)
class Source:
    """The answer to a locate: a node to pull from, or the inline bytes."""

    entry: Entry
    node: Optional[str]


class DirectoryShard:
    """Entries for the object ids this node owns; ``is_alive`` filters dead holders."""

    def __init__(self, fanout: int, is_alive: Callable[[str], bool],
                 owner_of: Callable[[ObjectID], str], me: str) -> None:
        self.fanout = fanout
        self.is_alive = is_alive
        self.owner_of = owner_of
        self.me = me
        self.entries: dict[ObjectID, Entry] = {}
        self.failed: dict[ObjectID, HopliteError] = {}  # ids that will never exist, and why
        self._waiters: dict[ObjectID, list[asyncio.Future[None]]] = {}
        self._seq = itertools.count()

    async def locate(self, oid: ObjectID, requester: str, timeout: Optional[float],
                     exclude: list[str], offset: int) -> Source:
        """Pick a source for ``requester``, waiting up to ``timeout`` for the object to exist."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            entry = self._current(oid)
            if entry is not None:
                if entry.inline is not None:
                    return Source(entry, None)
                mine = entry.holders.get(requester)
                if mine is not None and mine.received >= entry.size:
                    return Source(entry, requester)  # it was put on the requester meanwhile
                node = self._choose(entry, requester, set(exclude))
                if node is not None:
                    self._enrol(entry, requester, node, offset)
                    return Source(entry, node)
            await self._wait_change(oid, deadline, timeout)

    async def wait_object(self, oid: ObjectID, timeout: Optional[float]) -> Entry:
        """The entry of ``oid`` once a live member holds all of it (or it is inline)."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            entry = self._current(oid)
            if entry is not None and (entry.inline is not None or any(
                    self.is_alive(n) for n in entry.complete_holders())):
                return entry
            await self._wait_change(oid, deadline, timeout)

    def _current(self, oid: ObjectID) -> Optional[Entry]:
        """The entry of an id we own (None if not put yet); raises if it will never exist."""
        self.check_owner(oid)
        if oid in self.failed:
            raise self.failed[oid]
        return self.entries.get(oid)

    async def _wait_change(self, oid: ObjectID, deadline: Optional[float],
                           timeout: Optional[float]) -> None:
        """Sleep until something about ``oid`` changes, or raise once ``deadline`` passed."""
        loop = asyncio.get_running_loop()
        remaining = None if deadline is None else deadline - loop.time()
        if remaining is not None and remaining <= 0:
            raise HopliteTimeoutError(f"object {oid.hex()} was not available within "
                                      f"{timeout}s", oid=oid.hex())
        fut: asyncio.Future[None] = loop.create_future()
        self._waiters.setdefault(oid, []).append(fut)
        try:
            await asyncio.wait_for(fut, remaining)
        except asyncio.TimeoutError:
            pass
        finally:
            waiters = self._waiters.get(oid)
            if waiters is not None and fut in waiters:
                waiters.remove(fut)
                if not waiters:
                    del self._waiters[oid]

    def fail(self, oid: ObjectID, error: HopliteError) -> None:
        """``oid`` will never exist (a failed reduce): waiters and later gets get ``error``.
        An id that names an existing, complete object is left alone."""
        self.check_owner(oid)
        entry = self.entries.get(oid)
        if entry is not None and any(self.is_alive(n) for n in entry.complete_holders()):
            return
        self.entries.pop(oid, None)
        self.failed[oid] = error
        self._wake(oid)

    def check_owner(self, oid: ObjectID) -> None:
        """Raise NotOwnerError (naming the owner) unless this shard owns ``oid``."""
        owner = self.owner_of(oid)
        if owner != self.me:
            raise NotOwnerError(f"object {oid.hex()} belongs to shard {owner}", owner=owner)

    def _choose(self, entry: Entry, requester: str, exclude: set[str]) -> Optional[str]:
        me = entry.holders.get(requester)
        candidates = []
        for node, h in entry.holders.items():
            if node == requester or node in exclude or not self.is_alive(node):
                continue
            complete = h.received >= entry.size
            if not complete and me is not None and h.seq > me.seq:
                continue  # it may be downstream of the requester
            candidates.append((h.serving >= self.fanout, not complete, -h.received,
                               h.serving, h.seq, node))
        return min(candidates)[-1] if candidates else None

    def _enrol(self, entry: Entry, requester: str, source: str, offset: int) -> None:
        me = entry.holders.get(requester)
        if me is None:
            me = entry.holders[requester] = Holder(received=offset, seq=next(self._seq))
        if me.source is not None and me.source in entry.holders:
            entry.holders[me.source].serving = max(0, entry.holders[me.source].serving - 1)
        me.source = source
        me.received = max(me.received, offset)
        entry.holders[source].serving += 1

    def _wake(self, oid: ObjectID) -> None:
        for fut in self._waiters.pop(oid, []):
            if not fut.done():
                fut.set_result(None)

    def publish(self, oid: ObjectID, holder: str, size: int, dtype: str, shape: list[int],
                version: bytes, inline: Optional[bytes], received: Optional[int] = None) -> None:
        """Record that ``holder`` has ``received`` bytes (default: all) of the object."""
        self.check_owner(oid)
        entry = self.entries.get(oid)
        if entry is not None and entry.version != version:
            if any(self.is_alive(n) for n in entry.complete_holders()):
                raise ObjectExistsError(f"object {oid.hex()} already exists", oid=oid.hex())
            entry = None  # every copy was lost: this is a re-put
        if entry is None:
            entry = self.entries[oid] = Entry(oid, size, dtype, list(shape), version, inline)
            self.failed.pop(oid, None)
        elif inline is not None:
            entry.inline = inline
        got = size if received is None else received
        h = entry.holders.get(holder)
        if h is None:
            entry.holders[holder] = Holder(received=got, seq=next(self._seq))
        else:
            h.received = max(h.received, got)
        self._wake(oid)

    def progress(self, oid: ObjectID, holder: str, received: int) -> None:
        entry = self.entries.get(oid)
        if entry is not None and holder in entry.holders:
            h = entry.holders[holder]
            h.received = max(h.received, received)

    def transfer_done(self, oid: ObjectID, source: str, receiver: str, complete: bool) -> None:
        """A pull ended: free the source's slot; a completed receiver becomes a full holder."""
        entry = self.entries.get(oid)
        if entry is None:
            return
        h = entry.holders.get(receiver)
        if h is not None and h.source == source:
            h.source = None
            src = entry.holders.get(source)
            if src is not None:
                src.serving = max(0, src.serving - 1)
        if h is not None and complete:
            h.received = entry.size
        self._wake(oid)

    def delete(self, oid: ObjectID) -> list[str]:
        """Remove the entry; returns the nodes that must drop their copies."""
        self.check_owner(oid)
        entry = self.entries.pop(oid, None)
        if entry is None and self.failed.pop(oid, None) is not None:
            return []
        if entry is None:
            raise ObjectNotFoundError(f"object {oid.hex()} does not exist", oid=oid.hex())
        return list(entry.holders)

    def forget_node(self, node: str) -> None:
        """A member died: its copies are gone and the transfers it was sending stop."""
        for entry in self.entries.values():
            h = entry.holders.pop(node, None)
            if h is not None and h.source in entry.holders:
                src = entry.holders[h.source]
                src.serving = max(0, src.serving - 1)
            for other in entry.holders.values():
                if other.source == node:
                    other.source = None

    def membership_changed(self) -> int:
        """Drop entries owned elsewhere now, and wake every waiter to re-check its owner."""
        gone = [oid for oid in self.entries if self.owner_of(oid) != self.me]
        for oid in gone:
            del self.entries[oid]
        for oid in list(self._waiters):
            self._wake(oid)
        return len(gone)

    def stats(self) -> dict[str, int]:
        return {"entries": len(self.entries),
                "waiting_gets": sum(len(w) for w in self._waiters.values())}
