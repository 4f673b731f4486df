"""DirectoryState, the directory shard's pure core: tables of events and exact answers."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pytest
from helpers import top_level_imports

import hoplited.directory.state as state_module
from hoplite_client.wire.errors import (
    InvalidArgumentError,
    NotOwnerError,
    ObjectExistsError,
    ObjectNotFoundError,
    PeerUnavailableError,
)
from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.locate_hints import among
from hoplited.directory.state import (
    STORY_OIDS,
    STORY_RECORDS,
    DirectoryState,
    DropCopy,
    Entry,
    Moved,
    NotYet,
    Wake,
    WakeAll,
)

pytestmark = pytest.mark.unit

ME = "me"
SIZE = 1000
OID = ObjectID(bytes(20))
OID2 = ObjectID(bytes([2]) * 20)
WAKE = [Wake(OID)]
NOT_PUT = NotYet("not put yet")
NO_SOURCE = NotYet("no eligible source")
NO_COPY = NotYet("no live complete copy")
TOMBSTONE = PeerUnavailableError("reduce input lost", node="n9")


class World:
    """A DirectoryState owned by ``ME`` plus the liveness and ownership it is injected with."""

    def __init__(self, fanout: int) -> None:
        self.dead: set[str] = set()
        self.owners: dict[ObjectID, str] = {}
        self.state = DirectoryState(fanout, lambda n: n not in self.dead,
                                    lambda oid: self.owners.get(oid, ME), ME,
                                    fanout_for=tree_pays_above_four)


def tree_pays_above_four(nodes: int, size: int) -> int:
    """The cost rule the shard is given, as a table: a binary tree for more than 4 nodes."""
    return 2 if nodes > 4 else 1


Step = Callable[[World], object]


# --- steps: each does one thing to the world and returns what a test compares ---
def put(holder: str, version: bytes = b"v1", received: int | None = None,
        inline: bytes | None = None, oid: ObjectID = OID, producing: bool = False,
        source: str | None = None, serving: int = 0, receivers: int = 0,
        moved: bool = False) -> Step:
    return lambda w: w.state.publish(oid, holder, SIZE, "<f4", [SIZE // 4], version, inline,
                                     received, producing, source, serving, receivers, moved)


def moved(holder: str, version: bytes = b"v1", received: int | None = None,
          source: str | None = None) -> Step:
    """``holder`` announces its copy again because the id's owner moved."""
    return put(holder, version, received, source=source, moved=True)


def locate(requester: str, exclude: Sequence[str] = (), offset: int = 0,
           oid: ObjectID = OID, receivers: int = 0) -> Step:
    """The chosen node (None: inline), or the NotYet."""
    def step(w: World) -> object:
        answer = w.state.try_locate(oid, requester, list(exclude), offset, among(receivers))
        return answer if isinstance(answer, NotYet) else answer.node
    return step


def wait(oid: ObjectID = OID) -> Step:
    def step(w: World) -> object:
        answer = w.state.try_wait_object(oid)
        return "ready" if isinstance(answer, Entry) else answer
    return step


def progress(holder: str, received: int, oid: ObjectID = OID) -> Step:
    return lambda w: w.state.progress(oid, holder, received)


def done(source: str, receiver: str, complete: bool, oid: ObjectID = OID) -> Step:
    return lambda w: w.state.transfer_done(oid, source, receiver, complete)


def fail(oid: ObjectID = OID) -> Step:
    return lambda w: w.state.fail(oid, TOMBSTONE)


def delete(oid: ObjectID = OID) -> Step:
    return lambda w: w.state.delete(oid)


def delete_again(version: bytes | None, oid: ObjectID = OID) -> Step:
    """The deleter sends its delete again after the owner moved (``version``: removed)."""
    return lambda w: w.state.delete(oid, version, again=True)


def retire(version: bytes, oid: ObjectID = OID) -> Step:
    """A committed ring that lost every holder retires its version before it runs again."""
    return lambda w: w.state.delete(oid, version, retire=True)


def forget(node: str) -> Step:
    def step(w: World) -> object:
        w.dead.add(node)
        return w.state.forget_node(node)
    return step


def die(node: str) -> Step:
    """The member is dead (``is_alive`` says so) but the shard was not told yet."""
    return lambda w: w.dead.add(node)


def own(oid: ObjectID, owner: str) -> Step:
    return lambda w: w.owners.__setitem__(oid, owner)


def membership() -> Step:
    return lambda w: w.state.membership_changed()


def holders(oid: ObjectID = OID) -> Step:
    """{node: (received, serving, source)} of the entry, or None if there is none."""
    def step(w: World) -> object:
        entry = w.state.entries.get(oid)
        if entry is None:
            return None
        return {n: (h.received, h.serving, h.source) for n, h in entry.holders.items()}
    return step


def version(oid: ObjectID = OID) -> Step:
    return lambda w: w.state.entries[oid].version


@dataclass(frozen=True)
class Case:
    id: str
    steps: list[tuple[Step, object]]
    fanout: int = 1


def full(serving: int = 0, source: str | None = None) -> tuple[int, int, str | None]:
    return (SIZE, serving, source)


CASES = [
    Case("the producer of an incomplete object dies: it will never exist", [
        (put("coord", received=0, producing=True), [Wake(OID)]),
        (locate("r1"), "coord"), (locate("r2"), "r1"),
        (forget("coord"), [Wake(OID)]),
        (locate("r2"), PeerUnavailableError), (wait(), PeerUnavailableError),
        (holders(), None)]),
    Case("the producer dies after a copy is complete: the copy serves", [
        (put("coord", received=0, producing=True), [Wake(OID)]),
        (locate("r1"), "coord"), (done("coord", "r1", complete=True), [Wake(OID)]),
        (forget("coord"), []), (locate("r2"), "r1")]),
    Case("a plain holder's death leaves waiters waiting for a re-put", [
        (put("a", received=10), [Wake(OID)]), (locate("r1"), "a"),
        (forget("a"), []), (wait(), NO_COPY), (holders(), {"r1": (0, 0, None)})]),
    # --- source choice ---
    Case("chain-for-receivers-arriving-together", [
        (put("src"), WAKE),
        (locate("r0"), "src"), (locate("r1"), "r0"), (locate("r2"), "r1"), (locate("r3"), "r2"),
        (holders(), {"src": full(1), "r0": (0, 1, "src"), "r1": (0, 1, "r0"),
                     "r2": (0, 1, "r1"), "r3": (0, 0, "r2")}),
    ]),
    Case("fanout-2-grows-a-tree-breadth-first", [
        # partial holders fill up in enrolment order: a binary tree, not two chains
        (put("src"), WAKE),
        (locate("r0"), "src"), (locate("r1"), "src"), (locate("r2"), "r0"),
        (locate("r3"), "r0"), (locate("r4"), "r1"), (locate("r5"), "r1"), (locate("r6"), "r2"),
    ], fanout=2),
    Case("complete-before-partial-while-under-fanout", [
        (put("src"), WAKE), (locate("a"), "src"), (progress("a", 900), []),
        (locate("b"), "src"),  # src is busier than a, but complete
    ], fanout=2),
    Case("under-fanout-before-complete", [
        (put("src"), WAKE), (locate("a"), "src"),
        (locate("b"), "a"),  # src is at its fan-out: the idle partial a is preferred
    ]),
    Case("furthest-along-partial", [
        (put("src"), WAKE), (locate("a"), "src"), (locate("b"), "src"), (locate("c"), "src"),
        (progress("a", 300), []), (progress("b", 600), []), (progress("c", 100), []),
        (locate("d"), "b"),
    ], fanout=3),
    Case("furthest-along-before-least-busy", [
        (put("src"), WAKE), (locate("a"), "src"), (locate("b"), "src"), (locate("c"), "src"),
        (locate("d"), "a"), (progress("a", 600), []), (progress("b", 300), []),
        (locate("e"), "a"),
    ], fanout=3),
    # a producer that says how many will get its object (an allreduce's result) lets the
    # shard's cost rule pick the shape of their gets
    Case("announced-receivers-make-a-tree-where-it-pays", [
        (put("p", received=0, producing=True, receivers=6), WAKE),
        (locate("r0"), "p"), (locate("r1"), "p"), (locate("r2"), "r0"), (locate("r3"), "r0"),
        (locate("r4"), "r1"), (locate("r5"), "r1"),
    ]),
    Case("few-announced-receivers-keep-the-chain", [
        (put("p", received=0, producing=True, receivers=3), WAKE),
        (locate("r0"), "p"), (locate("r1"), "r0"), (locate("r2"), "r1"),
    ]),
    Case("receivers-unknown-keep-the-configured-fanout", [
        (put("p", received=0, producing=True), WAKE),
        (locate("r0"), "p"), (locate("r1"), "r0"), (locate("r2"), "r1"), (locate("r3"), "r2"),
        (locate("r4"), "r3"),
    ]),
    Case("a-later-announcement-keeps-the-count", [
        (put("p", received=0, producing=True, receivers=6), WAKE),
        (put("p", received=500, producing=True), WAKE),  # a re-announcement without it
        (locate("r0"), "p"), (locate("r1"), "p"),
    ]),
    Case("gets-that-say-their-number-make-a-tree-where-it-pays", [
        (put("src"), WAKE),
        (locate("r0", receivers=6), "src"), (locate("r1", receivers=6), "src"),
        (locate("r2", receivers=6), "r0"), (locate("r3", receivers=6), "r0"),
    ]),
    Case("the-largest-count-heard-is-kept", [
        (put("src"), WAKE),
        (locate("r0", receivers=6), "src"), (locate("r1"), "src"),  # r1 did not say
        (locate("r2", receivers=2), "r0"), (locate("r3"), "r0"),
    ]),
    Case("a-count-said-while-waiting-for-the-put-counts-once-asked-again", [
        (locate("r0", receivers=6), NOT_PUT),  # the shard asks again on the put's Wake
        (put("src"), WAKE), (locate("r0", receivers=6), "src"),
        (locate("r1"), "src"), (locate("r2"), "r0"), (locate("r3"), "r0"),
    ]),
    Case("gets-of-few-receivers-keep-the-chain", [
        (put("src"), WAKE),
        (locate("r0", receivers=3), "src"), (locate("r1", receivers=3), "r0"),
    ]),
    Case("partial-holders-in-enrolment-order", [
        (put("src"), WAKE), (locate("a"), "src"), (locate("b"), "src"), (locate("c"), "src"),
        (locate("d"), "a"), (locate("e"), "a"), (locate("f"), "a"), (locate("g"), "b"),
    ], fanout=3),
    Case("holders-at-the-fanout-least-busy-first", [
        # when every candidate is at its fan-out, the least busy serves, partial or not
        (put("src"), WAKE), (locate("a"), "src"), (locate("b"), "a"), (locate("c"), "b"),
        (locate("d", ["src", "c"]), "a"),  # a and b serve one each: enrolment order
        (locate("e", ["src", "c", "d"]), "b"),  # a serves two now
    ]),
    Case("complete-holders-least-busy-first", [
        (put("src"), WAKE), (put("s2"), WAKE), (locate("a"), "src"), (locate("b"), "s2"),
        (locate("c"), "src"), (locate("d"), "s2"),
    ], fanout=3),
    Case("no-cycle-on-reattach", [
        (put("src"), WAKE), (locate("a"), "src"), (locate("b"), "a"),
        (locate("a", ["src"], 100), NO_SOURCE),  # b was enrolled after a: maybe downstream
        (holders(), {"src": full(1), "a": (0, 1, "src"), "b": (0, 0, "a")}),
        (put("b"), WAKE),  # ... unless it is complete
        (locate("a", ["src"], 100), "b"),
        (holders(), {"src": full(0), "a": (100, 1, "b"), "b": full(1, "a")}),
    ]),
    Case("an-orphaned-chain-reattaches-to-another-chains-idle-tail", [
        # two chains: src -> a -> c and h1 -> b -> d; then src dies
        (put("src"), WAKE), (put("h1"), WAKE),
        (locate("a"), "src"), (locate("b"), "h1"), (locate("c"), "a"), (locate("d"), "b"),
        (progress("a", 500), []), (progress("b", 500), []), (progress("c", 400), []),
        (progress("d", 400), []), (forget("src"), []),
        # d (enrolled after a, but fed by h1's chain) is idle; c is fed through a; h1 is busy
        (locate("a", ["src"], 500), "d"),
        (holders(), {"h1": full(1), "a": (500, 1, "d"), "b": (500, 1, "h1"),
                     "c": (400, 0, "a"), "d": (400, 1, "b")}),
    ]),
    Case("where-a-chain-is-unknown-enrolment-order-decides", [
        # rebuilt from announcements (ownership moved): nobody's source is known
        (put("src"), WAKE), (put("a", received=100), WAKE), (put("b", received=50), WAKE),
        (locate("a", ["src"], 100), NO_SOURCE),  # b, enrolled later, may be downstream of a
        (locate("b", ["src"], 50), "a"),
    ]),
    Case("a-requester-not-announced-yet-gets-no-holder-that-pulls-from-it", [
        # ownership moved: b announced that it pulls from a; a, whose own source died, asks
        # before its announcement arrives: b has nothing but what a sends it, and each would
        # wait for the other until a stall timer (bench.chaos seed 70 trial 11: 30 s)
        (moved("b", received=0, source="a"), WAKE),
        (locate("a", ["src"]), NO_SOURCE),
        (put("p"), WAKE), (locate("a", ["src"]), "p"),
    ]),
    Case("a-shard-rebuilt-from-announcements-knows-the-chains", [
        # ownership moved: holders announce what they pull from, in any order
        (put("c", received=400, source="a"), WAKE), (put("src"), WAKE),
        (put("a", received=500, source="src"), WAKE), (put("h1"), WAKE),
        (put("d", received=400, source="b"), WAKE), (put("b", received=500, source="h1"), WAKE),
        (holders(), {"src": full(1), "a": (500, 1, "src"), "c": (400, 0, "a"),
                     "h1": full(1), "b": (500, 1, "h1"), "d": (400, 0, "b")}),
        (forget("src"), []),
        (locate("a", ["src"], 500), "d"),  # not c: its bytes come through a
    ]),
    Case("a-busy-holder-announced-before-its-reader-is-not-taken-for-idle", [
        # b says it serves one pull; d, its reader, has not announced yet: the idle d
        # (enrolled later, chain unknown) is not eligible, and b must not look idle
        (put("h1"), WAKE), (put("b", received=500, source="h1", serving=1), WAKE),
        (put("a", received=500), WAKE), (put("e", received=450, source="h1"), WAKE),
        (locate("a", ["src"], 500), "e"),  # idle, fed by h1; b is busier
        (put("d", received=400, source="b"), WAKE),
        (holders(), {"h1": full(2), "b": (500, 1, "h1"), "a": (500, 0, "e"),
                     "e": (450, 1, "h1"), "d": (400, 0, "b")}),
    ]),
    Case("exclude-list", [
        (put("src"), WAKE), (put("other"), WAKE),
        (locate("r", ["src"]), "other"),
        (locate("s", ["src", "other"]), "r"),
        (locate("t", ["src", "other", "r", "s"]), NO_SOURCE),
    ], fanout=2),
    Case("dead-holders-are-not-sources", [
        (put("src"), WAKE), (put("other"), WAKE), (die("src"), None),
        (locate("r"), "other"),
    ]),
    Case("inline-object-needs-no-source", [
        (put("src", inline=b"x" * SIZE), WAKE),
        (locate("r"), None), (wait(), "ready"),
        (holders(), {"src": full(), "r": full()}),  # the copy it keeps is listed, once
        (locate("r"), None), (holders(), {"src": full(), "r": full()}),
        (die("src"), None), (locate("r"), None), (wait(), "ready"),
    ]),
    Case("delete-reaches-copies-of-an-inline-object", [
        (put("src", inline=b"x" * SIZE), WAKE),
        (locate("r"), None),
        (delete(), [DropCopy("src", OID), DropCopy("r", OID)]),
    ]),
    Case("requester-already-holds-it", [
        (put("src"), WAKE), (put("r"), WAKE),
        (locate("r"), "r"),
        (holders(), {"src": full(), "r": full()}),
    ]),
    # --- waiting for a put ---
    Case("late-put", [
        (locate("r"), NOT_PUT), (wait(), NOT_PUT),
        (put("src"), WAKE),
        (locate("r"), "src"), (wait(), "ready"),
    ]),
    Case("wait-needs-a-live-complete-copy", [
        (put("src", received=500), WAKE), (wait(), NO_COPY),
        (put("src"), WAKE), (wait(), "ready"),
        (die("src"), None), (wait(), NO_COPY),
    ]),
    Case("announced-partial-never-goes-back", [
        (put("n", received=400), WAKE), (put("n", received=200), WAKE),
        (holders(), {"n": (400, 0, None)}),
        (put("n"), WAKE), (holders(), {"n": full()}),
    ]),
    # --- re-put ---
    Case("second-version-refused-while-a-copy-lives", [
        (put("src"), WAKE), (put("x", version=b"v2"), ObjectExistsError),
        (holders(), {"src": full()}), (version(), b"v1"),
    ]),
    Case("re-put-after-every-copy-was-lost", [
        (put("src"), WAKE), (locate("a"), "src"), (die("src"), None),
        (put("x", version=b"v2"), [Wake(OID), DropCopy("src", OID)]),  # "a" locates again
        (holders(), {"x": full()}), (version(), b"v2"),
    ]),
    # a stripe reduced again after its reducer and its shard died: the new reducer's copy is
    # announced to the stand-in first, then the same node's partial copy of the old version,
    # re-announced late; the stale copy must not erase the entry of the copy being produced
    Case("a-late-partial-copy-of-another-version-does-not-erase-a-live-producers", [
        (put("p", version=b"v2", received=0, producing=True), WAKE),
        (put("p", received=100), ObjectExistsError),
        (put("x", received=0), ObjectExistsError),
        (version(), b"v2"), (holders(), {"p": (0, 0, None)}),
    ]),
    Case("a-producer-may-begin-its-result-again", [
        (put("p", received=0, producing=True), WAKE), (put("r", received=0), WAKE),
        (put("p", version=b"v2", received=0, producing=True), WAKE), (version(), b"v2"),
    ]),
    Case("a-dead-producers-partial-copy-gives-way", [
        (put("p", received=10, producing=True), WAKE), (die("p"), None),
        (put("x", version=b"v2", received=0), [Wake(OID), DropCopy("p", OID)]),
        (version(), b"v2"),
    ]),
    Case("same-version-from-another-holder", [
        (put("src"), WAKE), (put("x"), WAKE),
        (holders(), {"src": full(), "x": full()}),
    ]),
    # --- tombstones ---
    Case("fail-then-gets-raise-then-put-lifts", [
        (locate("r"), NOT_PUT),
        (fail(), WAKE),
        (locate("r"), PeerUnavailableError), (wait(), PeerUnavailableError),
        (put("src"), WAKE),
        (locate("r"), "src"),
    ]),
    Case("fail-ignored-while-a-complete-copy-lives", [
        (put("src"), WAKE), (fail(), []), (locate("r"), "src"),
    ]),
    Case("fail-drops-a-partial-entry", [
        (put("src", received=500), WAKE), (fail(), WAKE),
        (holders(), None), (locate("r"), PeerUnavailableError),
    ]),
    # the owner moved after the reduce failed: a receiver's partial copy announced again
    # there keeps the tombstone (it would wait for a source forever), a complete copy or a
    # new put lifts it
    Case("a-moved-partial-copy-keeps-the-tombstone", [
        (fail(), WAKE), (moved("r", received=0), []), (moved("r2", received=SIZE // 2), []),
        (holders(), None), (locate("r"), PeerUnavailableError),
        (put("p", received=0, producing=True), WAKE), (holders(), {"p": (0, 0, None)}),
    ]),
    Case("a-moved-complete-copy-lifts-the-tombstone", [
        (fail(), WAKE), (moved("src"), WAKE), (locate("r"), "src"),
    ]),
    Case("fail-when-every-copy-is-dead", [
        (put("src"), WAKE), (die("src"), None), (fail(), WAKE), (wait(), PeerUnavailableError),
    ]),
    # --- delete ---
    Case("delete-tells-every-holder", [
        (put("src"), WAKE), (locate("a"), "src"),
        (delete(), [DropCopy("src", OID), DropCopy("a", OID)]),
        (locate("r"), NOT_PUT), (delete(), ObjectNotFoundError),
    ]),
    Case("delete-removes-a-tombstone", [
        (fail(), WAKE), (delete(), []), (locate("r"), NOT_PUT),
        (delete(), ObjectNotFoundError),
    ]),
    # a holder re-announces its copy when the owner moves; one that reaches the new owner after
    # a delete must not make the object an entry again (its copies would be kept for good)
    Case("a-copy-announced-after-its-delete-is-dropped", [
        (put("src"), WAKE), (locate("a"), "src"),
        (delete(), [DropCopy("src", OID), DropCopy("a", OID)]),
        (put("a"), [DropCopy("a", OID)]),
        (put("b", received=SIZE // 2, source="a"), [DropCopy("b", OID)]),
        (holders(), None), (locate("r"), NOT_PUT), (delete(), ObjectNotFoundError),
    ]),
    Case("a-put-again-after-a-delete-is-a-new-object", [
        (put("src"), WAKE), (delete(), [DropCopy("src", OID)]),
        (put("src", version=b"v2"), WAKE), (holders(), {"src": full()}),
        (put("late", version=b"v1"), ObjectExistsError),  # the deleted one, refused
        (delete(), [DropCopy("src", OID)]),
        (put("late", version=b"v2"), [DropCopy("late", OID)]),
    ]),
    # a delete that reaches the new owner before any holder's re-announcement finds no entry:
    # the copies announced again after the move go, whatever their version; a new put does not
    Case("a-delete-before-any-re-announcement-drops-the-moved-copies", [
        (delete(), ObjectNotFoundError),
        (moved("a"), [DropCopy("a", OID)]),
        (moved("b", version=b"v0", received=SIZE // 2, source="a"), [DropCopy("b", OID)]),
        (holders(), None), (locate("r"), NOT_PUT),
        (put("c", version=b"v2"), WAKE), (holders(), {"c": full()}),
        (moved("a"), [DropCopy("a", OID)]),  # the entry of the new put stands
    ]),
    Case("a-put-lifts-a-delete-that-found-no-entry", [
        (delete(), ObjectNotFoundError), (put("src"), WAKE),
        (moved("a", version=b"v1"), WAKE), (holders(), {"src": full(), "a": full()}),
    ]),
    Case("deleted-twice-the-version-known-first-stays", [
        (put("src"), WAKE), (delete(), [DropCopy("src", OID)]),
        (delete(), ObjectNotFoundError),
        (put("late"), [DropCopy("late", OID)]),  # a late publish of the deleted version
        (moved("b", version=b"v2"), WAKE),  # another version: a put the deletes never saw
    ]),
    # the deleter sends its delete again to the id's new owner (its first delete went to an
    # owner that died, or to a stand-in that gave the id back): only the version it removed goes
    Case("a-delete-sent-again-removes-the-version-it-deleted", [
        (moved("a"), WAKE), (moved("b"), WAKE),
        (delete_again(b"v1"), [DropCopy("a", OID), DropCopy("b", OID)]),
        (moved("c"), [DropCopy("c", OID)]), (holders(), None),
        (delete_again(b"v1"), []),  # nothing here is no error
    ]),
    Case("a-delete-sent-again-keeps-another-version", [
        (put("src", version=b"v2"), WAKE),
        (delete_again(b"v1"), []), (holders(), {"src": full()}),
        (delete_again(None), InvalidArgumentError),  # it could not tell a put made since
        (holders(), {"src": full()}),
    ]),
    Case("a-delete-sent-again-before-the-late-copy", [
        (delete_again(b"v1"), []), (holders(), None),
        (moved("a"), [DropCopy("a", OID)]),
        (moved("b", version=b"v2"), WAKE), (holders(), {"b": full()}),
    ]),
    # a committed ring that lost every holder retires its version before it runs again
    # (DirectoryClient.retire, docs/design.md §4, "Ring allreduce"): a member's late publish of
    # it is refused, waiters keep waiting, and the next run's version is the object
    Case("a-retired-version-is-refused-and-the-next-run-is-put", [
        (wait(), NOT_PUT), (retire(b"v1"), []),
        (put("late"), [DropCopy("late", OID)]), (wait(), NOT_PUT),
        (put("next", version=b"v2"), WAKE), (wait(), "ready"),
        (put("late"), ObjectExistsError), (holders(), {"next": full()}),
    ]),
    # its copies go, a receiver's too (it is told they are withdrawn, not deleted: its get
    # fetches the next version)
    Case("a-retired-version-drops-its-copies-and-receivers", [
        (put("a"), WAKE), (put("b"), WAKE), (locate("r"), "a"), (die("a"), None),
        (retire(b"v1"), [DropCopy("a", OID), DropCopy("b", OID), DropCopy("r", OID)]),
        (locate("r"), NOT_PUT), (put("next", version=b"v2"), WAKE), (locate("r"), "next"),
    ]),
    Case("a-retire-keeps-another-version-and-needs-one", [
        (put("src", version=b"v2"), WAKE), (retire(b"v1"), []), (holders(), {"src": full()}),
        (lambda w: w.state.delete(OID, None, retire=True), InvalidArgumentError),
    ]),
    # a put again while the old version's holder was silent: that holder, once it runs again,
    # keeps a copy nobody would find or delete, so it drops it; a live receiver does not
    Case("a-re-put-has-the-silent-holders-of-the-old-version-drop-theirs", [
        (put("src"), WAKE), (locate("r"), "src"), (die("src"), None),
        (put("again", version=b"v2"), [Wake(OID), DropCopy("src", OID)]),
        (holders(), {"again": full()}),
    ]),
    # a whole copy of another version, announced after a move, is one nobody would find:
    # it goes; a partial one is a receiver that locates again; a new put is refused as before
    Case("a-moved-whole-copy-of-another-version-is-dropped", [
        (put("src", version=b"v2"), WAKE),
        (moved("old"), [DropCopy("old", OID)]),
        (moved("recv", received=SIZE // 2, source="x"), []),
        (holders(), {"src": full()}),
        (put("new"), ObjectExistsError),
    ]),
    Case("a-delete-is-remembered-per-id", [
        (put("src"), WAKE), (put("src", oid=OID2), [Wake(OID2)]),
        (delete(), [DropCopy("src", OID)]),
        (put("a", oid=OID2), [Wake(OID2)]), (put("a"), [DropCopy("a", OID)]),
    ]),
    # --- node death ---
    Case("forget-dead-receiver-frees-its-source-slot", [
        (put("src"), WAKE), (locate("a"), "src"),
        (forget("a"), []),
        (holders(), {"src": full()}),
        (locate("b"), "src"),
    ]),
    Case("forget-dead-source-orphans-its-receivers", [
        (put("src"), WAKE), (locate("a"), "src"), (locate("b"), "a"),
        (forget("a"), []),
        (holders(), {"src": full(), "b": (0, 0, None)}),
        (locate("b"), "src"),
        (holders(), {"src": full(1), "b": (0, 0, "src")}),
    ]),
    Case("forget-unknown-node", [
        (put("src"), WAKE), (forget("zz"), []), (holders(), {"src": full()}),
    ]),
    # --- ownership ---
    Case("membership-change-drops-entries-owned-elsewhere", [
        (put("src"), WAKE), (put("src", oid=OID2), [Wake(OID2)]),
        (own(OID2, "other"), None),
        (membership(), [Moved(OID2), WakeAll()]),
        (holders(OID2), None), (locate("r", oid=OID2), NotOwnerError),
        (locate("r"), "src"),
        (membership(), [WakeAll()]),
    ]),
    Case("requests-for-foreign-ids-are-refused", [
        (own(OID, "other"), None),
        (locate("r"), NotOwnerError), (wait(), NotOwnerError), (put("src"), NotOwnerError),
        (fail(), NotOwnerError), (delete(), NotOwnerError),
    ]),
    # --- progress and transfer reports: duplicate, out of order, stale ---
    Case("progress-never-goes-backwards", [
        (put("src"), WAKE), (locate("a"), "src"),
        (progress("a", 500), []), (progress("a", 300), []),  # out of order
        (holders(), {"src": full(1), "a": (500, 0, "src")}),
        (progress("a", 500), []),  # duplicate
        (progress("zz", 900), []), (progress("a", 900, oid=OID2), []),  # unknown: ignored
        (holders(), {"src": full(1), "a": (500, 0, "src")}),
        (put("other"), WAKE),
        (locate("a", ["src"], 100), "other"),  # resuming from an older offset
        (holders(), {"src": full(0), "a": (500, 0, "other"), "other": full(1)}),
    ]),
    Case("transfer-done-frees-the-slot-once", [
        (put("src"), WAKE), (locate("a"), "src"),
        (done("src", "a", False), WAKE), (done("src", "a", False), WAKE),
        (holders(), {"src": full(), "a": (0, 0, None)}),
    ]),
    Case("transfer-done-from-a-stale-source", [
        (put("src"), WAKE), (locate("a"), "src"), (put("other"), WAKE),
        (locate("a", ["src"], 200), "other"),
        (done("src", "a", False), WAKE),
        (holders(), {"src": full(0), "a": (200, 0, "other"), "other": full(1)}),
        (done("src", "a", True), WAKE),  # its bytes still count
        (holders(), {"src": full(0), "a": full(0, "other"), "other": full(1)}),
        (done("other", "a", True), WAKE),
        (holders(), {"src": full(0), "a": full(), "other": full(0)}),
    ]),
    Case("transfer-done-for-unknown-ids-and-receivers", [
        (done("src", "a", True), []),
        (put("src"), WAKE), (done("src", "zz", True), WAKE),
        (holders(), {"src": full()}),
    ]),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_directory_state(case: Case) -> None:
    w = World(case.fanout)
    for i, (step, expected) in enumerate(case.steps):
        if isinstance(expected, type) and issubclass(expected, BaseException):
            with pytest.raises(BaseException) as info:
                step(w)
            assert type(info.value) is expected, f"step {i}"
        else:
            assert step(w) == expected, f"step {i}"


def test_tombstone_is_the_error_given_to_fail() -> None:
    w = World(1)
    w.state.fail(OID, TOMBSTONE)
    with pytest.raises(PeerUnavailableError) as info:
        w.state.try_locate(OID, "r", [], 0)
    assert info.value is TOMBSTONE


def test_not_owner_names_the_owner() -> None:
    w = World(1)
    w.owners[OID] = "elsewhere"
    with pytest.raises(NotOwnerError) as info:
        w.state.try_locate(OID, "r", [], 0)
    assert info.value.data["owner"] == "elsewhere"


def test_story_says_why_each_source_was_chosen() -> None:
    w = World(1)
    for step in (locate("r0"), locate("r0"), put("src"), locate("r0"), locate("r1"),
                 progress("r0", 10), done("src", "r0", True), locate("r2", ["src"]),
                 forget("r1"), fail(), delete()):
        step(w)
    assert w.state.story(OID) == [
        ("locate by r0 exclude=[] offset=0", "not yet: not put yet"),  # asked twice, kept once
        ("publish by src 1000/1000 bytes", "new entry"),
        ("locate by r0 exclude=[] offset=0", "source src: 1000/1000 bytes, serving 0, seq 0"),
        ("locate by r1 exclude=[] offset=0", "source r0: 0/1000 bytes, serving 0, seq 1"),
        ("transfer src->r0 done complete=True", "slot freed"),
        ("locate by r2 exclude=['src'] offset=0",  # r0 is complete but at its fan-out
         "source r1: 0/1000 bytes, serving 0, seq 2"),
        ("r1 died", "holder removed, orphaned ['r2']"),
        ("fail", "ignored: a live complete copy exists"),
        ("delete", "holders ['r0', 'r2', 'src'] drop their copies"),
    ]
    assert w.state.story(OID2) == []


def test_story_of_a_re_put_and_a_lifted_tombstone() -> None:
    w = World(1)
    for step in (fail(), locate("r"), put("a"), die("a"), put("b", version=b"v2"),
                 put("c", version=b"v3")):
        try:
            step(w)
        except (PeerUnavailableError, ObjectExistsError):
            pass
    assert [outcome for _, outcome in w.state.story(OID)] == [
        f"tombstone: {TOMBSTONE}", f"failed: {TOMBSTONE}", "new entry, tombstone lifted",
        "re-put: every copy was lost; ['a'] drop theirs",
        "refused: a complete copy of another version is on b"]


@pytest.mark.parametrize("first,why", [
    (put("src"), "a complete copy of another version is on src"),
    (put("p", received=10, producing=True), "p is producing another version"),
], ids=["a complete copy", "a producer"])
def test_a_refused_put_says_which_version_stands_and_where(first: Step, why: str) -> None:
    """The error a refused put raises (and the story) name what holds the other version: a
    reduce that failed so in CI could then be traced from its log alone."""
    w = World(1)
    first(w)
    with pytest.raises(ObjectExistsError) as info:
        put("x", version=b"v2")(w)
    assert str(info.value) == f"object {OID.hex()} already exists: {why}"
    assert w.state.story(OID)[-1][1] == f"refused: {why}"


def test_story_is_bounded_per_oid_and_in_oids() -> None:
    w = World(1)
    for i in range(STORY_RECORDS + 10):
        w.state.publish(OID, f"n{i}", SIZE, "<f4", [SIZE // 4], b"v1", None)
    story = w.state.story(OID)
    assert len(story) == STORY_RECORDS
    assert story[-1] == (f"publish by n{STORY_RECORDS + 9} 1000/1000 bytes", "updated")
    oids = [ObjectID(i.to_bytes(20, "big")) for i in range(1, STORY_OIDS + 1)]
    for oid in oids:
        w.state.try_locate(oid, "r", [], 0)
    assert w.state.story(OID) == []  # the oldest written is evicted first
    assert w.state.story(oids[0]) != [] and w.state.story(oids[-1]) != []


def test_deletes_remembered_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The oldest deleted versions are forgotten first: an announcement of one of those makes
    an entry again, as before deletes were remembered; the newest are still refused."""
    monkeypatch.setattr(state_module, "DELETED_MAX", 3)
    w = World(fanout=1)
    oids = [ObjectID(bytes([i]) * 20) for i in range(1, 6)]
    for oid in oids:
        put("src", oid=oid)(w)
        delete(oid)(w)
    assert list(w.state.deleted) == oids[2:]
    assert put("late", oid=oids[0])(w) == [Wake(oids[0])]
    assert put("late", oid=oids[4])(w) == [DropCopy("late", oids[4])]


def test_pure_module_imports_no_io() -> None:
    assert not top_level_imports(state_module) & {"asyncio", "socket", "time", "logging", "random"}
