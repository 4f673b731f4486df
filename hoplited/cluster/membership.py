"""Cluster membership and object ownership by rendezvous hashing.

The owner shard of an object is the *trusted* member (alive, not suspected) with the highest
hash of (object id, node id): every node computes the same owner from the same view, and
losing or adding one member moves only the entries that member owned or now owns. A suspected
member's objects are served meanwhile by the member that owns them once it is declared dead,
so a verdict moves nothing more, and a member trusted again takes its objects back
(docs/design.md §5, "Ownership").
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable

from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.messages import MemberInfo

log = logging.getLogger("hoplited.membership")

# Owners remembered per id while the owner set stays the same: a small put and get ask for
# the same id's owner three times on each node, at a hash per member each.
OWNER_CACHE = 4096


def _score(oid: ObjectID, node_id: str) -> bytes:
    return hashlib.blake2b(oid.binary() + node_id.encode(), digest_size=8).digest()


def rendezvous_owner(oid: ObjectID, nodes: Iterable[str]) -> str:
    """The node with the highest (object, node) hash."""
    return max(nodes, key=lambda n: _score(oid, n))


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
        self.owner_listeners: list[Callable[[list[str]], None]] = []
        self._alive = [me.node_id]
        self._owners = [me.node_id]
        self._owner_of: dict[ObjectID, str] = {}

    def alive_ids(self) -> list[str]:
        return self._alive

    def is_alive(self, node_id: str) -> bool:
        return node_id in self.members and node_id not in self.dead

    def owner_ids(self) -> list[str]:
        """The members that own objects now: the trusted ones, sorted (never empty: a node
        never suspects itself)."""
        return self._owners

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
            found = self._owner_of[oid] = rendezvous_owner(oid, self._owners)
        return found

    def add(self, member: MemberInfo) -> bool:
        """Add (or revive) a member; returns True if the live set changed."""
        known = self.members.get(member.node_id)
        if known is not None and member.node_id not in self.dead:
            return False
        self.members[member.node_id] = member
        self.dead.discard(member.node_id)
        self.suspected.discard(member.node_id)
        log.info("member %s at %s:%d is up", member.node_id, member.host, member.port)
        self._changed()
        return True

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
        previous = self._owners
        self._owners = [n for n in self._alive if n not in self.suspected]
        if self._owners != previous:
            self._owner_of.clear()
            for listener in self.owner_listeners:
                listener(previous)
