"""Composite objects: stripes are views of one allocation, written in place, and the whole
completes when every region has been filled (docs/design.md §4, "Striped allreduce")."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from hoplite_client.wire.errors import (
    InvalidArgumentError,
    ObjectDeletedError,
    ObjectExistsError,
)
from hoplite_client.wire.ids import ObjectID
from hoplited.memory.arena import PAGE, Arena
from hoplited.memory.store import ObjectStore

SIZE = 4 * PAGE


@pytest.fixture
def store() -> Iterator[ObjectStore]:
    arena = Arena(4 * SIZE)
    yield ObjectStore(arena)
    arena.close()


def stripes(n: int, size: int = SIZE) -> list[tuple[ObjectID, int, int]]:
    step = size // n
    return [(ObjectID.random(), i * step, size if i == n - 1 else (i + 1) * step)
            for i in range(n)]




def test_stripes_are_written_in_place_and_complete_the_whole(store: ObjectStore) -> None:
    parts = stripes(4)
    whole = store.create_composite(ObjectID.random(), SIZE, "|u1", [SIZE], parts)
    used = store.arena.used
    for i, (oid, lo, hi) in enumerate(reversed(parts)):  # any order
        assert whole.received == 0
        view = store.create(oid, hi - lo, "|u1", [hi - lo])
        np.frombuffer(view.buffer, dtype=np.uint8)[:] = 3 - i
        view.advance(hi - lo)
    assert store.arena.used == used  # no memory of their own
    assert whole.complete
    got = np.frombuffer(whole.buffer, dtype=np.uint8)
    for i, (_, lo, hi) in enumerate(parts):
        assert (got[lo:hi] == i).all()
    assert store.stats()["stored_bytes"] == SIZE


def test_a_removed_view_keeps_its_bytes_and_a_failed_one_can_be_made_again(
        store: ObjectStore) -> None:
    parts = stripes(2)
    whole = store.create_composite(ObjectID.random(), SIZE, "|u1", [SIZE], parts)
    (a, alo, ahi), (b, blo, bhi) = parts
    va = store.create(a, ahi - alo, "|u1", [ahi - alo])
    va.advance(va.size)
    store.remove(a)  # complete: its region stays filled
    with pytest.raises(ObjectExistsError):
        store.create(a, ahi - alo, "|u1", [ahi - alo])
    vb = store.create(b, bhi - blo, "|u1", [bhi - blo])
    vb.advance(10)
    store.remove(b, ObjectDeletedError("discarded"))  # a partial copy dropped
    assert vb.error is not None and not whole.complete
    vb = store.create(b, bhi - blo, "|u1", [bhi - blo])  # the region is there to fill again
    vb.advance(vb.size)
    assert whole.complete


def test_views_pin_the_whole_until_they_go(store: ObjectStore) -> None:
    parts = stripes(2)
    whole = store.create_composite(ObjectID.random(), SIZE, "|u1", [SIZE], parts)
    view = store.create(parts[0][0], parts[0][2], "|u1", [parts[0][2]])
    store.pin(view)  # a transfer reads it
    store.remove(whole.oid)
    assert view.deleted and store.get(view.oid) is None
    assert store.arena.used > 0  # the transfer's pin keeps the memory
    store.unpin(view)
    assert store.arena.used == 0
    assert store.stats()["pinned_deleted"] == 0


def test_removing_the_whole_fails_partial_stripes_and_frees_once(store: ObjectStore) -> None:
    parts = stripes(3)
    whole = store.create_composite(ObjectID.random(), SIZE, "|u1", [SIZE], parts)
    views = [store.create(oid, hi - lo, "|u1", [hi - lo]) for oid, lo, hi in parts]
    views[0].advance(views[0].size)
    store.remove(whole.oid)
    assert views[0].error is None and all(v.error is not None for v in views[1:])
    assert whole.error is not None and store.arena.used == 0
    assert not store.objects
    # the stripes' ids are plain ids again
    other = store.create(parts[1][0], PAGE, "|u1", [PAGE])
    assert not other.is_view


@pytest.mark.parametrize("bounds", [
    [(0, 100), (200, SIZE)],  # a gap
    [(0, 100), (50, SIZE)],  # an overlap
    [(0, SIZE - 1)],  # short
    [(10, SIZE)],  # not from 0
    [],
])
def test_stripes_must_tile_the_whole(store: ObjectStore, bounds: list[tuple[int, int]]) -> None:
    with pytest.raises(InvalidArgumentError):
        store.create_composite(ObjectID.random(), SIZE, "|u1", [SIZE],
                               [(ObjectID.random(), lo, hi) for lo, hi in bounds])
    assert store.arena.used == 0


def test_a_view_must_match_its_region(store: ObjectStore) -> None:
    parts = stripes(2)
    store.create_composite(ObjectID.random(), SIZE, "<f4", [SIZE // 4], parts)
    oid, lo, hi = parts[0]
    with pytest.raises(InvalidArgumentError):
        store.create(oid, hi - lo - 4, "<f4", [(hi - lo) // 4 - 1])
    with pytest.raises(InvalidArgumentError):
        store.create(oid, hi - lo, "<i4", [(hi - lo) // 4])
    assert store.create(oid, hi - lo, "<f4", [(hi - lo) // 4]).is_view


def test_ids_in_use_are_refused(store: ObjectStore) -> None:
    taken = store.create(ObjectID.random(), PAGE, "|u1", [PAGE]).oid
    parts = stripes(2)
    with pytest.raises(ObjectExistsError):
        store.create_composite(taken, SIZE, "|u1", [SIZE], parts)
    with pytest.raises(ObjectExistsError):
        store.create_composite(ObjectID.random(), SIZE, "|u1", [SIZE],
                               [(taken, 0, 100), (parts[1][0], 100, SIZE)])
