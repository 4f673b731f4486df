"""The directory shard's per-object state, as a pure core: who holds what, who sends to whom.

Theory of operation. Entries are soft state rebuilt from stores' announcements (``publish``). A
receiver asking for a source (``try_locate``) is enrolled at once as a partial holder, so
receivers that arrive together chain behind each other and the chains split into a tree as
copies complete. The source is the best of the live, non-excluded holders by, in order: under
the fan-out limit, complete before partial, furthest along, then for complete copies the least
busy and for partial ones the earliest enrolled (so under a fan-out of 2 receivers that ask
together grow a binary tree breadth first, not two chains). The fan-out limit is the configured
one, or 2 for an object whose producer or gets said how many will get it (``receivers``, the
largest count heard) when the injected cost rule (``fanout_for``) says a tree beats a chain for
them (docs/design.md §3). A partial holder may only serve a requester enrolled after it, so re-
attaching after a failure can never form a cycle. A holder short of memory may drop its copy
only with the shard's consent (``may_drop``): the shard agrees, and forgets that holder in the
same step, only while another live member holds the whole object and nobody is reading from the
asker. ``failed`` holds tombstones of ids that will never exist (a failed reduce); a later put
lifts them.

Ring order (docs/design.md §4, "Ring-ordered stripes"). A requester may ask to follow the ring:
the live participants (holders and the other ring requesters still waiting) in node-id order,
cyclically. It then takes its predecessor there as its source once that predecessor is
enrolled, waiting while it is not; a predecessor that cannot serve it (busy, downstream, no
participant holds anything) gives way to the usual choice. Requesters that arrive together thus
chain around the ring from the producer, so a striped allreduce's stripes, each started at a
different node, load every link equally.

Nothing here waits or reads a clock: ``try_*`` answer now or say ``NotYet``, and every mutator
returns the instructions its caller must carry out (``Wake`` the waiters of an id, ``DropCopy``
on a holder, ...). ``hoplited.directory.shard`` is the asyncio adapter that owns the waiters
and deadlines. ``story(oid)`` keeps the last few (event, outcome) records of each id, like
dask's ``story()``, so tests and ``hoplite status`` can see why a source was chosen.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict, deque
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field

from hoplite_client.wire.errors import (
    HopliteError,
    NotOwnerError,
    ObjectExistsError,
    ObjectNotFoundError,
    PeerUnavailableError,
)
from hoplite_client.wire.ids import ObjectID

# Records kept per id: a get with a few re-attaches and the transfers it caused fit with room
# to spare (dask keeps its story in a similarly bounded log).
STORY_RECORDS = 64
# Ids whose story is kept, oldest written evicted first: bounds the memory at ~STORY_OIDS x
# STORY_RECORDS short tuples whatever the number of objects.
STORY_OIDS = 1024


@dataclass(slots=True)
class Holder:
    """A node holding (part of) an object, as the shard last heard."""

    received: int
    seq: int  # enrolment order: where a chain's sources are unknown, sources come first
    serving: int = 0  # transfers it is sending to others now
    source: str | None = None


@dataclass(slots=True)
class Entry:
    """What the shard knows of one object: its metadata, inline bytes and holders."""

    oid: ObjectID
    size: int
    dtype: str
    shape: list[int]
    version: bytes
    inline: bytes | None = None
    holders: dict[str, Holder] = field(default_factory=dict)
    producer: str | None = None  # the node computing it (a reduce's result), if any
    receivers: int = 0  # how many members will get it, as its producer said (0: unknown)

    def complete_holders(self) -> list[str]:
        """The holders (alive or not) that have every byte."""
        return [n for n, h in self.holders.items() if h.received >= self.size]


@dataclass(frozen=True, slots=True)
class Source:
    """The answer to a locate: a node to pull from (the requester itself if it holds a
    complete copy), or ``None`` with the inline bytes in ``entry``."""

    entry: Entry
    node: str | None


@dataclass(frozen=True, slots=True)
class NotYet:
    """No answer now; ask again when the id's waiters are woken. ``reason`` says why;
    ``ring``: only because the requester's predecessor in the ring has not enrolled yet."""

    reason: str
    ring: bool = False


@dataclass(frozen=True, slots=True)
class DropVerdict:
    """The answer to a holder asking to drop its copy: ``allowed``, else ``reason``."""

    allowed: bool
    reason: str


@dataclass(frozen=True, slots=True)
class Wake:
    """Wake the waiters of ``oid``: something they wait for may have changed."""

    oid: ObjectID


@dataclass(frozen=True, slots=True)
class WakeAll:
    """Wake every waiter (ownership moved: each must re-check who owns its id)."""


@dataclass(frozen=True, slots=True)
class DropCopy:
    """Tell ``node`` to drop its copy of the deleted ``oid``."""

    node: str
    oid: ObjectID


@dataclass(frozen=True, slots=True)
class Moved:
    """The entry of ``oid`` was dropped here: another shard owns it now."""

    oid: ObjectID


Instruction = Wake | WakeAll | DropCopy | Moved


class DirectoryState:
    """Entries for the ids ``me`` owns (per ``owner_of``); ``is_alive`` filters dead holders
    (the daemon counts suspected members as gone too: docs/design.md §5, "Suspicion")."""

    def __init__(self, fanout: int, is_alive: Callable[[str], bool],
                 owner_of: Callable[[ObjectID], str], me: str,
                 fanout_for: Callable[[int, int], int] | None = None) -> None:
        self.fanout = fanout
        self.fanout_for = fanout_for  # (nodes, size) -> fan-out, for entries that know both
        self.is_alive = is_alive
        self.owner_of = owner_of
        self.me = me
        self.entries: dict[ObjectID, Entry] = {}
        self.failed: dict[ObjectID, HopliteError] = {}  # ids that will never exist, and why
        self._seq = itertools.count()
        self._stories: OrderedDict[ObjectID, deque[tuple[str, str]]] = OrderedDict()

    # --- queries (try_locate also enrols the requester) ---
    def check_owner(self, oid: ObjectID) -> None:
        """Raise NotOwnerError (naming the owner) unless this shard owns ``oid``."""
        owner = self.owner_of(oid)
        if owner != self.me:
            raise NotOwnerError(f"object {oid.hex()} belongs to shard {owner}", owner=owner)

    def try_locate(self, oid: ObjectID, requester: str, exclude: Iterable[str],
                   offset: int, ring: Collection[str] | None = None,
                   receivers: int = 0) -> Source | NotYet:
        """Pick a source for ``requester`` (enrolling it behind that source) or say NotYet;
        ``ring``: follow the ring order, ``ring`` naming the other ring requesters of ``oid``
        still waiting for a source; ``receivers``: how many get it together, if the requester
        knows (the largest count heard is kept)."""
        excluded = set(exclude)
        event = (f"locate by {requester} exclude={sorted(excluded)} offset={offset}"
                 + ("" if ring is None else " ring"))
        entry = self._current(oid, event)
        if entry is None:
            return self._not_yet(oid, event, "not put yet")
        entry.receivers = max(entry.receivers, receivers)
        if entry.inline is not None:  # the requester keeps a copy: a delete must reach it
            if requester not in entry.holders:
                entry.holders[requester] = Holder(received=entry.size, seq=next(self._seq))
            return self._answer(oid, event, Source(entry, None), "inline")
        mine = entry.holders.get(requester)
        if mine is not None and mine.received >= entry.size:
            return self._answer(oid, event, Source(entry, requester), "requester holds it")
        node = None
        if ring is not None:
            node, wait = self._ring_choice(entry, requester, excluded, ring)
            if wait is not None:
                return self._not_yet(oid, event, f"waiting for {wait}, before it in the ring",
                                     ring=True)
        node = node or self._choose(entry, requester, excluded)
        if node is None:
            return self._not_yet(oid, event, "no eligible source")
        h = entry.holders[node]
        why = f"{node}: {h.received}/{entry.size} bytes, serving {h.serving}, seq {h.seq}"
        self._enrol(entry, requester, node, offset)
        return self._answer(oid, event, Source(entry, node), why)

    def try_wait_object(self, oid: ObjectID) -> Entry | NotYet:
        """The entry of ``oid`` once a live member holds all of it (or it is inline)."""
        entry = self._current(oid, "wait")
        if entry is None:
            return self._not_yet(oid, "wait", "not put yet")
        if entry.inline is None and not self._has_live_copy(entry):
            return self._not_yet(oid, "wait", "no live complete copy")
        return entry

    def story(self, oid: ObjectID) -> list[tuple[str, str]]:
        """The last (event, outcome) records about ``oid``, oldest first."""
        return list(self._stories.get(oid, ()))

    # --- mutators: each returns the instructions to carry out ---
    def publish(self, oid: ObjectID, holder: str, size: int, dtype: str, shape: list[int],
                version: bytes, inline: bytes | None,
                received: int | None = None, producing: bool = False,
                source: str | None = None, serving: int = 0,
                receivers: int = 0) -> list[Instruction]:
        """Record that ``holder`` has ``received`` bytes (default: all) of the object;
        ``producing``: the holder computes it, so it dies with the holder until complete;
        ``source`` and ``serving``: the member it pulls its partial copy from and how many
        pulls it serves, as it announces after ownership moved (so the no-cycle rule can
        follow its chain and a busy holder is not taken for an idle one, whichever of a
        chain's members announces first); ``receivers``: how many members will get it, if
        its producer knows (the gets then form a tree where a chain would cost more)."""
        self.check_owner(oid)
        got = size if received is None else received
        event = f"publish by {holder} {got}/{size} bytes"
        entry = self.entries.get(oid)
        outcome = "updated"
        if entry is not None and entry.version != version:
            if self._has_live_copy(entry):
                self._record(oid, event, "refused: exists with another version")
                raise ObjectExistsError(f"object {oid.hex()} already exists", oid=oid.hex())
            entry, outcome = None, "re-put: every copy was lost"
        elif entry is None:
            outcome = "new entry"
        if entry is None:
            entry = self.entries[oid] = Entry(oid, size, dtype, list(shape), version, inline)
            if self.failed.pop(oid, None) is not None:
                outcome += ", tombstone lifted"
        elif inline is not None:
            entry.inline = inline
        if producing:
            entry.producer = holder
        entry.receivers = max(entry.receivers, receivers)
        h = entry.holders.get(holder)
        if h is None:  # holders announced before it may already pull from it
            h = entry.holders[holder] = Holder(received=got, seq=next(self._seq),
                                               serving=self._readers(entry, holder))
        else:
            h.received = max(h.received, got)
        h.serving = max(h.serving, serving)
        if (source is not None and h.source is None and source != holder
                and h.received < entry.size):
            h.source = source
            if source in entry.holders:
                src = entry.holders[source]
                src.serving = max(src.serving, self._readers(entry, source))
        self._record(oid, event, outcome)
        return [Wake(oid)]

    def progress(self, oid: ObjectID, holder: str, received: int) -> list[Instruction]:
        """A receiver is ``received`` bytes along (never goes backwards). Not in the story:
        too frequent, and it decides nothing; the next locate's outcome shows it."""
        entry = self.entries.get(oid)
        if entry is not None and holder in entry.holders:
            h = entry.holders[holder]
            h.received = max(h.received, received)
        return []

    def transfer_done(self, oid: ObjectID, source: str, receiver: str,
                      complete: bool) -> list[Instruction]:
        """A pull ended: free the source's slot; a completed receiver becomes a full holder."""
        entry = self.entries.get(oid)
        if entry is None:
            return []
        h = entry.holders.get(receiver)
        outcome = "receiver unknown"
        if h is not None:
            outcome = "slot freed" if h.source == source else "stale source, slot kept"
        if h is not None and h.source == source:
            h.source = None
            src = entry.holders.get(source)
            if src is not None:
                src.serving = max(0, src.serving - 1)
        if h is not None and complete:
            h.received = entry.size
        self._record(oid, f"transfer {source}->{receiver} done complete={complete}", outcome)
        return [Wake(oid)]

    def may_drop(self, oid: ObjectID, holder: str, version: bytes) -> DropVerdict:
        """May ``holder`` evict its complete copy of ``oid`` at ``version``? Yes only if
        another live member holds every byte (inline bytes do not count: the entry is soft
        state and dies with this shard) and no transfer reads from ``holder``; a yes forgets
        ``holder`` at once, so no later locate names it. A copy of another version than the
        entry's is nobody's source: it may go."""
        self.check_owner(oid)
        event = f"may {holder} drop its copy"
        entry = self.entries.get(oid)
        if entry is None:
            return self._verdict(oid, event, False, "no entry: cannot tell who else holds it")
        if entry.version != version:
            return self._verdict(oid, event, True, "not the entry's version")
        readers = sorted(n for n, h in entry.holders.items() if h.source == holder)
        mine = entry.holders.get(holder)
        if readers or (mine is not None and mine.serving > 0):
            return self._verdict(oid, event, False, f"transfers from it under way: {readers}")
        others = [n for n in entry.complete_holders() if n != holder and self.is_alive(n)]
        if not others:
            return self._verdict(oid, event, False, "it holds the last live complete copy")
        if mine is not None:
            del entry.holders[holder]
            if mine.source in entry.holders:
                src = entry.holders[mine.source]
                src.serving = max(0, src.serving - 1)
        return self._verdict(oid, event, True, f"complete on {sorted(others)}")

    def fail(self, oid: ObjectID, error: HopliteError) -> list[Instruction]:
        """``oid`` will never exist (a failed reduce): waiters and later gets get ``error``.
        An id that names an existing, complete object is left alone."""
        self.check_owner(oid)
        entry = self.entries.get(oid)
        if entry is not None and self._has_live_copy(entry):
            self._record(oid, "fail", "ignored: a live complete copy exists")
            return []
        self.entries.pop(oid, None)
        self.failed[oid] = error
        self._record(oid, "fail", f"tombstone: {error}")
        return [Wake(oid)]

    def delete(self, oid: ObjectID) -> list[Instruction]:
        """Remove the entry (or tombstone); each holder must drop its copy."""
        self.check_owner(oid)
        entry = self.entries.pop(oid, None)
        if entry is None and self.failed.pop(oid, None) is not None:
            self._record(oid, "delete", "tombstone removed")
            return []
        if entry is None:
            raise ObjectNotFoundError(f"object {oid.hex()} does not exist", oid=oid.hex())
        self._record(oid, "delete", f"holders {sorted(entry.holders)} drop their copies")
        return [DropCopy(node, oid) for node in entry.holders]

    def forget_node(self, node: str) -> list[Instruction]:
        """A member died: its copies are gone and the transfers it was sending stop. An object
        it was producing, with no complete copy anywhere, will never exist: its waiters get a
        typed error naming the node. Nobody else is woken: a death never makes a source
        eligible (``is_alive`` already said it was dead)."""
        out: list[Instruction] = []
        for oid, entry in list(self.entries.items()):
            if entry.producer == node and not any(
                    n != node and h.received >= entry.size for n, h in entry.holders.items()):
                del self.entries[oid]
                self.failed[oid] = PeerUnavailableError(
                    f"node {node} died producing object {oid.hex()}", node=node, oid=oid.hex())
                self._record(oid, f"{node} died", "tombstone: its producer died")
                out.append(Wake(oid))
                continue
            h = entry.holders.pop(node, None)
            if h is not None and h.source in entry.holders:
                src = entry.holders[h.source]
                src.serving = max(0, src.serving - 1)
            orphans = [n for n, other in entry.holders.items() if other.source == node]
            for n in orphans:
                entry.holders[n].source = None
            if h is not None or orphans:
                self._record(oid, f"{node} died", f"holder removed, orphaned {orphans}")
        return out

    def membership_changed(self) -> list[Instruction]:
        """Drop entries owned elsewhere now, and wake every waiter to re-check its owner."""
        gone = [oid for oid in self.entries if self.owner_of(oid) != self.me]
        for oid in gone:
            del self.entries[oid]
            self._record(oid, "membership changed", f"moved to {self.owner_of(oid)}")
        return [*(Moved(oid) for oid in gone), WakeAll()]

    # --- internals ---
    def _current(self, oid: ObjectID, event: str) -> Entry | None:
        """The entry of an id we own (None if not put yet); raises if it will never exist."""
        self.check_owner(oid)
        error = self.failed.get(oid)
        if error is not None:
            self._record(oid, event, f"failed: {error}")
            raise error.with_traceback(None)  # raised again and again: keep no old frames
        return self.entries.get(oid)

    def _has_live_copy(self, entry: Entry) -> bool:
        return any(self.is_alive(n) for n in entry.complete_holders())

    def _choose(self, entry: Entry, requester: str, exclude: set[str]) -> str | None:
        fanout = self._fanout(entry)
        candidates = []
        for node, h in entry.holders.items():
            if (node == requester or node in exclude or not self.is_alive(node)
                    or not self._eligible(entry, node, requester)):
                continue
            partial, full = h.received < entry.size, h.serving >= fanout
            # partial holders with room fill up in enrolment order, so receivers that ask
            # together grow a tree breadth first under a fan-out above 1; complete copies,
            # and holders already at the fan-out, share the load (least busy first)
            order = (h.seq, h.serving) if partial and not full else (h.serving, h.seq)
            candidates.append((full, partial, -h.received, order, node))
        return min(candidates)[-1] if candidates else None

    def _fanout(self, entry: Entry) -> int:
        """The most pulls one holder of ``entry`` should serve: the configured fan-out, or 2
        when the producer said how many will get it and a binary tree beats a chain for them
        (docs/design.md §3, "Who sends to whom")."""
        if not entry.receivers or self.fanout_for is None:
            return self.fanout
        return max(self.fanout, self.fanout_for(entry.receivers + 1, entry.size))

    def _eligible(self, entry: Entry, node: str, requester: str) -> bool:
        """``node`` may serve ``requester``: it is not (and, enrolled later, may not be)
        downstream of it."""
        me = entry.holders.get(requester)
        h = entry.holders[node]
        if h.received >= entry.size or me is None:
            return True
        fed = self._fed_by(entry, node, requester)
        return not (fed or (fed is None and h.seq > me.seq))

    def _ring_choice(self, entry: Entry, requester: str, exclude: set[str],
                     waiting: Collection[str]) -> tuple[str | None, str | None]:
        """(source, None): ``requester``'s predecessor in the ring, enrolled and able to serve
        it; (None, node): wait for that predecessor ``node`` to enrol; (None, None): choose as
        usual."""
        holders = {n for n in entry.holders if n not in exclude and self.is_alive(n)}
        if not holders - {requester}:
            return None, None  # nobody to chain behind: no ring
        peers = {n for n in waiting if n not in exclude and self.is_alive(n)}
        ring = sorted(holders | peers | {requester})
        pred = ring[ring.index(requester) - 1]
        if pred not in holders:
            return None, pred
        if entry.holders[pred].serving >= self.fanout or not self._eligible(entry, pred,
                                                                            requester):
            return None, None
        return pred, None

    @staticmethod
    def _readers(entry: Entry, node: str) -> int:
        """How many holders the shard knows to pull from ``node``."""
        return sum(other.source == node for other in entry.holders.values())

    def _fed_by(self, entry: Entry, node: str, requester: str) -> bool | None:
        """Whether ``node``'s bytes come through ``requester``, following each holder's
        source: False once the chain reaches a complete copy or the object's producer, None
        where it breaks off (a holder whose source is unknown: its pull ended, or the entry
        was rebuilt from announcements after ownership moved)."""
        seen: set[str] = set()
        while node != requester:
            h = entry.holders.get(node)
            if h is None or node in seen:
                return None
            if h.received >= entry.size or node == entry.producer:
                return False
            if h.source is None:
                return None
            seen.add(node)
            node = h.source
        return True

    def _enrol(self, entry: Entry, requester: str, source: str, offset: int) -> None:
        me = entry.holders.get(requester)
        if me is None:
            me = entry.holders[requester] = Holder(received=offset, seq=next(self._seq))
        if me.source is not None and me.source in entry.holders:
            entry.holders[me.source].serving = max(0, entry.holders[me.source].serving - 1)
        me.source = source
        me.received = max(me.received, offset)
        entry.holders[source].serving += 1

    def _verdict(self, oid: ObjectID, event: str, allowed: bool, reason: str) -> DropVerdict:
        self._record(oid, event, ("yes: " if allowed else "no: ") + reason)
        return DropVerdict(allowed, reason)

    def _answer(self, oid: ObjectID, event: str, answer: Source, why: str) -> Source:
        self._record(oid, event, f"source {why}")
        return answer

    def _not_yet(self, oid: ObjectID, event: str, reason: str, ring: bool = False) -> NotYet:
        self._record(oid, event, f"not yet: {reason}")
        return NotYet(reason, ring)

    def _record(self, oid: ObjectID, event: str, outcome: str) -> None:
        """Append to ``oid``'s story, skipping a repeat of the last record (waiters re-ask)."""
        story = self._stories.get(oid)
        if story is None:
            story = self._stories[oid] = deque(maxlen=STORY_RECORDS)
            if len(self._stories) > STORY_OIDS:
                self._stories.popitem(last=False)
        else:
            self._stories.move_to_end(oid)
        if not story or story[-1] != (event, outcome):
            story.append((event, outcome))
