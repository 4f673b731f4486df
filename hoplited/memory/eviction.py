"""Which local copies to try to evict when an allocation does not fit, as a pure core.

Theory of operation. A store that is full may drop copies that someone else also holds: the
policy picks, least recently used first, copies that nobody here needs now and that could be
fetched again (docs/architecture.md §6). It never picks a copy that is pinned (a client view,
a transfer sending it), incomplete (still being written or received), a reduce's temporary
partial, being produced here, already being evicted, or refused by its directory shard a
moment ago and not used since. Whether another live, complete copy exists is not known here:
the owner shard decides that for each candidate the policy returns (``EvictCopy``,
docs/protocol.md §6), and a refusal comes back as ``refused`` on the next call.

Nothing here waits, reads a clock or touches memory: :mod:`hoplited.memory.space` builds the
candidates from the store, asks the shards and frees what they agreed to.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from hoplite_client.wire.ids import ObjectID


@dataclass(frozen=True, slots=True)
class Candidate:
    """What the policy knows of one local object (``size`` in arena bytes it would free)."""

    oid: ObjectID
    size: int
    last_use: int  # the store's use counter at its last put, get or send: smaller is older
    pinned: bool = False
    complete: bool = True
    temporary: bool = False
    producing: bool = False
    evicting: bool = False
    refused: bool = False  # its shard said no recently, and it has not been used since


def why_kept(c: Candidate) -> str | None:
    """Why ``c`` may not be evicted now, or None if it may be tried."""
    if c.pinned:
        return "pinned"
    if not c.complete:
        return "incomplete"
    if c.temporary:
        return "a reduce's partial result"
    if c.producing:
        return "being produced here"
    if c.evicting:
        return "already being evicted"
    if c.refused:
        return "refused by its shard"
    return None


def choose(candidates: Iterable[Candidate], needed: int) -> list[ObjectID]:
    """The evictable candidates to try, least recently used first, just enough of them to
    free ``needed`` bytes (all of them if they are not enough; none if nothing is needed)."""
    if needed <= 0:
        return []
    out: list[ObjectID] = []
    total = 0
    for c in sorted((c for c in candidates if why_kept(c) is None),
                    key=lambda c: (c.last_use, c.oid.binary())):
        out.append(c.oid)
        total += c.size
        if total >= needed:
            break
    return out
