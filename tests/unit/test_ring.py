"""The ring allreduce's pure core: each member's schedule agrees with its predecessor's, the
schedules run to the full result on every member, and the choice of members (docs/design.md
§4, "Ring allreduce")."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import top_level_imports

import hoplited.collectives.ring as ring_module
from hoplited.collectives.choose import ring_pays
from hoplited.collectives.layout import ALIGN
from hoplited.collectives.ring import (
    RING_MAX,
    SEGMENT,
    chunk_segments,
    ring_cost,
    ring_members,
    ring_schedule,
)

pytestmark = pytest.mark.unit

MIB = 1 << 20
SHAPES = [  # (size in bytes, itemsize, members, segment)
    (8 * MIB, 4, 4, SEGMENT), (3 * MIB + 12, 4, 3, SEGMENT), (80 << 10, 8, 2, SEGMENT),
    (5 * ALIGN + 8, 8, 7, SEGMENT), (1 * MIB, 4, 8, 64 << 10), (4 * MIB + 36, 12, 5, 256 << 10),
    (65540, 4, 9, SEGMENT),
]


def sends(size: int, itemsize: int, n: int, p: int, segment: int) -> list[tuple[int, int]]:
    """What member ``p`` sends, in order: its first ranges, then each forwarded receive."""
    sched = ring_schedule(size, itemsize, n, p, segment)
    return [*sched.first, *((s.lo, s.hi) for s in sched.receive if s.forward)]


@pytest.mark.parametrize("size,itemsize,n,segment", SHAPES)
def test_each_member_receives_what_its_predecessor_sends(size: int, itemsize: int, n: int,
                                                         segment: int) -> None:
    for p in range(n):
        sched = ring_schedule(size, itemsize, n, p, segment)
        assert [(s.lo, s.hi) for s in sched.receive] == sends(size, itemsize, n, (p - 1) % n,
                                                              segment)
        assert all(0 < s.hi - s.lo <= max(segment, itemsize) and s.lo % itemsize == 0
                   for s in sched.receive)
        # 2(n-1) chunks of about size/n each way: the ring's bound
        assert sum(s.hi - s.lo for s in sched.receive) <= 2 * (n - 1) * (size // n + ALIGN *
                                                                          itemsize)


@pytest.mark.parametrize("size,itemsize,n,segment", SHAPES)
def test_the_schedules_leave_the_sum_on_every_member(size: int, itemsize: int, n: int,
                                                     segment: int) -> None:
    """Run every member's schedule, one segment at a time round the ring, on byte arrays:
    each result is the elementwise sum (here: of uint8 lanes, exact mod 256)."""
    rng = np.random.default_rng(size + n)
    inputs = [rng.integers(0, 256, size, dtype=np.uint8) for _ in range(n)]
    results = [np.zeros(size, dtype=np.uint8) for _ in range(n)]
    scheds = [ring_schedule(size, itemsize, n, p, segment) for p in range(n)]
    # what each member has queued for its successor: (array, lo, hi), in order
    queues: list[list[tuple[np.ndarray, int, int]]] = [
        [(inputs[p], lo, hi) for lo, hi in scheds[p].first] for p in range(n)]
    got = [0] * n
    while any(got[p] < len(scheds[p].receive) for p in range(n)):
        moved = False
        for p in range(n):
            pred = (p - 1) % n
            if got[p] < len(scheds[p].receive) and queues[pred]:
                src, lo, hi = queues[pred].pop(0)
                seg = scheds[p].receive[got[p]]
                assert (seg.lo, seg.hi) == (lo, hi)
                results[p][lo:hi] = src[lo:hi]
                if seg.add:
                    results[p][lo:hi] += inputs[p][lo:hi]
                if seg.forward:
                    queues[p].append((results[p], lo, hi))
                got[p] += 1
                moved = True
        assert moved, "the ring deadlocked"
    expected = np.sum(inputs, axis=0, dtype=np.uint8)
    for p in range(n):
        np.testing.assert_array_equal(results[p], expected)
        assert not queues[p]


@pytest.mark.parametrize("lo,hi,itemsize,segment", [
    (0, 10 * MIB, 4, MIB), (4096, 4096 + 3 * MIB + 12, 12, MIB), (0, 100, 8, MIB),
    (0, 5 * 4096, 4, 4096), (0, 24, 12, 1)])
def test_chunk_segments_tile_on_elements(lo: int, hi: int, itemsize: int, segment: int) -> None:
    segs = chunk_segments(lo, hi, itemsize, segment)
    assert segs[0][0] == lo and segs[-1][1] == hi
    assert all(a[1] == b[0] for a, b in zip(segs, segs[1:]))
    assert all((a - lo) % itemsize == 0 for a, _ in segs)
    assert all(b - a <= max(segment, itemsize) for a, b in segs)


@pytest.mark.parametrize("ready,n,expected", [
    ({0: ["a"], 1: ["b"], 2: ["c"]}, 3, [("a", (0,)), ("b", (1,)), ("c", (2,))]),
    ({0: ["c"], 1: ["a"], 2: ["b"]}, 3, [("a", (1,)), ("b", (2,)), ("c", (0,))]),
    ({0: ["a", "b"], 1: ["a"]}, 2, [("a", (1,)), ("b", (0,))]),  # a reassignment frees "a"
    ({0: ["a", "b"], 1: ["b", "a"]}, 2, [("a", (0,)), ("b", (1,))]),
    ({0: ["a"], 1: ["a"], 2: ["b"]}, 3, [("a", (0, 1)), ("b", (2,))]),  # "a" adds both
    # as many members as can be: "b" takes 0 so that "a" and "c" take one each, and input 3
    # (only on "a" and "c") goes to the holder adding fewer, ties by id
    ({0: ["a", "b"], 1: ["a"], 2: ["c"], 3: ["c", "a"]}, 4,
     [("a", (1, 3)), ("b", (0,)), ("c", (2,))]),
    ({0: ["a", "b"], 1: ["a"], 2: ["a"]}, 3, [("a", (1, 2)), ("b", (0,))]),
    # input 2 finds "a" and "b" taken: 1 moves to "c", 0 to "b", and 2 takes "a"
    ({0: ["a", "b"], 1: ["b", "c"], 2: ["a", "b"]}, 3, [("a", (2,)), ("b", (0,)), ("c", (1,))]),
    ({0: ["a"], 1: ["a"]}, 2, None),  # every input on one node: no ring
    ({0: [], 1: ["a"]}, 2, None),  # an input with no live holder
    ({0: ["a"], 1: ["b"]}, 3, None),  # an input not ready
    ({0: ["a"], 2: ["b"]}, 2, None),  # an index that is not an input's
    ({0: ["a"]}, 1, None),  # one member is no ring
])
def test_ring_members(ready: dict[int, list[str]], n: int,
                      expected: list[tuple[str, tuple[int, ...]]] | None) -> None:
    assert ring_members(ready, n) == expected


def test_a_spent_matching_budget_leaves_an_input_with_a_busy_holder() -> None:
    """With no holders left to look at, the input that needed a path is added by the holder
    adding fewest: fewer members, still every input in the ring."""
    ready = {0: ["a", "b"], 1: ["b", "c"], 2: ["a", "b"]}
    assert ring_members(ready, 3, budget=0) == [("a", (0, 2)), ("b", (1,))]


def test_a_path_through_thousands_of_nodes_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """Input i sits on nodes a_i and a_i+1, input m on a_0 and c, input m+1 on c only: input
    m's only way in is a path that moves every other input one node along, 5,000 deep: past
    Python's recursion limit, so the search must not recurse."""
    monkeypatch.setattr(ring_module, "RING_MAX", 10_000)
    m = 5_000
    ready = {i: [f"a{i:05d}", f"a{i + 1:05d}"] for i in range(m)}
    ready[m] = ["a00000", "c"]
    ready[m + 1] = ["c"]
    members = ring_members(ready, m + 2)
    assert members is not None and len(members) == m + 2
    assert dict(members) == {"a00000": (m,), "c": (m + 1,),
                             **{f"a{i + 1:05d}": (i,) for i in range(m)}}


def test_rings_have_a_size_limit_in_nodes_not_inputs() -> None:
    ready = {i: [f"n{i:04d}"] for i in range(RING_MAX + 1)}
    assert ring_members(ready, RING_MAX + 1) is None
    ready[RING_MAX] = ["n0000"]  # one node adding two inputs: RING_MAX members
    members = ring_members(ready, RING_MAX + 1)
    assert members is not None and len(members) == RING_MAX
    assert members[0] == ("n0000", (0, RING_MAX))


GBIT = 125e6  # bytes per second


@pytest.mark.parametrize("n,size,bandwidth,latency,pays", [
    (8, MIB, GBIT, 200e-6, True),  # 2(n-1) steps of 0.2 ms are less than a second S/B
    (8, 256 * MIB, GBIT, 200e-6, True),
    (2, 80 << 10, GBIT, 200e-6, True),
    (64, 32 * MIB, GBIT, 200e-6, True),
    (256, MIB, GBIT, 200e-6, False),  # 510 steps: a tree up and down is quicker
    (64, 128 << 10, GBIT, 200e-6, False),
    (1, MIB, GBIT, 200e-6, False),
    (RING_MAX + 1, 1 << 30, GBIT, 200e-6, False),
])
def test_ring_pays(n: int, size: int, bandwidth: float, latency: float, pays: bool) -> None:
    assert ring_pays(n, size, bandwidth, latency) is pays


def test_ring_cost_is_the_rings_bound_plus_its_steps() -> None:
    assert ring_cost(8, 8 * MIB, GBIT, 0.0) == pytest.approx(2 * 7 / 8 * 8 * MIB / GBIT)
    assert ring_cost(8, 0, GBIT, 1e-3) == pytest.approx(14e-3)


def test_a_ring_of_one_is_refused() -> None:
    with pytest.raises(ValueError):
        ring_schedule(MIB, 4, 1, 0)
    with pytest.raises(ValueError):
        ring_schedule(MIB, 4, 3, 3)


def test_the_core_does_no_io() -> None:
    assert not {"asyncio", "socket", "time"} & top_level_imports(ring_module)
