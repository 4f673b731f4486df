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
them (docs/design.md §3). A partial holder never serves a requester that feeds it, directly or
through others, and where those chains are not known only one enrolled before the requester
does, so re-attaching after a failure can never form a cycle (``_eligible``). A holder short
of memory may drop its copy only with the shard's consent (``may_drop``): the shard agrees, and
forgets that holder in the same step, only while another live member holds the whole object
and nobody is reading from the asker. ``failed`` holds tombstones of ids that will never exist
(a failed reduce); a later put lifts them, a partial copy announced again after a move does not.

Ring order (docs/design.md §4, "Ring-ordered stripes"). A requester may ask to follow the ring
(``InRing``): the live participants (holders and the other ring requesters still waiting) in
node-id order, cyclically. It then takes its predecessor there as its source once that
predecessor is enrolled, waiting while it is not; a predecessor that cannot serve it (busy,
downstream, no participant holds anything) gives way to the usual choice. Requesters that
arrive together thus chain around the ring from the producer, so a striped allreduce's stripes,
each started at a different node, load every link equally.

Two trees of halves (docs/design.md §3, "Two trees of halves for a broadcast"). Where the
injected rule (``halves_for``) says so for the receivers a get announced, the entry splits: each
new receiver is given an index, in the order they ask (``Split``), and then locates each half
on its own (a ``Half`` hint): it pulls half h from the receiver at its parent position in tree h
(``tree.half_parent``), waiting for that receiver to ask while the requester is ``patient``, or
from a holder of the whole object at the top. Each half keeps its own holders (``parts``), as
an entry does, so failures and re-attaches follow the usual rules within a half. A receiver
holds the whole object once both of its halves are complete.

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
    InvalidArgumentError,
    NotOwnerError,
    ObjectExistsError,
    ObjectNotFoundError,
    PeerUnavailableError,
)
from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.locate_hints import PLAIN, Among, Half, InRing, LocateHint
from hoplited.collectives.tree import half_parent

# Records kept per id: a get with a few re-attaches and the transfers it caused fit with room
# to spare (dask keeps its story in a similarly bounded log).
STORY_RECORDS = 64
# Ids whose story is kept, oldest written evicted first: bounds the memory at ~STORY_OIDS x
# STORY_RECORDS short tuples whatever the number of objects.
STORY_OIDS = 1024
# Deleted versions remembered, oldest forgotten first. A holder re-announces its copies when
# their owner changes, and an announcement that reaches the owner after a delete would make
# the deleted object an entry again, its copies kept for good: the shard answers it with a
# Drop instead (docs/design.md §5, "Deletes and moving owners"). A delete that finds no entry
# (it came before every re-announcement) is remembered without a version: it refuses the
# copies re-announced after a move, of any version, and a new put lifts it. Re-announcements
# follow a death within the retry window; this many deletes cover that window at about 5,000
# deletes a second, in about 3 MiB.
DELETED_MAX = 32768
# A ring requester waits this long at most for its predecessor to enrol (a receiver of a half,
# for its parent in that half's tree), then takes the usual choice: a predecessor that lags
# (its request is still on its way, or it waits for a source for another reason) costs the
# chain its order, never a stall (docs/design.md §3, §4). The adapters keep the time.
RING_WAIT = 0.5


@dataclass(slots=True)
class Holder:
    """A node holding (part of) an object, as the shard last heard."""

    received: int
    seq: int  # enrolment order: where a chain's sources are unknown, sources come first
    serving: int = 0  # transfers it is sending to others now
    source: str | None = None
    halves: bool = False  # it receives the object as two halves: no source until complete


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
    trees: HalfTrees | None = None  # its receivers take it as two trees of halves

    def complete_holders(self) -> list[str]:
        """The holders (alive or not) that have every byte."""
        return [n for n, h in self.holders.items() if h.received >= self.size]


@dataclass(slots=True)
class HalfTrees:
    """An object broadcast as two trees of halves: the count of receivers the trees are built
    for (``n``), each half's bytes (``bounds``) and holders, kept as an entry of the half's
    size (``parts``), and which receiver holds which index. ``rebuilt``: pieced together from
    the receivers' locates of their halves after the entry moved to this shard (a half or an
    index not heard of yet is missing), so it splits no new receiver."""

    n: int
    bounds: list[tuple[int, int] | None]
    parts: list[Entry | None]
    by_index: dict[int, str] = field(default_factory=dict)
    index: dict[str, int] = field(default_factory=dict)
    rebuilt: bool = False

    def enrol(self, requester: str, index: int) -> None:
        """``requester`` is receiver ``index`` (a first claim on an index holds)."""
        if requester not in self.index and index not in self.by_index:
            self.index[requester], self.by_index[index] = index, requester


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


@dataclass(frozen=True, slots=True)
class Split:
    """The answer to a locate of an object broadcast as two trees of halves: the requester is
    receiver ``index`` of trees built for ``receivers``, and locates each half (its bytes in
    ``bounds``) on its own."""

    entry: Entry
    index: int
    receivers: int
    bounds: tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class HalfClaim:
    """What a receiver locating a half was told at its split: it is receiver ``index`` of
    trees built for ``receivers``, and the half is bytes ``window``."""

    requester: str
    index: int = -1
    receivers: int = 0
    window: tuple[int, int] | None = None


Instruction = Wake | WakeAll | DropCopy | Moved
# (receivers, size, dtype) -> the bytes of the two halves, or None for one tree
HalvesRule = Callable[[int, int, str], list[tuple[int, int]] | None]


def _held(entry: Entry) -> list[Entry]:
    """``entry`` and, if it is taken as two halves, each half's holders known here."""
    parts = () if entry.trees is None else entry.trees.parts
    return [entry, *(p for p in parts if p is not None)]


class DirectoryState:
    """Entries for the ids ``me`` owns (per ``owner_of``); ``is_alive`` filters dead holders
    (the daemon counts suspected members as gone too: docs/design.md §5, "Suspicion")."""

    def __init__(self, fanout: int, is_alive: Callable[[str], bool],
                 owner_of: Callable[[ObjectID], str], me: str,
                 fanout_for: Callable[[int, int], int] | None = None,
                 halves_for: HalvesRule | None = None) -> None:
        self.fanout = fanout
        self.fanout_for = fanout_for  # (nodes, size) -> fan-out, for entries that know both
        self.halves_for = halves_for  # when the receivers take an object as two halves
        self.is_alive = is_alive
        self.owner_of = owner_of
        self.me = me
        self.entries: dict[ObjectID, Entry] = {}
        self.failed: dict[ObjectID, HopliteError] = {}  # ids that will never exist, and why
        # deleted ids: the version removed, None if none was known here
        self.deleted: OrderedDict[ObjectID, bytes | None] = OrderedDict()
        self._seq = itertools.count()
        self._stories: OrderedDict[ObjectID, deque[tuple[str, str]]] = OrderedDict()

    # --- queries (try_locate also enrols the requester) ---
    def check_owner(self, oid: ObjectID) -> None:
        """Raise NotOwnerError (naming the owner) unless this shard owns ``oid``."""
        owner = self.owner_of(oid)
        if owner != self.me:
            raise NotOwnerError(f"object {oid.hex()} belongs to shard {owner}", owner=owner)

    def try_locate(self, oid: ObjectID, requester: str, exclude: Iterable[str],
                   offset: int, hint: LocateHint = PLAIN, ring: Collection[str] = (),
                   patient: bool = True) -> Source | Split | NotYet:
        """Pick a source for ``requester`` (enrolling it behind that source) or say NotYet;
        ``hint``: what it is. ``InRing``: follow the ring order, ``ring`` naming the other
        ring requesters of ``oid`` still waiting for a source; ``Among``: how many get it
        together (the largest count heard is kept). ``Split``: take it as two halves, each
        located with a ``Half`` hint saying what the split said; ``patient``: a ring member
        or a half's requester may still wait for its predecessor (the receiver at its parent
        position) to ask, and takes the usual choice once not."""
        excluded = set(exclude)
        in_ring = isinstance(hint, InRing) and patient
        event = (f"locate by {requester} exclude={sorted(excluded)} offset={offset}"
                 + (" ring" if in_ring else "")
                 + (f" half {hint.half}" if isinstance(hint, Half) else ""))
        entry = self._current(oid, event)
        if entry is None:
            return self._not_yet(oid, event, "not put yet")
        if isinstance(hint, Half):
            window = None if hint.window is None else (hint.window[0], hint.window[1])
            return self._locate_half(entry, requester, excluded, offset, hint.half, patient,
                                     event, HalfClaim(requester, hint.index, hint.receivers,
                                                      window))
        if isinstance(hint, Among):
            entry.receivers = max(entry.receivers, hint.receivers)
        if entry.inline is not None:  # the requester keeps a copy: a delete must reach it
            if requester not in entry.holders:
                entry.holders[requester] = Holder(received=entry.size, seq=next(self._seq))
            return self._answer(oid, event, Source(entry, None), "inline")
        mine = entry.holders.get(requester)
        if mine is not None and mine.received >= entry.size:
            return self._answer(oid, event, Source(entry, requester), "requester holds it")
        split = self._split(entry, requester, offset)
        if split is not None:
            self._record(oid, event, f"receiver {split.index} of the two trees of halves")
            return split
        node = None
        if in_ring:
            node, wait = self._ring_choice(entry, requester, excluded, ring)
            if wait is not None:
                return self._not_yet(oid, event, f"waiting for {wait}, before it in the ring",
                                     ring=True)
        return self._take(oid, event, entry, requester, excluded, node, offset)

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
                receivers: int = 0, moved: bool = False) -> list[Instruction]:
        """Record that ``holder`` has ``received`` bytes (default: all) of the object;
        ``producing``: the holder computes it, so it dies with the holder until complete;
        ``source`` and ``serving``: the member it pulls its partial copy from and how many
        pulls it serves, as it announces after ownership moved (so the no-cycle rule can
        follow its chain and a busy holder is not taken for an idle one, whichever of a
        chain's members announces first); ``receivers``: how many members will get it, if
        its producer knows (the gets then form a tree where a chain would cost more);
        ``moved``: a copy announced again because its owner moved, not a new put.
        ``DropCopy`` for the holder: its copy is refused (a deleted version, or a whole
        moved copy of another version than the entry's), and it must drop it; for another
        node: it held the version this put replaced, and is dead or silent (docs/design.md
        §5, "Deletes and moving owners"). A moved partial copy of another version is not
        recorded: its receiver locates again and finds the entry's version."""
        self.check_owner(oid)
        got = size if received is None else received
        event = f"publish by {holder} {got}/{size} bytes" + (" (moved)" if moved else "")
        if oid in self.deleted and (self.deleted[oid] == version
                                    or moved and self.deleted[oid] is None):
            self._record(oid, event, "refused: deleted, the holder drops it")
            return [DropCopy(holder, oid)]
        if oid in self.failed and moved and got < size and not producing:
            # a receiver's partial copy, announced again after the owner moved, lifts no
            # tombstone: nothing can complete it, and its get would wait out its own timeout
            # (docs/design.md §2); its next locate here gets the failure, and its fetch drops it
            self._record(oid, event, "refused: the id failed; its receiver learns why")
            return []
        self.deleted.pop(oid, None)  # put again under the same id: a new version
        entry = self.entries.get(oid)
        outcome = "updated"
        stale: list[str] = []  # holders of a version this put replaces
        if entry is not None and entry.version != version:
            # a live producer's new version outranks a copy of another one that is not
            # being produced: one re-announced late, after ownership moved, must not erase it
            if self._has_live_copy(entry) or (not producing and self._producing(entry)):
                if moved and got >= size and not producing:  # nobody would find it: it goes
                    self._record(oid, event, "refused: another version exists, the holder "
                                             "drops it")
                    return [DropCopy(holder, oid)]
                if moved:  # a receiver of the other version: it locates again, finds this
                    self._record(oid, event, "refused: another version exists")
                    return []
                whole = [n for n in entry.complete_holders() if self.is_alive(n)]
                why = (f"a complete copy of another version is on {whole[0]}" if whole
                       else f"{entry.producer} is producing another version")
                self._record(oid, event, f"refused: {why}")
                raise ObjectExistsError(f"object {oid.hex()} already exists: {why}",
                                        oid=oid.hex())
            # the old version's complete copies are on dead or silent nodes; one that is only
            # silent keeps a copy nobody would find or delete once it runs again: it drops
            # it (a live receiver of the old version is left alone: it locates again, and
            # finds the new version)
            stale = [n for n in entry.holders if n != holder and not self.is_alive(n)]
            entry, outcome = None, "re-put: every copy was lost"
            if stale:
                outcome += f"; {sorted(stale)} drop theirs"
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
        return [Wake(oid), *(DropCopy(node, oid) for node in stale)]

    def progress(self, oid: ObjectID, holder: str, received: int,
                 half: int = -1) -> list[Instruction]:
        """A receiver is ``received`` bytes along (never goes backwards), of half ``half`` if
        it is one. Not in the story: too frequent, and it decides nothing; the next locate's
        outcome shows it."""
        if half >= 0:
            parts = self._parts(oid, half)
            entry = None if parts is None else parts[1]
        else:
            entry = self.entries.get(oid)
        if entry is not None and holder in entry.holders:
            h = entry.holders[holder]
            h.received = max(h.received, received)
        return []

    def transfer_done(self, oid: ObjectID, source: str, receiver: str,
                      complete: bool, half: int = -1) -> list[Instruction]:
        """A pull ended: free the source's slot; a completed receiver becomes a full holder
        (of half ``half``, if it is one: of the object once it has both). A receiver that took
        the object as two halves says it has it all with itself as the source: an entry
        rebuilt since (its shard moved) may not know it, and learns it then."""
        if half >= 0:
            return self._half_done(oid, source, receiver, complete, half)
        entry = self.entries.get(oid)
        if entry is None:
            return []
        h = entry.holders.get(receiver)
        outcome = "receiver unknown"
        if h is None and complete and source == receiver and entry.trees is not None:
            entry.holders[receiver] = Holder(received=entry.size, seq=next(self._seq))
            outcome = "a holder of the whole, from its halves"
        elif h is not None:
            outcome = "slot freed" if h.source == source else "stale source, slot kept"
        self._free_slot(entry, source, receiver, complete)
        self._record(oid, f"transfer {source}->{receiver} done complete={complete}", outcome)
        return [Wake(oid)]

    def _half_done(self, oid: ObjectID, source: str, receiver: str, complete: bool,
                   half: int) -> list[Instruction]:
        parts = self._parts(oid, half)
        if parts is None:
            return []
        entry, part = parts
        self._free_slot(part, source, receiver, complete)
        whole = entry.holders.get(receiver)
        assert entry.trees is not None
        if complete and whole is not None and all(
                p is not None and p.holders.get(receiver) is not None
                and p.holders[receiver].received >= p.size for p in entry.trees.parts):
            whole.received, whole.halves = entry.size, False
            self._record(oid, f"{receiver} has both halves", "a holder of the whole object")
        return [Wake(oid)]

    @staticmethod
    def _free_slot(entry: Entry, source: str, receiver: str, complete: bool) -> None:
        """Free ``source``'s slot in ``entry`` (an object or a half's holders)."""
        h = entry.holders.get(receiver)
        if h is not None and h.source == source:
            h.source = None
            src = entry.holders.get(source)
            if src is not None:
                src.serving = max(0, src.serving - 1)
        if h is not None and complete:
            h.received = entry.size

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
        held = _held(entry)
        readers = sorted({n for e in held for n, h in e.holders.items() if h.source == holder})
        serving = [e.holders[holder].serving for e in held if holder in e.holders]
        if readers or any(serving):
            return self._verdict(oid, event, False, f"transfers from it under way: {readers}")
        others = [n for n in entry.complete_holders() if n != holder and self.is_alive(n)]
        if not others:
            return self._verdict(oid, event, False, "it holds the last live complete copy")
        for e in held:
            self._forget_holder(e, holder)
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

    def delete(self, oid: ObjectID, version: bytes | None = None,
               again: bool = False, retire: bool = False) -> list[Instruction]:
        """Remove the entry (or tombstone); each holder must drop its copy. The version
        removed is remembered (``deleted``), None if no entry was here: the object may exist
        and its copies not be announced here yet, so the copies re-announced after a move go
        too. ``again``: the deleter sends the delete once more because the id's owner moved
        since; ``version`` is the one its first delete removed. Only an entry of that
        version goes (another is a put made since), and finding nothing is no error.
        ``retire``: the same for a version its maker replaces by another under the same id
        (a committed ring run again); the caller withdraws its copies rather than deletes
        them, so that gets waiting on them take the next version."""
        self.check_owner(oid)
        again = again or retire
        if again and version is None:
            raise InvalidArgumentError("a delete sent again names the version it removed")
        event = "retire" if retire else "delete" + (" again" if again else "")
        entry = self.entries.get(oid)
        if again and entry is not None and entry.version != version:
            self._record(oid, event, "kept: a put made since")
            return []
        self.entries.pop(oid, None)
        if entry is None and self.failed.pop(oid, None) is not None:
            self._record(oid, event, "tombstone removed")
            return []
        if entry is not None:
            version = entry.version
        elif version is None and oid in self.deleted:
            version = self.deleted[oid]  # deleted twice: the version known at the first stays
        self.deleted[oid] = version
        self.deleted.move_to_end(oid)
        if len(self.deleted) > DELETED_MAX:
            self.deleted.popitem(last=False)
        if entry is None:
            self._record(oid, event, "no entry: its copies announced after a move drop")
            if again:
                return []
            raise ObjectNotFoundError(f"object {oid.hex()} does not exist", oid=oid.hex())
        self._record(oid, event, f"holders {sorted(entry.holders)} drop their copies")
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
            for held in _held(entry):
                h = self._forget_holder(held, node)
                orphans = [n for n, other in held.holders.items() if other.source == node]
                for n in orphans:
                    held.holders[n].source = None
                if h is not None or orphans:
                    part = "" if held is entry else f" (a half of {held.size} bytes)"
                    self._record(oid, f"{node} died",
                                 f"holder removed, orphaned {orphans}{part}")
        return out

    @staticmethod
    def _forget_holder(entry: Entry, node: str) -> Holder | None:
        """Remove ``node`` from ``entry``'s holders, freeing its source's slot."""
        h = entry.holders.pop(node, None)
        if h is not None and h.source in entry.holders:
            src = entry.holders[h.source]
            src.serving = max(0, src.serving - 1)
        return h

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

    def _producing(self, entry: Entry) -> bool:
        """A live node is still computing ``entry`` (a reduce's result, begun again)."""
        p = entry.producer
        return (p is not None and self.is_alive(p) and p in entry.holders
                and entry.holders[p].received < entry.size)

    def _choose(self, entry: Entry, requester: str, exclude: set[str]) -> str | None:
        fanout = self._fanout(entry)
        candidates = []
        for node, h in entry.holders.items():
            if (node == requester or node in exclude or not self.is_alive(node)
                    or (h.halves and h.received < entry.size)
                    or not self._eligible(entry, node, requester)):
                continue
            partial, full = h.received < entry.size, h.serving >= fanout
            # partial holders with room fill up in enrolment order, so receivers that ask
            # together grow a tree breadth first under a fan-out above 1; complete copies,
            # and holders already at the fan-out, share the load (least busy first)
            order = (h.seq, h.serving) if partial and not full else (h.serving, h.seq)
            candidates.append((full, partial, -h.received, order, node))
        return min(candidates)[-1] if candidates else None

    def _split(self, entry: Entry, requester: str, offset: int) -> Split | None:
        """The requester's place in the two trees of halves, if the object is (or now becomes)
        taken so: a receiver starting from byte 0 with no copy of its own under way."""
        mine = entry.holders.get(requester)
        if offset or (mine is not None and not mine.halves):
            return None
        trees = entry.trees
        if trees is None and not self._has_live_copy(entry):
            return None  # still produced (a reduce's result): its gets chain behind it
        if trees is None:
            bounds = (None if self.halves_for is None or not entry.receivers
                      else self.halves_for(entry.receivers, entry.size, entry.dtype))
            if bounds is None:
                return None
            trees = entry.trees = HalfTrees(entry.receivers, list(bounds), [
                Entry(entry.oid, hi - lo, entry.dtype, [], entry.version) for lo, hi in bounds])
        if trees.rebuilt:
            return None  # a half's bounds may be unknown here: the usual choice
        index = trees.index.get(requester)
        if index is None:
            index = len(trees.by_index)
            trees.enrol(requester, index)
        if mine is None:  # a delete must reach its copy, and no whole-object pull picks it
            entry.holders[requester] = Holder(received=0, seq=next(self._seq), halves=True)
        return Split(entry, index, trees.n, tuple(b for b in trees.bounds if b is not None))

    def _locate_half(self, entry: Entry, requester: str, excluded: set[str], offset: int,
                     half: int, patient: bool, event: str, claim: HalfClaim) -> Source | NotYet:
        """A source of half ``half`` for receiver ``requester``: the receiver at its parent
        position in that half's tree, a holder of the whole object at the top, or, when that
        receiver is gone, excluded, or (``patient`` False) has not asked yet, the usual
        choice among the half's holders. ``claim``: what the requester was told at its split,
        from which an entry rebuilt here (its owner died) learns the trees again."""
        part = self._part(entry, half, claim)
        trees = entry.trees
        assert trees is not None
        for whole in entry.complete_holders():  # holders of the whole hold each half
            if whole not in part.holders:
                part.holders[whole] = Holder(received=part.size, seq=next(self._seq))
        oid = entry.oid
        mine = part.holders.get(requester)
        if mine is not None and mine.received >= part.size:
            return self._answer(oid, event, Source(part, requester), "requester holds it")
        index = trees.index.get(requester)
        parent = (None if index is None or index >= trees.n
                  else half_parent(trees.n, half, index))
        node: str | None = None
        up = None if parent is None else trees.by_index.get(parent)
        if parent is not None and up is None:
            if patient:
                return self._not_yet(oid, event, f"waiting for receiver {parent} to ask",
                                     ring=True)
        elif up is not None and up not in excluded and self.is_alive(up):
            if up not in part.holders:  # it asked for the whole, not yet for this half
                part.holders[up] = Holder(received=0, seq=next(self._seq))
            if self._eligible(part, up, requester):
                node = up
        return self._take(oid, event, part, requester, excluded, node, offset)

    def _part(self, entry: Entry, half: int, claim: HalfClaim) -> Entry:
        """Half ``half``'s holders, learning the trees, the half and the requester's index
        from ``claim`` where this entry lost them (rebuilt after its shard moved)."""
        if half not in (0, 1):
            raise InvalidArgumentError(f"half must be 0 or 1, not {half}")
        trees = entry.trees
        if trees is None or trees.parts[half] is None:
            if claim.window is None or not claim.receivers >= 1 or not claim.index >= 0:
                raise PeerUnavailableError(
                    f"object {entry.oid.hex()} is not taken as two halves here (never split, "
                    f"or its entry was rebuilt and the locate did not say which half)",
                    oid=entry.oid.hex())
            lo, hi = claim.window
            if not (0 <= lo < hi <= entry.size
                    and ((lo, half) == (0, 0) and hi < entry.size
                         or (hi, half) == (entry.size, 1) and lo > 0)):
                raise InvalidArgumentError(f"bytes {lo}..{hi} are not half {half} of an object "
                                           f"of {entry.size} bytes")
            if trees is None:
                trees = entry.trees = HalfTrees(claim.receivers, [None, None], [None, None],
                                                rebuilt=True)
            trees.bounds[half] = (lo, hi)
            trees.parts[half] = Entry(entry.oid, hi - lo, entry.dtype, [], entry.version)
        elif claim.window is not None and tuple(claim.window) != trees.bounds[half]:
            raise InvalidArgumentError(f"bytes {claim.window} are not half {half} of "
                                       f"{entry.oid.hex()}: {trees.bounds[half]}")
        if trees.rebuilt and 0 <= claim.index < trees.n:
            trees.enrol(claim.requester, claim.index)
        part = trees.parts[half]
        assert part is not None
        return part

    def _take(self, oid: ObjectID, event: str, held: Entry, requester: str,
              excluded: set[str], node: str | None, offset: int) -> Source | NotYet:
        """``node``, or else the usual choice among ``held``'s holders (an object's, or a
        half's), enrolled as ``requester``'s source."""
        node = node or self._choose(held, requester, excluded)
        if node is None:
            return self._not_yet(oid, event, "no eligible source")
        h = held.holders[node]
        why = f"{node}: {h.received}/{held.size} bytes, serving {h.serving}, seq {h.seq}"
        self._enrol(held, requester, node, offset)
        return self._answer(oid, event, Source(held, node), why)

    def _parts(self, oid: ObjectID, half: int) -> tuple[Entry, Entry] | None:
        """(the entry, its half ``half``'s holders), if ``oid`` is taken as halves here."""
        entry = self.entries.get(oid)
        if entry is None or entry.trees is None or half not in (0, 1):
            return None
        part = entry.trees.parts[half]
        return None if part is None else (entry, part)

    def _fanout(self, entry: Entry) -> int:
        """The most pulls one holder of ``entry`` should serve: the configured fan-out, or 2
        when the producer said how many will get it and a binary tree beats a chain for them
        (docs/design.md §3, "Who sends to whom")."""
        if not entry.receivers or self.fanout_for is None:
            return self.fanout
        return max(self.fanout, self.fanout_for(entry.receivers + 1, entry.size))

    def _eligible(self, entry: Entry, node: str, requester: str) -> bool:
        """``node`` may serve ``requester``: it is not (and, enrolled later, may not be)
        downstream of it. A requester not enrolled yet may still feed ``node``: an entry
        rebuilt after ownership moved knows the chains its holders announced before it
        knows every holder, and two nodes pulling from each other would each wait for the
        other until a stall timer fires (see the case
        a-requester-not-announced-yet-gets-no-holder-that-pulls-from-it of
        tests/unit/test_directory_state.py)."""
        me = entry.holders.get(requester)
        h = entry.holders[node]
        if h.received >= entry.size:
            return True
        fed = self._fed_by(entry, node, requester)
        if me is None:
            return not fed
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
