"""DirectoryState for a broadcast taken as two trees of halves (docs/design.md §3): tables of
locates and the sources they get, plus the trees' placement arithmetic (``tree.half_*``)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from hoplite_client.wire.errors import (
    InvalidArgumentError,
    ObjectNotFoundError,
    PeerUnavailableError,
)
from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.locate_hints import Half, among
from hoplited.collectives.choose import Known, Settings, bounds, broadcast_shape
from hoplited.collectives.tree import (
    half_parent,
    half_position,
    half_receiver,
)
from hoplited.directory.state import DirectoryState, NotYet, Source, Split

pytestmark = pytest.mark.unit

ME = "me"
SIZE = 1 << 20
HALVES = [(0, SIZE // 2), (SIZE // 2, SIZE)]
OID = ObjectID(bytes(20))
V1 = b"v1"


class World:
    """A DirectoryState owned by ``ME`` (fan-out 1) whose rule splits any object that says it
    has at least two receivers, and the liveness it is injected with."""

    def __init__(self) -> None:
        self.dead: set[str] = set()
        self.state = DirectoryState(
            1, lambda n: n not in self.dead, lambda oid: ME, ME,
            halves_for=lambda n, size, dtype: HALVES if n >= 2 else None)


Step = Callable[[World], object]


def put(holder: str) -> Step:
    def step(w: World) -> object:
        w.state.publish(OID, holder, SIZE, "float32", [SIZE // 4], V1, None)
        return None
    return step


def produce(holder: str) -> Step:
    """``holder`` computes the object and says 4 will get it (a reduce's result)."""
    def step(w: World) -> object:
        w.state.publish(OID, holder, SIZE, "float32", [SIZE // 4], V1, None, 0,
                        producing=True, receivers=4)
        return None
    return step


def answer(a: Source | Split | NotYet) -> object:
    if isinstance(a, Split):
        return ("split", a.index)
    if isinstance(a, NotYet):
        return ("wait", a.reason.split()[3]) if a.ring else "not yet"
    return a.node


def get(requester: str, receivers: int = 4, offset: int = 0) -> Step:
    """A locate of the whole object by ``requester``, saying ``receivers``."""
    def step(w: World) -> object:
        return answer(w.state.try_locate(OID, requester, [], offset, among(receivers)))
    return step


def half(requester: str, h: int, exclude: tuple[str, ...] = (),
         patient: bool = True, told: int = -1) -> Step:
    """A locate of half ``h`` by ``requester``; ``told``: the index it says it was given at
    its split (of trees for 4 receivers, the halves of HALVES), as hoplited's fetcher says."""
    def step(w: World) -> object:
        claim = (Half(half=h, index=-1, receivers=0, window=None) if told < 0
                 else Half(half=h, index=told, receivers=4, window=list(HALVES[h])))
        return answer(w.state.try_locate(OID, requester, exclude, 0, claim, patient=patient))
    return step


def done(requester: str, source: str, h: int) -> Step:
    """``requester``'s pull of half ``h`` (-1: the whole object) from ``source`` completed."""
    def step(w: World) -> object:
        w.state.transfer_done(OID, source, requester, True, h)
        return None
    return step


def die(node: str) -> Step:
    def step(w: World) -> object:
        w.dead.add(node)
        w.state.forget_node(node)
        return None
    return step


def holders(w: World) -> object:
    entry = w.state.entries[OID]
    return sorted(entry.complete_holders())


# n = 4: tree 0 in order (a top, its children b and c, d under b); tree 1 rotated by 2
# (c top, d and a its children, b under d). Receivers a b c d in that order.
FOUR = [get("a"), get("b"), get("c"), get("d")]

CASES = {
    "receivers split in the order they ask": (
        [put("src"), *FOUR], [None, ("split", 0), ("split", 1), ("split", 2), ("split", 3)]),
    "tree 0: the first receiver pulls from the holder, the rest from their parents": (
        [put("src"), *FOUR, half("a", 0), half("b", 0), half("c", 0), half("d", 0)],
        [None, *[("split", i) for i in range(4)], "src", "a", "a", "b"]),
    "tree 1: rotated by n // 2, so the inner receivers differ": (
        [put("src"), *FOUR, half("c", 1), half("d", 1), half("a", 1), half("b", 1)],
        [None, *[("split", i) for i in range(4)], "src", "c", "c", "d"]),
    "a receiver whose parent has not asked waits for it": (
        [put("src"), get("a"), half("a", 1)], [None, ("split", 0), ("wait", "2")]),
    "... and, impatient, takes the usual choice": (
        [put("src"), get("a"), half("a", 1, patient=False)], [None, ("split", 0), "src"]),
    "a parent that asked for the whole may already be pulled from": (
        [put("src"), get("a"), get("b"), half("b", 0)],
        [None, ("split", 0), ("split", 1), "a"]),
    "a dead parent: the usual choice": (
        [put("src"), *FOUR, half("a", 0), die("a"), half("b", 0)],
        [None, *[("split", i) for i in range(4)], "src", None, "src"]),
    "an excluded parent: the usual choice": (
        [put("src"), *FOUR, half("a", 0), half("b", 0, exclude=("a",))],
        [None, *[("split", i) for i in range(4)], "src", "src"]),
    "receivers past the count take the usual choice": (
        [put("src"), get("a", 2), get("b", 2), get("c", 2), half("a", 0), half("c", 0)],
        [None, ("split", 0), ("split", 1), ("split", 2), "src", "a"]),
    "both halves complete make a holder of the whole, which is then a source": (
        [put("src"), get("a", 2), get("b", 2), half("a", 0), done("a", "src", 0),
         half("a", 1), done("a", "b", 1), holders, die("src"), get("z", 0, offset=10),
         get("y", 0)],
        [None, ("split", 0), ("split", 1), "src", None, "b", None, ["a", "src"], None, "a",
         ("split", 2)]),
    "a requester holding both halves is its own source": (
        [put("src"), get("a", 2), half("a", 0), done("a", "src", 0), half("a", 0)],
        [None, ("split", 0), "src", None, "a"]),
    "a result still produced is not split: its gets chain behind it, overlapping": (
        [produce("root"), get("a"), get("b")], [None, "root", "a"]),
    "no count said: one tree": (
        [put("src"), get("a", 0), get("b", 0)], [None, "src", "a"]),
    "one receiver said: one tree (the rule declines)": (
        [put("src"), get("a", 1)], [None, "src"]),
    "a receiver resuming a partial copy keeps its tree": (
        [put("src"), get("a", 0), get("b", 4, offset=100)], [None, "src", "a"]),
    "an entry rebuilt after its shard moved learns the trees from the halves' locates": (
        [put("src"), half("b", 0, told=1), half("a", 0, told=0), half("b", 0, told=1),
         half("b", 1, told=1, patient=False), get("z")],
        [None, ("wait", "0"), "src", "a", "src", "src"]),
    "a receiver whose halves a rebuilt entry never heard of says it has the whole": (
        [put("src"), half("b", 0, told=1, patient=False), done("b", "b", -1), holders],
        [None, "src", None, ["b", "src"]]),
    "... which an entry never split does not take from anyone": (
        [put("src"), done("b", "b", -1), holders], [None, None, ["src"]]),
    "a whole-object pull never picks a receiver still taking halves": (
        [put("src"), get("a"), get("z", 0, offset=10)], [None, ("split", 0), "src"]),
}


@pytest.mark.parametrize("steps, expected", list(CASES.values()), ids=list(CASES))
def test_locates_in_halves(steps: list[Step], expected: list[object]) -> None:
    w = World()
    assert [step(w) for step in steps] == expected


def test_a_half_of_an_object_never_split_is_a_typed_error() -> None:
    w = World()
    put("src")(w)
    with pytest.raises(PeerUnavailableError, match="two halves"):
        w.state.try_locate(OID, "a", [], 0, Half(half=0, index=-1, receivers=0, window=None))


@pytest.mark.parametrize("window, match", [
    ((0, SIZE), "not half 0"), ((1, SIZE // 2), "not half 0"), ((0, SIZE + 1), "not half 0")])
def test_a_claimed_window_must_be_that_half(window: tuple[int, int], match: str) -> None:
    w = World()
    put("src")(w)
    with pytest.raises(InvalidArgumentError, match=match):
        w.state.try_locate(OID, "a", [], 0,
                           Half(half=0, index=0, receivers=4, window=list(window)))


def test_a_window_that_differs_from_the_split_is_refused() -> None:
    w = World()
    for step in [put("src"), get("a")]:
        step(w)
    with pytest.raises(InvalidArgumentError, match="not half 1"):
        w.state.try_locate(OID, "a", [], 0, Half(half=1, index=0, receivers=4, window=[0, 10]))


def test_a_half_of_an_object_not_put_waits_and_a_deleted_one_is_gone() -> None:
    w = World()
    assert isinstance(w.state.try_locate(
        OID, "a", [], 0, Half(half=0, index=-1, receivers=0, window=None)), NotYet)
    put("src")(w)
    get("a")(w)
    drops = w.state.delete(OID)
    assert sorted(d.node for d in drops) == ["a", "src"]  # the receiver's copy is dropped
    with pytest.raises(ObjectNotFoundError):
        w.state.delete(OID)


def test_a_dead_receiver_frees_its_parents_slot_and_orphans_its_children() -> None:
    w = World()
    for step in [put("src"), *FOUR, half("a", 0), half("b", 0), half("d", 0)]:
        step(w)
    part = w.state.entries[OID].trees.parts[0]  # type: ignore[union-attr]
    assert (part.holders["a"].serving, part.holders["d"].source) == (1, "b")
    die("b")(w)
    assert "b" not in part.holders and part.holders["a"].serving == 0
    assert part.holders["d"].source is None


def test_eviction_needs_no_reader_in_either_half() -> None:
    w = World()
    for step in [put("src"), put("other"), get("a", 2), half("a", 0)]:
        step(w)
    assert not w.state.may_drop(OID, "src", V1).allowed  # a pulls half 0 from it
    done("a", "src", 0)(w)
    assert w.state.may_drop(OID, "src", V1).allowed
    part = w.state.entries[OID].trees.parts[0]  # type: ignore[union-attr]
    assert "src" not in part.holders


@pytest.mark.parametrize("n", [*range(1, 40), 255, 999, 1000])
def test_the_two_trees_place_every_receiver_once_and_inner_in_one_tree_at_most(
        n: int) -> None:
    children: list[dict[int | None, int]] = [{}, {}]
    for h in (0, 1):
        positions = [half_position(n, h, i) for i in range(n)]
        assert sorted(positions) == list(range(1, n + 1))
        for i in range(n):
            assert half_receiver(n, h, half_position(n, h, i)) == i
            up = half_parent(n, h, i)
            children[h][up] = children[h].get(up, 0) + 1
        assert children[h][None] == 1  # one top, under the holder of the whole
    for i in range(n):
        sends = sum(children[h].get(i, 0) for h in (0, 1))
        assert sends <= 2, f"receiver {i} of {n} sends {sends} halves"
        assert min(children[0].get(i, 0), children[1].get(i, 0)) == 0


@pytest.mark.parametrize("mode, receivers, size, dtype, expected", [
    ("never", 1000, 32 << 20, "float32", None),
    ("always", 1, 32 << 20, "float32", None),
    ("always", 4, 32 << 20, "float32", [(0, 16 << 20), (16 << 20, 32 << 20)]),
    ("always", 4, 1000, "float32", None),  # halves small enough to go inline
    ("always", 4, 32 << 20, "not-a-dtype", None),
    ("auto", 7, 32 << 20, "float32", None),  # a chain at N = 8 on 1 Gbit/s
    ("auto", 999, 32 << 20, "float32", [(0, 16 << 20), (16 << 20, 32 << 20)]),
])
def test_when_a_broadcast_is_split(mode: str, receivers: int, size: int, dtype: str,
                                   expected: list[tuple[int, int]] | None) -> None:
    known = Known(receivers, size, dtype, link=(125e6, 1e-4), settings=Settings(two_trees=mode))
    assert bounds(broadcast_shape(known)) == expected
