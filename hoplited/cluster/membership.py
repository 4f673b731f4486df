"""Cluster membership and object ownership by rendezvous hashing.

The owner shard of an object is the *trusted* member (alive, not suspected) with the highest
score for (object id, node id): every node computes the same owner from the same view, and
losing or adding one member moves only the entries that member owned or now owns. A suspected
member's objects are served meanwhile by the member that owns them once it is declared dead,
so a verdict moves nothing more, and a member trusted again takes its objects back
(docs/design.md §5, "Ownership").

A score is a 64-bit mix of the id's hash with the node's, the node's hashed once: an owner
over 1,000 members is one vector operation (about 10 µs), where a hash per member takes 0.6 ms,
and every owner-set change makes each node ask again for every entry and copy it has
(docs/design.md §2.3).
"""

from __future__ import annotations

import functools
import hashlib
import logging
from collections.abc import Callable, Iterable, Sequence

import numpy as np
from numpy.typing import NDArray

from hoplite_client.wire.errors import DeclaredDeadError
from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.messages import MemberInfo

log = logging.getLogger("hoplited.membership")

# Owners remembered per id while the owner set stays the same: a small put and get ask for
# the same id's owner three times on each node.
OWNER_CACHE = 4096
# splitmix64's finaliser: every input bit reaches every output bit, so the scores of one id
# over the members are as good as independent hashes
_MIX1, _MIX2, _MASK = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB, (1 << 64) - 1
_NP_MIX1, _NP_MIX2 = np.uint64(_MIX1), np.uint64(_MIX2)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)
# From this many owners one numpy operation (6-9 µs) costs less than scoring them one by one
# (0.4-0.7 µs a member): a small cluster's owners are asked about at every put.
VECTOR_MIN = 12
# A put that names no id gets one its node's shard owns, found by drawing ids, while the
# owners are this few: a draw is owned with chance 1/N and costs a hash plus a score per
# owner, where an owner elsewhere costs the put a round trip to it (docs/design.md §2.4).
OWNED_ID_OWNERS = 64
# Batches of N draws tried before a random id is taken: found with chance 1 - (1 - 1/N)^(16N),
# 1 - 1e-7 or better. A put draws N ids on average whatever the bound; the bound only caps an
# unlucky put's draws (at most 16 batches: about 10 ms at 64 owners). Four batches would leave
# one put in 100 of a 4-member cluster to an owner elsewhere.
OWNED_ID_BATCHES = 16


def _hash64(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def _mix(z: int) -> int:
    z = ((z ^ (z >> 30)) * _MIX1) & _MASK
    z = ((z ^ (z >> 27)) * _MIX2) & _MASK
    return z ^ (z >> 31)


def _mix_all(z: NDArray[np.uint64]) -> NDArray[np.uint64]:
    """``_mix`` of every element (uint64, wrapping as ``_MASK`` does)."""
    z = (z ^ (z >> _S30)) * _NP_MIX1
    z = (z ^ (z >> _S27)) * _NP_MIX2
    mixed: NDArray[np.uint64] = z ^ (z >> _S31)
    return mixed


@functools.lru_cache(maxsize=65536)
def node_key(node_id: str) -> int:
    """A member's 64-bit hash: its part of every owner score, and its place on the watchers'
    ring (:mod:`.watching`)."""
    return _hash64(node_id.encode())


class OwnerSet:
    """The members that own objects now, each with its hash key: ``owner(oid)`` is the one
    whose score, the mix of the id's key with its own, is highest (ties, which take a 64-bit
    collision, go to the first in node-id order)."""

    __slots__ = ("nodes", "_keys", "_vector")

    def __init__(self, nodes: Iterable[str]) -> None:
        self.nodes: tuple[str, ...] = tuple(sorted(set(nodes)))
        if not self.nodes:
            raise ValueError("no members to own objects")
        self._keys = [node_key(n) for n in self.nodes]
        self._vector = (np.array(self._keys, dtype=np.uint64)
                        if len(self._keys) >= VECTOR_MIN else None)

    def owner(self, oid: ObjectID) -> str:
        key = _hash64(oid.binary())
        if self._vector is None:
            scores = [_mix(key ^ k) for k in self._keys]
            return self.nodes[scores.index(max(scores))]
        return self.nodes[int(_mix_all(self._vector ^ np.uint64(key)).argmax())]

    def first_owned(self, me: str, oids: Sequence[ObjectID]) -> ObjectID | None:
        """The first of ``oids`` that ``me`` owns (None: none, or ``me`` owns nothing): one
        numpy step over ids by owners, ties broken as ``owner`` breaks them."""
        if me not in self.nodes or not oids:
            return None
        keys = np.fromiter((_hash64(oid.binary()) for oid in oids), dtype=np.uint64,
                           count=len(oids))
        vector = (self._vector if self._vector is not None
                  else np.array(self._keys, dtype=np.uint64))
        scores = _mix_all(keys[:, None] ^ vector[None, :])
        mine = np.flatnonzero(scores.argmax(axis=1) == self.nodes.index(me))
        return oids[int(mine[0])] if mine.size else None


def owned_id(owners: OwnerSet, me: str,
             draw: Callable[[int], list[ObjectID]] = lambda n: [
                 ObjectID.random() for _ in range(n)]) -> ObjectID:
    """A fresh id for a put that named none: one that ``me`` owns if a few batches of
    ``draw`` find one while the owners are few, else a drawn one (registering it then
    costs a round trip to its owner, as any id's does)."""
    n = len(owners.nodes)
    if n > OWNED_ID_OWNERS or me not in owners.nodes:
        return draw(1)[0]
    for _ in range(OWNED_ID_BATCHES):
        batch = draw(n)
        found = owners.first_owned(me, batch)
        if found is not None:
            return found
    return batch[0]


def rendezvous_owner(oid: ObjectID, nodes: Iterable[str]) -> str:
    """The owner of ``oid`` among ``nodes``."""
    return OwnerSet(nodes).owner(oid)


class Membership:
    """Known members (this node included), which of them are alive, and which of those are
    suspected: silent for a while, not (yet) declared dead (liveness.py: ``Suspect``)."""

    def __init__(self, me: MemberInfo) -> None:
        self.me = me
        self.members: dict[str, MemberInfo] = {me.node_id: me}
        self.dead: set[str] = set()
        self.suspected: set[str] = set()
        self.listeners: list[Callable[[list[str]], None]] = []
        self.suspicion_listeners: list[Callable[[str, bool], None]] = []
        # called with the previous owner set whenever it changes (a death, a join, a
        # suspicion raised or cleared), after ``listeners``
        self.owner_listeners: list[Callable[[OwnerSet], None]] = []
        self._alive = [me.node_id]
        self._owner_set = OwnerSet([me.node_id])
        self._owner_of: dict[ObjectID, str] = {}

    def alive_ids(self) -> list[str]:
        return self._alive

    def is_alive(self, node_id: str) -> bool:
        return node_id in self.members and node_id not in self.dead

    @property
    def owner_set(self) -> OwnerSet:
        """The members that own objects now; replaced, never changed, at each move."""
        return self._owner_set

    def owner_ids(self) -> list[str]:
        """The members that own objects now: the trusted ones, sorted (never empty: a node
        never suspects itself)."""
        return list(self._owner_set.nodes)

    def is_trusted(self, node_id: str) -> bool:
        """Alive and not suspected: a node worth waiting on."""
        return self.is_alive(node_id) and node_id not in self.suspected

    def suspect(self, node_id: str, suspected: bool) -> None:
        """A live member fell silent (``suspected``) or answered again; listeners hear of a
        change, then its objects move (to a stand-in, or back to it)."""
        if node_id == self.me.node_id or not self.is_alive(node_id):
            return
        if suspected == (node_id in self.suspected):
            return
        if suspected:
            self.suspected.add(node_id)
            log.warning("member %s is silent: suspected", node_id)
        else:
            self.suspected.discard(node_id)
            log.info("member %s answers again", node_id)
        for listener in self.suspicion_listeners:
            listener(node_id, suspected)
        self._owners_changed()

    def owner(self, oid: ObjectID) -> str:
        found = self._owner_of.get(oid)
        if found is None:
            if len(self._owner_of) >= OWNER_CACHE:
                self._owner_of.clear()
            found = self._owner_of[oid] = self._owner_set.owner(oid)
        return found

    def add(self, member: MemberInfo) -> bool:
        """Add a member; returns True if the live set changed. A member declared dead stays
        dead: its process comes back under a new id (docs/design.md §5, "Declared dead, then
        running again")."""
        if member.node_id in self.members:
            return False
        self.members[member.node_id] = member
        log.info("member %s at %s:%d is up", member.node_id, member.host, member.port)
        self._changed()
        return True

    def declared_dead(self, node_id: str) -> bool:
        """We declared ``node_id`` dead: everything it sends under that id is refused."""
        return node_id in self.dead

    def refusal(self, origin: str) -> DeclaredDeadError | None:
        """The error every frame from ``origin`` is refused with, if we declared it dead: it
        carries our live set, on which the side rule decides (docs/design.md §5, "Declared
        dead, then running again", "Partitions heal")."""
        if origin not in self.dead:
            return None
        me = self.me.node_id
        return DeclaredDeadError(f"{me} declared {origin} dead; it must join again as a new "
                                 f"member", by=me, alive=",".join(self._alive))

    def mark_dead(self, node_id: str) -> bool:
        """Declare a member dead; returns True if it was alive."""
        if node_id == self.me.node_id or not self.is_alive(node_id):
            return False
        self.dead.add(node_id)
        self.suspected.discard(node_id)
        log.warning("member %s is dead", node_id)
        self._changed()
        return True

    def _changed(self) -> None:
        previous = self._alive
        self._alive = sorted(n for n in self.members if n not in self.dead)
        for listener in self.listeners:
            listener(previous)
        self._owners_changed()

    def _owners_changed(self) -> None:
        owners = tuple(n for n in self._alive if n not in self.suspected)  # sorted, as _alive
        if owners != self._owner_set.nodes:
            previous, self._owner_set = self._owner_set, OwnerSet(owners)
            self._owner_of.clear()
            for listener in self.owner_listeners:
                listener(previous)


def roster_digest(alive: Iterable[str]) -> bytes:
    """A short digest of a live set: two members whose digests are equal list the same
    members alive (docs/design.md §5, "Membership converges")."""
    return hashlib.blake2b("\n".join(sorted(alive)).encode(), digest_size=16).digest()


def rejoin_seeds(membership: Membership, by: str) -> list[tuple[str, int]]:
    """Where this node, declared dead by ``by``, joins again as a new member: ``by`` first
    (it answered just now), then every other member alive in our view, in id order, then
    those we declared dead, each address once (docs/design.md §5, "Declared dead, then
    running again"). A node cut off alone has declared everyone else dead, and ``by`` may be
    another node cut off alone, itself about to run again: the rest of the cluster is then
    among the dead (see the cut-off-alone case of ``test_rejoin_seeds`` in
    tests/unit/test_membership.py)."""
    me = membership.me.node_id
    alive = [n for n in membership.alive_ids() if n not in (by, me)]
    dead = sorted(n for n in membership.members if n not in (by, me) and n not in alive)
    order = [by, *alive, *dead]
    seeds: list[tuple[str, int]] = []
    for node in order:
        member = membership.members.get(node)
        if member is not None and node != me and (member.host, member.port) not in seeds:
            seeds.append((member.host, member.port))
    return seeds
