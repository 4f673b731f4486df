"""When a reduce runs as two trees of halves (``choose.reduce_shape``): a table, one row per reason."""

from __future__ import annotations

import pytest

from hoplite_client.wire.errors import InvalidArgumentError
from hoplite_client.wire.ids import ObjectID
from hoplited.collectives.choose import Known, Settings, bounds, reduce_shape
from hoplited.collectives.halves import half_id

GBIT = 125e6  # bytes per second
KiB, MiB = 1 << 10, 1 << 20


@pytest.mark.parametrize("mode, n, k, size, dtype, op, latency, halves, why", [
    ("auto", 1000, 1000, 32 * MiB, "<f4", "sum", 1e-4, [(0, 16 * MiB), (16 * MiB, 32 * MiB)],
     "the model pays at N = 1000: the halves split at the middle page"),
    ("auto", 8, 8, 32 * MiB, "<f4", "sum", 1e-4, None, "at N = 8 one tree is as good"),
    ("always", 8, 8, 32 * MiB, "<f4", "sum", 1e-4, [(0, 16 * MiB), (16 * MiB, 32 * MiB)],
     "always: whatever the model says"),
    ("always", 4, 4, 150 * KiB + 4, "<f4", "prod", 1e-4,
     [(0, 76 * KiB), (76 * KiB, 150 * KiB + 4)], "an odd size: the first half ends on a page, the second takes the rest"),
    ("always", 4, 4, 41 * 4096, "<c16", "sum", 1e-4, [(0, 20 * 4096), (20 * 4096, 41 * 4096)],
     "41 pages of 16-byte elements: the cut falls on a page boundary"),
    ("always", 4, 4, 128 * KiB, "<f4", "sum", 1e-4, None,
     "halves of 64 KiB would be sent inline: one tree"),
    ("always", 1000, 999, 32 * MiB, "<f4", "sum", 1e-4, None,
     "a subset: a backup could stand in for a lost input in one half only"),
    ("always", 1, 1, 32 * MiB, "<f4", "sum", 1e-4, None, "one input: nothing to reduce"),
    ("always", 4, 4, 32 * MiB, "|S8", "sum", 1e-4, None,
     "bytes are not reducible: the one tree's plan reports it"),
    ("never", 1000, 1000, 32 * MiB, "<f4", "sum", 1e-4, None, "never"),
])
def test_reduce_shape(mode: str, n: int, k: int, size: int, dtype: str, op: str, latency: float,
                      halves: list[tuple[int, int]] | None, why: str) -> None:
    known = Known(n, size, dtype, op, (GBIT, latency), Settings(two_trees=mode), subset=k != n)
    assert bounds(reduce_shape(known)) == halves, why


def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="two-trees mode 'sometimes'"):
        reduce_shape(Known(8, MiB, "<f4", "sum", (GBIT, 1e-4), Settings(two_trees="sometimes")))


def test_the_halves_have_ids_of_their_own() -> None:
    """Each half's id is fixed by the result's, and differs from the result's and the other's."""
    result = ObjectID(bytes(range(20)))
    ids = {half_id(result, 0), half_id(result, 1), result}
    assert len(ids) == 3 and half_id(result, 1) == half_id(ObjectID(bytes(range(20))), 1)
