"""This daemon's shard of the object directory: the asyncio adapter over ``DirectoryState``.

Every decision (source choice, chains, fan-out, no cycles, tombstones) is made by the pure
``hoplited.directory.state.DirectoryState``. This module only owns what needs a loop: the
futures of requests waiting for an object to appear (or for a source to become eligible) and
their deadlines. A wait asks the state; on ``NotYet`` it sleeps until a mutator's instructions
wake its id, then asks again.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from hoplite_client.wire.errors import HopliteError, HopliteTimeoutError
from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.locate_hints import PLAIN, Among, Half, InRing, LocateHint, Plain
from hoplited.directory.state import (
    RING_WAIT,
    DirectoryState,
    DropCopy,
    DropVerdict,
    Entry,
    HalvesRule,
    Holder,
    Instruction,
    Moved,
    NotYet,
    Source,
    Split,
    Wake,
    WakeAll,
)
from hoplited.waiters import KeyedWaiters

__all__ = ["DirectoryShard", "Entry", "Holder", "Source", "Split"]

T = TypeVar("T")

# Entries ``stats`` describes (oldest first), with the last records of their stories: enough
# to see why a few ids are still listed after their deletes (``bench/chaos.py`` reports them
# on a leak), small enough (about 4 KB a node) for a cluster's status in one reply.
STATS_SAMPLE = 3
STATS_STORY = 12


class DirectoryShard:
    """Entries for the object ids this node owns; ``is_alive`` filters dead holders."""

    def __init__(self, fanout: int, is_alive: Callable[[str], bool],
                 owner_of: Callable[[ObjectID], str], me: str,
                 fanout_for: Callable[[int, int], int] | None = None,
                 halves_for: HalvesRule | None = None) -> None:
        self.state = DirectoryState(fanout, is_alive, owner_of, me, fanout_for, halves_for)
        self._waiters: KeyedWaiters[ObjectID] = KeyedWaiters()
        self._ring: dict[ObjectID, Counter[str]] = {}  # ring requesters without a source yet

    @property
    def entries(self) -> dict[ObjectID, Entry]:
        return self.state.entries

    @property
    def failed(self) -> dict[ObjectID, HopliteError]:
        return self.state.failed

    # --- waits ---
    async def locate(self, oid: ObjectID, requester: str, timeout: float | None,
                     exclude: list[str], offset: int,
                     hint: LocateHint = PLAIN) -> Source | Split:
        """Pick a source for ``requester``, waiting up to ``timeout`` for the object to exist;
        ``hint``: what it is. ``InRing``: its predecessor in the ring, if it enrols within
        RING_WAIT; ``Among``: how many get it together; ``Half``: a source of that half of an
        object taken as two trees of halves, the requester's parent in that tree if it asks
        within RING_WAIT. A ``Split`` answer wakes the receivers waiting for this one."""
        loop = asyncio.get_running_loop()
        give_up: float | None = None  # when waiting for the predecessor (parent) stops
        ring = isinstance(hint, InRing)

        def attempt() -> Source | Split | NotYet:
            nonlocal give_up
            patient = give_up is None or loop.time() < give_up
            peers = [n for n in self._ring[oid] if n != requester] if ring and patient else []
            answer = self.state.try_locate(oid, requester, exclude, offset, hint, peers,
                                           patient)
            if isinstance(answer, NotYet) and answer.ring and give_up is None:
                give_up = loop.time() + RING_WAIT
            elif not isinstance(answer, NotYet) and (ring or isinstance(hint, Half)
                                                     or isinstance(answer, Split)):
                self._waiters.wake(oid)  # requesters behind it may chain on now
            return answer

        if ring:
            self._ring.setdefault(oid, Counter())[requester] += 1
        try:
            return await self._until(oid, timeout, attempt, lambda: (
                give_up if give_up is not None and loop.time() < give_up else None))
        finally:
            if ring:
                waiting = self._ring[oid]
                waiting[requester] -= 1
                if waiting[requester] <= 0:
                    del waiting[requester]
                if not waiting:
                    del self._ring[oid]

    def locate_now(self, oid: ObjectID, requester: str, exclude: list[str], offset: int,
                   hint: Plain | Among = PLAIN) -> Source | Split | None:
        """``locate``'s answer if a source is ready at once, for a requester in neither a ring
        nor a half's tree (a plain get); None: ``locate`` waits for one. A get of an object
        that exists is then answered where its request arrives, with no task of its own
        (docs/design.md §2.4, "Small requests"); one that waits asks again there, which only
        repeats a story record, and that is skipped."""
        answer = self.state.try_locate(oid, requester, exclude, offset, hint)
        if isinstance(answer, NotYet):
            return None
        if isinstance(answer, Split):
            self._waiters.wake(oid)  # requesters behind it may chain on now
        return answer

    async def wait_object(self, oid: ObjectID, timeout: float | None) -> Entry:
        """The entry of ``oid`` once a live member holds all of it (or it is inline)."""
        return await self._until(oid, timeout, lambda: self.state.try_wait_object(oid))

    async def _until(self, oid: ObjectID, timeout: float | None,
                     attempt: Callable[[], T | NotYet],
                     recheck: Callable[[], float | None] = lambda: None) -> T:
        """Ask ``attempt`` until it answers, sleeping between changes of ``oid`` (and until
        ``recheck()``'s time at most); raises HopliteTimeoutError once ``timeout`` passed
        (after one last attempt)."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            answer = attempt()
            if not isinstance(answer, NotYet):
                return answer
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                raise HopliteTimeoutError(f"object {oid.hex()} was not available within "
                                          f"{timeout}s ({answer.reason})", oid=oid.hex())
            again = recheck()
            if again is not None:
                wait = max(0.0, again - loop.time())
                remaining = wait if remaining is None else min(remaining, wait)
            await self._waiters.wait(oid, remaining)  # until its entry changes

    def _apply(self, instructions: Iterable[Instruction]) -> None:
        """Carry out the state's wake-ups (other instructions are returned to the caller)."""
        for ins in instructions:
            if isinstance(ins, Wake):
                self._waiters.wake(ins.oid)
            elif isinstance(ins, WakeAll):
                for oid in self._waiters.waited():
                    self._waiters.wake(oid)

    # --- events, forwarded to the state ---
    def check_owner(self, oid: ObjectID) -> None:
        """Raise NotOwnerError (naming the owner) unless this shard owns ``oid``."""
        self.state.check_owner(oid)

    def fail(self, oid: ObjectID, error: HopliteError) -> None:
        """``oid`` will never exist (a failed reduce): waiters and later gets get ``error``.
        An id that names an existing, complete object is left alone."""
        self._apply(self.state.fail(oid, error))

    def publish(self, oid: ObjectID, holder: str, size: int, dtype: str, shape: list[int],
                version: bytes, inline: bytes | None, received: int | None = None,
                producing: bool = False, source: str | None = None,
                serving: int = 0, receivers: int = 0, moved: bool = False) -> list[str]:
        """Record that ``holder`` has ``received`` bytes (default: all) of the object
        (``producing``: it computes the object, which dies with it until a copy is whole;
        ``source``: where it pulls its partial copy from; ``serving``: pulls it serves;
        ``receivers``: how many will get it, if known; ``moved``: announced again because
        its owner moved). Returns the nodes that must drop their copies: the holder, if its
        copy was refused (deleted, or a moved copy of another version), and the holders of a
        version this put replaced."""
        instructions = self.state.publish(oid, holder, size, dtype, shape, version, inline,
                                          received, producing, source, serving, receivers,
                                          moved)
        self._apply(instructions)
        return [ins.node for ins in instructions if isinstance(ins, DropCopy)]

    def progress(self, oid: ObjectID, holder: str, received: int, half: int = -1) -> None:
        """A receiver reports how far along it is (in half ``half``, if one)."""
        self._apply(self.state.progress(oid, holder, received, half))

    def transfer_done(self, oid: ObjectID, source: str, receiver: str, complete: bool,
                      half: int = -1) -> None:
        """A pull ended: free the source's slot; a completed receiver becomes a full holder
        (of half ``half``, if one)."""
        self._apply(self.state.transfer_done(oid, source, receiver, complete, half))

    def may_drop(self, oid: ObjectID, holder: str, version: bytes) -> DropVerdict:
        """May ``holder`` evict its copy? A yes forgets it as a holder (nobody is woken: fewer
        holders make no waiter's answer possible)."""
        return self.state.may_drop(oid, holder, version)

    def delete(self, oid: ObjectID, version: bytes | None = None,
               again: bool = False, retire: bool = False) -> tuple[bytes | None, list[str]]:
        """Remove the entry (``again``: a delete re-sent after the owner moved, of
        ``version``; ``retire``: a version made again under the id); returns the version
        deleted (None if unknown) and the nodes that must drop their copies."""
        instructions = self.state.delete(oid, version, again, retire)
        self._apply(instructions)
        return (self.state.deleted.get(oid),
                [ins.node for ins in instructions if isinstance(ins, DropCopy)])

    def forget_node(self, node: str) -> None:
        """A member died: its copies are gone and the transfers it was sending stop."""
        self._apply(self.state.forget_node(node))

    def membership_changed(self) -> int:
        """Drop entries owned elsewhere now, and wake every waiter to re-check its owner;
        returns how many entries moved."""
        instructions = self.state.membership_changed()
        self._apply(instructions)
        return sum(isinstance(ins, Moved) for ins in instructions)

    def story(self, oid: ObjectID) -> list[tuple[str, str]]:
        """The last (event, outcome) records about ``oid`` (why each source was chosen)."""
        return self.state.story(oid)

    def stats(self) -> dict[str, Any]:
        """Counts, and the first ``STATS_SAMPLE`` entries with their holders and the end of
        their stories."""
        sample = []
        for entry in itertools.islice(self.entries.values(), STATS_SAMPLE):
            sample.append({
                "oid": entry.oid.hex(), "version": entry.version.hex(), "size": entry.size,
                "inline": entry.inline is not None, "producer": entry.producer,
                "holders": {node: h.received for node, h in entry.holders.items()},
                "story": [f"{event}: {outcome}"[:160]
                          for event, outcome in self.story(entry.oid)[-STATS_STORY:]]})
        return {"entries": len(self.entries), "waiting_gets": len(self._waiters),
                "sample": sample}
