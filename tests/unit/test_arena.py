"""The arena's extent allocator: alignment, capacity, coalescing, population."""

from __future__ import annotations

import asyncio
import random

import pytest

from hoplite_client.wire.errors import CapacityError
from hoplited.memory.arena import PAGE, POPULATE_SLICE, Arena


@pytest.fixture
def arena():
    a = Arena(64 * PAGE)
    yield a
    a.close()


def test_extents_are_page_aligned_and_disjoint(arena: Arena) -> None:
    """Every extent starts on a page and no two overlap."""
    offsets = [arena.alloc(n) for n in (1, PAGE, PAGE + 1, 3 * PAGE - 7)]
    assert all(o % PAGE == 0 for o in offsets)
    assert offsets == [0, PAGE, 2 * PAGE, 4 * PAGE]


def test_full_arena_raises_capacity_error(arena: Arena) -> None:
    """Asking for more than is free is a CapacityError that says how much is free."""
    arena.alloc(60 * PAGE)
    with pytest.raises(CapacityError) as info:
        arena.alloc(5 * PAGE)
    assert info.value.data["free"] == 4 * PAGE


def test_free_coalesces_neighbours(arena: Arena) -> None:
    """Freeing in any order merges extents back into one free range."""
    offsets = [arena.alloc(4 * PAGE) for _ in range(16)]
    for i in random.Random(3).sample(range(16), 16):
        arena.free(offsets[i], 4 * PAGE)
    assert arena.used == 0 and arena.largest_free() == 64 * PAGE
    assert arena.alloc(64 * PAGE) == 0


def test_fragmentation_is_reported(arena: Arena) -> None:
    """Free space split into small holes cannot hold a big object; the error names the hole."""
    offsets = [arena.alloc(PAGE) for _ in range(64)]
    for o in offsets[::2]:
        arena.free(o, PAGE)
    with pytest.raises(CapacityError, match="largest extent"):
        arena.alloc(2 * PAGE)


async def test_populate_backs_an_extent(arena: Arena) -> None:
    """populate() succeeds on an extent and the memory is then writable."""
    off = arena.alloc(8 * PAGE)
    await arena.populate(off, 8 * PAGE)
    arena.buffer(off, 8 * PAGE)[:] = b"\x01" * (8 * PAGE)
    assert bytes(arena.buffer(off, 4)) == b"\x01" * 4


async def test_populate_remembers_backed_ranges(arena: Arena) -> None:
    """Backed ranges merge; an extent inside them needs no populate, one reaching past does."""
    assert not arena.backed(0, PAGE)
    await arena.populate(4 * PAGE, 4 * PAGE)
    await arena.populate(12 * PAGE, 2 * PAGE)
    assert arena.backed(4 * PAGE, 4 * PAGE) and arena.backed(5 * PAGE, PAGE + 1)
    assert arena.backed(12 * PAGE, 2 * PAGE)
    assert not arena.backed(3 * PAGE, 2 * PAGE)  # starts before
    assert not arena.backed(7 * PAGE, 2 * PAGE)  # ends past
    assert not arena.backed(8 * PAGE, PAGE)  # touches the end only
    await arena.populate(8 * PAGE, 4 * PAGE)  # fills the gap: one range 4..14
    assert arena.backed(4 * PAGE, 10 * PAGE)
    assert arena._backed == [4 * PAGE, 14 * PAGE]


@pytest.mark.parametrize("seed", range(30))
async def test_backed_ranges_match_a_page_set(arena: Arena, seed: int) -> None:
    """Against a set of backed pages, over random populates."""
    rng = random.Random(seed)
    pages: set[int] = set()
    for _ in range(12):
        lo = rng.randrange(64)
        n = rng.randrange(1, 65 - lo)
        await arena.populate(lo * PAGE, n * PAGE - rng.randrange(PAGE))  # rounds up to n pages
        pages |= set(range(lo, lo + n))
        for _ in range(20):
            a = rng.randrange(64)
            b = rng.randrange(a + 1, 65)
            assert arena.backed(a * PAGE, (b - a) * PAGE) == (set(range(a, b)) <= pages)
        flat = arena._backed
        assert flat == sorted(flat) and len(set(flat)) == len(flat)


@pytest.mark.parametrize(("extents", "backed", "gap"), [
    ([], [], None),  # nothing given out: nothing to keep warm
    ([4], [], (0, 8 * PAGE)),  # one extent of 4 pages: it and one more like it
    ([4], [(0, 4)], (4 * PAGE, 8 * PAGE)),  # the extent is backed: the next one's pages
    ([4], [(0, 8)], None),  # both backed
    ([4], [(2, 3), (5, 8)], (0, 2 * PAGE)),  # the first hole first
    ([4], [(0, 3), (5, 8)], (3 * PAGE, 5 * PAGE)),  # a hole between backed ranges
    ([4, 8], [(0, 12)], (12 * PAGE, 20 * PAGE)),  # the largest extent sets the reserve
    ([60], [], (0, 64 * PAGE)),  # never past the capacity
])
def test_the_pages_kept_warm_are_those_of_one_more_largest_extent(
        arena: Arena, extents: list[int], backed: list[tuple[int, int]],
        gap: tuple[int, int] | None) -> None:
    """Past the highest extent given out, one more of the largest stays backed: first fit
    places any extent no larger below that mark."""
    for pages in extents:
        arena.alloc(pages * PAGE)
    for lo, hi in backed:
        arena._mark_backed(lo * PAGE, hi * PAGE)
    assert arena.unwarmed() == gap


def test_warm_ranges_go_a_slice_at_a_time() -> None:
    """A large gap is handed out in populate slices, so allocations interleave with it."""
    big = Arena(4 * POPULATE_SLICE)
    try:
        big.alloc(POPULATE_SLICE + PAGE)
        assert big.unwarmed() == (0, POPULATE_SLICE)
        big._mark_backed(0, POPULATE_SLICE)
        assert big.unwarmed() == (POPULATE_SLICE, 2 * POPULATE_SLICE)
    finally:
        big.close()


async def test_keep_warm_backs_the_reserve_and_wakes_on_a_larger_extent(arena: Arena) -> None:
    """The daemon's warming task backs the reserve in the background, and again when a
    larger extent raises it."""
    warming = asyncio.ensure_future(arena.keep_warm())
    try:
        arena.alloc(4 * PAGE)
        for _ in range(200):
            if arena.unwarmed() is None:
                break
            await asyncio.sleep(0.01)
        assert arena.backed(0, 8 * PAGE)
        arena.alloc(16 * PAGE)  # at 4 pages: the mark moves to 20 + 16
        for _ in range(200):
            if arena.unwarmed() is None:
                break
            await asyncio.sleep(0.01)
        assert arena.backed(0, 36 * PAGE) and not arena.backed(36 * PAGE, PAGE)
    finally:
        warming.cancel()


async def test_warming_ahead_waits_while_a_put_fills_an_extent(arena: Arena) -> None:
    """Pages backed ahead would take cores from the put they are for: no slice starts while
    an extent is being filled, and warming goes on once the last fill ends (twice is fine)."""
    first, second = arena.alloc(4 * PAGE), arena.alloc(4 * PAGE)
    arena.fill_begins(first)
    arena.fill_begins(second)
    warming = asyncio.ensure_future(arena.keep_warm())
    try:
        await asyncio.sleep(0.2)
        arena.fill_ends(first)
        arena.fill_ends(first)
        await asyncio.sleep(0.2)
        assert arena.unwarmed() == (0, 12 * PAGE)
        arena.fill_ends(second)
        for _ in range(200):
            if arena.unwarmed() is None:
                break
            await asyncio.sleep(0.01)
        assert arena.backed(0, 12 * PAGE)
    finally:
        warming.cancel()
