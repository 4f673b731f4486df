"""The arena's extent allocator: alignment, capacity, coalescing, population."""

from __future__ import annotations

import random

import pytest

from hoplite_client.wire.errors import CapacityError
from hoplited.memory.arena import PAGE, Arena


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
